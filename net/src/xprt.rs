//! The transport boundary: the `xo_*` table as traits, and the sink through
//! which a transport reports to the core.
//!
//! A transport implements three traits:
//!
//! * [`Transport`]: the transport itself and its configuration; makes domains.
//! * [`XprtDomain`]: per-domain state; limits, capabilities, buffer
//!   registration, and making transfer machines.
//! * [`XprtTm`]: per-transfer-machine state; start, stop, end point address
//!   parsing, buffer add and delete.
//!
//! The core does all the bookkeeping (queues, flags, statistics, end point
//! references, event delivery, descriptor encoding, exactly-once completion)
//! and calls the transport with the locks documented on each method. The
//! transport reports through a [`TmSink`]: state changes, buffer completions,
//! received messages, errors. It never calls application code itself.
//!
//! # Locks held on entry
//!
//! | method | lock held by the caller |
//! |---|---|
//! | [`Transport::dom_init`] | none |
//! | [`XprtDomain::buf_register`], [`XprtDomain::buf_deregister`], [`XprtDomain::tm_init`], [`XprtDomain::fini`] | none (domain state is atomic) |
//! | [`XprtTm::start`], [`XprtTm::stop`], [`XprtTm::ep_parse`], [`XprtTm::desc_extra`], [`XprtTm::buf_add`], [`XprtTm::buf_del`], [`XprtTm::confine`] | the transfer machine's lock |
//! | [`XprtTm::fini`] | none |
//!
//! While the transfer machine's lock is held the transport must not block,
//! must not call any [`TmSink`] method of the same transfer machine (the sink
//! takes that lock) and must not wait for a buffer's data lock (see
//! [`QueuedBuf::data`]) that another thread may hold while waiting for a
//! transport lock. Events are therefore always posted from another thread,
//! or later from the same thread once the call returned.
//!
//! # Exactly one completion
//!
//! Every buffer the core hands to [`XprtTm::buf_add`] must eventually be
//! completed through [`TmSink::complete`] (or, for a message receive buffer,
//! by the final [`TmSink::post_msg`]). The core ignores completions of
//! buffers that already completed, so a transport that races a cancellation
//! against a normal completion may post both. As a safety net, when the
//! transport posts `STOPPED` (or a start fails) the core completes any buffer
//! still queued with `Cancelled` and logs the transport's mistake.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::MappedMutexGuard;

use crate::bufvec::BufVec;
use crate::desc::DescFields;
use crate::ep::EndPoint;
use crate::error::{NetError, Result};
use crate::queue::QueueType;
use crate::tm::{BufToken, RecvParams, Slot, TmId, TmInner, TmState};

/// Transport-private data attached to buffers and end points.
pub type XprtData = Arc<dyn Any + Send + Sync>;

/// Size limits of a transport, cached by the domain at init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest buffer, in bytes (sum of its segments).
    pub max_buffer_size: usize,
    /// Largest segment, in bytes.
    pub max_segment_size: usize,
    /// Most segments in one buffer.
    pub max_segments: usize,
    /// Largest descriptor, in bytes.
    pub max_desc_size: usize,
}

impl Limits {
    /// Builds a set of limits.
    pub const fn new(
        max_buffer_size: usize,
        max_segment_size: usize,
        max_segments: usize,
        max_desc_size: usize,
    ) -> Self {
        Self {
            max_buffer_size,
            max_segment_size,
            max_segments,
            max_desc_size,
        }
    }
}

/// What a transport can do. Optional features are declared here and the
/// core refuses their use with [`NetError::Unsupported`] when absent: a
/// transport never pretends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Identifier stamped into descriptors, so that a descriptor made by
    /// another transport is refused.
    pub transport_id: u32,
    /// Completions may be held until the application calls
    /// [`deliver_all`](crate::TmHandle::deliver_all) (the core keeps the
    /// queue; the transport must only post events from its own threads).
    pub sync_delivery: bool,
    /// Several messages may land in one receive buffer.
    pub multi_message: bool,
    /// Buffer timeouts are enforced (the transport drives
    /// [`TmSink::expire_timeouts`]).
    pub timeouts: bool,
    /// The transfer machine's threads can be confined to CPUs.
    pub confine: bool,
}

