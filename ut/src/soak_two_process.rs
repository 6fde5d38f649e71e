//! The soak across two processes: our transfer machine here, the peer's
//! in a child process (the same program run as a peer, speaking a line
//! protocol on its standard input and output), both behind their own
//! fault injector. The parent draws every operation: its own adds and
//! deletions, and commands to the child (add a receive buffer, send us a
//! message, serve or start a bulk transfer with a descriptor we pass or
//! it returns, delete one of its buffers, kill or revive our address in
//! its injector). Every epoch both sides stop (with or without abort) and
//! restart at fresh ports; the child checks its own side as the parent
//! does (every add one final event, payloads intact, the machine reached
//! STOPPED, nothing registered or referenced) and reports, and exits
//! non-zero on a violation. Now and then the child is killed instead of
//! stopped (SIGKILL, mid-epoch traffic in flight) and a new one started:
//! our side must still give every add one final event. The child is
//! killed on every path out of the parent (its guard's `Drop`), and exits
//! by itself when its standard input closes.
//!
//! Protocol (one command per line; only `start`, `psend`, `precv`,
//! `stop` and `quit` are answered, in order):
//!
//! | command | the child | answer |
//! |---|---|---|
//! | `start` | starts its transfer machine | `addr ADDR` |
//! | `peer ADDR` | makes its end point for our machine | |
//! | `recv N MS` | adds a receive buffer for N messages, timing out after MS ms (0: none) | |
//! | `send SEED LEN` | sends us a message | |
//! | `psend SEED LEN` | adds a passive send | `desc HEX` or `err TEXT` |
//! | `precv` | adds a passive receive | `desc HEX` or `err TEXT` |
//! | `asend SEED LEN HEX` | active send into our passive receive | |
//! | `arecv HEX` | active receive from our passive send | |
//! | `del` | deletes one of its outstanding buffers | |
//! | `kill` / `revive` | its injector kills / revives our address | |
//! | `stop 0\|1` | stops (1: abort), waits, checks | `ok ADDS FINALS CHECKED LOST FAILED DELAYED DUPLICATED TRUNCATED RESET` or `fail TEXT` (then exits 1) |
//! | `quit` | finalises its domain | `bye` |

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use colibri_net::fault::{FaultStats, FaultTransport};
use colibri_net::{
    BufToken, BufVec, Domain, EndPoint, NetBufDesc, NetError, RecvParams, TmState, TransferMachine,
    Transport, ignore_tm_events,
};
use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::harness::Rng;
use crate::soak::{Ledger, SoakConfig, SoakReport, callbacks, fault_plan, payload, rss_bytes};

/// How long the parent waits for an answer of the child.
const ANSWER_WAIT: Duration = Duration::from_secs(60);
/// How long a transfer machine may take to reach STOPPED.
const STOP_WAIT: Duration = Duration::from_secs(30);
/// How much longer a stop that overran [`STOP_WAIT`] is watched, to tell
/// a slow stop from a hung one (the two stay inside [`ANSWER_WAIT`]).
const STOP_LATE: Duration = Duration::from_secs(25);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd hex length {}", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("hex: {e}")))
        .collect()
}

