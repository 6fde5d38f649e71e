//! Unit tests of the protocol, without sockets: two real transfer machines
//! of a fake transport (`testkit`), the two ends of one connection as two
//! [`Proto`]s, bytes moved between them by hand (in pieces of any size),
//! and time from a manual clock.

use std::time::{Duration, Instant};

use colibri_net::xprt::{DelReason, QueuedBuf};
use colibri_net::{
    BufToken, BufVec, BufferEvent, Clock, EventReceiver, ManualClock, NetBufDesc, NetError,
    QueueType, RecvParams, event_channel,
};

use super::{DIRECT_MIN, Expiry, Proto, RBUF};
use crate::addr::TcpAddr;
use crate::testkit::{self, Dir, Node, TestTm, frames, take_output};
use crate::wire::{FLAG_LAST, HEADER_LEN, Header, Opcode, decode_status, encode_status};

const A: &str = "127.0.0.1:5001:1";
const B: &str = "127.0.0.1:5002:2";

/// Two transfer machines and the two ends of a connection from `a` to
/// `b`'s listener.
struct Pair {
    clock: ManualClock,
    a: Node,
    b: Node,
    dir: Dir,
    /// `a`'s end (it connected).
    ab: Proto<TestTm>,
    /// `b`'s end (it accepted).
    ba: Proto<TestTm>,
    /// Bytes are fed in pieces of this size.
    piece: usize,
}

