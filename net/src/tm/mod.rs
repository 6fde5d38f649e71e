//! Transfer machines.
//!
//! See the crate documentation for the object model. The core's
//! bookkeeping is split by concern:
//!
//! * [`ids`]: identifiers and small value types (import nothing);
//! * `slot`: a queued buffer's slot, flags and receive reservations;
//! * `add`: the add path (checks, slot, descriptor, hand-off);
//! * `post`: reports about buffers (completions, messages), claims, and
//!   the core's own cancellations;
//! * `deliver`: event delivery and synchronous delivery;
//! * `timers`: deadlines and expiry, time as an input;
//! * this module: the transfer machine's state, lifecycle (start, stop,
//!   fini) and handles. The transport's end is [`crate::xprt::TmSink`].

mod add;
mod deliver;
pub mod ids;
mod post;
mod slot;
mod timers;

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, error, trace, warn};

use crate::buffer::BufState;
use crate::domain::{Domain, DomainInner};
use crate::ep::{EndPoint, EpInner};
use crate::error::{FiniError, NetError, Result};
use crate::fasthash::FastMap;
use crate::queue::QueueType;
use crate::sink::Job;
use crate::slab::Slab;
use crate::stats::QueueStats;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, LeafMutex, Mutex};
use crate::util::{in_callback_of, in_data_view, next_id, on_delivery_thread};
use crate::wait::check_may_block;
use crate::xprt::{Caps, DelReason, Delivery, Limits, QueuedBuf, TmSink, XprtTm};

pub use add::{AddOp, Added};
pub use deliver::{TmCallback, TmEvent, TmEventKind};
pub use ids::{BufToken, RecvParams, TmId, TmState};
use slot::EvData;
pub(crate) use slot::{F_CANCEL, F_IN_USE, F_TIMED_OUT, Post, Slot};

struct TmCore {
    state: TmState,
    slots: Slab<Arc<Slot>>,
    qlen: [usize; QueueType::COUNT],
    recv_list: VecDeque<u64>,
    stats: [QueueStats; QueueType::COUNT],
    eps: FastMap<String, Weak<EpInner>>,
    eps_sweep_at: usize,
    /// Recent senders' end points, kept alive so that a busy peer's end
    /// point is not re-created for every message (oldest evicted first).
    ep_cache: VecDeque<EndPoint>,
    own_ep: Option<EndPoint>,
    own_addr: Option<String>,
    sync: bool,
    /// Synchronous delivery: buffer events waiting for `deliver_all`.
    pending: VecDeque<(Arc<Slot>, EvData)>,
    notify: Option<Box<dyn FnOnce() + Send>>,
    /// The last buffer of a stop completed: STOPPED was posted.
    stop_posted: bool,
    /// STOPPED waits for the running callbacks: the last one delivers it.
    stop_deferred: bool,
    timers: BTreeSet<(Instant, u64)>,
    /// The deadline the clock's timer is armed for.
    armed: Option<Instant>,
    no_buffers: u64,
    rejected: u64,
    event_seq: u64,
}

pub(crate) struct TmInner {
    id: TmId,
    pub(crate) dom: Arc<DomainInner>,
    xprt: Box<dyn XprtTm>,
    core: Mutex<TmCore>,
    cond: Condvar,
    callback: Arc<TmCallback>,
    deliver_lock: Mutex<()>,
    earliest: AtomicU64,
    /// Events posted and not yet fully delivered (their callback has not
    /// returned). Atomic so that finishing a callback takes no lock.
    running: AtomicUsize,
    /// A loss event (a message dropped for lack of a receive buffer, a bulk
    /// request refused) is posted and not yet dispatched: further losses
    /// are only counted until it is.
    pub(crate) loss_pending: AtomicBool,
    /// Finished slots kept for the next adds (at most
    /// [`slot::SPARE_SLOTS`]): an add fills one in place instead of
    /// allocating, a completion keeps its slot instead of freeing it. A
    /// leaf lock.
    spare: LeafMutex<Vec<Arc<Slot>>>,
    /// The buffer pool colour ([`TmHandle::set_colour`]).
    colour: std::sync::atomic::AtomicU32,
    me: Weak<TmInner>,
}

