//! The I/O engine of a domain: one thread that owns the domain's sockets
//! (its outgoing connections, the listeners its transfer machines opened
//! and the connections accepted on them), drives readiness with `epoll`
//! (through `mio`), runs the operations the transfer machines queue and the
//! core's deliveries, watches connect timeouts, and reaps idle connections
//! (the skulker). Buffer timeouts are the core's: a buffer in flight that
//! expires reaches the engine as a deletion.
//!
//! The thread polls for [`TcpConfig::spin`](crate::TcpConfig::spin) after
//! its last piece of work before it blocks in `epoll_wait`; whoever queues a
//! command wakes it only when it is blocked. Shutdown is a flag and a wake:
//! the thread never sleeps without a way to be woken.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use colibri_net::fasthash::FastMap;
use colibri_net::registry::Registry;
use colibri_net::xprt::{DelReason, Delivery, QueuedBuf};
use colibri_net::{NetError, QueueType, Result};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tracing::{debug, trace, warn};

use crate::TcpConfig;
use crate::addr::TcpAddr;
use crate::conn::{Conn, Flow, RbufPool};
use crate::proto::{self, Directory, Expiry, Machine, Proto, ProtoConfig};
use crate::tm::TmShared;

const WAKE: Token = Token(0);

/// Counters of a transport's connections, shared by its domains.
#[derive(Debug, Default)]
pub struct Stats {
    connects: AtomicU64,
    accepts: AtomicU64,
    reaped: AtomicU64,
    broken: AtomicU64,
    rx_bytes: AtomicU64,
    listeners: AtomicU64,
    detaches: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Outgoing connections opened.
    pub connects: u64,
    /// Incoming connections accepted.
    pub accepts: u64,
    /// Idle outgoing connections closed by the skulker.
    pub reaped: u64,
    /// Connections closed by an error (reset, protocol error, peer death).
    pub broken: u64,
    /// Bytes read from sockets.
    pub rx_bytes: u64,
    /// Listening sockets the I/O threads watch now.
    pub listeners: u64,
    /// Times a spinning I/O thread took a busy connection out of its epoll
    /// set to read it directly (see the crate's docs, "I/O threads").
    pub detaches: u64,
}

impl Stats {
    pub(crate) fn add_rx(&self, n: usize) {
        self.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Reads the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            connects: self.connects.load(Ordering::Relaxed),
            accepts: self.accepts.load(Ordering::Relaxed),
            reaped: self.reaped.load(Ordering::Relaxed),
            broken: self.broken.load(Ordering::Relaxed),
            rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            listeners: self.listeners.load(Ordering::Relaxed),
            detaches: self.detaches.load(Ordering::Relaxed),
        }
    }
}

/// Commands queued to an engine.
pub(crate) enum Cmd {
    Started(Arc<TmShared>),
    Listen(Arc<Listener>),
    /// The listener was closed: forget it.
    Unlisten(Arc<Listener>),
    Send(Arc<TmShared>, QueuedBuf),
    Active(Arc<TmShared>, QueuedBuf),
    Del(QueuedBuf, DelReason),
    /// Callbacks the core decided for a transfer machine of this domain.
    Deliver(Delivery),
    Pin(usize),
    /// Break the connections with the peer listening at this address
    /// (`XprtTm::reset_peer`).
    Reset(SocketAddrV4),
}

/// A listening socket shared by the transfer machines of this process
/// started at its address, told apart by service id (in [`SERVICES`]).
pub(crate) struct Listener {
    pub(crate) addr: SocketAddrV4,
    sock: Mutex<Option<TcpListener>>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish()
    }
}

/// The transfer machines of the process by address (the core's registry).
static SERVICES: Registry<TmShared> = Registry::new();

