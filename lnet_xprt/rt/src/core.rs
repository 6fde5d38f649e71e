//! The node behind its lock, the pump that carries its outputs out, the
//! runtime thread (timers, loopback LND, reaper ticks) and event delivery.
//!
//! Lock order: the node lock is taken first and only briefly; under it we
//! may take the parked-message maps and push into unbounded channels (event
//! queue, runtime thread), nothing else. User code (event handlers), socket
//! I/O and region locks are never reached with the node lock held.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use colibri_lnet::fault::HealthError;
use colibri_lnet::health::HealthStatus;
use colibri_lnet::ids::Nid;
use colibri_lnet::matching::Event;
use colibri_lnet::nidmap::KeyedMap;
use colibri_lnet::node::Payload;
use colibri_lnet::node::{
    Node, PayloadOutcome, PingError, RxAction, RxId, Transmit, TxId, Withdrawal,
};
use colibri_lnet::time::Time;
use colibri_lnet::wire::PingInfo;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::mem::{MemTable, Resolved, RouterBuffers, copy_pieces};
use crate::stats::{Counters, add};

const TARGET: &str = "colibri_lnet_rt";

/// What a node's events hook is told: where it is called from.
pub type EventHook = Arc<dyn Fn(HookCall) + Send + Sync>;

/// Where an [`EventHook`] is called from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookCall {
    /// A socket LND scheduler thread, between two turns of its loop: it
    /// holds no lock and no connection state, so the hook may take the
    /// node's events and run the application's code on it (as Lustre's
    /// event callbacks run in its LND threads). The scheduler's sockets
    /// wait meanwhile.
    Scheduler,
    /// Any other thread: the application's own (an API call that produced
    /// events), the runtime thread, connection daemons. The hook must not
    /// run application code there; it wakes whoever takes the events.
    Other,
}

