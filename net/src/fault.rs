//! A fault-injecting wrapper that turns any [`Transport`] into a faulty
//! one, to prove that what runs above survives a bad network: messages
//! lost (the sender told they left), duplicated, sends and bulk transfers
//! failed or cut short, operations delayed (and so reordered), connections
//! reset in the middle of transfers, peers killed and revived. Each rule
//! picks operations by rate or by interval from a seeded generator, so a
//! failing run replays with the same seed.
//!
//! The wrapper sits at the transport boundary, on the sending side of each
//! operation: when the core hands it a buffer of a queue a rule covers, it
//! either passes the buffer to the real transport or sets it aside (the
//! buffer stays queued and idle, so `del`, timeouts and stops reach it as
//! usual) and later completes it with the fault's status or hands it back
//! with [`TmSink::resubmit`]. Duplicated and truncated transfers are done
//! by the wrapper itself, through the core's public API on the same
//! transfer machine ([`TmSink::handle`], [`TmHandle::register`]), from a
//! buffer it owns holding a copy of the data (or its prefix): the peer
//! sees a real second message or bulk request, or a real short transfer,
//! from the same sender. Resets go through the optional
//! [`XprtTm::reset_peer`] hook (TCP closes its connections with the peer;
//! on a transport without the hook the operation fails with
//! `ConnectionReset`). Completions it makes run on its own thread.
//!
//! [`TmHandle::register`]: crate::TmHandle::register
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use colibri_bulk_mem::MemTransport;
//! use colibri_net::fault::{FaultAction, FaultPlan, FaultRule, FaultTransport, Pick};
//! use colibri_net::{Domain, QueueType};
//!
//! let plan = FaultPlan::new(42)
//!     .rule(FaultRule::new(FaultAction::Lose, Pick::Rate(0.1)).on(&[QueueType::MsgSend]))
//!     .rule(FaultRule::new(FaultAction::Duplicate, Pick::Rate(0.01)))
//!     .rule(FaultRule::new(FaultAction::Truncate, Pick::Every(100)))
//!     .rule(FaultRule::new(
//!         FaultAction::Reset { within: Duration::from_millis(2) },
//!         Pick::Rate(0.005),
//!     ))
//!     .rule(FaultRule::new(
//!         FaultAction::Delay { min: Duration::ZERO, max: Duration::from_millis(5) },
//!         Pick::Every(3),
//!     ));
//! let faulty = FaultTransport::new(Arc::new(MemTransport::default()), plan);
//! let dom = Domain::new(&faulty).unwrap();
//! assert_eq!(faulty.stats().lost, 0);
//! drop(dom);
//! ```

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::{debug, error};

use crate::buffer::BufferCallbacks;
use crate::bufvec::BufVec;
use crate::desc::NetBufDesc;
use crate::error::{NetError, Result};
use crate::queue::QueueType;
use crate::sink::{Delivery, QueuedBuf, TmSink};
use crate::tm::{BufToken, TmId, TmState};
use crate::xprt::{Caps, DelReason, EpAddr, Limits, Transport, XprtData, XprtDomain, XprtTm};

/// What a rule does to an operation it picks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FaultAction {
    /// The message is lost: its sender is told it was sent, nobody
    /// receives it. On the bulk queues (where claiming success would
    /// claim data moved) it fails with `Io` instead.
    Lose,
    /// The operation fails with this error, nothing is sent.
    Fail(NetError),
    /// The operation starts after a delay drawn between `min` and `max`
    /// (so operations are reordered).
    Delay {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
    /// The operation is passed on, and the wrapper does it a second time
    /// from its own copy of the data: a message arrives twice (same
    /// sender, same bytes); a bulk request is made twice, and the passive
    /// side must serve one and refuse the other.
    Duplicate,
    /// Only part of the transfer happens, and the operation fails with
    /// `Io`: a message or active bulk send carries a prefix of its bytes
    /// (at least one byte short; the receiver sees a shorter message or
    /// bulk transfer of the right length), sent by the wrapper from its
    /// own copy; an active bulk receive pulls the data into the wrapper's
    /// buffer (the passive side saw the transfer succeed).
    Truncate,
    /// The operation is passed on; after a delay drawn up to `within` the
    /// connections with its peer are broken
    /// ([`XprtTm::reset_peer`]), failing what is in flight on them. On a
    /// transport without connections to break, the operation fails with
    /// `ConnectionReset` instead.
    Reset {
        /// Longest delay before the reset.
        within: Duration,
    },
}

