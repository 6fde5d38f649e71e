//! Helpers shared by the runtime's tests.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{
    Event, EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use colibri_lnet_rt::{Lnet, MemRegion};

/// Every test gives up after this long.
pub const LIMIT: Duration = Duration::from_secs(30);

pub fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A deterministic pattern of `len` bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Events until `n` with `unlinked` have arrived for `md` (or `LIMIT`).
pub fn events_until(lnet: &Lnet, pred: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let start = Instant::now();
    let mut evs = Vec::new();
    while !pred(&evs) {
        let left = LIMIT.saturating_sub(start.elapsed());
        assert!(
            !left.is_zero(),
            "timed out waiting for events; got {evs:#?}"
        );
        if let Ok(ev) = lnet.next_event(left.min(Duration::from_millis(200))) {
            evs.push(ev);
        }
    }
    evs
}

/// Events until one of `kind` for `md` that is its last (`unlinked`).
pub fn until_final(lnet: &Lnet, md: MdHandle) -> Vec<Event> {
    events_until(lnet, |evs| evs.iter().any(|e| e.md == md && e.unlinked))
}

pub fn kinds(evs: &[Event], md: MdHandle) -> Vec<EventKind> {
    evs.iter().filter(|e| e.md == md).map(Event::kind).collect()
}

/// An ME on `portal` for `bits` from anyone, kept after use.
pub fn me_on(portal: u32, bits: u64) -> MeSpec {
    MeSpec {
        portal,
        match_id: ProcessId::ANY,
        match_bits: bits,
        ignore_bits: 0,
        unlink: Unlink::Retain,
        pos: InsertPos::After,
    }
}

/// An ME on `portal` matching `bits` with an MD over the whole `region`.
pub fn post(lnet: &Lnet, region: &MemRegion, portal: u32, bits: u64, opts: MdOptions) -> MdHandle {
    let key = lnet.register(region);
    let me = lnet.me_attach(me_on(portal, bits)).unwrap();
    let len = u32::try_from(region.len()).unwrap();
    lnet.md_attach(me, MdSpec::new(MemRef::new(key, 0, len), opts))
        .unwrap()
}

/// A bound MD over the whole `region` with threshold 2, unlinked after
/// its second event.
pub fn bind(lnet: &Lnet, region: &MemRegion) -> MdHandle {
    let key = lnet.register(region);
    let len = u32::try_from(region.len()).unwrap();
    lnet.md_bind(
        MdSpec::new(MemRef::new(key, 0, len), MdOptions::empty())
            .threshold(Threshold::Count(2))
            .unlink(Unlink::Unlink),
    )
    .unwrap()
}
