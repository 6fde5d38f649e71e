//! `colibri lnet selftest`, in the spirit of Lustre's `lst`: from the node
//! that receives the command to a group of nodes, for a duration, with
//! some concurrency, printing rates and bandwidth per interval and errors
//! per node.
//!
//! * `ping`: LNet pings (a GET of the target's ping buffer on the reserved
//!   portal and its REPLY), one round trip each.
//! * `brw write`: a PUT of `size` bytes with an ACK into the target's
//!   selftest buffer; `brw read`: a GET of `size` bytes from it (the
//!   REPLY lands in our memory). `--check` compares what a read brought
//!   with the pattern every node serves.
//!
//! Every node run by `colibri lnet run` serves the target: one ME on
//! [`SELFTEST_PORTAL`] matching any peer and any bits, with an MD over
//! [`MAX_BRW`] bytes of the pattern (PUT and GET, offsets managed by the
//! initiator so that every operation uses offset 0). Writes carry the same
//! pattern, so concurrent writes and reads see the same bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::matching::{
    EventKind, InsertPos, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use serde::{Deserialize, Serialize};

use super::daemon::Daemon;
use super::{Failure, errno};
use crate::yaml::Doc;
use crate::{Lnet, LnetError, MemRegion};

/// The portal of the selftest target (`lst`'s bulk portal).
pub const SELFTEST_PORTAL: u32 = 52;
/// The largest `brw` size (1 MiB, as `lst`).
pub const MAX_BRW: u32 = 1 << 20;
/// The most concurrent operations (`lst --concurrency` allows 1024).
pub const MAX_CONCURRENCY: u32 = 64;
/// The longest test.
pub const MAX_DURATION_S: u32 = 3600;

/// How long a worker pauses after a failed operation.
const ERROR_PAUSE: Duration = Duration::from_millis(20);
/// How long a worker waits for an operation's last event beyond the
/// node's transaction timeout, so that the node's own timeout ends it.
const OP_SLACK: Duration = Duration::from_secs(2);

/// The test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelftestKind {
    /// LNet pings.
    Ping,
    /// Bulk read (GET) or write (PUT).
    Brw {
        /// Read (GET) rather than write (PUT).
        read: bool,
        /// Bytes per operation.
        size: u32,
        /// Check the data of reads.
        check: bool,
    },
}

/// A selftest run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SelftestSpec {
    /// Ping or brw.
    pub kind: SelftestKind,
    /// Target NIDs (nodes running `colibri lnet run`).
    pub to: Vec<String>,
    /// Seconds.
    pub duration_s: u32,
    /// Operations in flight at once.
    pub concurrency: u32,
    /// Seconds between interval reports (0: none).
    pub interval_s: u32,
}

/// The served target; the ME and MD go with the node.
#[derive(Debug)]
pub(crate) struct SelftestTarget {
    _mem: MemRegion,
}

/// The pattern at byte `i`.
fn pattern(i: usize) -> u8 {
    // Not periodic on powers of two, so misplaced blocks show.
    u8::try_from((i * 7 + i / 251) % 251).unwrap_or(0)
}

fn pattern_region(len: usize) -> MemRegion {
    MemRegion::from_vec((0..len).map(pattern).collect())
}

/// Posts the target (see the module docs).
pub(crate) fn serve(lnet: &Lnet) -> Result<SelftestTarget, LnetError> {
    let mem = pattern_region(MAX_BRW as usize);
    let key = lnet.register(&mem);
    let me = lnet.me_attach(MeSpec {
        portal: SELFTEST_PORTAL,
        match_id: ProcessId::ANY,
        match_bits: 0,
        ignore_bits: u64::MAX,
        unlink: Unlink::Retain,
        pos: InsertPos::After,
    })?;
    lnet.md_attach(
        me,
        MdSpec::new(
            MemRef::new(key, 0, MAX_BRW),
            MdOptions::OP_PUT | MdOptions::OP_GET | MdOptions::MANAGE_REMOTE,
        ),
    )?;
    Ok(SelftestTarget { _mem: mem })
}

#[derive(Debug, Default)]
struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    check_errors: AtomicU64,
}

struct Snapshot {
    ops: u64,
    bytes: u64,
    errors: u64,
}

impl Counters {
    fn snap(&self) -> Snapshot {
        Snapshot {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed) + self.check_errors.load(Ordering::Relaxed),
        }
    }
}

fn mib_s(bytes: u64, secs: f64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let v = bytes as f64 / (1024.0 * 1024.0) / secs.max(1e-9);
    format!("{v:.2}")
}