/// Checks a side after its transfer machine was stopped: it reached
/// STOPPED, finalises, every add got one final event, nothing corrupted
/// and nothing left registered.
fn check_stopped(
    who: &str,
    dom: &Domain,
    tm: TransferMachine,
    ledger: &Ledger,
    added: &mut Vec<BufToken>,
) -> Result<(), String> {
    let t0 = Instant::now();
    if let Err(e) = tm.wait_stopped(STOP_WAIT) {
        // What is left, and whether it ends late or never (the second
        // wait keeps a child's answer inside its parent's ANSWER_WAIT).
        let left: Vec<String> = added
            .iter()
            .filter_map(|t| tm.buffer_state(*t))
            .take(8)
            .map(|b| {
                format!(
                    "{:?}{}{}{}",
                    b.queue,
                    if b.in_use { " in use" } else { "" },
                    if b.cancelled { " cancelled" } else { "" },
                    if b.timed_out { " timed out" } else { "" }
                )
            })
            .collect();
        let (state, queued) = (tm.state(), tm.queued());
        let later = match tm.wait_stopped(STOP_LATE) {
            Ok(()) => format!("it stopped after {:.1} s", t0.elapsed().as_secs_f64()),
            Err(_) => format!(
                "still not stopped after {:.1} s",
                t0.elapsed().as_secs_f64()
            ),
        };
        return Err(format!(
            "{who}: stuck in {state:?} ({e}) with {queued} buffer(s) queued {left:?}; {later}"
        ));
    }
    if let Err(e) = tm.fini() {
        return Err(format!("{who}: fini: {}", e.error));
    }
    {
        let mut finals = ledger.finals.lock();
        for t in added.drain(..) {
            match finals.remove(&t) {
                Some(1) => {}
                Some(n) => return Err(format!("{who}: {t:?} got {n} final events")),
                None => return Err(format!("{who}: {t:?} got no final event")),
            }
        }
        if let Some(t) = finals.keys().next() {
            return Err(format!("{who}: a final event for {t:?}, never added"));
        }
    }
    if dom.buffer_count() != 0 {
        return Err(format!(
            "{who}: {} buffer(s) still registered after the epoch",
            dom.buffer_count()
        ));
    }
    let corrupt = ledger.corrupt.load(Ordering::Relaxed);
    if corrupt > 0 {
        return Err(format!("{who}: {corrupt} corrupted payload(s)"));
    }
    Ok(())
}

