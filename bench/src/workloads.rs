//! The workloads. Each owns a [`BenchPair`], sets up its buffers and
//! callbacks once, and then runs any number of measured runs.
//!
//! Callbacks hold the workload's state through an `Arc`; the state holds
//! buffers whose callbacks hold the state again. `finish` breaks that cycle:
//! it stops both transfer machines (every queued buffer comes back), then
//! empties the state, then finalises.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_net::{
    BufVec, BufferCallbacks, EndPoint, NetBufDesc, NetBuffer, NetError, QueueType, RecvParams,
    TmHandle, Transport,
};
use parking_lot::{Condvar, Mutex};

use crate::{BenchError, BenchPair, BenchResult, PairConfig};

/// How long a run may go without finishing before it is declared stuck.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Progress bookkeeping common to every workload.
#[derive(Default)]
struct Run {
    target: u64,
    done: u64,
    finished: bool,
    end: Option<Instant>,
    error: Option<String>,
    closing: bool,
}

impl Run {
    fn reset(&mut self, target: u64) {
        self.target = target.max(1);
        self.done = 0;
        self.finished = false;
        self.end = None;
        self.error = None;
    }

    fn fail(&mut self, e: impl std::fmt::Display) {
        if self.error.is_none() && !self.closing {
            self.error = Some(e.to_string());
        }
        self.finished = true;
    }

    /// Counts one unit of work; true when the run is complete.
    fn tick(&mut self) -> bool {
        self.done += 1;
        if self.done >= self.target && !self.finished {
            self.finished = true;
            self.end = Some(Instant::now());
        }
        self.finished
    }
}

struct Shared<S> {
    st: Mutex<S>,
    cv: Condvar,
}

impl<S> Shared<S> {
    fn new(s: S) -> Arc<Self> {
        Arc::new(Self {
            st: Mutex::new(s),
            cv: Condvar::new(),
        })
    }
}

/// Tears a workload down: marks it closing, stops both transfer machines
/// (every queued buffer comes back through the callbacks, which ignore it),
/// takes what `leftovers` returns out of the state (breaking the cycle
/// state -> buffers -> callbacks -> state), then finalises the pair.
fn close_pair<S, L>(
    pair: &mut Option<BenchPair>,
    sh: &Shared<S>,
    run: impl Fn(&mut S) -> &mut Run,
    leftovers: impl FnOnce(&mut S) -> L,
) {
    let Some(pair) = pair.take() else {
        return;
    };
    run(&mut sh.st.lock()).closing = true;
    pair.stop();
    let taken = leftovers(&mut sh.st.lock());
    drop(taken);
    pair.shutdown();
}

/// Waits until `done(state)` or the run failed; returns the run's duration.
fn wait_run<S>(
    sh: &Shared<S>,
    start: Instant,
    run: impl Fn(&S) -> &Run,
    done: impl Fn(&S) -> bool,
) -> BenchResult<Duration> {
    let deadline = Instant::now() + RUN_LIMIT;
    let mut st = sh.st.lock();
    loop {
        if let Some(e) = &run(&st).error {
            return Err(BenchError(e.clone()));
        }
        if done(&st) {
            let end = run(&st).end.unwrap_or_else(Instant::now);
            return Ok(end.saturating_duration_since(start));
        }
        if sh.cv.wait_until(&mut st, deadline).timed_out() {
            return Err(BenchError(format!(
                "run stuck: {} of {} done after {RUN_LIMIT:?}",
                run(&st).done,
                run(&st).target
            )));
        }
    }
}

fn filled(
    pair_side: &colibri_net::Domain,
    size: usize,
    cbs: &Arc<BufferCallbacks>,
) -> BenchResult<NetBuffer> {
    let mut b = pair_side.register(BufVec::new(1, size.max(1)))?;
    b.bufvec_mut().fill(0xa5);
    b.set_callbacks(cbs.clone());
    Ok(b)
}

// ---------------------------------------------------------------------------

