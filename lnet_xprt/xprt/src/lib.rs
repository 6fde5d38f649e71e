//! # colibri-lnet-xprt: the LNet transport
//!
//! Transfer machines over LNet ([`colibri_lnet_rt::Lnet`]): the same
//! application code that runs over the in-memory and TCP transports runs
//! over LNet's loopback and socket LNDs, its routers and its Multi-Rail
//! peers.
//!
//! * Addresses are Motr's `NID:PID:PORTAL:TMID` ([`LnetAddr`]), for example
//!   `127.0.0.1@tcp:12345:30:5`; a TMID of `*` asks for the highest free one
//!   at start. The NID must be one of the transport's LNet nodes' NIDs (or
//!   `0@lo`).
//! * Every queued buffer is MD memory in place (no copy in user space): the
//!   runtime reads and writes its segments through
//!   [`colibri_lnet_rt::ForeignMemory`].
//! * MSG_RECV: an ME on the transfer machine's portal matching its TMID
//!   and MD threshold = maximum messages, `MAX_SIZE` = minimum receive size
//!   (several messages per buffer, placed by LNet). MSG_SEND: a PUT whose
//!   header data names the sender's portal, TMID and a sequence number;
//!   the receiver answers DELIVERED once it posted the message, or a NAK:
//!   `NoBuffers` (a catch-all MD takes messages no buffer took, and counts
//!   them), `MessageTooLarge`, or `Unreachable` from what a stopped machine
//!   left behind.
//! * Bulk: the active side asks the passive transfer machine with a control
//!   message; the passive side runs the core's checks (cookie, owner, actor,
//!   queue pairing, sizes), attaches an ME with the buffer's unique match
//!   bits and answers; then the active side GETs or PUTs against it.
//!
//! See `DESIGN.md` in the crate folder for the match-bit layout, the
//! descriptor's bytes and what a cancel does at each stage.
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet_rt::{Lnet, LnetConfig};
//! use colibri_lnet_xprt::LnetTransport;
//! use colibri_net::{BufVec, Domain, QueueType, RecvParams, TmState, event_channel, ignore_tm_events};
//!
//! let mut cfg = LnetConfig::new(&["127.0.9.1@tcp".parse()?]);
//! cfg.accept_port = 0;
//! let xprt = LnetTransport::new(vec![Lnet::start(cfg)?], Default::default())?;
//! let dom = Domain::new(&xprt)?;
//! let (cbs, events) = event_channel(16);
//! let tm = dom.tm_init(ignore_tm_events())?;
//! tm.start("127.0.9.1@tcp:12345:30:*")?;
//! tm.wait_for_state(TmState::Started, Duration::from_secs(10))?;
//! let me = tm.ep().expect("started");
//! // A message to ourselves.
//! tm.add_msg_recv(dom.register(BufVec::new(1, 64))?.with_callbacks(cbs.clone()), RecvParams::default())?;
//! let mut b = dom.register(BufVec::new(1, 64))?.with_callbacks(cbs);
//! b.bufvec_mut().copy_in(0, b"hello")?;
//! tm.add_msg_send(b, &me, 5)?;
//! let mut got = Vec::new();
//! while got.len() < 2 {
//!     let ev = events.recv_timeout(Duration::from_secs(10))?;
//!     assert!(ev.is_ok(), "{ev:?}");
//!     if ev.queue() == QueueType::MsgRecv {
//!         assert_eq!(ev.message()?, b"hello");
//!     }
//!     got.push(ev);
//! }
//! drop((got, me));
//! tm.stop(false)?;
//! tm.wait_stopped(Duration::from_secs(10))?;
//! tm.fini().map_err(|e| e.error)?;
//! dom.fini().map_err(|e| e.error)?;
//! xprt.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod addr;
mod ctl;
mod desc;
mod engine;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod lane;
mod tm;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colibri_lnet_rt::Lnet;
use colibri_lnet_rt::colibri_lnet::ids::Nid;
use colibri_lnet_rt::colibri_lnet::wire::LNET_MTU;
use colibri_net::xprt::{Caps, Limits, TmSink, Transport, XprtDomain, XprtTm};
use colibri_net::{Result, TmId};

pub use addr::LnetAddr;