/// Which operations a rule picks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// Each operation with this probability (0 to 1).
    Rate(f64),
    /// Every `n`-th operation the rule sees (the `n`-th, `2n`-th, ...).
    Every(u64),
}

/// One rule of a [`FaultPlan`].
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    action: FaultAction,
    pick: Pick,
    queues: Vec<QueueType>,
}

/// The queues a rule covers by default: those of the operations that start
/// on the sending side.
const ACTIVE_QUEUES: [QueueType; 3] = [
    QueueType::MsgSend,
    QueueType::ActiveBulkSend,
    QueueType::ActiveBulkRecv,
];

impl FaultRule {
    /// A rule doing `action` to the operations `pick` selects on the
    /// message send and active bulk queues.
    pub fn new(action: FaultAction, pick: Pick) -> Self {
        Self {
            action,
            pick,
            queues: ACTIVE_QUEUES.to_vec(),
        }
    }

    /// Limits the rule to `queues` (among the message send and active
    /// bulk queues; the others start on the peer's initiative and are
    /// never picked).
    #[must_use]
    pub fn on(mut self, queues: &[QueueType]) -> Self {
        self.queues = queues
            .iter()
            .copied()
            .filter(|q| ACTIVE_QUEUES.contains(q))
            .collect();
        self
    }
}

/// The rules of a [`FaultTransport`] and the seed of its choices. Rules
/// are tried in order; the first that picks an operation decides.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    seed: u64,
    rules: Vec<FaultRule>,
}

impl FaultPlan {
    /// No rules (every operation passes), choices seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            rules: Vec::new(),
        }
    }

    /// Adds a rule.
    #[must_use]
    pub fn rule(mut self, r: FaultRule) -> Self {
        self.rules.push(r);
        self
    }
}

/// What a [`FaultTransport`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Operations passed to the real transport untouched.
    pub passed: u64,
    /// Messages lost.
    pub lost: u64,
    /// Operations failed (by a rule, or to a killed peer).
    pub failed: u64,
    /// Operations delayed.
    pub delayed: u64,
    /// Operations done a second time.
    pub duplicated: u64,
    /// Transfers cut short.
    pub truncated: u64,
    /// Connection resets made (by the transport's hook).
    pub reset: u64,
}

#[derive(Default)]
struct Counters {
    passed: AtomicU64,
    lost: AtomicU64,
    failed: AtomicU64,
    delayed: AtomicU64,
    duplicated: AtomicU64,
    truncated: AtomicU64,
    reset: AtomicU64,
}

thread_local! {
    /// Set while the wrapper's thread adds its own copy of an operation:
    /// that add goes straight to the real transport.
    static OWN_ADD: Cell<bool> = const { Cell::new(false) };
}

/// A transport that injects the faults of a [`FaultPlan`] into another
/// (see the [module docs](self)). Every domain made from it shares the
/// plan's generator, statistics and killed peers.
#[derive(Clone)]
pub struct FaultTransport {
    inner: Arc<dyn Transport>,
    sh: Arc<Shared>,
}

impl fmt::Debug for FaultTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultTransport")
            .field("inner", &self.inner)
            .field("stats", &self.stats())
            .finish()
    }
}

struct Shared {
    plan: FaultPlan,
    /// Generator state and the operations each rule has seen.
    choice: Mutex<(u64, Vec<u64>)>,
    dead: Mutex<HashSet<String>>,
    counters: Counters,
    worker: Arc<Worker>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.worker.close();
    }
}

/// What an operation gets.
enum Verdict {
    Pass,
    Complete(Result<usize>),
    Delay(Duration),
    Duplicate,
    /// Cut after this many bytes (sends) or failed once done (receives).
    Truncate(usize),
    Reset(Duration),
}

