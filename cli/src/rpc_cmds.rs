//! `colibri serve` and `colibri ping`: the ping server and client of
//! `colibri-examples`, over any transport, by address.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use colibri_examples::{echo, ping};
use colibri_rpc::{RpcConfig, RpcMachine};
use serde::Serialize;

use crate::xprt::Xprt;
use crate::{round_sig, write_json};

/// Largest ping payload with the default RPC configuration: a request (and
/// its reply) must fit in one message with its headers (the `--size` help
/// says it too; a test keeps the three in step).
pub(crate) const MAX_PING: usize = 16280;

/// Checks that `addr` names a service (`IPv4:PORT:SERVICE`): both
/// transports would take a missing one as service 0, which is almost
/// never what was meant.
pub(crate) fn check_addr(addr: &str) -> Result<(), String> {
    if addr.contains('@') {
        return colibri_lnet_xprt::LnetAddr::parse(addr)
            .map(|_| ())
            .map_err(|e| e.to_string());
    }
    let parts = addr.split(':').count();
    if parts == 2 {
        return Err(format!(
            "address {addr} has no service id: write IPv4:PORT:SERVICE, for example {addr}:1"
        ));
    }
    if parts != 3 {
        return Err(format!(
            "address {addr} is not IPv4:PORT:SERVICE (for example 127.0.0.1:4041:1)"
        ));
    }
    Ok(())
}

/// Set by SIGINT or SIGTERM.
fn stop_flag() -> Result<Arc<AtomicBool>, String> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .map_err(|e| format!("cannot catch signal {sig}: {e}"))?;
    }
    Ok(flag)
}

/// Options of `colibri serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Transport to serve on.
    #[arg(long, value_enum, default_value = "mem")]
    xprt: Xprt,
    /// Address to listen at: IPv4:PORT:SERVICE for both transports (tcp:
    /// port 0 picks a free port; the address is printed). Default:
    /// 127.0.0.1:4040:1 for mem, 127.0.0.1:4041:1 for tcp.
    #[arg(long, short)]
    listen: Option<String>,
    /// lnet: the LNet node to serve on, from a configuration file (YAML,
    /// the `colibri lnet run` shape: several NIs for Multi-Rail, peers,
    /// routes, `accept_port`) instead of one node per NID on port 7988; the
    /// --listen address's NID must be one of its NIs.
    #[arg(long, value_name = "FILE")]
    lnet_config: Option<std::path::PathBuf>,
    /// Stop after this many seconds (default: run until Ctrl-C, SIGINT or
    /// SIGTERM; either way the statistics are printed).
    #[arg(long)]
    duration: Option<f64>,
    /// Transport threads poll before sleeping (lower latency, more CPU).
    #[arg(long)]
    polling: bool,
    /// Print the server's statistics as JSON when it stops.
    #[arg(long)]
    json: bool,
    /// No messages on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Options of `colibri ping`.
#[derive(Debug, clap::Args)]
pub(crate) struct PingArgs {
    /// Address of a `colibri serve` server. Without it, a server is started
    /// in this process (the only way with `--xprt mem`).
    addr: Option<String>,
    /// Transport to use.
    #[arg(long, value_enum, default_value = "mem")]
    xprt: Xprt,
    /// lnet: this client's LNet node from a configuration file (YAML, the
    /// `colibri lnet run` shape), for a server that needs more than the
    /// default node (127.0.0.2@tcp on port 7988): routes to a server on
    /// another net, peers, several NIs, another `accept_port`. The client's
    /// address is the first NI's NID, PID 12345, portal 30, any TMID.
    #[arg(long, value_name = "FILE", requires = "addr")]
    lnet_config: Option<std::path::PathBuf>,
    /// Pings to send.
    #[arg(long, short, default_value_t = 10)]
    count: u64,
    /// Payload bytes per ping (e.g. 64, 4K; at most 16280, what fits in
    /// one message of the default size with its headers; with --bulk, 1
    /// to 16M).
    #[arg(long, short, default_value = "64", value_parser = colibri_bench::parse_size)]
    size: usize,
    /// Bulk pings: each offers --size bytes in a source buffer and as much
    /// room in a sink; the server pulls the source and pushes the bytes
    /// back (an active bulk read and write), and the ping succeeds when
    /// they come back intact.
    #[arg(long)]
    bulk: bool,
    /// Pause between pings, in milliseconds.
    #[arg(long, short, default_value_t = 100)]
    interval: u64,
    /// How long to wait for each reply, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout: u64,
    /// Transport threads poll before sleeping (lower latency, more CPU).
    #[arg(long)]
    polling: bool,
    /// Print every reply and the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Only the summary (or, with --json, no progress on stderr).
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Debug, Serialize)]
struct ServeReport {
    transport: &'static str,
    addr: String,
    seconds: f64,
    stats: colibri_rpc::RpcStats,
}