fn misuse_in_view() -> NetError {
    NetError::ApiMisuse(
        "transfer machine called while reading a buffer through an event's data view".into(),
    )
}

impl TmInner {
    pub(crate) fn state(&self) -> TmState {
        self.core.lock().state
    }

    pub(crate) fn queued(&self) -> usize {
        self.core.lock().slots.len()
    }

    fn caps(&self) -> Caps {
        self.dom.caps
    }

    fn check_api(&self) -> Result<()> {
        if in_data_view() {
            return Err(misuse_in_view());
        }
        Ok(())
    }

    fn find_or_create_ep(&self, core: &mut TmCore, addr: &str) -> Result<EndPoint> {
        if let Some(ep) = core.eps.get(addr).and_then(Weak::upgrade) {
            return Ok(EndPoint(ep));
        }
        let parsed = self.xprt.ep_parse(addr)?;
        if parsed.addr != addr
            && let Some(ep) = core.eps.get(&parsed.addr).and_then(Weak::upgrade)
        {
            return Ok(EndPoint(ep));
        }
        let ep = Arc::new(EpInner {
            addr: parsed.addr,
            tm: self.id,
            data: parsed.data,
            cached: AtomicBool::new(false),
        });
        core.eps.insert(ep.addr.clone(), Arc::downgrade(&ep));
        if core.eps.len() >= core.eps_sweep_at {
            core.eps.retain(|_, w| w.strong_count() > 0);
            core.eps_sweep_at = (core.eps.len() * 2).max(64);
        }
        Ok(EndPoint(ep))
    }

    /// The end point of a message's sender: like `find_or_create_ep`, and
    /// remembered in the sender cache.
    fn sender_ep(&self, core: &mut TmCore, addr: &str) -> Result<EndPoint> {
        // Traffic usually comes in runs from one peer: try the newest
        // cached sender before hashing the address.
        if let Some(last) = core.ep_cache.back()
            && last.addr() == addr
        {
            return Ok(last.clone());
        }
        let ep = self.find_or_create_ep(core, addr)?;
        if !ep.0.cached.swap(true, Ordering::AcqRel) {
            if core.ep_cache.len() >= self.dom.sender_cache
                && let Some(old) = core.ep_cache.pop_front()
            {
                old.0.cached.store(false, Ordering::Release);
            }
            core.ep_cache.push_back(ep.clone());
        }
        Ok(ep)
    }

    /// The last buffer of a stopping transfer machine completed: the
    /// transport releases its address and STOPPED is posted, to run after
    /// the last running callback returned, or on one of the transport's
    /// threads.
    fn finish_stop(self: &Arc<Self>, core: &mut TmCore) {
        if std::mem::replace(&mut core.stop_posted, true) {
            return;
        }
        self.xprt.stopped();
        if self.running.load(Ordering::Acquire) > 0 {
            core.stop_deferred = true;
        } else {
            self.running.fetch_add(1, Ordering::AcqRel);
            self.xprt.deliver(Delivery {
                job: Some(Job::Stopped(Arc::clone(self))),
            });
        }
    }

    pub(crate) fn post_started(self: &Arc<Self>, addr: &str) {
        let mut core = self.core.lock();
        if core.state != TmState::Starting {
            debug!(tm = %self.id, state = ?core.state, "STARTED ignored: transfer machine no longer starting");
            return;
        }
        match self.find_or_create_ep(&mut core, addr) {
            Ok(ep) => {
                core.own_addr = Some(ep.addr().to_string());
                core.own_ep = Some(ep.clone());
                core.state = TmState::Started;
                debug!(tm = %self.id, addr = ep.addr(), "started");
                self.emit_tm(
                    core,
                    TmEventKind::StateChange {
                        state: TmState::Started,
                        status: Ok(()),
                        ep: Some(ep),
                    },
                );
            }
            Err(e) => {
                error!(tm = %self.id, addr, "transport reported an unparseable own address");
                drop(core);
                self.post_start_failed(e);
            }
        }
    }

