//! The acceptor and the connection daemons: connection request and V3
//! HELLO in both directions, on blocking sockets with timeouts.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use colibri_lnet::ids::{LNET_PID_USERFLAG, Nid, ProcessId};
use colibri_lnet::socklnd::acceptor::{CONNREQ_LEN, connector_ports};
use colibri_lnet::socklnd::hello::HELLO_LEN;
use colibri_lnet::socklnd::{
    ActiveReply, ConnReq, ConnType, FrameReceiver, Hello, HelloError, ReceivedHello, Refusal,
    SocketError, check_active_reply, check_passive_hello,
};
use crossbeam_channel::Receiver;
use socket2::{Domain, Protocol, Socket, Type};

use super::{ConndJob, Listener, SockLnd, SockNi, TARGET};
use crate::LnetError;
use crate::core::Shared;

/// The acceptor's waker token.
pub(super) const ACCEPT_WAKER: mio::Token = mio::Token(usize::MAX);
const LISTENER: mio::Token = mio::Token(0);

/// A listening socket on `addr` (SO_REUSEADDR, backlog 127).
pub(super) fn listener(addr: SocketAddr) -> Result<std::net::TcpListener, LnetError> {
    let io = |what: &str, source| LnetError::Io {
        what: format!("{what} {addr}"),
        source,
    };
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| io("socket for", e))?;
    s.set_reuse_address(true)
        .map_err(|e| io("SO_REUSEADDR on", e))?;
    s.bind(&addr.into()).map_err(|e| io("binding", e))?;
    s.listen(127).map_err(|e| io("listening on", e))?;
    s.set_nonblocking(true).map_err(|e| io("non-blocking", e))?;
    Ok(s.into())
}

/// The acceptor of one NI: takes connections and hands them to the connds.
pub(super) fn acceptor(
    lnd: &Arc<SockLnd>,
    shared: &Listener,
    mut poll: mio::Poll,
    l: std::net::TcpListener,
) {
    let at = shared.addr;
    let mut l = mio::net::TcpListener::from_std(l);
    if let Err(e) = poll
        .registry()
        .register(&mut l, LISTENER, mio::Interest::READABLE)
    {
        tracing::error!(target: TARGET, %at, error = %e, "acceptor cannot poll its listener");
        return;
    }
    let mut events = mio::Events::with_capacity(16);
    while !lnd.stopping.load(Ordering::Acquire) && !shared.stop.load(Ordering::Acquire) {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_secs(1)))
            && e.kind() != io::ErrorKind::Interrupted
        {
            tracing::error!(target: TARGET, %at, error = %e, "acceptor poll failed");
            return;
        }
        loop {
            match l.accept() {
                Ok((s, from)) => {
                    let s: TcpStream = s.into();
                    if lnd.accept_tx.try_send(ConndJob::Accept(s, from)).is_err() {
                        lnd.log_close(format!(
                            "refused connection from {from} on {at}: connection daemons busy"
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(target: TARGET, %at, error = %e, "accept failed");
                    break;
                }
            }
        }
    }
    tracing::debug!(target: TARGET, %at, "acceptor stopped");
}

/// A connection daemon: runs handshakes until told to stop, the passive
/// ones (`accepts`) first.
pub(super) fn connd(
    s: &Arc<Shared>,
    lnd: &Arc<SockLnd>,
    rx: &Receiver<ConndJob>,
    accepts: &Receiver<ConndJob>,
) {
    loop {
        let job = match accepts.try_recv() {
            Ok(job) => job,
            Err(_) => crossbeam_channel::select! {
                recv(accepts) -> job => match job {
                    Ok(job) => job,
                    Err(_) => break,
                },
                recv(rx) -> job => match job {
                    Ok(job) => job,
                    Err(_) => break,
                },
            },
        };
        if matches!(job, ConndJob::Stop) {
            break;
        }
        if lnd.stopping.load(Ordering::Acquire) {
            if let ConndJob::Connect(ni, peer) = job {
                let inputs =
                    lnd.connect_done(s, &ni, peer, Some((SocketError::NetDown, false)), s.now());
                if !inputs.is_empty() {
                    s.run(inputs, |_, _| ());
                }
            }
            continue;
        }
        match job {
            ConndJob::Stop => break,
            ConndJob::Accept(stream, from) => passive(s, lnd, stream, from),
            ConndJob::Connect(ni, peer) => active(s, lnd, &ni, peer),
        }
    }
}

/// The connection daemon for passive handshakes only: however many active
/// handshakes block the others, a socket accepted is answered (within
/// `accept_timeout`).
pub(super) fn passive_connd(s: &Arc<Shared>, lnd: &Arc<SockLnd>, accepts: &Receiver<ConndJob>) {
    while !lnd.stopping.load(Ordering::Acquire) {
        match accepts.recv_timeout(Duration::from_millis(200)) {
            Ok(ConndJob::Accept(stream, from)) => {
                if !lnd.stopping.load(Ordering::Acquire) {
                    passive(s, lnd, stream, from);
                }
            }
            Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// Why a HELLO could not be read.
enum HelloRead {
    /// The socket failed (or timed out, or closed).
    Io(io::Error),
    /// The bytes are not a HELLO we accept.
    Bad(HelloError),
}

impl std::fmt::Display for HelloRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "reading HELLO: {e}"),
            Self::Bad(e) => e.fmt(f),
        }
    }
}

