//! # colibri-bulk-tcp: the TCP transport
//!
//! Transfer machines in different processes (and hosts) exchange messages
//! and do bulk transfers over plain TCP (the role Motr's sunrpc bulk
//! emulation played, without sunrpc). See `DESIGN.md` beside this crate for the
//! threads, the locking order and the wire format.
//!
//! * Addresses are `a.b.c.d:port:service` ([`TcpAddr`]). The transfer
//!   machines of one process started at the same `a.b.c.d:port` share one
//!   listening socket and are told apart by service id; starting two at
//!   the same address fails with `AddrInUse`. Port 0 opens a listener on a
//!   free port, which the started transfer machine's end point reports.
//! * A message send is one MSG frame, answered by the receiver with
//!   whether it took it: the send completes with that status (`NoBuffers`,
//!   `MessageTooLarge`, `Unreachable`, ...), or `ConnectionReset` when the
//!   connection broke first. The receiver learns the sender's end point
//!   from the frame header.
//! * Active bulk is a series of chunked GET or PUT requests against the
//!   passive buffer the descriptor names; the passive side validates the
//!   first one with the core's checks (token generation, cookie, queue
//!   pairing, allowed end point, sizes) and every later one against that
//!   claim. Data moves straight between the sockets and the registered
//!   buffers with vectored I/O. Both sides complete with the same status.
//! * Each domain has one I/O thread ([`TcpConfig::spin`] sets how long it
//!   polls before it blocks in `epoll_wait`); connections are opened on
//!   first use, cached per domain, and closed by the skulker after
//!   [`TcpConfig::idle_timeout`] without traffic. Buffer callbacks run on
//!   the I/O thread that completes the buffer (keep them short, or use
//!   synchronous delivery). While it spins, an I/O thread reads the
//!   connection that last had data directly; after 64 such reads in a row
//!   it takes that connection out of its epoll set (a socket in an epoll
//!   set makes every arrival cost its sender the work of telling epoll)
//!   and puts it back before it blocks or when another connection becomes
//!   the busy one ([`StatsSnapshot::detaches`] counts them).
//! * Supports multi-message receive buffers, buffer timeouts, synchronous
//!   delivery, and confining the domain's I/O thread to a CPU.
//!
//! ```
//! use std::time::Duration;
//! use colibri_bulk_tcp::{TcpConfig, TcpTransport};
//! use colibri_net::{BufVec, Domain, QueueType, RecvParams, TmState, event_channel, ignore_tm_events};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let xprt = TcpTransport::new(TcpConfig::default());
//! let (sdom, cdom) = (Domain::new(&xprt)?, Domain::new(&xprt)?);
//! let server = sdom.tm_init(ignore_tm_events())?;
//! let client = cdom.tm_init(ignore_tm_events())?;
//! server.start("127.0.0.1:0:1")?;
//! client.start("127.0.0.1:0:2")?;
//! server.wait_for_state(TmState::Started, Duration::from_secs(5))?;
//! client.wait_for_state(TmState::Started, Duration::from_secs(5))?;
//!
//! let (cbs, events) = event_channel(8);
//! let rbuf = sdom.register(BufVec::new(1, 4096))?.with_callbacks(cbs.clone());
//! server.add_msg_recv(rbuf, RecvParams::default())?;
//! let mut sbuf = cdom.register(BufVec::new(1, 4096))?.with_callbacks(cbs);
//! sbuf.bufvec_mut().copy_in(0, b"hello")?;
//! let server_ep = client.ep_create(server.ep().unwrap().addr())?;
//! client.add_msg_send(sbuf, &server_ep, 5)?;
//! for _ in 0..2 {
//!     let ev = events.recv_timeout(Duration::from_secs(5)).expect("an event");
//!     assert!(ev.is_ok());
//!     if ev.queue() == QueueType::MsgRecv {
//!         assert_eq!(ev.message()?, b"hello");
//!         assert_eq!(ev.sender().unwrap().addr(), client.ep().unwrap().addr());
//!     }
//! }
//! drop(server_ep);
//! for tm in [&server, &client] {
//!     tm.stop(false)?;
//!     tm.wait_stopped(Duration::from_secs(5))?;
//! }
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod addr;
mod conn;
mod engine;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod proto;
#[cfg(any(test, feature = "fuzzing"))]
mod testkit;
mod tm;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use colibri_net::xprt::{Caps, Limits, TmSink, Transport, XprtDomain, XprtTm};
use colibri_net::{Result, TmId};