    pub(crate) fn post_start_failed(self: &Arc<Self>, error: NetError) {
        let mut core = self.core.lock();
        if core.state != TmState::Starting {
            debug!(tm = %self.id, state = ?core.state, "start failure ignored");
            return;
        }
        core.state = TmState::Failed;
        debug!(tm = %self.id, %error, "start failed");
        let done = self.cancel_all(&mut core);
        drop(core);
        for d in done {
            d.run();
        }
        let core = self.core.lock();
        self.emit_tm(
            core,
            TmEventKind::StateChange {
                state: TmState::Failed,
                status: Err(error),
                ep: None,
            },
        );
    }

    pub(crate) fn post_error(self: &Arc<Self>, error: NetError) {
        let core = self.core.lock();
        self.emit_tm(core, TmEventKind::Error(error));
    }

    pub(crate) fn post_diagnostic(self: &Arc<Self>, text: String) {
        let core = self.core.lock();
        self.emit_tm(core, TmEventKind::Diagnostic(text));
    }

    fn fini(&self, force: bool) -> Result<()> {
        if in_callback_of(self.id.0) {
            return Err(NetError::ApiMisuse(
                "a transfer machine cannot be finalised from its own callback".into(),
            ));
        }
        self.check_api()?;
        let mut core = self.core.lock();
        match core.state {
            TmState::Undefined => return Ok(()),
            TmState::Initialized | TmState::Stopped | TmState::Failed => {}
            state => return Err(NetError::WrongState { op: "fini", state }),
        }
        if core.slots.len() > 0 {
            return Err(NetError::Busy(format!(
                "{} buffer(s) still queued",
                core.slots.len()
            )));
        }
        if !core.pending.is_empty() {
            return Err(NetError::Busy(format!(
                "{} undelivered event(s): call deliver_all first",
                core.pending.len()
            )));
        }
        for ep in std::mem::take(&mut core.ep_cache) {
            ep.0.cached.store(false, Ordering::Release);
        }
        if !force {
            let own = core.own_addr.clone();
            let busy: Vec<String> = core
                .eps
                .iter()
                .filter(|(addr, w)| {
                    let allowed = usize::from(own.as_deref() == Some(addr.as_str()));
                    w.strong_count() > allowed
                })
                .map(|(addr, _)| addr.clone())
                .collect();
            if !busy.is_empty() {
                return Err(NetError::Busy(format!(
                    "end point references still held: {}",
                    busy.join(", ")
                )));
            }
        }
        if (self.running.load(Ordering::Acquire) > 0 || core.stop_deferred) && on_delivery_thread()
        {
            // The events still running may need this very thread.
            return Err(NetError::Busy(
                "events are still being delivered and this thread delivers events: \
                 finalise from an application thread"
                    .into(),
            ));
        }
        while self.running.load(Ordering::Acquire) > 0 || core.stop_deferred {
            self.cond.wait(&mut core);
        }
        core.state = TmState::Undefined;
        let own = core.own_ep.take();
        core.eps.clear();
        drop(core);
        drop(own);
        self.spare.lock().clear();
        self.xprt.fini();
        self.dom.tms.fetch_sub(1, Ordering::AcqRel);
        self.cond.notify_all();
        debug!(tm = %self.id, "finalised");
        Ok(())
    }
}

/// A shareable handle to a transfer machine: every operation except
/// finalisation. Callbacks receive one; clone it to use the transfer
/// machine from other threads.
#[derive(Clone)]
pub struct TmHandle {
    pub(crate) inner: Arc<TmInner>,
}

