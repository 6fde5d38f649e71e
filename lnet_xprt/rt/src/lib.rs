//! # colibri-lnet-rt: LNet goes live
//!
//! The runtime that drives the sans-IO LNet core ([`colibri_lnet`]) with real
//! time, real threads and real sockets:
//!
//! * [`Lnet`]: a cloneable handle on one LNet node. The node lives behind
//!   one lock; a runtime thread runs its timers and the loopback LND; events
//!   go to an event queue ([`Lnet::next_event`]) or to a handler
//!   ([`Lnet::start_with_handler`]) and are delivered without any runtime
//!   lock held.
//! * [`MemRegion`]: memory the application owns. Register it
//!   ([`Lnet::register`]) and build MDs over ranges of it; the runtime reads
//!   and writes payloads in place (no copy into memory of its own).
//! * The API of Lustre's LNet: [`Lnet::me_attach`], [`Lnet::md_attach`],
//!   [`Lnet::md_bind`], [`Lnet::put`], [`Lnet::get`], [`Lnet::md_unlink`],
//!   [`Lnet::ping`], [`Lnet::discover`], and the DLC calls (NIs, peers,
//!   routes, routing, discovery, fault rules).
//! * Two LNDs: loopback (`0@lo` and our own NIDs, one memory-to-memory
//!   move as Lustre's lolnd) and Lustre's socket LND on `tcp` nets
//!   (acceptor, typed connections, V3 HELLO, zero-copy sends and receives).
//! * A node as a process, configured the way `lnetctl` does it:
//!   [`conf`] (the `lnetctl export` YAML shape, read with warnings and
//!   written back), [`yaml`] (`lnetctl`'s YAML layout), [`ctl`] (the
//!   control socket: a versioned request/reply protocol over a Unix socket,
//!   the node-side handlers of `lnetctl`'s commands, fault rules and an
//!   `lst`-like selftest). The `colibri lnet` command is its client.
//!
//! See `DESIGN.md` in the crate folder for threads, locks, the control
//! protocol and what is compatible with Lustre.
//!
//! ## Example
//!
//! A node PUTs five bytes to itself (through the loopback LND) into a
//! buffer it posted, with an ACK:
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
//! use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
//! use colibri_lnet_rt::colibri_lnet::matching::{
//!     EventKind, InsertPos, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
//! };
//!
//! let me: Nid = "127.0.0.1@tcp".parse()?;
//! let mut cfg = LnetConfig::new(&[me]);
//! cfg.accept_port = 0; // any free port
//! let lnet = Lnet::start(cfg)?;
//!
//! // The target buffer: an ME on portal 5 and an MD over 16 bytes.
//! let inbox = MemRegion::zeroed(16);
//! let key = lnet.register(&inbox);
//! let me_h = lnet.me_attach(MeSpec {
//!     portal: 5,
//!     match_id: ProcessId::ANY,
//!     match_bits: 7,
//!     ignore_bits: 0,
//!     unlink: Unlink::Retain,
//!     pos: InsertPos::After,
//! })?;
//! lnet.md_attach(me_h, MdSpec::new(MemRef::new(key, 0, 16), MdOptions::OP_PUT))?;
//!
//! // The source: a bound MD (threshold 2: SEND and ACK).
//! let data = MemRegion::from_vec(b"hello".to_vec());
//! let dkey = lnet.register(&data);
//! let md = lnet.md_bind(MdSpec::new(MemRef::new(dkey, 0, 5), MdOptions::empty())
//!     .threshold(Threshold::Count(2)))?;
//! lnet.put(md, true, ProcessId::lustre(me), 5, 7, 0, 0)?;
//!
//! let mut kinds = Vec::new();
//! while kinds.len() < 3 {
//!     kinds.push(lnet.next_event(Duration::from_secs(5))?.kind());
//! }
//! assert!(kinds.contains(&EventKind::Put) && kinds.contains(&EventKind::Ack));
//! assert_eq!(&inbox.to_vec()[..5], b"hello");
//! lnet.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two nodes over the socket LND (listening on free ports, so each is told
//! where the other is); `b` serves a GET from its memory:
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
//! use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
//! use colibri_lnet_rt::colibri_lnet::matching::{
//!     EventKind, InsertPos, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
//! };
//!
//! let (na, nb): (Nid, Nid) = ("127.0.10.1@tcp".parse()?, "127.0.10.2@tcp".parse()?);
//! let start = |nid| {
//!     let mut cfg = LnetConfig::new(&[nid]);
//!     cfg.accept_port = 0;
//!     Lnet::start(cfg)
//! };
//! let (a, b) = (start(na)?, start(nb)?);
//! a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
//! b.set_peer_addr(na, a.listen_addr(na).unwrap());
//!
//! let served = MemRegion::from_vec(b"served from b's memory".to_vec());
//! let skey = b.register(&served);
//! let me = b.me_attach(MeSpec {
//!     portal: 6,
//!     match_id: ProcessId::ANY,
//!     match_bits: 1,
//!     ignore_bits: 0,
//!     unlink: Unlink::Retain,
//!     pos: InsertPos::After,
//! })?;
//! b.md_attach(me, MdSpec::new(MemRef::new(skey, 0, 22), MdOptions::OP_GET))?;
//!
//! let sink = MemRegion::zeroed(22);
//! let key = a.register(&sink);
//! let md = a.md_bind(MdSpec::new(MemRef::new(key, 0, 22), MdOptions::empty())
//!     .threshold(Threshold::Count(2)))?;
//! a.get(md, ProcessId::lustre(nb), 6, 1, 0)?;
//! while a.next_event(Duration::from_secs(10))?.kind() != EventKind::Reply {}
//! assert_eq!(sink.to_vec(), b"served from b's memory");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// `unsafe` is confined to the `splice` module and the socket LND's `link`
// module (system calls the standard library does not wrap: splice, tee,
// pipe sizes; getifaddrs).
#![deny(unsafe_code)]

