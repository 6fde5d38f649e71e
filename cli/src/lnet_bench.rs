//! `colibri bench --tests lnet`: LNet over the socket LND between nodes of
//! this process on loopback addresses, each figure next to a raw TCP
//! baseline measured in the same run (interleaved).
//!
//! * `lnet-rtt`: a 64-byte PUT and its ACK, one at a time, against a raw
//!   64-byte TCP ping-pong in blocking mode (the runtime's threads block
//!   in `epoll_wait`).
//! * `lnet-put`: a stream of 1 MiB PUTs (four in flight, no ACK) between
//!   two nodes, against a raw blocking 1 MiB TCP stream.
//! * `lnet-routed-put`: the same stream through a router node (two nets),
//!   against the same raw stream.
//! * `lnet-routed-relay`: the same runs against a raw user-space relay
//!   ([`baseline::tcp_relay_stream`]), measured interleaved: the ceiling a
//!   router that moves bytes through user space has on this machine (no
//!   target: it says how far the routed figure is from that ceiling).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_bench::baseline;
use colibri_bench::report::{Row, Target, row};
use colibri_lnet_rt::colibri_lnet::ids::{Net, Nid, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{
    Event, EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};

const MIB: usize = 1 << 20;
const PORTAL: u32 = 30;
const WAIT: Duration = Duration::from_secs(30);

fn nid(s: &str) -> Result<Nid, String> {
    s.parse().map_err(|e| format!("{s}: {e}"))
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A node on `nids`, any free port, any source port (no privilege
/// needed), routing as asked; with `puts`, events go to a handler that
/// counts PUTs, else to the node's queue.
fn node(nids: &[&str], routing: bool, puts: Option<Arc<AtomicU64>>) -> Result<Lnet, String> {
    let nids: Vec<Nid> = nids.iter().map(|s| nid(s)).collect::<Result<_, _>>()?;
    let mut cfg = LnetConfig::new(&nids);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    cfg.node.routing = routing;
    cfg.node.discovery = false;
    // The runtime's threads block in epoll_wait (no look before sleeping),
    // as the raw baseline's reads block.
    cfg.spin = Duration::ZERO;
    match puts {
        Some(n) => Lnet::start_with_handler(cfg, move |ev: Event| {
            if ev.kind() == EventKind::Put {
                n.fetch_add(1, Ordering::Release);
            }
        }),
        // Events in a queue, read by `wait_for`.
        None => Lnet::start(cfg),
    }
    .map_err(err)
}

/// Tells `a` and `b` where each other's NIs listen.
fn introduce(a: &Lnet, an: Nid, b: &Lnet, bn: Nid) -> Result<(), String> {
    let aa = a.listen_addr(an).ok_or("no listener")?;
    let ba = b.listen_addr(bn).ok_or("no listener")?;
    a.set_peer_addr(bn, ba);
    b.set_peer_addr(an, aa);
    Ok(())
}

/// An ME on `PORTAL` with an MD over all of `region` taking any number of
/// PUTs.
fn sink(lnet: &Lnet, region: &MemRegion) -> Result<(), String> {
    let key = lnet.register(region);
    let me = lnet
        .me_attach(MeSpec {
            portal: PORTAL,
            match_id: ProcessId::ANY,
            match_bits: 1,
            ignore_bits: 0,
            unlink: Unlink::Retain,
            pos: InsertPos::After,
        })
        .map_err(err)?;
    let len = u32::try_from(region.len()).map_err(err)?;
    lnet.md_attach(
        me,
        MdSpec::new(
            MemRef::new(key, 0, len),
            MdOptions::OP_PUT | MdOptions::TRUNCATE,
        )
        .threshold(Threshold::Infinite),
    )
    .map_err(err)?;
    Ok(())
}

/// A bound MD over `region` ending after `events` events.
fn bound(
    lnet: &Lnet,
    key: colibri_lnet_rt::colibri_lnet::matching::MemKey,
    len: usize,
    events: u32,
) -> Result<MdHandle, String> {
    let len = u32::try_from(len).map_err(err)?;
    lnet.md_bind(
        MdSpec::new(MemRef::new(key, 0, len), MdOptions::empty())
            .threshold(Threshold::Count(events))
            .unlink(Unlink::Unlink),
    )
    .map_err(err)
}

/// The next event of `lnet` for which `want` holds (others skipped).
fn wait_for(lnet: &Lnet, want: impl Fn(&Event) -> bool) -> Result<Event, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("LNet benchmark: an event did not come in 30 s".into());
        }
        let ev = lnet.next_event(left).map_err(err)?;
        if let Err(e) = ev.status() {
            return Err(format!("LNet benchmark: {:?} failed: {e:?}", ev.kind()));
        }
        if want(&ev) {
            return Ok(ev);
        }
    }
}

