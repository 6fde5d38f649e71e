//! Blocking helpers for applications (and tests) that prefer to wait for
//! events rather than react to them in callbacks.
//!
//! [`event_channel`] builds buffer callbacks that forward every event into a
//! bounded channel, and [`tm_event_channel`] does the same for transfer
//! machine events. The receiving side blocks with a timeout.
//!
//! The channels are bounded: when one is full, the forwarding callback
//! blocks the transport thread that delivers the event until the
//! application receives. Size them for the number of buffers in flight.
//!
//! ## Never wait on a thread that delivers events
//!
//! Events are delivered by the transport's threads (and, in synchronous
//! mode, by the thread calling [`TmHandle::deliver_all`]). A blocking wait
//! made on such a thread, from inside a callback for instance, waits for
//! an event that only this very thread could deliver: it would hang for
//! good. Every blocking wait of this crate (and of the layers above it,
//! through [`check_may_block`]) therefore fails at once with
//! [`NetError::ApiMisuse`] when called on a delivery thread:
//!
//! ```
//! use std::time::Duration;
//! use colibri_net::wait::check_may_block;
//!
//! // An application thread may block.
//! assert!(check_may_block("waiting").is_ok());
//! ```
//!
//! In a callback, react instead (add the next buffer, complete a request
//! later from another thread), or hand the waiting to a thread of your
//! own.
//!
//! [`TmHandle::deliver_all`]: crate::TmHandle::deliver_all

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};

use crate::buffer::{BufferCallbacks, BufferEvent};
use crate::error::{NetError, Result};
use crate::tm::{TmCallback, TmEvent, TmEventKind};
use crate::util;

/// True when the calling thread delivers events: it runs a transfer
/// machine callback, or it is a transport's or a timer's thread (see
/// [`DeliveryThread`]). Blocking waits fail on such a thread.
pub fn on_delivery_thread() -> bool {
    util::on_delivery_thread()
}

/// `Ok` when the calling thread may block; [`NetError::ApiMisuse`] naming
/// `what` and the fix when it delivers events (see the [module
/// docs](self)).
///
/// # Errors
/// `ApiMisuse` on a delivery thread.
pub fn check_may_block(what: &str) -> Result<()> {
    if on_delivery_thread() {
        return Err(NetError::ApiMisuse(format!(
            "{what} would block a thread that delivers events (a transport or timer \
             thread, or a callback): the event it waits for may need this very thread. \
             React in the callback instead, or wait on a thread of your own"
        )));
    }
    Ok(())
}

/// Marks the calling thread, for the guard's lifetime, as one that
/// delivers events: blocking waits on it fail with `ApiMisuse`.
/// Transports mark their engine and worker threads; a layer above that
/// runs completion callbacks on a thread of its own (a timer thread)
/// marks that one. Guards nest.
#[must_use = "the mark lasts as long as the guard"]
pub struct DeliveryThread {
    // Thread-bound: the mark is a thread-local.
    _not_send: PhantomData<*const ()>,
}

impl DeliveryThread {
    /// Marks the calling thread until the guard drops.
    pub fn enter() -> Self {
        util::enter_delivery();
        Self {
            _not_send: PhantomData,
        }
    }
}

impl Drop for DeliveryThread {
    fn drop(&mut self) {
        util::leave_delivery();
    }
}

impl fmt::Debug for DeliveryThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryThread").finish()
    }
}

fn recv_with<T>(rx: &Receiver<T>, what: &str, timeout: Duration) -> Result<T> {
    check_may_block(what)?;
    match rx.recv_timeout(timeout) {
        Ok(v) => Ok(v),
        Err(RecvTimeoutError::Timeout) => Err(NetError::TimedOut),
        Err(RecvTimeoutError::Disconnected) => Err(NetError::ApiMisuse(format!(
            "{what}: the callbacks feeding this channel were dropped, no event can come"
        ))),
    }
}

/// The receiving end of [`event_channel`].
pub struct EventReceiver {
    rx: Receiver<BufferEvent>,
}

