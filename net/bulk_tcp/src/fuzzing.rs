//! Fuzzing entry points (feature `fuzzing`): the connection protocol fed
//! arbitrary bytes, with no socket and no thread. Not part of the
//! transport's API; the cargo-fuzz targets in `fuzz/` call these.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use colibri_net::checksum::crc32c;
use colibri_net::{
    BufVec, BufferCallbacks, Clock, ManualClock, NetBuffer, NetError, QueueType, RecvParams,
};
use parking_lot::Mutex;

use crate::addr::TcpAddr;
use crate::proto::Proto;
use crate::testkit::{self, Dir, Node, TestTm, frames, take_output};
use crate::wire::{HEADER_LEN, MAGIC, VERSION};

/// The server the frames are for, and the client whose connection they
/// also arrive on (as answers to its requests).
struct Rig {
    clock: ManualClock,
    server: Node,
    client: Node,
    dir: Dir,
    /// Current descriptors of the server's passive receive and passive
    /// send buffers.
    descs: Arc<Mutex<[Vec<u8>; 2]>>,
    /// Messages the server received.
    received: Arc<AtomicU64>,
    /// The client's buffers, back from their completions.
    pool: Arc<Mutex<Vec<NetBuffer>>>,
    runs: u64,
}

const SERVER: &str = "127.0.0.1:7001:1";
/// The sender address of the generated frames.
const CLIENT: &str = "127.0.0.1:9:9";
/// Bulk chunk size: small, so that transfers have several chunks.
const CHUNK: usize = 4096;

static RIG: LazyLock<Mutex<Rig>> = LazyLock::new(|| Mutex::new(Rig::new()));

impl Rig {
    fn new() -> Self {
        let clock = Clock::manual();
        let server = Node::new(SERVER, clock.clock());
        let client = Node::new(CLIENT, clock.clock());
        let descs: Arc<Mutex<[Vec<u8>; 2]>> = Arc::default();
        let received = Arc::new(AtomicU64::new(0));
        let (d2, r2) = (Arc::clone(&descs), Arc::clone(&received));
        // Every server buffer goes back on its queue when it completes.
        let cbs = Arc::new(BufferCallbacks::new().on_all(move |tm, mut ev| {
            if ev.queue() == QueueType::MsgRecv && ev.is_ok() {
                r2.fetch_add(1, Ordering::SeqCst);
            }
            let Some(b) = ev.take_buffer() else { return };
            match ev.queue() {
                QueueType::MsgRecv => {
                    let _ = tm.add_msg_recv(b, RecvParams::multi(64, 4));
                }
                QueueType::PassiveBulkRecv => {
                    if let Ok((_, d)) = tm.add_passive_recv(b, None) {
                        d2.lock()[0] = d.into_bytes();
                    }
                }
                QueueType::PassiveBulkSend => {
                    if let Ok((_, d)) = tm.add_passive_send(b, 10_000, None) {
                        d2.lock()[1] = d.into_bytes();
                    }
                }
                _ => {}
            }
        }));
        let reg = |n: &Node, segs: usize, size: usize, cbs: &Arc<BufferCallbacks>| {
            n.dom
                .register(BufVec::new(segs, size))
                .expect("register")
                .with_callbacks(Arc::clone(cbs))
        };
        for _ in 0..8 {
            let b = reg(&server, 2, 4096, &cbs);
            server.tm.add_msg_recv(b, RecvParams::multi(64, 4)).unwrap();
        }
        let b = reg(&server, 3, 5000, &cbs);
        descs.lock()[0] = server.tm.add_passive_recv(b, None).unwrap().1.into_bytes();
        let b = reg(&server, 3, 5000, &cbs);
        descs.lock()[1] = server
            .tm
            .add_passive_send(b, 10_000, None)
            .unwrap()
            .1
            .into_bytes();
        // The client's buffers come back to a pool.
        let pool: Arc<Mutex<Vec<NetBuffer>>> = Arc::default();
        let p2 = Arc::clone(&pool);
        let ccbs = Arc::new(BufferCallbacks::new().on_all(move |_tm, mut ev| {
            if let Some(b) = ev.take_buffer() {
                p2.lock().push(b);
            }
        }));
        for _ in 0..3 {
            pool.lock().push(reg(&client, 3, 5000, &ccbs));
        }
        let dir = Dir(vec![Arc::clone(&server.m), Arc::clone(&client.m)]);
        Self {
            clock,
            server,
            client,
            dir,
            descs,
            received,
            pool,
            runs: 0,
        }
    }