fn read_hello(stream: &mut TcpStream) -> Result<ReceivedHello, HelloRead> {
    let mut buf = vec![0u8; HELLO_LEN];
    stream.read_exact(&mut buf).map_err(HelloRead::Io)?;
    loop {
        match Hello::decode(&buf) {
            Ok(h) => return Ok(h),
            Err(HelloError::Short { needed, .. }) if needed > buf.len() && needed <= 4096 => {
                let have = buf.len();
                buf.resize(needed, 0);
                stream.read_exact(&mut buf[have..]).map_err(HelloRead::Io)?;
            }
            Err(e) => return Err(HelloRead::Bad(e)),
        }
    }
}

fn peer_v4(a: SocketAddr) -> (Ipv4Addr, u16) {
    match a.ip() {
        IpAddr::V4(ip) => (ip, a.port()),
        IpAddr::V6(ip) => (
            ip.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
            a.port(),
        ),
    }
}

/// The passive side: connection request, the peer's HELLO, admission, our
/// answer. Every refusal closes the socket with a logged reason.
fn passive(s: &Arc<Shared>, lnd: &Arc<SockLnd>, mut stream: TcpStream, from: SocketAddr) {
    let refuse = |why: String| lnd.log_close(format!("closed connection from {from}: {why}"));
    let (peer_ip, peer_port) = peer_v4(from);
    if let Err(e) = lnd.cfg.accept.check(peer_port) {
        return refuse(e.to_string());
    }
    let t = Some(lnd.cfg.accept_timeout);
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(t).is_err()
        || stream.set_write_timeout(t).is_err()
    {
        return refuse("cannot set socket timeouts".into());
    }
    let _ = stream.set_nodelay(!lnd.cfg.tun.nagle);
    tune_socket(lnd, lnd.cfg.tun.tos, &socket2::SockRef::from(&stream));
    // Connection request.
    let mut req = [0u8; CONNREQ_LEN];
    if let Err(e) = stream.read_exact(&mut req) {
        return refuse(format!("reading the connection request: {e}"));
    }
    let (req, _) = match ConnReq::decode(&req) {
        Ok(r) => r,
        Err(e) => {
            if let Some(reply) = e.reply() {
                let _ = stream.write_all(&reply);
            }
            return refuse(format!("bad connection request: {e}"));
        }
    };
    if let Err(e) = req.check_target(&lnd.local_nids()) {
        return refuse(e.to_string());
    }
    let Some(ni) = lnd.ni_for_connreq(req.nid) else {
        return refuse(format!("no NI {}", req.nid));
    };
    // The NI's own type of service, now that it is known.
    let tos = ni.tos(lnd);
    if tos != lnd.cfg.tun.tos {
        set_tos(&socket2::SockRef::from(&stream), tos);
    }
    // The peer's HELLO.
    let hello = match read_hello(&mut stream) {
        Ok(h) => h,
        Err(e) => {
            if matches!(e, HelloRead::Bad(HelloError::UnsupportedVersion(_))) {
                // Our V3 HELLO with type NONE, so the peer can retry in V3.
                let _ = stream.write_all(&ni.local.version_reply().encode());
            }
            return refuse(format!("bad HELLO: {e}"));
        }
    };
    let seen = match check_passive_hello(&ni.local, &hello.hello, peer_ip, peer_port) {
        Ok(p) => p,
        Err(e) => return refuse(format!("HELLO refused: {e}")),
    };
    let loopback = peer_ip == ni.ip();
    let now = s.now();
    let admitted = lnd.admit(
        &ni,
        seen.peer.nid,
        seen.conn_type,
        seen.incarnation,
        false,
        loopback,
        now,
    );
    match admitted {
        Ok(conn) => {
            let reply = ni
                .local
                .passive_reply(&hello.hello, Some(seen.conn_type))
                .encode();
            if let Err(e) = stream.write_all(&reply) {
                refuse(format!("writing HELLO: {e}"));
                // Registered already: its scheduler closes it at once
                // (failing whatever was queued on it meanwhile).
                conn.closing.store(true, Ordering::Release);
            }
            let mut fr = FrameReceiver::new(hello.byte_order);
            if seen.peer.pid & LNET_PID_USERFLAG != 0 {
                fr = fr.with_src_override(seen.peer);
            }
            tracing::debug!(target: TARGET, peer = %seen.peer, conn_type = %seen.conn_type,
                ni = %ni.nid, "passive connection established");
            lnd.activate(&ni, &conn, stream, fr, now);
        }
        Err(reason) => {
            if reason.reply_none() {
                let _ = stream.write_all(&ni.local.passive_reply(&hello.hello, None).encode());
            }
            refuse(format!(
                "connection from {} refused: {}",
                seen.peer,
                refusal_text(reason)
            ));
        }
    }
}

