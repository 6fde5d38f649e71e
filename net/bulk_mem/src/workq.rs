//! A work queue whose consumers spin for a budget before they park.
//!
//! Waking a parked thread on another CPU costs 15-20 µs on the machines
//! this project is measured on, while a hand-off to a spinning thread costs
//! a fraction of a microsecond. Consumers therefore poll the queue for
//! `spin` before sleeping on a condition variable; `spin` zero is a purely
//! blocking queue.
//!
//! Items travel through a lock-free queue; the mutex and condition variable
//! are only touched to park and to wake a parked consumer. Lost wake-ups
//! are ruled out by a Dekker-style handshake: a producer pushes and then
//! reads the sleeper count, a consumer raises the sleeper count and then
//! looks at the queue again, each with a full fence in between, so at least
//! one of them sees the other.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

// The handshake's primitives come from the core's model-checking facade:
// loom's under `--cfg loom` (tests at the end of this file).
use colibri_net::sync::{AtomicBool, AtomicUsize, Condvar, Mutex, fence};
#[cfg(not(loom))]
use crossbeam_queue::SegQueue;

/// The queue. Its length is bounded by the buffers of the transfer
/// machines using it (one item per queued buffer, plus a few control
/// items), so it is not bounded here.
#[derive(Debug)]
pub(crate) struct WorkQueue<T> {
    q: SegQueue<T>,
    lock: Mutex<()>,
    cv: Condvar,
    sleepers: AtomicUsize,
    closed: AtomicBool,
}

impl<T> WorkQueue<T> {
    pub(crate) fn new() -> Self {
        Self {
            q: SegQueue::new(),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn push(&self, item: T) {
        self.q.push(item);
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_one();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Wakes every consumer, for example to make them look at their
    /// settings again.
    pub(crate) fn wake_all(&self) {
        let _g = self.lock.lock();
        self.cv.notify_all();
    }

    /// Makes every current and future `pop` return `None` once the queue
    /// is empty, without waiting.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Takes the next item, spinning up to `spin` and then sleeping. `None`
    /// when the queue was closed or a [`WorkQueue::wake_all`] asked
    /// consumers to look around. (Buffer timeouts are the core's: workers
    /// have no deadline of their own.)
    pub(crate) fn pop(&self, spin: Duration) -> Option<T> {
        if let Some(item) = self.q.pop() {
            return Some(item);
        }
        if !spin.is_zero() {
            let start = Instant::now();
            let mut n: u32 = 0;
            loop {
                std::hint::spin_loop();
                if let Some(item) = self.q.pop() {
                    return Some(item);
                }
                n = n.wrapping_add(1);
                if n.is_multiple_of(64) {
                    if self.is_closed() {
                        return None;
                    }
                    if start.elapsed() >= spin {
                        break;
                    }
                }
            }
        }
        let mut g = self.lock.lock();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let item = match self.q.pop() {
            Some(item) => Some(item),
            None if self.is_closed() => None,
            None => {
                // Woken by a push, wake_all, close or spuriously: in every
                // case return, so that the caller looks around.
                self.cv.wait(&mut g);
                self.q.pop()
            }
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        item
    }
}

/// Under the model checker, the lock-free queue is a locked one: loom
/// does not see inside crossbeam, and what is checked is the sleep and
/// wake-up handshake around the queue, which only needs a linearisable
/// push and pop.
#[cfg(loom)]
#[derive(Debug, Default)]
struct SegQueue<T>(Mutex<std::collections::VecDeque<T>>);

#[cfg(loom)]
impl<T> SegQueue<T> {
    fn new() -> Self {
        Self(Mutex::new(std::collections::VecDeque::new()))
    }
    fn push(&self, v: T) {
        self.0.lock().push_back(v);
    }
    fn pop(&self) -> Option<T> {
        self.0.lock().pop_front()
    }
    fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }
}

/// The sleep and wake-up handshake under every interleaving (loom):
/// `RUSTFLAGS="--cfg loom" cargo test -p colibri-bulk-mem --lib --release
/// --target-dir target/loom loom_`. A lost wake-up shows as a deadlock,
/// which loom reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two producers, one blocking consumer (spin 0): it gets both items.
    #[test]
    fn loom_no_lost_wakeup() {
        loom::model(|| {
            let q = Arc::new(WorkQueue::new());
            let producers: Vec<_> = (0..2)
                .map(|i| {
                    let q = Arc::clone(&q);
                    thread::spawn(move || q.push(i))
                })
                .collect();
            let mut got = Vec::new();
            while got.len() < 2 {
                if let Some(v) = q.pop(Duration::ZERO) {
                    got.push(v);
                }
            }
            for p in producers {
                p.join().unwrap();
            }
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
        });
    }

    /// `close` releases a consumer asleep on an empty queue.
    #[test]
    fn loom_close_wakes_a_sleeper() {
        loom::model(|| {
            let q = Arc::new(WorkQueue::<u32>::new());
            let q2 = Arc::clone(&q);
            let closer = thread::spawn(move || q2.close());
            while q.pop(Duration::ZERO).is_some() || !q.is_closed() {}
            closer.join().unwrap();
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo() {
        let q = WorkQueue::new();
        q.push(1);
        q.push(2);
        assert_eq!(q.pop(Duration::ZERO), Some(1));
        assert_eq!(q.pop(Duration::from_micros(5)), Some(2));
        assert!(q.is_empty());
    }

    #[test]
    fn parked_consumer_is_woken() {
        for spin in [Duration::ZERO, Duration::from_micros(20)] {
            let q = Arc::new(WorkQueue::new());
            let q2 = q.clone();
            let t = std::thread::spawn(move || q2.pop(spin));
            std::thread::sleep(Duration::from_millis(20));
            q.push(7);
            assert_eq!(t.join().unwrap(), Some(7));
        }
    }

    #[test]
    fn wake_all_releases_a_parked_consumer() {
        let q: Arc<WorkQueue<u8>> = Arc::new(WorkQueue::new());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(10));
        q.wake_all();
        assert_eq!(t.join().unwrap(), None);
    }

    #[test]
    fn close_releases_waiters() {
        let q: Arc<WorkQueue<u8>> = Arc::new(WorkQueue::new());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(10));
        q.close();
        assert_eq!(t.join().unwrap(), None);
    }

    #[test]
    fn no_lost_wakeups_under_load() {
        // Producers and blocking consumers hammer the handshake; every item
        // must be consumed without any consumer sleeping forever.
        let q = Arc::new(WorkQueue::new());
        let n = 20_000u64;
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut got = 0u64;
                    loop {
                        match q.pop(Duration::ZERO) {
                            Some(u64::MAX) => return got,
                            Some(_) => got += 1,
                            None if q.is_closed() => return got,
                            None => {}
                        }
                    }
                })
            })
            .collect();
        for i in 0..n {
            q.push(i);
        }
        q.push(u64::MAX);
        q.push(u64::MAX);
        let total: u64 = consumers.into_iter().map(|c| c.join().unwrap()).sum();
        assert_eq!(total, n);
    }
}