/// Listeners of the process by address. Lock order: `LISTENERS`, then
/// the registry's own lock.
static LISTENERS: LazyLock<Mutex<HashMap<SocketAddrV4, Arc<Listener>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Claims `want` for `tm`: joins the process's listener at that address or
/// opens one (port 0 opens one on a free port). Returns the listener and
/// the address actually claimed.
pub(crate) fn claim_addr(want: TcpAddr, tm: &Arc<TmShared>) -> Result<(Arc<Listener>, TcpAddr)> {
    let mut reg = LISTENERS.lock();
    if want.port != 0
        && let Some(l) = reg.get(&want.sock())
    {
        SERVICES.claim(want, tm)?;
        return Ok((Arc::clone(l), want));
    }
    let std_l = bind(want.sock()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            NetError::AddrInUse(want.to_string())
        } else {
            NetError::io(&e)
        }
    })?;
    let real = match std_l.local_addr()? {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => {
            return Err(NetError::InvalidArgument("bound an IPv6 address".into()));
        }
    };
    let got = SERVICES.claim(
        TcpAddr {
            port: real.port(),
            ..want
        },
        tm,
    )?;
    let engine = Arc::clone(&tm.engine);
    engine.add_user();
    let l = Arc::new(Listener {
        addr: real,
        sock: Mutex::new(Some(TcpListener::from_std(std_l))),
        engine,
    });
    reg.insert(real, Arc::clone(&l));
    drop(reg);
    debug!(addr = %real, "listening");
    l.engine.push(Cmd::Listen(Arc::clone(&l)));
    Ok((l, got))
}

/// Backlog of listening sockets: room for a burst of connections from many
/// clients while the I/O thread accepts them (the standard library's 128
/// makes clients beyond it wait a SYN retransmission, a second).
const BACKLOG: i32 = 4096;

/// What the epoll set watches on a connection (when it is accepted or
/// opened, and when it goes back into the set after a detach).
const CONN_INTEREST: Interest = Interest::READABLE.add(Interest::WRITABLE);

/// Reads in a row that must find data on the hot connection before the
/// spinning loop takes it out of the epoll set ([`Loop::detach_hot`]).
const DETACH_STREAK: u32 = 64;

/// Empty turns of the spinning loop without `epoll_wait` while the hot
/// connection is out of the epoll set.
const SKIP_EPOLL: u32 = 3;

/// A non-blocking listening socket with `SO_REUSEADDR` (restarting at an
/// address whose old connections are in TIME_WAIT works).
fn bind(addr: SocketAddrV4) -> std::io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Releases `tm`'s service at listener `l`; the last one closes the
/// listening socket (at once, so the address can be started again).
pub(crate) fn release_addr(l: &Arc<Listener>, service: u32, tm: &TmShared) {
    let mut reg = LISTENERS.lock();
    let me = TcpAddr {
        ip: *l.addr.ip(),
        port: l.addr.port(),
        service,
    };
    SERVICES.release(&me, tm);
    if SERVICES.any_at(me.ip, me.port) {
        return;
    }
    if reg.get(&l.addr).is_some_and(|x| Arc::ptr_eq(x, l)) {
        reg.remove(&l.addr);
    }
    drop(reg);
    if l.sock.lock().take().is_some() {
        debug!(addr = %l.addr, "listener closed");
        // A closed socket raises no event: the I/O thread would never
        // notice and would keep the listener for good.
        l.engine.push(Cmd::Unlisten(Arc::clone(l)));
        l.engine.release_user();
    }
}

/// Every engine of the process, for deletions of buffers in use that any of
/// them may be filling.
static ENGINES: LazyLock<Mutex<Vec<Weak<Engine>>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// Queues `c()` on every running engine.
pub(crate) fn push_all(c: impl Fn() -> Cmd) {
    let engines: Vec<Arc<Engine>> = ENGINES.lock().iter().filter_map(Weak::upgrade).collect();
    for e in engines {
        if !e.shutdown.load(Ordering::SeqCst) {
            e.push(c());
        }
    }
}

/// A domain's engine: the shared half (command queue, wake-up, lifetime).
pub(crate) struct Engine {
    cfg: TcpConfig,
    stats: Arc<Stats>,
    cmds: Mutex<VecDeque<Cmd>>,
    has_cmds: AtomicBool,
    sleeping: AtomicBool,
    waker: Waker,
    users: AtomicUsize,
    shutdown: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Mutex<Option<ThreadId>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("users", &self.users.load(Ordering::Relaxed))
            .finish()
    }
}

