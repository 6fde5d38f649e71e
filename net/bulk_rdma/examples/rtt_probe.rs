//! Where a message round trip's time goes (development aid, run in the
//! Soft-RoCE VM):
//!
//! ```text
//! cargo build --release -p colibri-bulk-rdma --example rtt_probe
//! ../shared/rdma-vm/run.sh --net lo -- target/release/examples/rtt_probe [ITERS] [RUNS] [CONFIG...]
//! ```
//!
//! CONFIG is any of `polling`, `blocking` (an engine thread per domain,
//! spinning 1 ms or none before it sleeps), `shared-polling`,
//! `shared-blocking` (both domains on one shared engine thread), and
//! `tcp-polling`, `tcp-blocking`, `tcp-shared-polling` (the TCP transport
//! in the same boot, for comparison), `mem-polling`, `mem-shared-polling`
//! (the in-memory transport: what the core and the callbacks cost). For each run it prints the
//! distribution of the 64 B round trips (from the client's
//! `add_msg_send` to its receive callback for the echo, as
//! `colibri_bench::RoundTrip` measures them) and, per thread of the
//! process, the context switches (`/proc/self/task/*/status`) and the
//! time on a CPU and waiting for one (`schedstat`) during the run; the
//! last run (of several) is also sampled every 2 ms by a thread of its
//! own: each thread's state, and where it sleeps (`wchan`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_bench::{PairConfig, RoundTrip};
use colibri_bulk_mem::{MemConfig, MemEngine, MemTransport};
use colibri_bulk_rdma::{RdmaConfig, RdmaEngine, RdmaTransport};
use colibri_bulk_tcp::{TcpConfig, TcpEngine, TcpTransport};
use colibri_net::Transport;

/// Per-thread counters: (name, voluntary, involuntary switches, ns on a
/// CPU, ns waiting for one).
fn threads() -> BTreeMap<u32, (String, u64, u64, u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let p = e.path();
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let sched = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        let mut s = sched
            .split_whitespace()
            .map(|x| x.parse::<u64>().unwrap_or(0));
        out.insert(
            tid,
            (
                field("Name:"),
                field("voluntary_ctxt_switches:").parse().unwrap_or(0),
                field("nonvoluntary_ctxt_switches:").parse().unwrap_or(0),
                s.next().unwrap_or(0),
                s.next().unwrap_or(0),
            ),
        );
    }
    out
}

/// Samples, every 2 ms until `stop`, what each thread of the process is
/// doing: running or runnable (`R`), or the kernel function it sleeps in
/// (`wchan`); returns the counts per thread name and state.
fn sample_states(
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<BTreeMap<(String, String), u64>> {
    std::thread::spawn(move || {
        let me = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
        let mut counts = BTreeMap::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
                for e in dir.flatten() {
                    let tid = e.file_name().to_string_lossy().into_owned();
                    if Some(&tid) == me.as_ref() {
                        continue;
                    }
                    let p = e.path();
                    let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
                    // "tid (comm) S ...": the state follows the last ')'.
                    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                        continue;
                    };
                    let name = stat
                        .find('(')
                        .zip(stat.rfind(')'))
                        .map(|(a, b)| stat[a + 1..b].to_string())
                        .unwrap_or_default();
                    let st = rest.split_whitespace().next().unwrap_or("?").to_string();
                    let what = if st == "R" {
                        "R (running or runnable)".to_string()
                    } else {
                        let w = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
                        format!("{st} in {w}")
                    };
                    *counts.entry((name, what)).or_insert(0) += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        counts
    })
}

fn transport(name: &str) -> Option<Arc<dyn Transport>> {
    let spin = |polling: bool| {
        if polling {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        }
    };
    Some(match name {
        "polling" => Arc::new(RdmaTransport::new(RdmaConfig::polling())),
        "blocking" => Arc::new(RdmaTransport::new(RdmaConfig::blocking())),
        "shared-polling" | "shared-blocking" => {
            let cfg = RdmaConfig {
                spin: spin(name == "shared-polling"),
                ..RdmaConfig::default()
            };
            let engine = RdmaEngine::new(1, &cfg).ok()?;
            Arc::new(RdmaTransport::new(RdmaConfig::shared(&engine)))
        }
        "tcp-polling" | "tcp-blocking" => Arc::new(TcpTransport::new(TcpConfig {
            spin: spin(name == "tcp-polling"),
            ..TcpConfig::default()
        })),
        "tcp-shared-polling" => {
            let cfg = TcpConfig {
                spin: spin(true),
                ..TcpConfig::default()
            };
            let engine = TcpEngine::new(1, &cfg).ok()?;
            Arc::new(TcpTransport::new(TcpConfig::shared(&engine)))
        }
        "mem-polling" => Arc::new(MemTransport::new(MemConfig::polling())),
        "mem-shared-polling" => {
            let engine = MemEngine::new(1, spin(true)).ok()?;
            Arc::new(MemTransport::new(MemConfig::shared(&engine)))
        }
        _ => return None,
    })
}

fn pct(v: &[Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iters: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let mut configs: Vec<&str> = args.iter().skip(2).map(String::as_str).collect();
    if configs.is_empty() {
        configs = vec!["polling", "blocking", "shared-polling", "shared-blocking"];
    }
    for name in configs {
        let Some(xprt) = transport(name) else {
            eprintln!("{name}: unknown configuration or no engine");
            continue;
        };
        let mut rt = match RoundTrip::new(xprt.as_ref(), &PairConfig::mem(), 64) {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("{name}: {e}");
                continue;
            }
        };
        rt.record_latencies(true);
        if let Err(e) = rt.run((iters / 10).max(1)) {
            eprintln!("{name}: warm-up: {e}");
            continue;
        }
        for r in 1..=runs {
            let before = threads();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = (r == runs && runs > 1).then(|| sample_states(Arc::clone(&stop)));
            let t0 = Instant::now();
            let d = match rt.run(iters) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("{name}: {e}");
                    break;
                }
            };
            let wall = t0.elapsed();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let states = sampler.and_then(|h| h.join().ok()).unwrap_or_default();
            let after = threads();
            let mut lat = rt.latencies();
            lat.sort_unstable();
            println!(
                "{name} run {r}: {iters} round trips, mean {:.1} us; min {:.1} p50 {:.1} p90 {:.1} p99 {:.1} max {:.1} us (wall {:.2} s)",
                d.as_secs_f64() * 1e6 / iters as f64,
                pct(&lat, 0.0),
                pct(&lat, 0.5),
                pct(&lat, 0.9),
                pct(&lat, 0.99),
                pct(&lat, 1.0),
                wall.as_secs_f64()
            );
            for (tid, (n, vol, inv, run, wait)) in &after {
                let (v0, i0, r0, w0) = before
                    .get(tid)
                    .map_or((0, 0, 0, 0), |b| (b.1, b.2, b.3, b.4));
                let (dv, di) = (vol - v0, inv - i0);
                if dv + di == 0 && run - r0 == 0 {
                    continue;
                }
                println!(
                    "    thread {tid:>6} {n:<24} switches/rt vol {:.2} invol {:.2}; on cpu {:.0}% waiting for one {:.0}% of the run",
                    dv as f64 / iters as f64,
                    di as f64 / iters as f64,
                    (run - r0) as f64 / wall.as_nanos() as f64 * 100.0,
                    (wait - w0) as f64 / wall.as_nanos() as f64 * 100.0,
                );
            }
            // The last run (of several) is sampled every 2 ms.
            for ((thread, what), n) in &states {
                println!("    sampled {thread:<24} {what}: {n}");
            }
        }
        rt.finish();
    }
}
