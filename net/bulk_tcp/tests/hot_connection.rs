//! A spinning I/O thread takes its busy connection out of the epoll set and
//! reads it directly: traffic on it, on other connections, after an idle
//! pause (the thread blocks in `epoll_wait` again) and after the peer went
//! away must all still arrive, once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::{
    BufVec, BufferCallbacks, Domain, EndPoint, NetBuffer, QueueType, RecvParams, TmHandle, TmState,
    TransferMachine, ignore_tm_events,
};
use common::{Node, WAIT};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// I/O threads that spin long enough to stay awake through a ping-pong,
/// and block when it pauses.
fn cfg() -> TcpConfig {
    TcpConfig {
        spin: Duration::from_millis(20),
        ..TcpConfig::default()
    }
}

/// An echo server: every message goes back to its sender from the
/// receive callback, and the buffer is queued again once the echo is out.
struct Echo {
    dom: Domain,
    tm: TransferMachine,
    xprt: TcpTransport,
    addr: String,
}

impl Echo {
    fn start() -> Self {
        let xprt = TcpTransport::new(cfg());
        let dom = Domain::new(&xprt).unwrap();
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        let cbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::MsgRecv, |tm, mut ev| {
                    if ev.status().is_err() {
                        return;
                    }
                    let (to, len) = (ev.take_sender().unwrap(), ev.length());
                    let b = ev.take_buffer().unwrap();
                    tm.add_msg_send(b, &to, len).expect("echo");
                })
                .on(QueueType::MsgSend, |tm, mut ev| {
                    if let Some(b) = ev.take_buffer() {
                        let _ = tm.add_msg_recv(b, RecvParams::default());
                    }
                }),
        );
        for _ in 0..16 {
            let b = dom
                .register(BufVec::new(1, 256))
                .unwrap()
                .with_callbacks(cbs.clone());
            tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
        tm.start("127.0.0.1:0:1").unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        let addr = tm.ep().unwrap().addr().to_string();
        Self {
            dom,
            tm,
            xprt,
            addr,
        }
    }

    fn shutdown(self) {
        self.tm.stop(true).unwrap();
        self.tm.wait_stopped(WAIT).unwrap();
        self.tm.fini().unwrap();
        self.dom.fini().unwrap();
    }
}

/// What the ping-pong client's callbacks share.
struct PingState {
    /// Round trips still to make in this burst.
    left: u64,
    /// Sequence number of the message in flight.
    seq: u64,
    free: Vec<NetBuffer>,
    to: Option<EndPoint>,
    /// Set when the client stops: cancelled buffers are expected then.
    closing: bool,
    done: Sender<Result<u64, String>>,
}

impl PingState {
    fn send(&mut self, tm: &TmHandle) {
        let mut b = self.free.pop().expect("a free send buffer");
        b.bufvec_mut().copy_in(0, &self.seq.to_le_bytes()).unwrap();
        let to = self.to.clone().unwrap();
        if let Err(e) = tm.add_msg_send(b, &to, 8) {
            let _ = self.done.try_send(Err(e.error.to_string()));
        }
    }
}

/// A client whose callbacks run a ping-pong on its I/O thread: each echo
/// sends the next message, so the connection never goes quiet.
struct Pinger {
    node: Node,
    st: Arc<Mutex<PingState>>,
    done: Receiver<Result<u64, String>>,
}

impl Pinger {
    fn start(server: &str) -> Self {
        let mut node = Node::start("127.0.0.1:0:2", cfg());
        let (tx, done) = crossbeam_channel::bounded(64);
        let st = Arc::new(Mutex::new(PingState {
            left: 0,
            seq: 0,
            free: Vec::new(),
            to: Some(node.ep(server)),
            closing: false,
            done: tx,
        }));
        let (s1, s2) = (st.clone(), st.clone());
        node.cbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::MsgRecv, move |tm, mut ev| {
                    let mut st = s1.lock();
                    if let Err(e) = ev.status() {
                        // Buffers come back cancelled when the client stops.
                        if !st.closing {
                            let _ = st.done.try_send(Err(format!("receive: {e}")));
                        }
                        return;
                    }
                    let m = ev.message().unwrap();
                    if m.len() != 8 {
                        let _ = st.done.try_send(Err(format!("echo of {} bytes", m.len())));
                        return;
                    }
                    let got = u64::from_le_bytes(m[..8].try_into().unwrap());
                    if got != st.seq {
                        let _ = st
                            .done
                            .send(Err(format!("echo {got}, expected {}", st.seq)));
                        return;
                    }
                    if let Some(b) = ev.take_buffer() {
                        tm.add_msg_recv(b, RecvParams::default()).unwrap();
                    }
                    st.seq += 1;
                    st.left -= 1;
                    if st.left == 0 {
                        let _ = st.done.try_send(Ok(st.seq));
                    } else {
                        st.send(tm);
                    }
                })
                .on(QueueType::MsgSend, move |_tm, mut ev| {
                    let mut st = s2.lock();
                    if let Err(e) = ev.status()
                        && !st.closing
                    {
                        let _ = st.done.try_send(Err(format!("send: {e}")));
                    }
                    if let Some(b) = ev.take_buffer() {
                        st.free.push(b);
                    }
                }),
        );
        node.recv_buffers(8, 256);
        for _ in 0..2 {
            let b = node.buf(&[], 8);
            st.lock().free.push(b);
        }
        Self { node, st, done }
    }

    /// Starts a burst of `n` round trips.
    fn go(&self, n: u64) {
        let mut st = self.st.lock();
        st.left = n;
        st.send(&self.node.tm.handle());
    }

    /// Waits for the burst; the messages sent so far.
    fn wait(&self) -> u64 {
        self.done
            .recv_timeout(WAIT)
            .expect("the ping-pong ended in time")
            .expect("every echo right")
    }

    fn shutdown(self) {
        let Self { node, st, .. } = self;
        st.lock().closing = true;
        let _ = node.tm.stop(true);
        node.tm.wait_stopped(WAIT).unwrap();
        // Break the cycle buffers -> callbacks -> state -> buffers.
        {
            let mut st = st.lock();
            st.free.clear();
            st.to = None;
        }
        node.tm.fini().unwrap();
        node.dom.fini().unwrap();
    }
}

