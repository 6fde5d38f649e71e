//! A work queue whose consumers spin for a budget before they park.
//!
//! Waking a parked thread on another CPU costs 15-20 µs on the machines
//! this project is measured on, while a hand-off to a spinning thread costs
//! a fraction of a microsecond. Consumers therefore poll the queue for
//! `spin` before sleeping on a condition variable; `spin` zero is a purely
//! blocking queue, `Duration::MAX` a purely polling one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The queue. Its length is bounded by the buffers of the transfer
/// machines using it (one item per queued buffer, plus a few control
/// items), so it is not bounded here.
#[derive(Debug)]
pub(crate) struct WorkQueue<T> {
    q: Mutex<VecDeque<T>>,
    cv: Condvar,
    len: AtomicUsize,
    sleepers: AtomicUsize,
    closed: AtomicBool,
}

impl<T> WorkQueue<T> {
    pub(crate) fn new() -> Self {
        Self {
            q: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            len: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    pub(crate) fn push(&self, item: T) {
        {
            let mut q = self.q.lock();
            q.push_back(item);
            self.len.store(q.len(), Ordering::SeqCst);
        }
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.cv.notify_one();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    /// Wakes every consumer, for example to make them notice a state
    /// change.
    pub(crate) fn wake_all(&self) {
        let _q = self.q.lock();
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

    fn try_pop(&self) -> Option<T> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut q = self.q.lock();
        let item = q.pop_front();
        self.len.store(q.len(), Ordering::SeqCst);
        item
    }

    /// Takes the next item, spinning up to `spin` and then sleeping. `None`
    /// when `deadline` (if any) passed, the queue was closed, or a
    /// [`WorkQueue::wake_all`] asked consumers to look around.
    pub(crate) fn pop(&self, spin: Duration, deadline: Option<Instant>) -> Option<T> {
        if let Some(item) = self.try_pop() {
            return Some(item);
        }
        if !spin.is_zero() {
            let start = Instant::now();
            let mut n: u32 = 0;
            loop {
                std::hint::spin_loop();
                if let Some(item) = self.try_pop() {
                    return Some(item);
                }
                n = n.wrapping_add(1);
                if n % 64 == 0 {
                    if self.is_closed() {
                        return None;
                    }
                    let now = Instant::now();
                    if now.duration_since(start) >= spin || deadline.is_some_and(|d| now >= d) {
                        break;
                    }
                }
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut q = self.q.lock();
        let item = loop {
            if let Some(item) = q.pop_front() {
                break Some(item);
            }
            if self.is_closed() {
                break None;
            }
            // Woken without an item (wake_all, or spuriously): return, so
            // that the caller recomputes its deadline.
            match deadline {
                Some(d) => {
                    self.cv.wait_until(&mut q, d);
                }
                None => self.cv.wait(&mut q),
            }
            break q.pop_front();
        };
        self.len.store(q.len(), Ordering::SeqCst);
        drop(q);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_and_deadline() {
        let q = WorkQueue::new();
        q.push(1);
        q.push(2);
        assert_eq!(q.pop(Duration::ZERO, None), Some(1));
        assert_eq!(q.pop(Duration::from_micros(5), None), Some(2));
        let t = Instant::now();
        assert_eq!(
            q.pop(Duration::from_micros(50), Some(t + Duration::from_millis(20))),
            None
        );
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert!(q.is_empty());
    }

    #[test]
    fn parked_consumer_is_woken() {
        for spin in [Duration::ZERO, Duration::from_micros(20)] {
            let q = Arc::new(WorkQueue::new());
            let q2 = q.clone();
            let t = std::thread::spawn(move || q2.pop(spin, None));
            std::thread::sleep(Duration::from_millis(20));
            q.push(7);
            assert_eq!(t.join().unwrap(), Some(7));
        }
    }

    #[test]
    fn close_releases_waiters() {
        let q: Arc<WorkQueue<u8>> = Arc::new(WorkQueue::new());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(Duration::ZERO, None));
        std::thread::sleep(Duration::from_millis(10));
        q.close();
        assert_eq!(t.join().unwrap(), None);
    }
}