impl fmt::Debug for TmHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmHandle")
            .field("id", &self.inner.id)
            .field("state", &self.state())
            .finish()
    }
}

impl TmHandle {
    /// The transfer machine's identifier.
    pub fn id(&self) -> TmId {
        self.inner.id
    }

    /// Identifier of its domain.
    pub fn domain_id(&self) -> u64 {
        self.inner.dom.id
    }

    /// Current state.
    pub fn state(&self) -> TmState {
        self.inner.state()
    }

    /// Its own end point (once started).
    pub fn ep(&self) -> Option<EndPoint> {
        self.inner.core.lock().own_ep.clone()
    }

    /// The transport's capabilities.
    pub fn caps(&self) -> Caps {
        self.inner.caps()
    }

    /// The transport's limits.
    pub fn limits(&self) -> Limits {
        self.inner.dom.limits
    }

    /// Registers memory with the domain of this transfer machine, as
    /// [`Domain::register`] does: for code that holds a transfer machine
    /// but not its domain (the fault injector's own copies of messages).
    ///
    /// # Errors
    /// As [`Domain::register`].
    pub fn register(
        &self,
        bufvec: crate::bufvec::BufVec,
    ) -> Result<crate::buffer::NetBuffer, crate::error::RegisterError> {
        Domain {
            inner: Arc::clone(&self.inner.dom),
        }
        .register(bufvec)
    }

    /// Starts the transfer machine at `addr` (transport specific). The
    /// result arrives as a state-change event (STARTED with the transfer
    /// machine's own end point, or FAILED), possibly before this returns,
    /// always from another thread.
    ///
    /// # Errors
    /// `WrongState` unless INITIALIZED; a synchronous failure from the
    /// transport (invalid or busy address), after which the transfer
    /// machine is FAILED and its queued buffers complete with `Cancelled`.
    pub fn start(&self, addr: &str) -> Result<()> {
        self.inner.check_api()?;
        let mut core = self.inner.core.lock();
        if core.state != TmState::Initialized {
            return Err(NetError::WrongState {
                op: "start",
                state: core.state,
            });
        }
        core.state = TmState::Starting;
        debug!(tm = %self.inner.id, addr, "starting");
        match self.inner.xprt.start(addr) {
            Ok(()) => Ok(()),
            Err(e) => {
                core.state = TmState::Failed;
                for d in self.inner.cancel_all(&mut core) {
                    if d.is_pending() {
                        self.inner.xprt.deliver(d);
                    }
                }
                Err(e)
            }
        }
    }

    /// Stops the transfer machine. With `abort`, every queued buffer is
    /// cancelled, operations in flight too (whatever was asked of them
    /// before); without, operations already in progress finish and the
    /// others are cancelled. STOPPED follows as an event, after every
    /// buffer's completion, always from another thread.
    ///
    /// # Errors
    /// `WrongState` unless INITIALIZED, STARTING or STARTED; the transport's
    /// failure (the previous state is restored).
    pub fn stop(&self, abort: bool) -> Result<()> {
        self.inner.check_api()?;
        let mut core = self.inner.core.lock();
        let old = core.state;
        if !matches!(
            old,
            TmState::Initialized | TmState::Starting | TmState::Started
        ) {
            return Err(NetError::WrongState {
                op: "stop",
                state: old,
            });
        }
        core.state = TmState::Stopping;
        if let Err(e) = self.inner.xprt.stop(abort) {
            core.state = old;
            return Err(e);
        }
        debug!(tm = %self.inner.id, abort, queued = core.slots.len(), "stopping");
        let targets: Vec<Arc<Slot>> = core
            .slots
            .iter()
            .filter(|s| abort || !s.flag(F_IN_USE))
            .cloned()
            .collect();
        for s in targets {
            if !s.flag(F_CANCEL) {
                s.set(F_CANCEL);
                core.stats[s.queue.index()].dels += 1;
            }
            self.inner.cancel_slot(&mut core, &s, DelReason::Stop);
        }
        if core.state == TmState::Stopping && core.slots.len() == 0 {
            self.inner.finish_stop(&mut core);
        }
        Ok(())
    }

