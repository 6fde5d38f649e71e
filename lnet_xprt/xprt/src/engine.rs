//! One engine per LNet node: the thread that reads the node's events and
//! runs the transfer machines' callbacks, the table of operations by MD
//! user value, and the node's transfer machines by portal and TMID.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::{Nid, Pid, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{
    Event, EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeHandle, MeSpec, MemKey, MemRef,
    Threshold, Unlink,
};
use colibri_lnet_rt::colibri_lnet::nidmap::KeyedMap;
use colibri_lnet_rt::{EventHook, HookCall, Lnet, LnetError, MemRegion, Start};
use colibri_net::xprt::{Delivery, QueuedBuf, TmSink};
use colibri_net::{NetError, Result};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use tracing::{debug, trace, warn};

use crate::addr::{
    CNT_CTL, HDR_BULK, HDR_BULK_LAST, HDR_CTL, HDR_MSG, HDR_NOTE, PASSIVE_SPARE, SEQ_MASK,
    TMID_MAX, hdr_data, match_bits, parse_hdr, split_bits,
};
use crate::ctl::{Ctl, DELIVERED_MANY_MAX};
use crate::tm::{Op, TmShared};

/// Work for an engine's thread.
pub(crate) enum Work {
    /// Run callbacks the core decided.
    Deliver(Delivery),
    /// Post STARTED for a transfer machine.
    Started(Arc<TmShared>, String),
    /// Complete a buffer (decided under a transfer machine's lock).
    Complete(TmSink, QueuedBuf, Result<usize>),
    /// Pin the thread to this CPU (a transfer machine's own thread).
    Pin(usize),
}

/// An LNet node seen by the transport.
/// A DELIVERED owed: to the sending machine (process, portal, TMID) from
/// the receiving one (portal, TMID), for the message with sequence number
/// `seq` and `len` bytes received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwedDelivered {
    pub(crate) to: ProcessId,
    pub(crate) portal: u32,
    pub(crate) tmid: u16,
    pub(crate) from: (u32, u16),
    pub(crate) seq: u32,
    pub(crate) len: u64,
}

impl OwedDelivered {
    /// Whether `other` goes from the same machine to the same machine.
    fn same_machines(&self, other: &Self) -> bool {
        (self.to, self.portal, self.tmid, self.from)
            == (other.to, other.portal, other.tmid, other.from)
    }
}

pub(crate) struct Engine {
    pub(crate) lnet: Lnet,
    pub(crate) pid: Pid,
    pub(crate) nids: Vec<Nid>,
    /// Operations by MD user value (operation id).
    ops: Mutex<KeyedMap<u64, Arc<Op>>>,
    /// Control messages being sent: their memory, by MD user value, and
    /// the active operation a request is for.
    ctl_sends: Mutex<KeyedMap<u64, (MemKey, u64)>>,
    /// LANDEDs being sent, by MD user value, with what resends them if
    /// their PUT fails (LNet resends it on another rail first, a bounded
    /// number of times; a lost LANDED would leave the other side waiting
    /// for `handshake_timeout` and failing data that arrived).
    landed_sends: Mutex<KeyedMap<u64, Resend>>,
    /// Started transfer machines by (portal, TMID).
    tms: Mutex<KeyedMap<(u32, u16), Weak<TmShared>>>,
    /// MDs left where a transfer machine stopped: they answer what still
    /// comes for it with `Unreachable`, until another machine starts there.
    pub(crate) tombs: Mutex<KeyedMap<(u32, u16), MdHandle>>,
    /// Per portal a machine of ours used: an ME matching the messages to
    /// every TMID, last in the portal's list (every ME appended after it
    /// goes ahead of it), whose MD answers those for a TMID where no
    /// machine runs (or ever ran) with a NAK `Unreachable`, as a tomb does
    /// ([`Engine::answer_absent`]).
    vacancies: Mutex<KeyedMap<u32, (MeHandle, MdHandle)>>,
    /// Bulk requests waiting for a verdict: (deadline, operation id).
    pub(crate) handshakes: Mutex<BTreeSet<(Instant, u64)>>,
    /// DELIVEREDs owed for messages taken in this turn of the token's
    /// holder: sent when it has taken every queued event, one control
    /// message per sending machine (`flush_delivered`).
    delivered: Mutex<Vec<OwedDelivered>>,
    pub(crate) handshake_timeout: Duration,
    /// The node's events (taken with `try_recv` only: nobody sleeps on
    /// the queue, so queueing one wakes no thread).
    events: Receiver<Event>,
    /// Work for whoever holds the token (taken with `try_recv` only).
    work: Sender<Work>,
    work_rx: Receiver<Work>,
    /// Held by the one thread that takes events and work at a time (a
    /// socket scheduler at its safe point, or the engine thread): the
    /// node's events and the callbacks run in order, one at a time.
    token: AtomicBool,
    /// Handshake deadlines are due for a look (set by the engine thread's
    /// tick, honoured by the token's holder).
    expire_due: AtomicBool,
    /// The engine thread is asked to leave / has left: work then runs on
    /// the thread that queues it.
    stopping: AtomicBool,
    stopped: AtomicBool,
    /// Wakes the engine thread (one pending wake-up is enough).
    wake: Sender<()>,
    /// Loss events (`NoBuffers`, refused bulk requests): run on a thread
    /// of their own, so that a slow error callback never holds up the
    /// counting of further losses or the node's other events.
    notices: Sender<Option<Delivery>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    notice_thread: Mutex<Option<JoinHandle<()>>>,
    /// An empty region: the memory of the catch-all MDs.
    pub(crate) empty: MemKey,
    /// The next operation id ([`Engine::new_id`]), shared by the engines
    /// of one transport (an operation made before its machine started
    /// moves from the first engine to its node's).
    next_id: Arc<AtomicU64>,
}

