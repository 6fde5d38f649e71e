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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::buffer::{BufferCallbacks, BufferEvent};
use crate::tm::{TmCallback, TmEvent};

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
    pub fn recv_timeout(&self, timeout: Duration) -> Option<BufferEvent> {
        self.rx.recv_timeout(timeout).ok()
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
}

impl fmt::Debug for TmEventReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmEventReceiver")
            .field("queued", &self.rx.len())
            .finish()
    }
}

impl TmEventReceiver {
    /// The next event, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<TmEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next event, if one is waiting.
    pub fn try_recv(&self) -> Option<TmEvent> {
        self.rx.try_recv().ok()
    }
}

/// A transfer machine callback that forwards events into a channel of
/// `capacity` events, and its receiving end.
pub fn tm_event_channel(capacity: usize) -> (Arc<TmCallback>, TmEventReceiver) {
    let (tx, rx) = bounded(capacity.max(1));
    let cb: Arc<TmCallback> = Arc::new(move |_tm, ev: &TmEvent| {
        let _ = tx.send(ev.clone());
    });
    (cb, TmEventReceiver { rx })
}

/// A transfer machine callback that ignores every event (state changes can
/// still be waited for with
/// [`TmHandle::wait_for_state`](crate::TmHandle::wait_for_state)).
pub fn ignore_tm_events() -> Arc<TmCallback> {
    Arc::new(|_tm, _ev| {})
}
