//! # colibri-bulk-rdma: the verbs RDMA transport
//!
//! Transfer machines of different processes (or domains) exchange messages
//! and do bulk transfers over RDMA reliable-connected queue pairs. Bulk
//! payloads move by a one-sided RDMA READ or WRITE between registered
//! buffers, run by the side that *receives the request* after the core has
//! validated it:
//!
//! * a small message (up to [`wire::MAX_EAGER`] bytes) travels whole in an
//!   RDMA SEND into a receive slot the receiver posted for the connection
//!   (the eager path, with credits so the slots never run out); the
//!   receiver claims space in a receive buffer and copies it in;
//! * a larger message: the receiver claims space in a receive buffer, then
//!   READs the message out of the sender's buffer straight into it;
//! * an active receive (GET): the passive side checks the descriptor
//!   (`claim_passive`), then WRITEs its buffer into the active one;
//! * an active send (PUT): the passive side checks the descriptor, then
//!   READs the active buffer into its own.
//!
//! Requests, replies and aborts travel as RDMA SENDs on the eager path
//! (or, when they do not fit a slot, on an out-of-band TCP connection per
//! peer, which also sets the queue pairs up and stays open as the liveness
//! channel: a peer process that dies closes it, and everything in flight
//! with it fails once, after its work requests retired). See `DESIGN.md` in
//! the crate for the protocol.
//!
//! Each domain has an engine thread of its own, or shares one of an
//! [`RdmaEngine`] ([`RdmaConfig::shared`]) with other domains.
//!
//! Addresses are `a.b.c.d:port:service`, as for the TCP transport: the TCP
//! control listener is at `a.b.c.d:port`. The RDMA device is the first one
//! (or [`RdmaConfig::device`]); on a machine without one, creating a domain
//! fails with a clear error:
//!
//! ```
//! use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
//! use colibri_net::Domain;
//!
//! let xprt = RdmaTransport::new(RdmaConfig::default());
//! match Domain::new(&xprt) {
//!     Ok(dom) => dom.fini().unwrap(), // a machine with an RDMA device
//!     Err(e) => assert!(e.to_string().contains("RDMA"), "{e}"),
//! }
//! ```

mod engine;
mod plan;
mod tm;
mod verbs;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use colibri_net::bufvec::BufVec;
use colibri_net::xprt::{Caps, Limits, TmSink, Transport, XprtData, XprtDomain, XprtTm};
use colibri_net::{Result, TmId};

use crate::engine::Engine;
use crate::plan::{Reg, RegSeg};
use crate::verbs::Device;

/// Identifier stamped into this transport's descriptors ("RDM1").
pub const RDMA_TRANSPORT_ID: u32 = u32::from_le_bytes(*b"RDM1");

/// Configuration of the RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Device name (`rxe0`, `mlx5_0`, ...); `None` takes the first one.
    pub device: Option<String>,
    /// How long the engine polls after its last piece of work before it
    /// arms the completion queue and sleeps. `Duration::ZERO` sleeps at
    /// once; `Duration::MAX` never sleeps.
    pub spin: Duration,
    /// Completion queue entries (capped by the device's `max_cqe`); also
    /// bounds the work requests outstanding on the engine.
    pub cq_depth: usize,
    /// Send queue depth of each queue pair (capped by `max_qp_wr`).
    pub sq_depth: usize,
    /// Local ACK timeout exponent of the queue pairs (4.096 µs × 2^n).
    pub qp_timeout: u8,
    /// Transport retries of the queue pairs, at most 6: rxe treats 7 as
    /// "retry for ever", which would never report a dead peer.
    pub retry_cnt: u8,
    /// How long a control connection may take to be set up.
    pub connect_timeout: Duration,
    /// How long a silent peer may take to answer TCP keepalive probes (and
    /// to acknowledge data) on a control connection before the connection
    /// is declared dead (`SO_KEEPALIVE` timers and `TCP_USER_TIMEOUT`);
    /// `None` leaves the kernel's defaults.
    pub peer_timeout: Option<Duration>,
    /// How long an aborted request may wait for the peer's reply before
    /// the connection is declared dead.
    pub abort_timeout: Duration,
    /// Eager receive slots (of `wire::SLOT_SIZE` bytes) posted per
    /// connection for the peer's SENDs, capped by the device's `max_qp_wr`
    /// and a quarter of the CQ (all connections together hold at most half
    /// of it). 0 turns the eager path off: every frame travels on the TCP
    /// connection and every message is READ by its receiver. The default
    /// is 32, or `COLIBRI_RDMA_EAGER_SLOTS` from the environment (to
    /// compare both protocols with the same binary, as `bench-vm.sh`
    /// does).
    pub eager_slots: usize,
    /// Size limits (the segment size is further capped by the device).
    pub limits: Limits,
    /// A shared engine whose threads serve the domains made with this
    /// configuration, instead of a thread (and a device context) of their
    /// own each; the engine settings above are then the engine's. See
    /// [`RdmaEngine`].
    pub engine: Option<RdmaEngine>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            device: std::env::var("RDMA_VM_DEVICE").ok(),
            spin: Duration::from_micros(50),
            cq_depth: 4096,
            sq_depth: 256,
            qp_timeout: 14,
            retry_cnt: 6,
            connect_timeout: Duration::from_secs(20),
            peer_timeout: Some(Duration::from_secs(60)),
            abort_timeout: Duration::from_secs(30),
            eager_slots: std::env::var("COLIBRI_RDMA_EAGER_SLOTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(32),
            limits: Limits::new(64 << 20, 16 << 20, 4096, 1024),
            engine: None,
        }
    }
}