/// The peer's side of the two-process soak: reads commands from `input`,
/// answers on `out`, over `xprt` (behind a fault injector seeded with
/// `seed` when `faults`), starting its transfer machines at `addr`.
/// Returns when told to quit or when `input` ends.
///
/// # Errors
/// A broken invariant of this side (also answered as `fail TEXT`), or a
/// malformed command.
pub fn serve_peer(
    xprt: Arc<dyn Transport>,
    addr: &str,
    seed: u64,
    faults: bool,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), String> {
    let ft = FaultTransport::new(xprt, fault_plan(seed ^ 0x9eed, faults));
    let dom = Domain::new(&ft).map_err(|e| format!("domain: {e}"))?;
    let ledger = Arc::new(Ledger::default());
    let cbs = callbacks(&ledger);
    let mut r = Rng::new(seed ^ 0x5eed);
    let mut tm: Option<TransferMachine> = None;
    let mut peer: Option<EndPoint> = None;
    let mut peer_addr = String::new();
    let mut added: Vec<BufToken> = Vec::new();
    let mut outstanding: Vec<BufToken> = Vec::new();
    let mut line = String::new();
    let answer = |out: &mut dyn Write, s: String| -> Result<(), String> {
        writeln!(out, "{s}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("answer: {e}"))
    };
    let reg = |bv: BufVec| {
        dom.register(bv)
            .map(|b| b.with_callbacks(cbs.clone()))
            .map_err(|e| format!("register: {e}"))
    };
    loop {
        line.clear();
        if input.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            // The parent is gone: stop and leave.
            if let Some(t) = tm.take() {
                let _ = t.stop(true);
                let _ = t.wait_stopped(STOP_WAIT);
            }
            return Ok(());
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i)
                .and_then(|x| x.parse().ok())
                .ok_or_else(|| format!("bad command {line:?}"))
        };
        let desc = |i: usize| -> Result<NetBufDesc, String> {
            Ok(NetBufDesc::from_bytes(unhex(
                w.get(i).ok_or_else(|| format!("bad command {line:?}"))?,
            )?))
        };
        // The result of an add: recorded, or (refused) a violation unless
        // the machine is stopping or a timeout passed before the add.
        let mut note = |res: Result<BufToken, NetError>| -> Result<(), String> {
            match res {
                Ok(t) => {
                    added.push(t);
                    outstanding.push(t);
                    if outstanding.len() > 4096 {
                        outstanding.swap_remove(0);
                    }
                    Ok(())
                }
                Err(NetError::TimeoutInPast) => Ok(()),
                Err(e) => Err(format!("peer: add refused: {e}")),
            }
        };
        match (w.first().copied(), tm.as_ref()) {
            (Some("start"), None) => {
                let t = dom
                    .tm_init(ignore_tm_events())
                    .map_err(|e| format!("tm_init: {e}"))?;
                t.start(addr).map_err(|e| format!("start: {e}"))?;
                t.wait_for_state(TmState::Started, Duration::from_secs(20))
                    .map_err(|e| format!("start: {e}"))?;
                let a = t.ep().map(|e| e.addr().to_string()).unwrap_or_default();
                tm = Some(t);
                answer(out, format!("addr {a}"))?;
            }
            (Some("peer"), Some(t)) => {
                peer_addr = w.get(1).unwrap_or(&"").to_string();
                peer = Some(t.ep_create(&peer_addr).map_err(|e| format!("ep: {e}"))?);
            }
            (Some("recv"), Some(t)) => {
                let mut b = reg(BufVec::new(1, 2048))?;
                let ms = num(2)?;
                if ms > 0 {
                    b.set_timeout(Some(Instant::now() + Duration::from_millis(ms)));
                }
                let p = RecvParams::multi(512, num(1)?.clamp(1, 4) as u32);
                note(t.add_msg_recv(b, p).map_err(|e| e.error))?;
            }
            (Some("send"), Some(t)) => {
                let (sd, len) = (num(1)?, num(2)? as usize);
                let mut b = reg(BufVec::new(1, 512))?;
                b.bufvec_mut()
                    .copy_in(0, &payload(sd, len))
                    .map_err(|e| e.to_string())?;
                let ep = peer.as_ref().ok_or("send before peer")?;
                note(t.add_msg_send(b, ep, len).map_err(|e| e.error))?;
            }
            (Some("psend"), Some(t)) => {
                let (sd, len) = (num(1)?, num(2)? as usize);
                let mut b = reg(BufVec::with_len(len, 100))?;
                b.bufvec_mut()
                    .copy_in(0, &payload(sd, len))
                    .map_err(|e| e.to_string())?;
                match t.add_passive_send(b, len, None) {
                    Ok((tok, d)) => {
                        note(Ok(tok))?;
                        answer(out, format!("desc {}", hex(d.as_bytes())))?;
                    }
                    Err(e) => answer(out, format!("err {}", e.error))?,
                }
            }
            (Some("precv"), Some(t)) => match t.add_passive_recv(reg(BufVec::new(2, 300))?, None) {
                Ok((tok, d)) => {
                    note(Ok(tok))?;
                    answer(out, format!("desc {}", hex(d.as_bytes())))?;
                }
                Err(e) => answer(out, format!("err {}", e.error))?,
            },
            (Some("asend"), Some(t)) => {
                let (sd, len) = (num(1)?, num(2)? as usize);
                let mut b = reg(BufVec::with_len(len, 64))?;
                b.bufvec_mut()
                    .copy_in(0, &payload(sd, len))
                    .map_err(|e| e.to_string())?;
                note(t.add_active_send(b, &desc(3)?, len).map_err(|e| e.error))?;
            }
            (Some("arecv"), Some(t)) => {
                let b = reg(BufVec::new(3, 200))?;
                note(t.add_active_recv(b, &desc(1)?).map_err(|e| e.error))?;
            }
            (Some("del"), Some(t)) => {
                if !outstanding.is_empty() {
                    let i = r.below(outstanding.len() as u64) as usize;
                    let _ = t.del(outstanding.swap_remove(i));
                }
            }
            (Some("kill"), Some(_)) => ft.kill(&peer_addr),
            (Some("revive"), Some(_)) => ft.revive(&peer_addr),
            (Some("stop"), Some(t)) => {
                ft.revive(&peer_addr);
                peer = None;
                t.stop(num(1)? == 1).map_err(|e| format!("stop: {e}"))?;
                outstanding.clear();
                let t = tm.take().ok_or("no machine")?;
                let adds = added.len();
                if let Err(e) = check_stopped("peer", &dom, t, &ledger, &mut added) {
                    answer(out, format!("fail {e}"))?;
                    return Err(e);
                }
                let f = ft.stats();
                answer(
                    out,
                    format!(
                        "ok {adds} {} {} {} {} {} {} {} {}",
                        ledger.seen.swap(0, Ordering::Relaxed),
                        ledger.checked.swap(0, Ordering::Relaxed),
                        f.lost,
                        f.failed,
                        f.delayed,
                        f.duplicated,
                        f.truncated,
                        f.reset
                    ),
                )?;
            }
            (Some("quit"), None) => {
                dom.fini()
                    .map_err(|e| format!("domain fini: {}", e.error))?;
                answer(out, "bye".into())?;
                return Ok(());
            }
            _ => return Err(format!("unexpected command {line:?}")),
        }
    }
}