impl Shared {
    fn next(state: &mut u64) -> u64 {
        // splitmix64.
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration drawn between zero and `max`.
    fn upto(state: &mut u64, max: Duration) -> Duration {
        let span = max.as_nanos() as u64;
        if span == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(Self::next(state) % (span + 1))
        }
    }

    /// The transfer machine an operation goes to.
    fn dest(buf: &QueuedBuf) -> Option<String> {
        match buf.queue() {
            QueueType::MsgSend => buf.end_point().map(|e| e.addr().to_string()),
            _ => buf.desc().map(|d| d.owner.clone()),
        }
    }

    fn verdict(&self, buf: &QueuedBuf) -> Verdict {
        let queue = buf.queue();
        if let Some(d) = Self::dest(buf)
            && self.dead.lock().contains(&d)
        {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            return Verdict::Complete(Err(NetError::Unreachable(d)));
        }
        let mut ch = self.choice.lock();
        let (state, seen) = &mut *ch;
        for (i, r) in self.plan.rules.iter().enumerate() {
            if !r.queues.contains(&queue) {
                continue;
            }
            seen[i] += 1;
            let picked = match r.pick {
                Pick::Rate(p) => ((Self::next(state) >> 11) as f64 / (1u64 << 53) as f64) < p,
                Pick::Every(n) => n > 0 && seen[i].is_multiple_of(n),
            };
            if !picked {
                continue;
            }
            return match &r.action {
                FaultAction::Lose if queue == QueueType::MsgSend => {
                    self.counters.lost.fetch_add(1, Ordering::Relaxed);
                    Verdict::Complete(Ok(buf.length()))
                }
                FaultAction::Lose => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    Verdict::Complete(Err(NetError::Io {
                        kind: std::io::ErrorKind::ConnectionAborted,
                        message: "transfer lost (injected fault)".into(),
                    }))
                }
                FaultAction::Fail(e) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    Verdict::Complete(Err(e.clone()))
                }
                FaultAction::Delay { min, max } => {
                    self.counters.delayed.fetch_add(1, Ordering::Relaxed);
                    Verdict::Delay(*min + Self::upto(state, max.saturating_sub(*min)))
                }
                FaultAction::Duplicate => Verdict::Duplicate,
                FaultAction::Truncate => {
                    // A prefix of 1..len-1 bytes (a 1-byte send carries
                    // nothing... it is failed as a whole instead).
                    let len = buf.length();
                    let cut = if len > 1 {
                        1 + (Self::next(state) % (len as u64 - 1)) as usize
                    } else {
                        0
                    };
                    Verdict::Truncate(cut)
                }
                FaultAction::Reset { within } => Verdict::Reset(Self::upto(state, *within)),
            };
        }
        self.counters.passed.fetch_add(1, Ordering::Relaxed);
        Verdict::Pass
    }
}

impl FaultTransport {
    /// Wraps `inner` with the faults of `plan`.
    pub fn new(inner: Arc<dyn Transport>, plan: FaultPlan) -> Self {
        let rules = plan.rules.len();
        let seed = plan.seed;
        Self {
            inner,
            sh: Arc::new(Shared {
                plan,
                choice: Mutex::new((seed, vec![0; rules])),
                dead: Mutex::new(HashSet::new()),
                counters: Counters::default(),
                worker: Worker::start(),
            }),
        }
    }

    /// From now on, every operation towards the transfer machine at `addr`
    /// (a canonical address, as `EndPoint::addr` prints it) fails with
    /// `Unreachable`, as if it had died.
    pub fn kill(&self, addr: &str) {
        self.sh.dead.lock().insert(addr.to_string());
    }

    /// Undoes [`FaultTransport::kill`].
    pub fn revive(&self, addr: &str) {
        self.sh.dead.lock().remove(addr);
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        let c = &self.sh.counters;
        FaultStats {
            passed: c.passed.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            delayed: c.delayed.load(Ordering::Relaxed),
            duplicated: c.duplicated.load(Ordering::Relaxed),
            truncated: c.truncated.load(Ordering::Relaxed),
            reset: c.reset.load(Ordering::Relaxed),
        }
    }
}

