//! Event delivery: transfer machine events, buffer events (per-buffer
//! serialization), the STOPPED event, and synchronous delivery.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{debug, error};

use crate::buffer::BufferEvent;
use crate::ep::EndPoint;
use crate::error::{NetError, Result};
use crate::sink::Job;
use crate::sync::MutexGuard;
use crate::util::{CallbackGuard, in_callback_of};
use crate::xprt::Delivery;

use super::slot::{EvData, SPARE_SLOTS, Slot};
use super::{BufToken, TmCore, TmHandle, TmInner, TmState};

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

impl TmInner {
    /// Synchronous delivery mode: queues buffer events for `deliver_all`.
    /// Returns the one-shot notify hook to run (once the lock is released).
    pub(super) fn queue_pending(
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
    pub(super) fn tm_event(
        self: &Arc<Self>,
        core: &mut TmCore,
        kind: TmEventKind,
        loss: bool,
    ) -> Delivery {
        let ev = TmEvent {
            kind,
            time: crate::clock::stamp_now(),
        };
        core.event_seq += 1;
        self.running.fetch_add(1, Ordering::AcqRel);
        Delivery {
            job: Some(Job::Tm(Arc::clone(self), Box::new(ev), loss)),
        }
    }

    /// Delivers a transfer machine event on this thread. Consumes the lock
    /// guard.
    pub(super) fn emit_tm(self: &Arc<Self>, mut core: MutexGuard<'_, TmCore>, kind: TmEventKind) {
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
    pub(super) fn loss_event(
        self: &Arc<Self>,
        mut core: MutexGuard<'_, TmCore>,
        error: NetError,
    ) -> Delivery {
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

    pub(super) fn call_tm_cb(self: &Arc<Self>, ev: &TmEvent) {
        let h = TmHandle {
            inner: Arc::clone(self),
        };
        let _g = CallbackGuard::enter(self.id.0);
        if catch_unwind(AssertUnwindSafe(|| (self.callback)(&h, ev))).is_err() {
            error!(tm = %self.id, "transfer machine event callback panicked");
        }
    }

    pub(super) fn finish_callback(self: &Arc<Self>) {
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

    pub(crate) fn run_delivery(self: &Arc<Self>, slot: Arc<Slot>) {
        loop {
            let ev = {
                let mut se = slot.events.lock();
                match se.backlog.pop_front() {
                    Some(ev) => ev,
                    None => {
                        se.busy = false;
                        break;
                    }
                }
            };
            self.dispatch_buffer(&slot, ev);
            self.finish_callback();
        }
        self.recycle(slot);
    }

    /// Keeps a slot for a later add when this was its last reference: it
    /// left the table (which holds one while it is queued), its final
    /// event was delivered, and neither the transport nor the application
    /// holds it. Otherwise the last holder frees it.
    pub(super) fn recycle(&self, mut slot: Arc<Slot>) {
        if let Some(s) = Arc::get_mut(&mut slot) {
            s.make_spare();
            let mut spare = self.spare.lock();
            if spare.len() < SPARE_SLOTS {
                spare.push(slot);
            }
        }
    }

    pub(super) fn dispatch_buffer(self: &Arc<Self>, slot: &Arc<Slot>, ev: EvData) {
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
        let Some(cb) = slot.callbacks.as_ref().and_then(|c| c.get(slot.queue)) else {
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
}

impl TmHandle {
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
            self.inner.recycle(slot);
            n += 1;
        }
        Ok(n)
    }

    /// Arms a one-shot hook called when the next buffer event becomes
    /// pending in synchronous mode, soon after, on a thread of the
    /// transport (the one that posted the event, or the receiving transfer
    /// machine's own); called at once, on this thread, if events are
    /// already pending. Replaces a hook not yet fired.
    pub fn notify(&self, hook: impl FnOnce() + Send + 'static) {
        let mut core = self.inner.core.lock();
        if core.pending.is_empty() {
            core.notify = Some(Box::new(hook));
        } else {
            drop(core);
            hook();
        }
    }
}
