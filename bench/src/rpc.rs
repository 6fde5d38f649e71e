//! RPC workloads: the same measurements one layer up, over
//! [`colibri_rpc`] machines, each compared in the report with the raw
//! workload of the layer below on the same transport.
//!
//! * [`RpcRoundTrip`]: null calls (empty request and reply), `window`
//!   calls in flight, each completion starting the next call from its
//!   callback.
//! * [`RpcBulk`]: calls that each move `size` bytes through bulk (the
//!   server pushes into the client's sink for reads, pulls the client's
//!   source for writes), two calls in flight.
//! * [`RpcOneWay`]: one-way items of `size` bytes posted as fast as the
//!   session takes them, with or without batching; the run ends when the
//!   server has handled the last item.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_net::{NetBuffer, Transport};
use colibri_rpc::{BulkArg, BulkOutcome, CallOpts, RpcConfig, RpcMachine, Session};
use parking_lot::{Condvar, Mutex};

use crate::{BenchError, BenchResult, BulkDir, PairConfig};

const RUN_LIMIT: Duration = Duration::from_secs(120);
const NULL: u32 = 1;
const READ: u32 = 2;
const WRITE: u32 = 3;
const ITEM: u32 = 4;

fn cfg_for(base: &RpcConfig, cpu: Option<usize>) -> RpcConfig {
    let mut c = base.clone();
    if let Some(cpu) = cpu {
        c = c.with_cpus(vec![cpu]);
    }
    c
}

/// Both machines of a workload.
struct RpcPair {
    client: Option<RpcMachine>,
    server: Option<RpcMachine>,
}

impl RpcPair {
    fn new(xprt: &dyn Transport, cfg: &PairConfig, rcfg: &RpcConfig) -> BenchResult<Self> {
        let e = |e: colibri_rpc::RpcError| BenchError(e.to_string());
        let server =
            RpcMachine::start_on(xprt, &cfg.server_addr, cfg_for(rcfg, cfg.cpus.map(|c| c.1)))
                .map_err(e)?;
        let client =
            RpcMachine::start_on(xprt, &cfg.client_addr, cfg_for(rcfg, cfg.cpus.map(|c| c.0)))
                .map_err(e)?;
        Ok(Self {
            client: Some(client),
            server: Some(server),
        })
    }

    fn client(&self) -> &RpcMachine {
        self.client.as_ref().expect("client present until finish")
    }

    fn server(&self) -> &RpcMachine {
        self.server.as_ref().expect("server present until finish")
    }

    fn finish(&mut self) {
        for m in [self.client.take(), self.server.take()]
            .into_iter()
            .flatten()
        {
            if let Err(e) = m.shutdown() {
                eprintln!("warning: benchmark RPC machine shutdown: {e}");
            }
        }
    }
}

/// Progress of a run driven from callbacks.
#[derive(Default)]
struct Progress {
    target: u64,
    started: u64,
    done: u64,
    end: Option<Instant>,
    error: Option<String>,
}

struct Run {
    p: Mutex<Progress>,
    cv: Condvar,
}

