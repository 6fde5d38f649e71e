//! Two processes over loopback: this test process and a
//! `colibri-tcp-peer` process exchange messages and do bulk both ways; a
//! peer killed with SIGKILL mid-bulk; a server restarted at the same
//! address.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use colibri_bulk_tcp::TcpConfig;
use colibri_net::checksum::crc32c;
use colibri_net::{BufToken, NetBufDesc, NetError, QueueType, RecvParams};
use common::{Node, PeerProc, WAIT, pattern};

fn desc_of(reply: &[u8]) -> NetBufDesc {
    assert_eq!(
        reply.first(),
        Some(&b'D'),
        "{:?}",
        String::from_utf8_lossy(reply)
    );
    NetBufDesc::from_bytes(reply[1..].to_vec())
}

fn crc_reply(len: usize, data: &[u8]) -> Vec<u8> {
    let mut r = vec![b'C'];
    r.extend_from_slice(&(len as u32).to_le_bytes());
    r.extend_from_slice(&crc32c(data).to_le_bytes());
    r
}

#[test]
fn messages_and_bulk_both_ways_with_data_checks() {
    let (mut server, saddr) = PeerProc::serve("127.0.0.1:0:7");
    let c = Node::start("127.0.0.1:0:1", TcpConfig::default());
    c.recv_buffers(8, 64 << 10);
    let s = c.ep(&saddr);

    // Echo, several sizes.
    for (i, len) in [1usize, 100, 4000, 60_000].into_iter().enumerate() {
        let data = pattern(i as u64, len);
        c.send(&s, &[b"E".as_slice(), &data].concat()).unwrap();
        assert_eq!(c.recv(), [b"e".as_slice(), &data].concat());
    }

    // Server -> client: the client reads a passive send buffer (3 MiB + a
    // bit: several chunks).
    let len = (3 << 20) + 123;
    let mut cmd = vec![b'S'];
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    cmd.extend_from_slice(&42u64.to_le_bytes());
    c.send(&s, &cmd).unwrap();
    let d = desc_of(&c.recv());
    c.tm.add_active_recv(c.buf(&[], len), &d).unwrap();
    let ev = c.next_on(QueueType::ActiveBulkRecv);
    assert!(ev.is_ok(), "{ev:?}");
    assert_eq!(ev.message().unwrap(), pattern(42, len));
    drop(ev);

    // Client -> server: the client writes a passive receive buffer.
    let len = (2 << 20) + 7;
    let data = pattern(43, len);
    let mut cmd = vec![b'R'];
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    c.send(&s, &cmd).unwrap();
    let d = desc_of(&c.recv());
    c.tm.add_active_send(c.buf(&data, len), &d, len).unwrap();
    assert!(c.next_on(QueueType::ActiveBulkSend).is_ok());
    assert_eq!(c.recv(), crc_reply(len, &data));

    // The server writes into our passive receive buffer.
    let len = (1 << 20) + 5;
    let (_, d) = c.tm.add_passive_recv(c.buf(&[], len), None).unwrap();
    let mut cmd = vec![b'P'];
    cmd.extend_from_slice(&44u64.to_le_bytes());
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    cmd.extend_from_slice(d.as_bytes());
    c.send(&s, &cmd).unwrap();
    let ev = c.next_on(QueueType::PassiveBulkRecv);
    assert!(ev.is_ok(), "{ev:?}");
    assert_eq!(ev.message().unwrap(), pattern(44, len));
    drop(ev);
    assert_eq!(c.recv(), b"K");

    // The server reads our passive send buffer.
    let len = 777_777;
    let data = pattern(45, len);
    let (_, d) = c.tm.add_passive_send(c.buf(&data, len), len, None).unwrap();
    let mut cmd = vec![b'G'];
    cmd.extend_from_slice(&(len as u32).to_le_bytes());
    cmd.extend_from_slice(d.as_bytes());
    c.send(&s, &cmd).unwrap();
    assert!(c.next_on(QueueType::PassiveBulkSend).is_ok());
    assert_eq!(c.recv(), crc_reply(len, &data));

    // Quit: the server checks that every buffer it added completed once.
    c.send(&s, b"Q").unwrap();
    let done = server.line();
    assert!(done.starts_with("DONE"), "{done}");
    assert!(server.wait().success(), "{done}");
    drop(s);
    c.shutdown();
}

/// This process is the server; the peer writes 32 MiB passive buffers in
/// a loop and is killed mid-transfer. Every buffer the server added must
/// complete exactly once, the interrupted ones with an error.
#[test]
fn client_killed_mid_bulk_server_completes_every_buffer() {
    for attempt in 0..3 {
        if kill_mid_bulk_once() {
            return;
        }
        eprintln!("attempt {attempt}: the kill fell between transfers; again");
    }
    panic!("never killed the client in the middle of a transfer");
}