impl RdmaConfig {
    /// An engine that sleeps as soon as it is idle.
    pub fn blocking() -> Self {
        Self {
            spin: Duration::ZERO,
            ..Self::default()
        }
    }

    /// An engine that polls for a millisecond before it sleeps.
    pub fn polling() -> Self {
        Self {
            spin: Duration::from_millis(1),
            ..Self::default()
        }
    }

    /// Domains served by the threads of `engine` (with its settings).
    pub fn shared(engine: &RdmaEngine) -> Self {
        Self {
            engine: Some(engine.clone()),
            ..engine.0.cfg.clone()
        }
    }
}

/// A device context, its engine thread and the limits they give.
#[derive(Debug)]
struct Served {
    dev: Arc<Device>,
    engine: Arc<Engine>,
    limits: Limits,
}

impl Served {
    /// Opens the device of `cfg` and starts an engine thread on it.
    fn start(cfg: &RdmaConfig) -> Result<Self> {
        let dev = Device::open(cfg.device.as_deref())?;
        let lim = dev.limits();
        let seg_cap =
            usize::try_from(lim.max_mr_size.min(u64::from(u32::MAX))).unwrap_or(usize::MAX);
        let l = cfg.limits;
        let limits = Limits::new(
            l.max_buffer_size,
            l.max_segment_size.min(seg_cap),
            l.max_segments.min(wire::MAX_SEGS),
            l.max_desc_size,
        );
        let name = format!("colibri-rdma-{}", dev.name());
        let cfg = RdmaConfig {
            engine: None,
            ..cfg.clone()
        };
        let engine = Engine::spawn(Arc::clone(&dev), cfg, limits, name)?;
        Ok(Self {
            dev,
            engine,
            limits,
        })
    }
}

/// A fixed set of engine threads, each with its own device context,
/// protection domain and completion queue, serving the transfer machines
/// of any number of RDMA domains (those whose [`RdmaConfig::engine`] names
/// it), as `colibri_bulk_tcp::TcpEngine` does for TCP.
///
/// Without one, each domain opens the device and runs an engine thread of
/// its own. Two domains of one process then exchange every message
/// through two threads: on a machine with few CPUs (or a VM), each round
/// trip pays for waking (or scheduling) the other thread. With an engine of
/// `n` threads, domains are dealt to the threads in turn; a thread serves
/// its domains' listeners, queue pairs, completions, timers and callbacks
/// in one loop, as it would one domain's, and domains on one thread share
/// its protection domain (a queue pair of the thread may then touch the
/// registrations of any domain the thread serves, which only matters
/// between domains of one process) and its outgoing connections. With
/// one thread, a message between two domains of the process and its
/// echo are posted, received and answered by that thread alone.
///
/// The trade-off: a domain's work waits behind the other domains' on its
/// thread, and the thread cannot be confined to CPUs for one domain
/// (`confine` is refused). The threads stop when the engine and every
/// domain using it are gone.
///
/// ```
/// use colibri_bulk_rdma::{RdmaConfig, RdmaEngine, RdmaTransport};
/// use colibri_net::Domain;
///
/// match RdmaEngine::new(1, &RdmaConfig::default()) {
///     Ok(engine) => {
///         let xprt = RdmaTransport::new(RdmaConfig::shared(&engine));
///         let a = Domain::new(&xprt).unwrap();
///         let b = Domain::new(&xprt).unwrap();
///         assert_eq!(engine.threads(), 1);
///         a.fini().unwrap();
///         b.fini().unwrap();
///     }
///     // A machine without an RDMA device.
///     Err(e) => assert!(e.to_string().contains("RDMA"), "{e}"),
/// }
/// ```
#[derive(Clone)]
pub struct RdmaEngine(Arc<EnginePool>);

