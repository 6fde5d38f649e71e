//! Registered buffers, their callbacks and their completion events.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::bufvec::BufVec;
use crate::domain::DomainInner;
use crate::ep::EndPoint;
use crate::error::{NetError, Result};
use crate::queue::QueueType;
use crate::tm::{BufToken, Slot, TmHandle};
use crate::util::{ViewGuard, next_id};
use crate::xprt::XprtData;

/// A buffer callback: receives the transfer machine (to re-queue buffers,
/// send replies, ...) and the event, by value.
pub type BufferCallback = dyn Fn(&TmHandle, BufferEvent) + Send + Sync;

/// The per-queue callbacks of buffers, in one value shared by any number of
/// buffers (wrap it in an [`Arc`]).
///
/// ```
/// use std::sync::Arc;
/// use colibri_net::{BufferCallbacks, QueueType};
///
/// let cbs = Arc::new(
///     BufferCallbacks::new()
///         .on(QueueType::MsgRecv, |_tm, ev| println!("{} bytes", ev.length()))
///         .on(QueueType::MsgSend, |_tm, ev| assert!(ev.status().is_ok())),
/// );
/// assert!(cbs.has(QueueType::MsgRecv));
/// assert!(!cbs.has(QueueType::ActiveBulkRecv));
/// ```
#[derive(Default, Clone)]
pub struct BufferCallbacks {
    cbs: [Option<Arc<BufferCallback>>; QueueType::COUNT],
}

impl fmt::Debug for BufferCallbacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: Vec<QueueType> = QueueType::ALL
            .into_iter()
            .filter(|q| self.has(*q))
            .collect();
        f.debug_struct("BufferCallbacks")
            .field("queues", &set)
            .finish()
    }
}

impl BufferCallbacks {
    /// No callbacks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the callback of one queue.
    #[must_use]
    pub fn on(
        mut self,
        queue: QueueType,
        f: impl Fn(&TmHandle, BufferEvent) + Send + Sync + 'static,
    ) -> Self {
        self.cbs[queue.index()] = Some(Arc::new(f));
        self
    }

    /// Sets the same callback for every queue.
    #[must_use]
    pub fn on_all(mut self, f: impl Fn(&TmHandle, BufferEvent) + Send + Sync + 'static) -> Self {
        let f: Arc<BufferCallback> = Arc::new(f);
        for c in &mut self.cbs {
            *c = Some(f.clone());
        }
        self
    }

    /// True when a callback is set for `queue`.
    pub fn has(&self, queue: QueueType) -> bool {
        self.cbs[queue.index()].is_some()
    }

    pub(crate) fn get(&self, queue: QueueType) -> Option<&Arc<BufferCallback>> {
        self.cbs[queue.index()].as_ref()
    }
}

/// Observable state of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BufState {
    /// Registered with a domain.
    pub registered: bool,
    /// On a queue of a transfer machine.
    pub queued: bool,
    /// The queue it is on.
    pub queue: Option<QueueType>,
    /// The transport is working on it.
    pub in_use: bool,
    /// Deletion was requested (cancel, stop or timeout).
    pub cancelled: bool,
    /// Its timeout expired.
    pub timed_out: bool,
    /// Messages received into it so far (message receive buffers).
    pub msgs_received: u32,
}

/// A registered buffer.
///
/// Made by [`Domain::register`](crate::Domain::register). Adding it to a
/// queue moves it into the transfer machine, and its final completion event
/// hands it back ([`BufferEvent::take_buffer`]); a refused add hands it back
/// at once. A buffer that is on a queue therefore cannot be touched, added
/// twice, or deregistered: the compiler enforces it.
///
/// ```compile_fail
/// # fn demo(tm: &colibri_net::TmHandle, buf: colibri_net::NetBuffer) {
/// use colibri_net::RecvParams;
/// let _t1 = tm.add_msg_recv(buf, RecvParams::default());
/// let _t2 = tm.add_msg_recv(buf, RecvParams::default()); // buf was moved
/// # }
/// ```
///
/// Dropping a buffer deregisters it.
#[must_use = "dropping a NetBuffer deregisters its memory"]
pub struct NetBuffer(Box<BufInner>);

/// The buffer's state, boxed so that moving a buffer (into a queue, into an
/// event, back in an error) moves one pointer.
pub(crate) struct BufInner {
    pub(crate) dom: Arc<DomainInner>,
    bufvec: BufVec,
    reg: Option<XprtData>,
    registered: bool,
    callbacks: Option<Arc<BufferCallbacks>>,
    timeout: Option<Instant>,
    id: u64,
    app_tag: u64,
    pub(crate) msgs_received: u32,
}

