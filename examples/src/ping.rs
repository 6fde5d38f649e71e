//! Ping: a server that echoes a payload back, and a client that sends
//! pings and measures their round trips.
//!
//! ```
//! use colibri_bulk_mem::MemTransport;
//! use colibri_examples::ping;
//!
//! let xprt = MemTransport::default();
//! let report = ping::run_local(&xprt, 5, 64).unwrap();
//! assert_eq!(report.received, 5);
//! ```

use std::time::{Duration, Instant};

use colibri_net::Transport;
use colibri_rpc::{CallOpts, RpcConfig, RpcHandle, RpcMachine, Session};
use serde::Serialize;

use crate::Error;

/// Opcode of a ping: the reply carries the request's payload.
pub const OP_PING: u32 = 0x5049;

/// Makes `m` answer pings.
pub fn install_server(m: &RpcHandle) {
    m.on(OP_PING, |req, reply| {
        let p = req.into_payload();
        reply.ok(&p);
    });
}

/// One ping's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Reply {
    /// Sequence number (from 1).
    pub seq: u64,
    /// Bytes echoed.
    pub bytes: usize,
    /// Round trip in microseconds, when the ping succeeded.
    pub rtt_us: Option<f64>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// A ping run's summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Server address.
    pub peer: String,
    /// Pings sent.
    pub sent: u64,
    /// Replies received intact.
    pub received: u64,
    /// Smallest round trip (µs).
    pub min_us: f64,
    /// Mean round trip (µs).
    pub avg_us: f64,
    /// Largest round trip (µs).
    pub max_us: f64,
}

/// Sends `count` pings of `size` bytes over `session`, `interval` apart;
/// `each` sees every reply as it comes.
///
/// # Errors
/// Only local failures (a payload too large); failed pings are counted.
pub fn ping(
    session: &Session,
    count: u64,
    size: usize,
    interval: Duration,
    timeout: Duration,
    mut each: impl FnMut(&Reply),
) -> Result<Report, Error> {
    let mut rep = Report {
        peer: session.peer().to_string(),
        min_us: f64::INFINITY,
        ..Report::default()
    };
    let mut total = 0.0;
    for seq in 1..=count {
        let payload: Vec<u8> = (0..size).map(|i| (i as u64 ^ seq) as u8).collect();
        let t0 = Instant::now();
        let r = session.call_with(OP_PING, &payload, CallOpts::new().timeout(timeout));
        let us = t0.elapsed().as_secs_f64() * 1e6;
        rep.sent += 1;
        let rtt_us = match r {
            Ok(back) if back == payload => {
                rep.received += 1;
                total += us;
                rep.min_us = rep.min_us.min(us);
                rep.max_us = rep.max_us.max(us);
                Ok(us)
            }
            Ok(_) => Err("reply payload differs from the request".to_string()),
            Err(colibri_rpc::RpcError::TooBig { len, max }) => {
                return Err(
                    format!("a {len}-byte ping does not fit in a message ({max} max)").into(),
                );
            }
            Err(e) => Err(e.to_string()),
        };
        let (rtt_us, error) = match rtt_us {
            Ok(us) => (Some(us), None),
            Err(e) => (None, Some(e)),
        };
        each(&Reply {
            seq,
            bytes: size,
            rtt_us,
            error,
        });
        if seq < count && !interval.is_zero() {
            std::thread::sleep(interval);
        }
    }
    if rep.received > 0 {
        rep.avg_us = total / rep.received as f64;
    } else {
        rep.min_us = 0.0;
    }
    Ok(rep)
}

/// Starts a ping server at `addr` over `xprt` (for another process to
/// ping: TCP). The server answers until the returned machine is shut down
/// or dropped; [`RpcHandle::addr`] says where it listens (a port 0 in
/// `addr` picks a free one).
///
/// # Errors
/// The transport's refusal of the address (in use, malformed).
pub fn serve(xprt: &dyn Transport, addr: &str) -> Result<RpcMachine, Error> {
    let m = RpcMachine::start_on(xprt, addr, RpcConfig::default())?;
    install_server(&m);
    Ok(m)
}

/// Pings the server at `server_addr` (in another process, over TCP) from
/// a client machine at `client_addr`: `count` pings of `size` bytes,
/// `each` seeing every reply.
///
/// # Errors
/// Failures to start or stop the client machine, a malformed address;
/// failed pings are counted in the report.
pub fn connect(
    xprt: &dyn Transport,
    client_addr: &str,
    server_addr: &str,
    count: u64,
    size: usize,
    each: impl FnMut(&Reply),
) -> Result<Report, Error> {
    let client = RpcMachine::start_on(xprt, client_addr, RpcConfig::default())?;
    let session = client.session(server_addr)?;
    let report = ping(
        &session,
        count,
        size,
        Duration::ZERO,
        Duration::from_secs(5),
        each,
    );
    drop(session);
    client.shutdown()?;
    report
}

/// Starts a ping server and a client in this process over `xprt`, sends
/// `count` pings of `size` bytes, and shuts both down.
///
/// # Errors
/// Failures to start or stop a machine.
pub fn run_local(xprt: &dyn Transport, count: u64, size: usize) -> Result<Report, Error> {
    run_local_with(xprt, "127.0.0.1:0:1", "127.0.0.1:0:2", count, size, |_| {})
}

/// As [`run_local`], at the given addresses, printing through `each`.
///
/// # Errors
/// As [`run_local`].
pub fn run_local_with(
    xprt: &dyn Transport,
    server_addr: &str,
    client_addr: &str,
    count: u64,
    size: usize,
    each: impl FnMut(&Reply),
) -> Result<Report, Error> {
    let server = RpcMachine::start_on(xprt, server_addr, RpcConfig::default())?;
    install_server(&server);
    let client = RpcMachine::start_on(xprt, client_addr, RpcConfig::default())?;
    let session = client.session(server.addr())?;
    let report = ping(
        &session,
        count,
        size,
        Duration::ZERO,
        Duration::from_secs(5),
        each,
    );
    drop(session);
    client.shutdown()?;
    server.shutdown()?;
    report
}
