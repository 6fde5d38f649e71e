//! Helpers shared by the integration tests: an in-process node, the data
//! pattern, and a peer process that is killed when dropped.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, EndPoint, EventReceiver, NetBuffer, QueueType,
    RecvParams, TmState, TransferMachine, event_channel, ignore_tm_events,
};

pub const WAIT: Duration = Duration::from_secs(20);

/// Byte `i` of pattern `seed` (the peer binary computes the same).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

/// A domain with one started transfer machine and its event channel.
pub struct Node {
    pub xprt: TcpTransport,
    pub dom: Domain,
    pub tm: TransferMachine,
    pub events: EventReceiver,
    pub cbs: Arc<BufferCallbacks>,
    pub addr: String,
    stash: std::sync::Mutex<std::collections::VecDeque<BufferEvent>>,
}

impl Node {
    pub fn start(addr: &str, cfg: TcpConfig) -> Self {
        let xprt = TcpTransport::new(cfg);
        let dom = Domain::new(&xprt).unwrap();
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        let (cbs, events) = event_channel(8192);
        tm.start(addr).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        let addr = tm.ep().unwrap().addr().to_string();
        Self {
            xprt,
            dom,
            tm,
            events,
            cbs,
            addr,
            stash: Default::default(),
        }
    }

    pub fn buf(&self, data: &[u8], size: usize) -> NetBuffer {
        let mut bv = BufVec::with_len(size.max(1), 1 << 20);
        bv.copy_in(0, data).unwrap();
        self.dom
            .register(bv)
            .unwrap()
            .with_callbacks(self.cbs.clone())
    }

    pub fn recv_buffers(&self, n: usize, size: usize) {
        for _ in 0..n {
            self.tm
                .add_msg_recv(self.buf(&[], size), RecvParams::default())
                .unwrap();
        }
    }

    pub fn ep(&self, addr: &str) -> EndPoint {
        self.tm.ep_create(addr).unwrap()
    }

    pub fn next(&self) -> BufferEvent {
        self.events.recv_timeout(WAIT).expect("an event in time")
    }

    /// The next event on `queue`; events of other queues met on the way
    /// are kept for later (events of different buffers are not ordered).
    pub fn next_on(&self, queue: QueueType) -> BufferEvent {
        {
            let mut st = self.stash.lock().unwrap();
            if let Some(i) = st.iter().position(|e| e.queue() == queue) {
                return st.remove(i).unwrap();
            }
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self.events.recv_timeout(left).expect("an event in time");
            if ev.queue() == queue {
                return ev;
            }
            let mut st = self.stash.lock().unwrap();
            assert!(st.len() < 64, "too many unexpected events: {ev:?}");
            st.push_back(ev);
        }
    }

    /// Sends `msg` and waits for the send to complete; returns its status.
    pub fn send(&self, to: &EndPoint, msg: &[u8]) -> Result<(), colibri_net::NetError> {
        self.tm
            .add_msg_send(self.buf(msg, msg.len()), to, msg.len())
            .unwrap();
        let ev = self.next_on(QueueType::MsgSend);
        ev.status().clone()
    }

    /// Waits for a message; re-queues its buffer.
    pub fn recv(&self) -> Vec<u8> {
        let mut ev = self.next_on(QueueType::MsgRecv);
        assert!(ev.is_ok(), "{ev:?}");
        let m = ev.message().unwrap();
        if let Some(b) = ev.take_buffer() {
            self.tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
        m
    }

    pub fn shutdown(self) {
        let _ = self.tm.stop(true);
        self.tm.wait_stopped(WAIT).unwrap();
        while let Some(ev) = self.events.try_recv() {
            assert!(ev.is_final());
        }
        self.stash.lock().unwrap().clear();
        self.tm.fini().unwrap();
        self.dom.fini().unwrap();
    }
}

/// A peer process, killed (SIGKILL) when dropped.
pub struct PeerProc {
    pub child: Child,
    pub lines: crossbeam_channel::Receiver<String>,
}

impl PeerProc {
    pub fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_colibri-tcp-peer"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn colibri-tcp-peer");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = crossbeam_channel::bounded(64);
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Spawns `serve ADDR` and returns it with the address it reports.
    pub fn serve(addr: &str) -> (Self, String) {
        let p = Self::spawn(&["serve", addr, "60"]);
        let l = p.line();
        let a = l
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("{l}"))
            .to_string();
        (p, a)
    }

    pub fn line(&self) -> String {
        self.lines.recv_timeout(WAIT).expect("a line from the peer")
    }

    /// Waits (bounded) for the process to exit; its status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "peer did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        self.kill();
    }
}