fn per_s(n: u64, secs: f64) -> i64 {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let v = (n as f64 / secs.max(1e-9)).round() as i64;
    v
}

/// One operation: `Ok(bytes)` or why it failed.
fn one_op(
    d: &Daemon,
    kind: SelftestKind,
    target: Nid,
    mem: &MemRegion,
    key: colibri_lnet::matching::MemKey,
    timeout: Duration,
) -> Result<u64, (bool, String)> {
    let lnet = d.lnet();
    match kind {
        SelftestKind::Ping => lnet
            .ping(target, timeout)
            .map(|_| 0)
            .map_err(|e| (false, e.to_string())),
        SelftestKind::Brw { read, size, check } => {
            let md = lnet
                .md_bind(
                    MdSpec::new(MemRef::new(key, 0, size), MdOptions::empty())
                        .threshold(Threshold::Count(2))
                        .unlink(Unlink::Unlink),
                )
                .map_err(|e| (false, e.to_string()))?;
            let (tx, rx) = crossbeam_channel::bounded(2);
            d.events.wait_for(md, tx);
            let started = if read {
                lnet.get(md, ProcessId::lustre(target), SELFTEST_PORTAL, 0, 0)
            } else {
                lnet.put(
                    md,
                    true,
                    ProcessId::lustre(target),
                    SELFTEST_PORTAL,
                    0,
                    0,
                    0,
                )
            };
            if let Err(e) = started {
                d.events.forget(md);
                let _ = lnet.md_unlink(md);
                return Err((false, e.to_string()));
            }
            let deadline = Instant::now() + timeout;
            let mut done = None;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(ev) => {
                        if let Err(e) = ev.status() {
                            done.get_or_insert(Err((false, format!("{:?}: {e:?}", ev.kind()))));
                        } else if matches!(ev.kind(), EventKind::Ack | EventKind::Reply) {
                            done.get_or_insert(Ok(u64::from(size)));
                        }
                        if ev.unlinked {
                            break;
                        }
                    }
                    Err(_) => {
                        // The node ends every operation with one event;
                        // one that has not come in time is given up on.
                        d.events.forget(md);
                        let _ = lnet.md_unlink(md);
                        return Err((false, "timed out".into()));
                    }
                }
            }
            let r = done.unwrap_or_else(|| Err((false, "ended without ACK or REPLY".into())));
            if r.is_ok() && read && check {
                let ok = mem.read(|b: &[u8]| {
                    b[..size as usize]
                        .iter()
                        .enumerate()
                        .all(|(i, v)| *v == pattern(i))
                });
                if !ok {
                    return Err((true, "data check failed".into()));
                }
            }
            r
        }
    }
}

