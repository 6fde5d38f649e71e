//! Running a benchmark plan and reporting it: each figure is the median of
//! several runs, with its minimum and maximum, next to its baseline's
//! figure measured in interleaved runs (ours, baseline, ours, ...), and the
//! ratio of the two medians.

use std::time::Duration;

use colibri_net::Transport;
use serde::Serialize;

use crate::{
    BenchResult, Bulk, BulkDir, OneWay, PairConfig, RoundTrip, RpcBulk, RpcOneWay, RpcRoundTrip,
    baseline, fmt_size,
};

/// Median, minimum and maximum of a figure over runs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Stat {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Stat {
    /// Summarises samples (at least one).
    pub fn of(samples: &[f64]) -> Self {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let median = if v.is_empty() {
            0.0
        } else if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        Self {
            median,
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// A target a figure should meet.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub enum Target {
    /// Our median at most this value (in the row's unit).
    AtMost(f64),
    /// Our median at least this value.
    AtLeast(f64),
    /// The ratio ours/baseline at most this.
    RatioAtMost(f64),
    /// The ratio ours/baseline at least this.
    RatioAtLeast(f64),
}

impl Target {
    fn met(&self, ours: f64, ratio: f64) -> bool {
        match *self {
            Self::AtMost(v) => ours <= v,
            Self::AtLeast(v) => ours >= v,
            Self::RatioAtMost(v) => ratio <= v,
            Self::RatioAtLeast(v) => ratio >= v,
        }
    }

    fn describe(&self, unit: &str) -> String {
        match *self {
            Self::AtMost(v) => format!("<= {v} {unit}"),
            Self::AtLeast(v) => format!(">= {v} {unit}"),
            Self::RatioAtMost(v) => format!("ratio <= {v}"),
            Self::RatioAtLeast(v) => format!("ratio >= {v}"),
        }
    }
}

/// One line of a report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Workload: `rtt`, `oneway`, `bulk-read`, `bulk-write`, `rpc-rtt`,
    /// `rpc-rate`, `rpc-bulk-read`, `rpc-bulk-write`, `rpc-oneway`.
    pub test: String,
    /// Message or transfer size in bytes.
    pub size: usize,
    /// Unit of `ours` and `baseline`: `us` (round-trip time), `Mmsg/s`,
    /// `Mcall/s`, `Mitem/s`, `GB/s` (10^9 bytes per second).
    pub unit: &'static str,
    /// Our figure.
    pub ours: Stat,
    /// The baseline's figure.
    pub baseline: Stat,
    /// What the baseline is.
    pub baseline_name: String,
    /// ours.median / baseline.median.
    pub ratio: f64,
    /// True when a higher figure is better.
    pub higher_is_better: bool,
    /// The target this figure should meet, if any.
    pub target: Option<Target>,
    /// Whether it met it.
    pub met: Option<bool>,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Workers poll (true) or block (false): only used to label the
    /// figures and choose the baseline's mode; the transport must have been
    /// configured to match.
    pub polling: bool,
    /// Client and server CPUs.
    pub cpus: Option<(usize, usize)>,
    /// Interleaved runs per figure.
    pub runs: usize,
    /// Message sizes for round trips.
    pub rtt_sizes: Vec<usize>,
    /// Round trips per run.
    pub rtt_iters: u64,
    /// Message size for the one-way stream (no larger than 64 for the
    /// channel baseline to be comparable).
    pub oneway_size: usize,
    /// Messages per one-way run.
    pub oneway_count: u64,
    /// Sends in flight in the one-way stream.
    pub oneway_window: usize,
    /// Bulk transfer sizes.
    pub bulk_sizes: Vec<usize>,
    /// Bytes moved per bulk run (at least 4 transfers).
    pub bulk_bytes: usize,
    /// Null RPC calls per run (RPC round trip and rate).
    pub rpc_iters: u64,
    /// Calls in flight for the RPC rate figure.
    pub rpc_window: usize,
    /// Bulk size of the RPC bulk figures.
    pub rpc_bulk_size: usize,
    /// Bulk calls in flight in the RPC bulk figures (each costs a request
    /// and a reply message on top of the transfer, so more than the raw
    /// workload's two transfers are needed to hide those round trips).
    pub rpc_bulk_window: usize,
    /// One-way items per RPC one-way run.
    pub rpc_oneway_count: u64,
    /// Workloads to run: any of `rtt`, `oneway`, `bulk`, `rpc`, `all`.
    pub tests: Vec<String>,
    /// Apply the in-memory transport's targets of issue 2.
    pub mem_targets: bool,
    /// Compare with a raw loopback TCP socket pair (ping-pong, message
    /// stream, byte stream) instead of channels and memcpy, and apply the
    /// TCP transport's targets of issue 3.
    pub tcp: bool,
    /// With `tcp`: the 64 B round trip's target (at most this times the
    /// raw ping-pong; `None`: no target) and the 1 MiB bulk target (at
    /// least this times the raw stream).
    pub tcp_targets: (Option<f64>, f64),
    /// With `tcp`: the pair is routed (a router node between client and
    /// server), so each bulk figure is also compared with a raw user-space
    /// relay measured in the same runs ([`baseline::tcp_relay_stream`]):
    /// the ceiling a router that moves the bytes through user space
    /// reaches on this machine (rows `bulk-read-relay`, `bulk-write-relay`,
    /// no target).
    pub relay: bool,
}

