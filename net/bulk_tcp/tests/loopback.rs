//! In-process tests over loopback: many transfer machines, shared listening
//! ports, malformed and hostile peers on raw sockets, a peer that stops
//! reading, connection reuse and the skulker.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colibri_bulk_tcp::wire::{self, HEADER_LEN, Header, Opcode};
use colibri_bulk_tcp::{TcpAddr, TcpConfig, TcpTransport};
use colibri_net::{
    BufferCallbacks, Domain, NetError, QueueType, RecvParams, TmState, event_channel,
    ignore_tm_events,
};
use common::{Node, WAIT, pattern};

/// 200 client transfer machines (in 4 domains, each domain's machines
/// sharing one listening port) against one server machine that echoes
/// from its callbacks; each client sends 3 messages and writes one bulk
/// buffer of the server.
#[test]
fn two_hundred_client_tms_against_one_server() {
    const CLIENTS: usize = 200;
    const DOMS: usize = 4;
    let started = Instant::now();
    let xprt = TcpTransport::new(TcpConfig::default());
    let sdom = Domain::new(&xprt).unwrap();
    let server = sdom.tm_init(ignore_tm_events()).unwrap();
    let echo = Arc::new(
        BufferCallbacks::new()
            .on(QueueType::MsgRecv, |tm, mut ev| {
                if ev.status().is_err() {
                    return;
                }
                let (to, len) = (ev.take_sender().unwrap(), ev.length());
                let b = ev.take_buffer().expect("single-message buffer");
                tm.add_msg_send(b, &to, len).expect("echo");
            })
            .on(QueueType::MsgSend, |tm, mut ev| {
                let b = ev.take_buffer().unwrap();
                let _ = tm.add_msg_recv(b, RecvParams::default());
            }),
    );
    // One receive buffer per message the clients send (3 each): echoes
    // recycle buffers, but how fast depends on the machine's load, and a
    // message finding none would rightly fail with NoBuffers.
    for _ in 0..3 * CLIENTS {
        let b = sdom
            .register(colibri_net::BufVec::new(1, 256))
            .unwrap()
            .with_callbacks(echo.clone());
        server.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    server.start("127.0.0.1:0:1").unwrap();
    server.wait_for_state(TmState::Started, WAIT).unwrap();
    let saddr = server.ep().unwrap().addr().to_string();
    let (pcbs, passive_events) = event_channel(1024);
    let mut descs = Vec::new();
    for _ in 0..CLIENTS {
        let b = sdom
            .register(colibri_net::BufVec::new(1, 8192))
            .unwrap()
            .with_callbacks(pcbs.clone());
        descs.push(server.add_passive_recv(b, None).unwrap().1);
    }

    let (cbs, events) = event_channel(8 * CLIENTS);
    let doms: Vec<Domain> = (0..DOMS).map(|_| Domain::new(&xprt).unwrap()).collect();
    let mut clients = Vec::new();
    let mut ports = [0u16; DOMS];
    for i in 0..CLIENTS {
        let d = i % DOMS;
        let tm = doms[d].tm_init(ignore_tm_events()).unwrap();
        tm.start(&format!("127.0.0.1:{}:{}", ports[d], 100 + i))
            .unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        let a = TcpAddr::parse(tm.ep().unwrap().addr()).unwrap();
        if ports[d] == 0 {
            ports[d] = a.port;
        }
        assert_eq!(a.port, ports[d], "the domain's machines share one port");
        clients.push(tm);
    }
    for (i, tm) in clients.iter().enumerate() {
        let dom = &doms[i % DOMS];
        let ep = tm.ep_create(&saddr).unwrap();
        for k in 0..3u64 {
            let rb = dom
                .register(colibri_net::BufVec::new(1, 256))
                .unwrap()
                .with_callbacks(cbs.clone());
            tm.add_msg_recv(rb, RecvParams::default()).unwrap();
            let mut sb = dom
                .register(colibri_net::BufVec::new(1, 256))
                .unwrap()
                .with_callbacks(cbs.clone());
            sb.bufvec_mut()
                .copy_in(0, &pattern(i as u64 * 10 + k, 100))
                .unwrap();
            tm.add_msg_send(sb, &ep, 100).unwrap();
        }
        let mut ab = dom
            .register(colibri_net::BufVec::new(1, 8192))
            .unwrap()
            .with_callbacks(cbs.clone());
        ab.bufvec_mut()
            .copy_in(0, &pattern(i as u64, 8192))
            .unwrap();
        tm.add_active_send(ab, &descs[i], 8192).unwrap();
    }
    let mut got = vec![0usize; CLIENTS];
    for _ in 0..CLIENTS * 7 {
        let ev = events.recv_timeout(WAIT).expect("client event in time");
        assert!(ev.is_ok(), "{ev:?}");
        let i = clients
            .iter()
            .position(|t| t.id() == ev.token().tm())
            .unwrap();
        if ev.queue() == QueueType::MsgRecv {
            let m = ev.message().unwrap();
            assert!(
                (0..3).any(|k| m == pattern(i as u64 * 10 + k, 100)),
                "echo of client {i}"
            );
        }
        got[i] += 1;
    }
    assert!(got.iter().all(|&n| n == 7));
    let mut seen = [false; CLIENTS];
    for _ in 0..CLIENTS {
        let ev = passive_events
            .recv_timeout(WAIT)
            .expect("passive event in time");
        assert!(ev.is_ok(), "{ev:?}");
        let m = ev.message().unwrap();
        let i = (0..CLIENTS)
            .find(|&i| !seen[i] && m == pattern(i as u64, 8192))
            .expect("a client's data");
        seen[i] = true;
    }
    for tm in clients {
        tm.stop(false).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().unwrap();
    }
    server.stop(true).unwrap();
    server.wait_stopped(WAIT).unwrap();
    // One connection per client domain, shared by every machine of the
    // domain and used both ways (the server's echoes go back over it).
    assert_eq!(xprt.stats().connects, DOMS as u64);
    drop((events, passive_events));
    server.fini().unwrap();
    for d in doms {
        d.fini().unwrap();
    }
    sdom.fini().unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Transfer machines of different domains share a port; the listener
/// outlives the domain that opened it.
#[test]
fn listening_port_shared_across_domains() {
    let a = Node::start("127.0.0.1:0:1", TcpConfig::default());
    let port = TcpAddr::parse(&a.addr).unwrap().port;
    let b = Node::start(&format!("127.0.0.1:{port}:2"), TcpConfig::default());
    let c_xprt = TcpTransport::default();
    let c_dom = Domain::new(&c_xprt).unwrap();
    let c = c_dom.tm_init(ignore_tm_events()).unwrap();
    assert!(matches!(
        c.start(&format!("127.0.0.1:{port}:1")),
        Err(NetError::AddrInUse(_))
    ));
    let x = Node::start("127.0.0.1:0:9", TcpConfig::default());
    a.recv_buffers(1, 64);
    b.recv_buffers(2, 64);
    x.send(&x.ep(&a.addr), b"to a").unwrap();
    x.send(&x.ep(&b.addr), b"to b").unwrap();
    assert_eq!(a.recv(), b"to a");
    assert_eq!(b.recv(), b"to b");
    // The domain that opened the port goes away; b still listens on it.
    a.shutdown();
    x.send(&x.ep(&b.addr), b"still b").unwrap();
    assert_eq!(b.recv(), b"still b");
    b.shutdown();
    x.shutdown();
    drop(c);
    c_dom.fini().unwrap();
}

fn header(op: Opcode, to: &str, body: u32) -> Header {
    let mut h = Header::new(
        op,
        1,
        TcpAddr::parse("127.0.0.1:9:9").unwrap(),
        TcpAddr::parse(to).unwrap(),
    );
    h.body_len = body;
    if op == Opcode::Msg {
        h.total = body.into();
    }
    h
}

/// Reads until the peer closes; true if it did within a few seconds.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Garbage, bad fields and truncated frames close the connection; the
/// transfer machine loses nothing and keeps working.
#[test]
fn malformed_frames_close_the_connection_and_lose_nothing() {
    let n = Node::start("127.0.0.1:0:1", TcpConfig::default());
    let port = TcpAddr::parse(&n.addr).unwrap().port;
    let t =
        n.tm.add_msg_recv(n.buf(&[], 4096), RecvParams::default())
            .unwrap();

    // Random bytes.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&pattern(5, 300)).unwrap();
    assert!(closed_by_peer(&mut s));
    // A valid header addressed to another port.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&header(Opcode::Msg, "127.0.0.1:1:1", 10).encode())
        .unwrap();
    assert!(closed_by_peer(&mut s));
    // A success response with a body (only failures carry one).
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&header(Opcode::MsgAck, &n.addr, 4).encode())
        .unwrap();
    assert!(closed_by_peer(&mut s));
    // A status code that does not exist.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut h = header(Opcode::PutAck, &n.addr, 0);
    h.status = 999;
    s.write_all(&h.encode()).unwrap();
    assert!(closed_by_peer(&mut s));
    // A message cut short by the peer's death: its claim is given back.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&header(Opcode::Msg, &n.addr, 1000).encode())
        .unwrap();
    s.write_all(&[7u8; 10]).unwrap();
    drop(s);
    let deadline = Instant::now() + WAIT;
    while n.tm.buffer_state(t).is_some_and(|st| st.in_use) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        n.tm.buffer_state(t).is_some(),
        "the receive buffer is still queued"
    );
    assert!(
        n.events.try_recv().is_none(),
        "no event for a message that never arrived"
    );

    // A well-formed message still lands in that same buffer.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&header(Opcode::Msg, &n.addr, 5).encode())
        .unwrap();
    s.write_all(b"hello").unwrap();
    let mut ack = [0u8; HEADER_LEN];
    s.read_exact(&mut ack).unwrap();
    let a = Header::decode(&ack, 0).unwrap();
    assert_eq!((a.opcode, a.status, a.xid), (Opcode::MsgAck, 0, 1));
    let ev = n.next_on(QueueType::MsgRecv);
    assert_eq!(ev.token(), t);
    assert_eq!(ev.message().unwrap(), b"hello");
    assert_eq!(ev.sender().unwrap().addr(), "127.0.0.1:9:9");
    drop(ev);
    n.shutdown();
}

