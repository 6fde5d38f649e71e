//! The socket LND between two nodes of one process, on loopback addresses
//! and free ports: 1 MiB PUT+ACK and GET+REPLY verified byte for byte, the
//! copy accounting, a peer dying mid-transfer, hostile input to the
//! acceptor.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{EventKind, MdOptions, OpError};
use colibri_lnet_rt::colibri_lnet::node::NiConfig;
use colibri_lnet_rt::colibri_lnet::socklnd::{AcceptPolicy, ConnReq, ConnType, Hello, LnetFrame};
use colibri_lnet_rt::colibri_lnet::wire::{Body, Header, WireHandle};
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use common::*;

const MIB: usize = 1 << 20;

fn start(nid_s: &str, accept: AcceptPolicy) -> Lnet {
    start_with(nid_s, accept, |_| {})
}

fn start_with(nid_s: &str, accept: AcceptPolicy, f: impl FnOnce(&mut LnetConfig)) -> Lnet {
    init_tracing();
    let mut cfg = LnetConfig::new(&[nid(nid_s)]);
    f(&mut cfg);
    cfg.accept_port = 0;
    cfg.accept = accept;
    cfg.tick = Duration::from_millis(200);
    Lnet::start(cfg).unwrap()
}

/// Two nodes that know each other's ports. (`accept=all`: without the
/// privilege to bind ports below 1024 the nodes connect as userspace
/// peers, so the tests pass as any user; as root they use privileged
/// ports as Lustre does.)
fn pair(a: &str, b: &str) -> (Lnet, Lnet) {
    let la = start(a, AcceptPolicy::All);
    let lb = start(b, AcceptPolicy::All);
    introduce(&la, a, &lb, b);
    (la, lb)
}

/// Tells nodes `la` (NID `a`) and `lb` (NID `b`) each other's ports.
fn introduce(la: &Lnet, a: &str, lb: &Lnet, b: &str) {
    let (na, nb) = (nid(a), nid(b));
    la.set_peer_addr(nb, lb.listen_addr(nb).unwrap());
    lb.set_peer_addr(na, la.listen_addr(na).unwrap());
}

#[test]
fn put_ack_and_get_reply_of_1mib_with_zero_copies() {
    let (a, b) = pair("127.0.2.2@tcp", "127.0.2.3@tcp");
    let nb = nid("127.0.2.3@tcp");
    // PUT with ACK.
    let inbox = MemRegion::zeroed(MIB);
    let target = post(&b, &inbox, 12, 0xabc, MdOptions::OP_PUT);
    let data = pattern(MIB, 3);
    let src = MemRegion::from_vec(data.clone());
    let md = bind(&a, &src);
    let (a0, b0) = (a.runtime_stats(), b.runtime_stats());
    a.put(md, true, ProcessId::lustre(nb), 12, 0xabc, 0, 0)
        .unwrap();
    let evs = until_final(&a, md);
    assert!(kinds(&evs, md).contains(&EventKind::Ack), "{evs:#?}");
    assert!(evs.iter().all(|e| e.status().is_ok()), "{evs:#?}");
    let bev = events_until(&b, |e| e.iter().any(|e| e.md == target));
    let put = bev.iter().find(|e| e.md == target).unwrap();
    assert_eq!(put.kind(), EventKind::Put);
    assert_eq!(put.info.mlength as usize, MIB);
    assert!(inbox.to_vec() == data, "PUT payload differs");
    let (a1, b1) = (a.runtime_stats(), b.runtime_stats());
    // The sender wrote the payload once from the MD, the receiver read it
    // once into the MD; nothing else was copied (LNet's own ping bytes of
    // discovery are inline and counted apart).
    assert_eq!(
        (a1.socket_write_bytes - a1.inline_write_bytes)
            - (a0.socket_write_bytes - a0.inline_write_bytes),
        MIB as u64
    );
    assert_eq!(
        (b1.socket_read_bytes - b1.inline_read_bytes)
            - (b0.socket_read_bytes - b0.inline_read_bytes),
        MIB as u64
    );
    for s in [a1, b1] {
        assert_eq!(s.user_copy_bytes, 0);
        assert_eq!(s.loopback_copy_bytes, 0);
        // Bulk travels on the bulk connections, read straight into place;
        // a PUT that leaves before they are up goes on CONTROL (as Lustre
        // allows), where only what the first read took is copied.
        assert!(s.eager_copy_bytes < 4096, "{s:?}");
    }

    // GET with REPLY.
    let served_data = pattern(MIB, 9);
    let served = MemRegion::from_vec(served_data.clone());
    let served_md = post(&b, &served, 13, 1, MdOptions::OP_GET);
    let sink = MemRegion::zeroed(MIB);
    let md = bind(&a, &sink);
    a.get(md, ProcessId::lustre(nb), 13, 1, 0).unwrap();
    let evs = until_final(&a, md);
    let reply = evs
        .iter()
        .find(|e| e.md == md && e.kind() == EventKind::Reply)
        .expect("REPLY");
    assert!(reply.status().is_ok());
    assert_eq!(reply.info.mlength as usize, MIB);
    assert!(sink.to_vec() == served_data, "GET payload differs");
    // b's GET event comes once its REPLY is written (and counted).
    events_until(&b, |e| {
        e.iter()
            .any(|e| e.md == served_md && e.kind() == EventKind::Get)
    });
    let (a2, b2) = (a.runtime_stats(), b.runtime_stats());
    assert_eq!(
        (b2.socket_write_bytes - b2.inline_write_bytes)
            - (b1.socket_write_bytes - b1.inline_write_bytes),
        MIB as u64
    );
    assert_eq!(
        (a2.socket_read_bytes - a2.inline_read_bytes)
            - (a1.socket_read_bytes - a1.inline_read_bytes),
        MIB as u64
    );
    assert_eq!(a2.user_copy_bytes + b2.user_copy_bytes, 0);
    assert_eq!(
        a.stats().payload_bytes_copied,
        a2.inline_write_bytes + a2.inline_read_bytes
    );
    // Typed connections: CONTROL, BULK_IN, BULK_OUT.
    assert!(a2.conns_established >= 3, "{a2:?}");
    a.shutdown();
    b.shutdown();
}

#[test]
fn ping_over_tcp() {
    let (a, b) = pair("127.0.2.4@tcp", "127.0.2.5@tcp");
    let info = a.ping(nid("127.0.2.5@tcp"), LIMIT).unwrap();
    assert!(info.nis.iter().any(|n| n.nid == nid("127.0.2.5@tcp")));
    drop(b);
    a.shutdown();
}

