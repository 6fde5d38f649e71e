//! Transfer machines.
//!
//! See the crate documentation for the object model. This module holds the
//! core's bookkeeping: the table of queued buffers, statistics, end points,
//! event posting (with per-buffer serialization and synchronous delivery),
//! and the lifecycle.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tracing::{debug, error, trace, warn};

use crate::buffer::{BufState, BufferCallbacks, BufferEvent, NetBuffer};
use crate::clock::TimerTarget;
use crate::desc::{DescFields, NetBufDesc};
use crate::domain::{Domain, DomainInner};
use crate::ep::{EndPoint, EpInner};
use crate::error::{AddError, FiniError, NetError, Result};
use crate::queue::QueueType;
use crate::sink::Job;
use crate::slab::Slab;
use crate::stats::QueueStats;
use crate::util::{
    CallbackGuard, in_callback_of, in_data_view, instant_to_nanos, nanos_to_instant, next_id,
    random_u64,
};
use crate::xprt::{
    Caps, ClaimError, DelReason, Delivery, Limits, PassiveClaim, PassiveError, QueuedBuf,
    RecvClaim, TmSink, XprtData, XprtTm,
};

/// Identifier of a transfer machine, unique in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TmId(pub u64);

impl fmt::Display for TmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tm{}", self.0)
    }
}

/// States of a transfer machine.
///
/// ```text
/// UNDEFINED -> INITIALIZED -> STARTING -> STARTED -> STOPPING -> STOPPED
///                   |             |  \                   ^          |
///                   |             |   `-> FAILED         |          v
///                   `-------------+----------------------'      UNDEFINED (fini)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmState {
    /// Finalised (or never initialised).
    Undefined,
    /// Initialised, not started. Message receive buffers may be added.
    Initialized,
    /// Start requested; STARTED or FAILED follows as an event.
    Starting,
    /// Operational.
    Started,
    /// Stop requested; STOPPED follows as an event once every buffer
    /// completed.
    Stopping,
    /// Stopped; may only be finalised.
    Stopped,
    /// Start failed; may only be finalised.
    Failed,
}

/// Parameters of a message receive buffer: how many messages it may hold.
///
/// The buffer stays queued after a message while it has at least
/// `min_receive_size` bytes left and has received fewer than
/// `max_receive_msgs` messages. The default is one message per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvParams {
    /// Space that must remain for the buffer to stay queued (at least 1).
    pub min_receive_size: usize,
    /// Most messages the buffer takes (at least 1).
    pub max_receive_msgs: u32,
}

impl Default for RecvParams {
    fn default() -> Self {
        Self::single()
    }
}

impl RecvParams {
    /// One message per buffer.
    pub const fn single() -> Self {
        Self {
            min_receive_size: 1,
            max_receive_msgs: 1,
        }
    }

    /// Up to `max_msgs` messages, while at least `min_size` bytes remain.
    pub const fn multi(min_size: usize, max_msgs: u32) -> Self {
        Self {
            min_receive_size: min_size,
            max_receive_msgs: max_msgs,
        }
    }
}

/// Identifies one add of a buffer: use it to cancel the operation
/// ([`TmHandle::del`]) or to query its state. A token never matches a later
/// add of the same buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufToken {
    pub(crate) tm: u64,
    pub(crate) key: u64,
}

impl BufToken {
    /// The transfer machine of the add.
    pub fn tm(&self) -> TmId {
        TmId(self.tm)
    }

    /// The token as a number (what descriptors carry).
    pub fn raw(&self) -> u64 {
        self.key
    }
}

/// A buffer operation: the queue to add to, with what that queue needs.
#[derive(Debug, Clone, Copy)]
pub enum AddOp<'a> {
    /// Receive unsolicited messages.
    MsgRecv(RecvParams),
    /// Send the first `len` bytes of the buffer to `ep`.
    MsgSend {
        /// Destination (an end point of this transfer machine).
        ep: &'a EndPoint,
        /// Bytes to send.
        len: usize,
    },
    /// Let a remote transfer machine write into the buffer. Returns a
    /// descriptor. With `actor`, only that end point may use it.
    PassiveRecv {
        /// The only end point allowed to use the descriptor, if any.
        actor: Option<&'a EndPoint>,
    },
    /// Let a remote transfer machine read the first `len` bytes. Returns a
    /// descriptor. With `actor`, only that end point may use it.
    PassiveSend {
        /// Bytes offered.
        len: usize,
        /// The only end point allowed to use the descriptor, if any.
        actor: Option<&'a EndPoint>,
    },
    /// Read the remote passive send buffer named by `desc` into this one.
    ActiveRecv {
        /// Descriptor from the passive side.
        desc: &'a NetBufDesc,
    },
    /// Write the first `len` bytes into the remote passive receive buffer
    /// named by `desc`.
    ActiveSend {
        /// Descriptor from the passive side.
        desc: &'a NetBufDesc,
        /// Bytes to write.
        len: usize,
    },
}

impl AddOp<'_> {
    /// The queue this operation adds to.
    pub fn queue(&self) -> QueueType {
        match self {
            Self::MsgRecv(_) => QueueType::MsgRecv,
            Self::MsgSend { .. } => QueueType::MsgSend,
            Self::PassiveRecv { .. } => QueueType::PassiveBulkRecv,
            Self::PassiveSend { .. } => QueueType::PassiveBulkSend,
            Self::ActiveRecv { .. } => QueueType::ActiveBulkRecv,
            Self::ActiveSend { .. } => QueueType::ActiveBulkSend,
        }
    }
}

/// A successful add.
#[derive(Debug, Clone)]
pub struct Added {
    /// Token of the add.
    pub token: BufToken,
    /// The descriptor, for the passive queues.
    pub desc: Option<NetBufDesc>,
}

/// A transfer machine event.
#[derive(Debug, Clone)]
pub struct TmEvent {
    /// What happened.
    pub kind: TmEventKind,
    /// When it was posted.
    pub time: Instant,
}