    /// Cancels a queued buffer, in any state it can be queued in. Returns
    /// `Ok(true)` when the buffer was queued: it will complete (with
    /// `Cancelled` unless its operation finishes first), always on another
    /// thread or later. An operation in flight is ended (the transport
    /// aborts the transfer and tells the peer where it can); the buffer's
    /// timeout stays armed. Returns
    /// `Ok(false)` when it was not queued (already completed, or a deletion
    /// is already under way): a no-op.
    ///
    /// # Errors
    /// `ApiMisuse` when called from inside a data view.
    pub fn del(&self, token: BufToken) -> Result<bool> {
        self.inner.check_api()?;
        if token.tm != self.inner.id.0 {
            return Ok(false);
        }
        let mut core = self.inner.core.lock();
        let Some(slot) = core.slots.get(token.key).cloned() else {
            return Ok(false);
        };
        if slot.flag(F_CANCEL) {
            return Ok(false);
        }
        slot.set(F_CANCEL);
        core.stats[slot.queue.index()].dels += 1;
        trace!(tm = %self.inner.id, token = token.key, "del");
        self.inner.cancel_slot(&mut core, &slot, DelReason::Cancel);
        Ok(true)
    }

    /// Finds or creates the end point for `addr`. Creating the same
    /// address again returns the same end point with one more reference.
    ///
    /// # Errors
    /// `WrongState` unless STARTED; `InvalidAddress` from the transport.
    pub fn ep_create(&self, addr: &str) -> Result<EndPoint> {
        self.inner.check_api()?;
        let mut core = self.inner.core.lock();
        if core.state != TmState::Started {
            return Err(NetError::WrongState {
                op: "ep_create",
                state: core.state,
            });
        }
        self.inner.find_or_create_ep(&mut core, addr)
    }

    /// Statistics of one queue; with `reset`, zeroed atomically after the
    /// read.
    pub fn stats(&self, queue: QueueType, reset: bool) -> QueueStats {
        let mut core = self.inner.core.lock();
        let s = core.stats[queue.index()];
        if reset {
            core.stats[queue.index()] = QueueStats::default();
        }
        s
    }

    /// Statistics of all queues, indexed by [`QueueType::index`]; with
    /// `reset`, all zeroed atomically after the read.
    pub fn stats_all(&self, reset: bool) -> [QueueStats; QueueType::COUNT] {
        let mut core = self.inner.core.lock();
        let s = core.stats;
        if reset {
            core.stats = [QueueStats::default(); QueueType::COUNT];
        }
        s
    }

    /// Number of buffers on a queue.
    pub fn queue_len(&self, queue: QueueType) -> usize {
        self.inner.core.lock().qlen[queue.index()]
    }

    /// Number of buffers on all queues.
    pub fn queued(&self) -> usize {
        self.inner.queued()
    }

    /// State of the buffer of an add, or `None` when it is no longer
    /// queued.
    pub fn buffer_state(&self, token: BufToken) -> Option<BufState> {
        let q = self.inner.lookup(token)?;
        let s = &q.0;
        Some(BufState {
            registered: true,
            queued: true,
            queue: Some(s.queue),
            in_use: s.flag(F_IN_USE),
            cancelled: s.flag(F_CANCEL),
            timed_out: s.flag(F_TIMED_OUT),
            msgs_received: s.rs.lock().delivered,
        })
    }

    /// Messages dropped because no receive buffer was free.
    pub fn no_buffer_drops(&self) -> u64 {
        self.inner.core.lock().no_buffers
    }

    /// Active bulk requests against this transfer machine's passive buffers
    /// that were refused without touching a buffer (stale, forged or edited
    /// descriptors, busy buffers).
    pub fn rejected_requests(&self) -> u64 {
        self.inner.core.lock().rejected
    }