impl Plan {
    /// The default plan (what `colibri bench` runs without options).
    pub fn standard(polling: bool) -> Self {
        Self {
            polling,
            cpus: Some((1, 0)),
            runs: 5,
            rtt_sizes: vec![64, 4096],
            rtt_iters: if polling { 200_000 } else { 5_000 },
            oneway_size: 64,
            oneway_count: 1_000_000,
            oneway_window: 256,
            bulk_sizes: vec![64 << 10, 1 << 20, 16 << 20],
            bulk_bytes: 512 << 20,
            rpc_iters: if polling { 100_000 } else { 5_000 },
            rpc_window: 16,
            rpc_bulk_size: 1 << 20,
            rpc_bulk_window: 4,
            rpc_oneway_count: if polling { 500_000 } else { 100_000 },
            tests: vec!["rtt".into(), "oneway".into(), "bulk".into(), "rpc".into()],
            mem_targets: true,
            tcp: false,
            tcp_targets: (Some(1.3), 0.9),
            relay: false,
        }
    }

    /// A plan small enough for a smoke test.
    pub fn smoke(polling: bool) -> Self {
        Self {
            runs: 1,
            rtt_iters: 200,
            oneway_count: 2_000,
            bulk_bytes: 8 << 20,
            bulk_sizes: vec![64 << 10, 1 << 20],
            rpc_iters: 200,
            rpc_oneway_count: 2_000,
            mem_targets: false,
            ..Self::standard(polling)
        }
    }

    fn wants(&self, t: &str) -> bool {
        self.tests.iter().any(|x| x == t || x == "all")
    }

    /// How many steps [`run_plan`] reports through its progress callback
    /// for this plan (for a "step N of M" display).
    pub fn steps(&self) -> usize {
        let mut n = 0;
        if self.wants("rtt") {
            n += self.rtt_sizes.len();
        }
        if self.wants("oneway") {
            n += 1;
        }
        if self.wants("bulk") {
            n += 2 * self.bulk_sizes.len();
        }
        if self.wants("rpc") {
            n += RPC_STEPS;
        }
        n
    }

    fn mode(&self) -> &'static str {
        if self.polling { "polling" } else { "blocking" }
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-12)
}