/// A PUT whose peer dies mid-chunk fails the passive buffer with
/// `ConnectionReset`; a PUT against a passive send buffer (wrong pairing)
/// fails both sides, checked on the wire as on every request.
#[test]
fn hostile_bulk_requests() {
    let n = Node::start("127.0.0.1:0:1", TcpConfig::default());
    let port = TcpAddr::parse(&n.addr).unwrap().port;
    let put = |desc: &[u8], total: u32, data: &[u8]| {
        let mut h = header(Opcode::Put, &n.addr, desc.len() as u32 + data.len() as u32);
        h.queue = QueueType::ActiveBulkSend.code();
        h.desc_len = desc.len() as u16;
        h.total = total.into();
        h.flags = wire::FLAG_LAST;
        let mut f = h.encode().to_vec();
        f.extend_from_slice(desc);
        f.extend_from_slice(data);
        f
    };
    // Peer death in the middle of the data.
    let (_, d) = n.tm.add_passive_recv(n.buf(&[], 1 << 20), None).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let f = put(d.as_bytes(), 100_000, &pattern(1, 100_000));
    s.write_all(&f[..f.len() - 50_000]).unwrap();
    drop(s);
    let ev = n.next_on(QueueType::PassiveBulkRecv);
    assert!(
        matches!(ev.error(), Some(NetError::ConnectionReset(_))),
        "{ev:?}"
    );
    drop(ev);
    // Wrong pairing: a write into a buffer offered for reading.
    let (_, d) =
        n.tm.add_passive_send(n.buf(&[1; 64], 64), 64, None)
            .unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&put(d.as_bytes(), 64, &[9; 64])).unwrap();
    let mut ack = [0u8; HEADER_LEN];
    s.read_exact(&mut ack).unwrap();
    let a = Header::decode(&ack, 0).unwrap();
    assert_eq!(a.opcode, Opcode::PutAck);
    let mut detail = vec![0u8; a.body_len as usize];
    s.read_exact(&mut detail).unwrap();
    let e = wire::decode_status(a.status, &detail).unwrap();
    assert!(matches!(e, NetError::WrongQueue { .. }), "{e:?}");
    // The refusal is the requester's: the passive buffer stays queued,
    // untouched, for the transfer it was made for.
    assert!(n.events.recv_timeout(Duration::from_millis(100)).is_err());
    assert_eq!(n.tm.rejected_requests(), 1);
    n.tm.stop(true).unwrap();
    let ev = n.next_on(QueueType::PassiveBulkSend);
    assert_eq!(ev.error(), Some(&NetError::Cancelled));
    assert_eq!(
        ev.buffer().unwrap().bufvec().to_vec(0, 64).unwrap(),
        vec![1; 64],
        "not overwritten"
    );
    drop(ev);
    n.shutdown();
}