thread_local! {
    /// Events went into the queue from this thread since the hook last ran.
    static QUEUED: Cell<bool> = const { Cell::new(false) };
    /// This thread is a socket scheduler (it calls the hook at its own
    /// safe points).
    static SCHEDULER: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a socket scheduler (for its life).
pub(crate) fn mark_scheduler_thread() {
    SCHEDULER.with(|c| c.set(true));
}

/// An LND driven by the runtime (the socket LND; loopback is built in).
pub(crate) trait Lnd: Send + Sync {
    /// Takes a transmit; `Err` completes it at once with that status.
    /// Transmits the LND finished at once (written by the calling thread)
    /// complete through `done`.
    fn send(
        &self,
        s: &Shared,
        tx: Transmit,
        done: &mut Vec<Input>,
        now: Time,
    ) -> Result<(), HealthStatus>;
    /// The action for a parked message; `false` if no connection holds it.
    fn resume(&self, s: &Shared, rx: RxId, action: RxAction) -> bool;
    /// Takes back a transmit not started on the wire (waiting for a
    /// connection, or queued on one); `false` if it is being written or
    /// gone (it then completes as usual).
    fn withdraw(&self, w: Withdrawal) -> bool;
    /// Periodic work: keepalives, timeouts, reconnections. It runs every
    /// `tick`, and earlier when asked ([`Shared::tick_at`]).
    fn tick(&self, s: &Shared, now: Time);
    /// Stops threads and closes connections (failing what they held).
    fn shutdown(&self, s: &Shared);
}

/// A node input that the runtime batches.
#[derive(Debug)]
pub(crate) enum Input {
    /// `handle_tx_done`.
    TxDone(TxId, Result<(), HealthError>),
    /// `handle_payload`.
    Payload(RxId, PayloadOutcome),
    /// `handle_tx_withdrawn`: the LND gave the transmit back unsent.
    Withdrawn(TxId),
    /// `notify`: the LND's word on a peer NI (`lnet_notify`).
    Notify {
        /// The local NI.
        ni: Nid,
        /// The peer NI.
        peer: Nid,
        /// Alive or down.
        alive: bool,
    },
    /// `set_ni_link`: the link watch's word on a local NI.
    Link {
        /// The local NI.
        ni: Nid,
        /// Its link is up.
        up: bool,
    },
}

/// The node and what lives with it under the node lock.
pub(crate) struct Core {
    pub(crate) node: Node,
    ping_waiters: HashMap<Nid, VecDeque<Sender<Result<PingInfo, PingError>>>>,
    /// The latest time the node was given: a time read before the lock
    /// was taken (a scheduler's turn, [`Shared::run_at`]) is raised to it,
    /// so that the node's time never goes back.
    last_now: Time,
}

impl Core {
    pub(crate) fn add_ping_waiter(&mut self, nid: Nid, s: Sender<Result<PingInfo, PingError>>) {
        self.ping_waiters.entry(nid).or_default().push_back(s);
    }
}

/// Messages to the runtime thread.
#[derive(Debug)]
pub(crate) enum RtMsg {
    /// A loopback transmit.
    Lo(Box<Transmit>),
    /// The action for a parked loopback message.
    LoResume(RxId, RxAction),
    /// Re-read the node's deadline.
    Wake,
    /// Stop.
    Stop,
}

/// State shared by every thread of one runtime.
pub(crate) struct Shared {
    epoch: Instant,
    pub(crate) core: Mutex<Core>,
    pub(crate) mem: MemTable,
    pub(crate) rbufs: RouterBuffers,
    pub(crate) counters: Counters,
    pub(crate) rt_tx: Sender<RtMsg>,
    events_tx: Sender<Event>,
    /// Loopback messages parked by the node, with their transmit.
    lo_parked: Mutex<KeyedMap<RxId, Transmit>>,
    pub(crate) lnd: OnceLock<Arc<crate::sock::SockLnd>>,
    pub(crate) shutdown: AtomicBool,
    /// The runtime thread's current wake-up time (ns on the runtime's clock).
    deadline: AtomicU64,
    /// When the LND asked for its periodic work to run before the next
    /// tick (a reconnection due after its back-off), `u64::MAX` if not.
    lnd_due: AtomicU64,
    /// Called when events were queued (`Lnet::set_event_hook`).
    hook: parking_lot::RwLock<Option<EventHook>>,
}

/// Converts a health status to the node's completion error.
pub(crate) fn health_error(s: HealthStatus) -> Result<(), HealthError> {
    Err(match s {
        HealthStatus::Ok => return Ok(()),
        HealthStatus::LocalInterrupt => HealthError::LocalInterrupt,
        HealthStatus::LocalDropped => HealthError::LocalDropped,
        HealthStatus::LocalAborted => HealthError::LocalAborted,
        HealthStatus::LocalNoRoute => HealthError::LocalNoRoute,
        HealthStatus::LocalTimeout => HealthError::LocalTimeout,
        HealthStatus::LocalError => HealthError::LocalError,
        HealthStatus::RemoteDropped => HealthError::RemoteDropped,
        HealthStatus::RemoteError => HealthError::RemoteError,
        HealthStatus::RemoteTimeout => HealthError::RemoteTimeout,
        HealthStatus::NetworkTimeout => HealthError::NetworkTimeout,
    })
}

/// What one pass over the node produced, to carry out without its lock.
#[derive(Default)]
struct Outputs {
    transmits: Vec<Transmit>,
    actions: Vec<(RxId, RxAction)>,
    releases: Vec<RxId>,
    withdrawals: Vec<Withdrawal>,
}

impl Outputs {
    fn is_empty(&self) -> bool {
        self.transmits.is_empty()
            && self.actions.is_empty()
            && self.releases.is_empty()
            && self.withdrawals.is_empty()
    }
}

impl Shared {
    pub(crate) fn new(
        node: Node,
        rt_tx: Sender<RtMsg>,
        events_tx: Sender<Event>,
        rbufs: RouterBuffers,
    ) -> Self {
        Self {
            // Start the time line one second in, so no timer sits at 0.
            epoch: Instant::now()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or_else(Instant::now),
            core: Mutex::new(Core {
                node,
                ping_waiters: HashMap::new(),
                last_now: Time::ZERO,
            }),
            mem: MemTable::default(),
            rbufs,
            counters: Counters::default(),
            rt_tx,
            events_tx,
            lo_parked: Mutex::new(KeyedMap::default()),
            lnd: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
            lnd_due: AtomicU64::new(u64::MAX),
            hook: parking_lot::RwLock::new(None),
        }
    }

    /// Sets (or clears) the events hook.
    pub(crate) fn set_hook(&self, hook: Option<EventHook>) {
        *self.hook.write() = hook;
    }

    /// Sets the events hook unless one is set; whether it did.
    pub(crate) fn try_set_hook(&self, hook: EventHook) -> bool {
        let mut h = self.hook.write();
        if h.is_some() {
            return false;
        }
        *h = Some(hook);
        true
    }

    /// Tells the hook about events this thread queued: on a scheduler at
    /// its safe point (`HookCall::Scheduler`), elsewhere at once.
    fn call_hook(&self, from: HookCall) {
        if !QUEUED.with(|q| q.replace(false)) {
            return;
        }
        let hook = self.hook.read().clone();
        if let Some(h) = hook {
            h(from);
        }
    }

    /// A scheduler's safe point: no lock held, no connection borrowed.
    pub(crate) fn scheduler_safe_point(&self) {
        self.call_hook(HookCall::Scheduler);
    }

    /// The runtime's clock.
    pub(crate) fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The `Instant` of a runtime time.
    pub(crate) fn instant(&self, t: Time) -> Instant {
        self.epoch
            .checked_add(t.since_epoch())
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    /// Applies `inputs`, then `f`, under the node lock; then carries out
    /// what the node produced (transmits to LNDs, resumed receives,
    /// released buffers) without the lock, and repeats while that produced
    /// new inputs (transmits that failed at once).
    pub(crate) fn run<R>(&self, inputs: Vec<Input>, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let mut inputs = inputs;
        self.run_at(&mut inputs, None, f)
    }

    /// [`Shared::run`] with the caller's vector of inputs, which it leaves
    /// empty with its capacity (a scheduler keeps one for its life, so that
    /// a message read allocates nothing for its completions), at `at`
    /// (a socket scheduler's turn, read once for all it does in the turn;
    /// raised to the node's latest time) or, without it, at the time read
    /// under the node's lock. One time serves every pass of the call and
    /// the LNDs' transmits: they are microseconds apart, and a clock read
    /// costs tens of nanoseconds (several per message).
    pub(crate) fn run_at<R>(
        &self,
        inputs: &mut Vec<Input>,
        at: Option<Time>,
        f: impl FnOnce(&mut Core, Time) -> R,
    ) -> R {
        let mut f = Some(f);
        let mut result = None;
        let mut at = at;
        loop {
            let (out, now) = {
                let mut core = self.core.lock();
                let now = at.unwrap_or_else(|| self.now()).max(core.last_now);
                core.last_now = now;
                at = Some(now);
                apply(&mut core.node, now, inputs.drain(..));
                if let Some(f) = f.take() {
                    result = Some(f(&mut core, now));
                }
                (self.collect(&mut core), now)
            };
            if !out.is_empty() {
                self.dispatch(out, inputs, now);
            }
            if inputs.is_empty() {
                break;
            }
        }
        if !SCHEDULER.with(Cell::get) {
            self.call_hook(HookCall::Other);
        }
        match result {
            Some(r) => r,
            None => unreachable!("run calls f exactly once"),
        }
    }

    /// Takes the node's outputs. Events go into the event channel here,
    /// under the lock, so they keep the node's order.
    fn collect(&self, core: &mut Core) -> Outputs {
        let mut out = Outputs::default();
        let node = &mut core.node;
        while let Some(tx) = node.poll_transmit() {
            out.transmits.push(tx);
        }
        while let Some(a) = node.poll_rx_action() {
            out.actions.push(a);
        }
        while let Some(rx) = node.poll_rx_release() {
            out.releases.push(rx);
        }
        while let Some(w) = node.poll_withdrawal() {
            out.withdrawals.push(w);
        }
        while let Some(ev) = node.poll_event() {
            if self.events_tx.send(ev).is_err() {
                tracing::trace!(target: TARGET, "event dropped: nobody listens");
            }
            QUEUED.with(|q| q.set(true));
        }
        while let Some(r) = node.poll_ping_result() {
            let mut r = Some(r);
            if let Some(q) = core
                .ping_waiters
                .get_mut(&r.as_ref().map_or(Nid::ANY, |r| r.nid))
            {
                while let Some(s) = q.pop_front() {
                    let Some(res) = r.take() else { break };
                    match s.try_send(res.result.clone()) {
                        Ok(()) => break,
                        Err(_) => r = Some(res),
                    }
                }
            }
        }
        core.ping_waiters.retain(|_, q| !q.is_empty());
        // Wake the runtime thread if the node's next timer is earlier than
        // the time it sleeps until.
        if let Some(t) = core.node.poll_timeout()
            && t.as_nanos() < self.deadline.load(Ordering::Acquire)
        {
            self.deadline.store(t.as_nanos(), Ordering::Release);
            let _ = self.rt_tx.send(RtMsg::Wake);
        }
        out
    }

    /// Carries out node outputs; completions of transmits that ended at
    /// once (written, or failed) go into `inputs`.
    fn dispatch(&self, out: Outputs, inputs: &mut Vec<Input>, now: Time) {
        for rx in out.releases {
            self.rbufs.release(rx);
        }
        for tx in out.transmits {
            if (tx.to.is_lo() || tx.from.is_lo()) && self.shutdown.load(Ordering::Acquire) {
                inputs.push(Input::TxDone(tx.id, Err(HealthError::LocalDropped)));
                continue;
            }
            if tx.to.is_lo() || tx.from.is_lo() {
                if let Err(crossbeam_channel::SendError(RtMsg::Lo(tx))) =
                    self.rt_tx.send(RtMsg::Lo(Box::new(tx)))
                {
                    tracing::debug!(target: TARGET, "loopback transmit after shutdown");
                    inputs.push(Input::TxDone(tx.id, Err(HealthError::LocalDropped)));
                }
                continue;
            }
            let id = tx.id;
            let r = match self.lnd.get() {
                Some(lnd) if !self.shutdown.load(Ordering::Acquire) => {
                    lnd.send(self, tx, inputs, now)
                }
                _ => {
                    tracing::debug!(target: TARGET, to = %tx.to, "no LND for this transmit");
                    Err(HealthStatus::LocalDropped)
                }
            };
            if let Err(s) = r {
                inputs.push(Input::TxDone(id, health_error(s)));
            }
        }
        // After the transmits: one of them may be the message asked back.
        for w in out.withdrawals {
            if self.lnd.get().is_some_and(|l| l.withdraw(w)) {
                inputs.push(Input::Withdrawn(w.id));
            }
        }
        for (rx, action) in out.actions {
            if self.lo_parked.lock().contains_key(&rx) {
                let _ = self.rt_tx.send(RtMsg::LoResume(rx, action));
                continue;
            }
            let resumed = self.lnd.get().is_some_and(|l| l.resume(self, rx, action));
            if !resumed {
                // The connection is gone; it reported the message failed.
                tracing::debug!(target: TARGET, ?rx, "action for a message no connection holds");
            }
        }
    }

    // ------------------------------------------------------------------
    // Loopback LND (Lustre's lolnd): the transmit is parsed by the same
    // node, and its payload moved memory to memory once.

    fn lo_send(&self, tx: Transmit) {
        let header = tx.header;
        let parked = &self.lo_parked;
        let action = self.run(Vec::new(), |core, now| {
            let a = core.node.handle_header(now, Nid::LO_0, Nid::LO_0, &header);
            if let Ok(RxAction::Wait { rx }) = a {
                // Under the node lock, before anyone can see the action.
                parked.lock().insert(rx, tx.clone());
            }
            a
        });
        match action {
            Err(e) => {
                tracing::warn!(target: TARGET, error = %e, "loopback message refused");
                self.run(
                    vec![Input::TxDone(tx.id, Err(HealthError::LocalError))],
                    |_, _| (),
                );
            }
            Ok(RxAction::Wait { .. }) => {}
            Ok(a) => self.lo_complete(tx, a),
        }
    }

    fn lo_resume(&self, rx: RxId, action: RxAction) {
        let Some(tx) = self.lo_parked.lock().remove(&rx) else {
            return;
        };
        self.lo_complete(tx, action);
    }

    fn lo_complete(&self, tx: Transmit, action: RxAction) {
        let mut inputs = Vec::new();
        let mut tx_ok = true;
        match action {
            RxAction::None | RxAction::Wait { .. } => {}
            RxAction::Discard { len } => add(&self.counters.discarded_bytes, u64::from(len)),
            RxAction::Deliver { rx, mem, .. } => {
                let ok = self
                    .mem
                    .resolve(mem)
                    .is_some_and(|dst| self.lo_move(&tx.payload, &dst));
                if ok {
                    add(&self.counters.loopback_copy_bytes, u64::from(mem.len));
                } else {
                    // The memory went away (deregistered, or its owner
                    // aborted): the application's doing, counted.
                    tracing::debug!(target: TARGET, ?mem, "loopback delivery failed: memory gone");
                    tx_ok = false;
                }
                let outcome = if ok {
                    PayloadOutcome::Received
                } else {
                    PayloadOutcome::Failed
                };
                inputs.push(Input::Payload(rx, outcome));
            }
            RxAction::Inline { rx, len, .. } => {
                let v = self.lo_copy(&tx.payload, |src| {
                    let mut v = vec![0; len as usize];
                    (copy_pieces(src, &mut [&mut v[..]]) == v.len()).then_some(v)
                });
                match v.flatten() {
                    Some(v) => {
                        add(&self.counters.loopback_copy_bytes, u64::from(len));
                        inputs.push(Input::Payload(rx, PayloadOutcome::Inline(v)));
                    }
                    None => {
                        tx_ok = false;
                        inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
                    }
                }
            }
            RxAction::Forward { rx, pool, len } => {
                let buf = self.lo_copy(&tx.payload, |src| {
                    let mut b = self.rbufs.take(pool, len as usize);
                    let n = copy_pieces(src, &mut [&mut b[..len as usize]]);
                    (n == len as usize).then_some(b)
                });
                match buf.flatten() {
                    Some(b) => {
                        add(&self.counters.loopback_copy_bytes, u64::from(len));
                        self.rbufs.insert(rx, b);
                        inputs.push(Input::Payload(rx, PayloadOutcome::Received));
                    }
                    None => {
                        tx_ok = false;
                        inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
                    }
                }
            }
        }
        let res = if tx_ok {
            Ok(())
        } else {
            add(&self.counters.loopback_failures, 1);
            Err(HealthError::LocalError)
        };
        inputs.push(Input::TxDone(tx.id, res));
        self.run(inputs, |_, _| ());
    }

    /// Runs `f` on the transmit's payload bytes, in pieces (`None` if
    /// they cannot be found), under the source memory's read lock.
    fn lo_copy<R>(&self, p: &Payload, f: impl FnOnce(&[&[u8]]) -> R) -> Option<R> {
        match p {
            Payload::None => Some(f(&[])),
            Payload::Inline(v) => Some(f(&[v])),
            Payload::Rx { rx, len } => {
                let b = self.rbufs.get(*rx)?;
                let len = *len as usize;
                match b.pipe() {
                    None => Some(f(&[b.bytes(len)?])),
                    Some(pipe) => Some(f(&[&pipe.copy_out(&self.rbufs.pipes, len)?])),
                }
            }
            Payload::Mem(r) => self.mem.resolve(*r)?.read(f),
        }
    }

    /// Moves the payload into `dst` (the one copy of the loopback LND).
    /// The runtime thread is the only one that holds two memory locks at
    /// once, so taking the source's and then the destination's cannot
    /// deadlock; one region as both is a `copy_within` (one foreign memory
    /// as both is refused: its lock is taken once).
    fn lo_move(&self, p: &Payload, dst: &Resolved) -> bool {
        if let Payload::Mem(r) = p
            && let Some(src) = self.mem.resolve(*r)
            && src.same_memory(dst)
        {
            let Some(region) = src.region() else {
                return false;
            };
            if src.len < dst.len {
                return false;
            }
            region.write(|g| g.copy_within(src.start..src.start + dst.len, dst.start));
            return true;
        }
        self.lo_copy(p, |bytes| {
            let have: usize = bytes.iter().map(|b| b.len()).sum();
            have >= dst.len
                && dst
                    .write(|d| copy_pieces(bytes, d) == dst.len)
                    .unwrap_or(false)
        })
        .unwrap_or(false)
    }

    // ------------------------------------------------------------------
    // The runtime thread.

    /// Asks for the LND's periodic work at `t` if that is before its next
    /// run (Lustre's connd sleeps until the first `ksnr_timeout`, not a
    /// fixed period): a connection held back by its back-off is tried when
    /// the back-off ends.
    pub(crate) fn tick_at(&self, t: Time) {
        let t = t.as_nanos();
        if self.lnd_due.fetch_min(t, Ordering::SeqCst) > t
            && t < self.deadline.load(Ordering::SeqCst)
        {
            self.deadline.store(t, Ordering::SeqCst);
            let _ = self.rt_tx.send(RtMsg::Wake);
        }
    }

    pub(crate) fn runtime_thread(self: Arc<Self>, rx: Receiver<RtMsg>, tick: Duration) {
        let mut next_tick = self.now().saturating_add(tick);
        loop {
            let node_deadline = self.core.lock().node.poll_timeout();
            let wake_at = node_deadline.map_or(next_tick, |d| d.min(next_tick));
            self.deadline.store(wake_at.as_nanos(), Ordering::SeqCst);
            // Read after the store (`tick_at` does the reverse), so that a
            // request made meanwhile is seen here or wakes us.
            let wake_at = wake_at.min(Time::from_nanos(self.lnd_due.load(Ordering::SeqCst)));
            let msg = rx.recv_deadline(self.instant(wake_at));
            match msg {
                Ok(RtMsg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(RtMsg::Lo(tx)) => self.lo_send(*tx),
                Ok(RtMsg::LoResume(rx, a)) => self.lo_resume(rx, a),
                Ok(RtMsg::Wake) | Err(RecvTimeoutError::Timeout) => {}
            }
            if self.shutdown.load(Ordering::Acquire) {
                break;
            }
            let now = self.now();
            if node_deadline.is_some_and(|d| d <= now)
                || self
                    .core
                    .lock()
                    .node
                    .poll_timeout()
                    .is_some_and(|d| d <= now)
            {
                self.run(Vec::new(), |core, now| core.node.handle_timeout(now));
            }
            let asked = self.lnd_due.load(Ordering::SeqCst) <= now.as_nanos();
            if now >= next_tick || asked {
                if now >= next_tick {
                    next_tick = now.saturating_add(tick);
                }
                self.lnd_due.store(u64::MAX, Ordering::SeqCst);
                if let Some(lnd) = self.lnd.get() {
                    lnd.tick(&self, now);
                }
            }
        }
        // Loopback messages still parked or queued end as failed.
        let parked: Vec<(RxId, Transmit)> = self.lo_parked.lock().drain().collect();
        let mut inputs = Vec::new();
        for (rx, tx) in parked {
            inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
            inputs.push(Input::TxDone(tx.id, Err(HealthError::LocalDropped)));
        }
        while let Ok(m) = rx.try_recv() {
            if let RtMsg::Lo(tx) = m {
                inputs.push(Input::TxDone(tx.id, Err(HealthError::LocalDropped)));
            }
        }
        if !inputs.is_empty() {
            self.run(inputs, |_, _| ());
        }
        // Responses that can no longer come: every tracker expires now, so
        // each operation still waiting for an ACK or REPLY gets its final
        // (TimedOut) event. What this sends fails at once (shutdown).
        for _ in 0..3 {
            if self.core.lock().node.poll_timeout().is_none() {
                break;
            }
            self.run(Vec::new(), |core, _| core.node.handle_timeout(Time::MAX));
        }
        tracing::debug!(target: TARGET, "runtime thread stopped");
    }
}

fn apply(node: &mut Node, now: Time, inputs: impl Iterator<Item = Input>) {
    for i in inputs {
        let r = match i {
            Input::TxDone(id, res) => node.handle_tx_done(now, id, res),
            Input::Payload(rx, outcome) => node.handle_payload(now, rx, outcome),
            Input::Withdrawn(id) => node.handle_tx_withdrawn(now, id),
            Input::Notify { ni, peer, alive } => {
                node.notify(now, ni, peer, alive);
                Ok(())
            }
            Input::Link { ni, up } => node.set_ni_link(now, ni, up).map(|_| ()),
        };
        if let Err(e) = r {
            tracing::warn!(target: TARGET, error = %e, "node refused a completion");
        }
    }
}

/// Calls the application's handler for each event, on its own thread,
/// without any runtime lock held.
/// On `stop` it delivers what is queued and returns.
pub(crate) fn event_thread(
    rx: Receiver<Event>,
    stop: Receiver<()>,
    mut handler: Box<dyn FnMut(Event) + Send>,
) {
    loop {
        crossbeam_channel::select! {
            recv(rx) -> ev => match ev {
                Ok(ev) => handler(ev),
                Err(_) => return,
            },
            recv(stop) -> _ => break,
        }
    }
    while let Ok(ev) = rx.try_recv() {
        handler(ev);
    }
}
