//! The engine: one thread per domain that owns the completion queue, every
//! queue pair and every control socket of the domain, and runs every
//! operation. `xo_*` calls only queue commands for it (see `tm.rs`).
//!
//! Loop: commands, completions, posting, timers; when idle it spins for
//! `RdmaConfig::spin`, then arms the CQ, polls it once more (a completion
//! that arrived before the arm raises no event) and blocks in `epoll_wait`
//! on the sockets, the completion channel and the command waker.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use colibri_net::addr::InetAddr;
use colibri_net::desc::NetBufDesc;
use colibri_net::fasthash::FastMap;
use colibri_net::xprt::{
    DelReason, Delivery, PassiveClaim, PassiveError, QueuedBuf, RecvClaim, TmSink,
};
use colibri_net::{BufToken, NetError, QueueType, Result};
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use tracing::{debug, trace, warn};

use crate::RdmaConfig;
use crate::plan::{Reg, plan, reg_of};
use crate::tm::{SERVICES, TmShared};
use crate::verbs::{Cq, Device, Mr, Qp, QpParams, Wc, Wr};
use crate::wire::{BulkOp, Frame, MAX_EAGER, SLOT_SIZE, Seg};

/// Largest RDMA WRITE work request (a passive side's part of a GET). A
/// software device (rxe) moves a whole WRITE inside `ibv_post_send`, on
/// the engine thread; posting 1 MiB in 256 KiB chunks, one per round of
/// the loop, lets the engine poll its CQ and handle frames (the next
/// request, an abort) between them. READs are served by the peer's
/// responder, asynchronously, and are not split.
const WRITE_CHUNK: u64 = 256 << 10;

/// How long a domain fini lets queued frames and posted work requests
/// finish before it fences every connection (`Engine::settle`).
const SETTLE: Duration = Duration::from_millis(100);

/// Requests sent in a row on the eager path while replies wait.
const REPLY_AFTER: u32 = 4;

/// Bytes of a SEND asked to go inline (the device may refuse: then 0).
const INLINE: u32 = 256;

thread_local! {
    /// The engine whose thread this is (null elsewhere).
    static ENGINE_THREAD: std::cell::Cell<*const Engine> = const { std::cell::Cell::new(std::ptr::null()) };
}

const WAKER: Token = Token(0);
const CQ: Token = Token(1);
const FIRST: usize = 2;

/// A listening socket shared between the `start` that binds it (any
/// thread), the engine that accepts on it, and the `stopped` that closes
/// it (dropping the socket closes it at once).
#[derive(Debug)]
pub(crate) struct ListenerSlot {
    pub sock: Mutex<Option<TcpListener>>,
}

/// Work for the engine thread.
pub(crate) enum Cmd {
    /// Accept on this listener.
    Listen(Arc<ListenerSlot>),
    /// Post STARTED for a transfer machine.
    Started(Arc<TmShared>),
    /// Send a message.
    Send(Arc<TmShared>, QueuedBuf),
    /// Run an active bulk transfer.
    Active(Arc<TmShared>, QueuedBuf),
    /// End the operation of a buffer in use.
    Del(QueuedBuf, DelReason),
    /// Run the core's callbacks.
    Deliver(Delivery),
    /// Pin the engine thread to this CPU (`confine`).
    Pin(usize),
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Listen(_) => "Listen",
            Self::Started(_) => "Started",
            Self::Send(..) => "Send",
            Self::Active(..) => "Active",
            Self::Del(..) => "Del",
            Self::Deliver(_) => "Deliver",
            Self::Pin(_) => "Pin",
        })
    }
}