#[test]
fn peer_dying_mid_transfer_gives_one_error_event() {
    let (na, nb) = (nid("127.0.2.6@tcp"), nid("127.0.2.7@tcp"));
    // Small socket buffers, so the 1 MiB PUT cannot be written whole while
    // its receiver does not read; a short transaction timeout bounds the
    // test whichever way the loss shows.
    let small_bufs = |c: &mut LnetConfig| {
        c.tcp.tx_buffer_size = 64 * 1024;
        c.tcp.rx_buffer_size = 64 * 1024;
        c.node.transaction_timeout = Duration::from_secs(5);
    };
    let a = start_with("127.0.2.6@tcp", AcceptPolicy::All, small_bufs);
    let b = start_with("127.0.2.7@tcp", AcceptPolicy::All, small_bufs);
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    // Warm up the connections with a small PUT.
    let small = MemRegion::zeroed(16);
    post(&b, &small, 5, 0, MdOptions::OP_PUT);
    let s = MemRegion::from_vec(vec![1; 16]);
    let md = bind(&a, &s);
    a.put(md, true, ProcessId::lustre(nb), 5, 0, 0, 0).unwrap();
    until_final(&a, md);
    // b's target is on a lazy portal with no MD: the 1 MiB PUT parks in b's
    // connection (its payload stays in the socket), and then b dies.
    b.set_lazy_portal(6, true).unwrap();
    let big = MemRegion::from_vec(pattern(MIB, 1));
    let md = bind(&a, &big);
    a.put(md, true, ProcessId::lustre(nb), 6, 0, 0, 0).unwrap();
    let t0 = Instant::now();
    while b.with_node(|n| n.rx_pending()) == 0 {
        assert!(t0.elapsed() < LIMIT, "the PUT never reached b");
        std::thread::sleep(Duration::from_millis(10));
    }
    b.shutdown();
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md && e.status().is_err()));
    // Nothing more for that MD.
    let mut later = Vec::new();
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(700) {
        if let Ok(e) = a.next_event(Duration::from_millis(50)) {
            later.push(e);
        }
    }
    let mine: Vec<_> = evs
        .iter()
        .chain(later.iter())
        .filter(|e| e.md == md)
        .collect();
    let errors = mine.iter().filter(|e| e.status().is_err()).count();
    assert_eq!(errors, 1, "{mine:#?}");
    assert!(mine.last().unwrap().status().is_err(), "{mine:#?}");
    assert!(
        a.close_reasons()
            .iter()
            .any(|r| r.contains("127.0.2.7@tcp")),
        "{:#?}",
        a.close_reasons()
    );
    a.shutdown();
}

/// Waits until the node closed `s` (EOF or reset) and returns what it sent.
fn closed_by_node(mut s: TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        assert!(
            start.elapsed() < LIMIT,
            "the node kept a hostile connection open"
        );
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return got,
        }
    }
}