fn kill_mid_bulk_once() -> bool {
    const LEN: usize = 32 << 20;
    let s = Node::start("127.0.0.1:0:9", TcpConfig::default());
    s.recv_buffers(4, 1024);
    let mut ledger: HashMap<BufToken, u32> = HashMap::new();
    let mut client = PeerProc::spawn(&["put-loop", &s.addr, "30"]);
    let mut peer = None;
    let mut in_flight = 0;
    let mut errors = 0;
    let mut completed = 0;
    let mut killed_at_rx = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "test took too long: killed at {killed_at_rx:?}, {in_flight} in flight, rx {}, {} adds, peer {}",
            s.xprt.stats().rx_bytes,
            ledger.len(),
            peer.is_some()
        );
        if killed_at_rx.is_none() && completed >= 2 {
            // Kill as soon as a transfer is under way (its passive buffer
            // claimed by the peer's PUT, not yet complete).
            let busy = ledger
                .keys()
                .any(|t| s.tm.buffer_state(*t).is_some_and(|st| st.in_use));
            if busy {
                client.kill();
                killed_at_rx = Some(s.xprt.stats().rx_bytes);
            }
        }
        let Ok(mut ev) = s.events.recv_timeout(Duration::from_millis(1)) else {
            // After the kill, wait until no passive buffer is in use by a
            // transfer any more; the ones never used stay queued.
            let busy = ledger
                .keys()
                .filter(|t| s.tm.buffer_state(**t).is_some_and(|st| st.in_use))
                .count();
            if killed_at_rx.is_some() && busy == 0 {
                break;
            }
            continue;
        };
        match ev.queue() {
            QueueType::MsgRecv => {
                assert!(ev.is_ok());
                if peer.is_none() {
                    peer = Some(ev.take_sender().unwrap());
                }
                let b = ev.take_buffer().unwrap();
                s.tm.add_msg_recv(b, RecvParams::default()).unwrap();
            }
            QueueType::PassiveBulkRecv => {
                *ledger.get_mut(&ev.token()).expect("known add") += 1;
                in_flight -= 1;
                match ev.status() {
                    Ok(()) => {
                        // The peer writes pattern 1 every time.
                        completed += 1;
                        let head = ev.with_data(|bv| bv.to_vec(0, 65536)).unwrap().unwrap();
                        assert_eq!(head, pattern(1, 65536));
                    }
                    Err(e) => {
                        assert!(
                            matches!(e, NetError::ConnectionReset(_)),
                            "interrupted transfer failed with {e:?}"
                        );
                        errors += 1;
                    }
                }
            }
            QueueType::MsgSend => {}
            q => panic!("unexpected event on {q:?}"),
        }
        drop(ev);
        if killed_at_rx.is_none()
            && let Some(p) = &peer
        {
            // Keep two descriptors offered at all times.
            while in_flight < 2 {
                let (t, d) = s.tm.add_passive_recv(s.buf(&[], LEN), None).unwrap();
                ledger.insert(t, 0);
                in_flight += 1;
                s.tm.add_msg_send(
                    s.buf(&[b"D".as_slice(), d.as_bytes()].concat(), d.len() + 1),
                    p,
                    d.len() + 1,
                )
                .unwrap();
            }
        }
    }
    // Stop: the buffers offered but never used complete with Cancelled.
    s.tm.stop(true).unwrap();
    s.tm.wait_stopped(WAIT).unwrap();
    while let Some(ev) = s.events.try_recv() {
        if ev.queue() == QueueType::PassiveBulkRecv {
            *ledger.get_mut(&ev.token()).expect("known add") += 1;
            assert!(ev.error().is_some_and(NetError::is_cancelled), "{ev:?}");
        }
    }
    let _ = in_flight;
    assert!(
        ledger.values().all(|&n| n == 1),
        "every passive buffer completes exactly once: {ledger:?}"
    );
    drop(peer);
    s.shutdown();
    errors > 0
}

#[test]
fn server_restarted_at_same_address_client_recovers() {
    let (mut server, saddr) = PeerProc::serve("127.0.0.1:0:5");
    let c = Node::start("127.0.0.1:0:2", TcpConfig::default());
    c.recv_buffers(4, 4096);
    let s = c.ep(&saddr);
    c.send(&s, b"Eone").unwrap();
    assert_eq!(c.recv(), b"eone");

    server.kill();
    // The next send fails: the connection broke (reset) or, once it is
    // known closed, nobody listens any more.
    let mut failed = false;
    for _ in 0..3 {
        match c.send(&s, b"Etwo") {
            Ok(()) => {}
            Err(e) => {
                assert!(
                    matches!(e, NetError::ConnectionReset(_) | NetError::Unreachable(_)),
                    "{e:?}"
                );
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "sends to a killed server must fail");

    let (server2, again) = PeerProc::serve(&saddr);
    assert_eq!(again, saddr);
    let deadline = Instant::now() + WAIT;
    loop {
        match c.send(&s, b"Ethree") {
            Ok(()) => break,
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.recv(), b"ethree");
    drop((s, server2));
    c.shutdown();
}