impl Pair {
    fn new(chunk: usize) -> Self {
        let clock = Clock::manual();
        let a = Node::new(A, clock.clock());
        let b = Node::new(B, clock.clock());
        let dir = Dir(vec![a.m.clone(), b.m.clone()]);
        let cfg = testkit::config(chunk);
        let now = clock.now();
        Self {
            ab: testkit::connected(cfg, now),
            ba: testkit::accepted(cfg, b.addr, now),
            clock,
            a,
            b,
            dir,
            piece: usize::MAX,
        }
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Moves everything `a`'s end has to write to `b`'s end; returns the
    /// frames moved.
    fn a_to_b(&mut self) -> colibri_net::Result<Vec<(Header, Vec<u8>)>> {
        let now = self.now();
        let bytes = take_output(&mut self.ab, usize::MAX, now)?;
        feed(&mut self.ba, &bytes, self.piece, now, &self.dir)?;
        Ok(frames(&bytes))
    }

    /// Moves everything `b`'s end has to write to `a`'s end.
    fn b_to_a(&mut self) -> colibri_net::Result<Vec<(Header, Vec<u8>)>> {
        let now = self.now();
        let bytes = take_output(&mut self.ba, usize::MAX, now)?;
        feed(&mut self.ab, &bytes, self.piece, now, &self.dir)?;
        Ok(frames(&bytes))
    }

    /// Moves bytes both ways until neither end has anything to write.
    fn settle(&mut self) {
        while self.ab.has_output() || self.ba.has_output() {
            self.a_to_b().expect("a to b");
            self.b_to_a().expect("b to a");
        }
    }

    /// The requester's node and end, and the responder's node: `a` asks
    /// `b` over the connection it opened (`fwd`), or `b` asks `a` back
    /// over the connection it accepted.
    fn roles(&mut self, fwd: bool) -> (&Node, &mut Proto<TestTm>, &Node) {
        if fwd {
            (&self.a, &mut self.ab, &self.b)
        } else {
            (&self.b, &mut self.ba, &self.a)
        }
    }

    /// Sends `data` from `a` to `b`; returns the send buffer's token.
    fn send(
        &mut self,
        data: &[u8],
        cbs: &std::sync::Arc<colibri_net::BufferCallbacks>,
    ) -> BufToken {
        let ep = self.a.tm.ep_create(B).unwrap();
        let buf = registered(&self.a, data, data.len().max(1), cbs);
        let t = self.a.tm.add_msg_send(buf, &ep, data.len()).unwrap();
        self.a.start_last(&mut self.ab);
        t
    }
}

/// Feeds `bytes` in pieces of `piece`.
fn feed(
    p: &mut Proto<TestTm>,
    bytes: &[u8],
    piece: usize,
    now: Instant,
    dir: &Dir,
) -> colibri_net::Result<()> {
    for part in bytes.chunks(piece.clamp(1, bytes.len().max(1))) {
        p.feed(part, now, dir)?;
    }
    Ok(())
}

/// A registered buffer of `size` bytes (segments of 1000, so that data
/// crosses segment boundaries) holding `data`.
fn registered(
    n: &Node,
    data: &[u8],
    size: usize,
    cbs: &std::sync::Arc<colibri_net::BufferCallbacks>,
) -> colibri_net::NetBuffer {
    let mut bv = BufVec::with_len(size, 1000);
    bv.copy_in(0, data).unwrap();
    n.dom.register(bv).unwrap().with_callbacks(cbs.clone())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The next event, which must be there already (nothing runs in the
/// background).
fn event(ev: &EventReceiver) -> BufferEvent {
    ev.try_recv().expect("an event")
}

fn no_event(ev: &EventReceiver) {
    if let Some(e) = ev.try_recv() {
        panic!("unexpected event {:?} {:?}", e.queue(), e.status());
    }
}

fn ops(fs: &[(Header, Vec<u8>)]) -> Vec<Opcode> {
    fs.iter().map(|(h, _)| h.opcode).collect()
}

fn status_of(h: &Header, body: &[u8]) -> Option<NetError> {
    (h.status != 0).then(|| decode_status(h.status, body).unwrap())
}

// ----- messages ---------------------------------------------------------------

#[test]
fn message_round_trip_in_any_pieces() {
    for piece in [1, 7, 67, 68, 69, 1000, usize::MAX] {
        let mut p = Pair::new(1 << 20);
        p.piece = piece;
        let (cbs, ev) = event_channel(8);
        let rbuf = registered(&p.b, &[], 4096, &cbs);
        p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
        let data = pattern(100, 1);
        let st = p.send(&data, &cbs);

        let fs = p.a_to_b().unwrap();
        assert_eq!(ops(&fs), [Opcode::Msg], "piece {piece}");
        let (h, body) = &fs[0];
        assert_eq!((h.xid, h.total, h.body_len), (1, 100, 100));
        assert_eq!((h.sender, h.receiver), (p.a.addr, p.b.addr));
        assert_eq!(body, &data);
        let e = event(&ev);
        assert_eq!(e.queue(), QueueType::MsgRecv);
        assert_eq!(e.message().unwrap(), data);
        assert_eq!(e.sender().unwrap().addr(), A);

        let fs = p.b_to_a().unwrap();
        assert_eq!(ops(&fs), [Opcode::MsgAck]);
        assert_eq!((fs[0].0.xid, fs[0].0.status, fs[0].0.body_len), (1, 0, 0));
        assert_eq!((fs[0].0.sender, fs[0].0.receiver), (p.b.addr, p.a.addr));
        let e = event(&ev);
        assert_eq!((e.queue(), e.length()), (QueueType::MsgSend, 100));
        assert!(e.is_ok());
        assert_eq!(p.a.m.completions_of(st), 1);
        assert!(p.ab.is_idle() && p.ba.is_idle());
    }
}

/// `b` receives `a`'s request and answers it before its MSG_ACK is
/// written; returns the answer's send token.
fn answer_before_the_ack_leaves(
    p: &mut Pair,
    cbs: &std::sync::Arc<colibri_net::BufferCallbacks>,
    ev: &EventReceiver,
) -> (BufToken, BufToken) {
    for n in [&p.a, &p.b] {
        let rbuf = registered(n, &[], 4096, cbs);
        n.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    }
    let req = pattern(100, 1);
    let st = p.send(&req, cbs);
    assert_eq!(ops(&p.a_to_b().unwrap()), [Opcode::Msg]);
    assert_eq!(event(ev).message().unwrap(), req);
    assert!(p.ba.has_output(), "the MSG_ACK waits to be written");
    let ans = pattern(50, 2);
    let ep = p.b.tm.ep_create(A).unwrap();
    let buf = registered(&p.b, &ans, 50, cbs);
    let at = p.b.tm.add_msg_send(buf, &ep, 50).unwrap();
    p.b.start_last(&mut p.ba);
    (st, at)
}

#[test]
fn an_answer_carries_the_acknowledgement_of_its_request() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let (st, at) = answer_before_the_ack_leaves(&mut p, &cbs, &ev);
    // One frame: the answer, acknowledging message 1.
    let fs = p.b_to_a().unwrap();
    assert_eq!(ops(&fs), [Opcode::Msg]);
    assert_eq!((fs[0].0.acks(), fs[0].0.body_len), (Some(1), 50));
    // `a`: the request completes, and the answer arrives.
    let mut got: Vec<_> = (0..2).map(|_| event(&ev)).collect();
    got.sort_by_key(|e| e.queue() != QueueType::MsgSend);
    assert_eq!((got[0].queue(), got[0].length()), (QueueType::MsgSend, 100));
    assert!(got[0].is_ok());
    assert_eq!(got[1].message().unwrap(), pattern(50, 2));
    assert_eq!(p.a.m.completions_of(st), 1);
    // `a` has nothing to answer with: its MSG_ACK goes alone.
    let fs = p.a_to_b().unwrap();
    assert_eq!(ops(&fs), [Opcode::MsgAck]);
    assert_eq!(fs[0].0.acks(), None);
    let e = event(&ev);
    assert_eq!((e.queue(), e.length()), (QueueType::MsgSend, 50));
    assert_eq!(p.b.m.completions_of(at), 1);
    no_event(&ev);
    assert!(p.ab.is_idle() && p.ba.is_idle());
}

#[test]
fn a_cancelled_answer_still_sends_the_acknowledgement_it_carried() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let (st, at) = answer_before_the_ack_leaves(&mut p, &cbs, &ev);
    del_through_core(&p.b, &mut p.ba, at);
    assert_eq!(event(&ev).error(), Some(&NetError::Cancelled));
    let fs = p.b_to_a().unwrap();
    assert_eq!(ops(&fs), [Opcode::MsgAck]);
    assert_eq!((fs[0].0.xid, fs[0].0.status), (1, 0));
    let e = event(&ev);
    assert_eq!((e.queue(), e.length()), (QueueType::MsgSend, 100));
    assert!(e.is_ok());
    assert_eq!(p.a.m.completions_of(st), 1);
    no_event(&ev);
}

#[test]
fn large_bodies_are_read_straight_into_the_claimed_buffer() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let rbuf = registered(&p.b, &[], 30_000, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::multi(1, 8)).unwrap();
    let rq = p.b.last_added();
    let now = p.now();
    for (i, (len, off)) in [(100, 0), (10_000, 100)].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        p.send(&data, &cbs);
        let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
        // The header alone: the body is expected next.
        p.ba.feed(&bytes[..HEADER_LEN], now, &p.dir).unwrap();
        let space = p.ba.recv_space();
        if len < DIRECT_MIN {
            // A small body is read with the next headers and copied.
            assert!(space.direct.is_none());
        } else {
            let d = space.direct.expect("a direct read");
            assert_eq!(d.buf.token(), rq.token());
            assert_eq!((d.off, d.len), (off, len));
            assert!(!space.spare.is_empty(), "room for the next headers");
        }
        p.ba.feed(&bytes[HEADER_LEN..], now, &p.dir).unwrap();
        let e = event(&ev);
        assert_eq!((e.offset(), e.message().unwrap()), (off, data));
        p.b_to_a().unwrap();
        assert!(event(&ev).is_ok());
    }
    // A body that arrives in the same read as its header is copied from
    // the read buffer even when large; what is left goes direct.
    let data = pattern(5000, 9);
    p.send(&data, &cbs);
    let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
    p.ba.feed(&bytes[..HEADER_LEN + 1000], now, &p.dir).unwrap();
    let d = p.ba.recv_space().direct.expect("the rest goes direct");
    assert_eq!((d.off, d.len), (10_100 + 1000, 4000));
    p.ba.feed(&bytes[HEADER_LEN + 1000..], now, &p.dir).unwrap();
    assert_eq!(event(&ev).message().unwrap(), data);
}

#[test]
fn message_failures_reach_the_sender() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    // No receive buffer.
    p.send(&pattern(10, 0), &cbs);
    p.a_to_b().unwrap();
    let fs = p.b_to_a().unwrap();
    assert_eq!(ops(&fs), [Opcode::MsgAck]);
    assert_eq!(status_of(&fs[0].0, &fs[0].1), Some(NetError::NoBuffers));
    assert_eq!(event(&ev).error(), Some(&NetError::NoBuffers));
    assert_eq!(p.b.tm.no_buffer_drops(), 1);

    // Too large for the only receive buffer: both fail the same way.
    let rbuf = registered(&p.b, &[], 64, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    p.send(&pattern(100, 0), &cbs);
    p.settle();
    let big = NetError::MessageTooLarge {
        len: 100,
        space: 64,
    };
    let (e1, e2) = (event(&ev), event(&ev));
    let mut got = [
        (e1.queue(), e1.error().cloned()),
        (e2.queue(), e2.error().cloned()),
    ];
    got.sort_by_key(|(q, _)| q.index());
    assert_eq!(
        got,
        [
            (QueueType::MsgRecv, Some(big.clone())),
            (QueueType::MsgSend, Some(big))
        ]
    );

    // No such service behind the listener: unreachable.
    let ep = p.a.tm.ep_create("127.0.0.1:5002:9").unwrap();
    let buf = registered(&p.a, b"x", 1, &cbs);
    p.a.tm.add_msg_send(buf, &ep, 1).unwrap();
    p.a.start_last(&mut p.ab);
    p.settle();
    assert!(matches!(event(&ev).error(), Some(NetError::Unreachable(_))));
    no_event(&ev);
}