    /// Sets the machine's buffer pool colour (Motr's
    /// `m0_net_tm_colour_set`): a [`RecvProvisioner`](crate::pool::RecvProvisioner)
    /// takes its buffers from the pool with this colour first and returns
    /// them with it, so the machine gets back the buffers it last used,
    /// still warm in its CPU's cache. Give each machine of a domain that
    /// shares a pool its own colour (Motr's servers number them 0, 1, 2,
    /// …). Default [`ANY_COLOUR`](crate::pool::ANY_COLOUR). It may be set
    /// in any state and counts from the next buffer taken or returned.
    pub fn set_colour(&self, colour: u32) {
        self.inner.colour.store(colour, Ordering::Relaxed);
    }

    /// The machine's buffer pool colour ([`TmHandle::set_colour`]).
    pub fn colour(&self) -> u32 {
        self.inner.colour.load(Ordering::Relaxed)
    }

    /// Confines the transfer machine's threads to the given CPUs. Only in
    /// INITIALIZED.
    ///
    /// # Errors
    /// `Unsupported` if the transport cannot, `WrongState` otherwise, or
    /// the transport's refusal.
    pub fn confine(&self, cpus: &[usize]) -> Result<()> {
        self.inner.check_api()?;
        if !self.inner.dom.caps.confine {
            return Err(NetError::Unsupported {
                transport: self.inner.dom.xprt.name(),
                what: "confining threads to CPUs",
            });
        }
        let core = self.inner.core.lock();
        if core.state != TmState::Initialized {
            return Err(NetError::WrongState {
                op: "confine",
                state: core.state,
            });
        }
        self.inner.xprt.confine(cpus)
    }

    /// Number of events posted so far (buffer and transfer machine events).
    /// Pair with [`TmHandle::wait_event_after`].
    pub fn event_seq(&self) -> u64 {
        self.inner.core.lock().event_seq
    }

    /// Blocks until an event is posted after sequence number `seq` (see
    /// [`TmHandle::event_seq`]) or `timeout` passes. Returns true if one
    /// was.
    ///
    /// # Errors
    /// `ApiMisuse` on a thread that delivers events (see
    /// [`wait`](crate::wait#never-wait-on-a-thread-that-delivers-events)).
    pub fn wait_event_after(&self, seq: u64, timeout: Duration) -> Result<bool> {
        check_may_block("TmHandle::wait_event_after")?;
        let deadline = Instant::now() + timeout;
        let mut core = self.inner.core.lock();
        while core.event_seq <= seq {
            if self.inner.cond.wait_until(&mut core, deadline).timed_out() {
                return Ok(core.event_seq > seq);
            }
        }
        Ok(true)
    }

    /// Blocks until the state satisfies `pred` or `timeout` passes.
    ///
    /// # Errors
    /// `TimedOut`; `ApiMisuse` on a thread that delivers events.
    pub fn wait_state(&self, pred: impl Fn(TmState) -> bool, timeout: Duration) -> Result<TmState> {
        check_may_block("TmHandle::wait_state")?;
        let deadline = Instant::now() + timeout;
        let mut core = self.inner.core.lock();
        while !pred(core.state) {
            if self.inner.cond.wait_until(&mut core, deadline).timed_out() && !pred(core.state) {
                return Err(NetError::TimedOut);
            }
        }
        Ok(core.state)
    }

    /// Blocks until the transfer machine is in `state` (or in a state it
    /// can no longer leave towards it, which is reported as `WrongState`).
    ///
    /// # Errors
    /// `TimedOut`, or `WrongState` when the transfer machine failed or
    /// stopped while waiting for STARTED; `ApiMisuse` on a thread that
    /// delivers events.
    pub fn wait_for_state(&self, state: TmState, timeout: Duration) -> Result<()> {
        let terminal = |s: TmState| matches!(s, TmState::Failed | TmState::Undefined);
        let got = self.wait_state(
            |s| {
                s == state
                    || terminal(s)
                    || (state == TmState::Started
                        && matches!(s, TmState::Stopping | TmState::Stopped))
            },
            timeout,
        )?;
        if got == state {
            Ok(())
        } else {
            Err(NetError::WrongState {
                op: "wait_for_state",
                state: got,
            })
        }
    }

