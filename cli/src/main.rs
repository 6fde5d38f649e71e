//! `colibri`: the command-line program of the Colibri messaging layer.
//!
//! `colibri bench` measures a transport (the in-memory one by default)
//! against baselines measured in the same run: message round trips against a
//! crossbeam channel ping-pong, a one-way message stream against a crossbeam
//! channel stream, and bulk bandwidth against `memcpy`. Every figure is the
//! median of interleaved runs with its minimum and maximum, and says whether
//! the transport's threads poll or block and where they are pinned. With
//! `--tests rpc` it measures the RPC layer against the layer below.
//!
//! `colibri serve` runs a ping (and echo) server at an address;
//! `colibri ping` pings one, or a server it starts itself.

#![forbid(unsafe_code)]

mod lnet_bench;
mod lnet_cmd;
mod rpc_cmds;
mod scale_bench;
mod soak_cmd;
mod xprt;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use colibri_bench::parse_size;
use colibri_bench::report::{Plan, Row, run_plan, table};
use serde::Serialize;

use crate::xprt::Xprt;

/// The Colibri messaging layer's command-line program.
#[derive(Debug, Parser)]
#[command(name = "colibri", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Benchmark a transport against baselines measured in the same run.
    ///
    /// Runs message round trips (against a crossbeam channel ping-pong
    /// between two threads), a one-way 64-byte message stream (against a
    /// crossbeam channel stream) and bulk reads and writes (against
    /// single-thread memcpy). Each figure is the median of interleaved runs,
    /// with [min-max]. The client and server transfer machines are pinned to
    /// CPUs 1 and 0 unless --no-pin is given.
    ///
    /// The `rpc` tests measure the RPC layer against the layer below on the
    /// same transport, in interleaved runs: a null RPC round trip against a
    /// raw message round trip (rpc-rtt), 16 null calls in flight against 1
    /// (rpc-rate), 1 MiB bulk reads and writes through RPC against raw
    /// active bulk (rpc-bulk-read, rpc-bulk-write), and 64-byte one-way
    /// items with batching against one item per message (rpc-oneway).
    ///
    /// Examples:
    ///   colibri bench                       # everything, polling and blocking
    ///   colibri bench --mode polling --tests rtt --sizes 64
    ///   colibri bench --mode polling --tests rpc
    ///   colibri bench --smoke --json        # a few seconds, machine-readable
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Run a ping (and typed echo) server at an address.
    ///
    /// The server answers `colibri ping` until it is killed or --duration
    /// passes, then prints what it served. Over the in-memory transport
    /// (the default) only clients in the same process can reach it: use
    /// `colibri ping` without an address instead, which starts its own
    /// server. Between two processes, use a network transport
    /// (`--xprt tcp`).
    ///
    /// Examples:
    ///   colibri serve                                 # mem, 127.0.0.1:4040:1
    ///   colibri serve --listen 127.0.0.1:4041:7 --duration 5 --json
    ///   colibri serve --xprt tcp --listen 127.0.0.1:0:1   # tcp, any free port
    #[command(verbatim_doc_comment)]
    Serve(rpc_cmds::ServeArgs),
    /// Ping a server: send requests, measure round trips.
    ///
    /// With an address, pings the `colibri serve` server there. Without
    /// one, starts a server in this process and pings it (the only way over
    /// the in-memory transport). Prints one line per reply (to stderr) and
    /// a summary; exits with status 1 if any ping failed.
    ///
    /// Examples:
    ///   colibri ping                          # 10 pings to an in-process server
    ///   colibri ping -c 1000 -i 0 -s 4K --polling
    ///   colibri ping --json 127.0.0.1:4040:1  # a server at that address
    ///   colibri ping --xprt tcp 127.0.0.1:4041:1   # a tcp server (another process)
    #[command(verbatim_doc_comment)]
    Ping(rpc_cmds::PingArgs),
    /// Soak a transport: randomized operations with faults injected,
    /// checking that nothing is lost.
    ///
    /// Two transfer machines exchange messages and bulk transfers both
    /// ways, add receive buffers (some with short timeouts), delete
    /// buffers at random, and are stopped (with or without abort) and
    /// restarted every --epoch-ops operations, while a fault injector loses,
    /// duplicates, fails, truncates and delays operations, resets
    /// connections and kills peers. With --two-process the peer runs in a
    /// child process that checks its own side and is killed now and then. After every
    /// epoch it checks that both machines stopped, every add got exactly
    /// one final event, no buffer stayed registered and no end point stayed
    /// referenced; every payload received is checked as it arrives.
    /// Resident memory is sampled every --sample seconds. Stops after --ops
    /// operations or --duration seconds; exits with status 1 and the seed
    /// on the first broken invariant.
    ///
    /// Examples:
    ///   colibri soak --ops 100000 --duration 30
    ///   colibri soak --xprt tcp --ops 100000000 --duration 600 --seed 7
    ///   colibri soak --xprt tcp --two-process --ops 1000000 --duration 120
    #[command(verbatim_doc_comment)]
    Soak(soak_cmd::SoakArgs),
    /// The peer process of `colibri soak --two-process` (commands on
    /// standard input, answers on standard output).
    #[command(hide = true)]
    SoakPeer(soak_cmd::PeerArgs),
    /// Run an LNet node as a process and configure it at run time the way
    /// lnetctl does (YAML), with a selftest.
    ///
    /// Examples:
    ///   colibri lnet run --config router.yaml --ctl /tmp/router.sock
    ///   colibri lnet --ctl /tmp/router.sock net show --verbose
    ///   colibri lnet --ctl /tmp/client.sock ping 127.0.0.1@tcp1
    ///   colibri lnet --ctl /tmp/client.sock selftest brw --to 127.0.0.1@tcp1 --size 1M --duration 5
    #[command(verbatim_doc_comment)]
    Lnet(lnet_cmd::LnetArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Transport threads poll for up to 1 ms before sleeping, so a busy
    /// transfer machine never sleeps (lowest latency).
    Polling,
    /// Transport threads sleep as soon as they are idle.
    Blocking,
    /// Both, one after the other.
    Both,
}