/// Runs a plan over `xprt`; `progress` receives a line per step.
///
/// # Errors
/// The first failing workload.
pub fn run_plan(
    plan: &Plan,
    xprt: &dyn Transport,
    cfg: &PairConfig,
    progress: &mut dyn FnMut(&str),
) -> BenchResult<Vec<Row>> {
    let cfg = PairConfig {
        cpus: plan.cpus,
        ..cfg.clone()
    };
    let runs = plan.runs.max(1);
    let mut rows = Vec::new();
    if plan.wants("rtt") {
        for &size in &plan.rtt_sizes {
            progress(&format!("round trip {} ({})", fmt_size(size), plan.mode()));
            let mut w = RoundTrip::new(xprt, &cfg, size)?;
            w.run((plan.rtt_iters / 10).max(1))?; // warm-up
            let (mut ours, mut base) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                ours.push(secs(w.run(plan.rtt_iters)?) * 1e6 / plan.rtt_iters as f64);
                let b = if plan.tcp {
                    baseline::tcp_round_trip(size, plan.rtt_iters, plan.polling, plan.cpus)
                } else {
                    baseline::channel_round_trip(size, plan.rtt_iters, plan.polling, plan.cpus)
                };
                base.push(secs(b) * 1e6 / plan.rtt_iters as f64);
            }
            w.finish();
            let target = match (plan.mem_targets, plan.tcp, plan.polling, size) {
                (_, true, _, 64) => plan.tcp_targets.0.map(Target::RatioAtMost),
                (true, false, true, 64) => Some(Target::AtMost(2.0)),
                (true, false, false, _) => Some(Target::RatioAtMost(1.5)),
                _ => None,
            };
            let name = if plan.tcp {
                tcp_name(plan.polling, &format!("{} ping-pong", fmt_size(size)))
            } else {
                channel_name(plan.polling, size)
            };
            rows.push(row("rtt", size, "us", &ours, &base, name, false, target));
        }
    }
    if plan.wants("oneway") {
        let size = plan.oneway_size;
        progress(&format!(
            "one-way stream {} ({})",
            fmt_size(size),
            plan.mode()
        ));
        let mut w = OneWay::new(xprt, &cfg, size, plan.oneway_window)?;
        w.run((plan.oneway_count / 10).max(1))?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            ours.push(plan.oneway_count as f64 / secs(w.run(plan.oneway_count)?) / 1e6);
            let b = if plan.tcp {
                baseline::tcp_one_way(size, plan.oneway_count, plan.polling, plan.cpus)
            } else {
                baseline::channel_one_way(plan.oneway_count, plan.polling, plan.cpus)
            };
            base.push(plan.oneway_count as f64 / secs(b) / 1e6);
        }
        let multi = w.multi_message();
        w.finish();
        let target = (plan.mem_targets && plan.polling).then_some(Target::AtLeast(1.0));
        let name = if plan.tcp {
            tcp_name(
                plan.polling,
                &format!("stream, one write per {} message", fmt_size(size)),
            )
        } else {
            format!(
                "crossbeam bounded(1024) stream of 64 B arrays ({}){}",
                if plan.polling {
                    "try_recv spin"
                } else {
                    "recv"
                },
                if multi {
                    ""
                } else {
                    "; ours without multi-message buffers"
                }
            )
        };
        rows.push(row(
            "oneway", size, "Mmsg/s", &ours, &base, name, true, target,
        ));
    }
    if plan.wants("bulk") {
        for dir in [BulkDir::Read, BulkDir::Write] {
            for &size in &plan.bulk_sizes {
                let name = if dir == BulkDir::Read {
                    "bulk-read"
                } else {
                    "bulk-write"
                };
                progress(&format!("{name} {} ({})", fmt_size(size), plan.mode()));
                let iters = (plan.bulk_bytes / size.max(1)).max(4) as u64;
                let mut w = Bulk::new(xprt, &cfg, size, dir)?;
                w.run(2)?;
                let (mut ours, mut base, mut relay) = (Vec::new(), Vec::new(), Vec::new());
                let relayed = plan.tcp && plan.relay;
                for _ in 0..runs {
                    let bytes = size as f64 * iters as f64;
                    ours.push(bytes / secs(w.run(iters)?) / 1e9);
                    let b = if plan.tcp {
                        baseline::tcp_stream(size, iters, plan.polling, plan.cpus)
                    } else {
                        baseline::memcpy(size, iters)
                    };
                    base.push(bytes / secs(b) / 1e9);
                    if relayed {
                        relay.push(bytes / secs(baseline::tcp_relay_stream(size, iters)) / 1e9);
                    }
                }
                w.finish();
                let target = match (plan.mem_targets, plan.tcp) {
                    (_, true) if size == 1 << 20 => Some(Target::RatioAtLeast(plan.tcp_targets.1)),
                    (true, false) if size == 1 << 20 => Some(Target::RatioAtLeast(0.8)),
                    _ => None,
                };
                let base_name = if plan.tcp {
                    tcp_name(
                        plan.polling,
                        "stream of the same bytes, whole buffers per call",
                    )
                } else {
                    "single-thread memcpy".to_string()
                };
                rows.push(row(
                    name, size, "GB/s", &ours, &base, base_name, true, target,
                ));
                if relayed {
                    rows.push(row(
                        &format!("{name}-relay"),
                        size,
                        "GB/s",
                        &ours,
                        &relay,
                        format!(
                            "raw loopback TCP relay: writer -> relay (a reading and a writing thread, {} buffers) -> reader, the same bytes",
                            baseline::RELAY_BUFS
                        ),
                        true,
                        None,
                    ));
                }
            }
        }
    }
    if plan.wants("rpc") {
        run_rpc(plan, xprt, &cfg, runs, progress, &mut rows)?;
    }
    Ok(rows)
}