impl Caps {
    /// Capabilities with every optional feature off.
    pub const fn new(transport_id: u32) -> Self {
        Self {
            transport_id,
            sync_delivery: false,
            multi_message: false,
            timeouts: false,
            confine: false,
        }
    }

    /// Declares synchronous delivery support.
    #[must_use]
    pub const fn with_sync_delivery(mut self) -> Self {
        self.sync_delivery = true;
        self
    }

    /// Declares multi-message receive buffers.
    #[must_use]
    pub const fn with_multi_message(mut self) -> Self {
        self.multi_message = true;
        self
    }

    /// Declares buffer timeouts.
    #[must_use]
    pub const fn with_timeouts(mut self) -> Self {
        self.timeouts = true;
        self
    }

    /// Declares CPU confinement.
    #[must_use]
    pub const fn with_confine(mut self) -> Self {
        self.confine = true;
        self
    }
}

/// A parsed end point address: the canonical printable form and the
/// transport's own representation.
#[derive(Clone)]
pub struct EpAddr {
    /// Canonical printable address; two strings naming the same end point
    /// must give the same canonical address.
    pub addr: String,
    /// The transport's parsed form.
    pub data: XprtData,
}

impl fmt::Debug for EpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpAddr").field("addr", &self.addr).finish()
    }
}

/// Why the core asks a transport to delete a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DelReason {
    /// The application called `del`.
    Cancel,
    /// The buffer's timeout expired (complete with `Cancelled`; the core
    /// reports `TimedOut`).
    Timeout,
    /// The transfer machine is stopping.
    Stop {
        /// Stop with abort: in-flight operations should be aborted if the
        /// transport can.
        abort: bool,
    },
}

/// A transport: the factory of its domains.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Short name ("mem", "tcp", ...).
    fn name(&self) -> &'static str;

    /// Sets up the transport's state for a new domain.
    ///
    /// # Errors
    /// Whatever prevents the domain from working (missing device, ...).
    fn dom_init(&self) -> Result<Box<dyn XprtDomain>>;
}

/// Per-domain transport state.
pub trait XprtDomain: Send + Sync + fmt::Debug {
    /// Name of the transport.
    fn name(&self) -> &'static str;

    /// Size limits.
    fn limits(&self) -> Limits;

    /// Capabilities.
    fn caps(&self) -> Caps;

    /// Registers (pins, maps) a buffer's memory. The core has already
    /// checked the buffer against [`XprtDomain::limits`].
    ///
    /// # Errors
    /// Registration failures; the memory goes back to the application.
    fn buf_register(&self, bufvec: &BufVec) -> Result<Option<XprtData>> {
        let _ = bufvec;
        Ok(None)
    }

    /// Releases what [`XprtDomain::buf_register`] set up.
    fn buf_deregister(&self, reg: Option<XprtData>) {
        drop(reg);
    }

    /// Creates the transport's state for a new transfer machine.
    ///
    /// # Errors
    /// Resource exhaustion.
    fn tm_init(&self, tm: TmId) -> Result<Box<dyn XprtTm>>;

    /// Releases the domain's state; called once, after every transfer
    /// machine and buffer of the domain is gone.
    fn fini(&self) {}
}

/// Per-transfer-machine transport state: the `xo_tm_*` and `xo_buf_*`
/// operations.
pub trait XprtTm: Send + Sync + fmt::Debug {
    /// Starts the transfer machine at `addr`. Must post
    /// [`TmSink::post_started`] or [`TmSink::post_start_failed`] later, from
    /// another thread (never from inside this call). `sink` may be kept.
    ///
    /// # Errors
    /// A synchronous failure (invalid or busy address): the core moves the
    /// transfer machine to FAILED.
    fn start(&self, sink: &TmSink, addr: &str) -> Result<()>;

    /// Stops the transfer machine. The core has already asked for every
    /// buffer to be deleted as the stop mode requires. Must complete every
    /// queued buffer and then post [`TmSink::post_stopped`] from another
    /// thread. May be called in INITIALIZED, STARTING or STARTED.
    ///
    /// # Errors
    /// A failure to stop; the core restores the previous state.
    fn stop(&self, sink: &TmSink, abort: bool) -> Result<()>;