/// Kinds of transfer machine events.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TmEventKind {
    /// The transfer machine changed state. `ep` is its own end point, on
    /// the change to STARTED.
    StateChange {
        /// The new state.
        state: TmState,
        /// `Ok`, or why a start failed.
        status: Result<()>,
        /// The transfer machine's own end point (STARTED only).
        ep: Option<EndPoint>,
    },
    /// An error outside any buffer's context (for example `NoBuffers`: a
    /// message was dropped because no receive buffer was free).
    Error(NetError),
    /// A transport-specific diagnostic.
    Diagnostic(String),
}

/// The transfer machine event callback.
pub type TmCallback = dyn Fn(&TmHandle, &TmEvent) + Send + Sync;

/// Senders' end points a transfer machine keeps alive.
const EP_CACHE: usize = 64;

pub(crate) const F_IN_USE: u8 = 1;
pub(crate) const F_CANCEL: u8 = 2;
pub(crate) const F_TIMED_OUT: u8 = 4;

/// A queued buffer: the parameters of its operation and its memory.
pub(crate) struct Slot {
    pub(crate) token: u64,
    pub(crate) tm_id: u64,
    pub(crate) queue: QueueType,
    pub(crate) length: usize,
    pub(crate) size: usize,
    /// Destination of a send; released when the buffer completes, even if
    /// the transport keeps its `QueuedBuf`.
    pub(crate) ep: Mutex<Option<EndPoint>>,
    pub(crate) actor: Option<String>,
    pub(crate) desc: Option<Box<DescFields>>,
    pub(crate) cookie: u64,
    pub(crate) recv: RecvParams,
    pub(crate) deadline: Option<Instant>,
    pub(crate) add_time: Instant,
    pub(crate) reg: Option<XprtData>,
    pub(crate) callbacks: Arc<BufferCallbacks>,
    pub(crate) buf: Mutex<Option<NetBuffer>>,
    flags: AtomicU8,
    rs: Mutex<RecvState>,
    events: Mutex<SlotEvents>,
}

/// Reservations of a message receive buffer. Several messages may be
/// written into one buffer at once, each into its own reserved region;
/// their events are delivered in reservation order, the final one last.
#[derive(Default)]
struct RecvState {
    /// End of the reserved space.
    reserved: usize,
    /// Messages reserved (released reservations excluded).
    claimed: u32,
    /// Messages delivered.
    delivered: u32,
    next_seq: u64,
    next_drain: u64,
    inflight: Few<(u64, Claim)>,
    /// Finished reservations waiting for earlier ones; `None` for a
    /// released one.
    ready: Few<(u64, Option<Ready>)>,
    /// The final reservation was made (or the buffer is being failed):
    /// no more claims.
    closed: bool,
}

struct Claim {
    offset: usize,
    len: usize,
    fin: bool,
}

struct Ready {
    status: Result<()>,
    offset: usize,
    len: usize,
    sender: Option<EndPoint>,
    fin: bool,
}

impl Slot {
    pub(crate) fn flag(&self, f: u8) -> bool {
        self.flags.load(Ordering::Acquire) & f != 0
    }
    fn set(&self, f: u8) {
        self.flags.fetch_or(f, Ordering::AcqRel);
    }
    fn clear(&self, f: u8) {
        self.flags.fetch_and(!f, Ordering::AcqRel);
    }
}

#[derive(Default)]
struct SlotEvents {
    busy: bool,
    backlog: VecDeque<EvData>,
}

struct EvData {
    status: Result<()>,
    offset: usize,
    length: usize,
    sender: Option<EndPoint>,
    time: Instant,
    fin: bool,
    msgs: u32,
}

