//! The sink: the core's end of a transfer machine, through which its
//! transport reports, and the types the sink's checks hand out.

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
use crate::xprt::XprtData;

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

    /// What [`XprtDomain::buf_register`](crate::xprt::XprtDomain::buf_register) returned for this buffer.
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

    /// For a [`Caps::network_owned`](crate::xprt::Caps::network_owned)
    /// transport, from inside [`XprtTm::buf_add`](crate::xprt::XprtTm::buf_add)
    /// only (its caller holds the transfer machine's lock, so no deletion
    /// can interleave): the network took the buffer's operation (LNet: its
    /// PUT, or its bulk request, is under way). The buffer then shows in
    /// use ([`crate::BufState::in_use`]) and a stop without abort lets it
    /// finish. A buffer the network only holds, as a receive buffer's MD
    /// waiting for messages, is not in use.
    pub fn mark_taken_by_network(&self) {
        self.0.set(crate::tm::F_IN_USE);
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

impl ClaimError {
    /// Settles a refused claim for a message of `len` bytes on a thread of
    /// the receiving transfer machine (its `sink`): runs the receiver's
    /// `NoBuffers` event, or fails the too-small `victim` with
    /// `MessageTooLarge`, and returns the error the sender gets
    /// (`Unreachable(receiver)` for a machine that is not started). For
    /// transports that deliver the receiver's events elsewhere, match the
    /// variants instead.
    pub fn settle(self, sink: &TmSink, len: usize, receiver: &dyn fmt::Display) -> NetError {
        match self {
            Self::NoBuffers { notice } => {
                notice.run();
                NetError::NoBuffers
            }
            Self::TooLarge { victim, space } => {
                let e = NetError::MessageTooLarge { len, space };
                sink.complete(&victim, Err(e.clone()));
                e
            }
            Self::NotStarted => NetError::Unreachable(receiver.to_string()),
        }
    }
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

/// A refused active bulk request. The passive buffer is never touched: a
/// request that breaks the descriptor's contract (stale, forged or edited
/// descriptor, busy buffer, wrong queue pairing, an end point the
/// descriptor does not allow, sizes) fails only the active side, so that
/// whoever sees a descriptor cannot kill the transfer it was made for.
#[derive(Debug)]
pub struct PassiveError {
    /// The status the active buffer completes with.
    pub error: NetError,
    /// The passive transfer machine's error event (coalesced; possibly
    /// empty), to run on one of its own threads.
    pub notice: Delivery,
}

/// The core's end of a transfer machine, handed to the transport.
///
/// Cheap to clone; holds the transfer machine weakly, so a transport keeping
/// one never keeps a finalised transfer machine alive. Every method may be
/// called from any thread, but never while holding the transfer machine's
/// lock (that is, never from inside an [`XprtTm`](crate::xprt::XprtTm) method of the same
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

    /// A handle to the transfer machine, while it exists: for a wrapper
    /// transport that adds operations of its own (the fault injector's
    /// duplicated and truncated transfers). Never use it under the
    /// transfer machine's lock (inside an `XprtTm` method).
    pub fn handle(&self) -> Option<crate::tm::TmHandle> {
        self.tm.upgrade().map(|inner| crate::tm::TmHandle { inner })
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
    /// core completes it now (it is no longer in use).
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

    /// For a network that places messages itself (LNet's MDs; see
    /// [`Caps::network_owned`](crate::xprt::Caps::network_owned)): records
    /// a message of `len` bytes the network already wrote at `offset` of
    /// the message receive buffer `buf`, whatever the core's own placement
    /// rules would have chosen, even on a buffer being cancelled (the
    /// bytes are there). `fin` says the network will place no more
    /// messages in the buffer: its event is then the final one. Hand the
    /// claim to [`TmSink::post_msg`] as any other. `None` when the buffer
    /// is no longer queued or the region is out of its bounds.
    pub fn claim_recv_placed(
        &self,
        buf: &QueuedBuf,
        offset: usize,
        len: usize,
        fin: bool,
    ) -> Option<RecvClaim> {
        self.with(|tm| tm.claim_recv_placed(buf, offset, len, fin))
            .flatten()
    }

    /// Counts a message that arrived with no receive buffer to take it
    /// (MSG_RECV failed events, [`TmHandle::no_buffer_drops`](crate::TmHandle::no_buffer_drops)),
    /// as [`TmSink::claim_recv`] does when it fails with
    /// [`ClaimError::NoBuffers`], for a network that found no buffer
    /// itself. Returns the receiver's coalesced `NoBuffers` error event
    /// (empty when one is pending or the transfer machine is not started).
    pub fn count_no_buffers(&self, len: usize) -> Delivery {
        self.with(|tm| tm.count_no_buffers(len)).unwrap_or_default()
    }

    /// Like [`TmSink::claim_recv`], but a failure has no effect at all:
    /// nothing counted or reported, no buffer failed. For a transport
    /// that can free a receive buffer first (by running completions it
    /// deferred) before it tries again with [`TmSink::claim_recv`].
    pub fn try_claim_recv(&self, len: usize) -> Option<RecvClaim> {
        self.with(|tm| tm.try_claim_recv(len)).flatten()
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
    /// (else `TooBig`). A refusal leaves the passive buffer queued and
    /// available, and is reported to its transfer machine as an error
    /// event (counted in `rejected_requests`).
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
                    notice: Delivery::default(),
                })
            })
    }

    /// Hands back to the transport a buffer it set aside in
    /// [`XprtTm::buf_add`](crate::xprt::XprtTm::buf_add) without working on
    /// it (a wrapper that delays operations): under the transfer machine's
    /// lock, if the buffer is still queued, not in use, not cancelled and
    /// the transfer machine is started, `buf_add` is called again; a
    /// refusal completes the buffer with the error. False when nothing was
    /// handed back (the buffer is gone, cancelled or busy: the core
    /// completes it otherwise).
    pub fn resubmit(&self, buf: &QueuedBuf) -> bool {
        self.with(|tm| tm.resubmit(buf)).unwrap_or(false)
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
    /// A transfer machine event (a state change, or a coalesced loss event
    /// when the flag is set); boxed, as they are rare and a `Delivery` is
    /// moved around a lot.
    Tm(Arc<TmInner>, Box<crate::tm::TmEvent>, bool),
    /// The STOPPED event (the state changes as it is delivered).
    Stopped(Arc<TmInner>),
    /// The synchronous-delivery hook ([`crate::TmHandle::notify`]).
    Hook(Box<dyn FnOnce() + Send>),
}

impl Job {
    fn run(self) {
        match self {
            Self::Buf(tm, slot) => tm.run_delivery(slot),
            Self::Tm(tm, ev, loss) => tm.run_tm_event(*ev, loss),
            Self::Stopped(tm) => tm.deliver_stopped(),
            Self::Hook(h) => h(),
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