fn refusal_text(r: Refusal) -> &'static str {
    match r {
        Refusal::LostRace => "connection race (the higher NID's connection wins)",
        Refusal::PeerRebooted => "peer rebooted",
        Refusal::Duplicate => "duplicate connection",
    }
}

/// Why an active attempt ended.
enum Fail {
    /// A socket error (connect, write, read).
    Sock(SocketError, String),
    /// The peer answered NONE: retry later.
    Retry(u64, &'static str),
    /// A protocol error.
    Proto(String),
}

/// The active side: opens the peer's typed connections one after the
/// other, until the set is complete or an attempt fails.
fn active(s: &Arc<Shared>, lnd: &Arc<SockLnd>, ni: &Arc<SockNi>, peer: Nid) {
    let mut failure = None;
    while let Some(ctype) = lnd.next_type(ni, peer) {
        if lnd.stopping.load(Ordering::Acquire) {
            failure = Some((SocketError::NetDown, false));
            break;
        }
        match connect_one(lnd, ni, peer, ctype) {
            Ok((stream, reply)) => {
                let now = s.now();
                let loopback = ni.nid.addr() == peer.addr();
                match lnd.admit(
                    ni,
                    peer,
                    ctype,
                    reply.hello.src_incarnation,
                    true,
                    loopback,
                    now,
                ) {
                    Ok(conn) => {
                        tracing::debug!(target: TARGET, %peer, conn_type = %ctype, ni = %ni.nid,
                            "active connection established");
                        let fr = FrameReceiver::new(reply.byte_order);
                        lnd.activate(ni, &conn, stream, fr, now);
                    }
                    Err(r) => {
                        lnd.log_close(format!(
                            "closed connection to {peer} ({ctype}): {}",
                            refusal_text(r)
                        ));
                        failure = Some((SocketError::ConnReset, true));
                        break;
                    }
                }
            }
            Err(Fail::Retry(inc, why)) => {
                lnd.observe_incarnation(ni, peer, inc);
                lnd.log_close(format!(
                    "connection to {peer} ({ctype}) refused by the peer: {why}"
                ));
                failure = Some((SocketError::ConnRefused, true));
                break;
            }
            Err(Fail::Sock(e, why)) => {
                lnd.log_close(format!("connecting to {peer} ({ctype}) failed: {why}"));
                failure = Some((e, false));
                break;
            }
            Err(Fail::Proto(why)) => {
                lnd.log_close(format!("connecting to {peer} ({ctype}): {why}"));
                failure = Some((SocketError::Protocol, false));
                break;
            }
        }
    }
    let inputs = lnd.connect_done(s, ni, peer, failure, s.now());
    if !inputs.is_empty() {
        s.run(inputs, |_, _| ());
    }
}

/// `tx_buffer_size` / `rx_buffer_size` (0 = the system's).
/// What Lustre's `ksocknal_lib_setup_sock` sets on every connection, both
/// sides: the buffer sizes (0: the system's), TCP keepalive probes when
/// `keepalive_idle`, `keepalive_count` and `keepalive_intvl` are all above
/// 0 (off otherwise), the IP type of service when `tos` (the NI's, else
/// the LND's) is 0 or more. A refusal is logged, not fatal.
fn tune_socket(lnd: &SockLnd, tos: i32, s: &Socket) {
    let t = &lnd.cfg.tun;
    let warn = |what: &str, e: io::Error| {
        tracing::warn!(target: TARGET, error = %e, "cannot set {what} on a socket LND connection");
    };
    if t.tx_buffer_size > 0
        && let Err(e) = s.set_send_buffer_size(t.tx_buffer_size as usize)
    {
        warn("SO_SNDBUF", e);
    }
    if t.rx_buffer_size > 0
        && let Err(e) = s.set_recv_buffer_size(t.rx_buffer_size as usize)
    {
        warn("SO_RCVBUF", e);
    }
    let probes = t.keepalive_idle > 0 && t.keepalive_count > 0 && t.keepalive_intvl > 0;
    if let Err(e) = s.set_keepalive(probes) {
        warn("SO_KEEPALIVE", e);
    }
    if probes {
        let k = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(t.keepalive_idle.into()))
            .with_interval(Duration::from_secs(t.keepalive_intvl.into()))
            .with_retries(t.keepalive_count);
        if let Err(e) = s.set_tcp_keepalive(&k) {
            warn("TCP_KEEPIDLE/KEEPINTVL/KEEPCNT", e);
        }
    }
    set_tos(s, tos);
}

