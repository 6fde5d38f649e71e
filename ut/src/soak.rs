//! The soak runner: randomized adds (messages both ways, bulk both ways,
//! receive buffers, buffers with short timeouts), deletions, stops with
//! and without abort and restarts of both transfer machines, with faults
//! injected (`colibri_net::fault`: lost, failed, delayed, duplicated and
//! truncated operations, connection resets, killed and revived peers),
//! bounded by a count of operations and a
//! time. After every epoch (a run of operations between two restarts) it
//! checks that both machines stopped, that every add got exactly one
//! final event, that no buffer stayed registered and no end point stayed
//! referenced; every payload received successfully is checked as it
//! arrives. The process's resident memory is sampled as it runs.
//!
//! `colibri soak` runs it from the command line; the test suite runs a
//! short version on every transport.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_net::fault::{FaultAction, FaultPlan, FaultRule, FaultStats, FaultTransport, Pick};
use colibri_net::{
    BufToken, BufVec, BufferCallbacks, Domain, EndPoint, NetBufDesc, NetError, QueueType,
    RecvParams, TmState, TransferMachine, Transport, ignore_tm_events,
};
use parking_lot::Mutex;

use crate::harness::{Rng, pattern};

/// How long a soak runs and what it injects.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Seed of every random choice (operations and faults): a failing run
    /// replays with it.
    pub seed: u64,
    /// Stop after this many operations.
    pub max_ops: u64,
    /// Stop after this long.
    pub max_time: Duration,
    /// Inject faults.
    pub faults: bool,
    /// Operations between two restarts of the transfer machines.
    pub epoch_ops: u64,
    /// Resident memory is sampled this often.
    pub sample_every: Duration,
}

impl Default for SoakConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            max_ops: 1_000_000,
            max_time: Duration::from_secs(600),
            faults: true,
            epoch_ops: 20_000,
            sample_every: Duration::from_secs(10),
        }
    }
}

/// What a soak did.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    /// Operations performed (adds and deletions).
    pub ops: u64,
    /// Buffers added.
    pub adds: u64,
    /// Deletions asked.
    pub dels: u64,
    /// Final events seen (one per add).
    pub finals: u64,
    /// Successful receptions whose payload was checked.
    pub payloads_checked: u64,
    /// Epochs run (each ends with both machines stopped and restarted).
    pub epochs: u64,
    /// What the fault injector did.
    pub faults: FaultStats,
    /// The longest time both machines took to reach STOPPED at the end of
    /// an epoch (a stop without abort waits for operations in flight).
    pub longest_stop: Duration,
    /// (time since start, resident bytes) samples.
    pub rss: Vec<(Duration, u64)>,
    /// Two processes: adds the peer process made (and checked).
    pub peer_adds: u64,
    /// Two processes: payloads the peer process received and checked.
    pub peer_payloads_checked: u64,
    /// Two processes: peer processes killed with traffic in flight (and
    /// replaced).
    pub peer_kills: u64,
    /// How long it ran.
    pub elapsed: Duration,
}

/// The process's resident set size in bytes (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[derive(Default)]
pub(crate) struct Ledger {
    /// Final events per add, for the current epoch.
    pub(crate) finals: Mutex<HashMap<BufToken, u32>>,
    pub(crate) corrupt: AtomicU64,
    pub(crate) checked: AtomicU64,
    pub(crate) seen: AtomicU64,
}

/// Payloads carry their pattern seed in their first 8 bytes.
pub(crate) fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut p = pattern(seed, len.max(8));
    p[..8].copy_from_slice(&seed.to_le_bytes());
    p
}