/// `iters` 64-byte PUT+ACK round trips; the time per round trip in µs.
fn put_ack_rtt(a: &Lnet, target: ProcessId, iters: u64) -> Result<f64, String> {
    let src = MemRegion::from_vec(vec![0x5a; 64]);
    let key = a.register(&src);
    let start = Instant::now();
    for _ in 0..iters {
        let md = bound(a, key, 64, 2)?;
        a.put(md, true, target, PORTAL, 1, 0, 0).map_err(err)?;
        wait_for(a, |e| e.md == md && e.kind() == EventKind::Ack)?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// `count` 1 MiB PUTs, `window` in flight, no ACK; GB/s at the target
/// (time until it counted the last PUT).
fn put_stream(
    a: &Lnet,
    target: ProcessId,
    count: u64,
    window: u64,
    received: &AtomicU64,
) -> Result<f64, String> {
    let srcs: Vec<MemRegion> = (0..3u8)
        .map(|i| MemRegion::from_vec(vec![i; MIB]))
        .collect();
    let keys: Vec<_> = srcs.iter().map(|r| a.register(r)).collect();
    let base = received.load(Ordering::Acquire);
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < count {
        while sent < count && sent - done < window {
            let md = bound(a, keys[(sent % 3) as usize], MIB, 1)?;
            a.put(md, false, target, PORTAL, 1, 0, 0).map_err(err)?;
            sent += 1;
        }
        wait_for(a, |e| e.kind() == EventKind::Send)?;
        done += 1;
    }
    let deadline = Instant::now() + WAIT;
    while received.load(Ordering::Acquire) - base < count {
        if Instant::now() > deadline {
            return Err("LNet benchmark: the target did not count every PUT".into());
        }
        std::hint::spin_loop();
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((count as usize * MIB) as f64 / secs / 1e9)
}

/// GB/s of `count` 1 MiB messages in `t`.
fn gbps(count: u64, t: Duration) -> f64 {
    (count as usize * MIB) as f64 / t.as_secs_f64() / 1e9
}

/// The row of a 1 MiB stream (GB/s, `ours`) against the raw blocking TCP
/// stream (`base`, measured interleaved), with its target ratio.
fn stream_row(test: &str, ours: &[f64], base: &[f64], target: f64) -> Row {
    row(
        test,
        MIB,
        "GB/s",
        ours,
        base,
        "raw loopback TCP stream, 1 MiB writes, blocking".into(),
        true,
        Some(Target::RatioAtLeast(target)),
    )
}

/// The LNet rows: `runs` interleaved runs of each figure and its baseline.
/// `progress` is called before each figure.
///
/// # Errors
/// A node that could not start, an operation that failed or timed out.
pub(crate) fn lnet_rows(
    runs: usize,
    smoke: bool,
    cpus: Option<(usize, usize)>,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Row>, String> {
    let runs = runs.max(1);
    let (iters, count) = if smoke { (200, 16) } else { (3000, 256) };
    let mut rows = Vec::new();

    // Two nodes on one net.
    let puts_b = Arc::new(AtomicU64::new(0));
    let (na, nb) = (nid("127.0.8.2@tcp")?, nid("127.0.8.3@tcp")?);
    let a = node(&["127.0.8.2@tcp"], false, None)?;
    let b = node(&["127.0.8.3@tcp"], false, Some(Arc::clone(&puts_b)))?;
    introduce(&a, na, &b, nb)?;
    let inbox = MemRegion::zeroed(MIB);
    sink(&b, &inbox)?;
    let tb = ProcessId::lustre(nb);
    // Warm up: the connections are made.
    put_ack_rtt(&a, tb, 10)?;

    progress("lnet-rtt 64B");
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(put_ack_rtt(&a, tb, iters)?);
        let t = baseline::tcp_round_trip(64, iters, false, cpus);
        base.push(t.as_secs_f64() * 1e6 / iters as f64);
    }
    rows.push(row(
        "lnet-rtt",
        64,
        "us",
        &ours,
        &base,
        "raw loopback TCP socket pair, 64B ping-pong, blocking reads".into(),
        false,
        Some(Target::RatioAtMost(1.3)),
    ));

    progress("lnet-put 1MiB");
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(put_stream(&a, tb, count, 4, &puts_b)?);
        base.push(gbps(count, baseline::tcp_stream(MIB, count, false, cpus)));
    }
    rows.push(stream_row("lnet-put", &ours, &base, 0.85));
    a.shutdown();
    b.shutdown();

    // Through a router.
    progress("lnet-routed-put 1MiB");
    let puts_s = Arc::new(AtomicU64::new(0));
    let (c_nid, r0, r1, s_nid) = (
        nid("127.0.9.2@tcp")?,
        nid("127.0.9.3@tcp")?,
        nid("127.0.10.3@tcp1")?,
        nid("127.0.10.4@tcp1")?,
    );
    let client = node(&["127.0.9.2@tcp"], false, None)?;
    let router = node(&["127.0.9.3@tcp", "127.0.10.3@tcp1"], true, None)?;
    let server = node(&["127.0.10.4@tcp1"], false, Some(Arc::clone(&puts_s)))?;
    introduce(&client, c_nid, &router, r0)?;
    introduce(&router, r1, &server, s_nid)?;
    let tcp1: Net = "tcp1".parse().map_err(err)?;
    let tcp: Net = "tcp".parse().map_err(err)?;
    client.add_route(tcp1, r0, Some(1), 0).map_err(err)?;
    server.add_route(tcp, r1, Some(1), 0).map_err(err)?;
    let inbox = MemRegion::zeroed(MIB);
    sink(&server, &inbox)?;
    let ts = ProcessId::lustre(s_nid);
    put_stream(&client, ts, 4, 4, &puts_s)?;
    // Each run: ours, the raw stream (the target's baseline), then a raw
    // relay (what moving the bytes through a user-space router costs on
    // this machine), interleaved; the relay last, so the stream baseline
    // is measured after ours as in the other rows.
    let (mut ours, mut base, mut relay) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(put_stream(&client, ts, count, 4, &puts_s)?);
        base.push(gbps(count, baseline::tcp_stream(MIB, count, false, cpus)));
        relay.push(gbps(count, baseline::tcp_relay_stream(MIB, count)));
    }
    rows.push(stream_row("lnet-routed-put", &ours, &base, 0.7));
    rows.push(row(
        "lnet-routed-relay",
        MIB,
        "GB/s",
        &ours,
        &relay,
        format!(
            "raw loopback TCP relay: writer -> relay (a reading and a writing thread, {} buffers) -> reader, 1 MiB messages",
            baseline::RELAY_BUFS
        ),
        true,
        None,
    ));
    client.shutdown();
    router.shutdown();
    server.shutdown();
    Ok(rows)
}