    /// Waits for the transfer machine's state events to settle after a
    /// stop: the state is STOPPED (or FAILED) and every callback returned.
    ///
    /// # Errors
    /// `TimedOut`; `ApiMisuse` on a thread that delivers events.
    pub fn wait_stopped(&self, timeout: Duration) -> Result<()> {
        check_may_block("TmHandle::wait_stopped")?;
        let deadline = Instant::now() + timeout;
        let mut core = self.inner.core.lock();
        loop {
            let settled = matches!(core.state, TmState::Stopped | TmState::Failed)
                && self.inner.running.load(Ordering::Acquire) == 0
                && !core.stop_deferred;
            if settled {
                return Ok(());
            }
            if self.inner.cond.wait_until(&mut core, deadline).timed_out() {
                let settled = matches!(core.state, TmState::Stopped | TmState::Failed)
                    && self.inner.running.load(Ordering::Acquire) == 0
                    && !core.stop_deferred;
                return if settled {
                    Ok(())
                } else {
                    Err(NetError::TimedOut)
                };
            }
        }
    }
}

/// Stands in for a transport whose `tm_init` failed, while the half-built
/// transfer machine is dropped. Never started.
#[derive(Debug)]
struct Unmade;

impl XprtTm for Unmade {
    fn start(&self, _addr: &str) -> Result<()> {
        Err(NetError::WrongState {
            op: "start",
            state: TmState::Undefined,
        })
    }
    fn stop(&self, _abort: bool) -> Result<()> {
        Ok(())
    }
    fn fini(&self) {}
    fn ep_parse(&self, addr: &str) -> Result<crate::xprt::EpAddr> {
        Err(NetError::InvalidAddress {
            addr: addr.to_string(),
            reason: "transfer machine not made".into(),
        })
    }
    fn buf_add(&self, _buf: &QueuedBuf) -> Result<()> {
        Err(NetError::WrongState {
            op: "add",
            state: TmState::Undefined,
        })
    }
    fn buf_del(&self, _buf: &QueuedBuf, _reason: DelReason) {}
    fn deliver(&self, delivery: Delivery) {
        delivery.run();
    }
}

/// A transfer machine: the owning handle.
///
/// Dereferences to [`TmHandle`] for every operation; adds finalisation.
/// Dropping a transfer machine that was not finalised stops it with abort,
/// waits (up to 30 s) for STOPPED and finalises it.
#[must_use = "dropping a TransferMachine stops and finalises it"]
pub struct TransferMachine {
    h: TmHandle,
    finalized: bool,
}

impl fmt::Debug for TransferMachine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferMachine")
            .field("id", &self.h.inner.id)
            .field("state", &self.h.state())
            .finish()
    }
}

impl Deref for TransferMachine {
    type Target = TmHandle;
    fn deref(&self) -> &TmHandle {
        &self.h
    }
}