    /// An outgoing connection of the client with a message, an active
    /// receive and an active send in flight (xids 1, 2, 3), the first
    /// `prefix` bytes of its requests written. Also returns how much of
    /// the frame cut by the prefix is left to write.
    fn client_end(&self, prefix: usize, now: Instant) -> (Proto<TestTm>, usize) {
        let mut end = testkit::connected(testkit::config(CHUNK), now);
        let mut bufs = std::mem::take(&mut *self.pool.lock());
        assert_eq!(bufs.len(), 3, "every client buffer came back");
        let descs = self.descs.lock().clone();
        let [rdesc, sdesc] = descs.map(colibri_net::NetBufDesc::from_bytes);
        let tm = &self.client.tm;
        let ep = tm.ep_create(SERVER).unwrap();
        tm.add_msg_send(bufs.pop().unwrap(), &ep, 100).unwrap();
        self.client.start_last(&mut end);
        tm.add_active_recv(bufs.pop().unwrap(), &sdesc).unwrap();
        self.client.start_last(&mut end);
        tm.add_active_send(bufs.pop().unwrap(), &rdesc, 9000)
            .unwrap();
        self.client.start_last(&mut end);
        take_output(&mut end, prefix, now).expect("client requests");
        let cut = end
            .to_write()
            .next()
            .filter(|o| o.head[0].len() < HEADER_LEN)
            .map_or(0, |o| o.left);
        (end, cut)
    }

    /// The server still serves a well-formed peer.
    fn probe(&self, now: Instant) {
        let before = self.received.load(Ordering::SeqCst);
        let cfg = testkit::config(CHUNK);
        let mut c = testkit::connected(cfg, now);
        let mut s = testkit::accepted(cfg, self.server.addr, now);
        let mut b = self.pool.lock().pop().expect("a client buffer");
        b.bufvec_mut().copy_in(0, b"probe!!!").unwrap();
        let ep = self.client.tm.ep_create(SERVER).unwrap();
        let t = self.client.tm.add_msg_send(b, &ep, 8).unwrap();
        self.client.start_last(&mut c);
        let bytes = take_output(&mut c, usize::MAX, now).unwrap();
        s.feed(&bytes, now, &self.dir)
            .expect("a well-formed message");
        let ack = take_output(&mut s, usize::MAX, now).unwrap();
        c.feed(&ack, now, &self.dir).expect("a well-formed answer");
        assert_eq!(
            self.received.load(Ordering::SeqCst),
            before + 1,
            "probe received"
        );
        let done = self.client.m.take_completions();
        assert!(
            done.iter().any(|(tk, st)| *tk == t && st.is_ok()),
            "probe send completed: {done:?}"
        );
    }
}

/// Checks that the protocol completed no buffer of `tm` twice since the
/// last check.
fn exactly_once(tm: &TestTm) {
    let mut ts: Vec<u64> = tm.take_completions().iter().map(|(t, _)| t.raw()).collect();
    let n = ts.len();
    ts.sort_unstable();
    ts.dedup();
    assert_eq!(ts.len(), n, "a buffer completed twice");
}