// ----- bulk ------------------------------------------------------------------

/// A passive send buffer on the responder and an active receive on the
/// requester.
#[test]
fn get_in_chunks_both_ways() {
    for fwd in [true, false] {
        let mut p = Pair::new(1000);
        p.piece = 333;
        let (cbs, ev) = event_channel(8);
        let data = pattern(4500, 3);
        let (req, end, resp) = p.roles(fwd);
        let (req_addr, resp_addr) = (req.addr, resp.addr);
        let pbuf = registered(resp, &data, 5000, &cbs);
        let (pt, desc) = resp.tm.add_passive_send(pbuf, data.len(), None).unwrap();
        let abuf = registered(req, &[], 6000, &cbs);
        let at = req.tm.add_active_recv(abuf, &desc).unwrap();
        req.start_last(end);

        let reqs = if fwd { p.a_to_b() } else { p.b_to_a() }.unwrap();
        assert_eq!(ops(&reqs), [Opcode::Get; 5]);
        for (i, (h, body)) in reqs.iter().enumerate() {
            let n = if i == 4 { 500 } else { 1000 };
            assert_eq!(h.queue, QueueType::ActiveBulkRecv.code());
            assert_eq!((h.offset, h.chunk, h.total), (i as u64 * 1000, n, 6000));
            assert_eq!(h.is_last(), i == 4);
            assert_eq!(body, desc.as_bytes());
            assert_eq!((h.sender, h.receiver), (req_addr, resp_addr));
        }
        // The passive buffer completes when its last chunk is written.
        let now = p.now();
        let (resp_end, resp_m) = if fwd {
            (&mut p.ba, &p.b.m)
        } else {
            (&mut p.ab, &p.a.m)
        };
        let mut bytes = take_output(resp_end, 5 * HEADER_LEN + 4499, now).unwrap();
        assert_eq!(resp_m.completions_of(pt), 0);
        no_event(&ev);
        bytes.extend(take_output(resp_end, usize::MAX, now).unwrap());
        assert_eq!(resp_m.completions_of(pt), 1);
        let e = event(&ev);
        assert_eq!((e.queue(), e.length()), (QueueType::PassiveBulkSend, 4500));
        let fs = frames(&bytes);
        assert_eq!(ops(&fs), [Opcode::GetData; 5]);
        for (i, (h, body)) in fs.iter().enumerate() {
            assert_eq!((h.offset, h.total, h.status), (i as u64 * 1000, 4500, 0));
            assert_eq!((h.sender, h.receiver), (resp_addr, req_addr));
            assert_eq!(body, &data[i * 1000..(i * 1000 + 1000).min(4500)]);
        }
        let (req_end, req_m) = if fwd {
            (&mut p.ab, &p.a.m)
        } else {
            (&mut p.ba, &p.b.m)
        };
        feed(req_end, &bytes, 777, now, &p.dir).unwrap();
        let e = event(&ev);
        assert_eq!((e.queue(), e.length()), (QueueType::ActiveBulkRecv, 4500));
        assert_eq!(e.with_data(|bv| bv.to_vec(0, 4500).unwrap()).unwrap(), data);
        assert_eq!(req_m.completions_of(at), 1);
        assert!(p.ab.is_idle() && p.ba.is_idle());
    }
}

#[test]
fn put_in_chunks_both_ways() {
    for fwd in [true, false] {
        let mut p = Pair::new(1000);
        p.piece = 1500;
        let (cbs, ev) = event_channel(8);
        let data = pattern(4500, 4);
        let (req, end, resp) = p.roles(fwd);
        let pbuf = registered(resp, &[], 5000, &cbs);
        let (_, desc) = resp.tm.add_passive_recv(pbuf, None).unwrap();
        let abuf = registered(req, &data, 4500, &cbs);
        req.tm.add_active_send(abuf, &desc, data.len()).unwrap();
        req.start_last(end);
        let fs = if fwd { p.a_to_b() } else { p.b_to_a() }.unwrap();
        assert_eq!(ops(&fs), [Opcode::Put; 5]);
        for (i, (h, body)) in fs.iter().enumerate() {
            let n = if i == 4 { 500 } else { 1000 };
            assert_eq!(h.queue, QueueType::ActiveBulkSend.code());
            assert_eq!((h.offset, h.total, h.chunk), (i as u64 * 1000, 4500, 0));
            assert_eq!((h.desc_len as usize, h.data_len()), (desc.len(), n));
            assert_eq!(h.is_last(), i == 4);
            assert_eq!(&body[..desc.len()], desc.as_bytes());
            assert_eq!(&body[desc.len()..], &data[i * 1000..i * 1000 + n as usize]);
        }
        // The last chunk completes the passive buffer and is answered.
        let e = event(&ev);
        assert_eq!((e.queue(), e.length()), (QueueType::PassiveBulkRecv, 4500));
        assert_eq!(e.with_data(|bv| bv.to_vec(0, 4500).unwrap()).unwrap(), data);
        let fs = if fwd { p.b_to_a() } else { p.a_to_b() }.unwrap();
        assert_eq!(ops(&fs), [Opcode::PutAck]);
        assert_eq!(fs[0].0.status, 0);
        let e = event(&ev);
        assert_eq!((e.queue(), e.length()), (QueueType::ActiveBulkSend, 4500));
        assert!(p.ab.is_idle() && p.ba.is_idle());
    }
}