/// The handle of an engine: its command queue and thread.
#[derive(Debug)]
pub(crate) struct Engine {
    cmds: Mutex<Vec<Cmd>>,
    waker: Waker,
    stop: AtomicBool,
    /// Domains (and a shared engine's handle) using the thread; the last
    /// one to leave stops it.
    users: AtomicUsize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts an engine thread on `dev`.
    pub(crate) fn spawn(
        dev: Arc<Device>,
        cfg: RdmaConfig,
        limits: colibri_net::Limits,
        name: String,
    ) -> Result<Arc<Self>> {
        let poll = Poll::new().map_err(|e| NetError::io(&e))?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(|e| NetError::io(&e))?;
        let depth = cfg.cq_depth.min(dev.limits().max_cqe).max(16);
        let cq = Cq::new(&dev, depth)?;
        let fd = cq.fd();
        poll.registry()
            .register(&mut SourceFd(&fd), CQ, Interest::READABLE)
            .map_err(|e| NetError::io(&e))?;
        let eng = Arc::new(Self {
            cmds: Mutex::new(Vec::new()),
            waker,
            stop: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            thread: Mutex::new(None),
        });
        let lim = dev.limits();
        let sq_depth = cfg.sq_depth.min(lim.max_qp_wr).min(depth / 2).max(1);
        // Eager receive slots per connection: at most the device's queue
        // depth and a quarter of the CQ (all connections together hold at
        // most half of it in receives: `recv_total`).
        let rq_depth = cfg
            .eager_slots
            .min(lim.max_qp_wr)
            .min(depth / 4)
            .min(usize::from(u16::MAX));
        let mut lp = Loop {
            eng: Arc::clone(&eng),
            params: QpParams {
                sq_depth: u32::try_from(sq_depth).unwrap_or(u32::MAX),
                rq_depth: u32::try_from(rq_depth).unwrap_or(0),
                max_inline: if rq_depth > 0 { INLINE } else { 0 },
                max_sge: u32::try_from(lim.max_sge).unwrap_or(1),
                timeout: cfg.qp_timeout,
                retry_cnt: cfg.retry_cnt,
            },
            dev,
            cfg,
            max_desc_size: limits.max_desc_size,
            poll,
            cq,
            conns: FastMap::default(),
            out_conns: FastMap::default(),
            routes: FastMap::default(),
            listeners: FastMap::default(),
            outs: FastMap::default(),
            by_token: FastMap::default(),
            ins: FastMap::default(),
            wrs: FastMap::default(),
            next_token: FIRST,
            next_xid: 1,
            next_wr: 1,
            cq_used: 0,
            recv_total: 0,
            wcs: Vec::with_capacity(64),
            rtmp: vec![0u8; 64 << 10],
            last_sweep: Instant::now(),
        };
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                ENGINE_THREAD.with(|e| e.set(Arc::as_ptr(&lp.eng)));
                lp.run();
            })
            .map_err(|e| NetError::io(&e))?;
        *eng.thread.lock() = Some(h);
        Ok(eng)
    }

    /// Queues a command and wakes the thread (unless the engine thread
    /// itself queues it, from a callback: it looks at its commands before
    /// it sleeps).
    pub(crate) fn push(&self, c: Cmd) {
        self.cmds.lock().push(c);
        if ENGINE_THREAD.with(|e| std::ptr::eq(e.get(), self)) {
            return;
        }
        if let Err(e) = self.waker.wake() {
            warn!(error = %e, "rdma engine wake failed");
        }
    }

    /// One more user (a domain served by a shared engine).
    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// Drops a user (the one `spawn` counted, or one `add_user` added);
    /// the last one stops the thread ([`Engine::shutdown`]).
    pub(crate) fn release_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shutdown();
        }
    }

    /// Stops the thread (fencing every connection and waiting for the
    /// device to give back every work request) and joins it, unless
    /// called from the thread itself, which then exits on its own.
    fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        let h = self.thread.lock().take();
        if let Some(h) = h {
            if h.thread().id() == std::thread::current().id() {
                return;
            }
            if h.join().is_err() {
                warn!("rdma engine thread panicked");
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Outgoing TCP connect in progress.
    Connecting,
    /// Waiting for the peer's HELLO.
    Hello,
    /// Queue pairs connected: requests flow.
    Ready,
    /// Fenced: QP in ERROR, waiting for its work requests to drain.
    Dead,
}

struct Conn {
    sock: Option<TcpStream>,
    outgoing: bool,
    peer: SocketAddrV4,
    state: State,
    qp: Option<Qp>,
    psn: u32,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Requests waiting for the connection to be ready (outgoing).
    pending: Vec<u64>,
    /// Work requests not yet posted.
    wr_queue: VecDeque<Wr>,
    /// Work requests posted and not yet completed.
    sq_used: usize,
    ever_ready: bool,
    deadline: Option<Instant>,
    /// The eager path (after `qp`: the queue pair is destroyed before the
    /// rings it names).
    eager: Option<Eager>,
}

impl Conn {
    /// Something of ours has not left or not completed: bytes for the
    /// socket, frames waiting for a credit, work requests unposted or on
    /// the send queue.
    fn has_outgoing(&self) -> bool {
        !self.wbuf.is_empty()
            || !self.wr_queue.is_empty()
            || self.sq_used > 0
            || self
                .eager
                .as_ref()
                .is_some_and(|e| !e.queue.is_empty() || !e.replies.is_empty())
    }
}

/// Who a posted work request belongs to.
#[derive(Debug, Clone, Copy)]
enum WrOwner {
    /// An incoming operation's READ or WRITE: (connection, request xid).
    Op(usize, u64),
    /// An eager receive slot of the connection.
    Recv(usize, u32),
    /// An eager SEND from a send slot of the connection.
    Send(usize, u32),
}

/// The eager path of a connection: frames as RDMA SENDs into the peer's
/// ring of pre-posted receive slots, with credits (DESIGN.md section 3).
struct Eager {
    /// MRs before the memory they cover (dropped first).
    rmr: Mr,
    smr: Mr,
    /// Receive ring: `slots` × `SLOT_SIZE`, registered for local write.
    rmem: Box<[u8]>,
    /// Send ring: `free_send` slots of `SLOT_SIZE`.
    smem: Box<[u8]>,
    /// Our receive slots (announced in our HELLO).
    slots: u32,
    /// Receives posted and not yet completed.
    posted: usize,
    /// Slots whose frame was handled, waiting to be re-posted.
    idle: Vec<u32>,
    /// Re-posted slots not yet reported to the peer.
    to_return: u32,
    /// Send slots not in use.
    free_send: Vec<u32>,
    /// The peer's slots (its HELLO); 0: every frame goes on TCP.
    peer_slots: u32,
    /// SENDs we may post now (free slots of the peer).
    credits: u32,
    /// Encoded frames waiting for a credit, a send slot and room.
    queue: VecDeque<Vec<u8>>,
    /// REPLY frames waiting likewise. They go after the requests (a
    /// request is what the peer's application waits for; a reply only
    /// completes a buffer here), at most `REPLY_AFTER` requests in a row
    /// while replies wait.
    replies: VecDeque<Vec<u8>>,
    /// Requests sent in a row while replies waited.
    streak: u32,
    /// The peer's queue pair is ready to receive: for the connecting side
    /// at the peer's HELLO, for the accepting side at the first frame
    /// after it (the peer walks its queue pair to RTS before sending it).
    peer_ready: bool,
}

impl Eager {
    fn new(dev: &Device, slots: u32, send_slots: u32) -> Result<Self> {
        let mut rmem = vec![0u8; slots as usize * SLOT_SIZE].into_boxed_slice();
        let mut smem = vec![0u8; send_slots as usize * SLOT_SIZE].into_boxed_slice();
        let rmr = dev.register_local(&mut rmem)?;
        let smr = dev.register_local(&mut smem)?;
        Ok(Self {
            rmr,
            smr,
            rmem,
            smem,
            slots,
            posted: 0,
            idle: (0..slots).rev().collect(),
            to_return: 0,
            free_send: (0..send_slots).rev().collect(),
            peer_slots: 0,
            credits: 0,
            queue: VecDeque::new(),
            replies: VecDeque::new(),
            streak: 0,
            peer_ready: false,
        })
    }

    /// The next frame to send if it fits in `room` bytes: a request, or a
    /// reply when there is no request or `REPLY_AFTER` requests went while
    /// replies waited.
    fn next_frame(&mut self, room: usize) -> Option<Vec<u8>> {
        let reply =
            self.queue.is_empty() || (!self.replies.is_empty() && self.streak >= REPLY_AFTER);
        let waiting = !self.replies.is_empty();
        let q = if reply {
            &mut self.replies
        } else {
            &mut self.queue
        };
        if q.front()?.len() > room {
            return None;
        }
        let f = q.pop_front();
        if reply {
            self.streak = 0;
        } else {
            self.streak += u32::from(waiting);
        }
        f
    }

    /// Whether a frame of `len` bytes goes as a SEND.
    fn carries(&self, len: usize) -> bool {
        self.peer_slots > 0 && len <= SLOT_SIZE
    }
}

/// An operation this side started (message send, active bulk): it waits
/// for the peer's REPLY.
struct OutOp {
    buf: QueuedBuf,
    sink: TmSink,
    conn: usize,
    /// The request, until it is written.
    frame: Option<Frame>,
    /// Deadline of an ABORT sent.
    abort_by: Option<Instant>,
    /// The request went as a SEND (its ABORT follows it on the same
    /// channel, so it can never overtake it).
    eager: bool,
    /// Keeps the registration (and so the keys sent) alive.
    _reg: Arc<Reg>,
}

enum InKind {
    Msg { claim: RecvClaim, sender: String },
    Passive { buf: QueuedBuf },
}

/// An operation a peer asked for, being moved by our work requests.
struct InOp {
    kind: InKind,
    sink: TmSink,
    len: u64,
    wrs_left: usize,
    error: Option<NetError>,
    abort: Option<NetError>,
    /// When an abort must have taken effect.
    abort_by: Option<Instant>,
    _reg: Arc<Reg>,
}

struct Loop {
    eng: Arc<Engine>,
    dev: Arc<Device>,
    cfg: RdmaConfig,
    max_desc_size: usize,
    params: QpParams,
    poll: Poll,
    cq: Cq,
    conns: FastMap<usize, Conn>,
    out_conns: FastMap<SocketAddrV4, usize>,
    /// Peer listeners reachable over connections they opened to us
    /// (learned from the sender addresses of their requests).
    routes: FastMap<SocketAddrV4, usize>,
    listeners: FastMap<usize, Arc<ListenerSlot>>,
    outs: FastMap<u64, OutOp>,
    by_token: FastMap<BufToken, u64>,
    ins: FastMap<(usize, u64), InOp>,
    /// Posted work requests.
    wrs: FastMap<u64, WrOwner>,
    next_token: usize,
    next_xid: u64,
    next_wr: u64,
    /// CQ entries held by posted work requests (sends and receives).
    cq_used: usize,
    /// Eager receive slots of every connection (at most half the CQ).
    recv_total: usize,
    wcs: Vec<Wc>,
    rtmp: Vec<u8>,
    last_sweep: Instant,
}

fn sock_of(a: &InetAddr) -> SocketAddrV4 {
    SocketAddrV4::new(a.ip, a.port)
}

/// The started transfer machine at `addr`, if it belongs to the engine
/// `eng`: a request naming a machine of another domain (another protection
/// domain) is refused as unreachable rather than run with keys this
/// engine's queue pairs cannot use.
fn tm_of(addr: &InetAddr, eng: &Arc<Engine>) -> Option<Arc<TmShared>> {
    SERVICES
        .lookup(addr)
        .filter(|tm| Arc::ptr_eq(tm.engine(), eng))
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        // Since when the engine has had nothing to do (read every 16th
        // round only).
        let mut idle_since: Option<Instant> = None;
        let mut had_events = false;
        let mut rounds = 0u32;
        let mut woke = true;
        loop {
            let mut worked = std::mem::take(&mut had_events);
            worked |= self.run_cmds();
            if self.poll_cq() {
                worked = true;
                // What the callbacks just asked for (an echo, the next
                // request) goes out in this round, ahead of the replies.
                self.run_cmds();
            }
            worked |= self.post_all();
            if self.eng.stop.load(Ordering::Acquire) {
                self.drain_and_exit();
                return;
            }
            // The clock, the timers and the sockets are looked at every
            // 16th round (and after a sleep), commands and the CQ every
            // round: an `epoll_wait` is a system call, and so is reading
            // the clock where it is not in the vDSO (HPET, as in the
            // Soft-RoCE VM): tens of microseconds each under emulation.
            rounds = rounds.wrapping_add(1);
            let now = (std::mem::take(&mut woke) || rounds.is_multiple_of(16)).then(Instant::now);
            if let Some(now) = now
                && now.duration_since(self.last_sweep) >= Duration::from_millis(50)
            {
                self.sweep(now);
                self.last_sweep = now;
            }
            if worked {
                idle_since = None;
            }
            let spun = match (now, idle_since) {
                (Some(now), Some(t)) => now.duration_since(t) >= self.cfg.spin,
                _ => false,
            };
            let timeout = if worked || !(self.cfg.spin.is_zero() || spun) {
                // Spinning: polls the sockets without sleeping.
                let Some(now) = now else { continue };
                if !worked {
                    idle_since.get_or_insert(now);
                }
                Some(Duration::ZERO)
            } else {
                // A command the engine queued for itself (a callback run by
                // the sweep) raised no wake-up: never sleep on one.
                if !self.eng.cmds.lock().is_empty() {
                    continue;
                }
                if let Err(e) = self.cq.arm() {
                    warn!(error = %e, "arming the CQ failed; polling");
                }
                if self.poll_cq() {
                    continue;
                }
                idle_since = None;
                woke = true;
                Some(Duration::from_millis(50))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!(error = %e, "epoll_wait failed");
                }
                continue;
            }
            had_events = !events.is_empty();
            for ev in &events {
                match ev.token() {
                    WAKER => {}
                    CQ => {
                        self.cq.take_events();
                    }
                    Token(t) if self.listeners.contains_key(&t) => self.accept(t),
                    Token(t) => {
                        if ev.is_writable() {
                            self.on_writable(t);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(t);
                        }
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- commands

    fn run_cmds(&mut self) -> bool {
        let cmds = std::mem::take(&mut *self.eng.cmds.lock());
        let any = !cmds.is_empty();
        for c in cmds {
            match c {
                Cmd::Listen(slot) => self.listen(slot),
                Cmd::Started(sh) => sh.sink.post_started(&sh.own_addr()),
                Cmd::Send(sh, buf) => self.start_send(&sh, buf),
                Cmd::Active(sh, buf) => self.start_active(&sh, buf),
                Cmd::Del(buf, reason) => self.del(&buf, reason),
                Cmd::Deliver(d) => d.run(),
                Cmd::Pin(cpu) => colibri_net::cpu::pin_current_thread(cpu, "rdma engine thread"),
            }
        }
        any
    }

    fn token(&mut self) -> usize {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn listen(&mut self, slot: Arc<ListenerSlot>) {
        let t = self.token();
        {
            let mut g = slot.sock.lock();
            let Some(l) = g.as_mut() else { return };
            if let Err(e) = self
                .poll
                .registry()
                .register(l, Token(t), Interest::READABLE)
            {
                warn!(error = %e, "cannot watch listener");
                return;
            }
        }
        self.listeners.insert(t, slot);
        self.accept(t);
    }

    fn accept(&mut self, t: usize) {
        let Some(slot) = self.listeners.get(&t).cloned() else {
            return;
        };
        loop {
            let got = {
                let g = slot.sock.lock();
                let Some(l) = g.as_ref() else {
                    self.listeners.remove(&t);
                    return;
                };
                l.accept()
            };
            match got {
                Ok((mut s, peer)) => {
                    tune_socket(&s, self.cfg.peer_timeout);
                    let peer = match peer {
                        std::net::SocketAddr::V4(p) => p,
                        std::net::SocketAddr::V6(_) => continue,
                    };
                    let ct = self.token();
                    if self
                        .poll
                        .registry()
                        .register(&mut s, Token(ct), Interest::READABLE | Interest::WRITABLE)
                        .is_err()
                    {
                        continue;
                    }
                    trace!(%peer, "accepted control connection");
                    self.conns.insert(
                        ct,
                        Conn::new(
                            Some(s),
                            false,
                            peer,
                            State::Hello,
                            Some(Instant::now() + self.cfg.connect_timeout),
                        ),
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    /// The outgoing connection to `peer`, opened if needed.
    fn conn_to(&mut self, peer: SocketAddrV4) -> Result<usize> {
        if let Some(&t) = self.out_conns.get(&peer) {
            return Ok(t);
        }
        // A connection the peer opened to us carries our requests too.
        if let Some(&t) = self.routes.get(&peer)
            && self.conns.get(&t).is_some_and(|c| c.state == State::Ready)
        {
            return Ok(t);
        }
        let mut s = TcpStream::connect(peer.into())
            .map_err(|e| NetError::Unreachable(format!("{peer}: {e}")))?;
        tune_socket(&s, self.cfg.peer_timeout);
        let t = self.token();
        self.poll
            .registry()
            .register(&mut s, Token(t), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| NetError::io(&e))?;
        self.conns.insert(
            t,
            Conn::new(
                Some(s),
                true,
                peer,
                State::Connecting,
                Some(Instant::now() + self.cfg.connect_timeout),
            ),
        );
        self.out_conns.insert(peer, t);
        Ok(t)
    }

    fn start_send(&mut self, sh: &Arc<TmShared>, buf: QueuedBuf) {
        trace!(len = buf.length(), "message send");
        if !sh.sink.begin_use(&buf) {
            return;
        }
        let len = buf.length();
        let dest = buf
            .end_point()
            .and_then(|ep| ep.downcast::<InetAddr>().copied());
        let Some(dest) = dest else {
            sh.sink.complete(
                &buf,
                Err(NetError::InvalidArgument("send without end point".into())),
            );
            return;
        };
        let Some(reg) = reg_of(buf.reg()) else {
            sh.sink.complete(
                &buf,
                Err(NetError::InvalidArgument(
                    "buffer not registered by rdma".into(),
                )),
            );
            return;
        };
        let xid = self.xid();
        let frame = if self.cfg.eager_slots > 0 && len <= MAX_EAGER {
            // Small: the bytes travel in the frame (a SEND into a slot of
            // the peer), copied out of the buffer now; no keys are sent.
            let data = buf
                .data()
                .ok_or(NetError::Cancelled)
                .and_then(|bv| bv.to_vec(0, len));
            match data {
                Ok(data) => Frame::Eager {
                    xid,
                    sender: sh.own(),
                    receiver: dest,
                    data,
                },
                Err(e) => {
                    sh.sink.complete(&buf, Err(e));
                    return;
                }
            }
        } else {
            let segs = match reg.remote(len as u64) {
                Ok(s) => s,
                Err(e) => {
                    sh.sink.complete(&buf, Err(e));
                    return;
                }
            };
            Frame::Msg {
                xid,
                sender: sh.own(),
                receiver: dest,
                len: len as u64,
                segs,
            }
        };
        self.submit(sh, buf, reg, sock_of(&dest), dest, xid, frame);
    }

    fn start_active(&mut self, sh: &Arc<TmShared>, buf: QueuedBuf) {
        if !sh.sink.begin_use(&buf) {
            return;
        }
        let Some(fields) = buf.desc().cloned() else {
            sh.sink
                .complete(&buf, Err(NetError::InvalidDescriptor("missing".into())));
            return;
        };
        let Ok(owner) = InetAddr::parse(&fields.owner) else {
            sh.sink
                .complete(&buf, Err(NetError::Unreachable(fields.owner.clone())));
            return;
        };
        let Some(reg) = reg_of(buf.reg()) else {
            sh.sink.complete(
                &buf,
                Err(NetError::InvalidArgument(
                    "buffer not registered by rdma".into(),
                )),
            );
            return;
        };
        let get = buf.queue() == QueueType::ActiveBulkRecv;
        let size = if get { buf.size() } else { buf.length() } as u64;
        let desc = match NetBufDesc::encode(&fields, self.max_desc_size) {
            Ok(d) => d.into_bytes(),
            Err(e) => {
                sh.sink.complete(&buf, Err(e));
                return;
            }
        };
        let segs = match reg.remote(size) {
            Ok(s) => s,
            Err(e) => {
                sh.sink.complete(&buf, Err(e));
                return;
            }
        };
        let xid = self.xid();
        let frame = Frame::Bulk {
            xid,
            op: if get { BulkOp::Get } else { BulkOp::Put },
            sender: sh.own(),
            receiver: owner,
            size,
            desc,
            segs,
        };
        self.submit(sh, buf, reg, sock_of(&owner), owner, xid, frame);
    }

    fn xid(&mut self) -> u64 {
        let x = self.next_xid;
        self.next_xid += 1;
        x
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        sh: &Arc<TmShared>,
        buf: QueuedBuf,
        reg: Arc<Reg>,
        peer: SocketAddrV4,
        dest: InetAddr,
        xid: u64,
        frame: Frame,
    ) {
        let conn = match self.conn_to(peer) {
            Ok(c) => c,
            Err(e) => {
                debug!(%dest, error = %e, "cannot connect");
                sh.sink
                    .complete(&buf, Err(NetError::Unreachable(dest.to_string())));
                return;
            }
        };
        self.by_token.insert(buf.token(), xid);
        self.outs.insert(
            xid,
            OutOp {
                buf,
                sink: sh.sink.clone(),
                conn,
                frame: Some(frame),
                abort_by: None,
                eager: false,
                _reg: reg,
            },
        );
        let ready = self
            .conns
            .get(&conn)
            .is_some_and(|c| c.state == State::Ready);
        if ready {
            self.send_request(conn, xid);
            self.flush(conn);
        } else if let Some(c) = self.conns.get_mut(&conn) {
            c.pending.push(xid);
        }
    }

    fn send_request(&mut self, conn: usize, xid: u64) {
        let Some(op) = self.outs.get_mut(&xid) else {
            return;
        };
        let Some(f) = op.frame.take() else { return };
        let eager = self.queue_frame(conn, &f, None);
        if let Some(op) = self.outs.get_mut(&xid) {
            op.eager = eager;
        }
    }

    /// Queues a frame for the peer of a ready connection: as a SEND when
    /// the eager path is up and the frame fits a slot (or `force` says
    /// so: an ABORT follows its request's channel), else on TCP, carrying
    /// the credits not yet returned. Returns whether it goes as a SEND.
    fn queue_frame(&mut self, t: usize, f: &Frame, force: Option<bool>) -> bool {
        let Some(c) = self.conns.get_mut(&t) else {
            return false;
        };
        if c.state != State::Ready {
            return false;
        }
        let mut b = Vec::new();
        f.encode(&mut b);
        match c.eager.as_mut() {
            Some(e) if e.peer_slots > 0 && force.unwrap_or_else(|| e.carries(b.len())) => {
                if matches!(f, Frame::Reply { .. }) {
                    e.replies.push_back(b);
                } else {
                    e.queue.push_back(b);
                }
                true
            }
            e => {
                let credits = e.map_or(0, |e| std::mem::take(&mut e.to_return));
                Frame::set_credits(&mut b, credits);
                c.wbuf.extend_from_slice(&b);
                false
            }
        }
    }

    fn del(&mut self, buf: &QueuedBuf, reason: DelReason) {
        let status = if reason == DelReason::Timeout {
            NetError::TimedOut
        } else {
            NetError::Cancelled
        };
        let token = buf.token();
        let Some(&xid) = self.by_token.get(&token) else {
            // A receive or passive buffer our work requests are moving: the
            // transfer is aborted (the requester will get the status), but
            // the buffer completes only once those requests retired, as
            // the device may still be writing into it. If they do not
            // retire within `abort_timeout`, the connection is fenced,
            // which flushes them.
            let by = Instant::now() + self.cfg.abort_timeout;
            for op in self.ins.values_mut() {
                let mine = match &op.kind {
                    InKind::Msg { claim, .. } => claim.buf.token() == token,
                    InKind::Passive { buf } => buf.token() == token,
                };
                if mine && op.abort.is_none() {
                    trace!(?reason, "del of a buffer being moved by RDMA: aborted");
                    op.abort = Some(status.clone());
                    op.abort_by = Some(by);
                }
            }
            return;
        };
        let Some(op) = self.outs.get_mut(&xid) else {
            return;
        };
        if op.frame.is_some() {
            // Never sent: nobody knows our keys.
            let op = self.outs.remove(&xid).expect("present");
            self.by_token.remove(&op.buf.token());
            if let Some(c) = self.conns.get_mut(&op.conn) {
                c.pending.retain(|&x| x != xid);
            }
            op.sink.complete(&op.buf, Err(NetError::Cancelled));
            return;
        }
        if op.abort_by.is_some() {
            return;
        }
        op.abort_by = Some(Instant::now() + self.cfg.abort_timeout);
        let (conn, eager) = (op.conn, op.eager);
        self.queue_frame(conn, &Frame::Abort { xid, status }, Some(eager));
        self.flush(conn);
    }

    // ------------------------------------------------------------ sockets

    fn on_writable(&mut self, t: usize) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if c.state == State::Connecting {
            let s = c.sock.as_ref().expect("socket of a connecting conn");
            let peer = c.peer;
            let failed = match s.take_error() {
                Ok(None) => None,
                Ok(Some(e)) | Err(e) => Some(e),
            };
            if let Some(e) = failed {
                self.fence(t, NetError::Unreachable(format!("{peer}: {e}")));
                return;
            }
            if s.peer_addr().is_err() {
                return; // not connected yet
            }
            // Connected: make our queue pair and say HELLO.
            let psn = (t as u32).wrapping_mul(0x9e37_79b9) & 0xff_ffff;
            match self.make_qp(t, psn) {
                Ok(info) => {
                    let c = self.conns.get_mut(&t).expect("conn being set up");
                    Frame::Hello(info).encode(&mut c.wbuf);
                    c.state = State::Hello;
                }
                Err(e) => {
                    self.fence(t, e);
                    return;
                }
            }
        }
        self.flush(t);
    }

    /// Creates the connection's queue pair (INIT) and its eager rings,
    /// and posts the receive slots (before the peer can learn our queue
    /// pair). Returns what our HELLO says.
    fn make_qp(&mut self, t: usize, psn: u32) -> Result<crate::wire::QpInfo> {
        let qp = Qp::new(&self.dev, &self.cq, self.params)?;
        let mut info = self.dev.endpoint(qp.qpn(), psn);
        let room = (self.cq.depth() / 2).saturating_sub(self.recv_total);
        let slots = (self.params.rq_depth as usize).min(room);
        let eager = if self.params.rq_depth > 0 {
            let send_slots = self.params.rq_depth.min(self.params.sq_depth);
            match Eager::new(&self.dev, u32::try_from(slots).unwrap_or(0), send_slots) {
                Ok(e) => Some(e),
                Err(e) => {
                    warn!(error = %e, "no eager rings: frames go on TCP");
                    None
                }
            }
        } else {
            None
        };
        let c = self.conns.get_mut(&t).expect("conn being set up");
        c.psn = psn;
        c.qp = Some(qp);
        if let Some(e) = eager {
            self.recv_total += e.slots as usize;
            c.eager = Some(e);
        }
        self.repost(t)?;
        let c = self.conns.get_mut(&t).expect("conn being set up");
        if let Some(e) = c.eager.as_mut() {
            // The first receives are the peer's initial credits, not
            // returns.
            e.to_return = 0;
            info.slots = u16::try_from(e.posted).unwrap_or(u16::MAX);
        }
        Ok(info)
    }

    /// Posts the idle receive slots of a connection while the CQ has room;
    /// each becomes a credit to return.
    fn repost(&mut self, t: usize) -> Result<()> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(());
        };
        if c.state == State::Dead {
            return Ok(());
        }
        let (Some(e), Some(qp)) = (c.eager.as_mut(), c.qp.as_mut()) else {
            return Ok(());
        };
        let cqd = self.cq.depth();
        while self.cq_used < cqd {
            let Some(i) = e.idle.pop() else { break };
            let wr_id = self.next_wr;
            self.next_wr += 1;
            // From a mutable pointer: the device writes the slot.
            let addr = e.rmem.as_mut_ptr() as u64 + u64::from(i) * SLOT_SIZE as u64;
            if let Err(err) = qp.post_recv(wr_id, addr, SLOT_SIZE as u32, e.rmr.lkey()) {
                e.idle.push(i);
                return Err(err);
            }
            self.wrs.insert(wr_id, WrOwner::Recv(t, i));
            self.cq_used += 1;
            e.posted += 1;
            e.to_return += 1;
        }
        Ok(())
    }

    /// Posts the queued eager frames of a connection as SENDs while it has
    /// credits, free send slots and room on its send queue and the CQ.
    fn pump_eager(&mut self, t: usize) -> Result<bool> {
        let Some(c) = self.conns.get_mut(&t) else {
            return Ok(false);
        };
        if c.state != State::Ready {
            return Ok(false);
        }
        let (Some(e), Some(qp)) = (c.eager.as_mut(), c.qp.as_mut()) else {
            return Ok(false);
        };
        if !e.peer_ready {
            return Ok(false);
        }
        let sq = self.params.sq_depth as usize;
        let cqd = self.cq.depth();
        let mut any = false;
        while e.credits > 0
            && c.sq_used < sq
            && self.cq_used < cqd
            && !(e.queue.is_empty() && e.replies.is_empty())
        {
            let Some(slot) = e.free_send.pop() else { break };
            // One SEND carries as many whole frames as fit its slot, in
            // queue order (a request and the reply it is queued with, an
            // echo and the REPLY of the message it answers): one work
            // request, one receive slot of the peer and one credit for
            // all of them.
            let off = slot as usize * SLOT_SIZE;
            let mut len = 0;
            while let Some(mut f) = e.next_frame(SLOT_SIZE - len) {
                Frame::set_credits(&mut f, std::mem::take(&mut e.to_return));
                e.smem[off + len..off + len + f.len()].copy_from_slice(&f);
                len += f.len();
            }
            if len == 0 {
                // Queued frames always fit a slot (`carries`).
                e.free_send.push(slot);
                break;
            }
            let dst = &mut e.smem[off..off + len];
            let wr_id = self.next_wr;
            self.next_wr += 1;
            if let Err(err) = qp.post_send(wr_id, dst, e.smr.lkey()) {
                e.free_send.push(slot);
                return Err(err);
            }
            self.wrs.insert(wr_id, WrOwner::Send(t, slot));
            trace!(t, len, credits = e.credits, "eager SEND posted");
            e.credits -= 1;
            c.sq_used += 1;
            self.cq_used += 1;
            any = true;
        }
        Ok(any)
    }

    fn flush(&mut self, t: usize) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if c.state == State::Connecting || c.state == State::Dead {
            return;
        }
        let Some(s) = c.sock.as_mut() else { return };
        let mut off = 0;
        let mut err = None;
        while off < c.wbuf.len() {
            match s.write(&c.wbuf[off..]) {
                Ok(0) => {
                    err = Some(io::Error::from(io::ErrorKind::WriteZero));
                    break;
                }
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        c.wbuf.drain(..off);
        if let Some(e) = err {
            let peer = c.peer;
            self.fence(t, NetError::ConnectionReset(format!("{peer}: {e}")));
        }
    }

    fn on_readable(&mut self, t: usize) {
        loop {
            let Some(c) = self.conns.get_mut(&t) else {
                return;
            };
            if c.state == State::Connecting {
                // Errors of a connect show up as readable too.
                if let Some(s) = c.sock.as_ref()
                    && let Ok(Some(e)) | Err(e) = s.take_error()
                {
                    let peer = c.peer;
                    self.fence(t, NetError::Unreachable(format!("{peer}: {e}")));
                }
                return;
            }
            let Some(s) = c.sock.as_mut() else { return };
            match s.read(&mut self.rtmp) {
                Ok(0) => {
                    let peer = c.peer;
                    // The peer closes only after its last SENDs completed,
                    // so their frames (a REPLY that completes one of our
                    // sends) are in the CQ already: take them before the
                    // fence fails what they would have completed.
                    self.poll_cq();
                    self.fence(
                        t,
                        NetError::ConnectionReset(format!("{peer}: connection closed by peer")),
                    );
                    return;
                }
                Ok(n) => {
                    c.rbuf.extend_from_slice(&self.rtmp[..n]);
                    if let Err(e) = self.parse(t) {
                        self.fence(t, e);
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let peer = c.peer;
                    self.fence(t, NetError::ConnectionReset(format!("{peer}: {e}")));
                    return;
                }
            }
        }
        self.flush(t);
    }

    fn parse(&mut self, t: usize) -> Result<()> {
        loop {
            let Some(c) = self.conns.get_mut(&t) else {
                return Ok(());
            };
            if c.state == State::Dead {
                return Ok(());
            }
            let Some((f, credits, n)) = Frame::decode_with_credits(&c.rbuf)? else {
                return Ok(());
            };
            c.rbuf.drain(..n);
            self.frame(t, f, credits)?;
        }
    }

    /// Handles one frame (from the TCP connection or an eager slot),
    /// which returns `credits` of our SENDs.
    fn frame(&mut self, t: usize, f: Frame, credits: u32) -> Result<()> {
        let c = self.conns.get_mut(&t).expect("conn of a frame");
        let proto = |w: &str| Err(NetError::Protocol(format!("rdma control: {w}")));
        if c.state == State::Ready
            && let Some(e) = c.eager.as_mut()
        {
            // Any frame after the HELLOs: the peer's queue pair is at RTS
            // (it sends nothing before), so it can take our SENDs.
            e.peer_ready = true;
            e.credits = e.credits.saturating_add(credits);
        }
        match (c.state, c.outgoing, f) {
            (State::Hello, true, Frame::Hello(info)) => {
                let qp = c.qp.as_mut().expect("QP of an outgoing conn in HELLO");
                qp.connect(c.psn, &info, self.params)?;
                if let Some(e) = c.eager.as_mut() {
                    e.peer_slots = u32::from(info.slots);
                    e.credits = e.peer_slots;
                    e.peer_ready = true;
                }
                c.state = State::Ready;
                c.ever_ready = true;
                c.deadline = None;
                let pending = std::mem::take(&mut c.pending);
                for xid in pending {
                    self.send_request(t, xid);
                }
                Ok(())
            }
            (State::Hello, false, Frame::Hello(info)) => {
                let psn = (t as u32).wrapping_mul(0x85eb_ca6b) & 0xff_ffff;
                let ours = self.make_qp(t, psn)?;
                let c = self.conns.get_mut(&t).expect("conn of a frame");
                let qp = c.qp.as_mut().expect("QP just made");
                qp.connect(psn, &info, self.params)?;
                Frame::Hello(ours).encode(&mut c.wbuf);
                if let Some(e) = c.eager.as_mut() {
                    e.peer_slots = u32::from(info.slots);
                    e.credits = e.peer_slots;
                }
                c.state = State::Ready;
                c.ever_ready = true;
                c.deadline = None;
                Ok(())
            }
            (State::Ready, _, Frame::Reply { xid, status }) => {
                let Some(op) = self.outs.get(&xid) else {
                    trace!(xid, "reply for an operation already ended");
                    return Ok(());
                };
                if op.conn != t {
                    return proto("reply on another connection");
                }
                let op = self.outs.remove(&xid).expect("present");
                self.by_token.remove(&op.buf.token());
                let status = status.map(|n| {
                    if op.buf.queue() == QueueType::MsgSend {
                        op.buf.length()
                    } else {
                        usize::try_from(n).unwrap_or(usize::MAX)
                    }
                });
                op.sink.complete(&op.buf, status);
                Ok(())
            }
            (
                State::Ready,
                _,
                Frame::Msg {
                    xid,
                    sender,
                    receiver,
                    len,
                    segs,
                },
            ) => {
                self.learn(t, sender);
                self.incoming_msg(t, xid, sender, receiver, len, &segs);
                Ok(())
            }
            (
                State::Ready,
                _,
                Frame::Bulk {
                    xid,
                    op,
                    sender,
                    receiver,
                    size,
                    desc,
                    segs,
                },
            ) => {
                self.learn(t, sender);
                self.incoming_bulk(t, xid, op, sender, receiver, size, desc, &segs);
                Ok(())
            }
            (State::Ready, _, Frame::Abort { xid, status }) => {
                if let Some(op) = self.ins.get_mut(&(t, xid)) {
                    op.abort.get_or_insert(status);
                    op.abort_by
                        .get_or_insert(Instant::now() + self.cfg.abort_timeout);
                }
                Ok(())
            }
            (
                State::Ready,
                _,
                Frame::Eager {
                    xid,
                    sender,
                    receiver,
                    data,
                },
            ) => {
                self.learn(t, sender);
                self.incoming_eager(t, xid, sender, receiver, &data);
                Ok(())
            }
            (State::Ready, _, Frame::Credit) => Ok(()),
            (st, out, f) => proto(&format!(
                "unexpected {} in state {st:?} on an {} connection",
                match f {
                    Frame::Hello(_) => "HELLO",
                    Frame::Msg { .. } => "MSG",
                    Frame::Bulk { .. } => "GET/PUT",
                    Frame::Reply { .. } => "REPLY",
                    Frame::Abort { .. } => "ABORT",
                    Frame::Eager { .. } => "EAGER",
                    Frame::Credit => "CREDIT",
                },
                if out { "outgoing" } else { "accepted" }
            )),
        }
    }

    /// Remembers that the listener of `sender` is reachable through the
    /// connection `t` (which it opened to us), for our requests to it.
    fn learn(&mut self, t: usize, sender: InetAddr) {
        let at = sock_of(&sender);
        if !self.out_conns.contains_key(&at) && self.routes.len() < 65_536 {
            self.routes.entry(at).or_insert(t);
        }
    }

    fn reply(&mut self, t: usize, xid: u64, status: Result<u64>) {
        self.queue_frame(t, &Frame::Reply { xid, status }, None);
    }

    /// A small message carried in its frame: claimed, copied into the
    /// receive buffer and posted at once, then answered.
    fn incoming_eager(
        &mut self,
        t: usize,
        xid: u64,
        sender: InetAddr,
        receiver: InetAddr,
        data: &[u8],
    ) {
        let Some(tm) = tm_of(&receiver, &self.eng) else {
            self.reply(t, xid, Err(NetError::Unreachable(receiver.to_string())));
            return;
        };
        let sink = tm.sink.clone();
        let len = data.len();
        match sink.claim_recv(len) {
            Ok(claim) => {
                let copied = claim
                    .buf
                    .data()
                    .ok_or(NetError::Cancelled)
                    .and_then(|mut bv| bv.copy_in(claim.offset, data));
                match copied {
                    Ok(()) => {
                        sink.post_msg(claim, len, &sender.to_string());
                        self.reply(t, xid, Ok(len as u64));
                    }
                    Err(e) => {
                        sink.release_recv(claim);
                        self.reply(t, xid, Err(e));
                    }
                }
            }
            Err(e) => {
                let e = e.settle(&sink, len, &receiver);
                self.reply(t, xid, Err(e));
            }
        }
    }

    // ------------------------------------------------------- incoming work

    #[allow(clippy::too_many_arguments)]
    fn incoming_msg(
        &mut self,
        t: usize,
        xid: u64,
        sender: InetAddr,
        receiver: InetAddr,
        len: u64,
        segs: &[Seg],
    ) {
        let Some(tm) = tm_of(&receiver, &self.eng) else {
            self.reply(t, xid, Err(NetError::Unreachable(receiver.to_string())));
            return;
        };
        let sink = tm.sink.clone();
        let ulen = usize::try_from(len).unwrap_or(usize::MAX);
        match sink.claim_recv(ulen) {
            Ok(claim) => {
                let Some(reg) = reg_of(claim.buf.reg()) else {
                    sink.release_recv(claim);
                    self.reply(t, xid, Err(NetError::Unreachable(receiver.to_string())));
                    return;
                };
                let wrs = reg.pieces(claim.offset as u64, len).and_then(|p| {
                    plan(
                        segs,
                        &p,
                        len,
                        self.dev.limits().max_sge_rd,
                        self.dev.limits().max_msg_sz,
                    )
                });
                match wrs {
                    Ok(wrs) => {
                        let op = InOp {
                            kind: InKind::Msg {
                                claim,
                                sender: sender.to_string(),
                            },
                            sink,
                            len,
                            wrs_left: 0,
                            error: None,
                            abort: None,
                            abort_by: None,
                            _reg: reg,
                        };
                        self.run_in(t, xid, op, true, wrs);
                    }
                    Err(e) => {
                        sink.release_recv(claim);
                        self.reply(t, xid, Err(e));
                    }
                }
            }
            Err(e) => {
                let e = e.settle(&sink, ulen, &receiver);
                self.reply(t, xid, Err(e));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn incoming_bulk(
        &mut self,
        t: usize,
        xid: u64,
        op: BulkOp,
        sender: InetAddr,
        receiver: InetAddr,
        size: u64,
        desc: Vec<u8>,
        segs: &[Seg],
    ) {
        let Some(tm) = tm_of(&receiver, &self.eng) else {
            self.reply(t, xid, Err(NetError::Unreachable(receiver.to_string())));
            return;
        };
        let fields = match NetBufDesc::from_bytes(desc).decode() {
            Ok(f) => f,
            Err(e) => {
                self.reply(t, xid, Err(e));
                return;
            }
        };
        let sink = tm.sink.clone();
        let active = if op == BulkOp::Get {
            QueueType::ActiveBulkRecv
        } else {
            QueueType::ActiveBulkSend
        };
        let usize_ = usize::try_from(size).unwrap_or(usize::MAX);
        match sink.claim_passive(&fields, &sender.to_string(), active, usize_) {
            Ok(PassiveClaim { buf, len }) => {
                let len = len as u64;
                let Some(reg) = reg_of(buf.reg()) else {
                    sink.release_claim(&buf);
                    self.reply(t, xid, Err(NetError::NoEntry));
                    return;
                };
                let lim = self.dev.limits();
                // WRITEs in chunks: on a software device (rxe) the whole
                // WRITE runs inside `ibv_post_send`, on the engine thread;
                // chunks posted one per round let the engine handle its
                // CQ and frames between them.
                let (sge, max_msg) = if op == BulkOp::Get {
                    (lim.max_sge, lim.max_msg_sz.min(WRITE_CHUNK))
                } else {
                    (lim.max_sge_rd, lim.max_msg_sz)
                };
                match reg
                    .pieces(0, len)
                    .and_then(|p| plan(segs, &p, len, sge, max_msg))
                {
                    Ok(wrs) => {
                        let iop = InOp {
                            kind: InKind::Passive { buf },
                            sink,
                            len,
                            wrs_left: 0,
                            error: None,
                            abort: None,
                            abort_by: None,
                            _reg: reg,
                        };
                        self.run_in(t, xid, iop, op == BulkOp::Put, wrs);
                    }
                    Err(e) => {
                        self.reply(t, xid, Err(e.clone()));
                        sink.complete(&buf, Err(e));
                    }
                }
            }
            Err(PassiveError { error, notice }) => {
                self.reply(t, xid, Err(error));
                notice.run();
            }
        }
    }

    /// Queues the work requests of an incoming operation (READs or WRITEs).
    fn run_in(
        &mut self,
        t: usize,
        xid: u64,
        mut op: InOp,
        read: bool,
        wrs: Vec<crate::plan::PlannedWr>,
    ) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        op.wrs_left = wrs.len();
        for w in wrs {
            let wr_id = self.next_wr;
            self.next_wr += 1;
            self.wrs.insert(wr_id, WrOwner::Op(t, xid));
            c.wr_queue.push_back(Wr {
                wr_id,
                read,
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                sges: w.sges,
            });
        }
        let done = op.wrs_left == 0;
        if self.ins.insert((t, xid), op).is_some() {
            warn!(xid, "peer reused a request id in flight");
        }
        if done {
            self.finish_in(t, xid);
        }
    }

    /// Every work request of an incoming operation retired: complete it
    /// and answer the requester.
    fn finish_in(&mut self, t: usize, xid: u64) {
        let Some(op) = self.ins.remove(&(t, xid)) else {
            return;
        };
        let status = match (op.abort, op.error) {
            // A deletion (ours or the requester's) decides the status.
            (Some(e), _) | (None, Some(e)) => Err(e),
            (None, None) => Ok(op.len),
        };
        self.reply(t, xid, status.clone());
        self.flush(t);
        let st = status.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        match op.kind {
            InKind::Msg { claim, sender } => match st {
                Ok(n) => op.sink.post_msg(claim, n, &sender),
                Err(_) => op.sink.release_recv(claim),
            },
            InKind::Passive { buf } => op.sink.complete(&buf, st),
        }
    }

    // --------------------------------------------------------- completions

    fn poll_cq(&mut self) -> bool {
        let mut any = false;
        loop {
            self.wcs.clear();
            let n = self.cq.poll(&mut self.wcs, 64);
            if n == 0 {
                return any;
            }
            any = true;
            let wcs = std::mem::take(&mut self.wcs);
            for wc in &wcs {
                self.completion(*wc);
            }
            self.wcs = wcs;
        }
    }

    fn completion(&mut self, wc: Wc) {
        let (t, xid) = match self.wrs.remove(&wc.wr_id) {
            Some(WrOwner::Op(t, xid)) => (t, xid),
            Some(WrOwner::Recv(t, slot)) => return self.received(t, slot, wc),
            Some(WrOwner::Send(t, slot)) => return self.sent(t, slot, wc),
            None => {
                warn!(wr_id = wc.wr_id, "completion of an unknown work request");
                return;
            }
        };
        self.cq_used = self.cq_used.saturating_sub(1);
        if let Some(c) = self.conns.get_mut(&t) {
            c.sq_used = c.sq_used.saturating_sub(1);
        }
        if !wc.ok() {
            let peer = self
                .conns
                .get(&t)
                .map(|c| c.peer.to_string())
                .unwrap_or_default();
            let e = NetError::ConnectionReset(format!(
                "{peer}: RDMA work request failed: {}",
                wc.status_text()
            ));
            if let Some(op) = self.ins.get_mut(&(t, xid)) {
                op.error.get_or_insert(e.clone());
            }
            self.fence(t, e);
        }
        if let Some(op) = self.ins.get_mut(&(t, xid)) {
            op.wrs_left = op.wrs_left.saturating_sub(1);
            if op.wrs_left == 0 {
                self.finish_in(t, xid);
            }
        }
        self.reap(t);
    }

    /// A SEND of the peer landed in receive slot `slot` (or the receive
    /// was flushed): handle its frame and queue the slot for re-posting.
    fn received(&mut self, t: usize, slot: u32, wc: Wc) {
        self.cq_used = self.cq_used.saturating_sub(1);
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        let Some(e) = c.eager.as_mut() else {
            return;
        };
        e.posted = e.posted.saturating_sub(1);
        if !wc.ok() || c.state != State::Ready {
            if !wc.ok() && !wc.flushed() {
                let peer = c.peer;
                let e = NetError::ConnectionReset(format!(
                    "{peer}: eager receive failed: {}",
                    wc.status_text()
                ));
                self.fence(t, e);
            }
            self.reap(t);
            return;
        }
        let n = wc.byte_len as usize;
        trace!(t, slot, n, "eager frame received");
        let off = slot as usize * SLOT_SIZE;
        // One or more whole frames (`pump_eager`), decoded before the slot
        // is re-posted.
        let decoded = if n > SLOT_SIZE {
            // Not possible with receives of one slot; refused all the same.
            Err(NetError::Protocol(format!(
                "rdma eager: a SEND of {n} bytes overflows its slot"
            )))
        } else {
            Frame::decode_send(&e.rmem[off..off + n])
        };
        e.idle.push(slot);
        let frames = match decoded {
            Ok(frames) => frames,
            Err(err) => {
                self.fence(t, err);
                return;
            }
        };
        for (f, credits) in frames {
            // A frame that fenced the connection discards the rest, as a
            // receive completing on a fenced connection is.
            if !self.conns.get(&t).is_some_and(|c| c.state == State::Ready) {
                return;
            }
            if let Err(err) = self.frame(t, f, credits) {
                self.fence(t, err);
                return;
            }
        }
        self.flush(t);
    }

    /// An eager SEND of ours retired: its send slot is free again.
    fn sent(&mut self, t: usize, slot: u32, wc: Wc) {
        self.cq_used = self.cq_used.saturating_sub(1);
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        c.sq_used = c.sq_used.saturating_sub(1);
        if let Some(e) = c.eager.as_mut() {
            e.free_send.push(slot);
        }
        if !wc.ok() && !wc.flushed() {
            let peer = c.peer;
            let e = NetError::ConnectionReset(format!(
                "{peer}: eager SEND failed: {}",
                wc.status_text()
            ));
            self.fence(t, e);
        }
        self.reap(t);
    }

    /// Posts queued work requests while the send queues and the CQ have
    /// room. One request per post call, so a failure names exactly the
    /// request that was not posted.
    fn post_all(&mut self) -> bool {
        let mut any = false;
        // The eager path first: re-posted receive slots, then the frames
        // waiting for credits (replies and requests are small and unblock
        // the peer), then explicit credit returns.
        let ready: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Ready && c.eager.is_some())
            .map(|(&t, _)| t)
            .collect();
        for t in ready {
            let r = self.repost(t).and_then(|()| self.pump_eager(t));
            match r {
                Ok(sent) => any |= sent,
                Err(e) => {
                    self.fence(t, NetError::ConnectionReset(format!("{e}")));
                    continue;
                }
            }
            let c = self.conns.get_mut(&t).expect("ready conn");
            let e = c.eager.as_mut().expect("eager conn");
            if e.to_return > 0 && e.to_return >= (e.slots / 2).max(1) {
                // Nothing carried them back: say so on TCP (a SEND would
                // take a slot of the peer, which it would have to return).
                let credits = std::mem::take(&mut e.to_return);
                Frame::Credit.encode_with_credits(credits, &mut c.wbuf);
                self.flush(t);
                any = true;
            }
        }
        let sq = self.params.sq_depth as usize;
        let cqd = self.cq.depth();
        let mut failed = Vec::new();
        for (&t, c) in &mut self.conns {
            if c.state != State::Ready {
                continue;
            }
            let mut writes = 0;
            while c.sq_used < sq && self.cq_used < cqd {
                if writes > 0 && c.wr_queue.front().is_some_and(|w| !w.read) {
                    // One WRITE per connection and round (see WRITE_CHUNK).
                    any = true;
                    break;
                }
                let Some(wr) = c.wr_queue.pop_front() else {
                    break;
                };
                writes += usize::from(!wr.read);
                let qp = c.qp.as_mut().expect("QP of a ready conn");
                match qp.post(std::slice::from_ref(&wr)) {
                    Ok(()) => {
                        c.sq_used += 1;
                        self.cq_used += 1;
                        any = true;
                    }
                    Err(e) => {
                        failed.push((t, wr.wr_id, e));
                        break;
                    }
                }
            }
        }
        for (t, wr_id, e) in failed {
            self.unpost(wr_id, e.clone());
            self.fence(t, NetError::ConnectionReset(format!("{e}")));
        }
        any
    }

    /// A work request that will never produce a completion: count it down.
    fn unpost(&mut self, wr_id: u64, e: NetError) {
        let Some(WrOwner::Op(t, xid)) = self.wrs.remove(&wr_id) else {
            return;
        };
        if let Some(op) = self.ins.get_mut(&(t, xid)) {
            op.error.get_or_insert(e);
            op.wrs_left = op.wrs_left.saturating_sub(1);
            if op.wrs_left == 0 {
                self.finish_in(t, xid);
            }
        }
    }

    // -------------------------------------------------------------- fencing

    /// The connection is broken (peer gone, error completion, protocol
    /// error, timeout): move its queue pair to ERROR so the peer can reach
    /// none of our memory through it, fail every operation waiting on the
    /// peer, and let our own work requests flush before their operations
    /// complete.
    fn fence(&mut self, t: usize, err: NetError) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if c.state == State::Dead {
            return;
        }
        debug!(peer = %c.peer, error = %err, outgoing = c.outgoing, "fencing connection");
        let never = !c.ever_ready;
        c.state = State::Dead;
        if let Some(qp) = c.qp.as_mut() {
            qp.set_error();
        }
        if let Some(mut s) = c.sock.take() {
            let _ = self.poll.registry().deregister(&mut s);
            let _ = s.shutdown(Shutdown::Both);
        }
        c.wbuf.clear();
        c.rbuf.clear();
        c.pending.clear();
        if let Some(e) = c.eager.as_mut() {
            // Frames not posted are dropped with the connection; posted
            // receives and SENDs come back flushed.
            e.queue.clear();
            e.replies.clear();
            e.idle.clear();
        }
        let unposted: Vec<u64> = c.wr_queue.drain(..).map(|w| w.wr_id).collect();
        if c.outgoing && self.out_conns.get(&c.peer) == Some(&t) {
            self.out_conns.remove(&c.peer);
        }
        self.routes.retain(|_, &mut r| r != t);
        let peer = c.peer;
        // Requests of ours: the peer can no longer touch their buffers.
        let mine: Vec<u64> = self
            .outs
            .iter()
            .filter(|(_, o)| o.conn == t)
            .map(|(&x, _)| x)
            .collect();
        for xid in mine {
            let op = self.outs.remove(&xid).expect("present");
            self.by_token.remove(&op.buf.token());
            let e = if never && op.frame.is_some() {
                NetError::Unreachable(peer.to_string())
            } else if matches!(err, NetError::Unreachable(_)) {
                NetError::Unreachable(format!("{peer}"))
            } else if matches!(err, NetError::Protocol(_)) {
                err.clone()
            } else {
                NetError::ConnectionReset(format!("{peer}: {err}"))
            };
            op.sink.complete(&op.buf, Err(e));
        }
        // Requests of the peer: ours finish as their WRs flush.
        let theirs: Vec<u64> = self
            .ins
            .keys()
            .filter(|(ct, _)| *ct == t)
            .map(|&(_, x)| x)
            .collect();
        for xid in &theirs {
            if let Some(op) = self.ins.get_mut(&(t, *xid)) {
                op.error
                    .get_or_insert(NetError::ConnectionReset(format!("{peer}: {err}")));
            }
        }
        for wr_id in unposted {
            self.unpost(wr_id, NetError::ConnectionReset(format!("{peer}: {err}")));
        }
        for xid in theirs {
            if self.ins.get(&(t, xid)).is_some_and(|o| o.wrs_left == 0) {
                self.finish_in(t, xid);
            }
        }
        self.reap(t);
    }

    /// Drops a fenced connection once none of its work requests is
    /// outstanding.
    fn reap(&mut self, t: usize) {
        if self.conns.get(&t).is_some_and(|c| {
            c.state == State::Dead
                && c.sq_used == 0
                && c.eager.as_ref().is_none_or(|e| e.posted == 0)
        }) && let Some(c) = self.conns.remove(&t)
            && let Some(e) = &c.eager
        {
            self.recv_total = self.recv_total.saturating_sub(e.slots as usize);
        }
    }

    // ---------------------------------------------------------------- timers

    fn sweep(&mut self, now: Instant) {
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state != State::Dead && c.deadline.is_some_and(|d| now >= d))
            .map(|(&t, _)| t)
            .collect();
        for t in late {
            let Some(c) = self.conns.get(&t) else {
                continue;
            };
            let peer = c.peer;
            let e = if c.outgoing {
                NetError::Unreachable(format!("{peer}: connection setup timed out"))
            } else {
                NetError::Protocol(format!("{peer}: no HELLO"))
            };
            self.fence(t, e);
        }
        let aborts: Vec<usize> = self
            .outs
            .values()
            .filter(|o| o.abort_by.is_some_and(|d| now >= d))
            .map(|o| o.conn)
            .collect();
        let late_in = self
            .ins
            .iter()
            .filter(|(_, o)| o.abort_by.is_some_and(|d| now >= d))
            .map(|(&(t, _), _)| t);
        let aborts: Vec<usize> = aborts.into_iter().chain(late_in).collect();
        for t in aborts {
            self.fence(t, NetError::TimedOut);
        }
        // Listeners closed by `stopped`.
        self.listeners.retain(|_, s| s.sock.lock().is_some());
    }

    fn drain_and_exit(&mut self) {
        self.settle();
        let all: Vec<usize> = self.conns.keys().copied().collect();
        for t in all {
            self.fence(t, NetError::ConnectionReset("domain finalised".into()));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.conns.is_empty() && Instant::now() < deadline {
            if !self.poll_cq() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if !self.conns.is_empty() {
            warn!(
                left = self.conns.len(),
                "work requests still outstanding at domain fini"
            );
            // Leak the queue pairs rather than destroy them under the
            // device's feet.
            for (_, mut c) in self.conns.drain() {
                std::mem::forget(c.qp.take());
                std::mem::forget(c.eager.take());
            }
        }
        for (_, c) in self.cmds_left() {
            drop(c);
        }
    }

    /// Before the fence at domain fini: frames already queued (above all
    /// the REPLY of a message this side delivered) and work requests
    /// posted get up to [`SETTLE`] to leave and complete, so a peer learns
    /// the fate of what it sent rather than a reset. Nothing new is
    /// started: commands are not read.
    fn settle(&mut self) {
        let deadline = Instant::now() + SETTLE;
        loop {
            self.post_all();
            let busy: Vec<usize> = self
                .conns
                .iter()
                .filter(|(_, c)| c.state == State::Ready && c.has_outgoing())
                .map(|(&t, _)| t)
                .collect();
            for &t in &busy {
                self.flush(t);
            }
            let worked = self.poll_cq();
            if busy.is_empty() || Instant::now() >= deadline {
                return;
            }
            if !worked {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    fn cmds_left(&mut self) -> Vec<(usize, Cmd)> {
        std::mem::take(&mut *self.eng.cmds.lock())
            .into_iter()
            .enumerate()
            .collect()
    }
}

/// Control sockets: no Nagle, keepalive tuned to `peer_timeout` and
/// `TCP_USER_TIMEOUT`, so a peer host that vanished without a FIN or RST
/// (which RC retries alone would not report on rxe) breaks the connection,
/// fencing it, within about `peer_timeout`. Failures are logged and
/// ignored.
fn tune_socket<S: std::os::fd::AsFd>(s: &S, peer_timeout: Option<Duration>) {
    let sr = socket2::SockRef::from(s);
    if let Err(e) = sr.set_tcp_nodelay(true) {
        debug!(%e, "TCP_NODELAY");
    }
    if let Err(e) = sr.set_keepalive(true) {
        debug!(%e, "SO_KEEPALIVE");
    }
    if let Some(t) = peer_timeout {
        let second = Duration::from_secs(1);
        let ka = socket2::TcpKeepalive::new()
            .with_time((t / 2).max(second))
            .with_interval((t / 10).max(second))
            .with_retries(5);
        if let Err(e) = sr.set_tcp_keepalive(&ka) {
            debug!(%e, "TCP keepalive timers");
        }
        if let Err(e) = sr.set_tcp_user_timeout(Some(t.max(second))) {
            debug!(%e, "TCP_USER_TIMEOUT");
        }
    }
}

impl Conn {
    fn new(
        sock: Option<TcpStream>,
        outgoing: bool,
        peer: SocketAddrV4,
        state: State,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            sock,
            outgoing,
            peer,
            state,
            qp: None,
            psn: 0,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            pending: Vec::new(),
            wr_queue: VecDeque::new(),
            sq_used: 0,
            ever_ready: false,
            deadline,
            eager: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_timeout_sets_keepalive_and_user_timeout() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        tune_socket(&s, Some(Duration::from_secs(40)));
        let sr = socket2::SockRef::from(&s);
        assert!(sr.tcp_nodelay().unwrap());
        assert!(sr.keepalive().unwrap());
        assert_eq!(sr.tcp_keepalive_time().unwrap(), Duration::from_secs(20));
        assert_eq!(sr.tcp_keepalive_interval().unwrap(), Duration::from_secs(4));
        assert_eq!(sr.tcp_keepalive_retries().unwrap(), 5);
        assert_eq!(
            sr.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(40))
        );
    }
}
