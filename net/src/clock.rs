//! Clocks: where transfer machines take the time for buffer timeouts, and
//! what drives their timers.
//!
//! Time is an input of the core. Each transfer machine keeps its buffers'
//! deadlines and exposes [`TmHandle::next_deadline`] and
//! [`TmHandle::handle_timeout`]; the domain's [`Clock`] decides who calls
//! the latter:
//!
//! * [`Clock::real`] (the default): one timer thread per process sleeps
//!   until the earliest armed deadline of any transfer machine and calls
//!   its `handle_timeout`. Transports never look at the time for buffer
//!   timeouts.
//! * [`Clock::manual`]: time stands still until [`ManualClock::advance`],
//!   which calls `handle_timeout` of every transfer machine with a deadline
//!   now due, on the caller's thread, before it returns. Tests of timeouts
//!   need no sleeping and cannot be flaky.
//!
//! `handle_timeout` never runs an application callback inline: expired
//! buffers complete on the transport's threads.
//!
//! [`TmHandle::next_deadline`]: crate::TmHandle::next_deadline
//! [`TmHandle::handle_timeout`]: crate::TmHandle::handle_timeout
//!
//! ```
//! use std::time::Duration;
//! use colibri_net::Clock;
//!
//! let manual = Clock::manual();
//! let clock = manual.clock();
//! let t0 = clock.now();
//! manual.advance(Duration::from_secs(5));
//! assert_eq!(clock.now() - t0, Duration::from_secs(5));
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::error;

thread_local! {
    /// The time of the step of work this thread is running, when its
    /// transport declared one ([`set_step_time`]).
    static STEP_TIME: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Declares the time of the step of work the calling thread is running,
/// or `None` to go back to reading the system clock.
///
/// A transport's I/O thread reads the clock once per turn of its loop (it
/// needs the time anyway, for its own timers) and declares it here; the
/// time stamps the core takes on that thread until the next call (the
/// time of the buffer events it posts, and the add time of buffers added
/// from the callbacks it runs, which only the queue statistics use) are
/// then that time instead of a clock read each: a few clock reads fewer
/// per message. Those stamps are then at most one turn of the loop early.
/// Buffer timeouts never use it (they follow the domain's [`Clock`]).
pub fn set_step_time(now: Option<Instant>) {
    STEP_TIME.with(|t| t.set(now));
}

/// The time for a stamp the core takes now: the step time declared on
/// this thread, else the system clock.
#[inline]
pub(crate) fn stamp_now() -> Instant {
    STEP_TIME.with(Cell::get).unwrap_or_else(Instant::now)
}

/// Something with deadlines: a transfer machine.
pub(crate) trait TimerTarget: Send + Sync {
    /// The armed deadline passed: expire what is due at `now` (and arm the
    /// next deadline, if any).
    fn on_timer(&self, now: Instant);
}

/// The time source of a domain's transfer machines. Cheap to clone.
#[derive(Clone)]
pub struct Clock {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Real,
    Manual(Arc<Manual>),
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Real => f.write_str("Clock::Real"),
            Kind::Manual(m) => f
                .debug_struct("Clock::Manual")
                .field("elapsed", &*m.offset.lock())
                .finish(),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::real()
    }
}

impl Clock {
    /// The system's monotonic clock, with the process's timer thread.
    pub fn real() -> Self {
        Self { kind: Kind::Real }
    }

    /// A clock that moves only when told ([`ManualClock::advance`]).
    pub fn manual() -> ManualClock {
        ManualClock(Arc::new(Manual {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
            timers: Mutex::new(Vec::new()),
        }))
    }

    /// True for a manual clock.
    pub fn is_manual(&self) -> bool {
        matches!(self.kind, Kind::Manual(_))
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        match &self.kind {
            Kind::Real => Instant::now(),
            Kind::Manual(m) => m.now(),
        }
    }

    /// Arranges for `target.on_timer` to be called once `at` has passed.
    pub(crate) fn arm(&self, at: Instant, target: Weak<dyn TimerTarget>) {
        match &self.kind {
            Kind::Real => REAL.arm(at, target),
            // Fired by the next advance that reaches it (never from here:
            // callers hold their own locks).
            Kind::Manual(m) => m.timers.lock().push((at, target)),
        }
    }
}