impl Transport for FaultTransport {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(FaultDomain {
            inner: self.inner.dom_init()?,
            sh: Arc::clone(&self.sh),
        }))
    }
}

struct FaultDomain {
    inner: Box<dyn XprtDomain>,
    sh: Arc<Shared>,
}

impl fmt::Debug for FaultDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultDomain")
            .field("inner", &self.inner)
            .finish()
    }
}

impl XprtDomain for FaultDomain {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn buf_register(&self, bufvec: &BufVec) -> Result<Option<XprtData>> {
        self.inner.buf_register(bufvec)
    }

    fn buf_deregister(&self, reg: Option<XprtData>) {
        self.inner.buf_deregister(reg);
    }

    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        Ok(Box::new(FaultTm {
            inner: Arc::from(self.inner.tm_init(tm, sink.clone())?),
            sink,
            sh: Arc::clone(&self.sh),
            released: Arc::default(),
            resets: self.inner.caps().reset_peer,
        }))
    }

    fn fini(&self) {
        self.inner.fini();
    }
}

struct FaultTm {
    inner: Arc<dyn XprtTm>,
    sink: TmSink,
    sh: Arc<Shared>,
    /// Delayed buffers being handed back: the next `buf_add` of each goes
    /// to the real transport.
    released: Arc<Mutex<HashSet<BufToken>>>,
    /// The real transport breaks connections on request
    /// ([`Caps::reset_peer`]); if not, resets fail operations instead.
    resets: bool,
}

impl fmt::Debug for FaultTm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultTm")
            .field("inner", &self.inner)
            .finish()
    }
}

impl XprtTm for FaultTm {
    fn start(&self, addr: &str) -> Result<()> {
        self.inner.start(addr)
    }

    fn stop(&self, abort: bool) -> Result<()> {
        self.inner.stop(abort)
    }

    fn stopped(&self) {
        self.inner.stopped();
    }

    fn fini(&self) {
        self.inner.fini();
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        self.inner.ep_parse(addr)
    }

    fn desc_extra(&self, buf: &QueuedBuf) -> Result<Vec<u8>> {
        self.inner.desc_extra(buf)
    }

