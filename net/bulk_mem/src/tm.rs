//! The in-memory transfer machine: worker threads and the operations they
//! run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};

use colibri_net::xprt::{
    ClaimError, DelReason, Delivery, EpAddr, PassiveClaim, PassiveError, QueuedBuf, TmSink, XprtTm,
};
use colibri_net::{NetError, QueueType, Result, TmId};
use parking_lot::Mutex;
use tracing::{debug, trace, warn};

use crate::MemConfig;
use crate::addr::{self, MemAddr, MemEp};
use crate::engine::{Engine, Runnable};
use crate::workq::WorkQueue;

/// Work items of a transfer machine's worker threads.
pub(crate) enum Work {
    /// Post STARTED.
    Started,
    /// Send a queued message.
    Send(QueuedBuf),
    /// Run an active bulk transfer.
    Active(QueuedBuf),
    /// Run callbacks the core decided for one of our buffers (posted by
    /// the core, or by another transfer machine's worker, so that our
    /// callbacks run on our own threads).
    Deliver(Delivery),
}

/// State shared by a transfer machine's transport object and the threads
/// that run its work.
#[derive(Debug)]
pub(crate) struct Shared {
    id: TmId,
    cfg: MemConfig,
    exec: Exec,
    sink: TmSink,
    addr: Mutex<Option<MemAddr>>,
    own: OnceLock<String>,
    cpus: Mutex<Option<Vec<usize>>>,
    /// Bumped by `confine`: workers re-pin themselves when it changes.
    pin_gen: AtomicU64,
}

/// Who runs a transfer machine's work.
pub(crate) enum Exec {
    /// Worker threads of its own, on its own queue.
    Own {
        queue: WorkQueue<Work>,
        workers: Mutex<Vec<JoinHandle<()>>>,
    },
    /// The threads of a shared engine ([`crate::MemEngine`]); the queue
    /// is run by one engine thread at a time.
    Engine {
        queue: crossbeam_queue::SegQueue<Work>,
        scheduled: colibri_net::sync::AtomicBool,
        engine: crate::MemEngine,
    },
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Own { .. } => "Own",
            Self::Engine { .. } => "Engine",
        })
    }
}

impl Runnable for Shared {
    fn run_one(self: &Arc<Self>) -> bool {
        let Exec::Engine { queue, .. } = &self.exec else {
            return false;
        };
        match queue.pop() {
            Some(w) => {
                self.process(w);
                true
            }
            None => false,
        }
    }

    fn idle(&self) -> bool {
        match &self.exec {
            Exec::Engine { queue, .. } => queue.is_empty(),
            Exec::Own { queue, .. } => queue.is_empty(),
        }
    }

    fn scheduled(&self) -> &colibri_net::sync::AtomicBool {
        match &self.exec {
            Exec::Engine { scheduled, .. } => scheduled,
            Exec::Own { .. } => unreachable!("only engine-run machines are scheduled"),
        }
    }
}

/// The engine type the in-memory transport shares.
pub(crate) type MemEngineCore = Engine<Shared>;

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Started => "Started",
            Self::Send(_) => "Send",
            Self::Active(_) => "Active",
            Self::Deliver(_) => "Deliver",
        })
    }
}

impl Shared {
    pub(crate) fn push(self: &Arc<Self>, w: Work) {
        match &self.exec {
            Exec::Own { queue, .. } => queue.push(w),
            Exec::Engine { queue, engine, .. } => {
                queue.push(w);
                engine.core().schedule(self);
            }
        }
    }

    /// The own work queue, if the machine has worker threads of its own.
    fn own_queue(&self) -> Option<&WorkQueue<Work>> {
        match &self.exec {
            Exec::Own { queue, .. } => Some(queue),
            Exec::Engine { .. } => None,
        }
    }

    pub(crate) fn sink(&self) -> &TmSink {
        &self.sink
    }

    fn own_addr(&self) -> &str {
        self.own.get().map_or("", String::as_str)
    }