use crate::engine::Engine;

/// Largest buffer: a bulk transfer of 64 one-MiB chunks.
pub const MAX_BUFFER: usize = 64 * LNET_MTU as usize;

/// Identifier stamped into this transport's descriptors ("LNT1").
pub const LNET_TRANSPORT_ID: u32 = u32::from_le_bytes(*b"LNT1");

/// Configuration of the LNet transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LnetXprtConfig {
    /// How long an active bulk operation waits for the passive side's
    /// answer to its request before it fails with `Unreachable`, and how
    /// long a passive buffer stays claimed for a request whose GET or PUT
    /// does not come (it is then available again).
    pub handshake_timeout: Duration,
    /// Gives every transfer machine its own delivery thread: its callbacks
    /// run there, so a slow callback delays only its own machine, and the
    /// node's engine thread never waits for the application; and
    /// [`TmHandle::confine`](colibri_net::TmHandle::confine) pins that
    /// thread (`Caps::confine` is declared only then). Off by default: the
    /// engine thread runs the callbacks of its node's machines, one thread
    /// switch less per event (BENCHMARKS.md compares the two).
    pub thread_per_tm: bool,
    /// How long a node's engine thread keeps looking for its next event
    /// after its last one before it sleeps, giving the CPU to any other
    /// runnable thread between looks (`sched_yield`). An event that comes
    /// meanwhile is taken without a thread wake-up (15-20 µs across cores
    /// on a VM; the 64 B round trip is about 1.6x shorter with the
    /// default, BENCHMARKS.md). `Duration::ZERO` sleeps at once (no CPU
    /// spent waiting). Default 50 µs, as [`TcpConfig::spin`].
    ///
    /// [`TcpConfig::spin`]: https://docs.rs/colibri-bulk-tcp
    pub spin: Duration,
    /// The transport's first operation id. Operation ids name
    /// bulk requests and sends on the wire (their low 24 bits in match
    /// bits and header data), and a process that restarts at the same
    /// address must not reuse those of its last incarnation, which its
    /// peers may still hold claims and answers for. `None` (the default)
    /// draws the first id from the clock and the process id, as
    /// Lustre seeds its RPC xids from the clock; tests that forge answers
    /// for every id an operation can have name a small one.
    pub first_op_id: Option<u64>,
}

impl Default for LnetXprtConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            thread_per_tm: false,
            spin: Duration::from_micros(50),
            first_op_id: None,
        }
    }
}

impl LnetXprtConfig {
    /// Sets the bulk handshake timeout.
    #[must_use]
    pub fn handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self
    }

    /// Sets how long the engine threads look for work before they sleep
    /// ([`LnetXprtConfig::spin`]).
    #[must_use]
    pub fn spin(mut self, t: Duration) -> Self {
        self.spin = t;
        self
    }

    /// Gives every transfer machine its own delivery thread
    /// ([`LnetXprtConfig::thread_per_tm`]).
    #[must_use]
    pub fn thread_per_tm(mut self, on: bool) -> Self {
        self.thread_per_tm = on;
        self
    }

    /// Sets the transport's first operation id
    /// ([`LnetXprtConfig::first_op_id`]).
    #[must_use]
    pub fn first_op_id(mut self, id: Option<u64>) -> Self {
        self.first_op_id = id;
        self
    }
}

/// State shared by the transport, its domains and transfer machines.
#[derive(Debug)]
pub(crate) struct XprtInner {
    pub(crate) engines: Vec<Arc<Engine>>,
    /// Every transfer machine gets its own delivery thread.
    pub(crate) thread_per_tm: bool,
    /// Transfer machine states alive (see [`LnetTransport::held_machines`]).
    pub(crate) held: Arc<AtomicUsize>,
}

/// Counts one transfer machine state while it exists.
#[derive(Debug)]
pub(crate) struct Held(Arc<AtomicUsize>);

impl Held {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(count))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl XprtInner {
    /// The engine of the node owning `nid` (`0@lo`: the first).
    pub(crate) fn engine_for(&self, nid: Nid) -> Option<Arc<Engine>> {
        if nid.is_lo() {
            return self.engines.first().cloned();
        }
        self.engines.iter().find(|e| e.nids.contains(&nid)).cloned()
    }
}