struct EnginePool {
    cfg: RdmaConfig,
    threads: Vec<Served>,
    next: AtomicUsize,
}

impl std::fmt::Debug for RdmaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaEngine")
            .field("threads", &self.0.threads.len())
            .finish_non_exhaustive()
    }
}

impl RdmaEngine {
    /// Opens the device `threads` times (at least once) and starts an
    /// engine thread on each context, with the settings of `cfg` (device,
    /// `spin`, queue depths, timeouts, eager slots, limits).
    ///
    /// # Errors
    /// No RDMA device (or not the one named), or the device or the system
    /// refused a context, a completion queue or a thread.
    pub fn new(threads: usize, cfg: &RdmaConfig) -> Result<Self> {
        let cfg = RdmaConfig {
            engine: None,
            ..cfg.clone()
        };
        let mut started = Vec::new();
        for _ in 0..threads.max(1) {
            match Served::start(&cfg) {
                Ok(s) => started.push(s),
                Err(e) => {
                    for s in &started {
                        s.engine.release_user();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self(Arc::new(EnginePool {
            cfg,
            threads: started,
            next: AtomicUsize::new(0),
        })))
    }

    /// Its engine threads.
    pub fn threads(&self) -> usize {
        self.0.threads.len()
    }

    /// The thread for one more domain (in turn).
    fn take(&self) -> RdmaDomain {
        let k = self.0.next.fetch_add(1, Ordering::Relaxed) % self.0.threads.len();
        let s = &self.0.threads[k];
        s.engine.add_user();
        RdmaDomain {
            dev: Arc::clone(&s.dev),
            engine: Arc::clone(&s.engine),
            limits: s.limits,
            shared: true,
            finalized: AtomicBool::new(false),
        }
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        for s in &self.threads {
            s.engine.release_user();
        }
    }
}

/// The RDMA transport.
#[derive(Debug, Clone, Default)]
pub struct RdmaTransport {
    cfg: RdmaConfig,
}

impl RdmaTransport {
    /// A transport with the given configuration.
    pub fn new(cfg: RdmaConfig) -> Self {
        Self { cfg }
    }

    /// Its configuration.
    pub fn config(&self) -> &RdmaConfig {
        &self.cfg
    }
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        if let Some(shared) = &self.cfg.engine {
            return Ok(Box::new(shared.take()));
        }
        let s = Served::start(&self.cfg)?;
        Ok(Box::new(RdmaDomain {
            dev: s.dev,
            engine: s.engine,
            limits: s.limits,
            shared: false,
            finalized: AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct RdmaDomain {
    dev: Arc<Device>,
    engine: Arc<Engine>,
    limits: Limits,
    /// Served by a shared engine's thread (which `confine` may not pin).
    shared: bool,
    finalized: AtomicBool,
}

impl XprtDomain for RdmaDomain {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn caps(&self) -> Caps {
        let caps = Caps::new(RDMA_TRANSPORT_ID)
            .with_sync_delivery()
            .with_multi_message()
            .with_timeouts();
        if self.shared {
            caps
        } else {
            caps.with_confine()
        }
    }

    fn buf_register(&self, bufvec: &BufVec) -> Result<Option<XprtData>> {
        let mut segs = Vec::with_capacity(bufvec.nr_segments());
        for s in bufvec.segments() {
            let mr = if s.is_empty() {
                None
            } else {
                Some(self.dev.register(s.as_ptr(), s.len())?)
            };
            segs.push(RegSeg {
                addr: s.as_ptr() as u64,
                len: s.len() as u64,
                mr,
            });
        }
        Ok(Some(Arc::new(Reg { segs })))
    }

    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        Ok(Box::new(tm::RdmaTm::new(
            tm,
            Arc::clone(&self.engine),
            sink,
        )))
    }

    /// Leaves the engine: the domain's own engine stops (fencing its
    /// connections); a shared one stops when its last user leaves.
    fn fini(&self) {
        if !self.finalized.swap(true, Ordering::AcqRel) {
            self.engine.release_user();
        }
    }
}

impl Drop for RdmaDomain {
    fn drop(&mut self) {
        self.fini();
    }
}