#[test]
fn bulk_refusals_fail_both_sides_alike() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    // A PUT into a passive *send* buffer: wrong queue pairing.
    let pbuf = registered(&p.b, &[], 3000, &cbs);
    let (_, sdesc) = p.b.tm.add_passive_send(pbuf, 3000, None).unwrap();
    let abuf = registered(&p.a, &pattern(2000, 0), 2000, &cbs);
    p.a.tm.add_active_send(abuf, &sdesc, 2000).unwrap();
    p.a.start_last(&mut p.ab);
    p.a_to_b().unwrap();
    let fs = p.b_to_a().unwrap();
    let wrong = NetError::WrongQueue {
        passive: QueueType::PassiveBulkSend,
        active: QueueType::ActiveBulkSend,
    };
    // Answered once, on the first chunk; the second is dropped.
    assert_eq!(ops(&fs), [Opcode::PutAck]);
    assert_eq!(status_of(&fs[0].0, &fs[0].1), Some(wrong.clone()));
    assert_eq!(event(&ev).error(), Some(&wrong));
    // The passive buffer was left alone and still serves a genuine GET.
    assert_eq!(p.b.tm.queue_len(QueueType::PassiveBulkSend), 1);

    // A GET into an active buffer smaller than the passive length: one
    // GET only, refused with TooBig.
    let small = registered(&p.a, &[], 2000, &cbs);
    p.a.tm.add_active_recv(small, &sdesc).unwrap();
    p.a.start_last(&mut p.ab);
    let fs = p.a_to_b().unwrap();
    assert_eq!(ops(&fs), [Opcode::Get]);
    assert!(fs[0].0.is_last());
    let fs = p.b_to_a().unwrap();
    assert_eq!(ops(&fs), [Opcode::GetData]);
    assert!(matches!(
        status_of(&fs[0].0, &fs[0].1),
        Some(NetError::TooBig(_))
    ));
    assert!(matches!(event(&ev).error(), Some(NetError::TooBig(_))));
    no_event(&ev);
}

// ----- protocol violations ----------------------------------------------------------

fn header(op: Opcode, xid: u64, from: TcpAddr, to: TcpAddr) -> Header {
    Header::new(op, xid, from, to)
}

fn is_protocol(r: colibri_net::Result<()>) -> NetError {
    match r {
        Err(e @ NetError::Protocol(_)) => e,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn malformed_frames_are_protocol_errors() {
    let p = Pair::new(1000);
    let (a, b) = (p.a.addr, p.b.addr);
    let cfg = testkit::config(1000);
    let fresh = || testkit::accepted(cfg, b, p.now());
    let mut bad: Vec<(&str, Vec<u8>)> = vec![("garbage", vec![0xab; HEADER_LEN])];
    let mut crc = header(Opcode::MsgAck, 1, b, a).encode();
    crc[10] ^= 1;
    bad.push(("checksum", crc.to_vec()));
    let mut huge = header(Opcode::Msg, 1, a, b);
    huge.total = u64::from(cfg.max_body) + 1;
    huge.body_len = cfg.max_body + 1;
    bad.push(("oversize message", huge.encode().to_vec()));
    let mut other = header(Opcode::Msg, 1, a, TcpAddr { port: 9, ..b });
    other.total = 1;
    other.body_len = 1;
    bad.push(("another listener", [&other.encode()[..], b"x"].concat()));
    let mut ack = header(Opcode::MsgAck, 1, b, a);
    let (code, _) = encode_status(&NetError::MessageTooLarge { len: 1, space: 1 });
    ack.status = code;
    ack.body_len = 3;
    bad.push(("bad status detail", [&ack.encode()[..], b"abc"].concat()));
    for (what, bytes) in bad {
        for piece in [1, 50, usize::MAX] {
            let mut end = fresh();
            let e = is_protocol(feed(&mut end, &bytes, piece, p.now(), &p.dir));
            end.fail_all(&e);
            let _ = what;
        }
    }
}

#[test]
fn answers_that_do_not_match_their_request_are_protocol_errors() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    let (a, b) = (p.a.addr, p.b.addr);
    let pbuf = registered(&p.b, &pattern(3000, 0), 3000, &cbs);
    let (_, desc) = p.b.tm.add_passive_send(pbuf, 3000, None).unwrap();
    let abuf = registered(&p.a, &[], 3000, &cbs);
    let at = p.a.tm.add_active_recv(abuf, &desc).unwrap();
    p.a.start_last(&mut p.ab);
    let st = p.send(b"hi", &cbs);
    take_output(&mut p.ab, usize::MAX, p.clock.now()).unwrap();

    // GET_DATA that does not follow (offset 1000 first).
    let mut gd = header(Opcode::GetData, 1, b, a);
    (gd.offset, gd.total, gd.chunk, gd.body_len) = (1000, 3000, 1000, 1000);
    let bytes = [&gd.encode()[..], &[0u8; 1000][..]].concat();
    let e = is_protocol(p.ab.feed(&bytes, p.clock.now(), &p.dir));
    // The I/O layer closes the connection: everything on it fails once.
    p.ab.fail_all(&e);
    p.ab.fail_all(&e);
    for _ in 0..2 {
        assert_eq!(event(&ev).error(), Some(&e));
    }
    assert_eq!((p.a.m.completions_of(at), p.a.m.completions_of(st)), (1, 1));

    // GET_DATA for a message; MSG_ACK for a GET.
    for (op, mk) in [(Opcode::GetData, true), (Opcode::MsgAck, false)] {
        let mut end = testkit::connected(testkit::config(1000), p.now());
        let abuf = registered(&p.a, &[], 3000, &cbs);
        p.a.tm.add_active_recv(abuf, &desc).unwrap();
        p.a.start_last(&mut end);
        let ep = p.a.tm.ep_create(B).unwrap();
        let sbuf = registered(&p.a, b"hi", 2, &cbs);
        p.a.tm.add_msg_send(sbuf, &ep, 2).unwrap();
        p.a.start_last(&mut end);
        take_output(&mut end, usize::MAX, p.now()).unwrap();
        // xid 1 is the GET, 2 the message.
        let mut h = header(op, if mk { 2 } else { 1 }, b, a);
        let body = if op == Opcode::GetData {
            (h.total, h.chunk, h.body_len) = (3000, 2, 2);
            vec![0u8; 2]
        } else {
            Vec::new()
        };
        let e = is_protocol(end.feed(&[&h.encode()[..], &body].concat(), p.now(), &p.dir));
        end.fail_all(&e);
        assert_eq!(event(&ev).error(), Some(&e));
        assert_eq!(event(&ev).error(), Some(&e));
    }
    no_event(&ev);
}

#[test]
fn put_chunks_out_of_order_fail_the_transfer_not_the_connection() {
    for (skip, last_early) in [(true, false), (false, true)] {
        let mut p = Pair::new(1000);
        let (cbs, ev) = event_channel(8);
        let pbuf = registered(&p.b, &[], 3000, &cbs);
        let (pt, desc) = p.b.tm.add_passive_recv(pbuf, None).unwrap();
        let (a, b) = (p.a.addr, p.b.addr);
        let put = |off: u64, last: bool| {
            let mut h = header(Opcode::Put, 7, a, b);
            h.queue = QueueType::ActiveBulkSend.code();
            (h.offset, h.total) = (off, 3000);
            h.desc_len = desc.len() as u16;
            h.body_len = desc.len() as u32 + 1000;
            if last {
                h.flags = FLAG_LAST;
            }
            [&h.encode()[..], desc.as_bytes(), &[5u8; 1000][..]].concat()
        };
        let mut bytes = put(0, false);
        if skip {
            bytes.extend(put(2000, true));
        } else if last_early {
            bytes.extend(put(1000, true));
        }
        p.ba.feed(&bytes, p.now(), &p.dir).unwrap();
        let fs = frames(&take_output(&mut p.ba, usize::MAX, p.clock.now()).unwrap());
        assert_eq!(ops(&fs), [Opcode::PutAck]);
        let st = status_of(&fs[0].0, &fs[0].1);
        assert!(matches!(st, Some(NetError::Protocol(_))), "{st:?}");
        let e = event(&ev);
        assert_eq!(
            (e.queue(), e.error()),
            (QueueType::PassiveBulkRecv, st.as_ref())
        );
        assert_eq!(p.b.m.completions_of(pt), 1);
        // The connection still works.
        assert!(p.ba.is_idle());
        no_event(&ev);
    }
}

#[test]
fn descriptors_of_another_transport_are_refused() {
    let mut p = Pair::new(1000);
    let (cbs, _ev) = event_channel(8);
    let pbuf = registered(&p.b, &[], 3000, &cbs);
    let (_, desc) = p.b.tm.add_passive_send(pbuf, 3000, None).unwrap();
    let mut f = desc.decode().unwrap();
    f.transport_id = u32::from_le_bytes(*b"MEM1");
    let foreign = NetBufDesc::encode(&f, 1024).unwrap();
    let mut h = header(Opcode::Get, 3, p.a.addr, p.b.addr);
    h.queue = QueueType::ActiveBulkRecv.code();
    (h.total, h.chunk, h.flags) = (3000, 3000, FLAG_LAST);
    h.desc_len = foreign.len() as u16;
    h.body_len = foreign.len() as u32;
    let bytes = [&h.encode()[..], foreign.as_bytes()].concat();
    p.ba.feed(&bytes, p.now(), &p.dir).unwrap();
    let fs = frames(&take_output(&mut p.ba, usize::MAX, p.clock.now()).unwrap());
    assert_eq!(ops(&fs), [Opcode::GetData]);
    assert!(matches!(
        status_of(&fs[0].0, &fs[0].1),
        Some(NetError::InvalidDescriptor(_))
    ));
}

// ----- deletions --------------------------------------------------------------

/// Deletes `t` through the core, which asks the transport (the buffer is
/// in use), and hands the request to the protocol as the I/O thread does.
fn del_through_core(n: &Node, end: &mut Proto<TestTm>, t: BufToken) -> QueuedBuf {
    assert!(n.tm.del(t).unwrap());
    let dels = n.take_dels();
    assert_eq!(dels.len(), 1);
    let (q, reason) = dels.into_iter().next().unwrap();
    assert_eq!(reason, DelReason::Cancel);
    assert!(end.del_outgoing(&q, &NetError::Cancelled, false).unwrap());
    q
}

#[test]
fn del_before_a_byte_is_written_withdraws_the_operation() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    let st = p.send(&pattern(100, 0), &cbs);
    let pbuf = registered(&p.b, &[], 3000, &cbs);
    let (_, desc) = p.b.tm.add_passive_recv(pbuf, None).unwrap();
    let abuf = registered(&p.a, &pattern(3000, 0), 3000, &cbs);
    let at = p.a.tm.add_active_send(abuf, &desc, 3000).unwrap();
    p.a.start_last(&mut p.ab);
    for t in [st, at] {
        del_through_core(&p.a, &mut p.ab, t);
        assert_eq!(event(&ev).error(), Some(&NetError::Cancelled));
        assert_eq!(p.a.m.completions_of(t), 1);
    }
    // Nothing went out, not even an ABORT.
    assert!(!p.ab.has_output());
    assert!(p.ab.is_idle());
    let q = p.a.last_added();
    assert!(!p.ab.del_outgoing(&q, &NetError::Cancelled, false).unwrap());
}