struct RtState {
    run: Run,
    free_send: Vec<NetBuffer>,
    /// Receive buffers of answers already taken, queued again once the
    /// next request is on its way (from the send completion, which the
    /// transports run after their writes), off the round trip's path.
    used_recv: Vec<NetBuffer>,
    want_send: bool,
    server: Option<EndPoint>,
    client: Option<TmHandle>,
    size: usize,
    /// Keep each round trip ([`RoundTrip::record_latencies`]).
    record: bool,
    /// When the message in flight left (`add_msg_send`).
    sent_at: Option<Instant>,
    /// Round trips of the current run, in nanoseconds (the first
    /// `LAT_SAMPLES`).
    lat: Vec<u64>,
}

/// Round trips kept per run by [`RoundTrip::latencies`].
const LAT_SAMPLES: usize = 1 << 20;

impl RtState {
    /// Queues the receive buffers in `used_recv` again.
    fn requeue_recv(&mut self, tm: &TmHandle) {
        for b in std::mem::take(&mut self.used_recv) {
            if let Err(e) = tm.add_msg_recv(b, RecvParams::default()) {
                self.run.fail(e.error);
            }
        }
    }

    fn send_next(&mut self) {
        let Some(buf) = self.free_send.pop() else {
            self.want_send = true;
            return;
        };
        let (Some(tm), Some(ep)) = (&self.client, &self.server) else {
            return;
        };
        if self.record {
            self.sent_at = Some(Instant::now());
        }
        if let Err(e) = tm.add_msg_send(buf, ep, self.size) {
            self.run.fail(e.error);
        }
    }
}

/// Message round trips: one message in flight, echoed by the server from
/// its receive callback.
pub struct RoundTrip {
    pair: Option<BenchPair>,
    sh: Arc<Shared<RtState>>,
}

impl std::fmt::Debug for RoundTrip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoundTrip").finish_non_exhaustive()
    }
}

impl RoundTrip {
    /// Starts a pair and sets up `size`-byte messages.
    ///
    /// # Errors
    /// Failures to start or register.
    pub fn new(xprt: &dyn Transport, cfg: &PairConfig, size: usize) -> BenchResult<Self> {
        let pair = BenchPair::new(xprt, cfg)?;
        let sh = Shared::new(RtState {
            run: Run::default(),
            free_send: Vec::new(),
            used_recv: Vec::new(),
            want_send: false,
            server: Some(pair.server_ep()?),
            client: Some(pair.client.tm.handle()),
            size,
            record: false,
            sent_at: None,
            lat: Vec::new(),
        });
        let (c1, c2) = (sh.clone(), sh.clone());
        let ccbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::MsgRecv, move |tm, mut ev| {
                    let mut st = c1.st.lock();
                    if st.run.closing {
                        return;
                    }
                    if let Err(e) = ev.status() {
                        st.run.fail(e);
                        c1.cv.notify_all();
                        return;
                    }
                    if let Some(t) = st.sent_at.take()
                        && st.lat.len() < LAT_SAMPLES
                    {
                        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        st.lat.push(ns);
                    }
                    if let Some(b) = ev.take_buffer() {
                        st.used_recv.push(b);
                    }
                    if st.run.tick() {
                        c1.cv.notify_all();
                    } else {
                        st.send_next();
                    }
                    // 15 more are queued; this one too if the next request
                    // could not leave.
                    if st.used_recv.len() > 1 || st.run.finished {
                        st.requeue_recv(tm);
                    }
                })
                .on(QueueType::MsgSend, move |tm, mut ev| {
                    let mut st = c2.st.lock();
                    if st.run.closing {
                        return;
                    }
                    if let Err(e) = ev.status() {
                        st.run.fail(e);
                        c2.cv.notify_all();
                        return;
                    }
                    if let Some(b) = ev.take_buffer() {
                        st.free_send.push(b);
                    }
                    st.requeue_recv(tm);
                    if std::mem::take(&mut st.want_send) {
                        st.send_next();
                    }
                }),
        );
        let scbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::MsgRecv, |tm, mut ev| {
                    let len = ev.length();
                    if let (true, Some(s), Some(b)) =
                        (ev.is_ok(), ev.take_sender(), ev.take_buffer())
                    {
                        let _ = tm.add_msg_send(b, &s, len);
                    }
                })
                .on(QueueType::MsgSend, |tm, mut ev| {
                    if let (true, Some(b)) = (ev.is_ok(), ev.take_buffer()) {
                        let _ = tm.add_msg_recv(b, RecvParams::default());
                    }
                }),
        );
        // Receive buffers to spare on both sides: on a network transport
        // the server's echo may complete (and its buffer return to the
        // receive queue) after the client's next request arrived. Over
        // LNet an echo completes when the client's DELIVERED arrives, a
        // small control message that travels on another typed connection
        // (CONTROL) than 4 KiB requests (BULK), with no order between
        // them: under load it was seen four round trips late.
        for _ in 0..16 {
            pair.server.tm.add_msg_recv(
                filled(&pair.server.dom, size, &scbs)?,
                RecvParams::default(),
            )?;
            pair.client.tm.add_msg_recv(
                filled(&pair.client.dom, size, &ccbs)?,
                RecvParams::default(),
            )?;
        }
        for _ in 0..2 {
            sh.st
                .lock()
                .free_send
                .push(filled(&pair.client.dom, size, &ccbs)?);
        }
        Ok(Self {
            pair: Some(pair),
            sh,
        })
    }

    /// Runs `iters` round trips; returns their total time.
    ///
    /// # Errors
    /// A failed or stuck run.
    pub fn run(&mut self, iters: u64) -> BenchResult<Duration> {
        let start = {
            let mut st = self.sh.st.lock();
            st.run.reset(iters);
            st.lat.clear();
            let start = Instant::now();
            st.send_next();
            start
        };
        wait_run(&self.sh, start, |s| &s.run, |s| s.run.finished)
    }

    /// Keeps each round trip of the following runs for
    /// [`RoundTrip::latencies`] (off by default: reading the clock twice
    /// per round trip costs two system calls where the clock is not in the
    /// vDSO, as in a VM on HPET).
    pub fn record_latencies(&mut self, on: bool) {
        self.sh.st.lock().record = on;
    }

    /// Each round trip of the last run, in order: from the client's
    /// `add_msg_send` to its receive callback for the echo (what `run`
    /// averages, without the start and the wake-up of the caller); empty
    /// unless [`RoundTrip::record_latencies`] is on.
    pub fn latencies(&self) -> Vec<Duration> {
        self.sh
            .st
            .lock()
            .lat
            .iter()
            .map(|&ns| Duration::from_nanos(ns))
            .collect()
    }

    /// Stops and finalises the pair.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        close_pair(
            &mut self.pair,
            &self.sh,
            |s| &mut s.run,
            |st| {
                (
                    std::mem::take(&mut st.free_send),
                    std::mem::take(&mut st.used_recv),
                    st.server.take(),
                    st.client.take(),
                )
            },
        );
    }
}

