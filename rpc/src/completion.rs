//! A one-shot completion cell: the value of an asynchronous operation,
//! which its owner can wait for (spinning, then parking), poll, hand to a
//! callback, or await as a [`Future`](std::future::Future).
//!
//! Waking a parked thread on another CPU costs 15-20 µs on the machines
//! this project is measured on, so [`Completion::wait`] spins for a budget
//! before it parks, and the completing side only touches the condition
//! variable when a waiter actually parked.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

type Callback<T> = Box<dyn FnOnce(T) + Send>;

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    callback: Option<Callback<T>>,
    parked: bool,
    taken: bool,
}

/// The cell.
pub(crate) struct Completion<T> {
    done: AtomicBool,
    slot: Mutex<Slot<T>>,
    cv: Condvar,
}

impl<T> fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> Default for Completion<T> {
    fn default() -> Self {
        Self {
            done: AtomicBool::new(false),
            slot: Mutex::new(Slot {
                value: None,
                waker: None,
                callback: None,
                parked: false,
                taken: false,
            }),
            cv: Condvar::new(),
        }
    }
}

impl<T> Completion<T> {
    /// True once the value was set (even if it was since taken).
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Sets the value: runs the callback if one is armed (on this thread,
    /// with no lock held), else stores it and wakes whoever waits.
    pub(crate) fn complete(&self, v: T) {
        let mut s = self.slot.lock();
        if let Some(cb) = s.callback.take() {
            s.taken = true;
            self.done.store(true, Ordering::Release);
            drop(s);
            cb(v);
            return;
        }
        s.value = Some(v);
        self.done.store(true, Ordering::Release);
        let waker = s.waker.take();
        let parked = s.parked;
        drop(s);
        if parked {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Takes the value if it is there.
    pub(crate) fn try_take(&self) -> Option<T> {
        if !self.is_done() {
            return None;
        }
        let mut s = self.slot.lock();
        let v = s.value.take();
        if v.is_some() {
            s.taken = true;
        }
        v
    }

    /// True once the value was handed out (taken, or given to a callback).
    pub(crate) fn is_taken(&self) -> bool {
        self.slot.lock().taken
    }

    /// Waits for the value: spins up to `spin`, then parks; `None` once
    /// `deadline` passes first.
    pub(crate) fn wait(&self, spin: Duration, deadline: Option<Instant>) -> Option<T> {
        if !self.is_done() && !spin.is_zero() {
            let start = Instant::now();
            let mut n: u32 = 0;
            while !self.is_done() {
                std::hint::spin_loop();
                n = n.wrapping_add(1);
                if n.is_multiple_of(128) && start.elapsed() >= spin {
                    break;
                }
            }
        }
        let mut s = self.slot.lock();
        loop {
            if let Some(v) = s.value.take() {
                s.taken = true;
                return Some(v);
            }
            if s.taken {
                return None;
            }
            s.parked = true;
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut s, d).timed_out() {
                        let v = s.value.take();
                        if v.is_some() {
                            s.taken = true;
                        }
                        return v;
                    }
                }
                None => self.cv.wait(&mut s),
            }
        }
    }

    /// Future-style poll.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.slot.lock();
        if let Some(v) = s.value.take() {
            s.taken = true;
            return Poll::Ready(Some(v));
        }
        if s.taken {
            return Poll::Ready(None);
        }
        match &s.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => s.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Arms a callback; runs it at once, on this thread, if the value is
    /// already there. Returns false (dropping `cb`) when the value was
    /// already handed out.
    pub(crate) fn on_complete(&self, cb: impl FnOnce(T) + Send + 'static) -> bool {
        let mut s = self.slot.lock();
        if let Some(v) = s.value.take() {
            s.taken = true;
            drop(s);
            cb(v);
            return true;
        }
        if s.taken {
            return false;
        }
        s.callback = Some(Box::new(cb));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn wait_poll_and_callback() {
        let c = Arc::new(Completion::<u32>::default());
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c2.complete(7);
        });
        assert_eq!(c.wait(Duration::from_micros(10), None), Some(7));
        t.join().unwrap();
        assert_eq!(c.try_take(), None);

        let c = Completion::<u32>::default();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let w = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&w);
        assert!(c.poll(&mut cx).is_pending());
        c.complete(3);
        assert!(flag.0.load(Ordering::SeqCst));
        assert_eq!(c.poll(&mut cx), Poll::Ready(Some(3)));

        let c = Completion::<u32>::default();
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        assert!(c.on_complete(move |v| *g.lock() = Some(v)));
        c.complete(5);
        assert_eq!(*got.lock(), Some(5));
        assert_eq!(c.wait(Duration::ZERO, Some(Instant::now())), None);

        let c = Completion::<u32>::default();
        assert_eq!(
            c.wait(
                Duration::ZERO,
                Some(Instant::now() + Duration::from_millis(5))
            ),
            None
        );
    }
}