    /// Releases the transfer machine's resources (joins threads). Called
    /// without locks, after STOPPED or FAILED, or in INITIALIZED, with no
    /// buffer queued and no callback running.
    fn fini(&self);

    /// Parses an address into its canonical form.
    ///
    /// # Errors
    /// `InvalidAddress` for strings this transport does not accept.
    fn ep_parse(&self, addr: &str) -> Result<EpAddr>;

    /// For a passive buffer about to be added, transport bytes to carry in
    /// its descriptor (for example remote keys). Called before
    /// [`XprtTm::buf_add`].
    ///
    /// # Errors
    /// Any failure refuses the add.
    fn desc_extra(&self, buf: &QueuedBuf) -> Result<Vec<u8>> {
        let _ = buf;
        Ok(Vec::new())
    }

    /// Starts the operation of a newly queued buffer. Must not block.
    ///
    /// # Errors
    /// A refusal; the core hands the buffer back to the application and
    /// will never accept a completion for it.
    fn buf_add(&self, sink: &TmSink, buf: &QueuedBuf) -> Result<()>;

    /// Asks for a queued buffer to be cancelled. The transport completes it
    /// with `Cancelled` if the operation has not started, and may let an
    /// in-flight operation finish normally. Never completes inline.
    fn buf_del(&self, sink: &TmSink, buf: &QueuedBuf, reason: DelReason);

    /// Confines the transfer machine's threads to the given CPUs; called in
    /// INITIALIZED only, and only when [`Caps::confine`] is set.
    ///
    /// # Errors
    /// Invalid CPU numbers.
    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let _ = cpus;
        Err(NetError::Unsupported {
            transport: "unknown",
            what: "confine",
        })
    }
}

/// The transport's view of a queued buffer: what the operation needs, and
/// access to the memory.
///
/// Cheap to clone. A transport keeps clones in its work queues; they stay
/// valid (for reading parameters) after the buffer completed, but its data
/// is gone once the completion handed the buffer back.
#[derive(Clone)]
pub struct QueuedBuf(pub(crate) Arc<Slot>);

impl fmt::Debug for QueuedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuedBuf")
            .field("token", &self.0.token)
            .field("queue", &self.0.queue)
            .finish()
    }
}

impl QueuedBuf {
    /// The token the application got from its add.
    pub fn token(&self) -> BufToken {
        BufToken {
            tm: self.0.tm_id,
            key: self.0.token,
        }
    }

    /// The queue the buffer is on.
    pub fn queue(&self) -> QueueType {
        self.0.queue
    }

    /// Bytes to send (message send, passive bulk send, active bulk send);
    /// 0 for the receive queues.
    pub fn length(&self) -> usize {
        self.0.length
    }

    /// Capacity of the buffer in bytes.
    pub fn size(&self) -> usize {
        self.0.size
    }

    /// The destination of a message send (until the buffer completed).
    pub fn end_point(&self) -> Option<EndPoint> {
        self.0.ep.lock().clone()
    }

    /// The decoded descriptor of an active bulk buffer.
    pub fn desc(&self) -> Option<&DescFields> {
        self.0.desc.as_deref()
    }

    /// Receive parameters of a message receive buffer.
    pub fn recv_params(&self) -> RecvParams {
        self.0.recv
    }

    /// Absolute timeout of the buffer, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.0.deadline
    }

    /// What [`XprtDomain::buf_register`] returned for this buffer.
    pub fn reg(&self) -> Option<&XprtData> {
        self.0.reg.as_ref()
    }

    /// True once a deletion (cancel, timeout or stop) was requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag(crate::tm::F_CANCEL)
    }

    /// True while the transport uses the buffer (between
    /// [`TmSink::begin_use`] or a claim and the completion).
    pub fn is_in_use(&self) -> bool {
        self.0.flag(crate::tm::F_IN_USE)
    }

    /// Locks the buffer's memory. `None` once the buffer was handed back.
    ///
    /// Data locks are the lowest locks of the hierarchy: take one with no
    /// other lock held, or under the transfer machine's lock or a transport
    /// lock, never the other way round. When two are held (a copy between
    /// buffers), lock the source (sending) buffer first.
    pub fn data(&self) -> Option<MappedMutexGuard<'_, BufVec>> {
        parking_lot::MutexGuard::try_map(self.0.buf.lock(), |b| {
            b.as_mut().map(|nb| nb.bufvec_mut())
        })
        .ok()
    }
}