impl Drop for RoundTrip {
    fn drop(&mut self) {
        self.close();
    }
}

// ---------------------------------------------------------------------------

struct OwState {
    run: Run,
    free: Vec<NetBuffer>,
    sent: u64,
    outstanding: u64,
    server: Option<EndPoint>,
    client: Option<TmHandle>,
    size: usize,
}

impl OwState {
    fn pump(&mut self) {
        while self.sent < self.run.target && self.run.error.is_none() {
            let Some(buf) = self.free.pop() else {
                return;
            };
            let (Some(tm), Some(ep)) = (&self.client, &self.server) else {
                return;
            };
            self.sent += 1;
            self.outstanding += 1;
            if let Err(e) = tm.add_msg_send(buf, ep, self.size) {
                self.outstanding -= 1;
                self.run.fail(e.error);
            }
        }
    }
}

/// One-way message stream: `window` sends in flight into the server's
/// receive buffers (multi-message ones where the transport has them).
pub struct OneWay {
    pair: Option<BenchPair>,
    sh: Arc<Shared<OwState>>,
    received: Arc<AtomicU64>,
    goal: Arc<AtomicU64>,
    multi: bool,
}

impl std::fmt::Debug for OneWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneWay")
            .field("multi_message", &self.multi)
            .finish_non_exhaustive()
    }
}