    fn reset_peer(&self, addr: &str) -> bool {
        self.inner.reset_peer(addr)
    }

    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        if self.released.lock().remove(&buf.token()) {
            return self.inner.buf_add(buf);
        }
        if !ACTIVE_QUEUES.contains(&buf.queue()) || OWN_ADD.with(Cell::get) {
            return self.inner.buf_add(buf);
        }
        let job = match self.sh.verdict(buf) {
            Verdict::Pass => return self.inner.buf_add(buf),
            // The original is set aside: the job marks it in use while it
            // makes the copy, so that no stop completes before the copy's
            // buffer is added (or dropped).
            Verdict::Duplicate => match OwnCopy::of(buf, buf.length()) {
                Some(copy) => {
                    self.sh.counters.duplicated.fetch_add(1, Ordering::Relaxed);
                    Job::Copy {
                        sink: self.sink.clone(),
                        copy,
                        original: buf.clone(),
                        then: Then::Resubmit(Arc::clone(&self.released)),
                        worker: Arc::downgrade(&self.sh.worker),
                    }
                }
                None => return self.inner.buf_add(buf),
            },
            Verdict::Truncate(cut) => match OwnCopy::of(buf, cut) {
                Some(copy) if cut > 0 || buf.queue() == QueueType::ActiveBulkRecv => {
                    self.sh.counters.truncated.fetch_add(1, Ordering::Relaxed);
                    Job::Copy {
                        sink: self.sink.clone(),
                        copy,
                        original: buf.clone(),
                        then: Then::Fail,
                        worker: Arc::downgrade(&self.sh.worker),
                    }
                }
                _ => {
                    self.sh.counters.failed.fetch_add(1, Ordering::Relaxed);
                    Job::Complete {
                        sink: self.sink.clone(),
                        buf: buf.clone(),
                        status: Err(cut_short(0, buf.length())),
                    }
                }
            },
            Verdict::Reset(after) => {
                let dest = Shared::dest(buf);
                match dest {
                    Some(addr) if self.resets => {
                        self.inner.buf_add(buf)?;
                        self.sh.worker.push(
                            Instant::now() + after,
                            Job::Reset {
                                tm: Arc::downgrade(&self.inner),
                                addr,
                                sh: Arc::downgrade(&self.sh),
                            },
                        );
                        return Ok(());
                    }
                    _ => {
                        self.sh.counters.failed.fetch_add(1, Ordering::Relaxed);
                        Job::Complete {
                            sink: self.sink.clone(),
                            buf: buf.clone(),
                            status: Err(NetError::ConnectionReset(
                                "connection reset (injected fault)".into(),
                            )),
                        }
                    }
                }
            }
            Verdict::Complete(status) => Job::Complete {
                sink: self.sink.clone(),
                buf: buf.clone(),
                status,
            },
            Verdict::Delay(d) => {
                debug!(token = ?buf.token(), delay = ?d, "operation delayed");
                self.sh.worker.push(
                    Instant::now() + d,
                    Job::Resubmit {
                        sink: self.sink.clone(),
                        buf: buf.clone(),
                        released: Arc::clone(&self.released),
                    },
                );
                return Ok(());
            }
        };
        // Completed on the wrapper's thread: never under the caller's lock.
        self.sh.worker.push(Instant::now(), job);
        Ok(())
    }

    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        // Buffers the wrapper holds are idle (the core completes them
        // itself): only those the real transport has are asked about.
        self.inner.buf_del(buf, reason);
    }

    fn deliver(&self, delivery: Delivery) {
        self.inner.deliver(delivery);
    }

    fn confine(&self, cpus: &[usize]) -> Result<()> {
        self.inner.confine(cpus)
    }
}

/// The error of a transfer cut short after `moved` of `len` bytes.
fn cut_short(moved: usize, len: usize) -> NetError {
    NetError::Io {
        kind: std::io::ErrorKind::UnexpectedEof,
        message: format!("transfer cut short after {moved} of {len} bytes (injected fault)"),
    }
}

/// The error of an active receive whose data arrived, failed afterwards.
fn failed_after() -> NetError {
    NetError::Io {
        kind: std::io::ErrorKind::ConnectionAborted,
        message: "transfer failed after the data moved (injected fault)".into(),
    }
}

/// The wrapper's own copy of an operation, taken when the core handed it
/// the buffer (under the transfer machine's lock, where reading the
/// buffer's memory is allowed).
struct OwnCopy {
    queue: QueueType,
    /// Destination of a message (an address: an end point held here would
    /// keep the transfer machine from finalising until the copy is made).
    ep: Option<String>,
    /// Descriptor of an active bulk transfer.
    desc: Option<NetBufDesc>,
    /// Bytes to send (a prefix of the original's), or the capacity of
    /// the buffer to receive into.
    data: Vec<u8>,
    size: usize,
    /// Bytes the original would have moved.
    len: usize,
}

impl OwnCopy {
    /// A copy sending the first `cut` bytes of `buf` (sends), or
    /// receiving what `buf` would (receives). `None` when the buffer's
    /// memory or destination is gone.
    fn of(buf: &QueuedBuf, cut: usize) -> Option<Self> {
        let queue = buf.queue();
        let (ep, desc) = match queue {
            QueueType::MsgSend => (Some(buf.end_point()?.addr().to_string()), None),
            _ => (
                None,
                Some(NetBufDesc::encode(buf.desc()?, usize::MAX).ok()?),
            ),
        };
        let data = match queue {
            QueueType::ActiveBulkRecv => Vec::new(),
            _ => buf.data()?.to_vec(0, cut.min(buf.length())).ok()?,
        };
        Some(Self {
            queue,
            ep,
            desc,
            data,
            size: buf.size(),
            len: buf.length(),
        })
    }