/// Where a transport's operation ids start when the configuration names
/// no first id: drawn from the clock, the process id and a count of calls
/// (mixed as SplitMix64 does), below 2^48. Ids name bulk requests and
/// sends on the wire (their low 24 bits in match bits and header data),
/// and a process that dies and restarts at the same address must not
/// reuse its last incarnation's, which peers may still hold claims and
/// answers for: Lustre seeds its RPC xids from the clock for the same
/// reason.
pub(crate) fn first_op_id() -> u64 {
    static ENGINES: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ ENGINES
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z & ((1 << 48) - 1)) + 1
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("nids", &self.nids)
            .finish_non_exhaustive()
    }
}

/// Bit of an MD user value that marks a control message's MD.
const CTL_SEND_BIT: u64 = 1 << 63;
/// Bit of an MD user value that marks a portal's vacancy MD (the portal
/// in the low bits).
const VACANCY_BIT: u64 = 1 << 62;

/// LNet errors of API calls as the messaging layer's.
pub(crate) fn lnet_err(e: &LnetError, dest: &str) -> NetError {
    match e.errno() {
        22 => NetError::InvalidArgument(format!("LNet: {e}")),
        14 => NetError::Protocol(format!("LNet memory: {e}")),
        _ => NetError::Unreachable(format!("{dest} ({e})")),
    }
}