/// `bench --tm-threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TmThreads {
    /// Callbacks on the LNet node's engine thread.
    Off,
    /// A delivery thread per transfer machine.
    On,
    /// Both, one after the other.
    Both,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Transport to measure.
    #[arg(long, value_enum, default_value = "mem")]
    xprt: Xprt,
    /// Whether transport threads poll or block.
    #[arg(long, value_enum, default_value = "both")]
    mode: Mode,
    /// Workloads, comma separated: rtt, oneway, bulk, rpc, all (all of
    /// those), and lnet (LNet over the socket LND, only when named).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    tests: Vec<String>,
    /// Round-trip message sizes (e.g. 64,4K).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Bulk transfer sizes (e.g. 64K,1M,16M).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    bulk_sizes: Option<Vec<usize>>,
    /// Bytes moved per bulk run (e.g. 512M).
    #[arg(long, value_parser = parse_size)]
    bulk_bytes: Option<usize>,
    /// Round trips per run.
    #[arg(long)]
    iters: Option<u64>,
    /// Messages per one-way run.
    #[arg(long)]
    count: Option<u64>,
    /// Interleaved runs per figure.
    #[arg(long)]
    runs: Option<usize>,
    /// lnet: the client and server transfer machines on two nets with a
    /// router node between them (one hop), instead of on one net.
    #[arg(long)]
    routed: bool,
    /// lnet: give every transfer machine its own delivery thread (its
    /// callbacks run there instead of on its LNet node's engine thread),
    /// "on", "off" (the default) or "both" (one section each, back to
    /// back). Only a machine with its own thread can be confined: off,
    /// pinning (--cpus) applies to the baselines' threads alone.
    #[arg(long, value_enum, default_value = "off")]
    tm_threads: TmThreads,
    /// lnet, polling mode: how long (µs) LNet's threads (the socket LND's
    /// schedulers, the transport's engines) look for their next event,
    /// yielding the CPU, before they sleep (`LnetConfig::spin`,
    /// `LnetXprtConfig::spin`; 0: at once). In blocking mode they sleep at
    /// once, as the raw baseline's reads block.
    #[arg(long, default_value_t = 50)]
    lnet_spin: u64,
    /// lnet: socket LND scheduler threads per LNet node. The bench's nodes
    /// share this machine's CPUs, so each gets one by default, as each
    /// side of the raw baseline has one thread (0: the runtime's default,
    /// 2, Lustre's on a small machine).
    #[arg(long, default_value_t = 1)]
    lnet_scheds: usize,
    /// CPUs for the client and server threads (two numbers).
    #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = [1, 0])]
    cpus: Vec<usize>,
    /// Do not pin threads to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Worker threads per transfer machine.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// mem, tcp and rdma: serve every transfer machine (mem) or domain
    /// (tcp, rdma) from one shared engine of this many threads instead of
    /// threads of their own (--workers then does not apply, nor does
    /// pinning).
    #[arg(long)]
    engine_threads: Option<usize>,
    /// A short run (seconds), for checking that everything works.
    #[arg(long)]
    smoke: bool,
    /// Print machine-readable JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Growth curves instead: one server echoing to 1 .. 1,000 client
    /// transfer machines (in one domain, then each in its own), and the
    /// LNet simulator from 2 to 1,024 nodes; with the scale targets.
    /// Uses --xprt, --mode (blocking unless polling: many transfer
    /// machines share two CPUs), --smoke and --json.
    #[arg(long)]
    scale: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct Machine {
    cpus: usize,
    cpu_model: String,
    kernel: String,
}