pub mod conf;
mod config;
mod core;
pub mod ctl;
mod error;
pub mod legacy;
mod mem;
mod sock;
#[allow(unsafe_code)]
mod splice;
mod stats;
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub mod testing;
pub mod yaml;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

pub use colibri_lnet;
use colibri_lnet::fault::{DelayRuleSpec, DropRuleSpec, FaultStats, RuleId};
use colibri_lnet::ids::{Net, Nid, ProcessId};
use colibri_lnet::matching::{Event, MdHandle, MdSpec, MeHandle, MeSpec, MemKey, MemRef};
use colibri_lnet::node::{NiConfig, Node, NodeError, NodeStats, ResponseTracking};
use colibri_lnet::time::Time;
use colibri_lnet::wire::PingInfo;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

pub use crate::config::LnetConfig;
pub use crate::core::{EventHook, HookCall};
use crate::core::{Lnd, RtMsg, Shared};
pub use crate::error::LnetError;
use crate::mem::RouterBuffers;
pub use crate::mem::{ForeignMemory, MemRegion};
use crate::sock::{SockCfg, SockLnd};
pub use crate::splice::PIPE_BYTES;
pub use crate::stats::RuntimeStats;

const TARGET: &str = "colibri_lnet_rt";

/// The operation [`Lnet::bind_start`] starts on the MD it binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// `LNetPut` of the whole MD (see [`Lnet::put`]).
    Put {
        /// Ask for an ACK (the MD then needs threshold 2).
        ack: bool,
        /// The receiving process.
        target: ProcessId,
        /// Its portal.
        portal: u32,
        /// Match bits.
        match_bits: u64,
        /// Offset the sender asks for in the receiver's MD.
        offset: u32,
        /// Header data carried with the PUT.
        hdr_data: u64,
    },
    /// `LNetGet` into the MD (see [`Lnet::get`]).
    Get {
        /// The process asked for the data.
        target: ProcessId,
        /// Its portal.
        portal: u32,
        /// Match bits.
        match_bits: u64,
        /// Offset in the target's MD.
        offset: u32,
    },
}

impl Start {
    /// Starts the operation from `md` (`LNetPut` or `LNetGet`).
    fn on(self, node: &mut Node, now: Time, md: MdHandle) -> Result<(), NodeError> {
        match self {
            Self::Put {
                ack,
                target,
                portal,
                match_bits,
                offset,
                hdr_data,
            } => node.put(now, md, ack, target, portal, match_bits, offset, hdr_data),
            Self::Get {
                target,
                portal,
                match_bits,
                offset,
            } => node.get(now, md, target, portal, match_bits, offset),
        }
    }
}

/// A running LNet node: a cheap, cloneable handle. The runtime stops when
/// [`Lnet::shutdown`] is called or the last handle is dropped.
#[derive(Clone)]
pub struct Lnet {
    h: Arc<Handle>,
}

impl std::fmt::Debug for Lnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lnet")
            .field("nids", &self.nids())
            .finish_non_exhaustive()
    }
}

struct Handle {
    shared: Arc<Shared>,
    events: Option<Receiver<Event>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The event handler's thread, stopped last, and its stop signal.
    handler: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        stop(self);
    }
}