/// A peer that accepts and never reads: a large send stays on the wire;
/// a queued one times out; stop with abort completes everything.
#[test]
fn stalled_peer_timeouts_and_abort() {
    let stall = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stall.local_addr().unwrap().port();
    let keep = std::thread::spawn(move || {
        let (s, _) = stall.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let n = Node::start("127.0.0.1:0:1", TcpConfig::default());
    let ep = n.ep(&format!("127.0.0.1:{port}:1"));
    let big = 32 << 20;
    n.tm.add_msg_send(n.buf(&[], big), &ep, big).unwrap();
    let mut b = n.buf(b"late", 4);
    b.set_timeout(Some(Instant::now() + Duration::from_millis(200)));
    n.tm.add_msg_send(b, &ep, 4).unwrap();
    let ev = n.next_on(QueueType::MsgSend);
    assert_eq!(ev.error(), Some(&NetError::TimedOut), "{ev:?}");
    drop(ev);
    assert_eq!(n.tm.queued(), 1, "the large send is still on the wire");
    let t0 = Instant::now();
    n.tm.stop(true).unwrap();
    n.tm.wait_stopped(WAIT).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "stop with abort does not wait for the peer"
    );
    let ev = n.next_on(QueueType::MsgSend);
    assert_eq!(ev.error(), Some(&NetError::Cancelled));
    drop((ev, ep));
    n.shutdown();
    keep.join().unwrap();
}

/// Repeated traffic reuses one connection; the skulker closes it once
/// idle, and the next send reconnects.
#[test]
fn connections_are_reused_and_reaped_when_idle() {
    let cfg = TcpConfig {
        idle_timeout: Duration::from_millis(100),
        ..TcpConfig::default()
    };
    let a = Node::start("127.0.0.1:0:1", cfg.clone());
    let b = Node::start("127.0.0.1:0:2", cfg);
    let ep = a.ep(&b.addr);
    let received = Arc::new(AtomicUsize::new(0));
    let r2 = received.clone();
    let cbs = Arc::new(
        BufferCallbacks::new().on(QueueType::MsgRecv, move |tm, mut ev| {
            r2.fetch_add(1, Ordering::SeqCst);
            if let Some(buf) = ev.take_buffer() {
                let _ = tm.add_msg_recv(buf, RecvParams::default());
            }
        }),
    );
    for _ in 0..4 {
        let rb = b
            .dom
            .register(colibri_net::BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(cbs.clone());
        b.tm.add_msg_recv(rb, RecvParams::default()).unwrap();
    }
    for i in 0..500u64 {
        a.send(&ep, &pattern(i, 32)).unwrap();
    }
    assert_eq!(received.load(Ordering::SeqCst), 500);
    // One connection for all the traffic, unless this thread was descheduled
    // for longer than the idle time between two sends (a loaded machine):
    // then the skulker closed it and the next send opened one more.
    let st = a.xprt.stats();
    assert_eq!(st.connects, st.reaped + 1, "{st:?}");
    assert!(st.connects <= 3, "connections are reused: {st:?}");
    let before = st.reaped;
    let deadline = Instant::now() + WAIT;
    while a.xprt.stats().reaped == before {
        assert!(Instant::now() < deadline, "idle connection never reaped");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.send(&ep, b"again").unwrap();
    let st = a.xprt.stats();
    assert!(
        st.connects >= before + 2,
        "reconnected after the reap: {st:?}"
    );
    drop(ep);
    a.shutdown();
    b.shutdown();
}

/// The soft limit on open files, from `/proc/self/limits`.
fn max_open_files() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|x| x.starts_with("Max open files"))
                .and_then(|x| x.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

/// Many connections, one I/O thread: 2000 raw sockets (fewer if the file
/// limit is low) each deliver a message to one transfer machine and get
/// their acknowledgement, all connections open at once.
#[test]
fn thousands_of_connections_one_io_thread() {
    let n_conns = 2000.min(max_open_files().saturating_sub(200) / 2);
    assert!(n_conns >= 400, "file limit too low for this test");
    const N: usize = 2000;
    let n = Node::start("127.0.0.1:0:1", TcpConfig::default());
    let port = TcpAddr::parse(&n.addr).unwrap().port;
    let received = Arc::new(AtomicUsize::new(0));
    let r2 = received.clone();
    let cbs = Arc::new(BufferCallbacks::new().on(QueueType::MsgRecv, move |_, ev| {
        if ev.is_ok() {
            r2.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let rb = n
        .dom
        .register(colibri_net::BufVec::new(1, 64 * N))
        .unwrap()
        .with_callbacks(cbs);
    n.tm.add_msg_recv(rb, RecvParams::multi(8, N as u32))
        .unwrap();
    let mut socks: Vec<TcpStream> = (0..n_conns)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    for (i, s) in socks.iter_mut().enumerate() {
        let mut h = header(Opcode::Msg, &n.addr, 8);
        h.xid = i as u64;
        s.write_all(&h.encode()).unwrap();
        s.write_all(&(i as u64).to_le_bytes()).unwrap();
    }
    for (i, s) in socks.iter_mut().enumerate() {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut ack = [0u8; HEADER_LEN];
        s.read_exact(&mut ack).unwrap();
        let a = Header::decode(&ack, 0).unwrap();
        assert_eq!((a.opcode, a.status, a.xid), (Opcode::MsgAck, 0, i as u64));
    }
    assert_eq!(received.load(Ordering::SeqCst), n_conns);
    assert_eq!(n.xprt.stats().accepts, n_conns as u64);
    drop(socks);
    n.shutdown();
}

/// A peer that accepts and never reads: once the socket stayed full for
/// `idle_timeout` the connection is given up and the send fails with
/// `TimedOut` (no buffer timeout needed).
#[test]
fn stalled_connection_is_given_up() {
    let stall = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stall.local_addr().unwrap().port();
    let keep = std::thread::spawn(move || {
        let (s, _) = stall.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let cfg = TcpConfig {
        idle_timeout: Duration::from_millis(300),
        ..TcpConfig::default()
    };
    let n = Node::start("127.0.0.1:0:1", cfg);
    let ep = n.ep(&format!("127.0.0.1:{port}:1"));
    let big = 32 << 20;
    let t0 = Instant::now();
    n.tm.add_msg_send(n.buf(&[], big), &ep, big).unwrap();
    let ev = n.next_on(QueueType::MsgSend);
    assert_eq!(ev.error(), Some(&NetError::TimedOut), "{ev:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(n.xprt.stats().broken, 1);
    drop((ev, ep));
    n.shutdown();
    keep.join().unwrap();
}