impl Machine {
    pub(crate) fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or_else(|| "unknown".into(), |s| s.trim().to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        Self {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            kernel,
        }
    }
}

#[derive(Debug, Serialize)]
struct Section {
    mode: &'static str,
    /// lnet: through a router node (`--routed`).
    routed: bool,
    workers: usize,
    /// lnet: a delivery thread per transfer machine (`--tm-threads`).
    tm_threads: bool,
    /// CPUs of the client and server threads: the baselines', and the
    /// transfer machines' when `confined`.
    pinned: Option<(usize, usize)>,
    /// Whether the transfer machines were confined to `pinned` too (a
    /// transport without `Caps::confine`, such as LNet without
    /// `--tm-threads`, runs its callbacks on threads it shares).
    confined: bool,
    rows: Vec<Row>,
}

#[derive(Debug, Serialize)]
struct Report {
    transport: &'static str,
    machine: Machine,
    build: &'static str,
    /// Wall time of the whole run.
    seconds: f64,
    sections: Vec<Section>,
}

fn bench(a: &BenchArgs) -> Result<(), String> {
    if a.scale {
        return scale_bench::run(a.xprt, a.mode == Mode::Polling, a.smoke, a.json, a.quiet);
    }
    let modes: &[bool] = match a.mode {
        Mode::Polling => &[true],
        Mode::Blocking => &[false],
        Mode::Both => &[true, false],
    };
    let ncpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pinned = if a.no_pin {
        None
    } else if a.cpus.iter().any(|&c| c >= ncpus) {
        if !a.quiet {
            eprintln!(
                "note: CPUs {:?} do not all exist ({ncpus} available); threads are not pinned",
                a.cpus
            );
        }
        None
    } else {
        Some((a.cpus[0], a.cpus[1]))
    };
    // One line per step on stderr, "N/M", whether or not it is a terminal
    // (a log file shows where a long run is); --quiet turns it off.
    let progress_on = !a.quiet;
    let started = Instant::now();
    let mut report = Report {
        transport: if a.tests.iter().all(|t| t == "lnet") {
            "lnet"
        } else {
            a.xprt.name()
        },
        machine: Machine::probe(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        seconds: 0.0,
        sections: Vec::new(),
    };
    if report.build == "debug" && !a.quiet {
        eprintln!(
            "note: a debug build; run `cargo run --release -p colibri-cli -- bench` for real figures"
        );
    }
    let plans: Vec<(bool, Plan)> = modes
        .iter()
        .map(|&polling| (polling, bench_plan(a, polling, pinned)))
        .filter(|(_, p)| p.steps() > 0)
        .collect();
    // LNet only when asked by name (not part of `all`).
    let lnet = a.tests.iter().any(|t| t == "lnet");
    let threads: &[bool] = match a.tm_threads {
        _ if a.xprt != Xprt::Lnet => &[false],
        TmThreads::Off => &[false],
        TmThreads::On => &[true],
        TmThreads::Both => &[false, true],
    };
    let plans: Vec<(bool, bool, Plan)> = plans
        .into_iter()
        .flat_map(|(polling, plan)| threads.iter().map(move |&t| (polling, t, plan.clone())))
        .collect();
    let total: usize =
        plans.iter().map(|(_, _, p)| p.steps()).sum::<usize>() + if lnet { 3 } else { 0 };
    let mut step = 0;
    for (polling, tm_threads, plan) in plans {
        if a.routed && a.xprt != Xprt::Lnet {
            return Err("--routed: only for --xprt lnet".into());
        }
        xprt::set_lnet_tm_threads(tm_threads);
        xprt::set_lnet_spin(std::time::Duration::from_micros(a.lnet_spin));
        xprt::set_lnet_scheds(a.lnet_scheds);
        let pair = a.xprt.pair(a.routed);
        let xprt = match a.engine_threads {
            Some(n) if matches!(a.xprt, Xprt::Mem | Xprt::Tcp | Xprt::Rdma) => {
                scale_bench::shared_engine(a.xprt, polling, n)?
                    .ok_or("--engine-threads: this transport has no shared engine")?
            }
            _ => a.xprt.transport_at(
                polling,
                a.workers,
                &[&pair.client_addr, &pair.server_addr],
                true,
            )?,
        };
        let mode = if polling { "polling" } else { "blocking" };
        let mut progress = |what: &str| {
            step += 1;
            if progress_on {
                eprintln!(
                    "[{:>6.1}s] {step}/{total} {what}",
                    started.elapsed().as_secs_f64()
                );
            }
        };
        // What the pair's machines will do with `pinned` (the bench goes
        // on without pinning where the transport cannot confine).
        let confined = pinned.is_some()
            && colibri_net::Domain::new(&*xprt)
                .map(|d| d.caps().confine)
                .unwrap_or(false);
        let rows = run_plan(&plan, &*xprt, &pair, &mut progress).map_err(|e| e.to_string())?;
        report.sections.push(Section {
            mode,
            routed: a.routed,
            workers: a.workers.max(1),
            tm_threads,
            pinned,
            confined,
            rows,
        });
    }
    if lnet {
        let mut progress = |what: &str| {
            step += 1;
            if progress_on {
                eprintln!(
                    "[{:>6.1}s] {step}/{total} {what}",
                    started.elapsed().as_secs_f64()
                );
            }
        };
        let rows = lnet_bench::lnet_rows(a.runs.unwrap_or(5), a.smoke, pinned, &mut progress)?;
        report.sections.push(Section {
            mode: "lnet",
            routed: false,
            workers: 1,
            tm_threads: false,
            pinned,
            // The LNet API rows pin their baselines only (lnet_bench.rs):
            // the nodes' threads serve both sides.
            confined: false,
            rows,
        });
    }
    report.seconds = round_sig(started.elapsed().as_secs_f64());
    let mut out = std::io::stdout().lock();
    if a.json {
        write_json(&mut out, &report)?;
    } else {
        let m = &report.machine;
        writeln!(
            out,
            "transport {}, {} build, {} CPUs ({}), kernel {}, {:.2} s total",
            report.transport, report.build, m.cpus, m.cpu_model, m.kernel, report.seconds
        )
        .map_err(|e| e.to_string())?;
        for s in &report.sections {
            let pin = match s.pinned {
                None => "not pinned".to_string(),
                Some((c, sv)) if s.confined => format!("client on CPU {c}, server on CPU {sv}"),
                Some((c, sv)) => format!(
                    "baselines' client on CPU {c} and server on CPU {sv}; transfer machines not pinned (the transport cannot confine them in this configuration)"
                ),
            };
            let threads = if s.mode == "lnet" {
                "socket LND over loopback, runtime threads block in epoll".to_string()
            } else if a.routed {
                "transfer machines on two LNet nets, through a router node".to_string()
            } else if s.tm_threads {
                format!(
                    "LNet, a delivery thread per transfer machine, LNet threads look {} µs before they sleep",
                    if s.mode == "polling" { a.lnet_spin } else { 0 }
                )
            } else if report.transport == "lnet" {
                format!(
                    "LNet, callbacks on the nodes' engine threads, LNet threads look {} µs before they sleep",
                    if s.mode == "polling" { a.lnet_spin } else { 0 }
                )
            } else if let Some(n) = a.engine_threads {
                format!("one shared engine of {n} thread(s) for every domain")
            } else if report.transport == "tcp" || report.transport == "rdma" {
                "I/O threads (one per domain)".to_string()
            } else {
                format!("workers ({} per transfer machine)", s.workers)
            };
            writeln!(out, "\n== {} {threads}, {pin}", s.mode).map_err(|e| e.to_string())?;
            write!(out, "{}", table(&s.rows)).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The plan of one mode, from the command line.
fn bench_plan(a: &BenchArgs, polling: bool, pinned: Option<(usize, usize)>) -> Plan {
    let mut plan = if a.smoke {
        Plan::smoke(polling)
    } else {
        Plan::standard(polling)
    };
    plan.cpus = pinned;
    plan.tests.clone_from(&a.tests);
    if let Some(s) = &a.sizes {
        plan.rtt_sizes.clone_from(s);
    }
    if let Some(s) = &a.bulk_sizes {
        plan.bulk_sizes.clone_from(s);
    }
    if let Some(b) = a.bulk_bytes {
        plan.bulk_bytes = b;
    }
    if let Some(i) = a.iters {
        plan.rtt_iters = i;
    }
    if let Some(c) = a.count {
        plan.oneway_count = c;
    }
    if let Some(r) = a.runs {
        plan.runs = r;
    }
    // TCP is compared with a raw loopback TCP socket pair, and against
    // its own targets.
    plan.tcp = matches!(a.xprt, Xprt::Tcp | Xprt::Lnet);
    if a.xprt == Xprt::Lnet {
        plan.bulk_sizes
            .retain(|&s| s <= colibri_lnet_xprt::MAX_BUFFER);
        // LNet's own targets: 1 MiB bulk at least 0.85x a raw stream,
        // 0.7x through a router (no round-trip target there).
        plan.tcp_targets = if a.routed {
            (None, 0.7)
        } else {
            (Some(1.3), 0.85)
        };
        plan.relay = a.routed;
    }
    plan.mem_targets &= !plan.tcp;
    plan
}

/// Rounds to six significant digits, so that JSON shows `344.2`, not
/// `344.20000000000005`, and small rates keep their digits.
pub(crate) fn round_sig(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let k = 5 - x.abs().log10().floor() as i32;
    if k >= 0 {
        let scale = 10f64.powi(k);
        (x * scale).round() / scale
    } else {
        let scale = 10f64.powi(-k);
        (x / scale).round() * scale
    }
}

/// Rounds every floating-point number of a JSON value to six significant
/// digits.
fn round_json(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) if n.is_f64() => {
            if let Some(r) = n
                .as_f64()
                .map(round_sig)
                .and_then(serde_json::Number::from_f64)
            {
                *n = r;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(round_json),
        serde_json::Value::Object(o) => o.values_mut().for_each(round_json),
        _ => {}
    }
}

/// Writes `value` as pretty JSON with rounded numbers, and a newline.
pub(crate) fn write_json(out: &mut impl Write, value: &impl Serialize) -> Result<(), String> {
    let mut v = serde_json::to_value(value).map_err(|e| e.to_string())?;
    round_json(&mut v);
    serde_json::to_writer_pretty(&mut *out, &v).map_err(|e| e.to_string())?;
    writeln!(out).map_err(|e| e.to_string())
}

/// `colibri lnet` takes unambiguous prefixes of long options, as
/// `lnetctl` (getopt_long) does: `--prim` for `--prim_nid`.
fn with_inferred_long_args(c: clap::Command) -> clap::Command {
    let names: Vec<String> = c
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    names.into_iter().fold(c.infer_long_args(true), |c, n| {
        c.mut_subcommand(n, with_inferred_long_args)
    })
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command()
        .mut_subcommand("lnet", with_inferred_long_args)
        .get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // `colibri lnet run` is a daemon: it logs at info level by default.
    let level = match &cli.cmd {
        Cmd::Lnet(a) if a.is_run() => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only on a terminal, and never with NO_COLOR set.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let res = match &cli.cmd {
        Cmd::Lnet(a) => return lnet_cmd::lnet_main(a),
        Cmd::Bench(a) => bench(a),
        Cmd::Serve(a) => rpc_cmds::serve(a),
        Cmd::Soak(a) => soak_cmd::soak_cmd(a),
        Cmd::SoakPeer(a) => soak_cmd::soak_peer(a),
        Cmd::Ping(a) => match rpc_cmds::ping_cmd(a) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("colibri: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_sig;

    #[test]
    fn rounding_keeps_six_significant_digits() {
        assert_eq!(round_sig(344.200_000_000_000_05), 344.2);
        assert_eq!(round_sig(0.000_493_123_456), 0.000_493_123);
        assert_eq!(round_sig(12_345_678.9), 12_345_700.0);
        assert_eq!(round_sig(-2.5), -2.5);
        assert_eq!(round_sig(0.0), 0.0);
        assert_eq!(serde_json::to_string(&round_sig(0.1 + 0.2)).unwrap(), "0.3");
    }
}