fn tcp_name(polling: bool, what: &str) -> String {
    format!(
        "raw loopback TCP socket pair (TCP_NODELAY), {what}, {}",
        if polling {
            "busy-poll reads"
        } else {
            "blocking reads"
        }
    )
}

/// Progress steps of [`run_rpc`]: round trip, rate, bulk read, bulk write,
/// one-way items.
const RPC_STEPS: usize = 5;

/// The RPC rows: each against the layer below (or the RPC layer's own
/// other setting) measured in the same, interleaved runs.
fn run_rpc(
    plan: &Plan,
    xprt: &dyn Transport,
    cfg: &PairConfig,
    runs: usize,
    progress: &mut dyn FnMut(&str),
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    let n = plan.rpc_iters.max(1);
    progress(&format!(
        "null RPC round trip vs raw 64B message round trip ({})",
        plan.mode()
    ));
    {
        let mut ours_w = RpcRoundTrip::new(xprt, cfg, 1)?;
        let mut base_w = RoundTrip::new(xprt, cfg, 64)?;
        ours_w.run((n / 10).max(1))?;
        base_w.run((n / 10).max(1))?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            ours.push(secs(ours_w.run(n)?) * 1e6 / n as f64);
            base.push(secs(base_w.run(n)?) * 1e6 / n as f64);
        }
        ours_w.finish();
        base_w.finish();
        // Issue 4's targets hold for bulk_mem and TCP alike.
        let target = (plan.mem_targets || plan.tcp).then_some(Target::RatioAtMost(1.5));
        rows.push(row(
            "rpc-rtt",
            0,
            "us",
            &ours,
            &base,
            "raw 64 B message round trip (colibri_bench::RoundTrip), same transport".into(),
            false,
            target,
        ));
    }
    progress(&format!(
        "null RPC rate, {} in flight vs 1 ({})",
        plan.rpc_window,
        plan.mode()
    ));
    {
        let mut ours_w = RpcRoundTrip::new(xprt, cfg, plan.rpc_window)?;
        let mut base_w = RpcRoundTrip::new(xprt, cfg, 1)?;
        ours_w.run((n / 10).max(1))?;
        base_w.run((n / 10).max(1))?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            ours.push(n as f64 / secs(ours_w.run(n)?) / 1e6);
            base.push(n as f64 / secs(base_w.run(n)?) / 1e6);
        }
        ours_w.finish();
        base_w.finish();
        rows.push(row(
            "rpc-rate",
            0,
            "Mcall/s",
            &ours,
            &base,
            format!(
                "the same null calls with 1 in flight (ours: {} in flight)",
                plan.rpc_window
            ),
            true,
            None,
        ));
    }
    let size = plan.rpc_bulk_size;
    let iters = ((256usize << 20) / size.max(1)).clamp(4, 10_000) as u64;
    let iters = if plan.rpc_iters < 1000 { 4 } else { iters };
    for dir in [BulkDir::Read, BulkDir::Write] {
        let name = if dir == BulkDir::Read {
            "rpc-bulk-read"
        } else {
            "rpc-bulk-write"
        };
        progress(&format!(
            "{name} {} vs raw active bulk ({})",
            fmt_size(size),
            plan.mode()
        ));
        let mut ours_w = RpcBulk::with_window(xprt, cfg, size, dir, plan.rpc_bulk_window)?;
        let mut base_w = Bulk::new(xprt, cfg, size, dir)?;
        ours_w.run(2)?;
        base_w.run(2)?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        let bytes = size as f64 * iters as f64;
        for _ in 0..runs {
            ours.push(bytes / secs(ours_w.run(iters)?) / 1e9);
            base.push(bytes / secs(base_w.run(iters)?) / 1e9);
        }
        ours_w.finish();
        base_w.finish();
        let target = ((plan.mem_targets || plan.tcp) && size == 1 << 20)
            .then_some(Target::RatioAtLeast(0.9));
        rows.push(row(
            name,
            size,
            "GB/s",
            &ours,
            &base,
            format!(
                "raw active bulk (colibri_bench::Bulk, {}, 2 transfers in flight), same \
                 transport; ours: {} calls in flight",
                if dir == BulkDir::Read {
                    "client active receive"
                } else {
                    "client active send"
                },
                plan.rpc_bulk_window
            ),
            true,
            target,
        ));
    }
    progress(&format!(
        "RPC one-way 64B items, batched vs one per message ({})",
        plan.mode()
    ));
    {
        let c = plan.rpc_oneway_count.max(1);
        let mut ours_w = RpcOneWay::new(xprt, cfg, 64, true)?;
        let mut base_w = RpcOneWay::new(xprt, cfg, 64, false)?;
        ours_w.run((c / 10).max(1))?;
        base_w.run((c / 10).max(1))?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            ours.push(c as f64 / secs(ours_w.run(c)?) / 1e6);
            base.push(c as f64 / secs(base_w.run(c)?) / 1e6);
        }
        let per = ours_w.items_per_msg();
        ours_w.finish();
        base_w.finish();
        rows.push(row(
            "rpc-oneway",
            64,
            "Mitem/s",
            &ours,
            &base,
            format!("the same items without batching, one per message (ours: {per:.0} items per message)"),
            true,
            None,
        ));
    }
    Ok(())
}

