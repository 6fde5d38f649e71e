//! The synchronisation primitives of the transfer machine core, in one
//! place so that the model checker can replace them.
//!
//! In a normal build these are `parking_lot`'s mutex and condition variable
//! and the standard atomics, re-exported unchanged (no cost). Built with
//! `RUSTFLAGS="--cfg loom"`, they are [loom](https://docs.rs/loom)'s
//! instrumented versions behind the same API, so the core's own code (the
//! buffer slots, completion, cancellation, timeouts, the stop sequence and
//! event delivery) runs under loom's exhaustive scheduler in
//! `net/tests/loom_core.rs`. DESIGN.md ("Model checking") says what that
//! covers and what it does not.
//!
//! What stays outside the model: a buffer's data lock and a send's end
//! point lock (leaf locks `parking_lot` provides directly, never contended
//! by the modelled steps), the clock's timer thread (the model uses the
//! manual clock) and the application's channels.
//!
//! Under loom, timed waits (`wait_until`, `wait_for`) are plain waits that
//! never time out: loom does not model time.
//!
//! Public (hidden) so that the transports' own handshakes (bulk_mem's work
//! queue) are checked the same way; not part of the API.

#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, fence};

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, fence};
#[cfg(loom)]
pub use model::{Condvar, Mutex, MutexGuard};

/// A leaf lock that stays `parking_lot`'s under the model checker too (a
/// buffer's data, a send's end point): the modelled steps never contend
/// on it, and its guard maps (`MutexGuard::try_map`).
pub use parking_lot::Mutex as LeafMutex;

#[cfg(loom)]
mod model {
    //! `parking_lot`'s API over loom's `std`-like primitives.

    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::time::{Duration, Instant};

    /// A mutex that never poisons (as `parking_lot`'s).
    #[derive(Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        /// A new unlocked mutex.
        pub fn new(v: T) -> Self {
            Self(loom::sync::Mutex::new(v))
        }

        /// The value, through exclusive access (no locking).
        pub fn get_mut(&mut self) -> &mut T {
            self.0
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Locks, waiting as long as it takes.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(
                self.0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            ))
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex")
        }
    }

    /// The guard; an `Option` only so that a condition variable can take
    /// it for the length of a wait.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> fmt::Debug for MutexGuard<'_, T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("MutexGuard")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard held")
        }
    }

    /// The result of a timed wait.
    #[derive(Debug, Clone, Copy)]
    pub struct WaitTimeoutResult;

    impl WaitTimeoutResult {
        /// Never: loom does not model time.
        pub fn timed_out(self) -> bool {
            false
        }
    }

    /// A condition variable with `parking_lot`'s signatures.
    #[derive(Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A new condition variable.
        pub fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        /// Waits for a notification.
        pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
            let inner = g.0.take().expect("guard held");
            g.0 = Some(
                self.0
                    .wait(inner)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }

        /// Waits for a notification (no timeout under loom).
        pub fn wait_until<T>(
            &self,
            g: &mut MutexGuard<'_, T>,
            _deadline: Instant,
        ) -> WaitTimeoutResult {
            self.wait(g);
            WaitTimeoutResult
        }

        /// Waits for a notification (no timeout under loom).
        pub fn wait_for<T>(
            &self,
            g: &mut MutexGuard<'_, T>,
            _timeout: Duration,
        ) -> WaitTimeoutResult {
            self.wait(g);
            WaitTimeoutResult
        }

        /// Wakes one waiter.
        pub fn notify_one(&self) -> bool {
            self.0.notify_one();
            true
        }

        /// Wakes every waiter.
        pub fn notify_all(&self) -> usize {
            self.0.notify_all();
            0
        }
    }

    impl fmt::Debug for Condvar {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Condvar")
        }
    }
}