/// Feeds `bytes` to `end` in pieces of `piece`, writing out (and checking)
/// what it answers between pieces, as the I/O thread would; the
/// connection then closes (on the first error, or at the end of the
/// input) and everything on it fails. The first `cut` bytes written finish
/// a frame already partly written.
fn run(end: &mut Proto<TestTm>, bytes: &[u8], piece: usize, now: Instant, dir: &Dir, cut: usize) {
    let mut err = None;
    let mut cut = cut;
    for part in bytes.chunks(piece.max(1)) {
        if let Err(e) = end.feed(part, now, dir) {
            err = Some(e);
            break;
        }
        match take_output(end, usize::MAX, now) {
            // Whatever the input, what the protocol writes is well formed.
            Ok(out) => {
                let skip = cut.min(out.len());
                cut -= skip;
                drop(frames(&out[skip..]));
            }
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let e = err.unwrap_or_else(|| NetError::ConnectionReset("closed".into()));
    end.fail_all(&e);
    end.fail_all(&e);
    assert!(!end.has_output());
}

/// The frames of a fuzz input: each takes a few input bytes for its
/// header fields (the checksum is made right, so that every field check
/// runs), a real or garbage descriptor, and a body.
fn frames_of(data: &[u8], descs: &[Vec<u8>; 2], server: TcpAddr) -> Vec<u8> {
    let mut inp = Input(data);
    let mut out = Vec::new();
    while !inp.0.is_empty() && out.len() < 1 << 20 {
        let op = inp.byte();
        let mode = inp.byte();
        let desc = match mode % 4 {
            1 => descs[0].clone(),
            2 => descs[1].clone(),
            3 => {
                let n = usize::from(inp.0.first().copied().unwrap_or(0));
                inp.take(n).to_vec()
            }
            _ => Vec::new(),
        };
        let data_len = (inp.u32() % 20_000) as usize;
        let body: Vec<u8> = inp.take(data_len).to_vec();
        let (offset, total, chunk) = (inp.u32() % 12_000, inp.u32() % 12_000, inp.u32() % 12_000);
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = VERSION;
        h[5] = op % 8;
        h[6] = if mode & 0x10 != 0 {
            inp.byte()
        } else {
            // The requester's active queue for GET and PUT, else 0.
            match op % 8 {
                3 => QueueType::ActiveBulkRecv.code(),
                5 => QueueType::ActiveBulkSend.code(),
                _ => 0,
            }
        };
        h[7] = mode >> 6;
        h[8..16].copy_from_slice(&u64::from(inp.byte() % 4).to_le_bytes());
        h[16..24].copy_from_slice(&u64::from(offset).to_le_bytes());
        h[24..32].copy_from_slice(&u64::from(total).to_le_bytes());
        h[32..36].copy_from_slice(&chunk.to_le_bytes());
        h[36..40].copy_from_slice(&((desc.len() + body.len()) as u32).to_le_bytes());
        h[40..42].copy_from_slice(&(desc.len() as u16).to_le_bytes());
        h[42..44].copy_from_slice(&u16::from(inp.byte() % 16).to_le_bytes());
        h[44..48].copy_from_slice(&[127, 0, 0, 1]);
        h[48..52].copy_from_slice(&9u32.to_le_bytes());
        h[52..54].copy_from_slice(&9u16.to_le_bytes());
        let to = if mode & 0x20 != 0 {
            TcpAddr {
                service: 7,
                ..server
            }
        } else {
            server
        };
        h[54..56].copy_from_slice(&to.port.to_le_bytes());
        h[56..60].copy_from_slice(&to.ip.octets());
        h[60..64].copy_from_slice(&to.service.to_le_bytes());
        let crc = crc32c(&h[..64]);
        h[64..68].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(&desc);
        out.extend_from_slice(&body);
    }
    out
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }

    fn byte(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    fn u32(&mut self) -> u32 {
        let b = self.take(4);
        let mut a = [0u8; 4];
        a[..b.len()].copy_from_slice(b);
        u32::from_le_bytes(a)
    }
}

/// One fuzz input into the protocol's receive path, twice: on a connection
/// accepted by a server transfer machine (receive and passive buffers
/// queued), and on a client's outgoing connection with a message, a GET
/// and a PUT in flight (partly written). The first input byte picks how
/// the bytes are cut into reads, the second how much of the client's
/// requests was written, the third (when odd) that the rest is fed raw;
/// otherwise the rest becomes frames with correct checksums and arbitrary
/// fields, real or garbage descriptors and arbitrary bodies.
///
/// Panics (which the fuzzer reports) on a panic in the protocol, on a
/// buffer completed twice, on a frame the protocol writes that does not
/// decode, on a buffer left in use after its connection closed, and, every
/// 64 inputs, if a well-formed message no longer gets through.
pub fn tcp_frames(data: &[u8]) {
    let mut rig = RIG.lock();
    let rig = &mut *rig;
    let mut inp = Input(data);
    let piece = [1, 7, 67, 68, 69, 1000, 4096, usize::MAX][usize::from(inp.byte() % 8)];
    let prefix = usize::from(inp.byte()) * 97;
    let raw = inp.byte() & 1 == 1;
    let bytes = if raw {
        inp.0.to_vec()
    } else {
        let descs = rig.descs.lock().clone();
        frames_of(inp.0, &descs, rig.server.addr)
    };
    let now = rig.clock.now();

    let mut server = testkit::accepted(testkit::config(CHUNK), rig.server.addr, now);
    run(&mut server, &bytes, piece, now, &rig.dir, 0);
    let (mut client, cut) = rig.client_end(prefix, now);
    run(&mut client, &bytes, piece, now, &rig.dir, cut);
    rig.server.pump();
    rig.client.pump();
    exactly_once(&rig.server.m);
    exactly_once(&rig.client.m);
    assert_eq!(rig.server.in_use(), 0, "a server buffer left in use");
    assert_eq!(rig.client.in_use(), 0, "a client buffer left in use");
    assert_eq!(rig.pool.lock().len(), 3, "every client buffer came back");

    rig.runs += 1;
    if rig.runs % 64 == 1 {
        rig.probe(now);
    }
}

#[cfg(test)]
mod tests {
    use super::RIG;
    use colibri_net::QueueType;

    /// A seeded pseudo-random generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn one_in(&mut self, n: u64) -> bool {
            self.below(n) == 0
        }
    }

    /// One frame in the input format of `frames_of`, mostly well formed
    /// (so that inputs get past the header checks into the protocol), with
    /// now and then one field replaced by noise.
    #[allow(clippy::too_many_arguments)]
    fn spec(
        r: &mut Rng,
        out: &mut Vec<u8>,
        op: u8,
        mode: u8,
        data: u32,
        offset: u32,
        total: u32,
        chunk: u32,
        xid: u8,
        status: u8,
    ) {
        let mut f = [
            u32::from(op),
            u32::from(mode),
            data,
            offset,
            total,
            chunk,
            u32::from(xid),
            u32::from(status),
        ];
        if r.one_in(6) {
            let i = r.below(f.len() as u64) as usize;
            f[i] = r.next() as u32 % 20_000;
        }
        out.push(f[0] as u8);
        out.push(f[1] as u8);
        if f[1] % 4 == 3 {
            let n = r.below(40) as u8;
            out.push(n);
            out.extend((1..n).map(|_| r.next() as u8));
        }
        out.extend(f[2].to_le_bytes());
        let body = f[2] % 20_000;
        if status == 0 || r.one_in(3) {
            out.extend((0..body).map(|_| r.next() as u8));
        } else {
            // A status detail: a text (u16 length, bytes).
            out.extend((body.saturating_sub(2) as u16).to_le_bytes());
            out.extend((2..body).map(|_| b'a' + r.below(26) as u8));
        }
        out.extend(f[3].to_le_bytes());
        out.extend(f[4].to_le_bytes());
        out.extend(f[5].to_le_bytes());
        if f[1] & 0x10 != 0 {
            out.push(r.next() as u8);
        }
        out.push(f[6] as u8);
        out.push(f[7] as u8);
    }

    /// An input: a few exchanges a peer could send (messages, a whole GET
    /// or PUT transfer in chunks, answers to the client's requests), in a
    /// random order, cut into random reads.
    fn input(r: &mut Rng) -> Vec<u8> {
        const LAST: u8 = 0x40;
        let mut v = vec![
            r.next() as u8,
            r.next() as u8,
            if r.one_in(8) { 1 } else { 0 },
        ];
        for _ in 0..1 + r.below(4) {
            let xid = r.below(4) as u8;
            let to7 = if r.one_in(10) { 0x20 } else { 0 };
            match r.below(6) {
                0 => {
                    // Now and then larger than any receive buffer.
                    let max = if r.one_in(10) { 10_000 } else { 3000 };
                    let n = 1 + r.below(max) as u32;
                    spec(r, &mut v, 1, to7, n, 0, n, 0, xid, 0);
                }
                1 => {
                    // GET of the passive send buffer (10000 bytes).
                    let total = [10_000, 15_000, 12_000][r.below(3) as usize];
                    for (off, n) in [(0, 4096), (4096, 4096), (8192, 1808)] {
                        let last = if off == 8192 { LAST } else { 0 };
                        spec(r, &mut v, 3, 2 | last | to7, 0, off, total, n, xid, 0);
                    }
                }
                2 => {
                    // PUT into the passive receive buffer (15000 bytes).
                    for (off, n) in [(0, 4096), (4096, 4096), (8192, 808)] {
                        let last = if off == 8192 { LAST } else { 0 };
                        spec(r, &mut v, 5, 1 | last | to7, n, off, 9000, 0, xid, 0);
                    }
                }
                3 => {
                    // GET_DATA for the client's GET (xid 2, 10000 bytes).
                    for (off, n) in [(0, 4096), (4096, 4096), (8192, 1808)] {
                        spec(r, &mut v, 4, 0, n, off, 10_000, n, 2, 0);
                    }
                }
                4 => {
                    // An answer or an abort, perhaps failed.
                    let op = [2, 6, 4, 7][r.below(4) as usize];
                    let status = if op == 7 || r.one_in(2) {
                        1 + r.below(14) as u8
                    } else {
                        0
                    };
                    let detail = if status == 0 { 0 } else { r.below(40) as u32 };
                    spec(r, &mut v, op, 0, detail, 0, 0, 0, xid, status);
                }
                _ => {
                    let n = r.below(200) as usize;
                    let junk: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
                    v.extend(junk);
                }
            }
        }
        v
    }

    /// The fuzz target's entry point over a few thousand seeded inputs: no
    /// panic, and the checks it makes hold. The inputs reach every kind of
    /// exchange (checked on the transfer machines' statistics).
    #[test]
    fn tcp_frames_on_seeded_inputs() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let i = input(&mut r);
            super::tcp_frames(&i);
        }
        let rig = RIG.lock();
        let ok = |tm: &colibri_net::TransferMachine, q: QueueType| tm.stats(q, false).s_events;
        let fail = |tm: &colibri_net::TransferMachine, q: QueueType| tm.stats(q, false).f_events;
        for q in [
            QueueType::MsgRecv,
            QueueType::PassiveBulkRecv,
            QueueType::PassiveBulkSend,
        ] {
            assert!(
                ok(&rig.server.tm, q) > 10,
                "{q:?} {:?}",
                rig.server.tm.stats(q, false)
            );
            assert!(
                fail(&rig.server.tm, q) > 10,
                "{q:?} {:?}",
                rig.server.tm.stats(q, false)
            );
        }
        for q in [
            QueueType::MsgSend,
            QueueType::ActiveBulkRecv,
            QueueType::ActiveBulkSend,
        ] {
            assert!(
                ok(&rig.client.tm, q) > 10,
                "{q:?} {:?}",
                rig.client.tm.stats(q, false)
            );
        }
    }

    /// Inputs of arbitrary bytes, as a fuzzer starts with.
    #[test]
    fn tcp_frames_on_noise() {
        let mut r = Rng(42);
        for _ in 0..1000 {
            let len = r.below(600) as usize;
            let i: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
            super::tcp_frames(&i);
        }
    }
}