/// A region of a receive buffer reserved for one incoming message
/// ([`TmSink::claim_recv`]). Hand it back with [`TmSink::post_msg`] once
/// the message is written, or [`TmSink::release_recv`] if it could not be.
///
/// Several claims on one multi-message buffer may be outstanding at once
/// (their regions are disjoint); their events are delivered in claim order.
#[derive(Debug)]
#[must_use = "a claim must be posted or released, or the buffer never completes"]
pub struct RecvClaim {
    /// The receive buffer.
    pub buf: QueuedBuf,
    /// Where the message goes in the buffer.
    pub offset: usize,
    /// Bytes reserved.
    pub len: usize,
    pub(crate) seq: u64,
}

/// Why no receive buffer could be claimed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClaimError {
    /// The transfer machine is not started (the sender should see
    /// `Unreachable`).
    NotStarted,
    /// No receive buffer is free. Already counted (MSG_RECV failed events,
    /// [`TmHandle::no_buffer_drops`](crate::TmHandle::no_buffer_drops)).
    /// `notice` is the receiving transfer machine's `NoBuffers` error event
    /// (empty when one is already pending: loss events are coalesced); run
    /// it on a thread of the receiving transfer machine, not the sender's.
    NoBuffers {
        /// The receiver's error event.
        notice: Delivery,
    },
    /// The message is larger than any empty receive buffer. `victim`, the
    /// first such buffer, is claimed for the transport, which must complete
    /// it with [`NetError::MessageTooLarge`] (as the sender will be).
    TooLarge {
        /// The receive buffer to fail.
        victim: QueuedBuf,
        /// Its capacity.
        space: usize,
    },
}

/// A passive buffer claimed for an active bulk request
/// ([`TmSink::claim_passive`]).
#[derive(Debug)]
pub struct PassiveClaim {
    /// The passive buffer, now in use by the transport.
    pub buf: QueuedBuf,
    /// Number of bytes to transfer.
    pub len: usize,
}

/// A refused active bulk request.
#[derive(Debug)]
pub struct PassiveError {
    /// The status the active buffer completes with.
    pub error: NetError,
    /// The passive buffer, when the request named it correctly but broke
    /// its contract (wrong queue pairing, wrong end point, sizes): it is
    /// claimed for the transport, which must complete it with the same
    /// error. `None` when the passive buffer is untouched.
    pub victim: Option<QueuedBuf>,
    /// For a request refused without touching a buffer (stale, forged or
    /// edited descriptor, busy buffer): the passive transfer machine's
    /// error event (coalesced; possibly empty), to run on one of its own
    /// threads.
    pub notice: Delivery,
}

/// The core's end of a transfer machine, handed to the transport.
///
/// Cheap to clone; holds the transfer machine weakly, so a transport keeping
/// one never keeps a finalised transfer machine alive. Every method may be
/// called from any thread, but never while holding the transfer machine's
/// lock (that is, never from inside an [`XprtTm`] method of the same
/// transfer machine).
#[derive(Clone)]
pub struct TmSink {
    pub(crate) tm: Weak<TmInner>,
    pub(crate) id: TmId,
}

impl fmt::Debug for TmSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmSink").field("tm", &self.id).finish()
    }
}

impl TmSink {
    fn with<R>(&self, f: impl FnOnce(&Arc<TmInner>) -> R) -> Option<R> {
        self.tm.upgrade().map(|tm| f(&tm))
    }

    /// The transfer machine this sink reports to.
    pub fn tm_id(&self) -> TmId {
        self.id
    }

    /// The transfer machine's state, or `None` once it is gone.
    pub fn state(&self) -> Option<TmState> {
        self.with(|tm| tm.state())
    }

    /// Number of buffers currently queued.
    pub fn queued(&self) -> usize {
        self.with(|tm| tm.queued()).unwrap_or(0)
    }