    /// What the original gets once the copy is done (a truncation).
    fn original_error(&self) -> NetError {
        match self.queue {
            QueueType::ActiveBulkRecv => failed_after(),
            _ => cut_short(self.data.len(), self.len),
        }
    }

    /// Adds the copy to the transfer machine of `sink` from a buffer the
    /// wrapper registers; `done` runs once its final event came. Returns
    /// false (and does not run `done`) when it could not be added.
    fn add(self, sink: &TmSink, done: impl Fn() + Send + Sync + 'static) -> bool {
        let Some(h) = sink.handle() else {
            return false;
        };
        if h.state() != TmState::Started
            || (self.queue != QueueType::ActiveBulkRecv && self.data.is_empty())
        {
            return false;
        }
        let bv = match self.queue {
            QueueType::ActiveBulkRecv => BufVec::with_len(self.size, self.size),
            _ => BufVec::from_bytes(&self.data),
        };
        let Ok(nb) = h.register(bv) else {
            return false;
        };
        // The copy's events are the wrapper's: nothing reaches the
        // application; the buffer is deregistered as its final event is
        // dropped.
        let nb = nb.with_callbacks(Arc::new(BufferCallbacks::new().on_all(move |_, ev| {
            if ev.is_final() {
                done();
            }
        })));
        let n = self.data.len();
        let ep = match &self.ep {
            Some(addr) => match h.ep_create(addr) {
                Ok(ep) => Some(ep),
                Err(_) => return false,
            },
            None => None,
        };
        OWN_ADD.with(|f| f.set(true));
        let r = match (self.queue, &ep, &self.desc) {
            (QueueType::MsgSend, Some(ep), _) => h.add_msg_send(nb, ep, n).map(|_| ()),
            (QueueType::ActiveBulkSend, _, Some(d)) => h.add_active_send(nb, d, n).map(|_| ()),
            (QueueType::ActiveBulkRecv, _, Some(d)) => h.add_active_recv(nb, d).map(|_| ()),
            _ => {
                OWN_ADD.with(|f| f.set(false));
                return false;
            }
        };
        OWN_ADD.with(|f| f.set(false));
        match r {
            Ok(()) => true,
            Err(e) => {
                debug!(error = %e.error, "the injector's copy was refused");
                false
            }
        }
    }
}

/// What becomes of the original of a copy.
enum Then {
    /// Handed to the real transport (marked in this set, so that its
    /// `buf_add` passes).
    Resubmit(Arc<Mutex<HashSet<BufToken>>>),
    /// Failed as cut short once the copy completed.
    Fail,
}

/// Work the wrapper's thread does at a given time.
enum Job {
    /// Completes an operation the wrapper decided (if it is still queued).
    Complete {
        sink: TmSink,
        buf: QueuedBuf,
        status: Result<usize>,
    },
    /// Hands a delayed operation to the real transport.
    Resubmit {
        sink: TmSink,
        buf: QueuedBuf,
        released: Arc<Mutex<HashSet<BufToken>>>,
    },
    /// Adds the wrapper's copy of an operation, with the original marked
    /// in use meanwhile; then hands the original to the real transport (a
    /// duplicate) or fails it as cut short once the copy is done (a
    /// truncation).
    Copy {
        sink: TmSink,
        copy: OwnCopy,
        original: QueuedBuf,
        then: Then,
        worker: Weak<Worker>,
    },
    /// Completes an operation the wrapper has in use.
    Finish {
        sink: TmSink,
        buf: QueuedBuf,
        status: Result<usize>,
    },
    /// Breaks the connections with a peer.
    Reset {
        tm: Weak<dyn XprtTm>,
        addr: String,
        sh: Weak<Shared>,
    },
}