pub(crate) fn serve(a: &ServeArgs) -> Result<(), String> {
    let addr = a.listen.as_deref().unwrap_or(a.xprt.default_addr(true));
    check_addr(addr).map_err(|e| format!("cannot serve at {addr}: {e}"))?;
    let xprt = match &a.lnet_config {
        Some(_) if a.xprt != Xprt::Lnet => {
            return Err("--lnet-config: only with --xprt lnet".into());
        }
        Some(path) => crate::xprt::lnet_from_config(path)?.0,
        None => a.xprt.transport_at(a.polling, 1, &[addr], false)?,
    };
    let deadline = match a.duration {
        Some(d) if d.is_finite() && d >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(d)),
        Some(d) => {
            return Err(format!(
                "bad --duration {d}: a number of seconds, 0 or more"
            ));
        }
        None => None,
    };
    let stop = stop_flag()?;
    let m = RpcMachine::start_on(&*xprt, addr, RpcConfig::default())
        .map_err(|e| format!("cannot serve at {addr}: {e}"))?;
    ping::install_server(&m);
    ping::install_bulk_server(&m).map_err(|e| format!("cannot serve bulk pings: {e}"))?;
    echo::install_server(&m);
    if !a.quiet {
        eprintln!(
            "serving ping, bulk ping and echo at {} (transport {}); {}",
            m.addr(),
            a.xprt.name(),
            match a.duration {
                Some(d) => format!("stopping after {d} s (or at Ctrl-C)"),
                None => "stop with Ctrl-C".to_string(),
            }
        );
        if !a.xprt.crosses_processes() {
            eprintln!(
                "note: the {} transport is reachable only from this process; \
                 `colibri ping` without an address runs its own server",
                a.xprt.name()
            );
        }
    }
    let start = Instant::now();
    let signalled = loop {
        if stop.load(Ordering::Relaxed) {
            break true;
        }
        let left = deadline.map_or(Duration::from_millis(50), |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            break false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    };
    if signalled && !a.quiet {
        eprintln!("signal received: stopping");
    }
    let report = ServeReport {
        transport: a.xprt.name(),
        addr: m.addr().to_string(),
        seconds: round_sig(start.elapsed().as_secs_f64()),
        stats: m.stats(),
    };
    m.shutdown().map_err(|e| e.to_string())?;
    if a.json {
        write_json(&mut std::io::stdout().lock(), &report)?;
    } else if !a.quiet {
        eprintln!(
            "served {} requests in {:.1} s",
            report.stats.requests, report.seconds
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct PingOutput {
    transport: &'static str,
    local_server: bool,
    replies: Vec<ping::Reply>,
    summary: ping::Report,
}

pub(crate) fn ping_cmd(a: &PingArgs) -> Result<bool, String> {
    if let Some(addr) = &a.addr {
        check_addr(addr)?;
    }
    if a.bulk && !(1..=ping::MAX_BULK_PING).contains(&a.size) {
        return Err(format!(
            "a bulk ping moves 1 to {} bytes, not {}",
            ping::MAX_BULK_PING,
            a.size
        ));
    }
    if !a.bulk && a.size > MAX_PING {
        return Err(format!(
            "a {}-byte ping does not fit in a message ({MAX_PING} bytes at most; \
             --bulk moves up to {} through bulk buffers)",
            a.size,
            ping::MAX_BULK_PING
        ));
    }
    let (own, xprt) = match (&a.addr, &a.lnet_config) {
        (_, Some(_)) if a.xprt != Xprt::Lnet => {
            return Err("--lnet-config: only with --xprt lnet".into());
        }
        (_, Some(path)) => {
            let (xprt, nid) = crate::xprt::lnet_from_config(path)?;
            (format!("{nid}:{}:30:*", crate::xprt::LNET_PID), xprt)
        }
        // Another process may take the free NID between the look and the
        // bind (pings started together): look again.
        (Some(_), None) => {
            let mut tries = 0;
            loop {
                let own = a.xprt.client_addr();
                match a.xprt.transport_at(a.polling, 1, &[&own], false) {
                    Ok(x) => break (own, x),
                    Err(e) if tries < 5 && e.contains("Address already in use") => tries += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        (None, None) => {
            let own = a.xprt.default_addr(false).to_string();
            let x = a
                .xprt
                .transport_at(a.polling, 1, &[&own, a.xprt.local_server_addr()], true)?;
            (own, x)
        }
    };
    let local = match &a.addr {
        Some(_) => None,
        None => {
            let s = RpcMachine::start_on(&*xprt, a.xprt.local_server_addr(), RpcConfig::default())
                .map_err(|e| format!("cannot start the local server: {e}"))?;
            ping::install_server(&s);
            ping::install_bulk_server(&s)
                .map_err(|e| format!("cannot start the local server: {e}"))?;
            Some(s)
        }
    };
    let target = match (&a.addr, &local) {
        (Some(addr), _) => addr.clone(),
        (None, Some(s)) => s.addr().to_string(),
        (None, None) => unreachable!("a local server exists when no address is given"),
    };
    if a.xprt == Xprt::Lnet && a.lnet_config.is_none() && !a.quiet {
        // The default node knows no routes: a server on another net is
        // unreachable (each ping says so; this says why).
        let net = |addr: &str| colibri_lnet_xprt::LnetAddr::parse(addr).map(|x| x.nid.net());
        if let (Ok(mine), Ok(theirs)) = (net(&own), net(&target))
            && mine != theirs
        {
            eprintln!(
                "note: {target} is on {theirs} and this client's node on {mine}, with no \
                 route between them: give --lnet-config FILE with a route through a router"
            );
        }
    }
    let client = RpcMachine::start_on(&*xprt, &own, RpcConfig::default())
        .map_err(|e| format!("cannot start the client: {e}"))?;
    let session = client
        .session(&target)
        .map_err(|e| format!("bad address {target}: {e}"))?;
    let progress = !a.quiet && (!a.json || std::io::stderr().is_terminal());
    if progress {
        eprintln!(
            "PING {target} ({} transport{}): {} bytes{}",
            a.xprt.name(),
            if local.is_some() {
                ", server in this process"
            } else {
                ""
            },
            a.size,
            if a.bulk { " each way through bulk" } else { "" }
        );
    }
    let mut replies = Vec::new();
    let each = |r: &ping::Reply| {
        if progress {
            match (&r.rtt_us, &r.error) {
                (Some(us), _) => eprintln!(
                    "{} bytes from {target}: seq={} time={us:.1} us",
                    r.bytes, r.seq
                ),
                (None, e) => eprintln!("seq={}: {}", r.seq, e.as_deref().unwrap_or("?")),
            }
        }
        replies.push(r.clone());
    };
    let (interval, timeout) = (
        Duration::from_millis(a.interval),
        Duration::from_millis(a.timeout.max(1)),
    );
    let summary = if a.bulk {
        ping::bulk_ping(&client, &session, a.count, a.size, interval, timeout, each)
    } else {
        ping::ping(&session, a.count, a.size, interval, timeout, each)
    }
    .map_err(|e| e.to_string())?;
    drop(session);
    client.shutdown().map_err(|e| e.to_string())?;
    if let Some(s) = local {
        s.shutdown().map_err(|e| e.to_string())?;
    }
    let ok = summary.received == summary.sent && summary.sent > 0;
    let mut out = std::io::stdout().lock();
    if a.json {
        let o = PingOutput {
            transport: a.xprt.name(),
            local_server: a.addr.is_none(),
            replies,
            summary,
        };
        write_json(&mut out, &o)?;
    } else {
        let lost = if summary.sent == 0 {
            0.0
        } else {
            100.0 * (summary.sent - summary.received) as f64 / summary.sent as f64
        };
        let rtt = if summary.received == 0 {
            "no reply came back".to_string()
        } else {
            format!(
                "rtt min/avg/max = {:.1}/{:.1}/{:.1} us",
                summary.min_us, summary.avg_us, summary.max_us
            )
        };
        writeln!(
            out,
            "--- {target} ping statistics ---\n{} sent, {} received, {lost:.0}% lost, {rtt}",
            summary.sent, summary.received,
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_largest_ping_is_what_fits_in_a_default_message() {
        let fits = RpcConfig::default().max_msg_size
            - colibri_rpc::wire::MSG_HEADER_SIZE
            - colibri_rpc::wire::ITEM_HEADER_SIZE;
        assert_eq!(MAX_PING, fits);
        let help = crate::Cli::command()
            .find_subcommand_mut("ping")
            .expect("ping")
            .render_long_help()
            .to_string();
        assert!(help.contains(&MAX_PING.to_string()), "{help}");
    }

    #[test]
    fn addresses_need_a_service() {
        assert!(check_addr("127.0.0.1:4041:1").is_ok());
        let e = check_addr("127.0.0.1:4041").unwrap_err();
        assert!(
            e.contains("no service id") && e.contains("127.0.0.1:4041:1"),
            "{e}"
        );
        assert!(check_addr("localhost").is_err());
    }
}
