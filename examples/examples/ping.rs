//! Ping over the RPC layer, client and server in one process.
//!
//! ```text
//! cargo run -p colibri-examples --example ping [-- COUNT [SIZE]]
//! ```
//!
//! Runs over the in-memory transport. Pinging between two processes by
//! address needs the TCP transport, which is not on this branch yet: then
//! `colibri serve --xprt tcp` and `colibri ping --xprt tcp ADDR` do it.

use colibri_bulk_mem::MemTransport;
use colibri_examples::ping;

fn main() -> Result<(), colibri_examples::Error> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().map_or(Ok(10), |a| a.parse())?;
    let size: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let report = ping::run_local_with(
        &MemTransport::default(),
        "127.0.0.1:0:1",
        "127.0.0.1:0:2",
        count,
        size,
        |r| match (&r.rtt_us, &r.error) {
            (Some(us), _) => println!("{} bytes: seq={} time={us:.1} us", r.bytes, r.seq),
            (None, e) => println!("seq={} failed: {}", r.seq, e.as_deref().unwrap_or("?")),
        },
    )?;
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