impl Engine {
    /// Starts an engine thread; the caller is its first user.
    pub(crate) fn start(cfg: TcpConfig, stats: Arc<Stats>) -> Result<Arc<Self>> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let eng = Arc::new(Self {
            cfg,
            stats,
            cmds: Mutex::new(VecDeque::new()),
            has_cmds: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            waker,
            users: AtomicUsize::new(1),
            shutdown: AtomicBool::new(false),
            thread: Mutex::new(None),
            thread_id: Mutex::new(None),
        });
        let e2 = Arc::clone(&eng);
        let h = thread::Builder::new()
            .name("colibri-tcp-io".into())
            .spawn(move || {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                Loop::new(e2, poll).run();
            })?;
        *eng.thread_id.lock() = Some(h.thread().id());
        *eng.thread.lock() = Some(h);
        let mut all = ENGINES.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&eng));
        drop(all);
        Ok(eng)
    }

    /// Queues a command and wakes the thread if it sleeps.
    pub(crate) fn push(&self, c: Cmd) {
        self.cmds.lock().push_back(c);
        self.has_cmds.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst)
            && let Err(e) = self.waker.wake()
        {
            warn!(%e, "could not wake the I/O thread");
        }
    }

    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// Drops a user; the last one stops the thread (and joins it, unless
    /// called from the thread itself, which then exits on its own).
    pub(crate) fn release_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.shutdown.store(true, Ordering::SeqCst);
        if let Err(e) = self.waker.wake() {
            warn!(%e, "could not wake the I/O thread");
        }
        if self.on_thread() {
            return;
        }
        if let Some(h) = self.thread.lock().take()
            && h.join().is_err()
        {
            warn!("I/O thread panicked");
        }
    }

    /// True on the engine's own thread.
    pub(crate) fn on_thread(&self) -> bool {
        *self.thread_id.lock() == Some(thread::current().id())
    }
}

/// The engine thread's own state.
struct Loop {
    eng: Arc<Engine>,
    /// The protocol's configuration, for new connections.
    pcfg: ProtoConfig,
    poll: Poll,
    conns: FastMap<usize, Conn>,
    listeners: FastMap<usize, Arc<Listener>>,
    out: FastMap<SocketAddrV4, usize>,
    /// Peers' listening addresses reachable over connections they opened
    /// to us (learned from their requests).
    routes: FastMap<SocketAddrV4, usize>,
    /// Commands taken from the queue (kept to reuse its allocation).
    cmd_buf: VecDeque<Cmd>,
    /// Connections with acknowledged sends whose callbacks run once this
    /// step's writes are out.
    later: Vec<usize>,
    next_token: usize,
    /// The connection that last had data to read (polled directly while
    /// spinning).
    hot: Option<usize>,
    /// Reads in a row that found data on `hot` while spinning.
    streak: u32,
    /// The hot connection while it is out of the epoll set (see
    /// [`Loop::detach_hot`]).
    detached: Option<usize>,
    /// Empty turns since the last `epoll_wait` while `detached`.
    skipped: u32,
    dirty: Vec<usize>,
    /// Connections whose socket was full at the last write.
    full: Vec<usize>,
    last_active: Instant,
    /// The time of this turn of the loop: the clock is read once per turn
    /// (after the wait for work), and the core's time stamps on this
    /// thread use it too ([`colibri_net::clock::set_step_time`]).
    now: Instant,
    timer_at: Instant,
    next_reap: Instant,
    /// Read buffers between reads.
    rbufs: RbufPool,
}

impl Loop {
    fn new(eng: Arc<Engine>, poll: Poll) -> Self {
        let now = Instant::now();
        let next_reap = now + eng.cfg.idle_timeout / 2;
        Self {
            pcfg: ProtoConfig::new(&eng.cfg),
            eng,
            poll,
            conns: FastMap::default(),
            listeners: FastMap::default(),
            out: FastMap::default(),
            routes: FastMap::default(),
            cmd_buf: VecDeque::new(),
            later: Vec::new(),
            next_token: 1,
            hot: None,
            streak: 0,
            detached: None,
            skipped: 0,
            dirty: Vec::new(),
            full: Vec::new(),
            last_active: now,
            now,
            timer_at: now,
            next_reap,
            rbufs: RbufPool::default(),
        }
    }