impl fmt::Debug for NetBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetBuffer")
            .field("id", &self.0.id)
            .field("len", &self.0.bufvec.len())
            .field("segments", &self.0.bufvec.nr_segments())
            .field("tag", &self.0.app_tag)
            .finish()
    }
}

impl NetBuffer {
    pub(crate) fn new(dom: Arc<DomainInner>, bufvec: BufVec, reg: Option<XprtData>) -> Self {
        Self(Box::new(BufInner {
            dom,
            bufvec,
            reg,
            registered: true,
            callbacks: None,
            timeout: None,
            id: next_id(),
            app_tag: 0,
            msgs_received: 0,
        }))
    }

    /// Process-unique identifier of the buffer.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Identifier of the domain it is registered with.
    pub fn domain_id(&self) -> u64 {
        self.0.dom.id
    }

    /// Capacity in bytes.
    pub fn len(&self) -> usize {
        self.0.bufvec.len()
    }

    /// True for a zero-capacity buffer (never registered: registration
    /// refuses empty buffers).
    pub fn is_empty(&self) -> bool {
        self.0.bufvec.is_empty()
    }

    /// The memory.
    pub fn bufvec(&self) -> &BufVec {
        &self.0.bufvec
    }

    /// The memory, mutable (to fill a message before sending it).
    pub fn bufvec_mut(&mut self) -> &mut BufVec {
        &mut self.0.bufvec
    }

    /// Sets the callbacks used when the buffer is added to a queue.
    pub fn set_callbacks(&mut self, callbacks: Arc<BufferCallbacks>) {
        self.0.callbacks = Some(callbacks);
    }

    /// Sets the callbacks (builder style).
    pub fn with_callbacks(mut self, callbacks: Arc<BufferCallbacks>) -> Self {
        self.0.callbacks = Some(callbacks);
        self
    }

    /// The callbacks, if set.
    pub fn callbacks(&self) -> Option<&Arc<BufferCallbacks>> {
        self.0.callbacks.as_ref()
    }

    /// Sets an absolute timeout for the next add; the buffer completes with
    /// `TimedOut` if its operation has not finished by then (on transports
    /// with [`Caps::timeouts`](crate::Caps)). Reset to `None` every time the
    /// buffer is handed back.
    pub fn set_timeout(&mut self, deadline: Option<Instant>) {
        self.0.timeout = deadline;
    }

    /// The timeout for the next add.
    pub fn timeout(&self) -> Option<Instant> {
        self.0.timeout
    }

    /// An application-defined tag (for example an index into the
    /// application's own tables); not interpreted.
    pub fn tag(&self) -> u64 {
        self.0.app_tag
    }

    /// Sets the application-defined tag.
    pub fn set_tag(&mut self, tag: u64) {
        self.0.app_tag = tag;
    }

    /// Messages received into this buffer during its last time on the
    /// message receive queue.
    pub fn msgs_received(&self) -> u32 {
        self.0.msgs_received
    }

    /// State of a buffer in the application's hands: registered, not
    /// queued.
    pub fn state(&self) -> BufState {
        BufState {
            registered: self.0.registered,
            msgs_received: self.0.msgs_received,
            ..BufState::default()
        }
    }

    pub(crate) fn dom(&self) -> &Arc<DomainInner> {
        &self.0.dom
    }

    pub(crate) fn set_msgs_received(&mut self, n: u32) {
        self.0.msgs_received = n;
    }

    pub(crate) fn reg(&self) -> Option<XprtData> {
        self.0.reg.clone()
    }

    pub(crate) fn timeout_reset(&mut self) {
        self.0.timeout = None;
    }

    /// Forgets what the last user set (callbacks, timeout, tag, message
    /// count), for a buffer going back to a pool.
    pub(crate) fn clear_for_pool(&mut self) {
        self.0.callbacks = None;
        self.0.timeout = None;
        self.0.app_tag = 0;
        self.0.msgs_received = 0;
    }

    /// Deregisters the buffer and returns its memory.
    pub fn deregister(mut self) -> BufVec {
        self.release();
        std::mem::take(&mut self.0.bufvec)
    }