#[test]
fn a_cancel_cannot_take_back_a_message_already_written() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let rbuf = registered(&p.b, &[], 4096, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    let st = p.send(&pattern(100, 2), &cbs);
    // Every byte of the message is written: the cancel changes nothing.
    p.a_to_b().unwrap();
    let e = event(&ev);
    assert_eq!(e.queue(), QueueType::MsgRecv);
    drop(e);
    assert!(p.a.tm.del(st).unwrap());
    let (q, reason) = p.a.take_dels().into_iter().next().unwrap();
    assert_eq!(reason, DelReason::Cancel);
    assert!(p.ab.del_outgoing(&q, &NetError::Cancelled, true).unwrap());
    no_event(&ev);
    assert!(!p.ab.has_output(), "no ABORT for a message");
    // It completes with the acknowledgement: a cancelled message is never
    // one that arrived.
    p.b_to_a().unwrap();
    let e = event(&ev);
    assert_eq!((e.queue(), e.length()), (QueueType::MsgSend, 100));
    assert!(e.is_ok());
    assert_eq!(p.a.m.completions_of(st), 1);
}

#[test]
fn a_message_partly_written_is_finished_from_a_copy() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let rbuf = registered(&p.b, &[], 8000, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    let data = pattern(5000, 6);
    let st = p.send(&data, &cbs);
    let now = p.now();
    let head = take_output(&mut p.ab, 100, now).unwrap();
    del_through_core(&p.a, &mut p.ab, st);
    // The buffer is back at once; scribbling on it changes nothing.
    let mut e = event(&ev);
    assert_eq!(e.error(), Some(&NetError::Cancelled));
    e.take_buffer().unwrap().bufvec_mut().fill(0xee);
    let rest = take_output(&mut p.ab, usize::MAX, now).unwrap();
    assert_eq!(head.len() + rest.len(), HEADER_LEN + 5000);
    let bytes = [head, rest].concat();
    p.ba.feed(&bytes, now, &p.dir).unwrap();
    assert_eq!(event(&ev).message().unwrap(), data);
    // The acknowledgement finds no operation: ignored.
    p.b_to_a().unwrap();
    no_event(&ev);
    assert_eq!(p.a.m.completions_of(st), 1);
}

