//! `colibri bench --scale`: growth curves. The per-operation cost of the
//! transport as the number of client transfer machines grows (one server
//! echoing 64-byte messages, 64 in flight in all, clients sharing one
//! domain, then each in its own), and of the LNet simulator as the number
//! of nodes grows (cost per wire message). Bounded: a point that takes
//! longer than its budget stops the curve there.

use std::io::Write;
use std::time::Instant;

use colibri_bench::scale::{EchoScale, ScaleConfig, ScalePoint};
use colibri_lnet_rt::colibri_lnet::scale::{Fabric, FabricShape};
use serde::Serialize;

use std::sync::Arc;
use std::time::Duration;

use colibri_bulk_mem::{MemConfig, MemEngine, MemTransport};
use colibri_bulk_rdma::{RdmaConfig, RdmaEngine, RdmaTransport};
use colibri_bulk_tcp::{TcpConfig, TcpEngine, TcpTransport};
use colibri_net::Transport;

use crate::xprt::Xprt;
use crate::{Machine, round_sig, write_json};

/// One point of the simulator's curve.
#[derive(Debug, Clone, Copy, Serialize)]
struct SimPoint {
    nodes: usize,
    routers: usize,
    /// Wire messages per round.
    messages: usize,
    /// Best of the rounds, wall time per wire message.
    us_per_message: f64,
}

#[derive(Debug, Serialize)]
struct Target {
    what: String,
    measured: f64,
    target: String,
    met: bool,
}

#[derive(Debug, Serialize)]
struct ScaleReport {
    transport: &'static str,
    machine: Machine,
    build: &'static str,
    seconds: f64,
    shared_domain: Vec<ScalePoint>,
    own_domains: Vec<ScalePoint>,
    /// mem and TCP: each client in its own domain, every transfer machine
    /// (mem) or domain (TCP) served by one engine of two threads.
    shared_engine: Vec<ScalePoint>,
    lnet_sim: Vec<SimPoint>,
    targets: Vec<Target>,
}

/// The sizes of each curve.
struct Sizes {
    shared: &'static [usize],
    own: &'static [usize],
    sim: &'static [usize],
    messages: u64,
    sim_rounds: usize,
}

/// `xprt` with every transfer machine (mem) or domain (TCP, RDMA) served by
/// one shared engine of `threads` threads (polling 1 ms or blocking);
/// `None` for a transport without shared engines.
pub(crate) fn shared_engine(
    xprt: Xprt,
    polling: bool,
    threads: usize,
) -> Result<Option<Arc<dyn Transport>>, String> {
    let spin = if polling {
        Duration::from_millis(1)
    } else {
        Duration::ZERO
    };
    Ok(match xprt {
        Xprt::Mem => {
            let engine = MemEngine::new(threads, spin).map_err(|e| e.to_string())?;
            Some(Arc::new(MemTransport::new(MemConfig::shared(&engine))))
        }
        Xprt::Tcp => {
            let engine = TcpEngine::new(
                threads,
                &TcpConfig {
                    spin,
                    ..TcpConfig::default()
                },
            )
            .map_err(|e| e.to_string())?;
            Some(Arc::new(TcpTransport::new(TcpConfig::shared(&engine))))
        }
        Xprt::Rdma => {
            let engine = RdmaEngine::new(
                threads,
                &RdmaConfig {
                    spin,
                    ..RdmaConfig::default()
                },
            )
            .map_err(|e| e.to_string())?;
            Some(Arc::new(RdmaTransport::new(RdmaConfig::shared(&engine))))
        }
        _ => None,
    })
}