impl TransferMachine {
    /// Creates a transfer machine in `dom` (same as
    /// [`Domain::tm_init`](crate::Domain::tm_init)).
    ///
    /// # Errors
    /// The transport's failure.
    pub fn new(dom: &Domain, callback: Arc<TmCallback>) -> Result<Self> {
        let id = TmId(next_id());
        let mut failed = None;
        let inner = Arc::new_cyclic(|me: &Weak<TmInner>| TmInner {
            id,
            dom: Arc::clone(&dom.inner),
            // The transport gets its sink at creation: a weak reference to
            // the transfer machine being built here.
            xprt: match dom.inner.xprt.tm_init(id, TmSink { tm: me.clone(), id }) {
                Ok(x) => x,
                Err(e) => {
                    failed = Some(e);
                    Box::new(Unmade)
                }
            },
            core: Mutex::new(TmCore {
                state: TmState::Initialized,
                slots: Slab::default(),
                qlen: [0; QueueType::COUNT],
                recv_list: VecDeque::new(),
                stats: [QueueStats::default(); QueueType::COUNT],
                eps: FastMap::default(),
                eps_sweep_at: 64,
                ep_cache: VecDeque::new(),
                own_ep: None,
                own_addr: None,
                sync: false,
                pending: VecDeque::new(),
                notify: None,
                stop_posted: false,
                stop_deferred: false,
                timers: BTreeSet::new(),
                armed: None,
                no_buffers: 0,
                rejected: 0,
                event_seq: 0,
            }),
            cond: Condvar::new(),
            callback,
            deliver_lock: Mutex::new(()),
            earliest: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            loss_pending: AtomicBool::new(false),
            spare: LeafMutex::new(Vec::new()),
            colour: std::sync::atomic::AtomicU32::new(crate::pool::ANY_COLOUR),
            me: me.clone(),
        });
        if let Some(e) = failed {
            return Err(e);
        }
        dom.inner.tms.fetch_add(1, Ordering::AcqRel);
        debug!(tm = %id, dom = dom.inner.id, "transfer machine init");
        Ok(Self {
            h: TmHandle { inner },
            finalized: false,
        })
    }

    /// A shareable handle.
    pub fn handle(&self) -> TmHandle {
        self.h.clone()
    }

    /// Finalises the transfer machine: waits for running callbacks, then
    /// releases its own end point and the transport's resources.
    ///
    /// # Errors
    /// `WrongState` unless INITIALIZED, STOPPED or FAILED; `Busy` while
    /// buffers are queued, events await `deliver_all`, or the application
    /// still holds end points; `ApiMisuse` from the transfer machine's own
    /// callback. The transfer machine is handed back.
    pub fn fini(mut self) -> Result<(), FiniError<Self>> {
        match self.h.inner.fini(false) {
            Ok(()) => {
                self.finalized = true;
                Ok(())
            }
            Err(error) => Err(FiniError {
                error,
                object: self,
            }),
        }
    }

    fn shutdown(inner: &Arc<TmInner>) {
        let h = TmHandle {
            inner: Arc::clone(inner),
        };
        let state = h.state();
        let needs_stop = match state {
            TmState::Starting | TmState::Started => true,
            TmState::Initialized => h.queued() > 0,
            _ => false,
        };
        if needs_stop && let Err(e) = h.stop(true) {
            warn!(tm = %inner.id, %e, "stop on drop failed");
        }
        if matches!(
            h.state(),
            TmState::Stopping | TmState::Stopped | TmState::Failed
        ) && let Err(e) = h.wait_stopped(Duration::from_secs(30))
        {
            error!(tm = %inner.id, %e, "transfer machine did not stop on drop; leaking it");
            return;
        }
        if let Err(e) = inner.fini(true) {
            error!(tm = %inner.id, %e, "transfer machine could not be finalised on drop");
        }
    }
}

impl Drop for TransferMachine {
    fn drop(&mut self) {
        if self.finalized || self.h.state() == TmState::Undefined {
            return;
        }
        let inner = Arc::clone(&self.h.inner);
        if on_delivery_thread() || in_data_view() {
            // Cannot wait for callbacks on a thread that may be the one
            // to deliver them: finish elsewhere.
            let spawned = std::thread::Builder::new()
                .name("colibri-tm-drop".into())
                .spawn(move || Self::shutdown(&inner));
            if let Err(e) = spawned {
                error!(%e, "could not spawn a thread to finalise a dropped transfer machine");
            }
            return;
        }
        Self::shutdown(&inner);
    }
}