    fn run(mut self) {
        if let Some(cpu) = self.eng.cfg.io_cpu {
            pin(cpu);
        }
        let mut events = Events::with_capacity(256);
        while !self.eng.shutdown.load(Ordering::SeqCst) {
            // The time of the last turn (one clock read per turn, taken
            // once the wait for work is over). A wait computed from it ends
            // at most the last step's length after the engine's own timer
            // (connect deadlines, the skulker: coarse timers; buffer
            // timeouts are the core's).
            let now = self.now;
            let spin = self.eng.cfg.spin;
            let spinning =
                !spin.is_zero() && now.saturating_duration_since(self.last_active) < spin;
            let timeout = if spinning {
                Some(Duration::ZERO)
            } else {
                Some(self.timer_at.saturating_duration_since(now))
            };
            if !spinning {
                // Only epoll reports traffic now: the hot connection goes
                // back into its set first.
                self.attach_hot();
            }
            let blocking = timeout.is_some_and(|t| !t.is_zero());
            if blocking {
                self.eng.sleeping.store(true, Ordering::SeqCst);
                if self.eng.has_cmds.load(Ordering::SeqCst)
                    || self.eng.shutdown.load(Ordering::SeqCst)
                {
                    self.eng.sleeping.store(false, Ordering::SeqCst);
                    self.tick();
                    self.step(&events, false);
                    continue;
                }
            }
            if spinning {
                // The zero-timeout poll below takes no time worth a
                // second clock read.
                self.tick();
                if self.poll_hot() {
                    self.last_active = self.now;
                    self.step(&events, false);
                    continue;
                }
                // While the hot connection is out of the epoll set, the
                // others are polled every `SKIP_EPOLL + 1`th empty turn:
                // the hot one is read sooner.
                if self.detached.is_some()
                    && self.skipped < SKIP_EPOLL
                    && !self.eng.has_cmds.load(Ordering::Relaxed)
                {
                    self.skipped += 1;
                    continue;
                }
                self.skipped = 0;
            }
            let r = self.poll.poll(&mut events, timeout);
            if blocking {
                self.eng.sleeping.store(false, Ordering::SeqCst);
            }
            if let Err(e) = r {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    warn!(%e, "epoll_wait failed");
                    thread::sleep(Duration::from_millis(1));
                }
                events.clear();
            }
            if !spinning {
                self.tick();
            }
            self.step(&events, true);
        }
        colibri_net::clock::set_step_time(None);
        self.close_all();
        let left = self.listeners.len() as u64;
        self.eng.stats.listeners.fetch_sub(left, Ordering::Relaxed);
    }

    /// Reads the clock for this turn of the loop and declares it as the
    /// thread's step time.
    fn tick(&mut self) {
        self.now = Instant::now();
        colibri_net::clock::set_step_time(Some(self.now));
    }

    /// Drops a closed listener from the watched set.
    fn forget_listener(&mut self, l: &Arc<Listener>) {
        let before = self.listeners.len();
        self.listeners.retain(|_, x| !Arc::ptr_eq(x, l));
        let gone = (before - self.listeners.len()) as u64;
        self.eng.stats.listeners.fetch_sub(gone, Ordering::Relaxed);
    }

    /// While spinning, reads the connection that last received data
    /// directly, without waiting for epoll to report it (the busy-poll of a
    /// raw socket): a request-response exchange sees its answer one
    /// `epoll_wait` earlier. Returns true if it read something. A later
    /// event for the same data finds nothing to read, which is harmless.
    fn poll_hot(&mut self) -> bool {
        if !self.full.is_empty() {
            let full = std::mem::take(&mut self.full);
            for t in full {
                if self.conns.get(&t).is_some_and(|c| c.proto.has_output()) {
                    self.dirty.push(t);
                }
            }
            self.flush_dirty();
        }
        let Some(t) = self.hot else {
            return false;
        };
        let Some(c) = self.conns.get_mut(&t) else {
            self.hot = None;
            return false;
        };
        if !c.proto.is_connected() {
            return false;
        }
        let before = self.eng.stats.rx_bytes.load(Ordering::Relaxed);
        match c.on_readable(&self.eng.stats, &Services, false, &mut self.rbufs, self.now) {
            Ok(Flow::Open) => {}
            Ok(Flow::Eof) => {
                let e = NetError::ConnectionReset(format!("{} closed the connection", c.peer));
                self.close(t, &e);
                return true;
            }
            Err(e) => {
                self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
                self.close(t, &e);
                return true;
            }
        }
        let Some(c) = self.conns.get_mut(&t) else {
            return true;
        };
        if c.proto.has_output() {
            self.dirty.push(t);
        }
        if c.proto.has_later() {
            self.later.push(t);
        }
        for a in c.proto.take_new_routes() {
            self.routes.insert(a, t);
        }
        let got = self.eng.stats.rx_bytes.load(Ordering::Relaxed) != before;
        if got {
            self.streak = self.streak.saturating_add(1);
            if self.streak >= DETACH_STREAK && self.detached.is_none() {
                self.detach_hot(t);
            }
        }
        got
    }

    /// Takes the hot connection out of the epoll set while the loop spins
    /// on it. A socket in an epoll set costs its sender's system call the
    /// work of reporting each arrival to epoll (and `epoll_wait` the work
    /// of collecting it), which a raw busy-polled socket does not pay:
    /// about 0.3-0.5 us of a 6-10 us loopback round trip on this machine
    /// kind (BENCHMARKS.md). `poll_hot` reads it (and retries its writes
    /// when the socket was full) on every turn while it is out; it goes
    /// back into the set ([`Loop::attach_hot`]) before the loop blocks and
    /// when another connection becomes hot. A socket added back with data
    /// waiting is reported at once (epoll checks readiness when an entry
    /// is added), so nothing is missed. Only after `DETACH_STREAK` reads in
    /// a row found data on it, so that traffic spread over many
    /// connections never pays the two system calls of a detach.
    fn detach_hot(&mut self, t: usize) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        match self.poll.registry().deregister(&mut c.sock) {
            Ok(()) => {
                self.detached = Some(t);
                self.eng.stats.detaches.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => debug!(conn = t, %e, "could not take the hot connection out of epoll"),
        }
    }

    /// Puts the detached connection back into the epoll set. It leaves the
    /// set again only after another `DETACH_STREAK` reads in a row with
    /// data: traffic that comes and goes (the thread blocks between
    /// messages) never pays two `epoll_ctl` calls a message.
    fn attach_hot(&mut self) {
        let Some(t) = self.detached.take() else {
            return;
        };
        self.streak = 0;
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut c.sock, Token(t), CONN_INTEREST)
        {
            // Without epoll the connection would be read only while the
            // loop spins: fail it rather than leave it deaf.
            warn!(conn = t, %e, "could not put a connection back into epoll");
            self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
            self.close(t, &NetError::io(&e));
        }
    }

    /// One iteration after a poll: socket events, commands, timers, writes,
    /// stops.
    fn step(&mut self, events: &Events, polled: bool) {
        let mut active = false;
        if polled {
            // Outgoing connections first: they carry the responses that
            // complete our sends and free their buffers (a server echoing
            // from its receive buffers gets them back before it reads the
            // next requests that arrived in the same batch). Each event's
            // connection is looked up once: the others wait in `incoming`
            // for the second pass.
            let mut incoming: SmallVec<[&mio::event::Event; 16]> = SmallVec::new();
            for ev in events {
                let t = ev.token();
                if t == WAKE {
                    continue;
                }
                active = true;
                if self.conns.get(&t.0).is_some_and(|c| c.proto.is_outgoing()) {
                    self.on_event(ev);
                } else {
                    incoming.push(ev);
                }
            }
            // Completions from the outgoing connections free their buffers
            // before the requests read next need them (the hot connection,
            // alone, defers them past its writes).
            self.run_later();
            for ev in incoming {
                self.on_event(ev);
            }
        }
        if self.eng.has_cmds.swap(false, Ordering::SeqCst) {
            let mut cmds = std::mem::take(&mut self.cmd_buf);
            std::mem::swap(&mut cmds, &mut *self.eng.cmds.lock());
            if !cmds.is_empty() {
                active = true;
            }
            while let Some(c) = cmds.pop_front() {
                self.on_cmd(c);
            }
            self.cmd_buf = cmds;
        }
        let now = self.now;
        if active {
            self.last_active = now;
        }
        if now >= self.timer_at {
            self.timers(now);
        }
        self.flush_dirty();
        // The callbacks of acknowledged sends, now that the answers of
        // this step are on their way.
        self.run_later();
    }

    /// Runs the deferred completions of the connections that have some.
    fn run_later(&mut self) {
        while let Some(t) = self.later.pop() {
            if let Some(c) = self.conns.get_mut(&t) {
                c.proto.run_later();
            }
        }
    }

    fn on_event(&mut self, ev: &mio::event::Event) {
        let t = ev.token().0;
        // Connections first (listeners and connections share the token
        // counter, so at most one of the two knows the token).
        let Some(c) = self.conns.get_mut(&t) else {
            if let Some(l) = self.listeners.get(&t).cloned() {
                self.accept(&l);
            }
            return;
        };
        if !c.proto.is_connected() && (ev.is_writable() || ev.is_error() || ev.is_write_closed()) {
            match c.sock.take_error() {
                Ok(None) => match c.sock.peer_addr() {
                    Ok(_) => {
                        c.proto.set_connected();
                        trace!(conn = t, peer = %c.peer, "connected");
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotConnected => return,
                    Err(e) => return self.close(t, &NetError::io(&e)),
                },
                Ok(Some(e)) | Err(e) => return self.close(t, &NetError::io(&e)),
            }
        }
        if !c.proto.is_connected() {
            return;
        }
        let mut new_hot = false;
        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
            match c.on_readable(
                &self.eng.stats,
                &Services,
                ev.is_read_closed() || ev.is_error(),
                &mut self.rbufs,
                self.now,
            ) {
                Ok(Flow::Open) => new_hot = self.hot != Some(t),
                Ok(Flow::Eof) => {
                    let idle = c.proto.is_idle();
                    let e = NetError::ConnectionReset(format!("{} closed the connection", c.peer));
                    if !idle {
                        self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
                    }
                    return self.close(t, &e);
                }
                Err(e) => {
                    debug!(conn = t, %e, "connection failed");
                    self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
                    return self.close(t, &e);
                }
            }
        }
        // Still open (every path that closed it returned): the same entry.
        if c.proto.has_output() && self.dirty.last() != Some(&t) {
            self.dirty.push(t);
        }
        if c.proto.has_later() {
            self.later.push(t);
        }
        for a in c.proto.take_new_routes() {
            self.routes.insert(a, t);
        }
        if new_hot {
            self.attach_hot();
            self.streak = 0;
            self.hot = Some(t);
        }
    }

    fn accept(&mut self, l: &Arc<Listener>) {
        loop {
            let r = {
                let g = l.sock.lock();
                match g.as_ref() {
                    None => {
                        drop(g);
                        self.forget_listener(l);
                        return;
                    }
                    Some(s) => s.accept(),
                }
            };
            match r {
                Ok((stream, peer)) => {
                    let std::net::SocketAddr::V4(peer) = peer else {
                        continue;
                    };
                    self.tune(&stream);
                    let t = self.token();
                    let proto = Proto::accepted(t, self.pcfg, l.addr, Instant::now());
                    let mut c = Conn::new(stream, peer, proto);
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut c.sock, Token(t), CONN_INTEREST)
                    {
                        warn!(%e, "could not register an accepted connection");
                        continue;
                    }
                    self.eng.stats.accepts.fetch_add(1, Ordering::Relaxed);
                    trace!(conn = t, %peer, listener = %l.addr, "accepted");
                    self.conns.insert(t, c);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors and the like: try again later.
                    warn!(%e, listener = %l.addr, "accept failed");
                    return;
                }
            }
        }
    }

    fn token(&mut self) -> usize {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn tune(&self, s: &TcpStream) {
        tune_socket(s, &self.eng.cfg);
    }

    /// The outgoing connection to `peer`, opened on first use.
    fn conn_to(&mut self, peer: SocketAddrV4) -> Result<usize> {
        if let Some(&t) = self.out.get(&peer)
            && self.conns.contains_key(&t)
        {
            return Ok(t);
        }
        // A connection the peer opened to us, while it is recently active:
        // the peer's skulker closes only connections idle for a whole
        // `idle_timeout`, so a request sent now cannot race that close.
        if let Some(&t) = self.routes.get(&peer)
            && let Some(c) = self.conns.get(&t)
            && self.now.saturating_duration_since(c.proto.last_use())
                < self.eng.cfg.idle_timeout / 2
        {
            return Ok(t);
        }
        let stream = TcpStream::connect(peer.into())?;
        self.tune(&stream);
        let t = self.token();
        let now = Instant::now();
        let proto = Proto::connecting(t, self.pcfg, now, now + self.eng.cfg.connect_timeout);
        let mut c = Conn::new(stream, peer, proto);
        self.poll
            .registry()
            .register(&mut c.sock, Token(t), CONN_INTEREST)?;
        self.eng.stats.connects.fetch_add(1, Ordering::Relaxed);
        trace!(conn = t, %peer, "connecting");
        self.conns.insert(t, c);
        self.out.insert(peer, t);
        self.timer_at = Instant::now();
        Ok(t)
    }

    fn close(&mut self, t: usize, e: &NetError) {
        let Some(mut c) = self.conns.remove(&t) else {
            return;
        };
        if c.proto.is_outgoing() && self.out.get(&c.peer) == Some(&t) {
            self.out.remove(&c.peer);
        }
        for a in c.proto.learned() {
            if self.routes.get(a) == Some(&t) {
                self.routes.remove(a);
            }
        }
        if self.detached == Some(t) {
            self.detached = None;
        } else {
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
        if self.hot == Some(t) {
            self.hot = None;
        }
        c.proto.fail_all(e);
        trace!(conn = t, peer = %c.peer, %e, "closed");
    }

    /// Closes the connections with the peer listening at `peer` (the one
    /// this engine opened and the one it opened to us), failing what is
    /// in flight on them, as a network reset would.
    fn reset(&mut self, peer: SocketAddrV4) {
        let e = NetError::ConnectionReset(format!("connection with {peer} reset"));
        let ts: Vec<usize> = [self.out.get(&peer), self.routes.get(&peer)]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        for t in ts {
            debug!(conn = t, %peer, "connection reset on request");
            self.close(t, &e);
        }
    }

    fn close_all(&mut self) {
        let ts: Vec<usize> = self.conns.keys().copied().collect();
        for t in ts {
            self.close(t, &NetError::ConnectionReset("transport shut down".into()));
        }
    }

    fn flush_dirty(&mut self) {
        while let Some(t) = self.dirty.pop() {
            let Some(c) = self.conns.get_mut(&t) else {
                continue;
            };
            match c.flush(self.now) {
                Ok(()) => {
                    if c.proto.has_output() && !self.full.contains(&t) {
                        // The socket is full: epoll reports room again only
                        // once a third of the buffer drained; while spinning
                        // we try again sooner.
                        self.full.push(t);
                    }
                }
                Err(e) => {
                    debug!(conn = t, %e, "write failed");
                    self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
                    self.close(t, &e);
                }
            }
        }
    }

    fn on_cmd(&mut self, c: Cmd) {
        match c {
            Cmd::Started(tm) => {
                if let Some(a) = tm.own() {
                    tm.sink().post_started(&a.to_string());
                }
            }
            Cmd::Listen(l) => {
                let t = self.token();
                let mut g = l.sock.lock();
                if let Some(s) = g.as_mut() {
                    if let Err(e) = self
                        .poll
                        .registry()
                        .register(s, Token(t), Interest::READABLE)
                    {
                        warn!(%e, addr = %l.addr, "could not watch a listener");
                    }
                    drop(g);
                    self.listeners.insert(t, Arc::clone(&l));
                    self.eng.stats.listeners.fetch_add(1, Ordering::Relaxed);
                    self.accept(&l);
                }
            }
            Cmd::Unlisten(l) => self.forget_listener(&l),
            Cmd::Send(tm, q) | Cmd::Active(tm, q) => self.start_op(tm, q),
            Cmd::Del(q, reason) => self.del(&q, reason),
            Cmd::Deliver(d) => d.run(),
            Cmd::Pin(cpu) => pin(cpu),
            Cmd::Reset(peer) => self.reset(peer),
        }
    }

    fn start_op(&mut self, tm: Arc<TmShared>, q: QueuedBuf) {
        if !tm.sink().begin_use(&q) {
            return;
        }
        let Some(own) = tm.own() else {
            let e = NetError::InvalidArgument("transfer machine not started".into());
            tm.complete(&q, Err(e));
            return;
        };
        let plan = match proto::plan(&q) {
            Ok(p) => p,
            Err(e) => return tm.complete(&q, Err(e)),
        };
        let dest = plan.dest;
        let t = match self.conn_to(dest.sock()) {
            Ok(t) => t,
            Err(e) => {
                debug!(%dest, %e, "connect failed");
                tm.complete(&q, Err(NetError::Unreachable(dest.to_string())));
                return;
            }
        };
        let c = self.conns.get_mut(&t).expect("just looked up");
        c.proto.start(tm, q, own, plan);
        if self.dirty.last() != Some(&t) {
            self.dirty.push(t);
        }
    }

    /// Ends the transfer using buffer `q` (which the transport has in
    /// use: the core completes idle buffers itself), wherever it is: an
    /// outgoing operation is withdrawn or aborted on the wire, an incoming
    /// message read or bulk transfer is abandoned and its sender told.
    fn del(&mut self, q: &QueuedBuf, reason: DelReason) {
        let wire = if reason == DelReason::Timeout {
            NetError::TimedOut
        } else {
            NetError::Cancelled
        };
        let mut failed = Vec::new();
        match q.queue() {
            QueueType::MsgSend | QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => {
                for (t, c) in &mut self.conns {
                    match c.proto.del_outgoing(q, &wire, reason == DelReason::Cancel) {
                        Ok(false) => {}
                        Ok(true) => self.dirty.push(*t),
                        Err(e) => {
                            self.dirty.push(*t);
                            failed.push((*t, e));
                        }
                    }
                }
            }
            QueueType::MsgRecv | QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => {
                for (t, c) in &mut self.conns {
                    if c.proto.abort_incoming(q, &wire) {
                        self.dirty.push(*t);
                    }
                }
            }
        }
        for (t, e) in failed {
            self.close(t, &e);
        }
    }

    /// Connect timeouts and the skulker; sets the next time to look.
    fn timers(&mut self, now: Instant) {
        let mut next = now + Duration::from_secs(1);
        let mut late = Vec::new();
        for (t, c) in &self.conns {
            if c.proto.connect_expired(now) {
                late.push(*t);
            } else if let Some(d) = c.proto.connect_deadline() {
                next = next.min(d);
            }
        }
        for t in late {
            self.close(t, &Expiry::Connect.error());
        }
        if now >= self.next_reap {
            let idle = self.eng.cfg.idle_timeout;
            let verdicts: Vec<(usize, Expiry)> = self
                .conns
                .iter()
                .filter_map(|(t, c)| c.proto.sweep(now, idle).map(|x| (*t, x)))
                .collect();
            for (t, x) in verdicts {
                match x {
                    Expiry::Idle => {
                        trace!(conn = t, "idle connection reaped");
                        self.eng.stats.reaped.fetch_add(1, Ordering::Relaxed);
                    }
                    // A peer that stopped reading: after `idle_timeout`
                    // without any write progress the connection is given up.
                    Expiry::Stalled | Expiry::Connect => {
                        debug!(conn = t, "peer stopped reading: connection closed");
                        self.eng.stats.broken.fetch_add(1, Ordering::Relaxed);
                    }
                }
                self.close(t, &x.error());
            }
            self.next_reap = now + (idle / 4).max(Duration::from_millis(10));
        }
        next = next.min(self.next_reap);
        self.timer_at = next;
    }
}

/// The transfer machines requests are delivered to: those of this process
/// (the core's registry of started addresses).
#[derive(Debug, Clone, Copy)]
struct Services;

impl Directory<TmShared> for Services {
    fn machine(&self, addr: &TcpAddr) -> Option<Arc<TmShared>> {
        SERVICES.lookup(addr)
    }

    fn generation(&self) -> Option<u64> {
        Some(SERVICES.generation())
    }
}

/// Socket options of every connection: no Nagle, keepalive (tuned to
/// `peer_timeout`), `TCP_USER_TIMEOUT`, buffer sizes. Failures are logged
/// and ignored: the connection works without them.
fn tune_socket<S: std::os::fd::AsFd>(s: &S, cfg: &TcpConfig) {
    let sr = socket2::SockRef::from(s);
    if let Err(e) = sr.set_tcp_nodelay(true) {
        debug!(%e, "TCP_NODELAY");
    }
    if let Err(e) = sr.set_keepalive(true) {
        debug!(%e, "SO_KEEPALIVE");
    }
    if let Some(t) = cfg.peer_timeout {
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
    if let Some(n) = cfg.sock_buf {
        let _ = sr.set_send_buffer_size(n);
        let _ = sr.set_recv_buffer_size(n);
    }
}

fn pin(cpu: usize) {
    colibri_net::cpu::pin_current_thread(cpu, "tcp I/O thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn peer_timeout_sets_keepalive_and_user_timeout() {
        let (c, _s) = pair();
        let cfg = TcpConfig {
            peer_timeout: Some(Duration::from_secs(40)),
            ..TcpConfig::default()
        };
        tune_socket(&c, &cfg);
        let sr = socket2::SockRef::from(&c);
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

    #[test]
    fn no_peer_timeout_keeps_the_system_timers() {
        let (c, _s) = pair();
        let sr = socket2::SockRef::from(&c);
        let (time, user) = (
            sr.tcp_keepalive_time().unwrap(),
            sr.tcp_user_timeout().unwrap(),
        );
        let cfg = TcpConfig {
            peer_timeout: None,
            ..TcpConfig::default()
        };
        tune_socket(&c, &cfg);
        assert!(sr.keepalive().unwrap());
        assert_eq!(sr.tcp_keepalive_time().unwrap(), time);
        assert_eq!(sr.tcp_user_timeout().unwrap(), user);
        // Short timeouts are raised to a second (the kernel's unit).
        let cfg = TcpConfig {
            peer_timeout: Some(Duration::from_millis(100)),
            ..TcpConfig::default()
        };
        tune_socket(&c, &cfg);
        assert_eq!(sr.tcp_keepalive_time().unwrap(), Duration::from_secs(1));
        assert_eq!(sr.tcp_user_timeout().unwrap(), Some(Duration::from_secs(1)));
    }
}