impl Run {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            p: Mutex::new(Progress::default()),
            cv: Condvar::new(),
        })
    }

    fn fail(&self, e: impl std::fmt::Display) {
        let mut p = self.p.lock();
        if p.error.is_none() {
            p.error = Some(e.to_string());
        }
        self.cv.notify_all();
    }

    /// Counts a completion; true when another operation should start.
    fn complete_one(&self) -> bool {
        let mut p = self.p.lock();
        p.done += 1;
        if p.done >= p.target {
            if p.end.is_none() {
                p.end = Some(Instant::now());
            }
            self.cv.notify_all();
        }
        if p.started < p.target && p.error.is_none() {
            p.started += 1;
            true
        } else {
            false
        }
    }

    /// Ends the run now (the last unit of work was seen elsewhere).
    fn mark_end(&self) {
        let mut p = self.p.lock();
        if p.end.is_none() {
            p.end = Some(Instant::now());
        }
        self.cv.notify_all();
    }

    fn begin(&self, target: u64, window: usize) -> u64 {
        let mut p = self.p.lock();
        *p = Progress {
            target: target.max(1),
            ..Progress::default()
        };
        let n = (window as u64).min(p.target);
        p.started = n;
        n
    }

    fn wait(&self, start: Instant) -> BenchResult<Duration> {
        let deadline = Instant::now() + RUN_LIMIT;
        let mut p = self.p.lock();
        loop {
            if let Some(e) = &p.error {
                return Err(BenchError(e.clone()));
            }
            if let Some(end) = p.end {
                return Ok(end.saturating_duration_since(start));
            }
            if self.cv.wait_until(&mut p, deadline).timed_out() {
                return Err(BenchError(format!(
                    "RPC run stuck: {} of {} done",
                    p.done, p.target
                )));
            }
        }
    }
}

const CHUNK: u64 = 512;

fn pump(s: Session, left: Arc<AtomicU64>, item: Arc<[u8]>, run: Arc<Run>) {
    let mut n = 0;
    while n < CHUNK {
        if left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1))
            .is_err()
        {
            break;
        }
        if let Err(e) = s.post(ITEM, &item) {
            run.fail(e);
            return;
        }
        n += 1;
    }
    if left.load(Ordering::Acquire) == 0 {
        return;
    }
    let s2 = s.clone();
    match s.start(NULL, &[], CallOpts::new()) {
        Ok(h) => h.on_complete(move |r| match r {
            Ok(_) => pump(s2, left, item, run),
            Err(e) => run.fail(e),
        }),
        Err(e) => run.fail(e),
    }
}

fn next_null(s: Session, run: Arc<Run>) {
    let s2 = s.clone();
    match s.start(NULL, &[], CallOpts::new()) {
        Ok(h) => h.on_complete(move |r| match r {
            Ok(_) => {
                if run.complete_one() {
                    next_null(s2, run);
                }
            }
            Err(e) => run.fail(e),
        }),
        Err(e) => run.fail(e),
    }
}

/// Null RPC round trips with `window` calls in flight.
pub struct RpcRoundTrip {
    pair: RpcPair,
    session: Option<Session>,
    run: Arc<Run>,
    window: usize,
}

impl std::fmt::Debug for RpcRoundTrip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcRoundTrip")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl RpcRoundTrip {
    /// Starts two machines; the server answers opcode 1 with an empty
    /// reply from its handler.
    ///
    /// # Errors
    /// Failures to start.
    pub fn new(xprt: &dyn Transport, cfg: &PairConfig, window: usize) -> BenchResult<Self> {
        let pair = RpcPair::new(xprt, cfg, &RpcConfig::default())?;
        pair.server().on(NULL, |_req, reply| reply.ok(&[]));
        let session = pair
            .client()
            .session(pair.server().addr())
            .map_err(|e| BenchError(e.to_string()))?;
        Ok(Self {
            pair,
            session: Some(session),
            run: Run::new(),
            window: window.max(1),
        })
    }

    /// Runs `iters` calls; returns their total time.
    ///
    /// # Errors
    /// A failed or stuck run.
    pub fn run(&mut self, iters: u64) -> BenchResult<Duration> {
        let s = self
            .session
            .clone()
            .ok_or_else(|| BenchError("finished".into()))?;
        let n = self.run.begin(iters, self.window);
        let start = Instant::now();
        for _ in 0..n {
            next_null(s.clone(), self.run.clone());
        }
        self.run.wait(start)
    }

    /// Shuts both machines down.
    pub fn finish(mut self) {
        self.session = None;
        self.pair.finish();
    }
}

impl Drop for RpcRoundTrip {
    fn drop(&mut self) {
        self.session = None;
        self.pair.finish();
    }
}

type Pool = Arc<Mutex<Vec<NetBuffer>>>;