fn channel_name(polling: bool, size: usize) -> String {
    if polling {
        format!(
            "crossbeam bounded(1) ping-pong, try_recv spin, {} copied per hop",
            fmt_size(size)
        )
    } else {
        format!(
            "crossbeam bounded(0) (parking) ping-pong, {} copied per hop",
            fmt_size(size)
        )
    }
}

/// A row from samples of ours and of the baseline: medians, ratio, and
/// whether `target` is met.
#[allow(clippy::too_many_arguments)]
pub fn row(
    test: &str,
    size: usize,
    unit: &'static str,
    ours: &[f64],
    base: &[f64],
    baseline_name: String,
    higher_is_better: bool,
    target: Option<Target>,
) -> Row {
    let ours = Stat::of(ours);
    let baseline = Stat::of(base);
    let ratio = if baseline.median > 0.0 {
        ours.median / baseline.median
    } else {
        0.0
    };
    Row {
        test: test.to_string(),
        size,
        unit,
        ours,
        baseline,
        baseline_name,
        ratio,
        higher_is_better,
        target,
        met: target.map(|t| t.met(ours.median, ratio)),
    }
}

/// A plain-text table of rows.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<17} {:>6} {:>8} {:>24} {:>24} {:>7}  {}\n",
        "test",
        "size",
        "unit",
        "ours median [min-max]",
        "baseline median [min-max]",
        "ratio",
        "target"
    ));
    for r in rows {
        let f = |s: &Stat| format!("{:.3} [{:.3}-{:.3}]", s.median, s.min, s.max);
        let target = match (r.target, r.met) {
            (Some(t), Some(m)) => format!(
                "{} {}",
                t.describe(r.unit),
                if m { "met" } else { "MISSED" }
            ),
            _ => String::new(),
        };
        out.push_str(&format!(
            "{:<17} {:>6} {:>8} {:>24} {:>24} {:>7.3}  {}\n",
            r.test,
            fmt_size(r.size),
            r.unit,
            f(&r.ours),
            f(&r.baseline),
            r.ratio,
            target
        ));
    }
    out.push_str("baselines:\n");
    let mut seen = Vec::new();
    for r in rows {
        if !seen.contains(&r.baseline_name) {
            out.push_str(&format!("  {}: {}\n", r.test, r.baseline_name));
            seen.push(r.baseline_name.clone());
        }
    }
    out.push_str(
        "ratio = ours / baseline (for us, lower is better; for Mmsg/s and GB/s, higher)\n",
    );
    if rows.iter().any(|r| r.target.is_some()) {
        out.push_str(
            "target = the project's goal for that figure (BENCHMARKS.md says why); \
             MISSED means this run did not reach it on this machine: figures depend on \
             the CPU, other load and pinning, so compare the ratio, measured side by side\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_targets() {
        let s = Stat::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stat::of(&[1.0, 2.0, 3.0, 10.0]).median, 2.5);
        assert!(Target::AtMost(2.0).met(1.9, 0.0));
        assert!(!Target::RatioAtLeast(0.8).met(0.0, 0.7));
        let r = row(
            "rtt",
            64,
            "us",
            &[2.0],
            &[1.0],
            "x".into(),
            false,
            Some(Target::RatioAtMost(1.5)),
        );
        assert_eq!(r.ratio, 2.0);
        assert_eq!(r.met, Some(false));
        assert!(table(&[r]).contains("MISSED"));
    }
}
