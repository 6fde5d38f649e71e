//! Small shared helpers: identifiers, random cookies, a monotonic epoch, and
//! the per-thread context that detects re-entrant misuse.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique, non-zero identifier.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// An unpredictable 64-bit value for descriptor cookies.
///
/// Built from the standard library's randomly keyed SipHash (its keys come
/// from the operating system's random source) over a counter and the clock,
/// so no extra dependency is needed. Cookies defend against guessed and
/// replayed descriptors, not against a peer able to read our memory.
pub(crate) fn random_u64() -> u64 {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = STATE.get_or_init(RandomState::new).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(d) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    // A fresh RandomState per call adds per-call key material on top.
    let extra = RandomState::new().hash_one(COUNTER.load(Ordering::Relaxed));
    h.write_u64(extra);
    h.finish()
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from the process epoch to `t`, plus one, so that 0 can mean
/// "none" in atomics.
pub(crate) fn instant_to_nanos(t: Instant) -> u64 {
    t.saturating_duration_since(epoch())
        .as_nanos()
        .min(u128::from(u64::MAX - 1)) as u64
        + 1
}

/// Inverse of [`instant_to_nanos`]; `None` for 0.
pub(crate) fn nanos_to_instant(n: u64) -> Option<Instant> {
    (n != 0).then(|| epoch() + std::time::Duration::from_nanos(n - 1))
}

#[cfg(not(loom))]
thread_local! {
    /// Depth of data views open on this thread.
    static IN_VIEW: Cell<u32> = const { Cell::new(0) };
    /// Transfer machines whose callbacks run on this thread (innermost last).
    static IN_CALLBACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Depth of delivery-thread marks on this thread (a transport's engine
    /// or worker thread, a timer thread, an upper layer's timer thread).
    static DELIVERY: Cell<u32> = const { Cell::new(0) };
}

// Under the model checker, model threads share one OS thread: their
// thread-locals must be loom's (which take no `const` initialisers).
#[cfg(loom)]
loom::thread_local! {
    /// Depth of data views open on this thread.
    static IN_VIEW: Cell<u32> = Cell::new(0);
    /// Transfer machines whose callbacks run on this thread (innermost last).
    static IN_CALLBACK: RefCell<Vec<u64>> = RefCell::new(Vec::new());
    /// Depth of delivery-thread marks on this thread (a transport's engine
    /// or worker thread, a timer thread, an upper layer's timer thread).
    static DELIVERY: Cell<u32> = Cell::new(0);
}

/// True while this thread delivers events: it runs a callback, or it is
/// marked as a transport or timer thread.
pub(crate) fn on_delivery_thread() -> bool {
    DELIVERY.with(|d| d.get() > 0) || IN_CALLBACK.with(|c| !c.borrow().is_empty())
}

/// Marks this thread as one that delivers events, for the guard's
/// lifetime.
pub(crate) fn enter_delivery() {
    DELIVERY.with(|d| d.set(d.get() + 1));
}

/// Undoes one [`enter_delivery`].
pub(crate) fn leave_delivery() {
    DELIVERY.with(|d| d.set(d.get().saturating_sub(1)));
}

/// True while this thread reads a buffer through an event's data view.
pub(crate) fn in_data_view() -> bool {
    IN_VIEW.with(|v| v.get() > 0)
}

/// Marks a data view open for the guard's lifetime.
pub(crate) struct ViewGuard(());

impl ViewGuard {
    pub(crate) fn enter() -> Self {
        IN_VIEW.with(|v| v.set(v.get() + 1));
        Self(())
    }
}

impl Drop for ViewGuard {
    fn drop(&mut self) {
        IN_VIEW.with(|v| v.set(v.get().saturating_sub(1)));
    }
}

/// True while this thread runs a callback of transfer machine `tm`.
pub(crate) fn in_callback_of(tm: u64) -> bool {
    IN_CALLBACK.with(|c| c.borrow().contains(&tm))
}

/// Marks a callback of `tm` running on this thread for the guard's lifetime.
pub(crate) struct CallbackGuard(u64);

impl CallbackGuard {
    pub(crate) fn enter(tm: u64) -> Self {
        IN_CALLBACK.with(|c| c.borrow_mut().push(tm));
        Self(tm)
    }
}

impl Drop for CallbackGuard {
    fn drop(&mut self) {
        IN_CALLBACK.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(pos) = c.iter().rposition(|&t| t == self.0) {
                c.remove(pos);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_cookies_vary() {
        let a = next_id();
        let b = next_id();
        assert_ne!(a, b);
        let cookies: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(cookies.len(), 1000);
    }

    #[test]
    fn nanos_round_trip() {
        let _ = epoch();
        let now = Instant::now();
        let n = instant_to_nanos(now);
        assert!(n > 0);
        let back = nanos_to_instant(n).unwrap();
        assert!(back <= now && now.duration_since(back).as_nanos() < 2);
        assert_eq!(nanos_to_instant(0), None);
    }

    #[test]
    fn guards_nest() {
        assert!(!in_data_view());
        {
            let _a = ViewGuard::enter();
            let _b = ViewGuard::enter();
            assert!(in_data_view());
        }
        assert!(!in_data_view());
        {
            let _g = CallbackGuard::enter(7);
            assert!(in_callback_of(7));
            assert!(!in_callback_of(8));
        }
        assert!(!in_callback_of(7));
    }
}