#[test]
fn a_put_partly_written_is_aborted_on_the_wire() {
    for timeout in [false, true] {
        let mut p = Pair::new(1000);
        let (cbs, ev) = event_channel(8);
        let pbuf = registered(&p.b, &[], 5000, &cbs);
        let (pt, desc) = p.b.tm.add_passive_recv(pbuf, None).unwrap();
        let mut abuf = registered(&p.a, &pattern(4500, 7), 4500, &cbs);
        if timeout {
            abuf.set_timeout(Some(p.now() + Duration::from_secs(1)));
        }
        let at = p.a.tm.add_active_send(abuf, &desc, 4500).unwrap();
        p.a.start_last(&mut p.ab);
        let frame = HEADER_LEN + desc.len() + 1000;
        let now = p.now();
        let head = take_output(&mut p.ab, frame + 50, now).unwrap();
        let wire = if timeout {
            // The core's clock expires the buffer and asks the transport.
            p.clock.advance(Duration::from_secs(2));
            let dels = p.a.take_dels();
            assert_eq!(dels.len(), 1);
            assert_eq!(dels[0].1, DelReason::Timeout);
            assert!(
                p.ab.del_outgoing(&dels[0].0, &NetError::TimedOut, false)
                    .unwrap()
            );
            NetError::TimedOut
        } else {
            del_through_core(&p.a, &mut p.ab, at);
            NetError::Cancelled
        };
        // The core reports a timed-out buffer's cancellation as TimedOut.
        assert_eq!(event(&ev).error(), Some(&wire));
        let rest = take_output(&mut p.ab, usize::MAX, p.clock.now()).unwrap();
        let fs = frames(&[&head[..], &rest].concat());
        assert_eq!(ops(&fs), [Opcode::Put, Opcode::Put, Opcode::Abort]);
        assert_eq!(status_of(&fs[2].0, &fs[2].1), Some(wire.clone()));
        p.ba.feed(&[head, rest].concat(), p.now(), &p.dir).unwrap();
        // The passive side ends with the status the ABORT carried.
        let e = event(&ev);
        assert_eq!(
            (e.queue(), e.error()),
            (QueueType::PassiveBulkRecv, Some(&wire))
        );
        assert_eq!(p.b.m.completions_of(pt), 1);
        assert_eq!(p.a.m.completions_of(at), 1);
        assert!(!p.ba.has_output());
        no_event(&ev);
    }
}

#[test]
fn abort_incoming_ends_a_message_read_and_a_get() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    // A message half read into its receive buffer.
    let rbuf = registered(&p.b, &[], 20_000, &cbs);
    let rt = p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    let st = p.send(&pattern(10_000, 1), &cbs);
    let now = p.now();
    let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
    p.ba.feed(&bytes[..HEADER_LEN + 3000], now, &p.dir).unwrap();
    assert!(p.b.tm.del(rt).unwrap());
    let (rq, _) =
        p.b.take_dels()
            .pop()
            .expect("in use: the transport is asked");
    assert!(p.ba.abort_incoming(&rq, &NetError::Cancelled));
    // The claim is given back: the core completes the idle buffer.
    p.b.pump();
    let e = event(&ev);
    assert_eq!(
        (e.queue(), e.error()),
        (QueueType::MsgRecv, Some(&NetError::Cancelled))
    );
    // The sender is answered once the body is consumed.
    assert!(!p.ba.has_output());
    p.ba.feed(&bytes[HEADER_LEN + 3000..], now, &p.dir).unwrap();
    let fs = p.b_to_a().unwrap();
    assert_eq!(ops(&fs), [Opcode::MsgAck]);
    assert_eq!(event(&ev).error(), Some(&NetError::Cancelled));
    assert_eq!(p.a.m.completions_of(st), 1);

    // A GET whose chunks are being written.
    let data = pattern(4500, 2);
    let pbuf = registered(&p.b, &data, 4500, &cbs);
    let (pt, desc) = p.b.tm.add_passive_send(pbuf, 4500, None).unwrap();
    let pq = p.b.last_added();
    let abuf = registered(&p.a, &[], 4500, &cbs);
    let at = p.a.tm.add_active_recv(abuf, &desc).unwrap();
    p.a.start_last(&mut p.ab);
    p.a_to_b().unwrap();
    let head = take_output(&mut p.ba, HEADER_LEN + 1000 + HEADER_LEN + 10, now).unwrap();
    assert!(p.ba.abort_incoming(&pq, &NetError::TimedOut));
    let e = event(&ev);
    assert_eq!(
        (e.queue(), e.error()),
        (QueueType::PassiveBulkSend, Some(&NetError::Cancelled))
    );
    assert_eq!(p.b.m.completions_of(pt), 1);
    let rest = take_output(&mut p.ba, usize::MAX, now).unwrap();
    let all = [head, rest].concat();
    let fs = frames(&all);
    assert_eq!(
        ops(&fs),
        [Opcode::GetData, Opcode::GetData, Opcode::GetData]
    );
    assert_eq!(
        fs[1].1,
        data[1000..2000],
        "the chunk on the wire is finished"
    );
    assert_eq!(status_of(&fs[2].0, &fs[2].1), Some(NetError::TimedOut));
    p.ab.feed(&all, now, &p.dir).unwrap();
    assert_eq!(event(&ev).error(), Some(&NetError::TimedOut));
    assert_eq!(p.a.m.completions_of(at), 1);
    assert!(!p.ba.abort_incoming(&pq, &NetError::TimedOut));
    no_event(&ev);
}

// ----- broken connections ---------------------------------------------------------

