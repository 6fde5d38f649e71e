//! The handler pool: threads that run the handlers registered with
//! [`RpcHandle::on_blocking`](crate::RpcHandle::on_blocking) and poll the
//! futures of [`RpcHandle::on_async`](crate::RpcHandle::on_async).
//!
//! Handlers registered with `on` run on the transport thread that
//! delivered the request: the fastest path, but that thread must deliver
//! the completions a handler would wait for, so blocking waits there fail
//! with `ApiMisuse`. The pool's threads deliver nothing, so a handler may
//! wait on them for as long as it needs (a bulk transfer, a call to
//! another server); the transport thread only queues the job.
//!
//! The pool is a fixed set of [`RpcConfig::handler_threads`] threads
//! sharing one FIFO queue, started with the first handler that needs it.
//! At most [`RpcConfig::handler_queue`] requests are admitted at once
//! (queued, running, or an async handler not finished); a request beyond
//! that is answered `Busy` at once, so that a flood of slow requests
//! costs bounded memory and the client learns it should back off. An async handler is a task: its future is polled on a pool
//! thread, and waking it queues it again (at most once at a time). When
//! the machine shuts down, the queue closes: jobs already queued still
//! run (their replies fail with `Shutdown`), tasks that are woken later
//! are dropped (their reply handles answer `NoReply`), and shutdown waits
//! for the threads to finish what they run.
//!
//! [`RpcConfig::handler_threads`]: crate::RpcConfig::handler_threads
//! [`RpcConfig::handler_queue`]: crate::RpcConfig::handler_queue

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, JoinHandle, ThreadId};

use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;
use tracing::{debug, error};

use crate::error::{Result, RpcError};

type Job = Box<dyn FnOnce() + Send>;

/// A future of an async handler, boxed.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Shared {
    /// `None` once the pool closed.
    tx: Mutex<Option<Sender<Job>>>,
    /// Requests admitted and not finished (see the module docs).
    admitted: AtomicUsize,
    /// Most requests admitted at once.
    limit: usize,
}

impl Shared {
    /// Queues `job`; gives it back when the pool is closed.
    fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else {
            return Err(job);
        };
        tx.send(job).map_err(|e| e.into_inner())
    }

    /// Takes one admission; `false` when `limit` are in.
    fn admit(&self) -> bool {
        self.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        self.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One admitted request (see the module docs); given back when dropped
/// (its job ran, panicked, or was dropped unrun; its task finished or was
/// abandoned).
pub(crate) struct Admission(Arc<Shared>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// The pool (see the module docs).
pub(crate) struct HandlerPool {
    sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for HandlerPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerPool")
            .field("threads", &self.threads.lock().len())
            .field("admitted", &self.sh.admitted.load(Ordering::Relaxed))
            .finish()
    }
}

impl HandlerPool {
    /// Starts `n` (at least one) threads named after `name`, admitting
    /// at most `limit` requests at once.
    ///
    /// # Errors
    /// The OS refused a thread (those already started are stopped).
    pub(crate) fn start(n: usize, limit: usize, name: &str) -> Result<Self> {
        // The queue holds admitted requests only (new ones are refused
        // past `limit`, and an admitted task is queued at most once at a
        // time), so its length is bounded by `limit`.
        #[allow(clippy::disallowed_methods)]
        let (tx, rx) = unbounded::<Job>();
        let pool = Self {
            sh: Arc::new(Shared {
                tx: Mutex::new(Some(tx)),
                admitted: AtomicUsize::new(0),
                limit: limit.max(1),
            }),
            threads: Mutex::new(Vec::new()),
        };
        for i in 0..n.max(1) {
            let rx: Receiver<Job> = rx.clone();
            let spawned = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A panicking handler loses its request (its reply
                        // handle answers NoReply as it unwinds), not the
                        // thread.
                        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                            error!("a handler panicked on the handler pool");
                        }
                    }
                });
            match spawned {
                Ok(h) => pool.threads.lock().push(h),
                Err(e) => {
                    pool.close();
                    return Err(RpcError::Net(colibri_net::NetError::io(&e)));
                }
            }
        }
        debug!(threads = n.max(1), "handler pool started");
        Ok(pool)
    }

    /// Admits one more request; `None` when `limit` are in.
    pub(crate) fn admit(&self) -> Option<Admission> {
        self.sh.admit().then(|| Admission(Arc::clone(&self.sh)))
    }

    /// Queues an admitted request's `job`; false (the job dropped unrun)
    /// when the pool is closed.
    pub(crate) fn submit(&self, adm: Admission, job: impl FnOnce() + Send + 'static) -> bool {
        self.sh
            .submit(Box::new(move || {
                let _adm = adm;
                job();
            }))
            .is_ok()
    }

    /// Runs an admitted request's future as a task on the pool until it
    /// completes; false (the future dropped) when the pool is closed.
    pub(crate) fn spawn(&self, adm: Admission, fut: BoxFuture) -> bool {
        let task = Arc::new(Task {
            fut: Mutex::new(Some((fut, adm))),
            scheduled: AtomicBool::new(true),
            abandoned: AtomicBool::new(false),
            pool: Arc::downgrade(&self.sh),
        });
        let t = Arc::clone(&task);
        self.sh.submit(Box::new(move || t.run())).is_ok()
    }

    /// Closes the queue and waits for the threads to finish (all but the
    /// calling one, when a pool thread closes its own pool).
    pub(crate) fn close(&self) {
        self.sh.tx.lock().take();
        let me: ThreadId = thread::current().id();
        let threads = std::mem::take(&mut *self.threads.lock());
        for h in threads {
            if h.thread().id() == me {
                continue;
            }
            if h.join().is_err() {
                error!("a handler pool thread panicked");
            }
        }
    }
}

