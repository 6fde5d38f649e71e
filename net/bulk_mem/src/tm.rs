//! The in-memory transfer machine: worker threads and the operations they
//! run.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use colibri_net::xprt::{
    ClaimError, DelReason, Delivery, EpAddr, PassiveClaim, PassiveError, QueuedBuf, TmSink, XprtTm,
};
use colibri_net::{NetError, QueueType, Result, TmId};
use parking_lot::Mutex;
use tracing::{debug, trace, warn};

use crate::MemConfig;
use crate::addr::{self, MemAddr, MemEp};
use crate::workq::WorkQueue;

/// Work items of a transfer machine's worker threads.
pub(crate) enum Work {
    /// Post STARTED.
    Started,
    /// Send a queued message.
    Send(QueuedBuf),
    /// Run an active bulk transfer.
    Active(QueuedBuf),
    /// Complete a buffer (cancellation).
    Complete(QueuedBuf, Result<usize>),
    /// Run callbacks the core decided for one of our buffers (posted by
    /// another transfer machine's worker, so that our callbacks run on our
    /// own threads).
    Deliver(Delivery),
    /// Look at the stop condition.
    Stop,
}

/// State shared by a transfer machine's transport object and its workers.
#[derive(Debug)]
pub(crate) struct Shared {
    id: TmId,
    cfg: MemConfig,
    queue: WorkQueue<Work>,
    sink: OnceLock<TmSink>,
    addr: Mutex<Option<MemAddr>>,
    own: OnceLock<String>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    cpus: Mutex<Option<Vec<usize>>>,
    busy: AtomicUsize,
    stop_pending: AtomicBool,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Started => "Started",
            Self::Send(_) => "Send",
            Self::Active(_) => "Active",
            Self::Complete(..) => "Complete",
            Self::Deliver(_) => "Deliver",
            Self::Stop => "Stop",
        })
    }
}

impl Shared {
    pub(crate) fn push(&self, w: Work) {
        self.queue.push(w);
    }

    fn sink(&self) -> Option<&TmSink> {
        self.sink.get()
    }

    fn own_addr(&self) -> &str {
        self.own.get().map_or("", String::as_str)
    }

    fn spawn_workers(self: &Arc<Self>) -> Result<()> {
        let mut workers = self.workers.lock();
        if !workers.is_empty() {
            return Ok(());
        }
        let cpus = self.cpus.lock().clone();
        for i in 0..self.cfg.workers.max(1) {
            let sh = Arc::clone(self);
            let cpu = cpus
                .as_ref()
                .and_then(|c| (!c.is_empty()).then(|| c[i % c.len()]));
            let h = thread::Builder::new()
                .name(format!("colibri-mem-{}-{i}", self.id.0))
                .spawn(move || sh.worker(cpu))
                .map_err(NetError::from)?;
            workers.push(h);
        }
        Ok(())
    }

    fn worker(self: Arc<Self>, cpu: Option<usize>) {
        if let Some(cpu) = cpu
            && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
        {
            warn!(tm = %self.id, cpu, "could not pin worker thread");
        }
        loop {
            let deadline = || self.sink().and_then(TmSink::next_deadline);
            let item = self.queue.pop(self.cfg.spin, &deadline);
            if let Some(w) = item {
                self.busy.fetch_add(1, Ordering::SeqCst);
                self.process(w);
                self.busy.fetch_sub(1, Ordering::SeqCst);
            } else if self.queue.is_closed() && self.queue.is_empty() {
                return;
            }
            if let Some(sink) = self.sink()
                && sink.next_deadline().is_some_and(|d| d <= Instant::now())
            {
                sink.expire_timeouts(Instant::now());
            }
            self.check_stop();
        }
    }

    /// Posts STOPPED once a stop was requested and nothing is left: no
    /// queued buffer and no work item. Exactly one caller wins.
    fn check_stop(self: &Arc<Self>) {
        if !self.stop_pending.load(Ordering::SeqCst) {
            return;
        }
        let Some(sink) = self.sink() else {
            return;
        };
        if sink.queued() > 0 || !self.queue.is_empty() {
            return;
        }
        if self
            .stop_pending
            .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        if let Some(a) = self.addr.lock().take() {
            addr::unregister(a, self);
        }
        debug!(tm = %self.id, "stopped");
        sink.post_stopped();
    }

    fn process(self: &Arc<Self>, w: Work) {
        trace!(tm = %self.id, work = ?w, "work");
        match w {
            Work::Started => {
                if let Some(sink) = self.sink() {
                    sink.post_started(self.own_addr());
                }
            }
            Work::Send(q) => self.do_send(&q),
            Work::Active(q) => self.do_active(&q),
            Work::Complete(q, status) => {
                if let Some(sink) = self.sink() {
                    sink.complete(&q, status);
                }
            }
            Work::Deliver(d) => d.run(),
            Work::Stop => {}
        }
    }