#[test]
fn fail_all_completes_everything_exactly_once() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(16);
    // b: a receive buffer, a passive receive and a passive send buffer.
    let rbuf = registered(&p.b, &[], 20_000, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    let pbuf = registered(&p.b, &[], 5000, &cbs);
    let (_, pdesc) = p.b.tm.add_passive_recv(pbuf, None).unwrap();
    let sbuf = registered(&p.b, &pattern(3000, 0), 3000, &cbs);
    let (_, sdesc) = p.b.tm.add_passive_send(sbuf, 3000, None).unwrap();
    // a: a PUT, a GET and a message.
    let abuf = registered(&p.a, &pattern(4500, 0), 4500, &cbs);
    p.a.tm.add_active_send(abuf, &pdesc, 4500).unwrap();
    p.a.start_last(&mut p.ab);
    let gbuf = registered(&p.a, &[], 3000, &cbs);
    p.a.tm.add_active_recv(gbuf, &sdesc).unwrap();
    p.a.start_last(&mut p.ab);
    p.send(&pattern(10_000, 0), &cbs);
    // b gets the whole PUT (its passive buffer completes; the PUT_ACK is
    // not delivered), the GETs (GET_DATA queued, not written), and the
    // start of the message (a claim, half read).
    let now = p.now();
    let reqs = 5 * (HEADER_LEN + pdesc.len()) + 4500 + 3 * (HEADER_LEN + sdesc.len());
    let bytes = take_output(&mut p.ab, reqs + HEADER_LEN + 500, now).unwrap();
    p.ba.feed(&bytes, now, &p.dir).unwrap();
    let e = event(&ev);
    assert_eq!((e.queue(), e.length()), (QueueType::PassiveBulkRecv, 4500));
    assert!(!p.ba.is_idle() && !p.ab.is_idle());
    assert!(p.ab.has_output() && p.ba.has_output());

    let reset = NetError::ConnectionReset("gone".into());
    for _ in 0..2 {
        p.ab.fail_all(&reset);
        p.ba.fail_all(&reset);
    }
    assert!(!p.ab.has_output() && !p.ba.has_output());
    assert!(p.ab.to_write().next().is_none());
    let mut got: Vec<_> = std::iter::from_fn(|| ev.try_recv())
        .map(|e| (e.queue(), e.error().cloned()))
        .collect();
    got.sort_by_key(|(q, _)| q.index());
    let r = Some(reset);
    assert_eq!(
        got,
        [
            (QueueType::MsgSend, r.clone()),
            (QueueType::PassiveBulkSend, r.clone()),
            (QueueType::ActiveBulkRecv, r.clone()),
            (QueueType::ActiveBulkSend, r),
        ]
    );
    // Every completion the protocol made, once per buffer.
    for m in [&p.a.m, &p.b.m] {
        let mut ts: Vec<u64> = m.take_completions().iter().map(|(t, _)| t.raw()).collect();
        let n = ts.len();
        ts.sort_unstable();
        ts.dedup();
        assert_eq!(ts.len(), n, "a buffer completed twice");
    }
    assert_eq!(p.a.m.take_completions().len(), 0);
    // The half-read message's claim was given back: the receive buffer
    // is still queued and the next message lands at its start.
    assert_eq!(p.b.tm.queue_len(QueueType::MsgRecv), 1);
    let cfg = testkit::config(1000);
    p.ab = testkit::connected(cfg, now);
    p.ba = testkit::accepted(cfg, p.b.addr, now);
    p.send(b"again", &cbs);
    p.a_to_b().unwrap();
    let e = event(&ev);
    assert_eq!((e.offset(), e.message().unwrap()), (0, b"again".to_vec()));
}

#[test]
fn a_connection_never_established_fails_unreachable() {
    let clock = Clock::manual();
    let a = Node::new(A, clock.clock());
    let (cbs, ev) = event_channel(4);
    let mut end = Proto::connecting(1, testkit::config(1000), clock.now(), clock.now());
    let ep = a.tm.ep_create(B).unwrap();
    let buf = a
        .dom
        .register(BufVec::new(1, 10))
        .unwrap()
        .with_callbacks(cbs);
    a.tm.add_msg_send(buf, &ep, 10).unwrap();
    a.start_last(&mut end);
    // Nothing is written before the connection is up.
    assert_eq!(end.to_write().count(), 0);
    assert!(end.connect_expired(clock.now()));
    end.fail_all(&Expiry::Connect.error());
    assert_eq!(event(&ev).error(), Some(&NetError::Unreachable(B.into())));
}

// ----- time ------------------------------------------------------------------

#[test]
fn connect_deadline_on_a_manual_clock() {
    let clock = Clock::manual();
    let t0 = clock.now();
    let mut end: Proto<TestTm> =
        Proto::connecting(1, testkit::config(1000), t0, t0 + Duration::from_secs(5));
    assert!(end.is_outgoing() && !end.is_connected());
    assert_eq!(end.connect_deadline(), Some(t0 + Duration::from_secs(5)));
    clock.advance(Duration::from_millis(4999));
    assert!(!end.connect_expired(clock.now()));
    clock.advance(Duration::from_millis(1));
    assert!(end.connect_expired(clock.now()));
    end.set_connected();
    assert!(!end.connect_expired(clock.now() + Duration::from_secs(60)));
    assert_eq!(end.connect_deadline(), None);
    assert_eq!(Expiry::Connect.error(), NetError::TimedOut);
}

