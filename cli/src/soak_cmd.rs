//! `colibri soak`: the soak runner of `colibri_ut::soak` from the command
//! line, bounded by a count of operations and a time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use colibri_ut::soak::{SoakConfig, SoakReport, rss_bytes, soak};
use colibri_ut::soak_two_process::{serve_peer, soak_two_process};
use serde::Serialize;

use colibri_lnet_rt::colibri_lnet::ids::Nid;
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};

use crate::xprt::Xprt;

/// Where the LNet soak's two sides start their transfer machines: two
/// nodes of this process, listening on free loopback ports.
const LNET_NIDS: [&str; 2] = ["127.0.64.1@tcp:12345:30:*", "127.0.64.2@tcp:12345:30:*"];

/// The LNet nodes of a two-process soak: ours and the child's (each
/// process has its own, on its own loopback address; the parent picks a
/// free port for the children once and tells both sides where the other
/// listens).
const LNET_PARENT: &str = "127.0.65.1@tcp";
const LNET_CHILD: &str = "127.0.65.2@tcp";

/// An LNet node of a two-process soak at `nid`, listening on `port` (0:
/// any free one), knowing where `peer` listens.
fn lnet_node(
    nid: &str,
    port: u16,
    peer: Option<(&str, std::net::SocketAddr)>,
) -> Result<Lnet, String> {
    let nid: Nid = nid.parse().map_err(|e| format!("{nid}: {e}"))?;
    let mut cfg = LnetConfig::new(&[nid]);
    cfg.accept_port = port;
    // Any source port: the program runs without privilege.
    cfg.accept = AcceptPolicy::All;
    cfg.node.transaction_timeout = Duration::from_secs(20);
    let node = Lnet::start(cfg).map_err(|e| format!("LNet node {nid}: {e}"))?;
    if let Some((p, at)) = peer {
        node.set_peer_addr(p.parse().map_err(|e| format!("{p}: {e}"))?, at);
    }
    Ok(node)
}