/// Runs the curves and prints them.
pub(crate) fn run(
    xprt: Xprt,
    polling: bool,
    smoke: bool,
    json: bool,
    quiet: bool,
) -> Result<(), String> {
    let sizes = if smoke {
        Sizes {
            shared: &[1, 10],
            own: &[1, 4],
            sim: &[2, 64],
            messages: 2_000,
            sim_rounds: 2,
        }
    } else {
        Sizes {
            shared: &[1, 10, 100, 1000],
            own: &[1, 10, 100],
            sim: &[2, 16, 64, 256, 1024],
            messages: 200_000,
            sim_rounds: 10,
        }
    };
    let started = Instant::now();
    let progress = |what: &str| {
        if !quiet {
            eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
        }
    };
    let transport = xprt.transport(polling, 1);
    let curve = |transport: &dyn Transport,
                 ns: &[usize],
                 shared: bool|
     -> Result<Vec<ScalePoint>, String> {
        let mut out = Vec::new();
        for &n in ns {
            progress(&format!(
                "{} clients{}",
                n,
                if shared {
                    " in one domain"
                } else {
                    ", a domain each"
                }
            ));
            let cfg = ScaleConfig {
                clients: n,
                shared_domain: shared,
                messages: sizes.messages,
                ..ScaleConfig::default()
            };
            out.push(EchoScale::run(transport, &cfg).map_err(|e| e.to_string())?);
        }
        Ok(out)
    };
    let shared_domain = curve(&*transport, sizes.shared, true)?;
    let own_domains = curve(&*transport, sizes.own, false)?;
    let shared_engine = match shared_engine(xprt, polling, 2)? {
        Some(t) => {
            progress("the same over one shared engine of two threads");
            curve(&*t, sizes.shared, false)?
        }
        None => Vec::new(),
    };
    let mut lnet_sim = Vec::new();
    for &k in sizes.sim {
        progress(&format!("LNet simulator, {k} nodes"));
        let shape = FabricShape::for_nodes(k);
        let mut f = Fabric::build(shape, 1).map_err(|e| e.to_string())?;
        // The first round also discovers the peers.
        f.round().map_err(|e| e.to_string())?;
        let mut best = f64::MAX;
        let mut messages = 0;
        for _ in 0..sizes.sim_rounds {
            let t = Instant::now();
            let r = f.round().map_err(|e| e.to_string())?;
            if r.failed > 0 {
                return Err(format!("simulator round with {k} nodes: {r:?}"));
            }
            messages = r.wire_messages;
            best = best.min(t.elapsed().as_secs_f64() * 1e6 / r.wire_messages.max(1) as f64);
        }
        lnet_sim.push(SimPoint {
            nodes: k,
            routers: shape.routers,
            messages,
            us_per_message: round_sig(best),
        });
    }
    let mut targets = Vec::new();
    if let (Some(first), Some(last)) = (shared_domain.first(), shared_domain.last())
        && last.clients >= 1000
    {
        let ratio = last.rate / first.rate;
        targets.push(Target {
            what: format!("rate with {} clients in one domain / with 1", last.clients),
            measured: round_sig(ratio),
            target: ">= 0.8".into(),
            met: ratio >= 0.8,
        });
    }
    if let (Some(first), Some(last)) = (shared_engine.first(), shared_engine.last())
        && last.clients >= 1000
    {
        let ratio = last.rate / first.rate;
        targets.push(Target {
            what: format!(
                "rate with {} clients on one shared engine / with 1",
                last.clients
            ),
            measured: round_sig(ratio),
            target: ">= 0.8".into(),
            met: ratio >= 0.8,
        });
    }
    if let (Some(first), Some(last)) = (lnet_sim.first(), lnet_sim.last())
        && last.nodes >= 1024
    {
        let ratio = last.us_per_message / first.us_per_message;
        targets.push(Target {
            what: format!(
                "simulator cost per message, {} nodes / {}",
                last.nodes, first.nodes
            ),
            measured: round_sig(ratio),
            target: "<= 1.2".into(),
            met: ratio <= 1.2,
        });
    }
    let report = ScaleReport {
        transport: xprt.name(),
        machine: Machine::probe(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        seconds: round_sig(started.elapsed().as_secs_f64()),
        shared_domain,
        own_domains,
        shared_engine,
        lnet_sim,
        targets,
    };
    let mut out = std::io::stdout().lock();
    if json {
        return write_json(&mut out, &report);
    }
    let w = |out: &mut std::io::StdoutLock<'_>, s: String| {
        writeln!(out, "{s}").map_err(|e| e.to_string())
    };
    let m = &report.machine;
    w(
        &mut out,
        format!(
            "scale: transport {} ({}), {} build, {} CPUs ({}), {:.1} s",
            report.transport,
            if polling { "polling" } else { "blocking" },
            report.build,
            m.cpus,
            m.cpu_model,
            report.seconds
        ),
    )?;
    for (title, pts) in [
        (
            "one server, N clients in one domain, 64 B echo, 64 in flight",
            &report.shared_domain,
        ),
        (
            "the same, each client in its own domain",
            &report.own_domains,
        ),
        (
            "each client in its own domain, all served by one engine of two threads",
            &report.shared_engine,
        ),
    ] {
        if pts.is_empty() {
            continue;
        }
        w(&mut out, format!("\n== {title}"))?;
        w(
            &mut out,
            format!(
                "{:>6} {:>12} {:>10} {:>10} {:>14}",
                "N", "echoes/s", "p50 µs", "p99 µs", "RSS/client"
            ),
        )?;
        for p in pts {
            w(
                &mut out,
                format!(
                    "{:>6} {:>12.0} {:>10.1} {:>10.1} {:>12.1} K",
                    p.clients,
                    p.rate,
                    p.p50_us,
                    p.p99_us,
                    p.rss_per_client / 1024.0
                ),
            )?;
        }
    }
    w(
        &mut out,
        "\n== LNet simulator: K nodes (clients on two nets, routers, servers), every client PUTs+ACK per round".into(),
    )?;
    w(
        &mut out,
        format!(
            "{:>6} {:>8} {:>10} {:>12}",
            "K", "routers", "msgs/round", "µs/message"
        ),
    )?;
    for p in &report.lnet_sim {
        w(
            &mut out,
            format!(
                "{:>6} {:>8} {:>10} {:>12.2}",
                p.nodes, p.routers, p.messages, p.us_per_message
            ),
        )?;
    }
    if !report.targets.is_empty() {
        w(&mut out, "\n== targets".into())?;
        for t in &report.targets {
            w(
                &mut out,
                format!(
                    "{}: {} (target {}) {}",
                    t.what,
                    t.measured,
                    t.target,
                    if t.met { "met" } else { "MISSED" }
                ),
            )?;
        }
    }
    Ok(())
}