#[test]
fn idle_and_stalled_connections_on_a_manual_clock() {
    let idle = Duration::from_secs(30);
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    let t0 = p.now();
    assert_eq!(p.ab.last_use(), t0);
    p.clock.advance(Duration::from_secs(29));
    assert_eq!(p.ab.sweep(p.now(), idle), None);
    p.clock.advance(Duration::from_secs(1));
    // Only the side that connected reaps.
    assert_eq!(p.ab.sweep(p.now(), idle), Some(Expiry::Idle));
    assert_eq!(p.ba.sweep(p.now() + idle, idle), None);
    assert_eq!(
        Expiry::Idle.error(),
        NetError::ConnectionReset("idle".into())
    );

    // Traffic moves the idle clock; a request in flight keeps it open.
    let rbuf = registered(&p.b, &[], 100, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    p.send(b"ping", &cbs);
    let t1 = p.now();
    p.a_to_b().unwrap();
    assert_eq!((p.ab.last_use(), p.ba.last_use()), (t1, t1));
    assert_eq!(p.ab.sweep(t1 + idle, idle), None, "waiting for the answer");
    p.clock.advance(Duration::from_secs(3));
    p.b_to_a().unwrap();
    assert_eq!(p.ab.last_use(), t1 + Duration::from_secs(3));
    assert_eq!(p.ab.sweep(t1 + idle, idle), None);
    assert_eq!(
        p.ab.sweep(t1 + Duration::from_secs(3) + idle, idle),
        Some(Expiry::Idle)
    );
    event(&ev);
    event(&ev);

    // A socket full from t2: given up after `idle` without progress.
    p.send(b"pong", &cbs);
    let t2 = p.now();
    p.ab.write_blocked(t2);
    p.ab.write_blocked(t2 + Duration::from_secs(10));
    assert_eq!(p.ab.sweep(t2 + idle - Duration::from_millis(1), idle), None);
    assert_eq!(p.ab.sweep(t2 + idle, idle), Some(Expiry::Stalled));
    assert_eq!(p.ba.sweep(t2 + idle, idle), None);
    // Progress stops the stall timer.
    take_output(&mut p.ab, 10, t2 + Duration::from_secs(20)).unwrap();
    assert_eq!(p.ab.sweep(t2 + 2 * idle, idle), None);
    assert_eq!(Expiry::Stalled.error(), NetError::TimedOut);
}

#[test]
fn a_send_in_flight_times_out_through_the_core() {
    let mut p = Pair::new(1000);
    let (cbs, ev) = event_channel(8);
    let ep = p.a.tm.ep_create(B).unwrap();
    let mut buf = registered(&p.a, &pattern(100, 0), 100, &cbs);
    buf.set_timeout(Some(p.now() + Duration::from_secs(1)));
    let t = p.a.tm.add_msg_send(buf, &ep, 100).unwrap();
    p.a.start_last(&mut p.ab);
    p.a_to_b().unwrap();
    // The receiver has no buffer but its answer never comes back.
    p.clock.advance(Duration::from_secs(1));
    let dels = p.a.take_dels();
    assert_eq!(dels.len(), 1);
    assert_eq!(dels[0].1, DelReason::Timeout);
    assert!(
        p.ab.del_outgoing(&dels[0].0, &NetError::TimedOut, false)
            .unwrap()
    );
    assert_eq!(event(&ev).error(), Some(&NetError::TimedOut));
    assert_eq!(p.a.m.completions_of(t), 1);
    // The late answer is ignored.
    p.b_to_a().unwrap();
    no_event(&ev);
}

#[test]
fn an_idle_connection_gives_its_read_buffer_back() {
    let mut p = Pair::new(1 << 20);
    let (cbs, ev) = event_channel(8);
    let rbuf = registered(&p.b, &[], 4096, &cbs);
    p.b.tm.add_msg_recv(rbuf, RecvParams::multi(1, 8)).unwrap();
    let now = p.now();
    assert!(p.ba.needs_rbuf(), "no read buffer before the first read");
    assert!(p.ba.take_idle_rbuf().is_none());
    let data = pattern(100, 1);
    p.send(&data, &cbs);
    let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
    // Half a header: the buffer holds bytes and is kept.
    p.ba.feed(&bytes[..HEADER_LEN / 2], now, &p.dir).unwrap();
    assert!(p.ba.take_idle_rbuf().is_none());
    p.ba.feed(&bytes[HEADER_LEN / 2..], now, &p.dir).unwrap();
    assert_eq!(event(&ev).message().unwrap(), data);
    // All processed: the buffer comes back, and a lent one is used.
    let b = p.ba.take_idle_rbuf().expect("idle: buffer back");
    assert_eq!(b.len(), RBUF);
    assert!(p.ba.needs_rbuf());
    p.ba.give_rbuf(b);
    assert!(!p.ba.needs_rbuf());
    p.b_to_a().unwrap();
    assert!(event(&ev).is_ok());
    let data = pattern(300, 2);
    p.send(&data, &cbs);
    let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
    p.ba.feed(&bytes, now, &p.dir).unwrap();
    assert_eq!(event(&ev).message().unwrap(), data);
    assert!(p.ba.take_idle_rbuf().is_some());
}

#[test]
fn every_sender_behind_a_connection_is_a_route_back() {
    // A thousand client transfer machines in one domain share one
    // connection: each one's listening address is learned from its
    // requests (not just the first 64), and reported to the engine once.
    let p = Pair::new(1 << 20);
    let b = p.b.addr;
    let mut end = testkit::accepted(testkit::config(1 << 20), b, p.now());
    let mut bytes = Vec::new();
    for i in 0..1000u16 {
        let from = TcpAddr::parse(&format!("127.0.0.9:{}:1", 2000 + i)).unwrap();
        // Two requests each: the second is not learned again.
        for x in 0..2 {
            let mut h = header(Opcode::Msg, u64::from(i) * 2 + x, from, b);
            h.total = 1;
            h.body_len = 1;
            bytes.extend_from_slice(&h.encode());
            bytes.push(b'x');
        }
    }
    end.feed(&bytes, p.now(), &p.dir).unwrap();
    assert_eq!(end.learned().count(), 1000);
    assert_eq!(end.take_new_routes().count(), 1000);
    assert_eq!(end.take_new_routes().count(), 0);
    end.fail_all(&NetError::Cancelled);
}

#[test]
fn each_message_names_its_own_sender_among_thousands() {
    // Messages of more senders than the connection keeps printed names
    // for, interleaved: each is posted with its own sender's address,
    // across the cache starting over.
    let p = Pair::new(1 << 20);
    let b = p.b.addr;
    let n = super::SENDER_NAMES as u16 + 904;
    let (cbs, ev) = event_channel(2 * usize::from(n));
    for _ in 0..2 * u32::from(n) {
        let rbuf = registered(&p.b, &[], 8, &cbs);
        p.b.tm.add_msg_recv(rbuf, RecvParams::default()).unwrap();
    }
    let mut end = testkit::accepted(testkit::config(1 << 20), b, p.now());
    let mut bytes = Vec::new();
    for round in 0..2u16 {
        for i in 0..n {
            let from = TcpAddr::parse(&format!("127.0.0.9:{}:{}", 2000 + i, 1 + round)).unwrap();
            let mut h = header(Opcode::Msg, u64::from(i) * 2 + u64::from(round), from, b);
            h.total = 2;
            h.body_len = 2;
            bytes.extend_from_slice(&h.encode());
            bytes.extend_from_slice(&i.to_le_bytes());
        }
    }
    end.feed(&bytes, p.now(), &p.dir).unwrap();
    for round in 0..2u16 {
        for i in 0..n {
            let e = event(&ev);
            assert!(e.is_ok(), "{:?}", e.status());
            assert_eq!(e.message().unwrap(), i.to_le_bytes());
            assert_eq!(
                e.sender().unwrap().addr(),
                format!("127.0.0.9:{}:{}", 2000 + i, 1 + round)
            );
        }
    }
    end.fail_all(&NetError::Cancelled);
}

#[test]
fn a_drained_burst_gives_its_queue_memory_back() {
    let mut p = Pair::new(1 << 20);
    let (cbs, _ev) = event_channel(4096);
    for i in 0..1000u32 {
        p.send(&i.to_le_bytes(), &cbs);
    }
    assert!(p.ab.wq.capacity() >= 1000);
    let now = p.now();
    let bytes = take_output(&mut p.ab, usize::MAX, now).unwrap();
    assert!(!bytes.is_empty());
    assert!(p.ab.wq.is_empty());
    assert!(p.ab.wq.capacity() <= 64, "{}", p.ab.wq.capacity());
    p.ab.fail_all(&NetError::Cancelled);
}