    fn do_send(self: &Arc<Self>, q: &QueuedBuf) {
        let Some(sink) = self.sink() else {
            return;
        };
        if !sink.begin_use(q) {
            return;
        }
        let len = q.length();
        let Some(ep) = q.end_point() else {
            sink.complete(
                q,
                Err(NetError::InvalidArgument("send without end point".into())),
            );
            return;
        };
        let unreachable = || NetError::Unreachable(ep.addr().to_string());
        let Some(dest) = ep.downcast::<MemEp>().and_then(MemEp::lookup) else {
            sink.complete(q, Err(unreachable()));
            return;
        };
        let Some(dsink) = dest.sink() else {
            sink.complete(q, Err(unreachable()));
            return;
        };
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
        let Some(sink) = self.sink() else {
            return;
        };
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
        let Some(dsink) = dest.sink() else {
            sink.complete(q, Err(unreachable()));
            return;
        };
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
            Err(PassiveError {
                error,
                victim,
                notice,
            }) => {
                if notice.is_pending() {
                    dest.push(Work::Deliver(notice));
                }
                if let Some(v) = victim {
                    dest.push(Work::Deliver(
                        dsink.complete_deferred(&v, Err(error.clone())),
                    ));
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
    pub(crate) fn new(id: TmId, cfg: MemConfig) -> Self {
        Self {
            sh: Arc::new(Shared {
                id,
                cfg,
                queue: WorkQueue::new(),
                sink: OnceLock::new(),
                addr: Mutex::new(None),
                own: OnceLock::new(),
                workers: Mutex::new(Vec::new()),
                cpus: Mutex::new(None),
                busy: AtomicUsize::new(0),
                stop_pending: AtomicBool::new(false),
            }),
        }
    }
}

impl XprtTm for MemTm {
    fn start(&self, sink: &TmSink, addr: &str) -> Result<()> {
        let want = MemAddr::parse(addr)?;
        let _ = self.sh.sink.set(sink.clone());
        let got = addr::register(want, &self.sh)?;
        *self.sh.addr.lock() = Some(got);
        let _ = self.sh.own.set(got.compact());
        if let Err(e) = self.sh.spawn_workers() {
            addr::unregister(got, &self.sh);
            return Err(e);
        }
        self.sh.push(Work::Started);
        Ok(())
    }

    fn stop(&self, sink: &TmSink, abort: bool) -> Result<()> {
        let _ = self.sh.sink.set(sink.clone());
        self.sh.spawn_workers()?;
        debug!(tm = %self.sh.id, abort, "stop requested");
        self.sh.stop_pending.store(true, Ordering::SeqCst);
        self.sh.push(Work::Stop);
        Ok(())
    }

    fn fini(&self) {
        self.sh.queue.close();
        let me = thread::current().id();
        let workers: Vec<JoinHandle<()>> = self.sh.workers.lock().drain(..).collect();
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
        if let Some(a) = self.sh.addr.lock().take() {
            addr::unregister(a, &self.sh);
        }
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        let a = MemAddr::parse(addr)?;
        Ok(EpAddr {
            addr: a.compact(),
            data: Arc::new(MemEp::new(a)),
        })
    }

    fn buf_add(&self, _sink: &TmSink, buf: &QueuedBuf) -> Result<()> {
        match buf.queue() {
            QueueType::MsgSend => self.sh.push(Work::Send(buf.clone())),
            QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => {
                self.sh.push(Work::Active(buf.clone()));
            }
            // Receive and passive buffers wait for the other side.
            QueueType::MsgRecv | QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => {
                if buf.deadline().is_some() {
                    // Make a parked worker recompute its wake-up time.
                    self.sh.queue.wake_all();
                }
            }
        }
        Ok(())
    }

    fn buf_del(&self, _sink: &TmSink, buf: &QueuedBuf, reason: DelReason) {
        if buf.is_in_use() {
            // A copy is under way: it completes normally (and a message
            // receive buffer leaves the queue with it).
            trace!(tm = %self.sh.id, ?reason, "del of a buffer in use: completes normally");
            return;
        }
        self.sh
            .push(Work::Complete(buf.clone(), Err(NetError::Cancelled)));
    }

    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let avail = core_affinity::get_core_ids().map_or(0, |c| c.len());
        if let Some(bad) = cpus.iter().find(|&&c| c >= avail.max(1)) {
            return Err(NetError::InvalidArgument(format!(
                "CPU {bad} does not exist ({avail} available)"
            )));
        }
        if cpus.is_empty() {
            return Err(NetError::InvalidArgument("empty CPU set".into()));
        }
        *self.sh.cpus.lock() = Some(cpus.to_vec());
        Ok(())
    }
}

impl Drop for MemTm {
    fn drop(&mut self) {
        // Not finalised: let the workers exit on their own.
        self.sh.queue.close();
    }
}