/// The child process, killed when dropped.
struct PeerProc {
    child: Child,
    stdin: Option<BufWriter<ChildStdin>>,
    answers: Receiver<String>,
}

impl PeerProc {
    fn spawn(mut cmd: Command) -> Result<Self, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not start the peer process: {e}"))?;
        let stdin = child.stdin.take().map(BufWriter::new);
        let stdout = child.stdout.take().ok_or("no stdout")?;
        // The parent reads each answer before it asks again: at most one
        // waits here.
        let (tx, rx) = crossbeam_channel::bounded(16);
        std::thread::Builder::new()
            .name("soak-peer-reader".into())
            .spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Self {
            child,
            stdin,
            answers: rx,
        })
    }

    fn tell(&mut self, cmd: &str) -> Result<(), String> {
        let s = self.stdin.as_mut().ok_or("peer input closed")?;
        writeln!(s, "{cmd}").map_err(|e| format!("peer process gone ({e}) at {cmd:?}"))
    }

    fn flush(&mut self) -> Result<(), String> {
        let s = self.stdin.as_mut().ok_or("peer input closed")?;
        s.flush().map_err(|e| format!("peer process gone ({e})"))
    }

    fn ask(&mut self, cmd: &str) -> Result<String, String> {
        self.tell(cmd)?;
        self.flush()?;
        match self.answers.recv_timeout(ANSWER_WAIT) {
            Ok(a) => Ok(a),
            Err(RecvTimeoutError::Timeout) => Err(format!("peer did not answer {cmd:?} in time")),
            Err(RecvTimeoutError::Disconnected) => {
                let st = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(format!("peer process ended ({st}) at {cmd:?}"))
            }
        }
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the soak with the peer in a child process made by `peer_cmd` (a
/// command running [`serve_peer`] on its standard input and output, with
/// the same seed and fault setting), our transfer machines at addresses
/// from `addr`. Every `kill_every`-th epoch (0: never) the child is
/// killed with traffic in flight instead of stopped, and a new one is
/// started. `progress` is called about every second.
///
/// # Errors
/// The first broken invariant of either side, with the seed.
pub fn soak_two_process(
    xprt: Arc<dyn Transport>,
    addr: &dyn Fn() -> String,
    peer_cmd: &dyn Fn() -> Command,
    cfg: &SoakConfig,
    kill_every: u64,
    progress: &mut dyn FnMut(&SoakReport),
) -> Result<SoakReport, String> {
    let start = Instant::now();
    let fail = |what: String| format!("{what} (seed {})", cfg.seed);
    let ft = FaultTransport::new(xprt, fault_plan(cfg.seed, cfg.faults));
    let dom = Domain::new(&ft).map_err(|e| fail(format!("domain: {e}")))?;
    let ledger = Arc::new(Ledger::default());
    let cbs = callbacks(&ledger);
    let mut peer = PeerProc::spawn(peer_cmd()).map_err(fail)?;
    let mut rep = SoakReport::default();
    // The injector statistics of the peer processes: those of the ones
    // killed, and the last report of the current one.
    let mut dead_peers = [0u64; 6];
    let mut cur_peer = [0u64; 6];
    let total = |ours: FaultStats, a: &[u64; 6], b: &[u64; 6]| {
        let mut f = ours;
        f.lost += a[0] + b[0];
        f.failed += a[1] + b[1];
        f.delayed += a[2] + b[2];
        f.duplicated += a[3] + b[3];
        f.truncated += a[4] + b[4];
        f.reset += a[5] + b[5];
        f
    };
    let mut r = Rng::new(cfg.seed);
    let mut last_sample = Instant::now();
    let mut last_progress = Instant::now();
    rep.rss.push((Duration::ZERO, rss_bytes()));
    let done = |rep: &SoakReport| rep.ops >= cfg.max_ops || start.elapsed() >= cfg.max_time;
    let reg = |bv: BufVec| {
        dom.register(bv)
            .map(|b| b.with_callbacks(cbs.clone()))
            .map_err(|e| fail(format!("register: {e}")))
    };
    let mut added: Vec<BufToken> = Vec::new();
    while !done(&rep) {
        let tm = dom
            .tm_init(ignore_tm_events())
            .map_err(|e| fail(format!("tm_init: {e}")))?;
        tm.start(&addr()).map_err(|e| fail(format!("start: {e}")))?;
        tm.wait_for_state(TmState::Started, Duration::from_secs(20))
            .map_err(|e| fail(format!("start: {e}")))?;
        let own = tm.ep().map(|e| e.addr().to_string()).unwrap_or_default();
        let theirs = match peer.ask("start").map_err(&fail)? {
            a if a.starts_with("addr ") => a[5..].to_string(),
            a => return Err(fail(format!("peer: {a}"))),
        };
        peer.tell(&format!("peer {own}")).map_err(&fail)?;
        let ep = tm
            .ep_create(&theirs)
            .map_err(|e| fail(format!("ep: {e}")))?;
        let kill_now = kill_every > 0 && (rep.epochs + 1).is_multiple_of(kill_every);
        let mut outstanding: Vec<BufToken> = Vec::new();
        let mut killed = false;
        let epoch_end = rep.ops + cfg.epoch_ops;
        while rep.ops < epoch_end && !done(&rep) {
            let len = 8 + r.below(500) as usize;
            let sd = r.next();
            let mut adds: Vec<Result<BufToken, NetError>> = Vec::new();
            match r.below(14) {
                0 | 1 => {
                    let mut b = reg(BufVec::new(1, 512))?;
                    b.bufvec_mut()
                        .copy_in(0, &payload(sd, len))
                        .map_err(|e| fail(e.to_string()))?;
                    adds.push(tm.add_msg_send(b, &ep, len).map_err(|e| e.error));
                }
                2 | 3 => {
                    let ms = if r.below(4) == 0 { 1 + r.below(20) } else { 0 };
                    peer.tell(&format!("recv {} {ms}", 1 + r.below(4)))
                        .map_err(&fail)?;
                }
                4 => peer.tell(&format!("send {sd} {len}")).map_err(&fail)?,
                5 => {
                    let mut b = reg(BufVec::new(1, 2048))?;
                    if r.below(4) == 0 {
                        b.set_timeout(Some(
                            Instant::now() + Duration::from_millis(1 + r.below(20)),
                        ));
                    }
                    let p = RecvParams::multi(512, 1 + r.below(4) as u32);
                    adds.push(tm.add_msg_recv(b, p).map_err(|e| e.error));
                }
                6 => {
                    // Our passive send, the peer's active receive.
                    let mut b = reg(BufVec::with_len(len, 100))?;
                    b.bufvec_mut()
                        .copy_in(0, &payload(sd, len))
                        .map_err(|e| fail(e.to_string()))?;
                    match tm.add_passive_send(b, len, None) {
                        Ok((t, d)) => {
                            adds.push(Ok(t));
                            peer.tell(&format!("arecv {}", hex(d.as_bytes())))
                                .map_err(&fail)?;
                        }
                        Err(e) => adds.push(Err(e.error)),
                    }
                }
                7 => {
                    // Our passive receive, the peer's active send.
                    match tm.add_passive_recv(reg(BufVec::new(2, 300))?, None) {
                        Ok((t, d)) => {
                            adds.push(Ok(t));
                            peer.tell(&format!("asend {sd} {len} {}", hex(d.as_bytes())))
                                .map_err(&fail)?;
                        }
                        Err(e) => adds.push(Err(e.error)),
                    }
                }
                8 | 9 => {
                    // The peer's passive buffer, our active transfer.
                    let send = r.below(2) == 0;
                    let q = if send {
                        "precv".to_string()
                    } else {
                        format!("psend {sd} {len}")
                    };
                    let a = peer.ask(&q).map_err(&fail)?;
                    let Some(h) = a.strip_prefix("desc ") else {
                        if a.starts_with("err ") {
                            continue;
                        }
                        return Err(fail(format!("peer: {a}")));
                    };
                    let d = NetBufDesc::from_bytes(unhex(h).map_err(&fail)?);
                    if send {
                        let mut b = reg(BufVec::with_len(len, 64))?;
                        b.bufvec_mut()
                            .copy_in(0, &payload(sd, len))
                            .map_err(|e| fail(e.to_string()))?;
                        adds.push(tm.add_active_send(b, &d, len).map_err(|e| e.error));
                    } else {
                        let b = reg(BufVec::new(3, 200))?;
                        adds.push(tm.add_active_recv(b, &d).map_err(|e| e.error));
                    }
                }
                10 | 11 => {
                    if r.below(2) == 0 {
                        peer.tell("del").map_err(&fail)?;
                    } else if !outstanding.is_empty() {
                        let i = r.below(outstanding.len() as u64) as usize;
                        let _ = tm.del(outstanding.swap_remove(i));
                    }
                    rep.dels += 1;
                    rep.ops += 1;
                    continue;
                }
                _ => {
                    if cfg.faults {
                        // Kill or revive each other, as the injectors see it.
                        if killed {
                            ft.revive(&theirs);
                            peer.tell("revive").map_err(&fail)?;
                            killed = false;
                        } else if r.below(20) == 0 {
                            ft.kill(&theirs);
                            peer.tell("kill").map_err(&fail)?;
                            killed = true;
                        }
                    }
                    continue;
                }
            }
            rep.ops += 1;
            for a in adds {
                match a {
                    Ok(t) => {
                        rep.adds += 1;
                        added.push(t);
                        outstanding.push(t);
                        if outstanding.len() > 4096 {
                            outstanding.swap_remove(0);
                        }
                    }
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
                peer.flush().map_err(&fail)?;
                rep.elapsed = start.elapsed();
                rep.finals = ledger.seen.load(Ordering::Relaxed);
                rep.faults = total(ft.stats(), &dead_peers, &cur_peer);
                progress(&rep);
            }
        }
        ft.revive(&theirs);
        drop(ep);
        let abort = r.below(2) == 0;
        let t0 = Instant::now();
        if kill_now {
            // The peer dies with traffic in flight; a new one takes over.
            drop(peer);
            rep.peer_kills += 1;
            for (d, c) in dead_peers.iter_mut().zip(&mut cur_peer) {
                *d += std::mem::take(c);
            }
            tm.stop(abort).map_err(|e| fail(format!("stop: {e}")))?;
            check_stopped("our side", &dom, tm, &ledger, &mut added).map_err(&fail)?;
            peer = PeerProc::spawn(peer_cmd()).map_err(&fail)?;
        } else {
            peer.tell(&format!("stop {}", u8::from(abort)))
                .map_err(&fail)?;
            peer.flush().map_err(&fail)?;
            tm.stop(abort).map_err(|e| fail(format!("stop: {e}")))?;
            check_stopped("our side", &dom, tm, &ledger, &mut added).map_err(&fail)?;
            let Ok(a) = peer.answers.recv_timeout(ANSWER_WAIT) else {
                return Err(fail("peer did not answer its stop".into()));
            };
            let Some(nums) = a.strip_prefix("ok ") else {
                return Err(fail(format!("peer: {a}")));
            };
            let n: Vec<u64> = nums
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if n.len() != 9 {
                return Err(fail(format!("peer: malformed answer {a:?}")));
            }
            rep.peer_adds += n[0];
            rep.peer_payloads_checked += n[2];
            cur_peer.copy_from_slice(&n[3..9]);
        }
        rep.longest_stop = rep.longest_stop.max(t0.elapsed());
        rep.epochs += 1;
    }
    match peer.ask("quit").map_err(&fail)?.as_str() {
        "bye" => {}
        a => return Err(fail(format!("peer: {a}"))),
    }
    drop(peer);
    dom.fini()
        .map_err(|e| fail(format!("domain fini: {}", e.error)))?;
    rep.elapsed = start.elapsed();
    rep.finals = ledger.seen.load(Ordering::Relaxed);
    rep.payloads_checked = ledger.checked.load(Ordering::Relaxed);
    rep.faults = total(ft.stats(), &dead_peers, &cur_peer);
    rep.rss.push((rep.elapsed, rss_bytes()));
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let b = vec![0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
    }

    /// The peer side answers as the protocol says, checks its epoch and
    /// refuses what it does not know.
    #[test]
    fn peer_answers_and_checks_its_epoch() {
        let xprt: Arc<dyn Transport> = Arc::new(colibri_bulk_mem::MemTransport::default());
        let mut input: &[u8] =
            b"start\nrecv 2 0\nrecv 1 5\npsend 7 100\nprecv\ndel\nstop 1\nstart\nstop 0\nquit\n";
        let mut out = Vec::new();
        serve_peer(
            Arc::clone(&xprt),
            "127.0.0.1:0:77",
            1,
            true,
            &mut input,
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "{text}");
        assert!(lines[0].starts_with("addr 127.0.0.1:"), "{text}");
        assert!(
            lines[1].starts_with("desc ") && lines[2].starts_with("desc "),
            "{text}"
        );
        // Four adds, four final events (the stop with abort ended them).
        assert!(lines[3].starts_with("ok 4 4 "), "{text}");
        assert!(lines[4].starts_with("addr "), "{text}");
        assert!(lines[5].starts_with("ok 0 0 "), "{text}");
        assert_eq!(lines[6], "bye");
        // A command out of place or unknown is an error, not a hang.
        let mut input: &[u8] = b"send 1 10\n";
        let mut out = Vec::new();
        let e = serve_peer(
            Arc::clone(&xprt),
            "127.0.0.1:0:78",
            1,
            false,
            &mut input,
            &mut out,
        )
        .unwrap_err();
        assert!(e.contains("unexpected command"), "{e}");
        // Its input ending (the parent gone) ends it.
        let mut input: &[u8] = b"start\nrecv 1 0\n";
        serve_peer(
            xprt,
            "127.0.0.1:0:79",
            1,
            false,
            &mut input,
            &mut Vec::new(),
        )
        .unwrap();
    }
}
