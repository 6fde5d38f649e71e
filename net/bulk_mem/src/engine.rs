//! A shared engine: a fixed set of threads serving the work of any number
//! of transfer machines, as socklnd's per-CPT schedulers serve every peer.
//!
//! Each transfer machine keeps its own queue of work and a `scheduled`
//! flag; a transfer machine with work is on the engine's ready queue at
//! most once, and only the thread that took it from there runs its work,
//! so one machine's work runs in order and never on two threads at once
//! (the guarantees of a machine with one worker of its own). A thread runs
//! at most [`BUDGET`] items of one machine before putting it back at the
//! end of the ready queue, so a busy machine cannot starve the others.
//!
//! Lost wake-ups are ruled out as in the work queue: a producer pushes the
//! item and then raises `scheduled`; the thread that ran the machine lowers
//! `scheduled` and then looks at the machine's queue again, each with a
//! full fence in between, so at least one of them sees the other (checked
//! with loom at the end of this file).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use colibri_net::sync::{AtomicBool, Mutex, fence};
use colibri_net::{NetError, Result};
use tracing::warn;

use crate::workq::WorkQueue;

/// Items a thread runs for one transfer machine before it serves the next.
pub(crate) const BUDGET: usize = 64;

/// What the engine runs: a transfer machine's work, one item at a time.
pub(crate) trait Runnable: Send + Sync + 'static {
    /// Takes and runs the next item; false when there was none.
    fn run_one(self: &Arc<Self>) -> bool;
    /// True when the machine's queue is empty.
    fn idle(&self) -> bool;
    /// The machine's `scheduled` flag.
    fn scheduled(&self) -> &AtomicBool;
}

/// The threads and their ready queue.
pub(crate) struct Engine<R: Runnable> {
    ready: WorkQueue<Arc<R>>,
    spin: Duration,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<R: Runnable> std::fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("spin", &self.spin).finish()
    }
}

impl<R: Runnable> Engine<R> {
    /// An engine without threads (they are added by [`Engine::spawn`]).
    pub(crate) fn new(spin: Duration) -> Arc<Self> {
        Arc::new(Self {
            ready: WorkQueue::new(),
            spin,
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Starts `n` threads named `name-i`.
    pub(crate) fn spawn(self: &Arc<Self>, n: usize, name: &str) -> Result<()> {
        let mut threads = self.threads.lock();
        for i in 0..n.max(1) {
            let me = Arc::clone(self);
            let h = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let _mark = colibri_net::wait::DeliveryThread::enter();
                    me.serve();
                })
                .map_err(NetError::from)?;
            threads.push(h);
        }
        Ok(())
    }

    /// Called after pushing an item on `r`'s queue: puts `r` on the ready
    /// queue unless it is already there or being run.
    pub(crate) fn schedule(&self, r: &Arc<R>) {
        fence(Ordering::SeqCst);
        if !r.scheduled().swap(true, Ordering::SeqCst) {
            self.ready.push(Arc::clone(r));
        }
    }

    /// Runs up to [`BUDGET`] items of `r`, then lets go of it (or puts it
    /// back at the end of the ready queue if it has more).
    pub(crate) fn run(&self, r: &Arc<R>) {
        let mut n = 0;
        loop {
            while n < BUDGET && r.run_one() {
                n += 1;
            }
            if n >= BUDGET && !r.idle() {
                // Still scheduled: back in line behind the others.
                self.ready.push(Arc::clone(r));
                return;
            }
            // A read-modify-write, not a store: with a plain store loom
            // finds an execution where a producer's later swap reads the
            // flag from before it and the machine ends scheduled but on no
            // queue (its work stranded). Same cost on x86 (a SeqCst store
            // is an xchg there).
            r.scheduled().swap(false, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if r.idle() || r.scheduled().swap(true, Ordering::SeqCst) {
                // Nothing more, or a producer scheduled it again.
                return;
            }
            // An item arrived between the last take and the store: ours.
        }
    }

    /// A thread's loop: until the engine is closed and its queue empty.
    fn serve(&self) {
        loop {
            match self.ready.pop(self.spin) {
                Some(r) => self.run(&r),
                None if self.ready.is_closed() && self.ready.is_empty() => return,
                None => {}
            }
        }
    }

    /// Lets the threads finish what is queued and exit; joins them unless
    /// called from one of them.
    pub(crate) fn shutdown(&self) {
        self.ready.close();
        let me = thread::current().id();
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
        for h in threads {
            if h.thread().id() == me {
                continue;
            }
            if h.join().is_err() {
                warn!("shared engine thread panicked");
            }
        }
    }
}

/// The handshake between producers and the engine under every
/// interleaving: `RUSTFLAGS="--cfg loom" cargo test -p colibri-bulk-mem
/// --lib --release --target-dir target/loom loom_`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    /// A machine whose items are counters.
    struct Machine {
        q: Mutex<u32>,
        scheduled: AtomicBool,
        ran: AtomicUsize,
    }

    impl Runnable for Machine {
        fn run_one(self: &Arc<Self>) -> bool {
            let mut q = self.q.lock();
            if *q == 0 {
                return false;
            }
            *q -= 1;
            drop(q);
            self.ran.fetch_add(1, Ordering::SeqCst);
            true
        }
        fn idle(&self) -> bool {
            *self.q.lock() == 0
        }
        fn scheduled(&self) -> &AtomicBool {
            &self.scheduled
        }
    }

    /// Two producers push an item each while the engine runs the machine:
    /// both items run, and the machine ends unscheduled with nothing left
    /// (no lost wake-up, no item stranded).
    #[test]
    fn loom_no_item_is_stranded() {
        loom::model(|| {
            let engine: Arc<Engine<Machine>> = Engine::new(Duration::ZERO);
            let m = Arc::new(Machine {
                q: Mutex::new(0),
                scheduled: AtomicBool::new(false),
                ran: AtomicUsize::new(0),
            });
            let producers: Vec<_> = (0..2)
                .map(|_| {
                    let (e, m) = (Arc::clone(&engine), Arc::clone(&m));
                    thread::spawn(move || {
                        *m.q.lock() += 1;
                        e.schedule(&m);
                    })
                })
                .collect();
            // This thread is the engine's: it runs what is ready until both
            // items ran.
            while m.ran.load(Ordering::SeqCst) < 2 {
                if let Some(r) = engine.ready.pop(Duration::ZERO) {
                    engine.run(&r);
                }
            }
            for p in producers {
                p.join().unwrap();
            }
            // A producer may have scheduled the machine after this thread
            // ran its item: the engine takes it once more and finds nothing.
            while !engine.ready.is_empty() {
                if let Some(r) = engine.ready.pop(Duration::ZERO) {
                    engine.run(&r);
                }
            }
            assert_eq!(m.ran.load(Ordering::SeqCst), 2);
            assert!(m.idle());
            assert!(!m.scheduled.load(Ordering::SeqCst));
            assert!(engine.ready.is_empty());
        });
    }
}
