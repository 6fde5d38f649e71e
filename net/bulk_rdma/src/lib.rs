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
        let dev = Device::open(self.cfg.device.as_deref())?;
        let lim = dev.limits();
        let seg_cap =
            usize::try_from(lim.max_mr_size.min(u64::from(u32::MAX))).unwrap_or(usize::MAX);
        let l = self.cfg.limits;
        let limits = Limits::new(
            l.max_buffer_size,
            l.max_segment_size.min(seg_cap),
            l.max_segments.min(wire::MAX_SEGS),
            l.max_desc_size,
        );
        let name = format!("colibri-rdma-{}", dev.name());
        let engine = Engine::spawn(Arc::clone(&dev), self.cfg.clone(), limits, name)?;
        Ok(Box::new(RdmaDomain {
            dev,
            engine,
            limits,
        }))
    }
}

#[derive(Debug)]
struct RdmaDomain {
    dev: Arc<Device>,
    engine: Arc<Engine>,
    limits: Limits,
}

impl XprtDomain for RdmaDomain {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn caps(&self) -> Caps {
        Caps::new(RDMA_TRANSPORT_ID)
            .with_sync_delivery()
            .with_multi_message()
            .with_timeouts()
            .with_confine()
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

    fn fini(&self) {
        self.engine.shutdown();
    }
}

impl Drop for RdmaDomain {
    fn drop(&mut self) {
        self.engine.shutdown();
    }
}