    /// Start succeeded; `addr` is the transfer machine's own canonical
    /// address (with a real port if the application asked for port 0). A
    /// STARTED that arrives after a stop began is ignored: a stop never
    /// loses to a late start.
    pub fn post_started(&self, addr: &str) {
        self.with(|tm| tm.post_started(addr));
    }

    /// Start failed; the transfer machine goes to FAILED and every buffer
    /// still queued completes with `Cancelled`.
    pub fn post_start_failed(&self, error: NetError) {
        self.with(|tm| tm.post_start_failed(error));
    }

    /// Stop finished: every buffer was completed and no transport thread
    /// will touch the transfer machine's buffers again.
    pub fn post_stopped(&self) {
        self.with(|tm| tm.post_stopped());
    }

    /// Reports an error outside any buffer's context.
    pub fn post_error(&self, error: NetError) {
        self.with(|tm| tm.post_error(error));
    }

    /// Reports a transport-specific diagnostic.
    pub fn post_diagnostic(&self, text: String) {
        self.with(|tm| tm.post_diagnostic(text));
    }

    /// Marks a queued buffer in use before the transport starts working on
    /// it. Returns false when the buffer was cancelled or completed: the
    /// transport must then leave it alone (its cancellation completes it).
    pub fn begin_use(&self, buf: &QueuedBuf) -> bool {
        self.with(|tm| tm.begin_use(buf)).unwrap_or(false)
    }

    /// Gives back an exclusive claim ([`TmSink::begin_use`] or
    /// [`TmSink::claim_passive`]) without completing the buffer: it stays
    /// queued and available. If a deletion or a stop arrived meanwhile, the
    /// transport is asked again (through [`XprtTm::buf_del`]) to complete
    /// it.
    pub fn release_claim(&self, buf: &QueuedBuf) {
        self.with(|tm| tm.release_claim(buf));
    }

    /// Completes a buffer: `Ok(len)` with the bytes moved (received length
    /// for the receive queues, sent length for the others), or the failure.
    /// A `Cancelled` status on a buffer whose timeout expired is reported as
    /// `TimedOut`. The callback runs on the calling thread, unless the
    /// transfer machine is in synchronous delivery mode.
    pub fn complete(&self, buf: &QueuedBuf, status: Result<usize>) {
        self.complete_deferred(buf, status).run();
    }

    /// Like [`TmSink::complete`], but returns the callback to run as a
    /// [`Delivery`], so the transport can run it on a thread of its choice
    /// (for example the receiving transfer machine's own worker).
    pub fn complete_deferred(&self, buf: &QueuedBuf, status: Result<usize>) -> Delivery {
        self.with(|tm| tm.post_buffer(buf, crate::tm::Post::Complete(status)))
            .unwrap_or_default()
    }

    /// Reports a message of `len` bytes (at most the claimed length) written
    /// at `claim.offset`, sent by `sender` (a canonical address). The core
    /// decides whether the buffer stays queued for more messages (it does
    /// while it has at least its minimum receive size left, has received
    /// fewer than its maximum number of messages, and was neither cancelled
    /// nor stopped). The callbacks run on the calling thread, unless in
    /// synchronous delivery mode.
    pub fn post_msg(&self, claim: RecvClaim, len: usize, sender: &str) {
        self.post_msg_deferred(claim, len, sender).run();
    }

    /// Like [`TmSink::post_msg`], returning the callbacks as a [`Delivery`].
    pub fn post_msg_deferred(&self, claim: RecvClaim, len: usize, sender: &str) -> Delivery {
        self.with(|tm| {
            tm.post_buffer(
                &claim.buf,
                crate::tm::Post::Msg {
                    seq: claim.seq,
                    len,
                    sender,
                },
            )
        })
        .unwrap_or_default()
    }

    /// Gives back a receive claim whose message could not be written (for
    /// example, it arrived truncated). No event is posted for it; its space
    /// is reused if it was the buffer's last reservation.
    pub fn release_recv(&self, claim: RecvClaim) {
        self.with(|tm| tm.post_buffer(&claim.buf, crate::tm::Post::Hole { seq: claim.seq }))
            .unwrap_or_default()
            .run();
    }

