//! Hostile clients against a listening transfer machine: garbage, a
//! wrong checksum, an oversize length, a truncated frame, a peer that
//! never reads its answers, and a flood of connections (bounded in
//! count). Each offending connection is closed by the server, which keeps
//! serving a well-behaved client throughout and loses no buffer.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use colibri_bulk_tcp::wire::{Header, Opcode};
use colibri_bulk_tcp::{TcpAddr, TcpConfig};
use common::Node;

/// True once the server closed `s` (end of file or reset) within `wait`.
fn closed_by_server(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

fn msg_frame(xid: u64, from: TcpAddr, to: TcpAddr, body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(Opcode::Msg, xid, from, to);
    h.total = body.len() as u64;
    h.body_len = body.len() as u32;
    let mut f = h.encode().to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn hostile_clients_are_cut_off_and_the_server_keeps_serving() {
    let server = Node::start("127.0.0.1:0:1", TcpConfig::default());
    server.recv_buffers(8, 4096);
    let client = Node::start("127.0.0.1:0:2", TcpConfig::default());
    let ep = client.ep(&server.addr);
    let to = TcpAddr::parse(&server.addr).unwrap();
    let me = TcpAddr::parse("127.0.0.1:9:77").unwrap();
    let mut round = 0u64;
    let mut served = |what: &str| {
        round += 1;
        let msg = format!("still serving after {what} ({round})");
        client.send(&ep, msg.as_bytes()).unwrap();
        assert_eq!(server.recv(), msg.as_bytes());
    };
    served("start");

    // Garbage instead of a header.
    let mut s = TcpStream::connect(to.sock()).unwrap();
    s.write_all(&[0xab; 200]).unwrap();
    assert!(closed_by_server(&mut s, Duration::from_secs(10)), "garbage");
    served("garbage");

    // A header whose checksum is wrong.
    let mut s = TcpStream::connect(to.sock()).unwrap();
    let mut f = msg_frame(1, me, to, b"hi");
    f[10] ^= 0x40;
    s.write_all(&f).unwrap();
    assert!(
        closed_by_server(&mut s, Duration::from_secs(10)),
        "checksum"
    );
    served("a bad checksum");

    // A header announcing a body far larger than any buffer.
    let mut s = TcpStream::connect(to.sock()).unwrap();
    let mut h = Header::new(Opcode::Msg, 2, me, to);
    h.total = u64::from(u32::MAX);
    h.body_len = u32::MAX;
    s.write_all(&h.encode()).unwrap();
    assert!(
        closed_by_server(&mut s, Duration::from_secs(10)),
        "oversize"
    );
    served("an oversize length");

    // Half a frame, then the client goes away.
    let mut s = TcpStream::connect(to.sock()).unwrap();
    let f = msg_frame(3, me, to, &[7u8; 1000]);
    s.write_all(&f[..f.len() / 2]).unwrap();
    drop(s);
    served("a truncated frame");

    // A client that sends valid messages and never reads the answers:
    // the server's writes to it back up, others are not held up.
    // They are for a service nobody runs: each is refused (Unreachable)
    // with an answer the client never reads.
    let nobody = TcpAddr { service: 99, ..to };
    let mut deaf = TcpStream::connect(to.sock()).unwrap();
    for x in 0..2000 {
        deaf.write_all(&msg_frame(100 + x, me, nobody, &[1u8; 64]))
            .unwrap();
    }
    served("a client that does not read");

    // A flood of connections that say nothing (bounded in count).
    let flood: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(to.sock()).unwrap())
        .collect();
    served("a flood of silent connections");
    drop(flood);
    drop(deaf);
    served("the flood went away");

    // Nothing lost: the server's receive buffers all come back at stop
    // (shutdown asserts every event is final and finalises the domain,
    // which refuses while a buffer is still queued).
    drop(ep);
    client.shutdown();
    server.shutdown();
}