/// Runs a test from `d`'s node (see the module docs).
pub(crate) fn run(
    d: &Daemon,
    spec: &SelftestSpec,
    partial: &mut dyn FnMut(Doc) -> bool,
) -> Result<Doc, Failure> {
    let bad = |what: String| Failure::new("selftest", "brw", errno::EINVAL, what);
    let targets = spec
        .to
        .iter()
        .map(|s| crate::conf::parse_nid(s, "to").map_err(|e| bad(e.to_string())))
        .collect::<Result<Vec<Nid>, _>>()?;
    if targets.is_empty() {
        return Err(bad("--to names no NID".into()));
    }
    if spec.duration_s == 0 || spec.duration_s > MAX_DURATION_S {
        return Err(bad(format!(
            "--duration must be 1..={MAX_DURATION_S} seconds"
        )));
    }
    if spec.concurrency == 0 || spec.concurrency > MAX_CONCURRENCY {
        return Err(bad(format!("--concurrency must be 1..={MAX_CONCURRENCY}")));
    }
    if let SelftestKind::Brw { size, .. } = spec.kind
        && (size == 0 || size > MAX_BRW)
    {
        return Err(bad(format!("--size must be 1..={MAX_BRW} bytes")));
    }
    let lnet = d.lnet().clone();
    let per_node: Arc<Vec<(Nid, Counters)>> =
        Arc::new(targets.iter().map(|n| (*n, Counters::default())).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let end = start + Duration::from_secs(u64::from(spec.duration_s));
    // An operation may take up to the transaction timeout, and the node
    // ends it then with its own verdict (counted in its statistics); the
    // worker's wait is only a safety net, so it outlasts the node's
    // deadline (which starts a little after the worker's clock did) by
    // OP_SLACK. The test ends within a bounded time all the same: a node
    // whose transaction timeout is longer than the test is given up on
    // after the test's duration plus 5 s.
    let op_timeout = (lnet.with_node(|n| n.config().transaction_timeout) + OP_SLACK)
        .min(Duration::from_secs(u64::from(spec.duration_s) + 5))
        .max(Duration::from_secs(1));
    let size = match spec.kind {
        SelftestKind::Brw { size, .. } => size,
        SelftestKind::Ping => 0,
    };
    let res = std::thread::scope(|scope| {
        for w in 0..spec.concurrency {
            let (per_node, wstop) = (per_node.clone(), stop.clone());
            let kind = spec.kind;
            let spawned = std::thread::Builder::new()
                .name(format!("lnet-selftest-{w}"))
                .spawn_scoped(scope, move || {
                    let mem = pattern_region(size.max(1) as usize);
                    let key = d.lnet().register(&mem);
                    let mut i = w as usize;
                    while !wstop.load(Ordering::Acquire) && Instant::now() < end {
                        let (nid, c) = &per_node[i % per_node.len()];
                        i += 1;
                        match one_op(d, kind, *nid, &mem, key, op_timeout) {
                            Ok(b) => {
                                c.ops.fetch_add(1, Ordering::Relaxed);
                                c.bytes.fetch_add(b, Ordering::Relaxed);
                            }
                            Err((check, why)) => {
                                tracing::debug!(target: super::TARGET, nid = %nid, why, "selftest error");
                                if check {
                                    c.check_errors.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    c.errors.fetch_add(1, Ordering::Relaxed);
                                }
                                // An operation refused at once (no route, node
                                // stopping) is not retried in a busy loop.
                                let pause = ERROR_PAUSE
                                    .min(end.saturating_duration_since(Instant::now()));
                                std::thread::sleep(pause);
                            }
                        }
                    }
                    d.lnet().deregister(key);
                });
            if let Err(e) = spawned {
                stop.store(true, Ordering::Release);
                return Err(Failure::new(
                    "selftest",
                    "run",
                    errno::EBUSY,
                    format!("cannot start a test thread: {e}"),
                ));
            }
        }
        // Interval reports while the workers run.
        let mut last = (start, 0u64, 0u64, 0u64);
        let mut n = 0u32;
        let tick = Duration::from_secs(u64::from(spec.interval_s.max(1)));
        while Instant::now() < end {
            let next = (last.0 + tick).min(end);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            if spec.interval_s == 0 {
                continue;
            }
            n += 1;
            let now = Instant::now();
            let (ops, bytes, errs) = per_node.iter().fold((0, 0, 0), |a, (_, c)| {
                let s = c.snap();
                (a.0 + s.ops, a.1 + s.bytes, a.2 + s.errors)
            });
            let secs = (now - last.0).as_secs_f64();
            let doc = Doc::map().with(
                "interval",
                Doc::map()
                    .with("seq", n)
                    .with("elapsed", format!("{:.1}", (now - start).as_secs_f64()))
                    .with("rate", per_s(ops - last.1, secs))
                    .with("bandwidth MiB/s", mib_s(bytes - last.2, secs))
                    .with("errors", errs - last.3),
            );
            last = (now, ops, bytes, errs);
            if !partial(doc) {
                break;
            }
        }
        stop.store(true, Ordering::Release);
        Ok(())
    });
    res?;
    let secs = start.elapsed().as_secs_f64();
    let (name, mode) = match spec.kind {
        SelftestKind::Ping => ("ping", None),
        SelftestKind::Brw { read, .. } => ("brw", Some(if read { "read" } else { "write" })),
    };
    let mut total = (0, 0, 0);
    let nodes = per_node
        .iter()
        .map(|(nid, c)| {
            let s = c.snap();
            total = (total.0 + s.ops, total.1 + s.bytes, total.2 + s.errors);
            let mut d = Doc::map()
                .with("nid", nid.to_string())
                .with("rpcs", s.ops)
                .with(
                    if name == "ping" {
                        "ping errors"
                    } else {
                        "brw errors"
                    },
                    c.errors.load(Ordering::Relaxed),
                );
            if name == "brw" {
                d.push("check errors", c.check_errors.load(Ordering::Relaxed));
            }
            d
        })
        .collect::<Vec<_>>();
    let mut t = Doc::map().with("test", name);
    if let Some(m) = mode {
        t.push("mode", m);
        t.push("size", size);
    }
    t.push("concurrency", spec.concurrency);
    t.push("duration", format!("{secs:.1}"));
    t.push("rpcs", total.0);
    t.push("rate", per_s(total.0, secs));
    t.push("bandwidth MiB/s", mib_s(total.1, secs));
    t.push("errors", total.2);
    t.push("nodes", nodes);
    Ok(Doc::map().with("selftest", t))
}