impl OneWay {
    /// Starts a pair and sets up `window` send buffers of `size` bytes and
    /// enough receive space on the server.
    ///
    /// # Errors
    /// Failures to start or register.
    pub fn new(
        xprt: &dyn Transport,
        cfg: &PairConfig,
        size: usize,
        window: usize,
    ) -> BenchResult<Self> {
        let pair = BenchPair::new(xprt, cfg)?;
        let multi = pair.server.tm.caps().multi_message;
        let sh = Shared::new(OwState {
            run: Run::default(),
            free: Vec::new(),
            sent: 0,
            outstanding: 0,
            server: Some(pair.server_ep()?),
            client: Some(pair.client.tm.handle()),
            size,
        });
        let received = Arc::new(AtomicU64::new(0));
        let c = sh.clone();
        let ccbs = Arc::new(
            BufferCallbacks::new().on(QueueType::MsgSend, move |_tm, mut ev| {
                let mut st = c.st.lock();
                if st.run.closing {
                    return;
                }
                st.outstanding -= 1;
                if let Err(e) = ev.status() {
                    st.run.fail(e);
                    c.cv.notify_all();
                    return;
                }
                if let Some(b) = ev.take_buffer() {
                    st.free.push(b);
                }
                if st.run.finished && st.outstanding == 0 {
                    c.cv.notify_all();
                }
                st.pump();
            }),
        );
        let (s, r) = (sh.clone(), received.clone());
        let params = if multi {
            RecvParams::multi(size, u32::MAX)
        } else {
            RecvParams::default()
        };
        let goal = Arc::new(AtomicU64::new(u64::MAX));
        let g = goal.clone();
        let scbs = Arc::new(
            BufferCallbacks::new().on(QueueType::MsgRecv, move |tm, mut ev| {
                if ev.is_ok() {
                    // Lock-free on every message; the state lock only at the end.
                    let n = r.fetch_add(1, Ordering::AcqRel) + 1;
                    if n == g.load(Ordering::Acquire) {
                        let end = Instant::now();
                        let mut st = s.st.lock();
                        st.run.finished = true;
                        st.run.end = Some(end);
                        s.cv.notify_all();
                    }
                }
                if let Some(b) = ev.take_buffer()
                    && ev.is_ok()
                {
                    let _ = tm.add_msg_recv(b, params);
                }
            }),
        );
        let (rsize, rcount) = if multi {
            ((size * 1024).max(64 << 10), 128)
        } else {
            (size, window * 16)
        };
        for _ in 0..rcount {
            pair.server
                .tm
                .add_msg_recv(filled(&pair.server.dom, rsize, &scbs)?, params)?;
        }
        for _ in 0..window.max(1) {
            sh.st
                .lock()
                .free
                .push(filled(&pair.client.dom, size, &ccbs)?);
        }
        Ok(Self {
            pair: Some(pair),
            sh,
            received,
            goal,
            multi,
        })
    }

    /// True when the server uses multi-message receive buffers.
    pub fn multi_message(&self) -> bool {
        self.multi
    }

    /// Streams `count` messages; returns the time until the server received
    /// the last one.
    ///
    /// # Errors
    /// A failed or stuck run (a `NoBuffers` failure means the server fell
    /// behind).
    pub fn run(&mut self, count: u64) -> BenchResult<Duration> {
        self.received.store(0, Ordering::Release);
        self.goal.store(count.max(1), Ordering::Release);
        let start = {
            let mut st = self.sh.st.lock();
            st.run.reset(count);
            st.sent = 0;
            let start = Instant::now();
            st.pump();
            start
        };
        wait_run(
            &self.sh,
            start,
            |s| &s.run,
            |s| s.run.finished && s.outstanding == 0,
        )
    }

    /// Stops and finalises the pair.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        close_pair(
            &mut self.pair,
            &self.sh,
            |s| &mut s.run,
            |st| {
                (
                    std::mem::take(&mut st.free),
                    st.server.take(),
                    st.client.take(),
                )
            },
        );
    }
}

impl Drop for OneWay {
    fn drop(&mut self) {
        self.close();
    }
}

// ---------------------------------------------------------------------------

/// Direction of a bulk workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkDir {
    /// The client reads the server's passive send buffers (active receive).
    Read,
    /// The client writes the server's passive receive buffers (active send).
    Write,
}

struct BkState {
    run: Run,
    descs: VecDeque<NetBufDesc>,
    idle: Vec<NetBuffer>,
    started: u64,
    client: Option<TmHandle>,
    dir: BulkDir,
    size: usize,
}