/// A free TCP port on `ip` (the child's LNet node listens there; the
/// port is free when looked up, and a child that cannot listen fails its
/// start, which fails the soak with that error; it is looked up once per
/// soak, before the first child).
fn free_port(ip: std::net::Ipv4Addr) -> Result<u16, String> {
    let l = std::net::TcpListener::bind((ip, 0)).map_err(|e| format!("a port on {ip}: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("a port on {ip}: {e}"))
}

/// Options of `colibri soak`.
#[derive(Debug, clap::Args)]
pub(crate) struct SoakArgs {
    /// Transport to soak.
    #[arg(long, value_enum, default_value = "mem")]
    xprt: Xprt,
    /// Stop after this many operations (adds and deletions).
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    duration: f64,
    /// Seed of every random choice (a failing run replays with it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operations between two restarts of the transfer machines.
    #[arg(long, default_value_t = 20_000)]
    epoch_ops: u64,
    /// Seconds between two samples of resident memory.
    #[arg(long, default_value_t = 10.0)]
    sample: f64,
    /// Inject no faults.
    #[arg(long)]
    no_faults: bool,
    /// Run the peer transfer machine in a child process (this program,
    /// driven over a pipe; tcp, rdma and lnet: over LNet each process has
    /// its own node), with its own fault injector and
    /// its own checks; every --kill-every-th epoch the child is killed
    /// with traffic in flight and a new one started.
    #[arg(long)]
    two_process: bool,
    /// With --two-process: kill the peer process every this many epochs
    /// (0: never).
    #[arg(long, default_value_t = 5)]
    kill_every: u64,
    /// Print machine-readable JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Options of the hidden `colibri soak-peer`: the child process of
/// `colibri soak --two-process`.
#[derive(Debug, clap::Args)]
pub(crate) struct PeerArgs {
    /// Transport.
    #[arg(long, value_enum)]
    xprt: Xprt,
    /// Seed of the parent's soak.
    #[arg(long)]
    seed: u64,
    /// Inject no faults.
    #[arg(long)]
    no_faults: bool,
    /// LNet: the port our node listens on.
    #[arg(long, default_value_t = 0)]
    lnet_port: u16,
    /// LNet: where the parent's node listens (`IP:PORT`).
    #[arg(long)]
    lnet_parent: Option<std::net::SocketAddr>,
}

/// Serves the peer side of a two-process soak on standard input and
/// output.
pub(crate) fn soak_peer(a: &PeerArgs) -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let (xprt, addr) = if a.xprt == Xprt::Lnet {
        let parent = a.lnet_parent.ok_or("--xprt lnet needs --lnet-parent")?;
        let node = lnet_node(LNET_CHILD, a.lnet_port, Some((LNET_PARENT, parent)))?;
        let x: std::sync::Arc<dyn colibri_net::Transport> = std::sync::Arc::new(
            LnetTransport::new(vec![node], LnetXprtConfig::default()).map_err(|e| e.to_string())?,
        );
        (x, format!("{LNET_CHILD}:12345:30:*"))
    } else {
        (a.xprt.transport(false, 1), "127.0.0.1:0:1".to_string())
    };
    serve_peer(xprt, &addr, a.seed, !a.no_faults, &mut input, &mut out)
}

#[derive(Debug, Serialize)]
struct Out {
    transport: &'static str,
    two_process: bool,
    seed: u64,
    faults: bool,
    ops: u64,
    adds: u64,
    dels: u64,
    finals: u64,
    payloads_checked: u64,
    /// Two processes: the peer process's adds, payloads checked, and the
    /// peer processes killed with traffic in flight.
    peer_adds: u64,
    peer_payloads_checked: u64,
    peer_kills: u64,
    epochs: u64,
    lost: u64,
    failed: u64,
    delayed: u64,
    duplicated: u64,
    truncated: u64,
    reset: u64,
    seconds: f64,
    /// The longest end-of-epoch stop, in seconds.
    longest_stop: f64,
    /// (seconds since start, resident MiB).
    rss_mib: Vec<(f64, f64)>,
}

fn secs(s: f64, what: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|_| format!("--{what} {s}: not a number of seconds"))
}

/// Runs the soak; an error names the broken invariant and the seed.
pub(crate) fn soak_cmd(a: &SoakArgs) -> Result<(), String> {
    if a.two_process && !matches!(a.xprt, Xprt::Tcp | Xprt::Rdma | Xprt::Lnet) {
        return Err(format!(
            "--two-process runs over tcp, rdma or lnet, not {}",
            a.xprt.name()
        ));
    }
    let cfg = SoakConfig {
        seed: a.seed,
        max_ops: a.ops,
        max_time: secs(a.duration, "duration")?,
        faults: !a.no_faults,
        epoch_ops: a.epoch_ops.max(1),
        sample_every: secs(a.sample, "sample")?,
    };
    static SVC: AtomicU32 = AtomicU32::new(1);
    let xprt = a.xprt;
    let two_process = a.two_process;
    let addr = move || match xprt {
        // bulk_mem: a fresh service each time, any port.
        Xprt::Mem => format!("127.0.0.1:0:{}", SVC.fetch_add(1, Ordering::Relaxed)),
        Xprt::Tcp | Xprt::Rdma => "127.0.0.1:0:1".to_string(),
        // LNet: two nodes in this process, the two sides' transfer
        // machines on different nodes (every message and bulk transfer
        // crosses the socket LND), each at a free TMID.
        Xprt::Lnet if two_process => format!("{LNET_PARENT}:12345:30:*"),
        Xprt::Lnet => LNET_NIDS[SVC.fetch_add(1, Ordering::Relaxed) as usize % 2].to_string(),
    };
    if !a.quiet {
        eprintln!(
            "soak: {} transport{}, seed {}, faults {}, up to {} operations or {:.0} s; resident {:.1} MiB",
            xprt.name(),
            if a.two_process {
                " between two processes"
            } else {
                ""
            },
            a.seed,
            if cfg.faults { "on" } else { "off" },
            a.ops,
            a.duration,
            rss_bytes() as f64 / 1048576.0
        );
    }
    let started = Instant::now();
    let quiet = a.quiet;
    let mut progress = |r: &SoakReport| {
        if !quiet {
            eprintln!(
                "[{:>7.1}s] {} ops, {} adds, {} final events, {} epochs, lost/failed/delayed/duplicated/truncated/reset {}/{}/{}/{}/{}/{}, resident {:.1} MiB",
                started.elapsed().as_secs_f64(),
                r.ops,
                r.adds,
                r.finals,
                r.epochs,
                r.faults.lost,
                r.faults.failed,
                r.faults.delayed,
                r.faults.duplicated,
                r.faults.truncated,
                r.faults.reset,
                rss_bytes() as f64 / 1048576.0
            );
        }
    };
    // Two processes over LNet: our node, which learns each child's port.
    let parent_node = if xprt == Xprt::Lnet && a.two_process {
        Some(lnet_node(LNET_PARENT, 0, None)?)
    } else {
        None
    };
    let transport: std::sync::Arc<dyn colibri_net::Transport> = if let Some(n) = &parent_node {
        std::sync::Arc::new(
            LnetTransport::new(vec![n.clone()], LnetXprtConfig::default())
                .map_err(|e| e.to_string())?,
        )
    } else if xprt == Xprt::Lnet {
        xprt.transport_at(false, 1, &LNET_NIDS, true)?
    } else {
        xprt.transport(false, 1)
    };
    let rep = if a.two_process {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let (seed, faults) = (a.seed, cfg.faults);
        // The child's LNet port, picked once: every restarted child listens
        // on the same one (its listener sets SO_REUSEADDR, so the killed
        // child's connections do not hold it), and nothing else binds the
        // child's address, so no other socket can take the port between two
        // children.
        let child_port = std::sync::OnceLock::new();
        let peer_cmd = move || {
            let mut c = std::process::Command::new(&exe);
            c.args([
                "soak-peer",
                "--xprt",
                xprt.name(),
                "--seed",
                &seed.to_string(),
            ]);
            if !faults {
                c.arg("--no-faults");
            }
            if let Some(n) = &parent_node {
                // The child's node listens on the port picked for the
                // children; ours learns it before the child starts.
                let child: Nid = LNET_CHILD.parse().unwrap_or(Nid::ANY);
                let ip = std::net::Ipv4Addr::from(child.addr());
                let port = *child_port.get_or_init(|| free_port(ip).unwrap_or(0));
                n.set_peer_addr(child, std::net::SocketAddr::from((ip, port)));
                let parent = LNET_PARENT.parse().unwrap_or(Nid::ANY);
                if let Some(at) = n.listen_addr(parent) {
                    c.args([
                        "--lnet-port",
                        &port.to_string(),
                        "--lnet-parent",
                        &at.to_string(),
                    ]);
                }
            }
            c
        };
        soak_two_process(
            transport,
            &addr,
            &peer_cmd,
            &cfg,
            a.kill_every,
            &mut progress,
        )
    } else {
        soak(transport, &addr, &cfg, &mut progress)
    }
    .map_err(|e| format!("soak failed: {e}"))?;
    let out = Out {
        transport: xprt.name(),
        two_process: a.two_process,
        seed: a.seed,
        faults: cfg.faults,
        ops: rep.ops,
        adds: rep.adds,
        dels: rep.dels,
        finals: rep.finals,
        payloads_checked: rep.payloads_checked,
        peer_adds: rep.peer_adds,
        peer_payloads_checked: rep.peer_payloads_checked,
        peer_kills: rep.peer_kills,
        epochs: rep.epochs,
        lost: rep.faults.lost,
        failed: rep.faults.failed,
        delayed: rep.faults.delayed,
        duplicated: rep.faults.duplicated,
        truncated: rep.faults.truncated,
        reset: rep.faults.reset,
        seconds: crate::round_sig(rep.elapsed.as_secs_f64()),
        longest_stop: crate::round_sig(rep.longest_stop.as_secs_f64()),
        rss_mib: rep
            .rss
            .iter()
            .map(|(t, b)| {
                (
                    crate::round_sig(t.as_secs_f64()),
                    crate::round_sig(*b as f64 / 1048576.0),
                )
            })
            .collect(),
    };
    let mut stdout = std::io::stdout().lock();
    if a.json {
        return crate::write_json(&mut stdout, &out);
    }
    use std::io::Write;
    let samples: Vec<String> = out
        .rss_mib
        .iter()
        .map(|(t, m)| format!("{t:.0}s {m:.1}"))
        .collect();
    writeln!(
        stdout,
        "soak passed: {} transport{}, seed {}, {} ops ({} adds, {} deletions) in {:.1} s, {} epochs, \
         every add one final event, {} payloads checked intact, faults lost/failed/delayed/duplicated/truncated/reset \
         {}/{}/{}/{}/{}/{}, longest stop {:.2} s\n\
         resident MiB: {}",
        out.transport,
        if out.two_process {
            format!(
                " between two processes (peer: {} adds, {} payloads checked, {} killed)",
                out.peer_adds, out.peer_payloads_checked, out.peer_kills
            )
        } else {
            String::new()
        },
        out.seed,
        out.ops,
        out.adds,
        out.dels,
        out.seconds,
        out.epochs,
        out.payloads_checked,
        out.lost,
        out.failed,
        out.delayed,
        out.duplicated,
        out.truncated,
        out.reset,
        out.longest_stop,
        samples.join(", ")
    )
    .map_err(|e| e.to_string())
}