impl Engine {
    /// Starts the engine of `lnet` (which must deliver its events to its
    /// queue: the engine consumes them). The node's socket schedulers take
    /// the events themselves through the events hook
    /// ([`Lnet::set_event_hook`]); the engine thread takes what other
    /// threads queue (work from application threads, loopback messages,
    /// timers).
    /// Operation ids come from `ids`, shared by the transport's engines.
    pub(crate) fn start(
        lnet: Lnet,
        cfg: &crate::LnetXprtConfig,
        ids: Arc<AtomicU64>,
    ) -> Result<Arc<Self>> {
        let (handshake_timeout, spin) = (cfg.handshake_timeout, cfg.spin);
        let events = lnet.event_queue().ok_or_else(|| {
            NetError::InvalidArgument(
                "the LNet node delivers its events to a handler; start it with Lnet::start".into(),
            )
        })?;
        let (pid, nids) = lnet.with_node(|n| (n.config().pid, n.nids()));
        // The node's events go to one consumer: this engine claims them
        // before it makes anything, and a second transport over the same
        // node is refused (the two would take each other's events).
        let of: Arc<OnceLock<Weak<Self>>> = Arc::new(OnceLock::new());
        let hook_of = Arc::clone(&of);
        let hook: EventHook = Arc::new(move |from| {
            if let Some(e) = hook_of.get().and_then(Weak::upgrade) {
                match from {
                    HookCall::Scheduler => e.pump(),
                    HookCall::Other => e.hand_over(false),
                }
            }
        });
        if !lnet.try_set_event_hook(hook) {
            let nid = nids
                .first()
                .map_or_else(|| "?".to_string(), ToString::to_string);
            return Err(NetError::Busy(format!(
                "LNet node {nid} already carries an LNet transport (its events go to one \
                 consumer): share that transport (clone it) instead of making another"
            )));
        }
        let lnet_for_err = lnet.clone();
        let unclaim = |e: NetError| {
            lnet_for_err.set_event_hook(None);
            e
        };
        let empty = lnet.register(&MemRegion::zeroed(0));
        // Work items: deliveries and completions, bounded by the buffers
        // queued; the token's holder drains them.
        #[allow(clippy::disallowed_methods)]
        let (work, work_rx) = crossbeam_channel::unbounded();
        let (wake, wake_rx) = crossbeam_channel::bounded(1);
        // Loss events are coalesced by the core: a few at a time.
        #[allow(clippy::disallowed_methods)]
        let (notices, notice_rx) = crossbeam_channel::unbounded::<Option<Delivery>>();
        let nt = std::thread::Builder::new()
            .name("colibri-lnet-xprt-notices".into())
            .spawn(move || {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                while let Ok(Some(d)) = notice_rx.recv() {
                    d.run();
                }
            })
            .map_err(|e| unclaim(NetError::from(e)))?;
        let e = Arc::new(Self {
            lnet,
            pid,
            nids,
            ops: Mutex::new(KeyedMap::default()),
            ctl_sends: Mutex::new(KeyedMap::default()),
            landed_sends: Mutex::new(KeyedMap::default()),
            tms: Mutex::new(KeyedMap::default()),
            tombs: Mutex::new(KeyedMap::default()),
            vacancies: Mutex::new(KeyedMap::default()),
            handshakes: Mutex::new(BTreeSet::new()),
            delivered: Mutex::new(Vec::new()),
            handshake_timeout,
            events,
            work,
            work_rx,
            token: AtomicBool::new(false),
            expire_due: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            wake,
            notices,
            thread: Mutex::new(None),
            notice_thread: Mutex::new(Some(nt)),
            empty,
            next_id: ids,
        });
        let me = Arc::downgrade(&e);
        let t = std::thread::Builder::new()
            .name("colibri-lnet-xprt".into())
            .spawn(move || run(&me, &wake_rx, spin));
        let t = match t {
            Ok(t) => t,
            Err(err) => {
                let _ = e.notices.send(None);
                e.lnet.deregister(e.empty);
                return Err(unclaim(NetError::from(err)));
            }
        };
        *e.thread.lock() = Some(t);
        let _ = of.set(Arc::downgrade(&e));
        // Events queued before the hook knew the engine.
        e.hand_over(false);
        Ok(e)
    }