impl Drop for XprtInner {
    fn drop(&mut self) {
        for e in &self.engines {
            e.stop();
        }
    }
}

/// The LNet transport over one or more LNet nodes of this process.
#[derive(Debug, Clone)]
pub struct LnetTransport {
    inner: Arc<XprtInner>,
    nodes: Vec<Lnet>,
}

impl LnetTransport {
    /// A transport over these LNet nodes. Each must have been started
    /// with [`Lnet::start`] (events to its queue): the transport consumes
    /// the node's events from now on, on one thread per node, which also
    /// runs the transfer machines' callbacks, unless each machine has its
    /// own thread ([`LnetXprtConfig::thread_per_tm`]).
    ///
    /// # Errors
    /// No node, or a node that delivers its events to a handler.
    pub fn new(nodes: Vec<Lnet>, cfg: LnetXprtConfig) -> Result<Self> {
        if nodes.is_empty() {
            return Err(colibri_net::NetError::InvalidArgument(
                "an LNet transport needs at least one LNet node".into(),
            ));
        }
        let mut engines = Vec::with_capacity(nodes.len());
        let first = cfg
            .first_op_id
            .map_or_else(engine::first_op_id, |i| i.max(1));
        let ids = Arc::new(std::sync::atomic::AtomicU64::new(first));
        for n in &nodes {
            engines.push(Engine::start(n.clone(), &cfg, Arc::clone(&ids))?);
        }
        Ok(Self {
            inner: Arc::new(XprtInner {
                engines,
                thread_per_tm: cfg.thread_per_tm,
                held: Arc::new(AtomicUsize::new(0)),
            }),
            nodes,
        })
    }

    /// How many transfer machine states the transport still holds: one
    /// per machine not finalised yet, and one per finalised machine that
    /// LNet still has something of (an operation whose last event has not
    /// come, bounded by the handshake or the LNet transaction timeout, or
    /// the tomb left at its address until another machine starts there).
    /// It does not grow with the machines a process started and
    /// finalised over its life: a diagnostic for tests and soaks.
    pub fn held_machines(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// The LNet nodes.
    pub fn nodes(&self) -> &[Lnet] {
        &self.nodes
    }

    /// Shuts the LNet nodes down (operations in flight end with their
    /// errors).
    pub fn shutdown(&self) {
        for n in &self.nodes {
            n.shutdown();
        }
    }
}

impl Transport for LnetTransport {
    fn name(&self) -> &'static str {
        "lnet"
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(LnetDomain {
            inner: parking_lot::Mutex::new(Some(Arc::clone(&self.inner))),
            thread_per_tm: self.inner.thread_per_tm,
        }))
    }
}

#[derive(Debug)]
struct LnetDomain {
    /// Let go at the domain's fini, so that the transport (and its claim
    /// on each node's events) ends when its last handle is dropped, not
    /// whenever the core lets go of the domain's state.
    inner: parking_lot::Mutex<Option<Arc<XprtInner>>>,
    thread_per_tm: bool,
}

impl XprtDomain for LnetDomain {
    fn name(&self) -> &'static str {
        "lnet"
    }

    fn limits(&self) -> Limits {
        // A message is one LNet message (LNET_MTU, 1 MiB); bulk goes in
        // 1 MiB chunks, 256 at most (the chunk bits of the match bits).
        Limits::new(MAX_BUFFER, MAX_BUFFER, 256, 1024)
    }

    fn caps(&self) -> Caps {
        let c = Caps::new(LNET_TRANSPORT_ID)
            .with_sync_delivery()
            .with_multi_message()
            .with_timeouts()
            .with_network_owned();
        // Only a machine's own thread can be confined: the engine thread
        // serves every machine of its node.
        if self.thread_per_tm {
            c.with_confine()
        } else {
            c
        }
    }

    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        let inner = self.inner.lock().clone().ok_or_else(|| {
            colibri_net::NetError::InvalidArgument("the domain was finalised".into())
        })?;
        Ok(Box::new(tm::LnetTm::new(tm, sink, &inner)?))
    }

    fn fini(&self) {
        self.inner.lock().take();
    }
}