pub(crate) fn callbacks(l: &Arc<Ledger>) -> Arc<BufferCallbacks> {
    let l = Arc::clone(l);
    Arc::new(BufferCallbacks::new().on_all(move |_tm, ev| {
        if ev.is_ok()
            && matches!(
                ev.queue(),
                QueueType::MsgRecv | QueueType::ActiveBulkRecv | QueueType::PassiveBulkRecv
            )
            && let Ok(msg) = ev.message()
            && msg.len() >= 8
        {
            let s = u64::from_le_bytes(msg[..8].try_into().unwrap_or_default());
            if msg[8..] != payload(s, msg.len())[8..] {
                l.corrupt.fetch_add(1, Ordering::Relaxed);
            }
            l.checked.fetch_add(1, Ordering::Relaxed);
        }
        if ev.is_final() {
            l.seen.fetch_add(1, Ordering::Relaxed);
            *l.finals.lock().entry(ev.token()).or_insert(0) += 1;
        }
    }))
}

/// One side: its domain, and its transfer machine for the epoch.
struct Side {
    dom: Domain,
    tm: Option<TransferMachine>,
    addr: String,
}

impl Side {
    fn tm(&self) -> &TransferMachine {
        self.tm.as_ref().expect("started")
    }
}

/// The faults every soak injects (none when `faults` is false), seeded
/// with `seed`: 5% of messages lost; 3% of operations failed with
/// `ConnectionReset`; 1% duplicated; 1% cut short; 0.5% followed by a
/// reset of the connections with the peer (within 2 ms); 10% delayed up
/// to 2 ms.
pub fn fault_plan(seed: u64, faults: bool) -> FaultPlan {
    if faults {
        FaultPlan::new(seed)
            .rule(FaultRule::new(FaultAction::Lose, Pick::Rate(0.05)).on(&[QueueType::MsgSend]))
            .rule(FaultRule::new(
                FaultAction::Fail(NetError::ConnectionReset("injected".into())),
                Pick::Rate(0.03),
            ))
            .rule(FaultRule::new(FaultAction::Duplicate, Pick::Rate(0.01)))
            .rule(FaultRule::new(FaultAction::Truncate, Pick::Rate(0.01)))
            .rule(FaultRule::new(
                FaultAction::Reset {
                    within: Duration::from_millis(2),
                },
                Pick::Rate(0.005),
            ))
            .rule(FaultRule::new(
                FaultAction::Delay {
                    min: Duration::ZERO,
                    max: Duration::from_millis(2),
                },
                Pick::Rate(0.1),
            ))
    } else {
        FaultPlan::new(seed)
    }
}