impl fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventReceiver")
            .field("queued", &self.rx.len())
            .finish()
    }
}

impl EventReceiver {
    /// The next event, waiting up to `timeout`.
    ///
    /// # Errors
    /// `TimedOut` when none came in time; `ApiMisuse` on a thread that
    /// delivers events (see the [module docs](self)) or when the
    /// callbacks that feed the channel are gone.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<BufferEvent> {
        recv_with(&self.rx, "EventReceiver::recv_timeout", timeout)
    }

    /// The next event, if one is waiting.
    pub fn try_recv(&self) -> Option<BufferEvent> {
        self.rx.try_recv().ok()
    }

    /// Number of events waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// True when no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// Buffer callbacks (for all six queues) that forward events into a channel
/// of `capacity` events, and its receiving end.
pub fn event_channel(capacity: usize) -> (Arc<BufferCallbacks>, EventReceiver) {
    let (tx, rx): (Sender<BufferEvent>, Receiver<BufferEvent>) = bounded(capacity.max(1));
    let cbs = BufferCallbacks::new().on_all(move |_tm, ev| {
        // A dropped receiver means nobody wants the event: the buffer it
        // carries is dropped (deregistered) with it.
        let _ = tx.send(ev);
    });
    (Arc::new(cbs), EventReceiver { rx })
}

/// The receiving end of [`tm_event_channel`].
pub struct TmEventReceiver {
    rx: Receiver<TmEvent>,
    dropped: Arc<AtomicU64>,
}

impl fmt::Debug for TmEventReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmEventReceiver")
            .field("queued", &self.rx.len())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl TmEventReceiver {
    /// The next event, waiting up to `timeout`.
    ///
    /// # Errors
    /// As [`EventReceiver::recv_timeout`].
    pub fn recv_timeout(&self, timeout: Duration) -> Result<TmEvent> {
        recv_with(&self.rx, "TmEventReceiver::recv_timeout", timeout)
    }

    /// The next event, if one is waiting.
    pub fn try_recv(&self) -> Option<TmEvent> {
        self.rx.try_recv().ok()
    }

    /// Error and diagnostic events dropped because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// A transfer machine callback that forwards events into a channel of
/// `capacity` events, and its receiving end.
///
/// The callback never waits: it runs on a transport's thread, which may
/// serve other machines too, and a stream of losses (`NoBuffers` under
/// load) that nobody reads must not stop it. An error or diagnostic event
/// that finds the channel full is dropped; a state change that does makes
/// room by dropping the oldest event waiting. Either way the drop is
/// counted ([`TmEventReceiver::dropped`]); losses stay counted in the
/// machine's statistics too.
pub fn tm_event_channel(capacity: usize) -> (Arc<TmCallback>, TmEventReceiver) {
    let (tx, rx) = bounded(capacity.max(1));
    let dropped = Arc::new(AtomicU64::new(0));
    let d = Arc::clone(&dropped);
    let oldest: Receiver<TmEvent> = rx.clone();
    let cb: Arc<TmCallback> = Arc::new(move |_tm, ev: &TmEvent| {
        let mut ev = ev.clone();
        let state = matches!(ev.kind, TmEventKind::StateChange { .. });
        loop {
            match tx.try_send(ev) {
                Err(TrySendError::Full(back)) => {
                    if !state {
                        d.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    // Room for the state change: the oldest event goes
                    // (unless the reader just took one).
                    if oldest.try_recv().is_ok() {
                        d.fetch_add(1, Ordering::Relaxed);
                    }
                    ev = back;
                }
                Ok(()) | Err(TrySendError::Disconnected(_)) => return,
            }
        }
    });
    (cb, TmEventReceiver { rx, dropped })
}

/// A transfer machine callback that ignores every event (state changes can
/// still be waited for with
/// [`TmHandle::wait_for_state`](crate::TmHandle::wait_for_state)).
pub fn ignore_tm_events() -> Arc<TmCallback> {
    Arc::new(|_tm, _ev| {})
}