impl Drop for HandlerPool {
    fn drop(&mut self) {
        self.close();
    }
}

/// An async handler's future and its scheduling state.
struct Task {
    /// The future and its admission, both dropped when it completes (a
    /// waker may outlive it).
    fut: Mutex<Option<(BoxFuture, Admission)>>,
    /// Queued on the pool (or about to be): a wake then does nothing.
    scheduled: AtomicBool,
    /// Woken after the pool closed: the future is dropped.
    abandoned: AtomicBool,
    pool: Weak<Shared>,
}

impl Task {
    fn run(self: Arc<Self>) {
        // Cleared before polling: a wake during the poll queues the task
        // again (the next run waits for this one's lock).
        self.scheduled.store(false, Ordering::Release);
        let waker = Waker::from(Arc::clone(&self));
        let mut cx = Context::from_waker(&waker);
        let mut slot = self.fut.lock();
        if let Some((fut, _)) = slot.as_mut()
            && let Poll::Ready(()) = fut.as_mut().poll(&mut cx)
        {
            *slot = None;
        }
        if self.abandoned.load(Ordering::Acquire) {
            *slot = None;
        }
    }

    /// Drops the future of a task that can no longer be polled (now, or
    /// after the poll in progress when it woke itself).
    fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
        let fut = self.fut.try_lock().and_then(|mut g| g.take());
        drop(fut);
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(sh) = self.pool.upgrade() else {
            self.abandon();
            return;
        };
        let t = Arc::clone(self);
        if let Err(job) = sh.submit(Box::new(move || t.run())) {
            // The pool closed: the task is abandoned (its future, with
            // any reply handle it holds, drops).
            drop(job);
            self.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn jobs_run_and_close_joins() {
        let pool = HandlerPool::start(2, 1000, "t-pool").unwrap();
        let n = Arc::new(AtomicU32::new(0));
        for _ in 0..100 {
            let n = Arc::clone(&n);
            let adm = pool.admit().unwrap();
            assert!(pool.submit(adm, move || {
                n.fetch_add(1, Ordering::SeqCst);
            }));
        }
        pool.close();
        assert_eq!(n.load(Ordering::SeqCst), 100);
        assert!(!pool.submit(pool.admit().unwrap(), || {}));
        assert_eq!(pool.sh.admitted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn admissions_are_bounded_and_given_back() {
        let pool = HandlerPool::start(1, 2, "t-full").unwrap();
        let (go_tx, go) = crossbeam_channel::bounded::<()>(2);
        for _ in 0..2 {
            let go = go.clone();
            let adm = pool.admit().unwrap();
            assert!(pool.submit(adm, move || {
                let _ = go.recv_timeout(Duration::from_secs(10));
            }));
        }
        assert!(pool.admit().is_none());
        go_tx.send(()).unwrap();
        go_tx.send(()).unwrap();
        wait_for("admissions back", || {
            pool.sh.admitted.load(Ordering::SeqCst) == 0
        });
        assert!(pool.submit(pool.admit().unwrap(), || {}));
        pool.close();
    }

    /// A future that is pending until its flag is set, and wakes whoever
    /// polled it from another thread.
    struct Gate {
        open: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            *self.waker.lock() = Some(cx.waker().clone());
            if self.open.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    #[test]
    fn tasks_are_polled_again_when_woken() {
        let pool = HandlerPool::start(1, 8, "t-task").unwrap();
        let open = Arc::new(AtomicBool::new(false));
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let (o, w, d) = (Arc::clone(&open), Arc::clone(&waker), Arc::clone(&done));
        assert!(pool.spawn(
            pool.admit().unwrap(),
            Box::pin(async move {
                Gate { open: o, waker: w }.await;
                d.store(true, Ordering::SeqCst);
            })
        ));
        wait_for("first poll", || waker.lock().is_some());
        assert!(!done.load(Ordering::SeqCst));
        open.store(true, Ordering::SeqCst);
        let w = waker.lock().take().unwrap();
        // Waking twice queues it once; both are harmless.
        w.wake_by_ref();
        w.wake();
        wait_for("task finished", || done.load(Ordering::SeqCst));
        wait_for("admission back", || {
            pool.sh.admitted.load(Ordering::SeqCst) == 0
        });
        pool.close();
    }

    #[test]
    fn a_task_woken_after_close_is_dropped() {
        let pool = HandlerPool::start(1, 8, "t-drop").unwrap();
        let open = Arc::new(AtomicBool::new(false));
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        struct OnDrop(Arc<AtomicBool>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = OnDrop(Arc::clone(&dropped));
        let (o, w) = (Arc::clone(&open), Arc::clone(&waker));
        assert!(pool.spawn(
            pool.admit().unwrap(),
            Box::pin(async move {
                let _g = guard;
                Gate { open: o, waker: w }.await;
            })
        ));
        wait_for("first poll", || waker.lock().is_some());
        pool.close();
        waker.lock().take().unwrap().wake();
        assert!(dropped.load(Ordering::SeqCst));
        assert!(!pool.spawn(pool.admit().unwrap(), Box::pin(async {})));
        assert_eq!(pool.sh.admitted.load(Ordering::SeqCst), 0);
    }
}