/// Runs a soak over `xprt` (wrapped in a fault injector when
/// `cfg.faults`), starting transfer machines at addresses from `addr`.
/// `progress` is called with the report so far about every second.
///
/// # Errors
/// The first broken invariant, with the seed to replay it.
pub fn soak(
    xprt: Arc<dyn Transport>,
    addr: &dyn Fn() -> String,
    cfg: &SoakConfig,
    progress: &mut dyn FnMut(&SoakReport),
) -> Result<SoakReport, String> {
    let start = Instant::now();
    let ft = FaultTransport::new(xprt, fault_plan(cfg.seed, cfg.faults));
    let ledger = Arc::new(Ledger::default());
    let cbs = callbacks(&ledger);
    let mut sides = Vec::new();
    for _ in 0..2 {
        sides.push(Side {
            dom: Domain::new(&ft).map_err(|e| format!("domain: {e}"))?,
            tm: None,
            addr: String::new(),
        });
    }
    let mut rep = SoakReport::default();
    let mut r = Rng::new(cfg.seed);
    let mut last_sample = Instant::now();
    let mut last_progress = Instant::now();
    rep.rss.push((Duration::ZERO, rss_bytes()));
    let done = |rep: &SoakReport| rep.ops >= cfg.max_ops || start.elapsed() >= cfg.max_time;
    let fail = |what: String| format!("{what} (seed {})", cfg.seed);
    while !done(&rep) {
        // Start both machines at fresh addresses, with receive buffers.
        for s in &mut sides {
            let tm = s
                .dom
                .tm_init(ignore_tm_events())
                .map_err(|e| fail(format!("tm_init: {e}")))?;
            tm.start(&addr()).map_err(|e| fail(format!("start: {e}")))?;
            tm.wait_for_state(TmState::Started, Duration::from_secs(20))
                .map_err(|e| fail(format!("start: {e}")))?;
            s.addr = tm.ep().map(|e| e.addr().to_string()).unwrap_or_default();
            s.tm = Some(tm);
        }
        let eps: [EndPoint; 2] = [
            sides[0]
                .tm()
                .ep_create(&sides[1].addr)
                .map_err(|e| fail(format!("ep: {e}")))?,
            sides[1]
                .tm()
                .ep_create(&sides[0].addr)
                .map_err(|e| fail(format!("ep: {e}")))?,
        ];
        let mut outstanding: Vec<(usize, BufToken)> = Vec::new();
        let mut added: Vec<BufToken> = Vec::new();
        let epoch_end = rep.ops + cfg.epoch_ops;
        let mut killed: Option<String> = None;
        while rep.ops < epoch_end && !done(&rep) {
            let me = r.below(2) as usize;
            let (s, other) = (&sides[me], &sides[1 - me]);
            let len = 8 + r.below(500) as usize;
            let sd = r.next();
            let reg = |d: &Domain, bv: BufVec| {
                d.register(bv)
                    .map(|b| b.with_callbacks(cbs.clone()))
                    .map_err(|e| fail(format!("register: {e}")))
            };
            let mut adds: Vec<Result<BufToken, NetError>> = Vec::new();
            match r.below(10) {
                0..=2 => {
                    let mut b = reg(&s.dom, BufVec::new(1, 512))?;
                    b.bufvec_mut()
                        .copy_in(0, &payload(sd, len))
                        .map_err(|e| fail(e.to_string()))?;
                    adds.push(s.tm().add_msg_send(b, &eps[me], len).map_err(|e| e.error));
                }
                3 | 4 => {
                    let mut b = reg(&other.dom, BufVec::new(1, 2048))?;
                    if r.below(4) == 0 {
                        // A receive buffer that times out soon.
                        b.set_timeout(Some(
                            Instant::now() + Duration::from_millis(1 + r.below(20)),
                        ));
                    }
                    let p = RecvParams::multi(512, 1 + r.below(4) as u32);
                    adds.push(other.tm().add_msg_recv(b, p).map_err(|e| e.error));
                }
                5 => {
                    let mut pb = reg(&other.dom, BufVec::with_len(len, 100))?;
                    pb.bufvec_mut()
                        .copy_in(0, &payload(sd, len))
                        .map_err(|e| fail(e.to_string()))?;
                    match other.tm().add_passive_send(pb, len, None) {
                        Ok((t, d)) => {
                            adds.push(Ok(t));
                            let ab = reg(&s.dom, BufVec::new(3, 200))?;
                            adds.push(active(s.tm().add_active_recv(ab, &d)));
                        }
                        Err(e) => adds.push(Err(e.error)),
                    }
                }
                6 => {
                    let pb = reg(&other.dom, BufVec::new(2, 300))?;
                    match other.tm().add_passive_recv(pb, None) {
                        Ok((t, d)) => {
                            adds.push(Ok(t));
                            let mut ab = reg(&s.dom, BufVec::with_len(len, 64))?;
                            ab.bufvec_mut()
                                .copy_in(0, &payload(sd, len))
                                .map_err(|e| fail(e.to_string()))?;
                            adds.push(active_send(&s.tm, ab, &d, len));
                        }
                        Err(e) => adds.push(Err(e.error)),
                    }
                }
                7 | 8 => {
                    if !outstanding.is_empty() {
                        let i = r.below(outstanding.len() as u64) as usize;
                        let (side, t) = outstanding.swap_remove(i);
                        let _ = sides[side].tm().del(t);
                        rep.dels += 1;
                        rep.ops += 1;
                    }
                    continue;
                }
                _ => {
                    if cfg.faults {
                        // Kill or revive a peer, as the fault injector sees it.
                        match killed.take() {
                            Some(a) => ft.revive(&a),
                            None if r.below(20) == 0 => {
                                ft.kill(&other.addr);
                                killed = Some(other.addr.clone());
                            }
                            None => {}
                        }
                    }
                    continue;
                }
            }
            for a in adds {
                rep.ops += 1;
                match a {
                    Ok(t) => {
                        rep.adds += 1;
                        added.push(t);
                        let side = usize::from(t.tm() == sides[1].tm().id());
                        outstanding.push((side, t));
                        if outstanding.len() > 4096 {
                            outstanding.swap_remove(0);
                        }
                    }
                    // A bulk request may be refused at once (its passive
                    // buffer completed meanwhile): the buffer came back.
                    // A timeout that passed before the add.
                    Err(NetError::TimeoutInPast) => {}
                    Err(e) => return Err(fail(format!("add refused: {e}"))),
                }
            }
            if last_sample.elapsed() >= cfg.sample_every {
                last_sample = Instant::now();
                rep.rss.push((start.elapsed(), rss_bytes()));
            }
            if last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                rep.elapsed = start.elapsed();
                rep.finals = ledger.seen.load(Ordering::Relaxed);
                rep.faults = ft.stats();
                progress(&rep);
            }
        }
        if let Some(a) = killed.take() {
            ft.revive(&a);
        }
        // End of the epoch: stop both, check everything came back.
        drop(eps);
        let abort = r.below(2) == 0;
        let t0 = Instant::now();
        for s in &sides {
            s.tm().stop(abort).map_err(|e| fail(format!("stop: {e}")))?;
        }
        for (i, s) in sides.iter().enumerate() {
            if let Err(e) = s.tm().wait_stopped(Duration::from_secs(30)) {
                return Err(fail(format!(
                    "side {i} stuck in {:?} ({e}) with {} buffer(s) queued",
                    s.tm().state(),
                    s.tm().queued()
                )));
            }
        }
        rep.longest_stop = rep.longest_stop.max(t0.elapsed());
        for (i, s) in sides.iter_mut().enumerate() {
            if let Some(tm) = s.tm.take()
                && let Err(e) = tm.fini()
            {
                return Err(fail(format!("side {i} fini: {}", e.error)));
            }
        }
        {
            let mut finals = ledger.finals.lock();
            for t in &added {
                match finals.remove(t) {
                    Some(1) => {}
                    Some(n) => return Err(fail(format!("{t:?} got {n} final events"))),
                    None => return Err(fail(format!("{t:?} got no final event"))),
                }
            }
            if let Some(t) = finals.keys().next() {
                return Err(fail(format!("a final event for {t:?}, never added")));
            }
        }
        for (i, s) in sides.iter().enumerate() {
            if s.dom.buffer_count() != 0 {
                return Err(fail(format!(
                    "side {i}: {} buffer(s) still registered after the epoch",
                    s.dom.buffer_count()
                )));
            }
        }
        let corrupt = ledger.corrupt.load(Ordering::Relaxed);
        if corrupt > 0 {
            return Err(fail(format!("{corrupt} corrupted payload(s)")));
        }
        rep.epochs += 1;
    }
    for s in sides {
        s.dom
            .fini()
            .map_err(|e| fail(format!("domain fini: {}", e.error)))?;
    }
    rep.elapsed = start.elapsed();
    rep.finals = ledger.seen.load(Ordering::Relaxed);
    rep.payloads_checked = ledger.checked.load(Ordering::Relaxed);
    rep.faults = ft.stats();
    rep.rss.push((rep.elapsed, rss_bytes()));
    Ok(rep)
}

fn active(r: Result<BufToken, colibri_net::AddError>) -> Result<BufToken, NetError> {
    r.map_err(|e| e.error)
}

fn active_send(
    tm: &Option<TransferMachine>,
    b: colibri_net::NetBuffer,
    d: &NetBufDesc,
    len: usize,
) -> Result<BufToken, NetError> {
    match tm {
        Some(tm) => active(tm.add_active_send(b, d, len)),
        None => Err(NetError::NoEntry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read() {
        assert!(rss_bytes() > 0);
    }
}
