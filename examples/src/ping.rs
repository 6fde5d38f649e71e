//! Ping: a server that echoes a payload back, and a client that sends
//! pings and measures their round trips. A *bulk* ping moves its bytes
//! through bulk buffers instead ([`bulk_ping`]): the server pulls the
//! client's source and pushes the same bytes into its sink, so each ping
//! is an active bulk read and write by the server, checked byte for byte.
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
use colibri_net::checksum::crc32c;
use colibri_rpc::{
    BulkArg, BulkKind, CallOpts, Request, RpcConfig, RpcHandle, RpcMachine, STATUS_INVALID,
    STATUS_PROTOCOL, Session,
};
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

/// Opcode of a bulk ping: the request offers a source of n bytes and a
/// sink of at least n; the server pulls the source, pushes the same bytes
/// into the sink and replies with their CRC-32C (4 bytes, little-endian).
pub const OP_BULK_PING: u32 = 0x5042;

/// Largest bulk ping (bytes each way).
pub const MAX_BULK_PING: usize = 16 << 20;

/// Makes `m` answer bulk pings. The handler runs on the machine's handler
/// pool ([`RpcHandle::on_blocking`]), where it waits for its transfers.
///
/// # Errors
/// The machine is shutting down, or the pool could not be started.
pub fn install_bulk_server(m: &RpcHandle) -> Result<(), Error> {
    let h = m.clone();
    m.on_blocking(OP_BULK_PING, move |req, reply| match bulk_echo(&h, &req) {
        Ok(sum) => reply.ok(&sum.to_le_bytes()),
        Err(code) => reply.error(code),
    })?;
    Ok(())
}

/// Pulls the request's source and pushes it into its sink; the bytes'
/// CRC-32C, or the failure's status.
fn bulk_echo(m: &RpcHandle, req: &Request) -> Result<u32, i32> {
    let [src, sink] = req.bulk() else {
        return Err(STATUS_PROTOCOL);
    };
    if src.kind != BulkKind::Source || sink.kind != BulkKind::Sink {
        return Err(STATUS_PROTOCOL);
    }
    if src.len == 0 || src.len > MAX_BULK_PING as u64 || sink.len < src.len {
        return Err(STATUS_INVALID);
    }
    let buf = m.alloc(src.len as usize).map_err(|e| e.errno())?;
    let pulled = m
        .bulk_pull(src, buf)
        .wait()
        .map_err(|b| b.error().errno())?;
    let n = pulled.result.map_err(|e| e.errno())?;
    let sum = crc32c(
        &pulled
            .buffer
            .bufvec()
            .to_vec(0, n)
            .map_err(|_| STATUS_INVALID)?,
    );
    let pushed = m
        .bulk_push(sink, pulled.buffer, n)
        .wait()
        .map_err(|b| b.error().errno())?;
    pushed.result.map_err(|e| e.errno())?;
    Ok(sum)
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
    each: impl FnMut(&Reply),
) -> Result<Report, Error> {
    let peer = session.peer().to_string();
    run_pings(peer, count, size, interval, each, |seq| {
        let payload: Vec<u8> = (0..size).map(|i| (i as u64 ^ seq) as u8).collect();
        let t0 = Instant::now();
        let r = session.call_with(OP_PING, &payload, CallOpts::new().timeout(timeout));
        let us = t0.elapsed().as_secs_f64() * 1e6;
        Ok(match r {
            Ok(back) if back == payload => Ok(us),
            Ok(_) => Err("reply payload differs from the request".to_string()),
            Err(colibri_rpc::RpcError::TooBig { len, max }) => {
                return Err(
                    format!("a {len}-byte ping does not fit in a message ({max} max)").into(),
                );
            }
            Err(e) => Err(e.to_string()),
        })
    })
}

/// Runs `count` pings of `size` bytes to `peer`, `interval` apart: `one`
/// makes ping `seq` (its round trip in µs, or why it failed; `Err` stops
/// the run), `each` sees every outcome; returns the summary.
fn run_pings(
    peer: String,
    count: u64,
    size: usize,
    interval: Duration,
    mut each: impl FnMut(&Reply),
    mut one: impl FnMut(u64) -> Result<Result<f64, String>, Error>,
) -> Result<Report, Error> {
    let mut rep = Report {
        peer,
        min_us: f64::INFINITY,
        ..Report::default()
    };
    let mut total = 0.0;
    for seq in 1..=count {
        let r = one(seq)?;
        rep.sent += 1;
        if let Ok(us) = r {
            rep.received += 1;
            total += us;
            rep.min_us = rep.min_us.min(us);
            rep.max_us = rep.max_us.max(us);
        }
        let (rtt_us, error) = match r {
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

/// Sends `count` bulk pings of `size` bytes (1 to [`MAX_BULK_PING`]) over
/// `session`, a machine `m`'s, `interval` apart: each offers a source and
/// a sink, and succeeds when the server's checksum and the bytes it
/// pushed back both match what was sent. `each` sees every ping.
///
/// # Errors
/// A size out of range, or no memory for the buffers; failed pings are
/// counted.
pub fn bulk_ping(
    m: &RpcHandle,
    session: &Session,
    count: u64,
    size: usize,
    interval: Duration,
    timeout: Duration,
    each: impl FnMut(&Reply),
) -> Result<Report, Error> {
    if size == 0 || size > MAX_BULK_PING {
        return Err(format!("a bulk ping moves 1 to {MAX_BULK_PING} bytes, not {size}").into());
    }
    let (mut src, mut sink) = (None, None);
    let peer = session.peer().to_string();
    run_pings(peer, count, size, interval, each, |seq| {
        let data: Vec<u8> = (0..size)
            .map(|i| (i as u64 ^ (seq << 3) ^ (i as u64 >> 9)) as u8)
            .collect();
        let mut s = match src.take() {
            Some(b) => b,
            None => m.alloc(size)?,
        };
        s.bufvec_mut().copy_in(0, &data)?;
        let k = match sink.take() {
            Some(b) => b,
            None => m.alloc(size)?,
        };
        let t0 = Instant::now();
        let out = session
            .start_bulk(
                OP_BULK_PING,
                &[],
                vec![
                    BulkArg::Source { buf: s, len: size },
                    BulkArg::Sink { buf: k },
                ],
                CallOpts::new().timeout(timeout),
            )
            .wait()
            .map_err(|_| "bulk_ping: called on a thread that delivers events")?;
        let us = t0.elapsed().as_secs_f64() * 1e6;
        let mut back = out.buffers.into_iter().map(|d| d.buffer);
        src = back.next();
        sink = back.next();
        let got = sink.as_ref().map(|b| b.bufvec().to_vec(0, size));
        Ok(match (out.result, got) {
            (Ok(sum), Some(Ok(got))) => {
                if sum.as_slice() != crc32c(&data).to_le_bytes() {
                    Err("the server's checksum differs from the data sent".to_string())
                } else if got != data {
                    Err("the bytes pushed back differ from the data sent".to_string())
                } else {
                    Ok(us)
                }
            }
            (Ok(_), _) => Err("the sink buffer did not come back".to_string()),
            (Err(e), _) => Err(e.to_string()),
        })
    })
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