    /// Takes the node's events and the queued work, unless another thread
    /// holds the token (it then takes what is queued before it lets go).
    /// Runs callbacks: only on a thread that may (a scheduler at its safe
    /// point, the engine thread, or any thread once the engine stopped).
    pub(crate) fn pump(&self) {
        loop {
            if self
                .token
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                // One time for the core's stamps (event times, add times
                // for the queue statistics) of what this pass delivers
                // and of what its callbacks add: a few clock reads fewer
                // per message (`colibri_net::clock::set_step_time`).
                colibri_net::clock::set_step_time(Some(Instant::now()));
                self.drain();
                colibri_net::clock::set_step_time(None);
            }
            self.token.store(false, Ordering::Release);
            // Whatever came while we held the token was left to us.
            fence(Ordering::SeqCst);
            if !self.has_pending() {
                return;
            }
        }
    }

    fn has_pending(&self) -> bool {
        !self.work_rx.is_empty()
            || (!self.events.is_empty() && !self.stopped.load(Ordering::Relaxed))
            || self.expire_due.load(Ordering::Relaxed)
    }

    /// Takes what is queued, then sends the DELIVEREDs owed for the
    /// messages it took.
    fn drain(&self) {
        self.drain_queued();
        self.flush_delivered();
    }

    /// Owes the sender of a message the DELIVERED for it: sent with the
    /// others owed to the same machine once the queued events are taken
    /// (or at once when [`DELIVERED_MANY_MAX`] are owed), so that a
    /// receiver taking a burst of messages answers each sending machine
    /// once instead of once per message.
    pub(crate) fn owe_delivered(&self, d: OwedDelivered) {
        let full = {
            let mut v = self.delivered.lock();
            v.push(d);
            v.len() >= DELIVERED_MANY_MAX
        };
        if full {
            self.flush_delivered();
        }
    }

    /// Sends the DELIVEREDs owed: one DELIVERED_MANY (or a DELIVERED, for
    /// one message) per sending machine, in the order owed.
    fn flush_delivered(&self) {
        let owed = std::mem::take(&mut *self.delivered.lock());
        let mut groups: Vec<(OwedDelivered, Vec<(u32, u64)>)> = Vec::new();
        for d in owed {
            match groups.iter_mut().find(|(k, _)| k.same_machines(&d)) {
                Some((_, acks)) => acks.push((d.seq, d.len)),
                None => groups.push((d, vec![(d.seq, d.len)])),
            }
        }
        for (k, acks) in groups {
            let msg = match acks[..] {
                [(seq, len)] => Ctl::Delivered {
                    xid: u64::from(seq),
                    len,
                },
                _ => Ctl::DeliveredMany { acks },
            };
            let _ = self.send_ctl(k.to, k.portal, k.tmid, k.from, &msg, 0);
        }
    }

    /// Work first: completions and deliveries give buffers back (an echo's
    /// send completing re-queues its receive buffer), so they run before
    /// further messages, which could otherwise find no receive buffer.
    fn drain_queued(&self) {
        loop {
            if self.expire_due.swap(false, Ordering::Relaxed) {
                self.expire_handshakes(Instant::now());
            }
            while let Ok(w) = self.work_rx.try_recv() {
                do_work(w);
            }
            if self.stopped.load(Ordering::Relaxed) {
                // A stopped engine takes no more of the node's events.
                return;
            }
            match self.events.try_recv() {
                Ok(ev) => self.on_event(&ev),
                Err(_) => {
                    if self.work_rx.is_empty() && !self.expire_due.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }
        }
    }

    /// Something was queued on a thread that may not run callbacks: the
    /// token's holder or the engine thread takes it. A queued event is
    /// left alone once the engine stopped (it takes no more); queued
    /// `work` then runs here, on the thread that queued it, as nothing else
    /// would run it (`push`).
    fn hand_over(&self, work: bool) {
        fence(Ordering::SeqCst);
        if self.stopped.load(Ordering::Acquire) {
            if work {
                self.pump();
            }
        } else if !self.token.load(Ordering::Relaxed) {
            let _ = self.wake.try_send(());
        }
    }

    /// Stops the thread (pending work runs first).
    pub(crate) fn stop(&self) {
        self.lnet.set_event_hook(None);
        self.stopping.store(true, Ordering::Release);
        let _ = self.wake.try_send(());
        // Operations refer to their machines, which refer to the engine.
        // What LNet still holds for them, the tombs and the control
        // messages in flight go back to the nodes, which outlive the
        // transport.
        let ops: Vec<Arc<Op>> = self.ops.lock().drain().map(|(_, op)| op).collect();
        for op in ops {
            op.release(self);
        }
        let tombs: Vec<MdHandle> = self.tombs.lock().drain().map(|(_, md)| md).collect();
        let vacancies: Vec<MdHandle> = self
            .vacancies
            .lock()
            .drain()
            .map(|(_, (_, md))| md)
            .collect();
        for md in tombs.into_iter().chain(vacancies) {
            let _ = self.lnet.md_unlink(md);
        }
        let sends: Vec<MemKey> = self
            .ctl_sends
            .lock()
            .drain()
            .map(|(_, (key, _))| key)
            .collect();
        for key in sends {
            self.lnet.deregister(key);
        }
        let _ = self.notices.send(None);
        for t in [self.thread.lock().take(), self.notice_thread.lock().take()]
            .into_iter()
            .flatten()
        {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    /// Runs a loss event on the notice thread.
    pub(crate) fn notice(&self, d: Delivery) {
        if d.is_pending()
            && let Err(e) = self.notices.send(Some(d))
            && let Some(d) = e.0
        {
            d.run();
        }
    }

    pub(crate) fn push(&self, w: Work) {
        if let Err(e) = self.work.send(w) {
            do_work(e.0);
            return;
        }
        self.hand_over(true);
    }

    /// A new operation id, unique in the transport (an operation made
    /// before its machine started moves to the engine of its node then).
    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) & !(CTL_SEND_BIT | VACANCY_BIT)
    }

    pub(crate) fn add_op(&self, op: &Arc<Op>) {
        self.ops.lock().insert(op.id, Arc::clone(op));
    }

    pub(crate) fn op(&self, id: u64) -> Option<Arc<Op>> {
        self.ops.lock().get(&id).cloned()
    }

    pub(crate) fn remove_op(&self, id: u64) -> Option<Arc<Op>> {
        self.ops.lock().remove(&id)
    }

    pub(crate) fn has(&self, nid: Nid) -> bool {
        nid.is_lo() || self.nids.contains(&nid)
    }

    /// Claims (portal, TMID) for `tm`; `None` picks the highest free TMID
    /// (as Motr).
    pub(crate) fn claim(&self, portal: u32, tmid: Option<u16>, tm: &Arc<TmShared>) -> Result<u16> {
        let mut tms = self.tms.lock();
        tms.retain(|_, w| w.strong_count() > 0);
        let t = match tmid {
            Some(t) => {
                if tms.contains_key(&(portal, t)) {
                    return Err(NetError::AddrInUse(format!(
                        "portal {portal} TMID {t} of this LNet node"
                    )));
                }
                t
            }
            None => (0..=TMID_MAX)
                .rev()
                .find(|t| !tms.contains_key(&(portal, *t)))
                .ok_or_else(|| NetError::AddrInUse(format!("every TMID of portal {portal}")))?,
        };
        tms.insert((portal, t), Arc::downgrade(tm));
        drop(tms);
        if let Some(md) = self.tombs.lock().remove(&(portal, t)) {
            let _ = self.lnet.md_unlink(md);
        }
        self.ensure_vacancy(portal);
        Ok(t)
    }

    /// Puts the portal's vacancy in place, the first time a machine of
    /// ours takes an address on it: appended, so that it stays behind
    /// everything the portal held, and everything appended later goes
    /// ahead of it ([`Engine::attach_at`]).
    fn ensure_vacancy(&self, portal: u32) {
        if self.vacancies.lock().contains_key(&portal) {
            return;
        }
        // A tomb for every TMID: any counter. Last on the ignore list,
        // which LNet searches before the exact MEs: every ME of ours has
        // ignore bits (a control ME [`PASSIVE_SPARE`]), so none is behind
        // it on the exact list.
        let me = MeSpec {
            portal,
            match_id: ProcessId::ANY,
            match_bits: 0,
            // Any TMID, any counter.
            ignore_bits: u64::MAX,
            unlink: Unlink::Unlink,
            pos: InsertPos::After,
        };
        // Empty, as a tomb's: a message or PUT is taken whole and dropped,
        // and answered (`answer_absent`); a GET (a passive side's, for a
        // requester that is not there) gets a REPLY of no bytes.
        let md = MdSpec::new(
            MemRef::new(self.empty, 0, 0),
            MdOptions::OP_PUT
                .with(MdOptions::OP_GET)
                .with(MdOptions::TRUNCATE)
                .with(MdOptions::ACK_DISABLE),
        )
        .threshold(Threshold::Infinite)
        .unlink(Unlink::Unlink)
        .user_ptr(VACANCY_BIT | u64::from(portal));
        // No lock held across the node's turn; two machines starting at
        // once may both attach one: the second goes.
        match self.lnet.me_md_attach(me, md) {
            Ok(v) => {
                let extra = match self.vacancies.lock().entry(portal) {
                    std::collections::hash_map::Entry::Occupied(_) => Some(v.1),
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(v);
                        None
                    }
                };
                if let Some(md) = extra {
                    let _ = self.lnet.md_unlink(md);
                }
            }
            Err(err) => {
                debug!(portal, %err, "no vacancy ME: messages to absent machines will time out")
            }
        }
    }

    /// What a machine that is not there answers (a stopped machine's tomb
    /// for it, or the portal's vacancy for any TMID, `from` being the
    /// address the message was for): a message gets a NAK `Unreachable`,
    /// a request or a passive side's bulk PUT a GONE (the claim goes
    /// back; a GET got its REPLY of no bytes from the empty MD), a note
    /// nothing (an answered note could be a GONE to another tomb, which
    /// would answer it).
    pub(crate) fn answer_absent(&self, ev: &Event, from: (u32, u16)) {
        if ev.kind() != EventKind::Put || ev.info.status.is_err() {
            return;
        }
        let Some((kind, portal, tmid, seq)) = parse_hdr(ev.info.hdr_data) else {
            return;
        };
        let xid = u64::from(seq);
        let answer = match kind {
            HDR_MSG => Ctl::Nak {
                xid,
                status: NetError::Unreachable(String::new()),
            },
            HDR_CTL | HDR_BULK | HDR_BULK_LAST => Ctl::Gone { xid },
            _ => return,
        };
        let _ = self.send_ctl(ev.info.initiator, portal, tmid, from, &answer, 0);
    }

    pub(crate) fn release(&self, portal: u32, tmid: u16, tm: &TmShared) {
        let mut tms = self.tms.lock();
        if tms
            .get(&(portal, tmid))
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), tm))
        {
            tms.remove(&(portal, tmid));
        }
    }

    pub(crate) fn local_tm(&self, portal: u32, tmid: u16) -> Option<Arc<TmShared>> {
        self.tms.lock().get(&(portal, tmid)).and_then(Weak::upgrade)
    }

    /// `LNetMEAttach` + `LNetMDAttach`: an ME on `portal` matching `bits`
    /// (but for `ignore`) from anyone, appended, with `md` on it; the ME
    /// goes when the MD does (`unlink`). An ME whose MD cannot be attached
    /// (the buffer's memory went meanwhile, the node stopped) is unlinked
    /// at once, or it would stay in the portal's match list for good.
    pub(crate) fn attach(
        &self,
        portal: u32,
        bits: u64,
        ignore: u64,
        unlink: Unlink,
        md: MdSpec,
    ) -> std::result::Result<MdHandle, LnetError> {
        self.attach_at(portal, bits, ignore, unlink, md, InsertPos::After)
            .map(|(_, md)| md)
    }

    /// An ME and MD for one process only: a passive buffer claimed for
    /// `from`'s request, so that nobody else who learnt its match bits
    /// (the descriptor's) can GET or PUT against it meanwhile (the
    /// allowed-actor check holds for the data too, not only the request).
    /// At the head of the portal's ignore list: the ME ignores a bit no
    /// passive match bits set ([`PASSIVE_SPARE`]), since LNet does not mix
    /// MEs for one process without ignore bits with the portal's wildcard
    /// ones; claims live for one transfer, so the list's head stays short.
    pub(crate) fn attach_for(
        &self,
        portal: u32,
        bits: u64,
        from: ProcessId,
        md: MdSpec,
    ) -> std::result::Result<MdHandle, LnetError> {
        let me = MeSpec {
            portal,
            match_id: from,
            match_bits: bits,
            ignore_bits: PASSIVE_SPARE,
            unlink: Unlink::Unlink,
            pos: InsertPos::Before,
        };
        self.lnet.me_md_attach(me, md).map(|(_, md)| md)
    }

    /// [`Engine::attach`] with the ME at `pos` in its portal's list;
    /// returns the ME too.
    pub(crate) fn attach_at(
        &self,
        portal: u32,
        bits: u64,
        ignore: u64,
        unlink: Unlink,
        md: MdSpec,
        pos: InsertPos,
    ) -> std::result::Result<(MeHandle, MdHandle), LnetError> {
        // Appended means ahead of the portal's vacancy, which stays last.
        let pos = match (pos, self.vacancies.lock().get(&portal)) {
            (InsertPos::After, Some((vacancy, _))) => InsertPos::Ahead(*vacancy),
            (pos, _) => pos,
        };
        let me = MeSpec {
            portal,
            match_id: ProcessId::ANY,
            match_bits: bits,
            ignore_bits: ignore,
            unlink,
            pos,
        };
        self.lnet.me_md_attach(me, md)
    }

    /// The ME, then the MD on it; an ME whose MD cannot be attached is
    /// unlinked again (see [`Engine::attach`]).
    /// `LNetMDBind` of a free MD over `mem` (`threshold` events, unlinked
    /// after the last, reported with `user`) and the PUT or GET `start`
    /// from it, in one turn of the node ([`Lnet::bind_start`]); an MD
    /// whose operation did not start is gone again, with no event.
    pub(crate) fn bind_and_start(
        &self,
        mem: MemRef,
        threshold: u32,
        user: u64,
        start: Start,
    ) -> std::result::Result<MdHandle, LnetError> {
        self.lnet.bind_start(
            MdSpec::new(mem, MdOptions::empty())
                .threshold(Threshold::Count(threshold))
                .unlink(Unlink::Unlink)
                .user_ptr(user),
            start,
        )
    }

    /// Sends a control message (a PUT without ACK from memory of its own)
    /// to the transfer machine `(to, portal, tmid)`, from `(portal, tmid)`.
    /// `op` is the active operation a request is for (0 otherwise): a
    /// failed send fails it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_ctl(
        &self,
        to: ProcessId,
        portal: u32,
        tmid: u16,
        from: (u32, u16),
        msg: &Ctl,
        op: u64,
    ) -> std::result::Result<(), LnetError> {
        let left = if matches!(msg, Ctl::Landed { .. } | Ctl::Again { .. }) {
            LANDED_RESENDS
        } else {
            0
        };
        self.send_ctl_to(
            Resend {
                to,
                portal,
                tmid,
                from,
                msg: msg.clone(),
                left,
            },
            op,
        )
    }

    /// Sends `r.msg` to `r`'s machine; while `r.left` is not 0, a PUT
    /// that fails is sent again.
    fn send_ctl_to(&self, r: Resend, op: u64) -> std::result::Result<(), LnetError> {
        let bytes = r.msg.encode();
        let kind = if r.msg.expects_answer() {
            HDR_CTL
        } else {
            HDR_NOTE
        };
        let len = bytes.len() as u32;
        let key = self.lnet.register(&MemRegion::from_vec(bytes));
        let id = self.new_id() | CTL_SEND_BIT;
        self.ctl_sends.lock().insert(id, (key, op));
        let hdr = hdr_data(kind, r.from.0, r.from.1, (r.msg.xid() as u32) & SEQ_MASK);
        let (to, portal, bits) = (r.to, r.portal, match_bits(r.tmid, CNT_CTL));
        if r.left > 0 {
            self.landed_sends.lock().insert(id, r);
        }
        let res = self.bind_and_start(
            MemRef::new(key, 0, len),
            1,
            id,
            Start::Put {
                ack: false,
                target: to,
                portal,
                match_bits: bits,
                offset: 0,
                hdr_data: hdr,
            },
        );
        if res.is_err() {
            self.ctl_sends.lock().remove(&id);
            self.landed_sends.lock().remove(&id);
            self.lnet.deregister(key);
        }
        res.map(|_| ())
    }

    fn on_event(&self, ev: &Event) {
        trace!(kind = ?ev.kind(), md = ?ev.md, unlinked = ev.unlinked, status = ?ev.info.status, "LNet event");
        if ev.user_ptr & CTL_SEND_BIT != 0 {
            let Some((key, op)) = (if ev.unlinked {
                self.ctl_sends.lock().remove(&ev.user_ptr)
            } else {
                self.ctl_sends.lock().get(&ev.user_ptr).copied()
            }) else {
                return;
            };
            let resend = if ev.unlinked {
                self.lnet.deregister(key);
                self.landed_sends.lock().remove(&ev.user_ptr)
            } else {
                None
            };
            if let Err(e) = ev.info.status {
                if op != 0
                    && let Some(op) = self.op(op)
                {
                    debug!(%e, "bulk request not sent");
                    op.tm.fail_request(&op, e);
                }
                if let Some(mut r) = resend {
                    debug!(%e, left = r.left, "LANDED or AGAIN not sent: sent again");
                    r.left -= 1;
                    let _ = self.send_ctl_to(r, 0);
                }
            }
            return;
        }
        if ev.user_ptr & VACANCY_BIT != 0 {
            let (tmid, _) = split_bits(ev.info.match_bits);
            self.answer_absent(ev, (ev.info.portal, tmid));
            return;
        }
        let op = self.op(ev.user_ptr);
        if ev.unlinked
            && op
                .as_ref()
                .is_some_and(|o| !o.awaits_answer() && !o.superseded(ev.md))
        {
            self.remove_op(ev.user_ptr);
        }
        let Some(op) = op else {
            trace!(
                user_ptr = ev.user_ptr,
                "event for an operation no longer known"
            );
            return;
        };
        op.tm.on_event(&op, ev);
    }

    /// Fails bulk requests whose verdict did not come in time.
    fn expire_handshakes(&self, now: Instant) {
        let due: Vec<u64> = {
            let mut h = self.handshakes.lock();
            let mut due = Vec::new();
            while let Some(&(d, id)) = h.first() {
                if d > now {
                    break;
                }
                h.pop_first();
                due.push(id);
            }
            due
        };
        for id in due {
            if let Some(op) = self.op(id) {
                op.tm.expire_request(&op);
            }
        }
    }
}