pub use addr::TcpAddr;
pub use engine::{Stats, StatsSnapshot};

/// Identifier stamped into this transport's descriptors ("TCP1").
pub const TCP_TRANSPORT_ID: u32 = u32::from_le_bytes(*b"TCP1");

/// Configuration of the TCP transport.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// How long an idle I/O thread polls (with a zero `epoll_wait`
    /// timeout) before it blocks. `Duration::ZERO` blocks at once (every
    /// hand-off pays a thread wake-up, 15-20 µs across cores on a VM);
    /// `Duration::MAX` never blocks (lowest latency; burns a CPU).
    pub spin: Duration,
    /// Bulk transfers move in chunks of this many bytes.
    pub chunk: usize,
    /// The skulker closes outgoing connections idle this long.
    pub idle_timeout: Duration,
    /// A connection not established after this long fails its buffers
    /// with `Unreachable`.
    pub connect_timeout: Duration,
    /// How long a peer may stay silent or leave sent data unacknowledged
    /// before its connection is given up (host crashed, network cut: no
    /// FIN or RST ever comes). TCP keepalive probes an idle connection
    /// after half of it, five times at a tenth of it, and
    /// `TCP_USER_TIMEOUT` bounds unacknowledged data; the connection then
    /// fails what was on it. `None` keeps the system's timers (keepalive
    /// after two hours). Default 60 s.
    pub peer_timeout: Option<Duration>,
    /// `SO_SNDBUF` and `SO_RCVBUF` for every socket; `None` leaves the
    /// kernel's autotuning on, which is best on Linux.
    pub sock_buf: Option<usize>,
    /// Pin each domain's I/O thread to this CPU.
    pub io_cpu: Option<usize>,
    /// Size limits.
    pub limits: Limits,
    /// A shared engine whose I/O threads serve the domains made with this
    /// configuration, instead of a thread of their own each (the I/O
    /// settings above are then the engine's). See [`TcpEngine`].
    pub engine: Option<TcpEngine>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            spin: Duration::from_micros(50),
            chunk: 1 << 20,
            idle_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            peer_timeout: Some(Duration::from_secs(60)),
            sock_buf: None,
            io_cpu: None,
            limits: Limits::new(64 << 20, 16 << 20, 4096, 1024),
            engine: None,
        }
    }
}

impl TcpConfig {
    /// I/O threads that never block (lowest latency; each burns a CPU).
    pub fn polling() -> Self {
        Self {
            spin: Duration::MAX,
            ..Self::default()
        }
    }

    /// I/O threads that block as soon as they are idle.
    pub fn blocking() -> Self {
        Self {
            spin: Duration::ZERO,
            ..Self::default()
        }
    }

    /// Domains served by the I/O threads of `engine` (its I/O settings,
    /// the default limits).
    pub fn shared(engine: &TcpEngine) -> Self {
        Self {
            engine: Some(engine.clone()),
            ..engine.0.cfg.clone()
        }
    }
}

/// A fixed set of I/O threads serving the connections of any number of
/// TCP domains (those whose [`TcpConfig::engine`] names it), as Lustre's
/// socklnd schedulers serve every peer.
///
/// Without one, each domain has an I/O thread of its own: a process with
/// a thousand domains has a thousand threads, each spinning
/// [`TcpConfig::spin`] after work, and the rate falls as they take turns
/// on the CPUs. With an engine of `n` threads, domains are dealt to the
/// threads in turn; a thread serves its domains' listeners, connections,
/// timers and callbacks in one event loop, as it would one domain's.
/// Connections are cached per thread, so domains on one thread also share
/// their outgoing connections.
///
/// The trade-off: a domain's I/O waits behind the other domains' on its
/// thread (a slow callback delays all of them, as it delays its own
/// domain's I/O without an engine), and the thread cannot be confined to
/// CPUs for one domain (`confine` is refused; [`TcpConfig::io_cpu`] of
/// the engine's configuration pins every thread). One domain per side on
/// an engine of at least two threads gets a thread each, as without one.
/// The threads exit when the engine and every domain using it are gone.
///
/// ```
/// use colibri_bulk_tcp::{TcpConfig, TcpEngine, TcpTransport};
/// use colibri_net::Domain;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = TcpEngine::new(2, &TcpConfig::default())?;
/// let xprt = TcpTransport::new(TcpConfig::shared(&engine));
/// let domains = (0..50)
///     .map(|_| Domain::new(&xprt))
///     .collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(engine.threads(), 2);
/// # drop(domains);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TcpEngine(Arc<EnginePool>);