fn next_bulk(s: Session, run: Arc<Run>, pool: Pool, dir: BulkDir, size: usize) {
    let Some(buf) = pool.lock().pop() else {
        run.fail("no client buffer free");
        return;
    };
    let (op, arg) = match dir {
        BulkDir::Read => (READ, BulkArg::Sink { buf }),
        BulkDir::Write => (WRITE, BulkArg::Source { buf, len: size }),
    };
    let s2 = s.clone();
    s.start_bulk(op, &[], vec![arg], CallOpts::new())
        .on_complete(move |o: BulkOutcome| {
            for d in o.buffers {
                pool.lock().push(d.buffer);
            }
            match o.result {
                Ok(_) => {
                    if run.complete_one() {
                        next_bulk(s2, run, pool, dir, size);
                    }
                }
                Err(e) => run.fail(e),
            }
        });
}

/// Bulk reads or writes of `size` bytes through RPC, two in flight.
pub struct RpcBulk {
    pair: RpcPair,
    session: Option<Session>,
    run: Arc<Run>,
    pool: Pool,
    dir: BulkDir,
    size: usize,
    window: usize,
}

impl std::fmt::Debug for RpcBulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcBulk")
            .field("dir", &self.dir)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl RpcBulk {
    /// Starts two machines; the server moves the data with pre-registered
    /// buffers and replies once its transfer completed. Two calls in
    /// flight, as the raw [`Bulk`](crate::Bulk) workload has two transfers.
    ///
    /// # Errors
    /// Failures to start or register.
    pub fn new(
        xprt: &dyn Transport,
        cfg: &PairConfig,
        size: usize,
        dir: BulkDir,
    ) -> BenchResult<Self> {
        Self::with_window(xprt, cfg, size, dir, 2)
    }

    /// As [`RpcBulk::new`] with `window` calls in flight.
    ///
    /// # Errors
    /// Failures to start or register.
    pub fn with_window(
        xprt: &dyn Transport,
        cfg: &PairConfig,
        size: usize,
        dir: BulkDir,
        window: usize,
    ) -> BenchResult<Self> {
        let window = window.max(1);
        let e = |e: colibri_rpc::RpcError| BenchError(e.to_string());
        let pair = RpcPair::new(xprt, cfg, &RpcConfig::default())?;
        let spool: Pool = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..window + 2 {
            let mut b = pair.server().alloc(size).map_err(e)?;
            b.bufvec_mut().fill(0x5a);
            spool.lock().push(b);
        }
        for (op, pull) in [(READ, false), (WRITE, true)] {
            let h = pair.server().handle();
            let pool = spool.clone();
            pair.server().on(op, move |req, reply| {
                let (Some(d), Some(buf)) = (req.bulk().first().cloned(), pool.lock().pop()) else {
                    reply.error(-105);
                    return;
                };
                let pool = pool.clone();
                let done = move |d: colibri_rpc::BulkDone| {
                    pool.lock().push(d.buffer);
                    match d.result {
                        Ok(_) => reply.ok(&[]),
                        Err(e) => reply.error(e.errno()),
                    }
                };
                if pull {
                    h.bulk_pull(&d, buf).on_complete(done);
                } else {
                    let len = d.len as usize;
                    h.bulk_push(&d, buf, len).on_complete(done);
                }
            });
        }
        let pool: Pool = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..window {
            let mut b = pair.client().alloc(size).map_err(e)?;
            b.bufvec_mut().fill(0xa5);
            pool.lock().push(b);
        }
        let session = pair.client().session(pair.server().addr()).map_err(e)?;
        Ok(Self {
            pair,
            session: Some(session),
            run: Run::new(),
            pool,
            dir,
            size,
            window,
        })
    }

    /// Runs `iters` calls; returns their total time.
    ///
    /// # Errors
    /// A failed or stuck run.
    pub fn run(&mut self, iters: u64) -> BenchResult<Duration> {
        let s = self
            .session
            .clone()
            .ok_or_else(|| BenchError("finished".into()))?;
        let n = self.run.begin(iters, self.window);
        let start = Instant::now();
        for _ in 0..n {
            next_bulk(
                s.clone(),
                self.run.clone(),
                self.pool.clone(),
                self.dir,
                self.size,
            );
        }
        self.run.wait(start)
    }

    /// Shuts both machines down.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        self.session = None;
        self.pool.lock().clear();
        self.pair.finish();
    }
}