#[test]
fn a_busy_connection_read_outside_epoll_loses_nothing() {
    let server = Echo::start();
    let client = Pinger::start(&server.addr);

    // A long burst: the connection is busy long enough to leave the epoll
    // set on both sides.
    client.go(3000);
    assert_eq!(client.wait(), 3000);
    let detaches = server.xprt.stats().detaches + client.node.xprt.stats().detaches;
    assert!(
        detaches >= 1,
        "no I/O thread took the busy connection out of epoll"
    );

    // A pause: both threads stop spinning and block in epoll_wait, so the
    // connection must be back in their sets for the next burst to be seen.
    std::thread::sleep(Duration::from_millis(200));
    client.go(500);
    assert_eq!(client.wait(), 3500);

    // Messages with pauses longer than the spin: the connection goes back
    // into epoll at each pause and does not leave it again for each one.
    let stats = |s: &Echo, c: &Pinger| s.xprt.stats().detaches + c.node.xprt.stats().detaches;
    let before = stats(&server, &client);
    for i in 0..20 {
        std::thread::sleep(Duration::from_millis(30));
        client.go(1);
        assert_eq!(client.wait(), 3501 + i);
    }
    let churn = stats(&server, &client) - before;
    assert!(churn <= 2, "{churn} detaches for 20 messages with pauses");

    // Another sender while the busy connection is out of the server's set:
    // its messages are read too, and the burst goes on.
    let other = Node::start("127.0.0.1:0:3", cfg());
    other.recv_buffers(4, 256);
    let to = other.ep(&server.addr);
    client.go(3980);
    for i in 0..20u64 {
        other
            .send(&to, &i.to_le_bytes())
            .expect("send to a busy server");
        let echo = other.recv();
        assert_eq!(echo, i.to_le_bytes());
    }
    assert_eq!(client.wait(), 7500);

    // The client goes away right after a burst, while the server's thread
    // still spins on its connection: the server sees the close and keeps
    // serving others.
    client.go(1000);
    assert_eq!(client.wait(), 8500);
    client.shutdown();
    std::thread::sleep(Duration::from_millis(50));
    for i in 20..30u64 {
        other
            .send(&to, &i.to_le_bytes())
            .expect("send after a peer left");
        assert_eq!(other.recv(), i.to_le_bytes());
    }
    drop(to);
    other.shutdown();
    server.shutdown();
}

/// Small frames are copied into one piece per write (several at a time
/// when many are queued); with small socket buffers such a write is often
/// cut short, and the rest must follow in order: every message arrives
/// whole, once.
#[test]
fn coalesced_small_writes_cut_short_lose_nothing() {
    const MSGS: usize = 600;
    let small = TcpConfig {
        sock_buf: Some(32 << 10),
        ..cfg()
    };
    let server = Node::start("127.0.0.1:0:1", small.clone());
    server.recv_buffers(MSGS, 4096);
    let client = Node::start("127.0.0.1:0:2", small);
    let to = client.ep(&server.addr);
    // The index first, then a pattern of a length that varies.
    let msg = |i: usize| {
        let mut m = (i as u32).to_le_bytes().to_vec();
        m.extend(common::pattern(i as u64, (i * 37) % 3000));
        m
    };
    for i in 0..MSGS {
        let m = msg(i);
        client
            .tm
            .add_msg_send(client.buf(&m, m.len()), &to, m.len())
            .unwrap();
    }
    let mut seen = vec![false; MSGS];
    let t0 = std::time::Instant::now();
    for k in 0..MSGS {
        if k % 100 == 0 {
            eprintln!("recv {k} at {:?}", t0.elapsed());
        }
        let ev = server.next_on(QueueType::MsgRecv);
        assert!(ev.is_ok(), "{ev:?}");
        let m = ev.message().unwrap();
        let i = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
        assert!(i < MSGS && !seen[i], "message {i} unexpected");
        assert!(m == msg(i), "message {i} arrived damaged");
        seen[i] = true;
    }
    for _ in 0..MSGS {
        assert!(client.next_on(QueueType::MsgSend).is_ok());
    }
    drop(to);
    client.shutdown();
    server.shutdown();
}