impl Job {
    fn run(self) {
        match self {
            Self::Complete { sink, buf, status } => {
                if sink.begin_use(&buf) {
                    sink.complete(&buf, status);
                }
            }
            Self::Resubmit {
                sink,
                buf,
                released,
            } => {
                let token = buf.token();
                released.lock().insert(token);
                if !sink.resubmit(&buf) {
                    released.lock().remove(&token);
                }
            }
            Self::Copy {
                sink,
                copy,
                original,
                then,
                worker,
            } => {
                if !sink.begin_use(&original) {
                    // Deleted, timed out or stopped meanwhile: the core
                    // completed it; no copy either.
                    return;
                }
                let error = copy.original_error();
                let fail = matches!(then, Then::Fail);
                let (s2, o2, e2) = (sink.clone(), original.clone(), error.clone());
                let added = copy.add(&sink, move || {
                    // On a delivery thread: the original is failed from the
                    // wrapper's thread.
                    if fail {
                        let job = Job::Finish {
                            sink: s2.clone(),
                            buf: o2.clone(),
                            status: Err(e2.clone()),
                        };
                        match worker.upgrade() {
                            Some(w) => w.push(Instant::now(), job),
                            None => job.run(),
                        }
                    }
                });
                match then {
                    Then::Resubmit(released) => {
                        // Idle again (completed now if a stop or deletion
                        // came meanwhile), then to the real transport.
                        sink.release_claim(&original);
                        let token = original.token();
                        released.lock().insert(token);
                        if !sink.resubmit(&original) {
                            released.lock().remove(&token);
                        }
                    }
                    Then::Fail if !added => sink.complete(&original, Err(error)),
                    Then::Fail => {}
                }
            }
            Self::Finish { sink, buf, status } => sink.complete(&buf, status),
            Self::Reset { tm, addr, sh } => {
                if let Some(tm) = tm.upgrade()
                    && tm.reset_peer(&addr)
                    && let Some(sh) = sh.upgrade()
                {
                    sh.counters.reset.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One thread running jobs at their time.
struct Worker {
    st: Mutex<WorkerSt>,
    cond: Condvar,
}

#[derive(Default)]
struct WorkerSt {
    /// (when, sequence) -> job, earliest first.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    jobs: std::collections::HashMap<u64, Job>,
    seq: u64,
    closed: bool,
}

impl Worker {
    fn start() -> Arc<Self> {
        let w = Arc::new(Self {
            st: Mutex::new(WorkerSt::default()),
            cond: Condvar::new(),
        });
        let weak: Weak<Self> = Arc::downgrade(&w);
        let spawned = std::thread::Builder::new()
            .name("colibri-fault".into())
            .spawn(move || {
                let _mark = crate::wait::DeliveryThread::enter();
                Self::run(&weak);
            });
        if let Err(e) = spawned {
            error!(%e, "could not start the fault injector's thread: faults complete nothing");
            w.st.lock().closed = true;
        }
        w
    }

    fn push(&self, at: Instant, job: Job) {
        let mut st = self.st.lock();
        if st.closed {
            // No thread (it could not start): the buffer stays queued and
            // idle, and the core completes it at its deletion, timeout or
            // stop.
            return;
        }
        st.seq += 1;
        let seq = st.seq;
        st.due.push(Reverse((at, seq)));
        st.jobs.insert(seq, job);
        drop(st);
        self.cond.notify_one();
    }

    fn close(&self) {
        self.st.lock().closed = true;
        self.cond.notify_all();
    }

    fn run(weak: &Weak<Self>) {
        loop {
            let Some(w) = weak.upgrade() else {
                return;
            };
            let mut st = w.st.lock();
            if st.closed {
                // The transport is gone: run what is left now, so that
                // every operation the wrapper holds still completes.
                let jobs: Vec<Job> = st.jobs.drain().map(|(_, j)| j).collect();
                st.due.clear();
                drop(st);
                for j in jobs {
                    j.run();
                }
                return;
            }
            let now = Instant::now();
            match st.due.peek().map(|r| r.0) {
                Some((at, seq)) if at <= now => {
                    st.due.pop();
                    let job = st.jobs.remove(&seq);
                    drop(st);
                    if let Some(j) = job {
                        j.run();
                    }
                }
                Some((at, _)) => {
                    let _ = w.cond.wait_until(&mut st, at);
                }
                None => {
                    // Wake now and then to notice the transport dropped.
                    let _ = w.cond.wait_for(&mut st, Duration::from_millis(200));
                }
            }
        }
    }
}