    /// Claims space for an incoming message of `len` bytes in the first
    /// queued message receive buffer (in add order) that is not cancelled,
    /// not closed to further messages, and has `len` bytes left.
    ///
    /// # Errors
    /// See [`ClaimError`]. `NoBuffers` is counted and reported here.
    pub fn claim_recv(&self, len: usize) -> std::result::Result<RecvClaim, ClaimError> {
        self.with(|tm| tm.claim_recv(len))
            .unwrap_or(Err(ClaimError::NotStarted))
    }

    /// Validates an active bulk request against the passive buffer its
    /// descriptor names, and claims that buffer. `requester` is the
    /// canonical address of the active transfer machine, `active` its queue,
    /// `active_size` the capacity of its buffer (active receive) or the
    /// bytes it sends (active send).
    ///
    /// Checked, in order: the transfer machine is started; the buffer
    /// exists with the descriptor's generation and cookie, not cancelled,
    /// not in use (else `NoEntry`, or `Busy`); the descriptor's other fields
    /// match the buffer (else `InvalidDescriptor`); queue pairing (else
    /// `WrongQueue`), allowed end point (else `AccessDenied`) and sizes
    /// (else `TooBig`), which fail the passive buffer too. Rejections that
    /// leave the passive buffer alone are reported to its transfer machine
    /// as error events.
    ///
    /// # Errors
    /// See [`PassiveError`].
    pub fn claim_passive(
        &self,
        fields: &DescFields,
        requester: &str,
        active: QueueType,
        active_size: usize,
    ) -> std::result::Result<PassiveClaim, PassiveError> {
        self.with(|tm| tm.claim_passive(fields, requester, active, active_size))
            .unwrap_or_else(|| {
                Err(PassiveError {
                    error: NetError::Unreachable(fields.owner.clone()),
                    victim: None,
                    notice: Delivery::default(),
                })
            })
    }

    /// The earliest buffer deadline, if any buffer has one. Lock-free.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.with(|tm| tm.next_deadline()).flatten()
    }

    /// Asks the transport (through [`XprtTm::buf_del`] with
    /// [`DelReason::Timeout`]) to cancel every buffer whose deadline is at
    /// or before `now`. Returns how many were expired. Harmless to call
    /// early or often.
    pub fn expire_timeouts(&self, now: Instant) -> usize {
        self.with(|tm| tm.expire_timeouts(now)).unwrap_or(0)
    }

    /// The queued buffer with this token, if it is still queued on this
    /// transfer machine.
    pub fn lookup(&self, token: BufToken) -> Option<QueuedBuf> {
        self.with(|tm| tm.lookup(token)).flatten()
    }
}

/// Callbacks the core has decided, waiting to run: the pending events of a
/// buffer, or a transfer machine's loss event.
///
/// Returned by the `*_deferred` posting methods (and carried by
/// [`ClaimError::NoBuffers`] and [`PassiveError`]) so a transport can run
/// the application's callbacks on a thread of the transfer machine they
/// belong to. Running it (or dropping it: `Drop` runs it) delivers every
/// event pending for that buffer, in order; an empty delivery does nothing.
#[must_use = "a Delivery runs the application's callback; run it (dropping it also runs it)"]
#[derive(Default)]
pub struct Delivery {
    pub(crate) job: Option<Job>,
}

/// What a delivery runs.
pub(crate) enum Job {
    /// The pending events of one buffer.
    Buf(Arc<TmInner>, Arc<Slot>),
    /// A transfer machine's (loss) event; boxed, as they are rare and a
    /// `Delivery` is moved around a lot.
    Tm(Arc<TmInner>, Box<crate::tm::TmEvent>),
}

impl Job {
    fn run(self) {
        match self {
            Self::Buf(tm, slot) => tm.run_delivery(&slot),
            Self::Tm(tm, ev) => tm.run_loss_event(*ev),
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("pending", &self.job.is_some())
            .finish()
    }
}

impl Delivery {
    /// Runs the callbacks now, on this thread.
    pub fn run(mut self) {
        if let Some(job) = self.job.take() {
            job.run();
        }
    }

    /// True when running it would call the application.
    pub fn is_pending(&self) -> bool {
        self.job.is_some()
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            job.run();
        }
    }
}