impl BkState {
    fn pump(&mut self) {
        while self.started < self.run.target && self.run.error.is_none() {
            if self.descs.is_empty() || self.idle.is_empty() {
                return;
            }
            let (Some(d), Some(b), Some(tm)) =
                (self.descs.pop_front(), self.idle.pop(), &self.client)
            else {
                return;
            };
            self.started += 1;
            let r = match self.dir {
                BulkDir::Read => tm.add_active_recv(b, &d),
                BulkDir::Write => tm.add_active_send(b, &d, self.size),
            };
            if let Err(e) = r {
                self.run.fail(e.error);
            }
        }
    }
}

fn offer(tm: &TmHandle, dir: BulkDir, buf: NetBuffer, size: usize) -> Result<NetBufDesc, NetError> {
    let r = match dir {
        BulkDir::Read => tm.add_passive_send(buf, size, None),
        BulkDir::Write => tm.add_passive_recv(buf, None),
    };
    r.map(|(_, d)| d).map_err(|e| e.error)
}

/// Bulk transfers of `size` bytes: the server keeps three passive buffers
/// on offer, the client runs two active transfers at a time.
pub struct Bulk {
    pair: Option<BenchPair>,
    sh: Arc<Shared<BkState>>,
}

impl std::fmt::Debug for Bulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulk").finish_non_exhaustive()
    }
}

impl Bulk {
    /// Starts a pair and sets up the buffers.
    ///
    /// # Errors
    /// Failures to start or register.
    pub fn new(
        xprt: &dyn Transport,
        cfg: &PairConfig,
        size: usize,
        dir: BulkDir,
    ) -> BenchResult<Self> {
        let pair = BenchPair::new(xprt, cfg)?;
        let sh = Shared::new(BkState {
            run: Run::default(),
            descs: VecDeque::new(),
            idle: Vec::new(),
            started: 0,
            client: Some(pair.client.tm.handle()),
            dir,
            size,
        });
        let c = sh.clone();
        let ccbs = Arc::new(BufferCallbacks::new().on_all(move |_tm, mut ev| {
            let mut st = c.st.lock();
            if st.run.closing {
                return;
            }
            if let Err(e) = ev.status() {
                st.run.fail(e);
                c.cv.notify_all();
                return;
            }
            if let Some(b) = ev.take_buffer() {
                st.idle.push(b);
            }
            if st.run.tick() {
                c.cv.notify_all();
            }
            st.pump();
        }));
        let s = sh.clone();
        let scbs = Arc::new(BufferCallbacks::new().on_all(move |tm, mut ev| {
            let closing = s.st.lock().run.closing;
            if closing {
                return;
            }
            let Some(b) = ev.take_buffer() else {
                return;
            };
            if let Err(e) = ev.status() {
                let mut st = s.st.lock();
                st.run.fail(e);
                s.cv.notify_all();
                return;
            }
            let offered = offer(tm, dir, b, size);
            let mut st = s.st.lock();
            match offered {
                Ok(d) => {
                    st.descs.push_back(d);
                    st.pump();
                }
                Err(e) => {
                    st.run.fail(e);
                    s.cv.notify_all();
                }
            }
        }));
        for _ in 0..3 {
            let d = offer(
                &pair.server.tm,
                dir,
                filled(&pair.server.dom, size, &scbs)?,
                size,
            )?;
            sh.st.lock().descs.push_back(d);
        }
        for _ in 0..2 {
            sh.st
                .lock()
                .idle
                .push(filled(&pair.client.dom, size, &ccbs)?);
        }
        Ok(Self {
            pair: Some(pair),
            sh,
        })
    }

    /// Runs `iters` transfers; returns their total time.
    ///
    /// # Errors
    /// A failed or stuck run.
    pub fn run(&mut self, iters: u64) -> BenchResult<Duration> {
        let start = {
            let mut st = self.sh.st.lock();
            st.run.reset(iters);
            st.started = 0;
            let start = Instant::now();
            st.pump();
            start
        };
        wait_run(&self.sh, start, |s| &s.run, |s| s.run.finished)
    }

    /// Stops and finalises the pair.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        close_pair(
            &mut self.pair,
            &self.sh,
            |s| &mut s.run,
            |st| {
                (
                    std::mem::take(&mut st.idle),
                    std::mem::take(&mut st.descs),
                    st.client.take(),
                )
            },
        );
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        self.close();
    }
}