/// `IP_TOS` when `tos` is 0 or more.
fn set_tos(s: &Socket, tos: i32) {
    if let Ok(tos) = u32::try_from(tos)
        && let Err(e) = s.set_tos_v4(tos)
    {
        tracing::warn!(target: TARGET, error = %e, "cannot set IP_TOS on a socket LND connection");
    }
}

/// A socket bound to our NI's address, from a privileged port when we may
/// (Lustre's `lnet_connect`), connected to `to`.
fn connect_socket(
    lnd: &SockLnd,
    tos: i32,
    local: Ipv4Addr,
    to: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, Fail> {
    let sock_err = |e: &io::Error, what: &str| {
        Fail::Sock(SocketError::from_io_error(e), format!("{what} {to}: {e}"))
    };
    let new = || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| sock_err(&e, "socket for"))?;
        s.set_reuse_address(true)
            .map_err(|e| sock_err(&e, "SO_REUSEADDR for"))?;
        tune_socket(lnd, tos, &s);
        Ok::<Socket, Fail>(s)
    };
    if lnd.cfg.reserved_ports {
        for port in connector_ports() {
            let s = new()?;
            match s.bind(&SocketAddr::V4(SocketAddrV4::new(local, port)).into()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => continue,
                // No privilege: an ephemeral port (a userspace peer to
                // the other side, which needs accept=all).
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => break,
                Err(e) => return Err(sock_err(&e, "binding a source port for")),
            }
            match s.connect_timeout(&to.into(), timeout) {
                Ok(()) => return Ok(s.into()),
                Err(e)
                    if e.kind() == io::ErrorKind::AddrInUse
                        || e.kind() == io::ErrorKind::AddrNotAvailable =>
                {
                    continue;
                }
                Err(e) => return Err(sock_err(&e, "connecting to")),
            }
        }
    }
    let s = new()?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(local, 0)).into())
        .map_err(|e| sock_err(&e, "binding a source address for"))?;
    s.connect_timeout(&to.into(), timeout)
        .map_err(|e| sock_err(&e, "connecting to"))?;
    Ok(s.into())
}

fn connect_one(
    lnd: &SockLnd,
    ni: &SockNi,
    peer: Nid,
    ctype: ConnType,
) -> Result<(TcpStream, ReceivedHello), Fail> {
    let Some(to) = lnd.peer_addr(peer, ctype) else {
        return Err(Fail::Sock(
            SocketError::HostUnreachable,
            format!("no address for {peer}"),
        ));
    };
    let timeout = lnd.sock_timeout();
    let mut stream = connect_socket(lnd, ni.tos(lnd), ni.ip(), to, timeout)?;
    let io_fail = |e: io::Error, what: &str| {
        Fail::Sock(SocketError::from_io_error(&e), format!("{what}: {e}"))
    };
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| io_fail(e, "read timeout"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| io_fail(e, "write timeout"))?;
    let _ = stream.set_nodelay(!lnd.cfg.tun.nagle);
    let mut out = Vec::with_capacity(CONNREQ_LEN + HELLO_LEN);
    out.extend_from_slice(&ConnReq::new(peer).encode());
    out.extend_from_slice(&ni.local.active_hello(peer, ctype).encode());
    stream
        .write_all(&out)
        .map_err(|e| io_fail(e, "sending the connection request and HELLO"))?;
    let reply = match read_hello(&mut stream) {
        Ok(r) => r,
        Err(HelloRead::Io(e)) => {
            let err = match SocketError::from_io_error(&e) {
                SocketError::Eof => SocketError::ConnReset,
                other => other,
            };
            return Err(Fail::Sock(err, format!("reading HELLO: {e}")));
        }
        Err(e @ HelloRead::Bad(_)) => {
            return Err(Fail::Proto(format!("bad HELLO answer: {e}")));
        }
    };
    let expected = ProcessId::new(peer, lnd.cfg.pid);
    match check_active_reply(&ni.local, expected, ctype, &reply.hello) {
        Ok(ActiveReply::Accepted { .. }) => Ok((stream, reply)),
        Ok(ActiveReply::Retry { incarnation }) => Err(Fail::Retry(
            incarnation,
            "answered with connection type NONE",
        )),
        Err(e) => Err(Fail::Proto(format!("HELLO answer refused: {e}"))),
    }
}
