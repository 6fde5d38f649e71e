//! Timers as inputs: each transfer machine's deadlines, the timer it arms
//! on its domain's clock, and expiry.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use tracing::trace;

use crate::clock::TimerTarget;
use crate::util::{instant_to_nanos, nanos_to_instant};
use crate::xprt::DelReason;

use super::slot::{F_CANCEL, F_TIMED_OUT};
use super::{TmCore, TmHandle, TmInner};

impl TmInner {
    /// Publishes the earliest deadline and arms the clock's timer when it
    /// moved earlier than the one armed.
    pub(super) fn update_earliest(&self, core: &mut TmCore) {
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
}

impl TimerTarget for TmInner {
    fn on_timer(&self, now: Instant) {
        if let Some(me) = self.me.upgrade() {
            me.handle_timeout(now);
        }
    }
}

impl TmHandle {
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
}