struct EnginePool {
    cfg: TcpConfig,
    stats: Arc<Stats>,
    threads: Vec<Arc<engine::Engine>>,
    next: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for TcpEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpEngine")
            .field("threads", &self.0.threads.len())
            .finish_non_exhaustive()
    }
}

impl TcpEngine {
    /// Starts `threads` I/O threads (at least one) with the I/O settings
    /// of `cfg` (`spin`, `chunk`, timeouts, socket buffers, `io_cpu`).
    ///
    /// # Errors
    /// The system refused a thread or an epoll instance.
    pub fn new(threads: usize, cfg: &TcpConfig) -> Result<Self> {
        let cfg = TcpConfig {
            engine: None,
            ..cfg.clone()
        };
        let stats = Arc::<Stats>::default();
        let threads = (0..threads.max(1))
            .map(|_| engine::Engine::start(cfg.clone(), Arc::clone(&stats)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self(Arc::new(EnginePool {
            cfg,
            stats,
            threads,
            next: std::sync::atomic::AtomicUsize::new(0),
        })))
    }

    /// Its I/O threads.
    pub fn threads(&self) -> usize {
        self.0.threads.len()
    }

    /// Connection counters of every domain it serves.
    pub fn stats(&self) -> StatsSnapshot {
        self.0.stats.snapshot()
    }

    /// The thread for one more domain (in turn).
    fn take(&self) -> Arc<engine::Engine> {
        let k = self.0.next.fetch_add(1, Ordering::Relaxed) % self.0.threads.len();
        let e = Arc::clone(&self.0.threads[k]);
        e.add_user();
        e
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        for e in &self.threads {
            e.release_user();
        }
    }
}

/// The TCP transport.
#[derive(Debug, Clone, Default)]
pub struct TcpTransport {
    cfg: TcpConfig,
    stats: Arc<Stats>,
}

impl TcpTransport {
    /// A transport with the given configuration.
    pub fn new(cfg: TcpConfig) -> Self {
        let stats = cfg
            .engine
            .as_ref()
            .map_or_else(Arc::default, |e| Arc::clone(&e.0.stats));
        Self { cfg, stats }
    }

    /// Its configuration.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// Connection counters of every domain made from this transport.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        let engine = match &self.cfg.engine {
            Some(shared) => shared.take(),
            None => engine::Engine::start(self.cfg.clone(), Arc::clone(&self.stats))?,
        };
        Ok(Box::new(TcpDomain {
            shared: self.cfg.engine.is_some(),
            cfg: self.cfg.clone(),
            engine,
            finalized: AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct TcpDomain {
    cfg: TcpConfig,
    /// Served by a shared engine's thread (which `confine` may not pin).
    shared: bool,
    engine: Arc<engine::Engine>,
    finalized: AtomicBool,
}

impl XprtDomain for TcpDomain {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn limits(&self) -> Limits {
        self.cfg.limits
    }

    fn caps(&self) -> Caps {
        let caps = Caps::new(TCP_TRANSPORT_ID)
            .with_sync_delivery()
            .with_multi_message()
            .with_timeouts()
            .with_reset_peer();
        if self.shared {
            caps
        } else {
            caps.with_confine()
        }
    }

    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        Ok(Box::new(tm::TcpTm::new(tm, Arc::clone(&self.engine), sink)))
    }

    fn fini(&self) {
        if !self.finalized.swap(true, Ordering::AcqRel) {
            self.engine.release_user();
        }
    }
}

impl Drop for TcpDomain {
    fn drop(&mut self) {
        self.fini();
    }
}
