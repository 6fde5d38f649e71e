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

/// A 1 MiB stream row: `runs` runs of `ours` (GB/s) interleaved with a
/// raw blocking TCP stream of `count` 1 MiB writes, against `target`.
fn stream_row(
    test: &str,
    target: f64,
    runs: usize,
    count: u64,
    cpus: Option<(usize, usize)>,
    mut ours_run: impl FnMut() -> Result<f64, String>,
) -> Result<Row, String> {
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(ours_run()?);
        let t = baseline::tcp_stream(MIB, count, false, cpus);
        base.push((count as usize * MIB) as f64 / t.as_secs_f64() / 1e9);
    }
    Ok(row(
        test,
        MIB,
        "GB/s",
        &ours,
        &base,
        "raw loopback TCP stream, 1 MiB writes, blocking".into(),
        true,
        Some(Target::RatioAtLeast(target)),
    ))
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
    rows.push(stream_row("lnet-put", 0.85, runs, count, cpus, || {
        put_stream(&a, tb, count, 4, &puts_b)
    })?);
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
    rows.push(stream_row(
        "lnet-routed-put",
        0.7,
        runs,
        count,
        cpus,
        || put_stream(&client, ts, count, 4, &puts_s),
    )?);
    client.shutdown();
    router.shutdown();
    server.shutdown();
    Ok(rows)
}