/// How many times a LANDED whose PUT failed is sent again.
const LANDED_RESENDS: u8 = 3;

/// A control message to send again if its PUT fails: its destination
/// machine, its sender and how many more times.
#[derive(Debug)]
struct Resend {
    to: ProcessId,
    portal: u32,
    tmid: u16,
    from: (u32, u16),
    msg: Ctl,
    left: u8,
}

/// Looks for something to take for up to `spin`, yielding the CPU between
/// looks: `true` if something came (the caller takes it without sleeping).
fn await_briefly(e: &Engine, spin: Duration) -> bool {
    if spin.is_zero() {
        return false;
    }
    let until = Instant::now() + spin;
    loop {
        if e.has_pending() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::yield_now();
    }
}

/// The engine thread: takes what threads other than the schedulers queue
/// (they wake it), and looks at the handshake deadlines every tick.
fn run(me: &Weak<Engine>, wake: &Receiver<()>, spin: Duration) {
    let tick = Duration::from_millis(100);
    let mut next_check = Instant::now() + tick;
    loop {
        let Some(e) = me.upgrade() else { return };
        if e.stopping.load(Ordering::Acquire) {
            // From now on whoever queues work runs it; what is queued now
            // runs here (or on the token's holder, before it lets go).
            e.stopped.store(true, Ordering::Release);
            fence(Ordering::SeqCst);
            e.pump();
            return;
        }
        let now = Instant::now();
        if now >= next_check {
            next_check = now + tick;
            e.expire_due.store(true, Ordering::Relaxed);
        }
        e.pump();
        // Before sleeping, a short look: in a ping-pong the next item is
        // usually on its way.
        if await_briefly(&e, spin) {
            continue;
        }
        drop(e);
        let timeout = next_check.saturating_duration_since(Instant::now());
        let _ = wake.recv_timeout(timeout);
    }
}

fn do_work(w: Work) {
    match w {
        Work::Deliver(d) => d.run(),
        Work::Started(tm, own) => tm.sink().post_started(&own),
        Work::Complete(sink, q, r) => sink.complete(&q, r),
        // The engine serves several machines: it is never pinned for one.
        Work::Pin(cpu) => warn!(cpu, "pin for the engine thread ignored"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_ids_differ_per_transport_and_stay_clear_of_the_control_bit() {
        let ids: Vec<u64> = (0..1000).map(|_| first_op_id()).collect();
        let mut seqs: Vec<u64> = ids.iter().map(|i| i & u64::from(SEQ_MASK)).collect();
        assert!(ids.iter().all(|&i| (1..=1 << 48).contains(&i)));
        seqs.sort_unstable();
        seqs.dedup();
        // Transports started back to back (a process restarted at the same
        // address) begin at unrelated sequence numbers: among a thousand,
        // a few may share their low 24 bits, not more.
        assert!(seqs.len() > 990, "{} distinct of 1000", seqs.len());
    }
}