/// A small ordered collection holding its first element inline: the
/// events one post produces (almost always one), the reservations of a
/// receive buffer in flight (usually one). Only a second element allocates.
struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Few<T> {
    fn push(&mut self, v: T) {
        if self.first.is_none() {
            self.first = Some(v);
        } else {
            self.rest.push(v);
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(self.rest.iter())
    }

    /// Removes and returns the first element matching `pred`, keeping the
    /// order of the others.
    fn take(&mut self, pred: impl Fn(&T) -> bool) -> Option<T> {
        if self.first.as_ref().is_some_and(&pred) {
            let v = self.first.take();
            if !self.rest.is_empty() {
                self.first = Some(self.rest.remove(0));
            }
            return v;
        }
        let i = self.rest.iter().position(pred)?;
        Some(self.rest.remove(i))
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

type Out = Few<EvData>;

pub(crate) enum Post<'a> {
    Complete(Result<usize>),
    Msg {
        seq: u64,
        len: usize,
        sender: &'a str,
    },
    Hole {
        seq: u64,
    },
}

struct TmCore {
    state: TmState,
    slots: Slab<Arc<Slot>>,
    qlen: [usize; QueueType::COUNT],
    recv_list: VecDeque<u64>,
    stats: [QueueStats; QueueType::COUNT],
    eps: HashMap<String, Weak<EpInner>>,
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

    /// Publishes the earliest deadline and arms the clock's timer when it
    /// moved earlier than the one armed.
    fn update_earliest(&self, core: &mut TmCore) {
        let first = core.timers.first().map(|(d, _)| *d);
        self.earliest
            .store(first.map_or(0, instant_to_nanos), Ordering::Release);
        if let Some(d) = first
            && core.armed.is_none_or(|a| d < a)
        {
            core.armed = Some(d);
            let me: Weak<dyn TimerTarget> = self.me.clone();
            self.dom.clock.arm(d, me);
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        nanos_to_instant(self.earliest.load(Ordering::Acquire))
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
            if core.ep_cache.len() >= EP_CACHE
                && let Some(old) = core.ep_cache.pop_front()
            {
                old.0.cached.store(false, Ordering::Release);
            }
            core.ep_cache.push_back(ep.clone());
        }
        Ok(ep)
    }

    /// Synchronous delivery mode: queues buffer events for `deliver_all`.
    /// Returns the one-shot notify hook to run (once the lock is released).
    fn queue_pending(
        &self,
        core: &mut TmCore,
        items: impl IntoIterator<Item = (Arc<Slot>, EvData)>,
    ) -> Delivery {
        core.pending.extend(items);
        self.cond.notify_all();
        Delivery {
            job: core.notify.take().map(Job::Hook),
        }
    }

    /// A transfer machine event to run (state change, error, diagnostic,
    /// or a coalesced loss event with `loss`). Counted as running until its
    /// callback returned. Transfer machine events are never held for
    /// `deliver_all`, in synchronous mode too.
    fn tm_event(self: &Arc<Self>, core: &mut TmCore, kind: TmEventKind, loss: bool) -> Delivery {
        let ev = TmEvent {
            kind,
            time: Instant::now(),
        };
        core.event_seq += 1;
        self.running.fetch_add(1, Ordering::AcqRel);
        Delivery {
            job: Some(Job::Tm(Arc::clone(self), Box::new(ev), loss)),
        }
    }

    /// Delivers a transfer machine event on this thread. Consumes the lock
    /// guard.
    fn emit_tm(self: &Arc<Self>, mut core: MutexGuard<'_, TmCore>, kind: TmEventKind) {
        let d = self.tm_event(&mut core, kind, false);
        drop(core);
        // Waiters on the state or the event sequence see it before the
        // callback runs.
        self.cond.notify_all();
        d.run();
    }

    /// Posts a loss event (`NoBuffers`, a refused bulk request) to be run
    /// by the transport on this transfer machine's own thread: the caller is
    /// usually another transfer machine's thread, which must never run (and
    /// wait for) this one's callback. Coalesced: while one loss event is
    /// posted and not dispatched, further ones are only counted (in the
    /// statistics and counters), so a flood of drops cannot flood the
    /// application. Consumes the lock guard.
    fn loss_event(self: &Arc<Self>, mut core: MutexGuard<'_, TmCore>, error: NetError) -> Delivery {
        if self.loss_pending.swap(true, Ordering::AcqRel) {
            return Delivery::default();
        }
        let d = self.tm_event(&mut core, TmEventKind::Error(error), true);
        drop(core);
        self.cond.notify_all();
        d
    }

    /// Runs a transfer machine event's callback (from a `Delivery`).
    pub(crate) fn run_tm_event(self: &Arc<Self>, ev: TmEvent, loss: bool) {
        if loss {
            self.loss_pending.store(false, Ordering::Release);
        }
        self.call_tm_cb(&ev);
        // The event holds end point references: release them before the
        // callback counts as finished, so that fini sees them gone.
        drop(ev);
        self.finish_callback();
    }

    fn call_tm_cb(self: &Arc<Self>, ev: &TmEvent) {
        let h = TmHandle {
            inner: Arc::clone(self),
        };
        let _g = CallbackGuard::enter(self.id.0);
        if catch_unwind(AssertUnwindSafe(|| (self.callback)(&h, ev))).is_err() {
            error!(tm = %self.id, "transfer machine event callback panicked");
        }
    }

    fn finish_callback(self: &Arc<Self>) {
        if self.running.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // The last running callback finished: deliver a STOPPED that
        // waited for it, and wake fini and wait_stopped.
        let mut core = self.core.lock();
        if core.stop_deferred && self.running.load(Ordering::Acquire) == 0 {
            core.stop_deferred = false;
            self.running.fetch_add(1, Ordering::AcqRel);
            drop(core);
            self.deliver_stopped();
            return;
        }
        drop(core);
        self.cond.notify_all();
    }

    /// Delivers STOPPED (counted as running by the caller): the state
    /// becomes STOPPED as its event is delivered, as in Motr.
    pub(crate) fn deliver_stopped(self: &Arc<Self>) {
        let ev = {
            let mut core = self.core.lock();
            core.state = TmState::Stopped;
            core.event_seq += 1;
            TmEvent {
                kind: TmEventKind::StateChange {
                    state: TmState::Stopped,
                    status: Ok(()),
                    ep: None,
                },
                time: Instant::now(),
            }
        };
        debug!(tm = %self.id, "stopped");
        self.cond.notify_all();
        self.call_tm_cb(&ev);
        drop(ev);
        self.finish_callback();
    }

    /// Completes every queued buffer with `Cancelled` (a failed start).
    /// Returns the callbacks to run once the lock is released.
    fn cancel_all(self: &Arc<Self>, core: &mut TmCore) -> Vec<Delivery> {
        let left: Vec<Arc<Slot>> = core.slots.iter().cloned().collect();
        if !left.is_empty() {
            debug!(tm = %self.id, n = left.len(), "completing queued buffers with Cancelled");
        }
        left.into_iter()
            .map(|s| {
                s.set(F_CANCEL);
                self.post_locked(
                    core,
                    &QueuedBuf(s),
                    Post::Complete(Err(NetError::Cancelled)),
                )
            })
            .collect()
    }

    /// Ends a queued buffer's operation (cancel, timeout, stop): a buffer
    /// the transport does not use is completed here, its callback run by
    /// one of the transport's threads; one in use is the transport's to
    /// end.
    fn cancel_slot(self: &Arc<Self>, core: &mut TmCore, slot: &Arc<Slot>, reason: DelReason) {
        let q = QueuedBuf(Arc::clone(slot));
        if slot.flag(F_IN_USE) {
            self.xprt.buf_del(&q, reason);
            return;
        }
        let d = self.post_locked(core, &q, Post::Complete(Err(NetError::Cancelled)));
        if d.is_pending() {
            self.xprt.deliver(d);
        }
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

    fn live<'a>(core: &'a TmCore, q: &QueuedBuf) -> Option<&'a Arc<Slot>> {
        core.slots.get(q.0.token).filter(|s| Arc::ptr_eq(s, &q.0))
    }

    pub(crate) fn begin_use(&self, q: &QueuedBuf) -> bool {
        let core = self.core.lock();
        match Self::live(&core, q) {
            Some(s) if !s.flag(F_CANCEL) => {
                s.set(F_IN_USE);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn release_claim(self: &Arc<Self>, q: &QueuedBuf) {
        let mut core = self.core.lock();
        let Some(s) = Self::live(&core, q).cloned() else {
            return;
        };
        s.clear(F_IN_USE);
        if core.state == TmState::Stopping && !s.flag(F_CANCEL) {
            // The stop spared it because it was in use; it is not any
            // more, so it goes now.
            s.set(F_CANCEL);
        }
        if s.flag(F_CANCEL) {
            // A deletion arrived while the buffer was in use: now that it
            // is not, the core completes it.
            self.cancel_slot(&mut core, &s, DelReason::Cancel);
        }
    }

    pub(crate) fn lookup(&self, token: BufToken) -> Option<QueuedBuf> {
        if token.tm != self.id.0 {
            return None;
        }
        let core = self.core.lock();
        core.slots.get(token.key).cloned().map(QueuedBuf)
    }

    fn remove_slot(&self, core: &mut TmCore, slot: &Slot) {
        core.slots.remove(slot.token);
        // The reference a send holds on its end point ends with the send.
        drop(slot.ep.lock().take());
        core.qlen[slot.queue.index()] -= 1;
        if slot.queue == QueueType::MsgRecv
            && let Some(pos) = core.recv_list.iter().position(|&k| k == slot.token)
        {
            core.recv_list.remove(pos);
        }
        if let Some(d) = slot.deadline {
            core.timers.remove(&(d, slot.token));
            self.update_earliest(core);
        }
    }

    /// A report about a buffer from its transport: the callbacks to run.
    pub(crate) fn post_buffer(self: &Arc<Self>, q: &QueuedBuf, post: Post<'_>) -> Delivery {
        let mut core = self.core.lock();
        let d = self.post_locked(&mut core, q, post);
        drop(core);
        // For wait_event_after (cheap when nobody waits).
        self.cond.notify_all();
        d
    }

    /// Applies a report about a buffer (a completion, a message, a
    /// released reservation), from the transport or from the core itself.
    /// Returns the callbacks to run once the lock is released: the buffer's
    /// pending events, or in synchronous mode the notify hook.
    fn post_locked(self: &Arc<Self>, core: &mut TmCore, q: &QueuedBuf, post: Post<'_>) -> Delivery {
        let slot = &q.0;
        if Self::live(core, q).is_none() {
            trace!(tm = %self.id, token = slot.token, "event for a buffer no longer queued ignored");
            return Delivery::default();
        }
        let now = Instant::now();
        let mut out = Out::default();
        let (fin, redel);
        match post {
            Post::Complete(res) => {
                let status = match res {
                    Ok(n) => Ok(n),
                    Err(NetError::Cancelled) if slot.flag(F_TIMED_OUT) => Err(NetError::TimedOut),
                    Err(e) => Err(e),
                };
                let length = *status.as_ref().unwrap_or(&0);
                (fin, redel) = (true, false);
                out.push(EvData {
                    status: status.map(|_| ()),
                    offset: 0,
                    length,
                    sender: None,
                    time: now,
                    fin: true,
                    msgs: slot.rs.lock().delivered,
                });
            }
            Post::Msg { .. } | Post::Hole { .. } if slot.queue != QueueType::MsgRecv => {
                warn!(tm = %self.id, queue = %slot.queue, "message posted on a non-receive buffer: ignored");
                return Delivery::default();
            }
            Post::Msg { seq, len, sender } => {
                let Some((_, c)) = slot.rs.lock().inflight.take(|(k, _)| *k == seq) else {
                    warn!(tm = %self.id, seq, "message for an unknown reservation ignored");
                    return Delivery::default();
                };
                let (status, len, sender) = match self.sender_ep(core, sender) {
                    Ok(ep) => (Ok(()), len.min(c.len), Some(ep)),
                    Err(e) => {
                        warn!(tm = %self.id, sender, %e, "message from an unparseable sender address");
                        (
                            Err(NetError::Protocol(format!(
                                "sender address {sender:?}: {e}"
                            ))),
                            0,
                            None,
                        )
                    }
                };
                let mut rs = slot.rs.lock();
                rs.ready.push((
                    seq,
                    Some(Ready {
                        status,
                        offset: c.offset,
                        len,
                        sender,
                        fin: c.fin,
                    }),
                ));
                (fin, redel) = self.drain_recv(core, slot, &mut rs, now, &mut out);
            }
            Post::Hole { seq } => {
                let mut rs = slot.rs.lock();
                let Some((_, c)) = rs.inflight.take(|(k, _)| *k == seq) else {
                    warn!(tm = %self.id, seq, "release of an unknown reservation ignored");
                    return Delivery::default();
                };
                rs.claimed -= 1;
                if c.fin {
                    // The last reservation: give its space back and reopen.
                    rs.closed = false;
                    if rs.reserved == c.offset + c.len {
                        rs.reserved = c.offset;
                    }
                }
                rs.ready.push((seq, None));
                (fin, redel) = self.drain_recv(core, slot, &mut rs, now, &mut out);
            }
        }
        if fin {
            self.remove_slot(core, slot);
        }
        for ev in out.iter() {
            core.stats[slot.queue.index()].record_event(
                ev.status.is_ok(),
                ev.length,
                ev.fin.then(|| now.saturating_duration_since(slot.add_time)),
            );
            trace!(tm = %self.id, token = slot.token, queue = %slot.queue, ok = ev.status.is_ok(), fin = ev.fin, "buffer event");
        }
        core.event_seq += out.len() as u64;
        let d = if out.is_empty() {
            Delivery::default()
        } else if core.sync {
            self.queue_pending(core, out.into_iter().map(|ev| (Arc::clone(slot), ev)))
        } else {
            self.running.fetch_add(out.len(), Ordering::AcqRel);
            // Queued under the transfer machine's lock, so events of one
            // buffer are delivered in the order they were posted.
            let mut se = slot.events.lock();
            se.backlog.extend(out);
            if std::mem::replace(&mut se.busy, true) {
                Delivery::default()
            } else {
                Delivery {
                    job: Some(Job::Buf(Arc::clone(self), Arc::clone(slot))),
                }
            }
        };
        if redel {
            // Spared by a deletion or a stop while messages were being
            // written into it; now idle, it goes (after the events above).
            if !slot.flag(F_CANCEL) {
                slot.set(F_CANCEL);
                core.stats[slot.queue.index()].dels += 1;
            }
            self.cancel_slot(core, slot, DelReason::Cancel);
        }
        if core.state == TmState::Stopping && core.slots.len() == 0 {
            self.finish_stop(core);
        }
        d
    }

    /// Moves finished reservations of a receive buffer, in order, into
    /// `out`. Returns (the buffer completed, the buffer is idle and must be
    /// deleted).
    fn drain_recv(
        &self,
        core: &TmCore,
        slot: &Slot,
        rs: &mut RecvState,
        now: Instant,
        out: &mut Out,
    ) -> (bool, bool) {
        let leaving = slot.flag(F_CANCEL) || core.state == TmState::Stopping;
        while let Some((_, entry)) = {
            let next = rs.next_drain;
            rs.ready.take(|(k, _)| *k == next)
        } {
            rs.next_drain += 1;
            let Some(r) = entry else {
                continue;
            };
            rs.delivered += 1;
            let last = rs.inflight.is_empty() && rs.ready.is_empty();
            let fin = r.fin || (last && leaving);
            out.push(EvData {
                status: r.status,
                offset: r.offset,
                length: r.len,
                sender: r.sender,
                time: now,
                fin,
                msgs: rs.delivered,
            });
            if fin {
                return (true, false);
            }
        }
        if rs.inflight.is_empty() {
            slot.clear(F_IN_USE);
            return (false, leaving);
        }
        (false, false)
    }

    pub(crate) fn run_delivery(self: &Arc<Self>, slot: &Arc<Slot>) {
        loop {
            let ev = {
                let mut se = slot.events.lock();
                match se.backlog.pop_front() {
                    Some(ev) => ev,
                    None => {
                        se.busy = false;
                        return;
                    }
                }
            };
            self.dispatch_buffer(slot, ev);
            self.finish_callback();
        }
    }

    fn dispatch_buffer(self: &Arc<Self>, slot: &Arc<Slot>, ev: EvData) {
        let (buffer, view) = if ev.fin {
            let mut nb = slot.buf.lock().take();
            if let Some(b) = nb.as_mut() {
                b.timeout_reset();
                b.set_msgs_received(ev.msgs);
            }
            (nb, None)
        } else {
            (None, Some(Arc::clone(slot)))
        };
        let event = BufferEvent {
            queue: slot.queue,
            status: ev.status,
            offset: ev.offset,
            length: ev.length,
            sender: ev.sender,
            time: ev.time,
            token: BufToken {
                tm: self.id.0,
                key: slot.token,
            },
            msgs: ev.msgs,
            buffer,
            slot: view,
        };
        let Some(cb) = slot.callbacks.get(slot.queue).cloned() else {
            error!(tm = %self.id, queue = %slot.queue, "no callback for a queued buffer");
            return;
        };
        let h = TmHandle {
            inner: Arc::clone(self),
        };
        let _g = CallbackGuard::enter(self.id.0);
        if catch_unwind(AssertUnwindSafe(|| cb(&h, event))).is_err() {
            error!(tm = %self.id, queue = %slot.queue, "buffer callback panicked");
        }
    }

    pub(crate) fn claim_recv(self: &Arc<Self>, len: usize) -> Result<RecvClaim, ClaimError> {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return Err(ClaimError::NotStarted);
        }
        let mut victim: Option<Arc<Slot>> = None;
        for &key in &core.recv_list {
            let Some(slot) = core.slots.get(key) else {
                continue;
            };
            if slot.flag(F_CANCEL) {
                continue;
            }
            let mut rs = slot.rs.lock();
            if rs.closed {
                continue;
            }
            if slot.size - rs.reserved >= len {
                let seq = rs.next_seq;
                rs.next_seq += 1;
                let offset = rs.reserved;
                rs.reserved += len;
                rs.claimed += 1;
                let fin = rs.claimed >= slot.recv.max_receive_msgs
                    || slot.size - rs.reserved < slot.recv.min_receive_size;
                rs.closed = fin;
                rs.inflight.push((seq, Claim { offset, len, fin }));
                slot.set(F_IN_USE);
                return Ok(RecvClaim {
                    buf: QueuedBuf(Arc::clone(slot)),
                    offset,
                    len,
                    seq,
                });
            }
            if rs.reserved == 0 && rs.inflight.is_empty() && victim.is_none() {
                victim = Some(Arc::clone(slot));
            }
        }
        if let Some(v) = victim {
            v.rs.lock().closed = true;
            v.set(F_IN_USE);
            return Err(ClaimError::TooLarge {
                space: v.size,
                victim: QueuedBuf(v),
            });
        }
        core.stats[QueueType::MsgRecv.index()].f_events += 1;
        core.no_buffers += 1;
        debug!(tm = %self.id, len, "message dropped: no receive buffer");
        let notice = self.loss_event(core, NetError::NoBuffers);
        Err(ClaimError::NoBuffers { notice })
    }

    pub(crate) fn claim_passive(
        self: &Arc<Self>,
        f: &DescFields,
        requester: &str,
        active: QueueType,
        active_size: usize,
    ) -> Result<PassiveClaim, PassiveError> {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return Err(PassiveError {
                error: NetError::Unreachable(f.owner.clone()),
                notice: Delivery::default(),
            });
        }
        let found = core
            .slots
            .get(f.token)
            .filter(|s| s.queue.is_passive() && s.cookie == f.cookie)
            .cloned();
        let reject = match &found {
            None => Some(NetError::NoEntry),
            Some(s) if s.flag(F_CANCEL) => Some(NetError::NoEntry),
            Some(s) if s.flag(F_IN_USE) => Some(NetError::Busy(
                "passive buffer is already in use by another transfer".into(),
            )),
            Some(s) => {
                let len = if s.queue == QueueType::PassiveBulkSend {
                    s.length
                } else {
                    s.size
                };
                if f.queue != s.queue
                    || f.len != len as u64
                    || core.own_addr.as_deref() != Some(f.owner.as_str())
                    || f.actor != s.actor
                {
                    Some(NetError::InvalidDescriptor(
                        "descriptor fields do not match the buffer it names".into(),
                    ))
                } else if s.queue.bulk_peer() != Some(active) {
                    Some(NetError::WrongQueue {
                        passive: s.queue,
                        active,
                    })
                } else if let Some(actor) = s.actor.as_deref().filter(|a| *a != requester) {
                    Some(NetError::AccessDenied {
                        requester: requester.to_string(),
                        allowed: actor.to_string(),
                    })
                } else if s.queue == QueueType::PassiveBulkSend && active_size < s.length {
                    Some(NetError::TooBig(format!(
                        "active receive buffer of {active_size} bytes for {} bytes offered",
                        s.length
                    )))
                } else if s.queue == QueueType::PassiveBulkRecv && active_size > s.size {
                    Some(NetError::TooBig(format!(
                        "active send of {active_size} bytes into a passive buffer of {} bytes",
                        s.size
                    )))
                } else {
                    None
                }
            }
        };
        let slot = match (reject, found) {
            (None, Some(slot)) => slot,
            (reject, _) => {
                // Refused without touching the passive buffer: it stays
                // queued for the transfer it was made for.
                let error = reject.unwrap_or(NetError::NoEntry);
                core.rejected += 1;
                debug!(tm = %self.id, requester, %error, "active bulk request refused");
                let notice = self.loss_event(core, error.clone());
                return Err(PassiveError { error, notice });
            }
        };
        slot.set(F_IN_USE);
        let len = if slot.queue == QueueType::PassiveBulkSend {
            slot.length
        } else {
            active_size
        };
        Ok(PassiveClaim {
            buf: QueuedBuf(slot),
            len,
        })
    }

    /// Expires every buffer whose deadline is at or before `now`: the core
    /// completes idle ones (`TimedOut`) and asks the transport to end the
    /// operations in flight. A deletion asked before never keeps a timeout
    /// from firing. Returns how many buffers expired.
    pub(crate) fn handle_timeout(self: &Arc<Self>, now: Instant) -> usize {
        let mut core = self.core.lock();
        core.armed = None;
        let mut n = 0;
        while let Some(&(d, key)) = core.timers.first() {
            if d > now {
                break;
            }
            core.timers.pop_first();
            if let Some(slot) = core.slots.get(key).cloned()
                && !slot.flag(F_TIMED_OUT)
            {
                slot.set(F_TIMED_OUT | F_CANCEL);
                trace!(tm = %self.id, token = key, "buffer timed out");
                self.cancel_slot(&mut core, &slot, DelReason::Timeout);
                n += 1;
            }
        }
        self.update_earliest(&mut core);
        n
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
        while self.running.load(Ordering::Acquire) > 0 || core.stop_deferred {
            self.cond.wait(&mut core);
        }
        core.state = TmState::Undefined;
        let own = core.own_ep.take();
        core.eps.clear();
        drop(core);
        drop(own);
        self.xprt.fini();
        self.dom.tms.fetch_sub(1, Ordering::AcqRel);
        self.cond.notify_all();
        debug!(tm = %self.id, "finalised");
        Ok(())
    }
}

impl TimerTarget for TmInner {
    fn on_timer(&self, now: Instant) {
        if let Some(me) = self.me.upgrade() {
            me.handle_timeout(now);
        }
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

fn check_len(len: usize, size: usize) -> Result<()> {
    if len == 0 {
        return Err(NetError::InvalidArgument("zero length".into()));
    }
    if len > size {
        return Err(NetError::InvalidArgument(format!(
            "length {len} beyond a buffer of {size} bytes"
        )));
    }
    Ok(())
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

    fn decode_desc(&self, desc: &NetBufDesc) -> Result<DescFields> {
        let f = desc.decode()?;
        let mine = self.inner.dom.caps.transport_id;
        if f.transport_id != mine {
            return Err(NetError::InvalidDescriptor(format!(
                "made by transport {:#x}, this is {:#x}",
                f.transport_id, mine
            )));
        }
        Ok(f)
    }

    fn check_ep(&self, ep: &EndPoint) -> Result<()> {
        if ep.tm_id() != self.inner.id {
            return Err(NetError::ForeignEndPoint(ep.addr().to_string()));
        }
        Ok(())
    }

    /// Adds a buffer to a queue, starting the operation `op` describes.
    ///
    /// The buffer moves into the transfer machine; its final completion
    /// event hands it back. Refusals hand it back at once, with the reason:
    /// buffer of another domain, no callback for the queue, wrong state
    /// (message receive buffers may be added from INITIALIZED until
    /// STOPPING, the others only when STARTED), a zero or too large length,
    /// an end point of another transfer machine, receive parameters that
    /// cannot work, an undecodable descriptor or one made by another
    /// transport, a timeout already past, or an optional feature the
    /// transport lacks.
    ///
    /// # Errors
    /// [`AddError`] with the reason and the buffer.
    pub fn add(&self, buf: NetBuffer, op: AddOp<'_>) -> Result<Added, AddError> {
        match self.add_checked(buf, op) {
            Ok(added) => Ok(added),
            Err((error, buffer)) => {
                debug!(tm = %self.inner.id, queue = %op.queue(), %error, "add refused");
                Err(AddError { error, buffer })
            }
        }
    }

    fn add_checked(
        &self,
        buf: NetBuffer,
        op: AddOp<'_>,
    ) -> std::result::Result<Added, (NetError, NetBuffer)> {
        macro_rules! check {
            ($e:expr) => {
                if let Err(e) = $e {
                    return Err((e, buf));
                }
            };
        }
        check!(self.inner.check_api());
        if !Arc::ptr_eq(buf.dom(), &self.inner.dom) {
            return Err((NetError::WrongDomain, buf));
        }
        let queue = op.queue();
        let Some(callbacks) = buf.callbacks().filter(|c| c.has(queue)).cloned() else {
            return Err((NetError::NoCallback(queue), buf));
        };
        let size = buf.len();
        let caps = self.inner.dom.caps;
        let mut length = 0;
        let mut ep = None;
        let mut actor: Option<String> = None;
        let mut desc = None;
        let mut recv = RecvParams::default();
        match op {
            AddOp::MsgRecv(p) => {
                if p.max_receive_msgs == 0 || p.min_receive_size == 0 || p.min_receive_size > size {
                    return Err((
                        NetError::InvalidArgument(format!(
                            "receive parameters {p:?} for a buffer of {size} bytes"
                        )),
                        buf,
                    ));
                }
                if p.max_receive_msgs > 1 && !caps.multi_message {
                    return Err((
                        NetError::Unsupported {
                            transport: self.inner.dom.xprt.name(),
                            what: "several messages per receive buffer",
                        },
                        buf,
                    ));
                }
                recv = p;
            }
            AddOp::MsgSend { ep: e, len } => {
                check!(check_len(len, size));
                check!(self.check_ep(e));
                ep = Some(e.clone());
                length = len;
            }
            AddOp::PassiveRecv { actor: a } | AddOp::PassiveSend { actor: a, .. } => {
                if let AddOp::PassiveSend { len, .. } = op {
                    check!(check_len(len, size));
                    length = len;
                }
                if let Some(a) = a {
                    check!(self.check_ep(a));
                    actor = Some(a.addr().to_string());
                }
            }
            AddOp::ActiveRecv { desc: d } | AddOp::ActiveSend { desc: d, .. } => {
                if let AddOp::ActiveSend { len, .. } = op {
                    check!(check_len(len, size));
                    length = len;
                }
                match self.decode_desc(d) {
                    Ok(f) => desc = Some(Box::new(f)),
                    Err(e) => return Err((e, buf)),
                }
            }
        }
        let deadline = buf.timeout();
        let now = Instant::now();
        if let Some(d) = deadline {
            let now = self.inner.dom.clock.now();
            if !caps.timeouts {
                return Err((
                    NetError::Unsupported {
                        transport: self.inner.dom.xprt.name(),
                        what: "buffer timeouts",
                    },
                    buf,
                ));
            }
            if d <= now {
                return Err((NetError::TimeoutInPast, buf));
            }
        }
        let mut core = self.inner.core.lock();
        let allowed = match queue {
            QueueType::MsgRecv => matches!(
                core.state,
                TmState::Initialized | TmState::Starting | TmState::Started
            ),
            _ => core.state == TmState::Started,
        };
        if !allowed {
            let state = core.state;
            drop(core);
            return Err((NetError::WrongState { op: "add", state }, buf));
        }
        let cookie = if queue.is_passive() { random_u64() } else { 0 };
        let reg = buf.reg();
        let tm_id = self.inner.id.0;
        let mut buf = Some(buf);
        let key = core.slots.insert_with(|key| {
            Arc::new(Slot {
                token: key,
                tm_id,
                queue,
                length,
                size,
                ep: Mutex::new(ep),
                actor: actor.clone(),
                desc,
                cookie,
                recv,
                deadline,
                add_time: now,
                reg,
                callbacks,
                buf: Mutex::new(buf.take()),
                flags: AtomicU8::new(0),
                rs: Mutex::new(RecvState::default()),
                events: Mutex::new(SlotEvents::default()),
            })
        });
        let slot = match core.slots.get(key) {
            Some(s) => Arc::clone(s),
            None => unreachable!("slot inserted above"),
        };
        let q = QueuedBuf(Arc::clone(&slot));
        let undo = |core: &mut TmCore, e: NetError| {
            core.slots.remove(key);
            let buffer = slot.buf.lock().take().expect(
                "the buffer was placed in its slot above and nobody takes it before completion",
            );
            (e, buffer)
        };
        let out_desc = if queue.is_passive() {
            let owner = core.own_addr.clone().unwrap_or_default();
            let extra = match self.inner.xprt.desc_extra(&q) {
                Ok(x) => x,
                Err(e) => return Err(undo(&mut core, e)),
            };
            let fields = DescFields {
                transport_id: caps.transport_id,
                queue,
                len: if queue == QueueType::PassiveBulkSend {
                    length as u64
                } else {
                    size as u64
                },
                token: key,
                cookie,
                owner,
                actor,
                extra,
            };
            match NetBufDesc::encode(&fields, self.inner.dom.limits.max_desc_size) {
                Ok(d) => Some(d),
                Err(e) => return Err(undo(&mut core, e)),
            }
        } else {
            None
        };
        // Publish the deadline before the transport sees the buffer: a
        // transport wakes its timer loop in buf_add, and that loop must
        // then find the new earliest deadline.
        if let Some(d) = deadline {
            core.timers.insert((d, key));
            self.inner.update_earliest(&mut core);
        }
        if let Err(e) = self.inner.xprt.buf_add(&q) {
            if let Some(d) = deadline {
                core.timers.remove(&(d, key));
                self.inner.update_earliest(&mut core);
            }
            return Err(undo(&mut core, e));
        }
        core.qlen[queue.index()] += 1;
        core.stats[queue.index()].adds += 1;
        if queue == QueueType::MsgRecv {
            core.recv_list.push_back(key);
        }
        trace!(tm = %self.inner.id, token = key, %queue, "added");
        Ok(Added {
            token: BufToken { tm: tm_id, key },
            desc: out_desc,
        })
    }

    /// Adds a message receive buffer.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_msg_recv(&self, buf: NetBuffer, params: RecvParams) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::MsgRecv(params)).map(|a| a.token)
    }

    /// Sends the first `len` bytes of `buf` to `ep`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_msg_send(
        &self,
        buf: NetBuffer,
        ep: &EndPoint,
        len: usize,
    ) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::MsgSend { ep, len }).map(|a| a.token)
    }

    /// Offers `buf` for a remote active bulk send; returns its descriptor.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_passive_recv(
        &self,
        buf: NetBuffer,
        actor: Option<&EndPoint>,
    ) -> Result<(BufToken, NetBufDesc), AddError> {
        self.add(buf, AddOp::PassiveRecv { actor })
            .map(|a| (a.token, a.desc.unwrap_or_default()))
    }

    /// Offers the first `len` bytes of `buf` for a remote active bulk
    /// receive; returns its descriptor.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_passive_send(
        &self,
        buf: NetBuffer,
        len: usize,
        actor: Option<&EndPoint>,
    ) -> Result<(BufToken, NetBufDesc), AddError> {
        self.add(buf, AddOp::PassiveSend { len, actor })
            .map(|a| (a.token, a.desc.unwrap_or_default()))
    }

    /// Reads the remote passive send buffer named by `desc` into `buf`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_active_recv(&self, buf: NetBuffer, desc: &NetBufDesc) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::ActiveRecv { desc }).map(|a| a.token)
    }

    /// Writes the first `len` bytes of `buf` into the remote passive receive
    /// buffer named by `desc`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_active_send(
        &self,
        buf: NetBuffer,
        desc: &NetBufDesc,
        len: usize,
    ) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::ActiveSend { desc, len })
            .map(|a| a.token)
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

    /// Switches to synchronous event delivery: buffer events wait until
    /// [`TmHandle::deliver_all`] runs them on the caller's thread (transfer
    /// machine events, state changes and errors, are delivered as in the
    /// default mode, as Motr does). Only in INITIALIZED.
    ///
    /// # Errors
    /// `Unsupported` if the transport cannot, `WrongState` otherwise.
    pub fn set_sync_delivery(&self) -> Result<()> {
        self.inner.check_api()?;
        if !self.inner.dom.caps.sync_delivery {
            return Err(NetError::Unsupported {
                transport: self.inner.dom.xprt.name(),
                what: "synchronous event delivery",
            });
        }
        let mut core = self.inner.core.lock();
        if core.state != TmState::Initialized {
            return Err(NetError::WrongState {
                op: "set_sync_delivery",
                state: core.state,
            });
        }
        core.sync = true;
        Ok(())
    }

    /// True in synchronous delivery mode.
    pub fn is_sync_delivery(&self) -> bool {
        self.inner.core.lock().sync
    }

    /// True when events wait for [`TmHandle::deliver_all`].
    pub fn events_pending(&self) -> bool {
        !self.inner.core.lock().pending.is_empty()
    }

    /// Runs every pending event's callback on this thread, in posting
    /// order; returns how many ran.
    ///
    /// # Errors
    /// `ApiMisuse` outside synchronous mode, or from inside one of this
    /// transfer machine's callbacks.
    pub fn deliver_all(&self) -> Result<usize> {
        self.inner.check_api()?;
        if in_callback_of(self.inner.id.0) {
            return Err(NetError::ApiMisuse(
                "deliver_all called from one of the transfer machine's own callbacks".into(),
            ));
        }
        if !self.inner.core.lock().sync {
            return Err(NetError::ApiMisuse(
                "deliver_all needs synchronous delivery mode".into(),
            ));
        }
        let _serial = self.inner.deliver_lock.lock();
        let mut n = 0;
        loop {
            let item = {
                let mut core = self.inner.core.lock();
                match core.pending.pop_front() {
                    Some(p) => {
                        self.inner.running.fetch_add(1, Ordering::AcqRel);
                        p
                    }
                    None => break,
                }
            };
            let (slot, ev) = item;
            self.inner.dispatch_buffer(&slot, ev);
            self.inner.finish_callback();
            n += 1;
        }
        Ok(n)
    }

    /// Arms a one-shot hook called (on the posting thread) when the next
    /// event becomes pending in synchronous mode; called at once if events
    /// are already pending. Replaces a hook not yet fired.
    pub fn notify(&self, hook: impl FnOnce() + Send + 'static) {
        let mut core = self.inner.core.lock();
        if core.pending.is_empty() {
            core.notify = Some(Box::new(hook));
        } else {
            drop(core);
            hook();
        }
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

    /// The earliest deadline of a queued buffer, if any (lock-free).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }

    /// Expires every buffer whose deadline is at or before `now` (time as
    /// an input: the domain's [`Clock`](crate::Clock) calls this by itself;
    /// call it directly to drive timeouts by hand). Idle buffers complete
    /// with `TimedOut`; operations in flight are ended by the transport.
    /// No callback runs on the calling thread. Returns how many expired.
    pub fn handle_timeout(&self, now: Instant) -> usize {
        self.inner.handle_timeout(now)
    }

    /// Number of events posted so far (buffer and transfer machine events).
    /// Pair with [`TmHandle::wait_event_after`].
    pub fn event_seq(&self) -> u64 {
        self.inner.core.lock().event_seq
    }

    /// Blocks until an event is posted after sequence number `seq` (see
    /// [`TmHandle::event_seq`]) or `timeout` passes. Returns true if one
    /// was.
    pub fn wait_event_after(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut core = self.inner.core.lock();
        while core.event_seq <= seq {
            if self.inner.cond.wait_until(&mut core, deadline).timed_out() {
                return core.event_seq > seq;
            }
        }
        true
    }

    /// Blocks until the state satisfies `pred` or `timeout` passes.
    ///
    /// # Errors
    /// `TimedOut`.
    pub fn wait_state(&self, pred: impl Fn(TmState) -> bool, timeout: Duration) -> Result<TmState> {
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
    /// stopped while waiting for STARTED.
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
    /// `TimedOut`.
    pub fn wait_stopped(&self, timeout: Duration) -> Result<()> {
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
                eps: HashMap::new(),
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
        if in_callback_of(inner.id.0) || in_data_view() {
            // Cannot wait for our own callbacks here: finish elsewhere.
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