/// The handle that moves a manual clock. Cheap to clone.
#[derive(Clone)]
pub struct ManualClock(Arc<Manual>);

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("elapsed", &*self.0.offset.lock())
            .finish()
    }
}

struct Manual {
    base: Instant,
    offset: Mutex<Duration>,
    timers: Mutex<Vec<(Instant, Weak<dyn TimerTarget>)>>,
}

impl Manual {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock()
    }
}

impl ManualClock {
    /// The clock to put in a domain's configuration.
    pub fn clock(&self) -> Clock {
        Clock {
            kind: Kind::Manual(Arc::clone(&self.0)),
        }
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        self.0.now()
    }

    /// Moves time forward by `d`, then expires every buffer whose deadline
    /// is now due (in every transfer machine on this clock) before it
    /// returns. Their completions run on the transports' threads.
    pub fn advance(&self, d: Duration) {
        let now = {
            let mut off = self.0.offset.lock();
            *off += d;
            self.0.base + *off
        };
        self.fire(now);
    }

    fn fire(&self, now: Instant) {
        let due: Vec<Weak<dyn TimerTarget>> = {
            let mut timers = self.0.timers.lock();
            let mut due = Vec::new();
            timers.retain(|(at, t)| {
                if *at <= now {
                    due.push(t.clone());
                    false
                } else {
                    t.strong_count() > 0
                }
            });
            due
        };
        for t in due {
            if let Some(t) = t.upgrade() {
                t.on_timer(now);
            }
        }
    }
}

/// The process's timer thread for the real clock.
static REAL: LazyLock<RealTimers> = LazyLock::new(RealTimers::start);

struct RealTimers {
    state: Arc<(Mutex<TimerHeap>, Condvar)>,
}

#[derive(Default)]
struct TimerHeap {
    /// Armed deadlines; the sequence number keeps equal deadlines apart.
    due: BTreeMap<(Instant, u64), Weak<dyn TimerTarget>>,
    seq: u64,
    /// The thread could not be started (logged): timers are not armed.
    dead: bool,
}

impl RealTimers {
    fn start() -> Self {
        let state: Arc<(Mutex<TimerHeap>, Condvar)> = Arc::default();
        let s2 = Arc::clone(&state);
        let spawned = std::thread::Builder::new()
            .name("colibri-timer".into())
            .spawn(move || {
                let _mark = crate::wait::DeliveryThread::enter();
                Self::run(&s2);
            });
        if let Err(e) = spawned {
            error!(%e, "could not start the timer thread: buffer timeouts are not enforced");
            state.0.lock().dead = true;
        }
        Self { state }
    }

    fn arm(&self, at: Instant, target: Weak<dyn TimerTarget>) {
        let (lock, cond) = &*self.state;
        let mut h = lock.lock();
        if h.dead {
            return;
        }
        h.seq += 1;
        let key = (at, h.seq);
        let earliest = h.due.first_key_value().is_none_or(|(k, _)| key < *k);
        h.due.insert(key, target);
        if earliest {
            cond.notify_one();
        }
    }

    fn run(state: &(Mutex<TimerHeap>, Condvar)) {
        let (lock, cond) = state;
        let mut h = lock.lock();
        loop {
            let now = Instant::now();
            match h.due.first_key_value().map(|(k, _)| *k) {
                Some(key) if key.0 <= now => {
                    let target = h.due.remove(&key);
                    drop(h);
                    if let Some(t) = target.and_then(|t| t.upgrade()) {
                        t.on_timer(now);
                    }
                    h = lock.lock();
                }
                Some((at, _)) => {
                    cond.wait_until(&mut h, at);
                }
                None => cond.wait(&mut h),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_is_per_thread_and_reverts() {
        let t0 = Instant::now() - Duration::from_secs(3600);
        set_step_time(Some(t0));
        assert_eq!(stamp_now(), t0);
        let other = std::thread::spawn(stamp_now).join().unwrap();
        assert!(other > t0, "another thread reads the clock");
        set_step_time(None);
        assert!(stamp_now() > t0);
    }
}