fn stop(h: &Handle) {
    let (shared, threads) = (&h.shared, &h.threads);
    if shared.shutdown.swap(true, Ordering::AcqRel) {
        return;
    }
    tracing::debug!(target: TARGET, "LNet runtime shutting down");
    if let Some(lnd) = shared.lnd.get() {
        lnd.shutdown(shared);
    }
    let _ = shared.rt_tx.send(RtMsg::Stop);
    let current = std::thread::current().id();
    for t in threads.lock().drain(..) {
        if t.thread().id() != current {
            let _ = t.join();
        }
    }
    // Events produced while stopping are delivered before the handler's
    // thread ends.
    if let Some((stop_tx, t)) = h.handler.lock().take() {
        let _ = stop_tx.send(());
        if t.thread().id() != current {
            let _ = t.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, LnetError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map_err(|source| LnetError::Io {
            what: format!("spawning thread {name}"),
            source,
        })
}

impl Lnet {
    /// Starts a node whose events go to a queue read with
    /// [`Lnet::next_event`] or [`Lnet::event_queue`] (unbounded: drain it).
    ///
    /// # Errors
    /// An invalid configuration (unsupported LND type, bad tunables), or a
    /// listener that cannot be bound.
    pub fn start(cfg: LnetConfig) -> Result<Self, LnetError> {
        Self::start_inner(cfg, None)
    }

    /// Starts a node whose events are given to `handler`, on a thread of
    /// its own, in the node's order, with no runtime lock held (the handler
    /// may call back into the [`Lnet`], blocking calls such as
    /// [`Lnet::ping`] included). Events wait in an unbounded queue while
    /// the handler runs. A handler that keeps an [`Lnet`] handle keeps the
    /// runtime alive: call [`Lnet::shutdown`] then.
    ///
    /// # Errors
    /// As [`Lnet::start`].
    pub fn start_with_handler(
        cfg: LnetConfig,
        handler: impl FnMut(Event) + Send + 'static,
    ) -> Result<Self, LnetError> {
        Self::start_inner(cfg, Some(Box::new(handler)))
    }

    fn start_inner(
        mut cfg: LnetConfig,
        handler: Option<Box<dyn FnMut(Event) + Send>>,
    ) -> Result<Self, LnetError> {
        for ni in &cfg.node.nis {
            check_lnd(ni.nid)?;
        }
        cfg.tcp
            .validate()
            .map_err(|e| LnetError::Config(e.to_string()))?;
        let salt = wall_nanos();
        if cfg.node.seed == 0 {
            cfg.node.seed = salt;
        }
        let node = Node::new(cfg.node.clone())?;
        // The runtime thread's queue holds loopback transmits (bounded by
        // the node's messages in flight) and wake-ups (one per earlier
        // deadline): bounded elsewhere.
        #[allow(clippy::disallowed_methods)]
        let (rt_tx, rt_rx) = crossbeam_channel::unbounded();
        // Events: one per MD operation step; the application drains them.
        #[allow(clippy::disallowed_methods)]
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared::new(
            node,
            rt_tx,
            ev_tx,
            RouterBuffers::new(cfg.splice_pipes, cfg.splice_pipe_bytes),
        ));
        let mut threads = Vec::new();
        let s = shared.clone();
        let tick = cfg.tick;
        threads.push(spawn("lnet-rt", move || s.runtime_thread(rt_rx, tick))?);
        let (events, handler) = match handler {
            Some(h) => {
                let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
                let t = spawn("lnet-events", move || core::event_thread(ev_rx, stop_rx, h))?;
                (None, Some((stop_tx, t)))
            }
            None => (Some(ev_rx), None),
        };
        let lnet = Self {
            h: Arc::new(Handle {
                shared: shared.clone(),
                events,
                threads: Mutex::new(threads),
                handler: Mutex::new(handler),
            }),
        };
        // The socket LND, for the tcp NIs (and any added later).
        let nscheds = if cfg.tcp.nscheds > 0 {
            cfg.tcp.nscheds as usize
        } else {
            cfg.nscheds
        };
        let nconnds = if cfg.nconnds > 0 {
            cfg.nconnds
        } else {
            cfg.tcp.nconnds as usize
        };
        let sock_cfg = SockCfg {
            tun: cfg.tcp.clone(),
            accept: cfg.accept,
            accept_port: cfg.accept_port,
            accept_port_bulk: cfg.accept_port_bulk,
            accept_timeout: cfg.accept_timeout,
            reserved_ports: cfg.reserved_ports,
            pid: cfg.node.pid,
            sock_timeout: cfg.tcp.sock_timeout,
            lnd_timeout: lnet.with_node(|n| n.health().config().lnd_timeout()),
            keepalive: cfg.tcp.keepalive_after(),
            conns_per_peer: cfg.tcp.conns_per_peer_for_speed(None),
            spin: cfg.spin,
            link_down_ips: cfg.link_down_ips.clone(),
        };
        let lnd = SockLnd::start(&shared, sock_cfg, cfg.peers.clone(), nscheds, nconnds)?;
        let _ = shared.lnd.set(lnd.clone());
        for ni in &cfg.node.nis {
            if is_tcp(ni.nid) {
                lnd.add_ni(
                    ni.nid,
                    cfg.listen.get(&ni.nid).copied(),
                    salt,
                    ni.conns_per_peer,
                    ni.tos,
                )?;
            }
        }
        tracing::info!(target: TARGET, nids = ?lnet.nids(), "LNet runtime started");
        Ok(lnet)
    }

    fn shared(&self) -> &Shared {
        &self.h.shared
    }

    fn live(&self) -> Result<&Shared, LnetError> {
        let s = self.shared();
        if s.shutdown.load(Ordering::Acquire) {
            Err(LnetError::Shutdown)
        } else {
            Ok(s)
        }
    }

    /// Stops the runtime: connections are closed, operations in progress
    /// end with an error event, threads are joined. Idempotent.
    pub fn shutdown(&self) {
        stop(&self.h);
    }

    // ------------------------------------------------------------------
    // Events

    /// The next event, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`LnetError::TimedOut`]; [`LnetError::Config`] if events go to a
    /// handler; [`LnetError::Shutdown`] once the runtime is gone and the
    /// queue is empty.
    pub fn next_event(&self, timeout: Duration) -> Result<Event, LnetError> {
        let q = self
            .h
            .events
            .as_ref()
            .ok_or_else(|| LnetError::Config("events go to a handler".into()))?;
        match q.recv_timeout(timeout) {
            Ok(ev) => Ok(ev),
            Err(RecvTimeoutError::Timeout) => Err(LnetError::TimedOut),
            Err(RecvTimeoutError::Disconnected) => Err(LnetError::Shutdown),
        }
    }

    /// The event queue (`None` when events go to a handler).
    #[must_use]
    pub fn event_queue(&self) -> Option<Receiver<Event>> {
        self.h.events.clone()
    }

    /// Sets the hook called when events were queued (a node started with
    /// [`Lnet::start`]; `None` removes it). On a socket LND scheduler it
    /// is called between two turns of the scheduler's loop, with
    /// [`HookCall::Scheduler`]: the hook may take the events from
    /// [`Lnet::event_queue`] and run application code there, with no
    /// runtime lock held, sparing the thread switch to a consumer thread
    /// (a transfer machine's callback then answers from the thread that
    /// read the message, as Lustre's event callbacks run in its LND
    /// threads). Elsewhere (an application thread whose API call queued
    /// events, the runtime thread, connection daemons) it is called after
    /// the call with [`HookCall::Other`]: the hook must not run application
    /// code there, only wake its consumer. Events are in the queue before
    /// the hook is called; the hook may be called when another thread took
    /// them already.
    pub fn set_event_hook(&self, hook: Option<EventHook>) {
        self.shared().set_hook(hook);
    }

    /// [`Lnet::set_event_hook`] unless a hook is set already: `false`
    /// then, and nothing changes. The events of a node go to one
    /// consumer; whoever takes them claims the hook this way, so that a
    /// second consumer is refused instead of sharing the queue with the
    /// first (each would miss the events the other took).
    #[must_use]
    pub fn try_set_event_hook(&self, hook: EventHook) -> bool {
        self.shared().try_set_hook(hook)
    }

    // ------------------------------------------------------------------
    // Memory

    /// Registers application memory; MDs name ranges of it by the returned
    /// key ([`MemRef::new`]).
    #[must_use]
    pub fn register(&self, region: &MemRegion) -> MemKey {
        self.shared().mem.register(region)
    }

    /// Registers memory the application keeps behind its own lock, in
    /// segments ([`ForeignMemory`]): MDs over its key are that memory, read
    /// and written in place by the runtime (scatter-gather socket calls, no
    /// copy). Forget it with [`Lnet::deregister`] (which then returns
    /// `None`).
    #[must_use]
    pub fn register_foreign(&self, mem: Arc<dyn ForeignMemory>) -> MemKey {
        self.shared().mem.register_foreign(mem)
    }

    /// Forgets a region. MDs still naming it fail their operations
    /// (`LOCAL_ERROR` for a send, a failed receive), each with its event.
    pub fn deregister(&self, key: MemKey) -> Option<MemRegion> {
        self.shared().mem.deregister(key)
    }

    /// How many memory keys are registered now (a leak check: an idle
    /// node with nothing attached holds only what its users keep).
    pub fn registered_keys(&self) -> usize {
        self.shared().mem.len()
    }

    fn check_mem(&self, r: MemRef) -> Result<(), LnetError> {
        if self.shared().mem.resolve(r).is_some() {
            Ok(())
        } else {
            Err(LnetError::BadMemory {
                key: r.key,
                offset: r.offset,
                len: r.len,
            })
        }
    }

    // ------------------------------------------------------------------
    // LNet API

    /// `LNetMEAttach`: a match entry on a portal.
    ///
    /// # Errors
    /// Bad or reserved portal, portal kind mismatch (`EPERM`).
    pub fn me_attach(&self, spec: MeSpec) -> Result<MeHandle, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.me_attach(spec))?)
    }

    /// `LNetMDAttach`: an MD over registered memory on an ME (PUTs waiting
    /// on a lazy portal are delivered into it).
    ///
    /// # Errors
    /// Unregistered memory or a range beyond its end ([`LnetError::BadMemory`]),
    /// bad options, unknown ME.
    pub fn md_attach(&self, me: MeHandle, spec: MdSpec) -> Result<MdHandle, LnetError> {
        let s = self.live()?;
        self.check_mem(spec.mem)?;
        Ok(s.run(Vec::new(), |c, now| c.node.md_attach(now, me, spec))?)
    }

    /// `LNetMEAttach` then `LNetMDAttach` on it, in one turn of the node
    /// (one lock and one look at its outputs instead of two). If the MD is
    /// refused, the ME is unlinked again and nothing stays attached.
    ///
    /// # Errors
    /// As [`Lnet::me_attach`] and [`Lnet::md_attach`].
    pub fn me_md_attach(&self, me: MeSpec, md: MdSpec) -> Result<(MeHandle, MdHandle), LnetError> {
        let s = self.live()?;
        self.check_mem(md.mem)?;
        Ok(s.run(Vec::new(), |c, now| {
            let me = c.node.me_attach(me)?;
            match c.node.md_attach(now, me, md) {
                Ok(md) => Ok((me, md)),
                Err(e) => {
                    let _ = c.node.me_unlink(me);
                    Err(e)
                }
            }
        })?)
    }

    /// `LNetMDBind` then the PUT or GET `start` from it, in one turn of the
    /// node (as [`Lnet::md_bind`] followed by [`Lnet::put`] or
    /// [`Lnet::get`], with one lock and one look at the node's outputs
    /// instead of two). An operation that did not start leaves nothing: the
    /// MD is taken back with no event ([`Node::md_unbind`]).
    ///
    /// # Errors
    /// As [`Lnet::md_bind`], [`Lnet::put`] and [`Lnet::get`].
    pub fn bind_start(&self, spec: MdSpec, start: Start) -> Result<MdHandle, LnetError> {
        let s = self.live()?;
        self.check_mem(spec.mem)?;
        Ok(s.run(Vec::new(), |c, now| {
            let md = c.node.md_bind(spec)?;
            if let Err(e) = start.on(&mut c.node, now, md) {
                // A refused operation leaves the MD idle; were it not, its
                // unlink would end it with an event, as two calls do.
                if c.node.md_unbind(md).is_err() {
                    let _ = c.node.md_unlink(now, md);
                }
                return Err(e);
            }
            Ok(md)
        })?)
    }

    /// `LNetMDBind`: a free-floating MD, the source of a PUT or the sink of
    /// a GET.
    ///
    /// # Errors
    /// As [`Lnet::md_attach`].
    pub fn md_bind(&self, spec: MdSpec) -> Result<MdHandle, LnetError> {
        let s = self.live()?;
        self.check_mem(spec.mem)?;
        Ok(s.run(Vec::new(), |c, _| c.node.md_bind(spec))?)
    }

    /// `LNetMDUnlink`: an idle MD gives an UNLINK event at once; a busy one
    /// ends with its last operation's event (`unlinked` set). Returns
    /// whether it was busy (true: that event is still to come; a foreign
    /// memory taken back meanwhile fails what was being read into it, the
    /// rest of the payload being dropped).
    ///
    /// # Errors
    /// Unknown MD (`ENOENT`).
    pub fn md_unlink(&self, md: MdHandle) -> Result<bool, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.md_unlink(now, md))?)
    }

    /// Takes back the messages of `md` that still wait for their peer's
    /// discovery (no LND has them): each fails `Canceled` and is never
    /// sent. Returns how many (0: its messages are on their way, or it has
    /// none). See [`colibri_lnet::node::Node::withdraw`].
    ///
    /// # Errors
    /// The node was shut down.
    pub fn withdraw(&self, md: MdHandle) -> Result<usize, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.withdraw(now, md)))
    }

    /// Whether an operation holds `md` now (a payload being read into it,
    /// a message on its way), unlinked or not: its last event is still to
    /// come. False for an unknown MD, or one whose last event was built.
    #[must_use]
    pub fn md_busy(&self, md: MdHandle) -> bool {
        self.with_node(|n| n.md_busy(md))
    }

    /// `LNetMEUnlink`: removes an ME (and unlinks its MD, if any). An ME
    /// whose `md_attach` failed stays in its portal's match list until it
    /// is unlinked this way.
    ///
    /// # Errors
    /// Unknown ME (`ENOENT`).
    pub fn me_unlink(&self, me: MeHandle) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.me_unlink(me))?)
    }

    /// `LNetSetLazyPortal` / `LNetClearLazyPortal`.
    ///
    /// # Errors
    /// Bad or reserved portal.
    pub fn set_lazy_portal(&self, portal: u32, lazy: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.set_lazy_portal(portal, lazy))?)
    }

    /// `LNetPut`: sends the whole MD to `target`; with `ack` the MD needs
    /// threshold 2 (SEND and ACK events). Every operation ends with exactly
    /// one final event, whatever fails.
    ///
    /// # Errors
    /// Unusable MD, bad portal or target (the operation did not start and
    /// gives no event).
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        md: MdHandle,
        ack: bool,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
        hdr_data: u64,
    ) -> Result<(), LnetError> {
        let start = Start::Put {
            ack,
            target,
            portal,
            match_bits,
            offset,
            hdr_data,
        };
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| start.on(&mut c.node, now, md))?)
    }

    /// `LNetGet`: asks `target` for data into a bound MD (threshold 2: SEND
    /// and REPLY events).
    ///
    /// # Errors
    /// As [`Lnet::put`].
    pub fn get(
        &self,
        md: MdHandle,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
    ) -> Result<(), LnetError> {
        let start = Start::Get {
            target,
            portal,
            match_bits,
            offset,
        };
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| start.on(&mut c.node, now, md))?)
    }

    /// `lnetctl ping`: the peer's ping buffer (its NIDs and their status),
    /// waiting at most `timeout`.
    ///
    /// # Errors
    /// [`LnetError::TimedOut`], [`LnetError::Ping`] (no reply within the
    /// transaction timeout, bad reply), invalid NID.
    pub fn ping(&self, nid: Nid, timeout: Duration) -> Result<PingInfo, LnetError> {
        self.ping_from(nid, None, timeout)
    }

    /// Like [`Lnet::ping`], sent from the local NI `source` when given
    /// (`lnetctl ping --source`).
    ///
    /// # Errors
    /// As [`Lnet::ping`]; `source` not a local NID.
    pub fn ping_from(
        &self,
        nid: Nid,
        source: Option<Nid>,
        timeout: Duration,
    ) -> Result<PingInfo, LnetError> {
        let s = self.live()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        s.run(Vec::new(), |c, now| {
            c.node.ping_from(now, nid, source)?;
            c.add_ping_waiter(nid, tx);
            Ok::<(), LnetError>(())
        })?;
        match rx.recv_timeout(timeout) {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(error)) => Err(LnetError::Ping { nid, error }),
            Err(RecvTimeoutError::Timeout) => {
                // lnet_ping unlinks its MD when the caller's timeout
                // passes: the ping ends now (no response timeout later).
                // Results reach waiters under the node lock, so a result
                // that came meanwhile is seen here and our ping is not
                // confused with another one to the same NID. Our waiter,
                // its receiver gone, is skipped by the next result.
                let late = s.run(Vec::new(), |c, now| match rx.try_recv() {
                    Ok(r) => Some(r),
                    Err(_) => {
                        c.node.abandon_ping(now, nid);
                        None
                    }
                });
                match late {
                    Some(Ok(info)) => Ok(info),
                    Some(Err(error)) => Err(LnetError::Ping { nid, error }),
                    None => Err(LnetError::TimedOut),
                }
            }
            Err(RecvTimeoutError::Disconnected) => Err(LnetError::Shutdown),
        }
    }

    /// `lnetctl discover`: starts (or with `force` restarts) discovery of
    /// the peer owning `nid`; the result shows in the peer table
    /// ([`Lnet::with_node`]).
    ///
    /// # Errors
    /// Invalid NID, peer busy.
    pub fn discover(&self, nid: Nid, force: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.discover(now, nid, force))?)
    }

    // ------------------------------------------------------------------
    // DLC

    /// `lnetctl net add`: a new local NI (a `tcp` NI starts listening).
    ///
    /// # Errors
    /// Unsupported LND, duplicate NI, listener error.
    pub fn add_ni(&self, ni: NiConfig) -> Result<(), LnetError> {
        let s = self.live()?;
        check_lnd(ni.nid)?;
        if is_tcp(ni.nid)
            && let Some(l) = s.lnd.get()
        {
            if l.ni(ni.nid).is_some() {
                return Err(NodeError::DuplicateNi(ni.nid).into());
            }
            let inc = wall_nanos();
            l.add_ni(ni.nid, None, inc, ni.conns_per_peer, ni.tos)?;
        }
        if let Err(e) = s.run(Vec::new(), |c, now| c.node.add_ni(now, ni)) {
            if let Some(l) = s.lnd.get() {
                l.del_ni(ni.nid);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// The `conns_per_peer` in force on local NI `nid` (`None` for an NI
    /// without a socket LND: `0@lo`, unknown NIs).
    #[must_use]
    pub fn conns_per_peer(&self, nid: Nid) -> Option<u32> {
        self.shared()
            .lnd
            .get()
            .and_then(|l| l.ni(nid))
            .map(|n| n.conns_per_peer.load(Ordering::Relaxed))
    }

    /// `lnetctl net set --conns-per-peer N`: the socket LND's connections
    /// per peer on local NI `nid` (every NI with `None`), 0 to 127 (0: the
    /// runtime's default), for peers met from now on (connections made
    /// stay); how many NIs were set.
    ///
    /// # Errors
    /// A value above 127: `EINVAL`; a NID that is not a local NI: `ENOENT`.
    pub fn set_conns_per_peer(&self, nid: Option<Nid>, value: u32) -> Result<usize, LnetError> {
        let s = self.live()?;
        if value > 127 {
            return Err(LnetError::Config(format!(
                "conns_per_peer {value} is outside 0..=127"
            )));
        }
        if let Some(n) = nid
            && !self.nids().contains(&n)
        {
            return Err(NodeError::NoSuchNi(n).into());
        }
        Ok(s.lnd.get().map_or(0, |l| l.set_conns_per_peer(nid, value)))
    }

    /// The socket LND's connections from local NI `local` to `peer`, by
    /// type (empty when there are none).
    #[must_use]
    pub fn peer_conns(&self, local: Nid, peer: Nid) -> Vec<colibri_lnet::socklnd::ConnType> {
        self.shared()
            .lnd
            .get()
            .map(|l| l.peer_conns(local, peer))
            .unwrap_or_default()
    }

    /// `lnetctl net del`.
    ///
    /// # Errors
    /// Unknown NI.
    pub fn del_ni(&self, nid: Nid) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, now| c.node.del_ni(now, nid))?;
        if let Some(l) = s.lnd.get() {
            l.del_ni(nid);
        }
        Ok(())
    }

    /// `lnetctl peer add --prim_nid primary --nid nids [--non_mr]`.
    ///
    /// # Errors
    /// As the node's `dlc_add_peer` (`EBUSY` during discovery, NID in use).
    pub fn add_peer(&self, primary: Nid, nids: &[Nid], multi_rail: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| {
            c.node.dlc_add_peer(now, primary, nids, multi_rail)
        })?)
    }

    /// Locks (`lnetctl peer add --lock_prim`) or unlocks the primary NID
    /// of the peer whose primary is `primary`: discovery keeps it, and a
    /// delete of the whole peer removes only its other NIDs until it is
    /// unlocked (`peer del --force`).
    ///
    /// # Errors
    /// `primary` is not a peer's primary NID.
    pub fn set_peer_primary_locked(&self, primary: Nid, locked: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| {
            c.node.set_peer_primary_locked(primary, locked)
        })?)
    }

    /// `lnetctl peer set --nid nid --state bits` (for tests and debugging):
    /// the flags of the peer owning `nid` from Lustre's `lp_state` bits
    /// (see `Discovery::set_lustre_state`).
    ///
    /// # Errors
    /// No peer owns `nid`; a non-Multi-Rail state for a peer with several
    /// NIDs on one net.
    pub fn set_peer_state(&self, nid: Nid, bits: u32) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.set_peer_state(nid, bits))?)
    }

    /// `lnetctl udsp add`: a selection policy at index `idx` (`None`: the
    /// end), in force from the next send on; returns its index.
    ///
    /// # Errors
    /// The same rule is there already (`EALREADY`), too many rules.
    pub fn udsp_add(
        &self,
        rule: colibri_lnet::udsp::Rule,
        idx: Option<usize>,
    ) -> Result<usize, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| {
            c.node.udsp_add(rule, idx).map_err(NodeError::from)
        })?)
    }

    /// `lnetctl udsp del --idx N` (`None`: every rule, `--all`).
    ///
    /// # Errors
    /// No rule at that index (`ENOENT`).
    pub fn udsp_del(&self, idx: Option<usize>) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| {
            c.node.udsp_del(idx).map_err(NodeError::from)
        })?)
    }

    /// `lnetctl peer del --prim_nid primary --nid nids`.
    ///
    /// # Errors
    /// As the node's `dlc_del_peer`.
    pub fn del_peer(&self, primary: Nid, nids: &[Nid]) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.dlc_del_peer(now, primary, nids))?)
    }

    /// `lnetctl route add --net net --gateway gw [--hop] [--priority]`.
    ///
    /// # Errors
    /// As the node's `add_route`.
    pub fn add_route(
        &self,
        net: Net,
        gateway: Nid,
        hops: Option<u32>,
        priority: u32,
    ) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| {
            c.node.add_route(now, net, gateway, hops, priority)
        })?)
    }

    /// `lnetctl route del --net net --gateway gw`.
    ///
    /// # Errors
    /// Unknown route.
    pub fn del_route(&self, net: Net, gateway: Nid) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.del_route(net, gateway))?)
    }

    /// Stops forwarding at once, without the graceful interval of
    /// [`Lnet::set_routing`] (`lnetctl lnet unconfigure`).
    ///
    /// # Errors
    /// A node shut down.
    pub fn disable_routing_now(&self) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, now| c.node.disable_routing_now(now));
        Ok(())
    }

    /// `lnetctl set routing 0|1`, gracefully: see
    /// [`colibri_lnet::node::Node::set_routing`].
    ///
    /// # Errors
    /// On while a stop is under way (`EBUSY`); ping buffer rebuild
    /// failure.
    pub fn set_routing(&self, on: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.set_routing(now, on))?)
    }

    /// `lnetctl set discovery 0|1`.
    ///
    /// # Errors
    /// Ping buffer rebuild failure.
    pub fn set_discovery(&self, on: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.set_discovery(now, on))?)
    }

    /// `lnetctl set health_sensitivity|retry_count|transaction_timeout`:
    /// values for messages sent from now on.
    ///
    /// # Errors
    /// Values breaking Lustre's rules (a retry count not below the
    /// transaction timeout in seconds, retries without health): `EINVAL`,
    /// nothing changes.
    pub fn set_health(
        &self,
        sensitivity: u32,
        retry_count: u32,
        transaction_timeout: Duration,
    ) -> Result<(), LnetError> {
        let s = self.live()?;
        let lnd_timeout = s.run(Vec::new(), |c, _| {
            c.node
                .set_health_params(sensitivity, retry_count, transaction_timeout)
                .map(|()| c.node.health().config().lnd_timeout())
        })?;
        if let Some(l) = s.lnd.get() {
            l.note_lnd_timeout(lnd_timeout);
        }
        Ok(())
    }

    /// The socket LND's dead-socket timeout in force (`ksocknal_timeout`:
    /// `sock_timeout`, or LNet's `lnd_timeout` while that is 0); `None`
    /// without a socket LND.
    #[must_use]
    pub fn sock_timeout(&self) -> Option<Duration> {
        self.shared().lnd.get().map(|l| l.sock_timeout())
    }

    /// The socket LND's module parameters in force (`sock_timeout` as
    /// set at run time: 0 means LNet's `lnd_timeout`); `None` without a
    /// socket LND.
    #[must_use]
    pub fn tcp_tunables(&self) -> Option<colibri_lnet::socklnd::Tunables> {
        self.shared().lnd.get().map(|l| {
            let mut t = l.cfg.tun.clone();
            t.sock_timeout = l.sock_timeout_setting();
            t
        })
    }

    /// `lnetctl net set --net NET --lnd-timeout S`: the LND timeout of
    /// the LND that serves `net`, in whole seconds, for every net of that
    /// LND (Lustre writes the LND's module parameter: socklnd's
    /// `sock_timeout`). Here the socket LND takes it as its dead-socket
    /// timeout (a connection with a send or receive making no progress
    /// that long is closed; a message waiting that long for a connection
    /// fails; connection handshakes are bounded by it) from its next check
    /// on; 0 makes it follow LNet's `lnd_timeout` (`(transaction_timeout
    /// - 1) / (retry_count + 1)`, at least 1 s).
    ///
    /// # Errors
    /// A net of another LND than `tcp` (`lo` has no timeout): `EINVAL`.
    pub fn set_lnd_timeout(&self, net: Net, secs: u32) -> Result<(), LnetError> {
        let s = self.live()?;
        let lnd = net.lnd();
        if lnd.name() != Some("tcp") {
            return Err(LnetError::Config(format!(
                "net {net} does not accept an LND timeout (only the socket LND's tcp nets do here)"
            )));
        }
        let Some(l) = s.lnd.get() else {
            return Err(LnetError::Config("no socket LND runs on this node".into()));
        };
        l.set_sock_timeout(secs);
        tracing::info!(target: TARGET, secs, "socket LND timeout set");
        Ok(())
    }

    /// `lnetctl net set --health V` (`side` Local) and `lnetctl peer set
    /// --health V` (Peer): the health value of the interface `nid`, or of
    /// every one of that side with `None` (`--all`), set by hand; see
    /// [`colibri_lnet::node::Node::set_ni_health`]. Returns how many
    /// interfaces were set.
    ///
    /// # Errors
    /// A NID that is not an interface of that side: `ENOENT`.
    pub fn set_ni_health(
        &self,
        side: colibri_lnet::health::NiSide,
        nid: Option<Nid>,
        value: u32,
    ) -> Result<usize, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| {
            c.node.set_ni_health(now, side, nid, value)
        })?)
    }

    /// `lnetctl set recovery_limit N` (`None` = 0 = forever) and
    /// `max_recovery_ping_interval N`.
    ///
    /// # Errors
    /// A zero interval: `EINVAL`, nothing changes.
    pub fn set_recovery(
        &self,
        recovery_limit: Option<Duration>,
        max_recovery_ping_interval: Duration,
    ) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| {
            c.node
                .set_recovery_params(recovery_limit, max_recovery_ping_interval)
        })?)
    }

    /// `lnetctl set drop_asym_route 0|1`.
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_drop_asym_route(&self, on: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, _| c.node.set_drop_asym_route(on));
        Ok(())
    }

    /// `lnetctl set response_tracking 0..=3`.
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_response_tracking(&self, mode: ResponseTracking) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, _| c.node.set_response_tracking(mode));
        Ok(())
    }

    /// `alive_router_check_interval` (seconds; zero stops the router
    /// checker).
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_router_check_interval(&self, interval: Duration) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, now| {
            c.node.set_router_check_interval(now, interval);
        });
        Ok(())
    }

    /// `router_ping_timeout` (seconds): a router ping's reply time, and
    /// with `alive_router_check_interval` how long a router's net stays up
    /// without a ping.
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_router_ping_timeout(&self, timeout: Duration) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, _| c.node.set_router_ping_timeout(timeout));
        Ok(())
    }

    /// `avoid_asym_router_failure`: a single-hop route needs its gateway's
    /// NIs on both nets up.
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_avoid_asym_router_failure(&self, on: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, _| c.node.set_avoid_asym_router_failure(on));
        Ok(())
    }

    /// `check_routers_before_use`: new routes are dead until their gateway
    /// answers a router ping.
    ///
    /// # Errors
    /// A node shut down.
    pub fn set_check_routers_before_use(&self, on: bool) -> Result<(), LnetError> {
        let s = self.live()?;
        s.run(Vec::new(), |c, _| c.node.set_check_routers_before_use(on));
        Ok(())
    }

    /// `lnetctl set max_interfaces N` (at least 16).
    ///
    /// # Errors
    /// Below 16: `EINVAL`.
    pub fn set_max_interfaces(&self, n: u32) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, _| c.node.set_max_interfaces(n))?)
    }

    /// `lnetctl fault add` / `lctl net_drop_add`.
    ///
    /// # Errors
    /// Invalid rule.
    pub fn add_drop_rule(&self, spec: DropRuleSpec) -> Result<RuleId, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.add_drop_rule(now, spec))?)
    }

    /// `lctl net_delay_add`.
    ///
    /// # Errors
    /// Invalid rule.
    pub fn add_delay_rule(&self, spec: DelayRuleSpec) -> Result<RuleId, LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.add_delay_rule(now, spec))?)
    }

    /// Removes a fault rule (delayed messages are released); `false` if
    /// unknown.
    pub fn remove_fault_rule(&self, id: RuleId) -> bool {
        self.shared()
            .run(Vec::new(), |c, now| c.node.remove_fault_rule(now, id))
    }

    /// `lnetctl set tiny_buffers|small_buffers|large_buffers N`: resizes a
    /// router buffer pool (forwards waiting for a buffer go on when it
    /// grows).
    ///
    /// # Errors
    /// A size of 0.
    pub fn set_router_buffers(
        &self,
        kind: colibri_lnet::credits::PoolKind,
        n: u32,
    ) -> Result<(), LnetError> {
        let s = self.live()?;
        Ok(s.run(Vec::new(), |c, now| c.node.set_router_buffers(now, kind, n))?)
    }

    /// Forgets the peer NIs the node knows from traffic alone (`lnetctl
    /// lnet unconfigure`).
    pub fn forget_traffic_peers(&self) {
        self.shared().core.lock().node.forget_traffic_peers();
    }

    /// `lnetctl stats reset`: zeroes the node's counters (messages, bytes,
    /// per local NI and per peer NI). [`Lnet::runtime_stats`] is not reset.
    pub fn reset_stats(&self) {
        self.shared().core.lock().node.reset_stats();
    }

    /// `lctl net_drop_reset` / `net_delay_reset` (see the node's
    /// `reset_fault_rules`).
    pub fn reset_fault_rules(&self, drops: bool, delays: bool) {
        self.shared().run(Vec::new(), |c, now| {
            c.node.reset_fault_rules(now, drops, delays);
        });
    }

    /// A fault rule's statistics.
    #[must_use]
    pub fn fault_stats(&self, id: RuleId) -> Option<FaultStats> {
        self.shared().core.lock().node.fault_stats(id)
    }

    // ------------------------------------------------------------------
    // Introspection

    /// Our NIDs (the first is the primary NID).
    #[must_use]
    pub fn nids(&self) -> Vec<Nid> {
        self.shared().core.lock().node.nids()
    }

    /// LNet counters (`lnetctl stats show`).
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        self.shared().core.lock().node.stats()
    }

    /// What the runtime moved (copy accounting) and its connections.
    #[must_use]
    pub fn runtime_stats(&self) -> RuntimeStats {
        self.shared().counters.snapshot()
    }

    /// Router buffers filled and not yet released by the node.
    #[must_use]
    pub fn router_buffers_in_use(&self) -> usize {
        self.shared().rbufs.filled_count()
    }

    /// Runs `f` on the node, read only, under the node lock (peer table,
    /// health, routes, credits). Do not call back into the [`Lnet`] from
    /// `f`.
    pub fn with_node<R>(&self, f: impl FnOnce(&Node) -> R) -> R {
        f(&self.shared().core.lock().node)
    }

    /// The address NI `nid` listens on (its port when `accept_port` was 0).
    #[must_use]
    pub fn listen_addr(&self, nid: Nid) -> Option<SocketAddr> {
        self.shared().lnd.get().and_then(|l| l.listen_addr(nid))
    }

    /// Where peer NID `nid` is connected to (overriding `ip:accept_port`).
    pub fn set_peer_addr(&self, nid: Nid, addr: SocketAddr) {
        if let Some(l) = self.shared().lnd.get() {
            l.set_peer_addr(nid, addr);
        }
    }

    /// Tells each of `nodes` where the others listen (their first NID's
    /// [`listen_addr`](Self::listen_addr)): nodes of one process on
    /// loopback addresses with accept ports picked by the system
    /// (`accept_port = 0`) then find each other without a fixed port.
    pub fn introduce(nodes: &[Lnet]) {
        for a in nodes {
            for b in nodes {
                let Some(&nb) = b.nids().first() else {
                    continue;
                };
                if a.nids().first() != Some(&nb)
                    && let Some(at) = b.listen_addr(nb)
                {
                    a.set_peer_addr(nb, at);
                }
            }
        }
    }

    /// Why the latest connections (and refused connection attempts) were
    /// closed, oldest first (at most 64).
    #[must_use]
    pub fn close_reasons(&self) -> Vec<String> {
        self.shared()
            .lnd
            .get()
            .map(|l| l.close_reasons())
            .unwrap_or_default()
    }
}

/// Wall-clock nanoseconds: NI incarnations (Lustre uses the NI's start
/// time) and seeds.
fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(1))
}

fn is_tcp(nid: Nid) -> bool {
    nid.net().lnd().name() == Some("tcp")
}

/// Only `lo` and `tcp` NIs have an LND here.
fn check_lnd(nid: Nid) -> Result<(), LnetError> {
    match nid.net().lnd().name() {
        Some("tcp" | "lo") => Ok(()),
        _ => Err(LnetError::Config(format!(
            "{nid}: only tcp NIs are supported by this runtime"
        ))),
    }
}