    /// Starts the worker threads (at creation: the core may hand them
    /// deliveries in any state, INITIALIZED included).
    fn spawn_workers(self: &Arc<Self>) -> Result<()> {
        let Exec::Own { queue, workers } = &self.exec else {
            return Ok(());
        };
        let mut workers = workers.lock();
        for i in 0..self.cfg.workers.max(1) {
            let sh = Arc::clone(self);
            let h = thread::Builder::new()
                .name(format!("colibri-mem-{}-{i}", self.id.0))
                .spawn(move || {
                    let _mark = colibri_net::wait::DeliveryThread::enter();
                    sh.worker(i);
                })
                .map_err(NetError::from);
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    queue.close();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Pins the calling worker (number `i`) as `confine` asked.
    fn pin(&self, i: usize) {
        let cpus = self.cpus.lock().clone();
        if let Some(c) = cpus.filter(|c| !c.is_empty()) {
            colibri_net::cpu::pin_current_thread(c[i % c.len()], "bulk_mem worker");
        }
    }

    fn worker(self: Arc<Self>, i: usize) {
        let Some(queue) = self.own_queue() else {
            return;
        };
        let mut pinned = 0;
        loop {
            let generation = self.pin_gen.load(Ordering::Acquire);
            if generation != pinned {
                pinned = generation;
                self.pin(i);
            }
            match queue.pop(self.cfg.spin) {
                Some(w) => self.process(w),
                None if queue.is_closed() && queue.is_empty() => return,
                None => {}
            }
        }
    }

    fn process(self: &Arc<Self>, w: Work) {
        trace!(tm = %self.id, work = ?w, "work");
        match w {
            Work::Started => self.sink.post_started(self.own_addr()),
            Work::Send(q) => self.do_send(&q),
            Work::Active(q) => self.do_active(&q),
            Work::Deliver(d) => d.run(),
        }
    }

    fn do_send(self: &Arc<Self>, q: &QueuedBuf) {
        let sink = &self.sink;
        if !sink.begin_use(q) {
            return;
        }
        let len = q.length();
        // The end point is looked at and let go before anything completes:
        // a reference held here while the sender's callback runs would make
        // the application's `fini` right after it see the end point still
        // in use.
        let Some(dest) = q
            .end_point()
            .map(|ep| ep.downcast::<MemEp>().and_then(MemEp::lookup))
        else {
            sink.complete(
                q,
                Err(NetError::InvalidArgument("send without end point".into())),
            );
            return;
        };
        let unreachable = || {
            let addr = q.end_point().map(|ep| ep.addr().to_string());
            NetError::Unreachable(addr.unwrap_or_default())
        };
        let Some(dest) = dest else {
            sink.complete(q, Err(unreachable()));
            return;
        };
        let dsink = dest.sink();
        match dsink.claim_recv(len) {
            Ok(claim) => {
                let copied = copy(q, 0, &claim.buf, claim.offset, len);
                if let Err(e) = copied {
                    dsink.release_recv(claim);
                    sink.complete(q, Err(e));
                    return;
                }
                let d = dsink.post_msg_deferred(claim, len, self.own_addr());
                dest.push(Work::Deliver(d));
                sink.complete(q, Ok(len));
            }
            Err(ClaimError::NoBuffers { notice }) => {
                // The receiver's error event runs on the receiver's workers.
                if notice.is_pending() {
                    dest.push(Work::Deliver(notice));
                }
                sink.complete(q, Err(NetError::NoBuffers));
            }
            Err(ClaimError::TooLarge { victim, space }) => {
                let e = NetError::MessageTooLarge { len, space };
                dest.push(Work::Deliver(
                    dsink.complete_deferred(&victim, Err(e.clone())),
                ));
                sink.complete(q, Err(e));
            }
            Err(_) => sink.complete(q, Err(unreachable())),
        }
    }

    fn do_active(self: &Arc<Self>, q: &QueuedBuf) {
        let sink = &self.sink;
        if !sink.begin_use(q) {
            return;
        }
        let Some(fields) = q.desc() else {
            sink.complete(q, Err(NetError::InvalidDescriptor("missing".into())));
            return;
        };
        let unreachable = || NetError::Unreachable(fields.owner.clone());
        let Some(dest) = MemAddr::parse(&fields.owner)
            .ok()
            .and_then(|a| addr::lookup(&a))
        else {
            sink.complete(q, Err(unreachable()));
            return;
        };
        let dsink = dest.sink();
        let active = q.queue();
        let active_size = if active == QueueType::ActiveBulkRecv {
            q.size()
        } else {
            q.length()
        };
        match dsink.claim_passive(fields, self.own_addr(), active, active_size) {
            Ok(PassiveClaim { buf: p, len }) => {
                let copied = if active == QueueType::ActiveBulkRecv {
                    copy(&p, 0, q, 0, len)
                } else {
                    copy(q, 0, &p, 0, len)
                };
                let status = copied.map(|()| len);
                dest.push(Work::Deliver(dsink.complete_deferred(&p, status.clone())));
                sink.complete(q, status);
            }
            Err(PassiveError { error, notice }) => {
                if notice.is_pending() {
                    dest.push(Work::Deliver(notice));
                }
                sink.complete(q, Err(error));
            }
        }
    }
}

/// Copies `len` bytes from `src` at `src_off` into `dst` at `dst_off`,
/// locking the source first.
fn copy(
    src: &QueuedBuf,
    src_off: usize,
    dst: &QueuedBuf,
    dst_off: usize,
    len: usize,
) -> Result<()> {
    let gone = || NetError::Cancelled;
    let s = src.data().ok_or_else(gone)?;
    let mut d = dst.data().ok_or_else(gone)?;
    d.copy_from_bufvec(dst_off, &s, src_off, len)
}

/// The transport object of one transfer machine.
#[derive(Debug)]
pub(crate) struct MemTm {
    sh: Arc<Shared>,
}

impl MemTm {
    pub(crate) fn new(id: TmId, cfg: MemConfig, sink: TmSink) -> Result<Self> {
        let exec = match &cfg.engine {
            Some(engine) => Exec::Engine {
                queue: crossbeam_queue::SegQueue::new(),
                scheduled: colibri_net::sync::AtomicBool::new(false),
                engine: engine.clone(),
            },
            None => Exec::Own {
                queue: WorkQueue::new(),
                workers: Mutex::new(Vec::new()),
            },
        };
        let sh = Arc::new(Shared {
            id,
            cfg,
            exec,
            sink,
            addr: Mutex::new(None),
            own: OnceLock::new(),
            cpus: Mutex::new(None),
            pin_gen: AtomicU64::new(0),
        });
        sh.spawn_workers()?;
        Ok(Self { sh })
    }

    fn leave_address(&self) {
        if let Some(a) = self.sh.addr.lock().take() {
            addr::unregister(a, &self.sh);
        }
    }
}

impl XprtTm for MemTm {
    fn start(&self, addr: &str) -> Result<()> {
        let want = MemAddr::parse(addr)?;
        let got = addr::register(want, &self.sh)?;
        *self.sh.addr.lock() = Some(got);
        let _ = self.sh.own.set(got.compact());
        self.sh.push(Work::Started);
        Ok(())
    }

    fn stop(&self, abort: bool) -> Result<()> {
        debug!(tm = %self.sh.id, abort, "stop requested");
        Ok(())
    }

    fn stopped(&self) {
        self.leave_address();
        debug!(tm = %self.sh.id, "stopped");
    }

    fn fini(&self) {
        let Exec::Own { queue, workers } = &self.sh.exec else {
            // The engine's threads are not ours; what is left in our queue
            // (sends of buffers the stop completed) runs as no-ops.
            self.leave_address();
            return;
        };
        queue.close();
        let me = thread::current().id();
        let workers: Vec<JoinHandle<()>> = workers.lock().drain(..).collect();
        for h in workers {
            if h.thread().id() == me {
                // Finalised from one of our own workers (inside another
                // transfer machine's callback): it exits by itself.
                continue;
            }
            if h.join().is_err() {
                warn!(tm = %self.sh.id, "worker thread panicked");
            }
        }
        self.leave_address();
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        let a = MemAddr::parse(addr)?;
        Ok(EpAddr {
            addr: a.compact(),
            data: Arc::new(MemEp::new(a)),
        })
    }

    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        match buf.queue() {
            QueueType::MsgSend => self.sh.push(Work::Send(buf.clone())),
            QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => {
                self.sh.push(Work::Active(buf.clone()));
            }
            // Receive and passive buffers wait for the other side.
            QueueType::MsgRecv | QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => {}
        }
        Ok(())
    }

    fn buf_del(&self, _buf: &QueuedBuf, reason: DelReason) {
        // The core completes idle buffers itself; a buffer in use here is
        // being copied by a worker, and the copy completes it at once (a
        // message receive buffer leaves the queue with that message).
        trace!(tm = %self.sh.id, ?reason, "del of a buffer in use: its copy completes it");
    }

    fn deliver(&self, delivery: Delivery) {
        self.sh.push(Work::Deliver(delivery));
    }

    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let Some(queue) = self.sh.own_queue() else {
            return Err(NetError::Unsupported {
                transport: "mem",
                what: "confining a transfer machine served by a shared engine",
            });
        };
        colibri_net::cpu::check_cpu_set(cpus)?;
        *self.sh.cpus.lock() = Some(cpus.to_vec());
        self.sh.pin_gen.fetch_add(1, Ordering::AcqRel);
        queue.wake_all();
        Ok(())
    }
}

impl Drop for MemTm {
    fn drop(&mut self) {
        // Not finalised: let the workers exit on their own.
        if let Some(q) = self.sh.own_queue() {
            q.close();
        }
    }
}