fn wait_reason(l: &Lnet, needle: &str) {
    let start = Instant::now();
    while !l.close_reasons().iter().any(|r| r.contains(needle)) {
        assert!(
            start.elapsed() < LIMIT,
            "no close reason containing {needle:?}: {:#?}",
            l.close_reasons()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn hostile_input_to_the_acceptor() {
    let server = nid("127.0.2.9@tcp");
    let b = start("127.0.2.9@tcp", AcceptPolicy::All);
    let addr: SocketAddr = b.listen_addr(server).unwrap();
    let fake = nid("127.0.2.8@tcp");

    // Garbage.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    closed_by_node(s);
    wait_reason(&b, "bad connection request");

    // Wrong magic in an otherwise well-formed request.
    let mut req = ConnReq::new(server).encode();
    req[..4].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&req).unwrap();
    closed_by_node(s);
    wait_reason(&b, "unrecognised acceptor magic");

    // A request for a NID that is not ours.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&ConnReq::new(nid("127.0.2.99@tcp")).encode())
        .unwrap();
    closed_by_node(s);
    wait_reason(&b, "no matching NI");

    // A HELLO for another NID.
    let hello = |dst: Nid, ct| Hello {
        src_nid: fake,
        dst_nid: dst,
        src_pid: 12345,
        dst_pid: 0,
        src_incarnation: 77,
        dst_incarnation: 0,
        conn_type: Some(ct),
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&ConnReq::new(server).encode()).unwrap();
    s.write_all(&hello(nid("127.0.2.98@tcp"), ConnType::Control).encode())
        .unwrap();
    closed_by_node(s);
    wait_reason(&b, "HELLO refused");

    // A good handshake, then a header announcing 2 MiB of payload.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&ConnReq::new(server).encode()).unwrap();
    s.write_all(&hello(server, ConnType::Control).encode())
        .unwrap();
    let mut answer = [0u8; 56];
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.read_exact(&mut answer).unwrap();
    let answer = Hello::decode(&answer).unwrap().hello;
    assert_eq!(answer.conn_type, Some(ConnType::Control));
    let header = Header {
        dest_nid: server,
        src_nid: fake,
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: 2 * MIB as u32,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 0,
            hdr_data: 0,
            ptl_index: 4,
            offset: 0,
        },
    };
    let mut frame = LnetFrame::new(header).encode();
    // Header::encode would refuse nothing; make sure the length is what we say.
    frame[24 + 28..24 + 32].copy_from_slice(&(2 * MIB as u32).to_le_bytes());
    s.write_all(&frame).unwrap();
    closed_by_node(s);
    wait_reason(&b, "protocol error");

    // The node still serves: a real peer PUTs to it.
    let a = start("127.0.2.8@tcp", AcceptPolicy::All);
    a.set_peer_addr(server, addr);
    let inbox = MemRegion::zeroed(1000);
    post(&b, &inbox, 7, 0, MdOptions::OP_PUT);
    let src = MemRegion::from_vec(pattern(1000, 5));
    let md = bind(&a, &src);
    a.put(md, true, ProcessId::lustre(server), 7, 0, 0, 0)
        .unwrap();
    let evs = until_final(&a, md);
    assert!(
        evs.iter()
            .filter(|e| e.md == md)
            .all(|e| e.status().is_ok()),
        "{evs:#?}"
    );
    assert_eq!(inbox.to_vec(), pattern(1000, 5));
    a.shutdown();
    b.shutdown();
}

#[test]
fn parked_connection_resumes_when_an_md_comes() {
    let (a, b) = pair("127.0.2.10@tcp", "127.0.2.11@tcp");
    let nb = nid("127.0.2.11@tcp");
    b.set_lazy_portal(8, true).unwrap();
    let data = pattern(300_000, 4);
    let src = MemRegion::from_vec(data.clone());
    let md = bind(&a, &src);
    a.put(md, true, ProcessId::lustre(nb), 8, 2, 0, 0).unwrap();
    let t0 = Instant::now();
    while b.with_node(|n| n.rx_pending()) == 0 {
        assert!(t0.elapsed() < LIMIT, "the PUT never reached b");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Parked: its payload waits in the connection. A small PUT on the same
    // connection queues behind it.
    let inbox = MemRegion::zeroed(300_000);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.with_node(|n| n.rx_pending()), 1);
    let target = post(&b, &inbox, 8, 2, MdOptions::OP_PUT);
    let evs = until_final(&a, md);
    assert!(
        evs.iter()
            .filter(|e| e.md == md)
            .all(|e| e.status().is_ok()),
        "{evs:#?}"
    );
    let bev = events_until(&b, |e| e.iter().any(|e| e.md == target));
    assert!(
        bev.iter()
            .any(|e| e.md == target && e.kind() == EventKind::Put)
    );
    assert!(inbox.to_vec() == data);
    assert_eq!(b.runtime_stats().user_copy_bytes, 0);
    a.shutdown();
    b.shutdown();
}

#[test]
fn keepalives_on_a_quiet_connection() {
    let (na, nb) = (nid("127.0.2.12@tcp"), nid("127.0.2.13@tcp"));
    let quick = |c: &mut LnetConfig| {
        c.tcp.keepalive = 1;
    };
    let a = start_with("127.0.2.12@tcp", AcceptPolicy::All, quick);
    let b = start_with("127.0.2.13@tcp", AcceptPolicy::All, quick);
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    a.ping(nb, LIMIT).unwrap();
    let before = b.runtime_stats().frames_received;
    let t0 = Instant::now();
    while a.runtime_stats().keepalives_sent == 0 {
        assert!(t0.elapsed() < LIMIT, "no keepalive sent");
        std::thread::sleep(Duration::from_millis(50));
    }
    // b received NOOPs and kept the connections.
    let t0 = Instant::now();
    while b.runtime_stats().frames_received <= before {
        assert!(t0.elapsed() < LIMIT);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        b.runtime_stats().conns_closed,
        0,
        "{:#?}",
        b.close_reasons()
    );
    a.shutdown();
    b.shutdown();
}

/// A raw peer that completes the handshake for `ctype` with `incarnation`.
fn raw_peer(
    addr: SocketAddr,
    server: Nid,
    me: Nid,
    ctype: ConnType,
    incarnation: u64,
) -> TcpStream {
    handshake(None, addr, server, me, ctype, incarnation).0
}

/// A connection to `addr` (from the address `from` when given, any port),
/// and its handshake as `me` for `ctype` with `incarnation`; returns the
/// stream and the type the answer gives (`None`: refused, retry).
fn handshake(
    from: Option<[u8; 4]>,
    addr: SocketAddr,
    server: Nid,
    me: Nid,
    ctype: ConnType,
    incarnation: u64,
) -> (TcpStream, Option<ConnType>) {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(ip) = from {
        sock.bind(&SocketAddr::from((ip, 0)).into()).unwrap();
    }
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.write_all(&ConnReq::new(server).encode()).unwrap();
    let h = Hello {
        src_nid: me,
        dst_nid: server,
        src_pid: 12345,
        dst_pid: 0,
        src_incarnation: incarnation,
        dst_incarnation: 0,
        conn_type: Some(ctype),
    };
    s.write_all(&h.encode()).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut answer = [0u8; 56];
    s.read_exact(&mut answer).unwrap();
    let t = Hello::decode(&answer).unwrap().hello.conn_type;
    (s, t)
}

#[test]
fn stalled_peer_is_closed_after_sock_timeout() {
    let server = nid("127.0.2.14@tcp");
    let b = start_with("127.0.2.14@tcp", AcceptPolicy::All, |c| {
        c.tcp.sock_timeout = 1
    });
    let addr = b.listen_addr(server).unwrap();
    let mut s = raw_peer(addr, server, nid("127.0.2.15@tcp"), ConnType::Control, 5);
    // Half a ksock_msg header, then nothing.
    s.write_all(&[0xc1, 0, 0, 0, 0, 0]).unwrap();
    let t0 = Instant::now();
    closed_by_node(s);
    assert!(t0.elapsed() >= Duration::from_millis(900));
    wait_reason(&b, "timed out receiving");
    b.shutdown();
}

#[test]
fn sock_timeout_set_at_run_time_and_following_lnd_timeout() {
    let server = nid("127.0.2.60@tcp");
    let b = start("127.0.2.60@tcp", AcceptPolicy::All);
    // socklnd's default, 50 s.
    assert_eq!(b.sock_timeout(), Some(Duration::from_secs(50)));
    // `lnetctl net set --net tcp --lnd-timeout 1`: in force from the next
    // check on, for connections made before too.
    let addr = b.listen_addr(server).unwrap();
    let mut s = raw_peer(addr, server, nid("127.0.2.61@tcp"), ConnType::Control, 5);
    b.set_lnd_timeout("tcp".parse().unwrap(), 1).unwrap();
    assert_eq!(b.sock_timeout(), Some(Duration::from_secs(1)));
    s.write_all(&[0xc1, 0, 0, 0, 0, 0]).unwrap();
    let t0 = Instant::now();
    closed_by_node(s);
    assert!(t0.elapsed() >= Duration::from_millis(900));
    wait_reason(&b, "timed out receiving (sock_timeout 1s)");
    // 0: LNet's lnd_timeout, (transaction_timeout - 1) / (retry_count + 1),
    // followed as those change.
    b.set_lnd_timeout("tcp3".parse().unwrap(), 0).unwrap();
    b.set_health(100, 2, Duration::from_secs(10)).unwrap();
    assert_eq!(b.sock_timeout(), Some(Duration::from_secs(3)));
    b.set_health(100, 1, Duration::from_secs(21)).unwrap();
    assert_eq!(b.sock_timeout(), Some(Duration::from_secs(10)));
    // `lo` has no LND timeout.
    let e = b.set_lnd_timeout("lo".parse().unwrap(), 5).unwrap_err();
    assert_eq!(e.errno(), colibri_lnet_rt::ctl::errno::EINVAL, "{e}");
    b.shutdown();
}

/// `(IP_TOS, SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT)` of
/// every TCP socket of this process bound to `ip` (the nodes run in the
/// test's process), read through `/proc/self/fd`.
fn socket_options_on(ip: [u8; 4]) -> Vec<[i32; 5]> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: `sockaddr_in` is plain data; getsockname writes at most
        // `len` bytes into it. A descriptor that is not a socket, or was
        // closed meanwhile, fails the call and is skipped; nothing is
        // read from or written to a descriptor but these queries.
        let local = unsafe {
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let rc = libc::getsockname(fd, (&raw mut a).cast(), &raw mut len);
            (rc == 0 && i32::from(a.sin_family) == libc::AF_INET && a.sin_port != 0)
                .then(|| a.sin_addr.s_addr.to_ne_bytes())
        };
        if local != Some(ip) {
            continue;
        }
        let opt = |level: i32, name: i32| {
            let mut v: libc::c_int = -1;
            let mut len = size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: an int-sized option read into an int of that size.
            let rc =
                unsafe { libc::getsockopt(fd, level, name, (&raw mut v).cast(), &raw mut len) };
            if rc == 0 { v } else { -1 }
        };
        // A listening socket has no keepalive to show: connections only.
        if opt(libc::SOL_SOCKET, libc::SO_ACCEPTCONN) != 0 {
            continue;
        }
        out.push([
            opt(libc::IPPROTO_IP, libc::IP_TOS),
            opt(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            opt(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
            opt(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
            opt(libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
        ]);
    }
    out
}

#[test]
fn connections_carry_the_tunables_tos_and_tcp_keepalive() {
    // Both sides set what Lustre's ksocknal_lib_setup_sock sets: the
    // connecting one (a) and the accepting one (b).
    let tuned = |n: &str, tos: i32, (idle, intvl, count): (u32, u32, u32)| {
        start_with(n, AcceptPolicy::All, |c| {
            c.tcp.tos = tos;
            c.tcp.keepalive_idle = idle;
            c.tcp.keepalive_intvl = intvl;
            c.tcp.keepalive_count = count;
        })
    };
    let a = tuned("127.0.2.62@tcp", 0x10, (7, 2, 3));
    let b = tuned("127.0.2.63@tcp", 0x20, (9, 3, 4));
    introduce(&a, "127.0.2.62@tcp", &b, "127.0.2.63@tcp");
    a.ping(nid("127.0.2.63@tcp"), LIMIT).unwrap();
    // A connection is tuned by the thread that makes or accepts it, just
    // after it exists: wait until every one is (each must get there).
    let all_become = |ip: [u8; 4], want: &dyn Fn(&[i32; 5]) -> bool| {
        let t0 = Instant::now();
        loop {
            let opts = socket_options_on(ip);
            if !opts.is_empty() && opts.iter().all(want) {
                return;
            }
            assert!(t0.elapsed() < LIMIT, "{ip:?}: {opts:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    all_become([127, 0, 2, 62], &|o| *o == [0x10, 1, 7, 2, 3]);
    all_become([127, 0, 2, 63], &|o| *o == [0x20, 1, 9, 3, 4]);
    a.shutdown();
    b.shutdown();
    // No probes when one of the three is 0; tos -1 leaves the system's.
    let c = tuned("127.0.2.64@tcp", -1, (30, 5, 0));
    let d = start("127.0.2.65@tcp", AcceptPolicy::All);
    introduce(&c, "127.0.2.64@tcp", &d, "127.0.2.65@tcp");
    c.ping(nid("127.0.2.65@tcp"), LIMIT).unwrap();
    all_become([127, 0, 2, 64], &|o| o[..2] == [0, 0]);
    // Lustre's defaults: probes after 30 s, every 5 s, 5 of them.
    all_become([127, 0, 2, 65], &|o| *o == [0, 1, 30, 5, 5]);
    c.shutdown();
    d.shutdown();
    // An NI's own type of service (`net add --tos`, sanity-lnet test
    // 232) wins over the LND's, on the connecting side and, once the
    // connection request names the NI, on the accepting one.
    let e = start_with("127.0.2.66@tcp", AcceptPolicy::All, |c| {
        c.tcp.tos = 0x10;
        c.node.nis[0].tos = 0x28;
    });
    let f = start_with("127.0.2.67@tcp", AcceptPolicy::All, |c| {
        c.node.nis[0].tos = 0x48;
    });
    introduce(&e, "127.0.2.66@tcp", &f, "127.0.2.67@tcp");
    e.ping(nid("127.0.2.67@tcp"), LIMIT).unwrap();
    all_become([127, 0, 2, 66], &|o| o[0] == 0x28);
    all_become([127, 0, 2, 67], &|o| o[0] == 0x48);
    e.shutdown();
    f.shutdown();
}

#[test]
fn a_new_incarnation_closes_the_old_connections() {
    let server = nid("127.0.2.16@tcp");
    let b = start("127.0.2.16@tcp", AcceptPolicy::All);
    let addr = b.listen_addr(server).unwrap();
    let me = nid("127.0.2.17@tcp");
    let old = raw_peer(addr, server, me, ConnType::Control, 1);
    // The peer "reboots": a connection with a new incarnation.
    let (s, answer) = handshake(None, addr, server, me, ConnType::BulkOut, 2);
    // Refused with NONE (retry), and the old connection is closed.
    assert_eq!(answer, None);
    drop(s);
    closed_by_node(old);
    wait_reason(&b, "rebooted");
    // The retry is accepted.
    let again = raw_peer(addr, server, me, ConnType::Control, 2);
    drop(again);
    b.shutdown();
}

#[test]
fn a_peer_that_exited_is_admitted_at_once_when_it_starts_again() {
    // A client process that exits and starts again with the same NID (a
    // second `colibri ping`, say) brings a new incarnation. Once its old
    // connections are gone, its first connection is admitted, as Lustre
    // does, rather than refused as a reboot and retried a second later.
    let server = nid("127.0.2.50@tcp");
    let b = start("127.0.2.50@tcp", AcceptPolicy::All);
    let addr = b.listen_addr(server).unwrap();
    let me = nid("127.0.2.51@tcp");
    let (old, t) = handshake(
        Some([127, 0, 2, 51]),
        addr,
        server,
        me,
        ConnType::Control,
        1,
    );
    assert_eq!(t, Some(ConnType::Control));
    let t0 = Instant::now();
    while b.peer_conns(server, me).is_empty() {
        assert!(t0.elapsed() < LIMIT, "the first connection never showed");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(old);
    while !b.peer_conns(server, me).is_empty() {
        assert!(t0.elapsed() < LIMIT, "the closed connection stayed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s, t) = handshake(
        Some([127, 0, 2, 51]),
        addr,
        server,
        me,
        ConnType::Control,
        2,
    );
    assert_eq!(
        t,
        Some(ConnType::Control),
        "refused: {:?}",
        b.close_reasons()
    );
    assert!(!b.close_reasons().iter().any(|r| r.contains("rebooted")));
    assert_eq!(b.peer_conns(server, me), vec![ConnType::Control]);
    drop(s);
    b.shutdown();
}

#[test]
fn a_refused_connection_is_retried_after_min_reconnect_not_at_a_later_tick() {
    // A peer that answers NONE (it won a connection race, or saw a new
    // incarnation) is tried again `min_reconnectms` (1 s) later, as
    // Lustre's connd does, even when the node's reaper ticks rarely.
    let (an, pn) = (nid("127.0.2.52@tcp"), nid("127.0.2.53@tcp"));
    let mut cfg = LnetConfig::new(&[an]);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    cfg.tick = Duration::from_secs(4);
    let a = Lnet::start(cfg).unwrap();
    let listener = std::net::TcpListener::bind("127.0.2.53:0").unwrap();
    a.set_peer_addr(pn, listener.local_addr().unwrap());
    a.set_discovery(false).unwrap();
    let src = MemRegion::from_vec(vec![7; 100]);
    let md = bind(&a, &src);
    a.put(md, false, ProcessId::lustre(pn), 4, 0, 0, 0).unwrap();
    // The first attempt: read its request and HELLO, answer NONE.
    let (mut c, _) = listener.accept().unwrap();
    let first = Instant::now();
    c.set_read_timeout(Some(LIMIT)).unwrap();
    let mut req = [0u8; 16];
    c.read_exact(&mut req).unwrap();
    let mut hello = [0u8; 56];
    c.read_exact(&mut hello).unwrap();
    let got = Hello::decode(&hello).unwrap().hello;
    assert_eq!(got.src_nid, an);
    let none = Hello {
        src_nid: pn,
        dst_nid: an,
        src_pid: 12345,
        dst_pid: got.src_pid,
        src_incarnation: 9,
        dst_incarnation: got.src_incarnation,
        conn_type: None,
    };
    c.write_all(&none.encode()).unwrap();
    // The second attempt comes about a second later, not at the 4 s tick.
    listener.set_nonblocking(true).unwrap();
    let again = loop {
        match listener.accept() {
            Ok(_) => break first.elapsed(),
            Err(_) => {
                assert!(first.elapsed() < LIMIT, "never tried again");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    assert!(
        again >= Duration::from_millis(900) && again < Duration::from_millis(2500),
        "tried again after {again:?}"
    );
    a.shutdown();
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    assert!(evs.iter().any(|e| e.md == md && e.status().is_err()));
}

#[test]
fn a_put_waiting_for_a_connection_is_withdrawn_at_once() {
    let a = start("127.0.2.32@tcp", AcceptPolicy::All);
    let deaf = nid("127.0.2.33@tcp");
    // A listener that never accepts: the connection daemon's handshake
    // waits for an answer that never comes.
    let l = std::net::TcpListener::bind("127.0.2.33:0").unwrap();
    a.set_peer_addr(deaf, l.local_addr().unwrap());
    a.set_discovery(false).unwrap();
    let src = MemRegion::from_vec(vec![7; 5000]);
    let md = bind(&a, &src);
    a.put(md, true, ProcessId::lustre(deaf), 4, 0, 0, 0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.next_event(Duration::from_millis(10)).is_err(),
        "nothing yet"
    );
    let t0 = Instant::now();
    // Not seen by any peer: LNet takes it back from the LND's queue.
    assert_eq!(a.withdraw(md).unwrap(), 0);
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    let ev = evs.iter().find(|e| e.md == md).unwrap();
    assert_eq!(ev.kind(), EventKind::Send);
    assert_eq!(ev.status(), Err(OpError::Canceled), "{ev:#?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(e) = a.next_event(Duration::from_millis(50)) {
        assert_ne!(e.md, md, "second event {e:#?}");
    }
    assert_eq!(a.stats().send_failures, 1, "{:?}", a.stats());
    drop(l);
    a.shutdown();
}

#[test]
fn a_put_queued_behind_a_stalled_one_is_withdrawn_the_stalled_one_goes_on() {
    // Small socket buffers, so that what a parked message holds up stays
    // in a's queue.
    let small = |c: &mut LnetConfig| {
        c.tcp.tx_buffer_size = 128 << 10;
        c.tcp.rx_buffer_size = 128 << 10;
    };
    let (na, nb) = (nid("127.0.2.34@tcp"), nid("127.0.2.35@tcp"));
    let a = start_with("127.0.2.34@tcp", AcceptPolicy::All, small);
    let b = start_with("127.0.2.35@tcp", AcceptPolicy::All, small);
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    // b parks the first PUT (lazy portal, no MD yet), so nothing more is
    // read from that connection: the next PUT's write stalls when the
    // socket is full, and those after it wait in a's queue.
    b.set_lazy_portal(30, true).unwrap();
    let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(MIB, 10 + i)).collect();
    let srcs: Vec<MemRegion> = data
        .iter()
        .map(|d| MemRegion::from_vec(d.clone()))
        .collect();
    let mds: Vec<_> = srcs.iter().map(|r| bind(&a, r)).collect();
    a.put(mds[0], false, ProcessId::lustre(nb), 30, 0, 0, 0)
        .unwrap();
    let t0 = Instant::now();
    while b.with_node(|n| n.rx_pending()) == 0 {
        assert!(t0.elapsed() < LIMIT, "the first PUT never reached b");
        std::thread::sleep(Duration::from_millis(10));
    }
    for (i, &md) in mds.iter().enumerate().skip(1) {
        a.put(md, false, ProcessId::lustre(nb), 30, i as u64, 0, 0)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let last = mds[5];
    let t0 = Instant::now();
    assert_eq!(a.withdraw(last).unwrap(), 0);
    let mut seen = events_until(&a, |e| e.iter().any(|e| e.md == last));
    let ev = seen.iter().find(|e| e.md == last).unwrap();
    assert_eq!(
        (ev.kind(), ev.status()),
        (EventKind::Send, Err(OpError::Canceled)),
        "{ev:#?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(
        seen.iter().all(|e| e.md == last),
        "sent while b held the connection: {seen:#?}"
    );
    // The others go on once b has MDs for them; the withdrawn one never
    // reaches b.
    let inboxes: Vec<MemRegion> = (0..6).map(|_| MemRegion::zeroed(MIB)).collect();
    let targets: Vec<_> = inboxes
        .iter()
        .enumerate()
        .map(|(i, r)| post(&b, r, 30, i as u64, MdOptions::OP_PUT))
        .collect();
    // (No ACKs asked: one SEND event each.)
    seen.extend(events_until(&a, |e| {
        e.iter().filter(|e| mds[..5].contains(&e.md)).count() == 5
    }));
    assert!(
        seen.iter()
            .filter(|e| mds[..5].contains(&e.md))
            .all(|e| e.status().is_ok()),
        "{seen:#?}"
    );
    let bev = events_until(&b, |e| {
        e.iter().filter(|e| targets[..5].contains(&e.md)).count() == 5
    });
    assert!(bev.iter().all(|e| e.md != targets[5]), "{bev:#?}");
    for i in 0..5 {
        assert!(inboxes[i].to_vec() == data[i], "PUT {i}'s payload differs");
    }
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(e) = b.next_event(Duration::from_millis(50)) {
        assert_ne!(e.md, targets[5], "the withdrawn PUT arrived: {e:#?}");
    }
    a.shutdown();
    b.shutdown();
}

#[test]
fn put_to_a_peer_nobody_serves_fails_once_and_the_next_ones_at_once() {
    let a = start("127.0.2.18@tcp", AcceptPolicy::All);
    let ghost = nid("127.0.2.19@tcp");
    // A port where nothing listens.
    let port = {
        let l = std::net::TcpListener::bind("127.0.2.19:0").unwrap();
        l.local_addr().unwrap().port()
    };
    a.set_peer_addr(ghost, SocketAddr::from(([127, 0, 2, 19], port)));
    a.set_discovery(false).unwrap();
    let src = MemRegion::from_vec(vec![7; 5000]);
    let md = bind(&a, &src);
    let t0 = Instant::now();
    a.put(md, true, ProcessId::lustre(ghost), 4, 0, 0, 0)
        .unwrap();
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    let ev = evs.iter().find(|e| e.md == md).unwrap();
    assert_eq!(ev.kind(), EventKind::Send);
    assert!(ev.status().is_err(), "{ev:#?}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(e) = a.next_event(Duration::from_millis(50)) {
        assert_ne!(e.md, md, "second event {e:#?}");
    }
    assert!(
        a.close_reasons().iter().any(|r| r.contains("refused")),
        "{:#?}",
        a.close_reasons()
    );
    assert_eq!(a.stats().send_failures, 1, "{:?}", a.stats());
    // The peer's reconnection now backs off (`min_reconnectms`, 1 s).
    // Lustre's `ksocknal_launch_packet`: with no connection, none being
    // made and the last attempt failed too recently to try again, a
    // message fails at once ("No usable routes", REMOTE_ERROR, not
    // resent) instead of waiting for the next attempt: a dead server is
    // reported to each new call without delay.
    for i in 2..5 {
        let md = bind(&a, &src);
        let t0 = Instant::now();
        a.put(md, false, ProcessId::lustre(ghost), 4, 0, 0, 0)
            .unwrap();
        let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
        let ev = evs.iter().find(|e| e.md == md).unwrap();
        assert!(ev.status().is_err(), "{ev:#?}");
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(300), "took {took:?}");
        assert_eq!(a.stats().send_failures, i, "{:?}", a.stats());
    }
    a.shutdown();
}

#[test]
fn userspace_peers_from_unprivileged_ports() {
    // Connecting from ephemeral ports, the peers see each other as
    // userspace processes (U<port>-ip@tcp), which accept=all admits.
    let (na, nb) = (nid("127.0.2.20@tcp"), nid("127.0.2.21@tcp"));
    let user = |c: &mut LnetConfig| c.reserved_ports = false;
    let a = start_with("127.0.2.20@tcp", AcceptPolicy::All, user);
    let b = start_with("127.0.2.21@tcp", AcceptPolicy::All, user);
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    let inbox = MemRegion::zeroed(5000);
    let target = post(&b, &inbox, 3, 0, MdOptions::OP_PUT);
    let md = bind(&a, &MemRegion::from_vec(vec![3; 5000]));
    a.put(md, true, ProcessId::lustre(nb), 3, 0, 0, 0).unwrap();
    let evs = until_final(&a, md);
    assert!(kinds(&evs, md).contains(&EventKind::Ack), "{evs:#?}");
    let bev = events_until(&b, |e| e.iter().any(|e| e.md == target));
    let put = bev.iter().find(|e| e.md == target).unwrap();
    assert!(put.info.initiator.pid & 0x8000_0000 != 0, "{put:#?}");
    assert_eq!(inbox.to_vec(), vec![3; 5000]);
    a.shutdown();
    b.shutdown();
}

#[test]
fn shutdown_ends_every_operation_with_one_final_event() {
    let (a, b) = pair("127.0.2.22@tcp", "127.0.2.23@tcp");
    let nb = nid("127.0.2.23@tcp");
    // b parks the PUT (lazy portal): a's SEND completes, its ACK cannot.
    b.set_lazy_portal(9, true).unwrap();
    let md = bind(&a, &MemRegion::from_vec(vec![1; 100]));
    a.put(md, true, ProcessId::lustre(nb), 9, 0, 0, 0).unwrap();
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    assert_eq!(
        evs.iter().find(|e| e.md == md).unwrap().kind(),
        EventKind::Send
    );
    a.shutdown();
    let mut rest = Vec::new();
    while let Ok(e) = a.next_event(Duration::from_millis(100)) {
        rest.push(e);
    }
    let mine: Vec<_> = rest.iter().filter(|e| e.md == md).collect();
    assert_eq!(mine.len(), 1, "{rest:#?}");
    assert_eq!(mine[0].kind(), EventKind::Ack);
    assert!(mine[0].status().is_err() && mine[0].unlinked, "{mine:#?}");
    b.shutdown();
}

/// The same with the node as its own peer (a PUT to its own NID crosses
/// the socket LND to its own listener, as Lustre's): its receiving side
/// parks the PUT, and a shutdown ends the sending side's operation with
/// one final event, the parked receive with it.
#[test]
fn shutdown_ends_a_put_to_our_own_nid_with_one_final_event() {
    let me = nid("127.0.2.80@tcp");
    let a = start("127.0.2.80@tcp", AcceptPolicy::All);
    a.set_lazy_portal(9, true).unwrap();
    let md = bind(&a, &MemRegion::from_vec(vec![1; 100]));
    a.put(md, true, ProcessId::lustre(me), 9, 0, 0, 0).unwrap();
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    assert_eq!(
        evs.iter().find(|e| e.md == md).unwrap().kind(),
        EventKind::Send
    );
    a.shutdown();
    let mut rest = Vec::new();
    while let Ok(e) = a.next_event(Duration::from_millis(100)) {
        rest.push(e);
    }
    let mine: Vec<_> = rest.iter().filter(|e| e.md == md).collect();
    assert_eq!(mine.len(), 1, "{rest:#?}");
    assert_eq!(mine[0].kind(), EventKind::Ack);
    assert!(mine[0].status().is_err() && mine[0].unlinked, "{mine:#?}");
}

/// A node at `nid_s` without discovery (raw peers then need not answer a
/// ping), its NID and listening address.
fn raw_target(nid_s: &str) -> (Lnet, Nid, SocketAddr) {
    let server = nid(nid_s);
    let b = start(nid_s, AcceptPolicy::All);
    b.set_discovery(false).unwrap();
    let addr = b.listen_addr(server).unwrap();
    (b, server, addr)
}

/// The headers of a PUT of `len` payload bytes from `me` to `server`'s
/// `portal` (no ACK).
fn put_head(server: Nid, me: Nid, portal: u32, bits: u64, len: usize) -> Vec<u8> {
    let header = Header {
        dest_nid: server,
        src_nid: me,
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: u32::try_from(len).unwrap(),
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: bits,
            hdr_data: 0,
            ptl_index: portal,
            offset: 0,
        },
    };
    LnetFrame::new(header).encode().to_vec()
}

/// A whole PUT: its headers, then `payload`.
fn put_frame(server: Nid, me: Nid, portal: u32, bits: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = put_head(server, me, portal, bits, payload.len());
    v.extend_from_slice(payload);
    v
}

#[test]
fn small_messages_come_in_one_read_and_a_parked_one_keeps_what_follows() {
    let (b, server, addr) = raw_target("127.0.2.26@tcp");
    let me = nid("127.0.2.27@tcp");
    // The first message waits for an MD (lazy portal 20); ten more follow
    // it on the same connection, all in one segment, so the read that
    // takes the first header takes them too.
    b.set_lazy_portal(20, true).unwrap();
    let inboxes: Vec<MemRegion> = (0..10).map(|i| MemRegion::zeroed(50 + i)).collect();
    let targets: Vec<_> = inboxes
        .iter()
        .enumerate()
        .map(|(i, r)| post(&b, r, 21, i as u64, MdOptions::OP_PUT))
        .collect();
    let first = pattern(100, 1);
    let mut wire = put_frame(server, me, 20, 7, &first);
    let mut total = first.len();
    for i in 0..10 {
        wire.extend(put_frame(
            server,
            me,
            21,
            i as u64,
            &pattern(50 + i, 2 + i as u8),
        ));
        total += 50 + i;
    }
    assert!(wire.len() < 4096);
    let s0 = b.runtime_stats();
    let mut s = raw_peer(addr, server, me, ConnType::Control, 11);
    s.write_all(&wire).unwrap();
    let t0 = Instant::now();
    while b.with_node(|n| n.rx_pending()) == 0 {
        assert!(t0.elapsed() < LIMIT, "the first PUT never reached b");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Parked: nothing behind it is delivered, though its bytes were read.
    std::thread::sleep(Duration::from_millis(200));
    let mut early = Vec::new();
    while let Ok(e) = b.next_event(Duration::from_millis(10)) {
        early.push(e);
    }
    assert!(
        early.iter().all(|e| !targets.contains(&e.md)),
        "delivered past a parked message: {early:#?}"
    );
    let inbox = MemRegion::zeroed(100);
    let target = post(&b, &inbox, 20, 7, MdOptions::OP_PUT);
    let last = targets[9];
    let evs = events_until(&b, |e| e.iter().any(|e| e.md == last));
    let order: Vec<_> = evs
        .iter()
        .filter(|e| e.md == target || targets.contains(&e.md))
        .map(|e| {
            assert_eq!(e.kind(), EventKind::Put);
            assert!(e.status().is_ok(), "{e:#?}");
            e.md
        })
        .collect();
    let mut want = vec![target];
    want.extend(&targets);
    assert_eq!(order, want, "in the order sent");
    assert_eq!(inbox.to_vec(), first);
    for (i, r) in inboxes.iter().enumerate() {
        assert_eq!(r.to_vec(), pattern(50 + i, 2 + i as u8), "message {i}");
    }
    let s1 = b.runtime_stats();
    assert_eq!(s1.socket_read_bytes - s0.socket_read_bytes, total as u64);
    // Every payload came in with the read of the first header.
    assert_eq!(s1.eager_copy_bytes - s0.eager_copy_bytes, total as u64);
    assert_eq!(s1.user_copy_bytes, 0);
    drop(s);
    b.shutdown();
}

#[test]
fn a_large_payload_is_read_into_place_after_the_first_read() {
    let (b, server, addr) = raw_target("127.0.2.28@tcp");
    // A CONTROL connection (a peer whose min_bulk let it send 100 KB
    // there) copies what its first read took; a bulk connection nothing.
    for (i, (ctype, copied)) in [(ConnType::Control, true), (ConnType::BulkOut, false)]
        .into_iter()
        .enumerate()
    {
        let me = nid(&format!("127.0.2.{}@tcp", 29 + i));
        let inbox = MemRegion::zeroed(100_000);
        let target = post(&b, &inbox, 22, i as u64, MdOptions::OP_PUT);
        let data = pattern(100_000, 5 + i as u8);
        let s0 = b.runtime_stats();
        let mut s = raw_peer(addr, server, me, ctype, 12);
        s.write_all(&put_frame(server, me, 22, i as u64, &data))
            .unwrap();
        let evs = events_until(&b, |e| e.iter().any(|e| e.md == target));
        let put = evs.iter().find(|e| e.md == target).unwrap();
        assert!(put.status().is_ok(), "{put:#?}");
        assert!(inbox.to_vec() == data, "{ctype:?}: payload differs");
        let s1 = b.runtime_stats();
        assert_eq!(s1.socket_read_bytes - s0.socket_read_bytes, 100_000);
        let eager = s1.eager_copy_bytes - s0.eager_copy_bytes;
        if copied {
            assert!(eager > 0 && eager < 4096, "{ctype:?}: {eager} bytes copied");
        } else {
            assert_eq!(eager, 0, "{ctype:?}");
        }
        assert_eq!(s1.user_copy_bytes, 0);
        drop(s);
    }
    b.shutdown();
}

#[test]
fn sender_dying_mid_payload_fails_the_receive_once() {
    let (b, server, addr) = raw_target("127.0.2.24@tcp");
    let me = nid("127.0.2.25@tcp");
    let inbox = MemRegion::zeroed(100_000);
    let target = post(&b, &inbox, 4, 0, MdOptions::OP_PUT);
    let mut s = raw_peer(addr, server, me, ConnType::Control, 9);
    s.write_all(&put_head(server, me, 4, 0, 100_000)).unwrap();
    s.write_all(&[0xee; 10_000]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    let evs = events_until(&b, |e| e.iter().any(|e| e.md == target));
    std::thread::sleep(Duration::from_millis(300));
    let mut all = evs;
    while let Ok(e) = b.next_event(Duration::from_millis(50)) {
        all.push(e);
    }
    let mine: Vec<_> = all.iter().filter(|e| e.md == target).collect();
    assert_eq!(mine.len(), 1, "{mine:#?}");
    assert_eq!(mine[0].kind(), EventKind::Put);
    assert!(mine[0].status().is_err(), "{mine:#?}");
    wait_reason(&b, "in the middle of a message");
    assert_eq!(b.stats().payload_failures, 1);
    b.shutdown();
}

/// Two nodes whose every message, large ones too, goes on the CONTROL
/// connection (`min_bulk` out of reach), with schedulers that spin for
/// `spin` after their last event.
fn spinning_pair(a: &str, b: &str, spin: Duration) -> (Lnet, Lnet) {
    let (na, nb) = (nid(a), nid(b));
    let cfg = |c: &mut LnetConfig| {
        c.spin = spin;
        c.tcp.min_bulk = u32::MAX;
    };
    let la = start_with(a, AcceptPolicy::All, cfg);
    let lb = start_with(b, AcceptPolicy::All, cfg);
    la.set_peer_addr(nb, lb.listen_addr(nb).unwrap());
    lb.set_peer_addr(na, la.listen_addr(na).unwrap());
    (la, lb)
}

/// PUTs with ACK of `len` bytes from `a` to portal 15 of `b`, one after
/// the other, each acknowledged before the next leaves and checked in
/// `inbox` (where `b` takes them, all at offset 0).
fn put_acked_in_turn(a: &Lnet, b: &Lnet, inbox: &MemRegion, n: usize, len: usize) {
    let nb = b.nids()[0];
    for i in 0..n {
        let data = pattern(len, u8::try_from(i % 251).unwrap());
        let src = MemRegion::from_vec(data.clone());
        let md = bind(a, &src);
        a.put(md, true, ProcessId::lustre(nb), 15, 7, 0, 0).unwrap();
        let evs = until_final(a, md);
        assert!(kinds(&evs, md).contains(&EventKind::Ack), "{evs:#?}");
        assert!(evs.iter().all(|e| e.status().is_ok()), "{evs:#?}");
        assert!(inbox.to_vec()[..len] == data[..], "PUT {i} payload differs");
    }
}

#[test]
fn a_spinning_scheduler_reads_its_busy_connection_directly() {
    // Spinning for longer than the test: the connection stays out of the
    // epoll sets throughout, so a write that waits for room must be
    // retried by the spinning scheduler itself (nothing else would tell
    // it of room before the 60 s are up).
    let (a, b) = spinning_pair("127.0.2.40@tcp", "127.0.2.41@tcp", Duration::from_secs(60));
    let inbox = MemRegion::zeroed(MIB);
    post(
        &b,
        &inbox,
        15,
        7,
        MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE,
    );
    put_acked_in_turn(&a, &b, &inbox, 40, 64);
    let detaches = a.runtime_stats().hot_detaches + b.runtime_stats().hot_detaches;
    assert!(
        detaches >= 1,
        "no scheduler took its connection out of epoll"
    );
    // 16 MiB in flight on the same connection: more than the sockets
    // hold, so the sender's scheduler waits for room while its connection
    // is out.
    let t0 = Instant::now();
    let data = pattern(MIB, 77);
    let src = MemRegion::from_vec(data.clone());
    let nb = b.nids()[0];
    let mds: Vec<_> = (0..16)
        .map(|_| {
            let md = bind(&a, &src);
            a.put(md, true, ProcessId::lustre(nb), 15, 7, 0, 0).unwrap();
            md
        })
        .collect();
    let evs = events_until(&a, |evs| {
        mds.iter()
            .all(|md| evs.iter().any(|e| e.md == *md && e.unlinked))
    });
    for md in &mds {
        assert!(kinds(&evs, *md).contains(&EventKind::Ack), "{evs:#?}");
    }
    assert!(evs.iter().all(|e| e.status().is_ok()), "{evs:#?}");
    assert!(
        inbox.to_vec()[..MIB] == data[..],
        "1 MiB PUT payload differs"
    );
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_eq!(
        a.runtime_stats().hot_detaches + b.runtime_stats().hot_detaches,
        detaches,
        "the connection went back into epoll while its schedulers spun"
    );
    a.shutdown();
    b.shutdown();
}

#[test]
fn a_scheduler_that_stops_spinning_hears_of_its_connection_again() {
    let (a, b) = spinning_pair(
        "127.0.2.42@tcp",
        "127.0.2.43@tcp",
        Duration::from_millis(100),
    );
    let inbox = MemRegion::zeroed(4096);
    post(
        &b,
        &inbox,
        15,
        7,
        MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE,
    );
    for round in 0..3 {
        // (A deaf connection would end only when a `sock_timeout` closed
        // it and LNet sent again on a new one: far beyond this bound.)
        let t0 = Instant::now();
        put_acked_in_turn(&a, &b, &inbox, 20, 64 + round);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "round {round}: {:?}",
            t0.elapsed()
        );
        // The schedulers stop spinning and block: the connection must be
        // back in their epoll sets for the next round to be heard.
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(a.runtime_stats().hot_detaches + b.runtime_stats().hot_detaches >= 1);
    a.shutdown();
    b.shutdown();
}

/// A port free on every one of `ips`.
fn common_port(ips: &[&str]) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind((ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..]
            .iter()
            .all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no common free port");
}

/// Two nets on one interface (Lustre's `net add --net tcp --if eth0` and
/// `--net tcp1 --if eth0`): both NIs listen on the same address and port
/// through one listener, which dispatches by the connection request's
/// NID, lives while either NI does, and closes with the last one so that
/// the address can be bound again at once.
#[test]
fn two_nets_on_one_address_share_its_listener() {
    let port = common_port(&["127.0.2.70", "127.0.2.71"]);
    let node = |ip: &str| {
        init_tracing();
        let mut cfg = LnetConfig::new(&[nid(&format!("{ip}@tcp")), nid(&format!("{ip}@tcp1"))]);
        cfg.accept_port = port;
        cfg.accept = AcceptPolicy::All;
        cfg.tick = Duration::from_millis(200);
        Lnet::start(cfg).unwrap()
    };
    let (a, b) = (node("127.0.2.70"), node("127.0.2.71"));
    for (x, ip) in [(&a, "127.0.2.70"), (&b, "127.0.2.71")] {
        for net in ["tcp", "tcp1"] {
            let bound = x.listen_addr(nid(&format!("{ip}@{net}"))).unwrap();
            assert_eq!(bound.to_string(), format!("{ip}:{port}"));
        }
    }
    let pings = |to: &str| a.ping(nid(to), LIMIT).is_ok();
    assert!(pings("127.0.2.71@tcp") && pings("127.0.2.71@tcp1"));
    // Deleting one NI leaves the other's listener alone.
    b.del_ni(nid("127.0.2.71@tcp")).unwrap();
    assert!(pings("127.0.2.71@tcp1"), "tcp1 still accepts");
    // The last NI closes it; adding one binds again, at once.
    b.del_ni(nid("127.0.2.71@tcp1")).unwrap();
    assert!(TcpStream::connect(("127.0.2.71", port)).is_err());
    b.add_ni(NiConfig::new(nid("127.0.2.71@tcp1"))).unwrap();
    // A ping written to a's old connection as b closes it is lost (LNet
    // learns of it by its timeout): ping with a short one until it works.
    let deadline = Instant::now() + LIMIT;
    while a
        .ping(nid("127.0.2.71@tcp1"), Duration::from_secs(2))
        .is_err()
    {
        assert!(Instant::now() < deadline, "tcp1 came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    a.shutdown();
    b.shutdown();
}