impl Drop for RpcBulk {
    fn drop(&mut self) {
        self.close();
    }
}

/// One-way items through RPC, with or without batching.
pub struct RpcOneWay {
    pair: RpcPair,
    session: Option<Session>,
    received: Arc<AtomicU64>,
    goal: Arc<AtomicU64>,
    run: Arc<Run>,
    size: usize,
    batching: bool,
}

impl std::fmt::Debug for RpcOneWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcOneWay")
            .field("size", &self.size)
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl RpcOneWay {
    /// Starts two machines. With `batching`, items share messages (no
    /// added delay: items queue behind the 2 messages in flight); without,
    /// each item is one message.
    ///
    /// # Errors
    /// Failures to start.
    pub fn new(
        xprt: &dyn Transport,
        cfg: &PairConfig,
        size: usize,
        batching: bool,
    ) -> BenchResult<Self> {
        let rcfg = RpcConfig::default()
            .with_batching(batching)
            .with_recv_buffers(32, 1 << 20)
            .with_max_in_flight(if batching { 2 } else { 64 });
        let pair = RpcPair::new(xprt, cfg, &rcfg)?;
        let received = Arc::new(AtomicU64::new(0));
        let goal = Arc::new(AtomicU64::new(u64::MAX));
        let run = Run::new();
        let (r, g, rn) = (received.clone(), goal.clone(), run.clone());
        pair.server().on(ITEM, move |_req, _reply| {
            let n = r.fetch_add(1, Ordering::AcqRel) + 1;
            if n == g.load(Ordering::Acquire) {
                rn.mark_end();
            }
        });
        pair.server().on(NULL, |_req, reply| reply.ok(&[]));
        let session = pair
            .client()
            .session(pair.server().addr())
            .map_err(|e| BenchError(e.to_string()))?;
        Ok(Self {
            pair,
            session: Some(session),
            received,
            goal,
            run,
            size,
            batching,
        })
    }

    /// Posts `count` items (from the client's transport thread: each chunk
    /// of 512 items is followed by a null call whose completion posts the
    /// next chunk, two chunks in flight); returns the time until the server
    /// handled the last item.
    ///
    /// # Errors
    /// A failed or stuck run.
    pub fn run(&mut self, count: u64) -> BenchResult<Duration> {
        let s = self
            .session
            .clone()
            .ok_or_else(|| BenchError("finished".into()))?;
        let count = count.max(1);
        let base = self.received.load(Ordering::Acquire);
        self.goal.store(base + count, Ordering::Release);
        self.run.begin(count, 0);
        let left = Arc::new(AtomicU64::new(count));
        let item: Arc<[u8]> = vec![0x42u8; self.size].into();
        let start = Instant::now();
        // Two pumps: each posts a chunk, then a null call queued behind it
        // whose completion (on the client's transport thread) posts the
        // next chunk. No thread outside the transport's posts or spins.
        for _ in 0..2 {
            pump(s.clone(), left.clone(), item.clone(), self.run.clone());
        }
        self.run.wait(start)
    }

    /// Average items per message so far.
    pub fn items_per_msg(&self) -> f64 {
        self.pair.client().stats().items_per_msg()
    }

    /// Shuts both machines down.
    pub fn finish(mut self) {
        self.session = None;
        self.pair.finish();
    }
}

impl Drop for RpcOneWay {
    fn drop(&mut self) {
        self.session = None;
        self.pair.finish();
    }
}
