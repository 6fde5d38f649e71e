//! Ping over the RPC layer: client and server in one process (in-memory
//! transport), or in two processes by address (TCP).
//!
//! ```text
//! # one process, in-memory transport
//! cargo run -p colibri-examples --example ping [-- COUNT [SIZE]]
//!
//! # two processes over TCP: a server (port 0 picks a free one; it prints
//! # the address to give the client), then a client
//! cargo run -p colibri-examples --example ping -- --serve 127.0.0.1:0:1 [--for SECONDS]
//! cargo run -p colibri-examples --example ping -- --connect 127.0.0.1:PORT:1 [COUNT [SIZE]]
//! ```
//!
//! The server answers until it is killed (or `--for` seconds pass). The
//! client sends COUNT (10) pings of SIZE (64) bytes, prints each round
//! trip and a summary, and exits with an error if any ping failed.

use std::io::Write;
use std::time::Duration;

use colibri_bulk_mem::MemTransport;
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_examples::ping::{self, Reply, Report};

const USAGE: &str = "usage: ping [COUNT [SIZE]]
       ping --serve ADDR [--for SECONDS]
       ping --connect ADDR [COUNT [SIZE]]
ADDR is IPv4:PORT:SERVICE, e.g. 127.0.0.1:0:1 (port 0: any free port)";

enum Mode {
    Local,
    Serve { addr: String, secs: Option<f64> },
    Connect { addr: String },
}

fn parse(args: Vec<String>) -> Result<(Mode, u64, usize), String> {
    let mut mode = Mode::Local;
    let mut nums = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--serve" => {
                let addr = it.next().ok_or("--serve needs an address")?;
                mode = Mode::Serve { addr, secs: None };
            }
            "--connect" => {
                let addr = it.next().ok_or("--connect needs an address")?;
                mode = Mode::Connect { addr };
            }
            "--for" => {
                let s: f64 = it
                    .next()
                    .ok_or("--for needs a number of seconds")?
                    .parse()
                    .map_err(|e| format!("--for: {e}"))?;
                if !s.is_finite() || s < 0.0 {
                    return Err(format!("--for: bad duration {s}"));
                }
                match &mut mode {
                    Mode::Serve { secs, .. } => *secs = Some(s),
                    _ => return Err("--for goes with --serve".into()),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            o if o.starts_with('-') => return Err(format!("unknown option {o}")),
            n => nums.push(n.parse::<u64>().map_err(|e| format!("{n}: {e}"))?),
        }
    }
    if matches!(mode, Mode::Serve { .. }) && !nums.is_empty() {
        return Err("--serve takes no COUNT or SIZE".into());
    }
    if nums.len() > 2 {
        return Err("too many arguments".into());
    }
    let count = nums.first().copied().unwrap_or(10);
    let size = usize::try_from(nums.get(1).copied().unwrap_or(64)).map_err(|e| e.to_string())?;
    Ok((mode, count, size))
}

fn print_reply(r: &Reply) {
    match (&r.rtt_us, &r.error) {
        (Some(us), _) => println!("{} bytes: seq={} time={us:.1} us", r.bytes, r.seq),
        (None, e) => println!("seq={} failed: {}", r.seq, e.as_deref().unwrap_or("?")),
    }
}

fn summary(report: &Report) -> Result<(), colibri_examples::Error> {
    println!(
        "--- {} ping statistics ---\n{} sent, {} received, rtt min/avg/max = {:.1}/{:.1}/{:.1} us",
        report.peer, report.sent, report.received, report.min_us, report.avg_us, report.max_us
    );
    if report.received == report.sent {
        Ok(())
    } else {
        Err("some pings failed".into())
    }
}

fn main() -> Result<(), colibri_examples::Error> {
    let (mode, count, size) = match parse(std::env::args().skip(1).collect()) {
        Ok(p) => p,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ping: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    match mode {
        Mode::Local => {
            let report = ping::run_local_with(
                &MemTransport::default(),
                "127.0.0.1:0:1",
                "127.0.0.1:0:2",
                count,
                size,
                print_reply,
            )?;
            summary(&report)
        }
        Mode::Serve { addr, secs } => {
            let xprt = TcpTransport::new(TcpConfig::default());
            let server = ping::serve(&xprt, &addr)?;
            // The first line says where to connect (scripts read it).
            println!("ping server listening at {}", server.addr());
            std::io::stdout().flush()?;
            match secs {
                Some(s) => std::thread::sleep(Duration::from_secs_f64(s)),
                None => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
            }
            let served = server.stats().requests;
            server.shutdown()?;
            println!("served {served} pings");
            Ok(())
        }
        Mode::Connect { addr } => {
            let xprt = TcpTransport::new(TcpConfig::default());
            let report = ping::connect(&xprt, "127.0.0.1:0:2", &addr, count, size, print_reply)?;
            summary(&report)
        }
    }
}