    fn release(&mut self) {
        if self.0.registered {
            self.0.registered = false;
            self.0.dom.xprt.buf_deregister(self.0.reg.take());
            self.0.dom.bufs.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for NetBuffer {
    fn drop(&mut self) {
        self.release();
    }
}

/// A buffer completion event, delivered to the buffer's callback for its
/// queue.
///
/// A *final* event ends the buffer's time on the queue and carries the
/// buffer back to the application ([`BufferEvent::take_buffer`]); if the
/// callback does not take it, it is deregistered when the event is dropped.
/// A message receive buffer that holds several messages gets one event per
/// message; all but the last are *retained* events: the buffer stays queued,
/// and the message is read through [`BufferEvent::with_data`] or
/// [`BufferEvent::message`].
pub struct BufferEvent {
    pub(crate) queue: QueueType,
    pub(crate) status: Result<()>,
    pub(crate) offset: usize,
    pub(crate) length: usize,
    pub(crate) sender: Option<EndPoint>,
    pub(crate) time: Instant,
    pub(crate) token: BufToken,
    pub(crate) msgs: u32,
    pub(crate) buffer: Option<NetBuffer>,
    pub(crate) slot: Option<Arc<Slot>>,
}

impl fmt::Debug for BufferEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferEvent")
            .field("queue", &self.queue)
            .field("status", &self.status)
            .field("offset", &self.offset)
            .field("length", &self.length)
            .field("sender", &self.sender.as_ref().map(EndPoint::addr))
            .field("final", &self.is_final())
            .finish()
    }
}

impl BufferEvent {
    /// The queue the buffer was on.
    pub fn queue(&self) -> QueueType {
        self.queue
    }

    /// `Ok` on success, else the failure (`Cancelled`, `TimedOut`, ...).
    pub fn status(&self) -> &Result<()> {
        &self.status
    }

    /// True on success.
    pub fn is_ok(&self) -> bool {
        self.status.is_ok()
    }

    /// The failure, if any.
    pub fn error(&self) -> Option<&NetError> {
        self.status.as_ref().err()
    }

    /// Where the received data starts in the buffer (receive queues).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes received (receive queues) or sent (send queues).
    pub fn length(&self) -> usize {
        self.length
    }

    /// The sender of a received message. The event holds a reference;
    /// clone it to keep the end point.
    pub fn sender(&self) -> Option<&EndPoint> {
        self.sender.as_ref()
    }

    /// Takes the sender's end point out of the event.
    pub fn take_sender(&mut self) -> Option<EndPoint> {
        self.sender.take()
    }

    /// When the event was posted.
    pub fn time(&self) -> Instant {
        self.time
    }

    /// The token of the add this event completes.
    pub fn token(&self) -> BufToken {
        self.token
    }

    /// Messages received into the buffer so far, this one included
    /// (message receive queue).
    pub fn msgs_received(&self) -> u32 {
        self.msgs
    }

    /// True when the buffer left the queue with this event.
    pub fn is_final(&self) -> bool {
        self.slot.is_none()
    }

    /// The buffer, on a final event (until taken).
    pub fn buffer(&self) -> Option<&NetBuffer> {
        self.buffer.as_ref()
    }

    /// The buffer, mutable, on a final event (until taken).
    pub fn buffer_mut(&mut self) -> Option<&mut NetBuffer> {
        self.buffer.as_mut()
    }

    /// Takes the buffer back, on a final event.
    pub fn take_buffer(&mut self) -> Option<NetBuffer> {
        self.buffer.take()
    }

    /// Runs `f` over the buffer's memory (the message is at
    /// `offset()..offset() + length()`), without copying.
    ///
    /// On a retained event the buffer is still queued and this briefly
    /// locks its memory: `f` must not call into the messaging API (such
    /// calls fail with `ApiMisuse`).
    ///
    /// # Errors
    /// `ApiMisuse` when the buffer was taken out of this event, or a
    /// retained event is read after its buffer completed.
    pub fn with_data<R>(&self, f: impl FnOnce(&BufVec) -> R) -> Result<R> {
        if let Some(b) = &self.buffer {
            return Ok(f(b.bufvec()));
        }
        let gone = || NetError::ApiMisuse("the event's buffer is no longer available".into());
        let slot = self.slot.as_ref().ok_or_else(gone)?;
        let guard = slot.buf.lock();
        let nb = guard.as_ref().ok_or_else(gone)?;
        let _view = ViewGuard::enter();
        Ok(f(nb.bufvec()))
    }

    /// A copy of the received message (`offset()..offset() + length()`).
    ///
    /// # Errors
    /// As [`BufferEvent::with_data`].
    pub fn message(&self) -> Result<Vec<u8>> {
        let (off, len) = (self.offset, self.length);
        self.with_data(|bv| bv.to_vec(off, len))?
    }
}
