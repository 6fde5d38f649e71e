//! Model checking of the transfer machine core with loom: the real core
//! (its TM lock, slot flags, per-buffer event backlogs, callback counter,
//! deferred STOPPED), built with loom's primitives (`net/src/sync.rs`),
//! under every interleaving of the racing calls below up to loom's
//! preemption bound. The transport is a scripted fake whose "threads" are
//! the model's threads.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p colibri-net --test loom_core --release --target-dir target/loom
//! ```
//!
//! Each case checks the first invariant: every add gets exactly one final
//! event, it is the buffer's last event, receive events arrive in claim
//! order, STOPPED is delivered exactly once and after every buffer's final
//! event, and the transfer machine and domain then finalise (nothing left
//! queued or referenced).
#![cfg(loom)]

use std::time::{Duration, Instant};

use loom::sync::{Arc, Mutex};
use loom::thread;

use colibri_net::xprt::{
    Caps, DelReason, Delivery, EpAddr, Limits, QueuedBuf, TmSink, Transport, XprtDomain, XprtTm,
};
use colibri_net::{
    BufToken, BufVec, BufferCallbacks, Clock, Domain, DomainConfig, NetError, RecvParams, Result,
    TmEvent, TmEventKind, TmHandle, TmId, TmState, TransferMachine,
};

#[derive(Debug, Default)]
struct Script {
    sink: Option<TmSink>,
    queued: Vec<QueuedBuf>,
    dels: Vec<(QueuedBuf, DelReason)>,
    deliveries: Vec<Delivery>,
}

/// The scripted transport. Its lock is loom's, so a model thread blocked
/// on it is a blocked model thread, not a blocked process.
#[derive(Debug, Clone, Default)]
struct Fake(Arc<Mutex<Script>>);

impl Fake {
    fn sink(&self) -> TmSink {
        self.0.lock().unwrap().sink.clone().expect("initialised")
    }

    /// Runs the deliveries the core handed over, as a transport thread.
    fn pump(&self) {
        loop {
            let ds = std::mem::take(&mut self.0.lock().unwrap().deliveries);
            if ds.is_empty() {
                return;
            }
            for d in ds {
                d.run();
            }
        }
    }

    /// Does what a transport must after the core asked it to end an
    /// operation in flight: completes it, `Cancelled`.
    fn finish_dels(&self) {
        let dels = std::mem::take(&mut self.0.lock().unwrap().dels);
        for (q, _) in dels {
            self.sink().complete(&q, Err(NetError::Cancelled));
        }
    }

    fn queued(&self, i: usize) -> QueuedBuf {
        self.0.lock().unwrap().queued[i].clone()
    }
}

impl Transport for Fake {
    fn name(&self) -> &'static str {
        "loom-fake"
    }
    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(self.clone()))
    }
}

impl XprtDomain for Fake {
    fn name(&self) -> &'static str {
        "loom-fake"
    }
    fn limits(&self) -> Limits {
        Limits::new(1 << 16, 1 << 16, 4, 512)
    }
    fn caps(&self) -> Caps {
        Caps::new(0x4c4f)
            .with_timeouts()
            .with_multi_message()
            .with_sync_delivery()
    }
    fn tm_init(&self, _tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        self.0.lock().unwrap().sink = Some(sink);
        Ok(Box::new(self.clone()))
    }
}

impl XprtTm for Fake {
    fn start(&self, _addr: &str) -> Result<()> {
        Ok(())
    }
    fn stop(&self, _abort: bool) -> Result<()> {
        Ok(())
    }
    fn fini(&self) {}
    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        Ok(EpAddr {
            addr: addr.to_string(),
            data: std::sync::Arc::new(()),
        })
    }
    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        self.0.lock().unwrap().queued.push(buf.clone());
        Ok(())
    }
    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        self.0.lock().unwrap().dels.push((buf.clone(), reason));
    }
    fn deliver(&self, delivery: Delivery) {
        self.0.lock().unwrap().deliveries.push(delivery);
    }
}

/// What the callbacks saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A buffer event: token, final, status, offset.
    Buf(BufToken, bool, Status, usize),
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Cancelled,
    TimedOut,
    Other,
}

fn status(r: &Result<()>) -> Status {
    match r {
        Ok(()) => Status::Ok,
        Err(NetError::Cancelled) => Status::Cancelled,
        Err(NetError::TimedOut) => Status::TimedOut,
        Err(_) => Status::Other,
    }
}

struct Rig {
    fake: Fake,
    dom: Domain,
    tm: TransferMachine,
    log: Arc<Mutex<Vec<Seen>>>,
    cbs: std::sync::Arc<BufferCallbacks>,
    now: Instant,
}

impl Rig {
    /// A started transfer machine on the fake, with recording callbacks.
    fn new() -> Self {
        Self::with_mode(false)
    }

    /// As [`Rig::new`], in synchronous delivery mode if `sync`.
    fn with_mode(sync: bool) -> Self {
        let fake = Fake::default();
        let clock = Clock::manual();
        let now = clock.now();
        let dom =
            Domain::with_config(&fake, DomainConfig::default().with_clock(clock.clock())).unwrap();
        let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let tlog = Arc::clone(&log);
        let tm = dom
            .tm_init(std::sync::Arc::new(move |_: &TmHandle, ev: &TmEvent| {
                if let TmEventKind::StateChange {
                    state: TmState::Stopped,
                    ..
                } = ev.kind
                {
                    tlog.lock().unwrap().push(Seen::Stopped);
                }
            }))
            .unwrap();
        let blog = Arc::clone(&log);
        let cbs = std::sync::Arc::new(BufferCallbacks::new().on_all(move |_, ev| {
            blog.lock().unwrap().push(Seen::Buf(
                ev.token(),
                ev.is_final(),
                status(ev.status()),
                ev.offset(),
            ));
        }));
        if sync {
            tm.set_sync_delivery().unwrap();
        }
        tm.start("ep:me").unwrap();
        fake.sink().post_started("ep:me");
        assert_eq!(tm.state(), TmState::Started);
        Self {
            fake,
            dom,
            tm,
            log,
            cbs,
            now,
        }
    }

    fn buffer(&self, deadline: Option<Duration>) -> colibri_net::NetBuffer {
        let mut b = self
            .dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(std::sync::Arc::clone(&self.cbs));
        b.set_timeout(deadline.map(|d| self.now + d));
        b
    }

    /// A send the transport has begun working on.
    fn send_in_use(&self, deadline: Option<Duration>) -> (BufToken, QueuedBuf) {
        let ep = self.tm.ep_create("ep:peer").unwrap();
        let t = self.tm.add_msg_send(self.buffer(deadline), &ep, 8).unwrap();
        let n = self.fake.0.lock().unwrap().queued.len();
        let q = self.fake.queued(n - 1);
        assert!(self.fake.sink().begin_use(&q));
        (t, q)
    }

    /// Lets the transport finish what it was asked, runs every delivery,
    /// stops with abort if not stopping yet, and checks the invariant:
    /// one final event per token, last of its buffer; STOPPED once, last
    /// (in synchronous mode: once).
    /// Then finalises everything.
    fn finish(self, tokens: &[BufToken]) -> Vec<Seen> {
        self.fake.finish_dels();
        self.fake.pump();
        if matches!(self.tm.state(), TmState::Started) {
            self.tm.stop(true).unwrap();
        }
        self.fake.finish_dels();
        self.fake.pump();
        if self.tm.is_sync_delivery() {
            self.tm.deliver_all().unwrap();
        }
        let log = self.log.lock().unwrap().clone();
        for t in tokens {
            let evs: Vec<&Seen> = log
                .iter()
                .filter(|s| matches!(s, Seen::Buf(k, ..) if k == t))
                .collect();
            let finals = evs
                .iter()
                .filter(|s| matches!(s, Seen::Buf(_, true, ..)))
                .count();
            assert_eq!(finals, 1, "token {t:?}: events {evs:?}");
            assert!(
                matches!(evs.last(), Some(Seen::Buf(_, true, ..))),
                "token {t:?}: the final event is not the last: {evs:?}"
            );
        }
        let stops: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Seen::Stopped)
            .map(|(i, _)| i)
            .collect();
        if self.tm.is_sync_delivery() {
            // Buffer events wait for deliver_all, STOPPED does not
            // (DESIGN.md section 4): once, wherever.
            assert_eq!(stops.len(), 1, "STOPPED once: {log:?}");
        } else {
            assert_eq!(stops, vec![log.len() - 1], "STOPPED once and last: {log:?}");
        }
        assert_eq!(self.tm.state(), TmState::Stopped);
        self.tm.fini().map_err(|e| e.error).unwrap();
        self.dom.fini().map_err(|e| e.error).unwrap();
        log
    }
}

/// Runs `f` under loom's scheduler, exhaustively (no preemption bound
/// unless `LOOM_MAX_PREEMPTIONS` sets one), and reports how many
/// interleavings it explored.
fn model(f: impl Fn() + Sync + Send + 'static) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let b = loom::model::Builder::new();
    RUNS.store(0, std::sync::atomic::Ordering::Relaxed);
    b.check(move || {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    eprintln!(
        "explored {} interleavings",
        RUNS.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn final_status(log: &[Seen], t: BufToken) -> Status {
    log.iter()
        .find_map(|s| match s {
            Seen::Buf(k, true, st, _) if *k == t => Some(*st),
            _ => None,
        })
        .expect("a final event")
}

/// A deletion races the transport's completion of an operation in
/// flight: one final event, the completion's or the cancellation's.
#[test]
fn del_races_completion() {
    model(|| {
        let rig = Rig::new();
        let (t, q) = rig.send_in_use(None);
        let h = rig.tm.handle();
        let sink = rig.fake.sink();
        let a = thread::spawn(move || {
            h.del(t).unwrap();
        });
        let b = thread::spawn(move || sink.complete(&q, Ok(8)));
        a.join().unwrap();
        b.join().unwrap();
        let log = rig.finish(&[t]);
        assert!(matches!(
            final_status(&log, t),
            Status::Ok | Status::Cancelled
        ));
    });
}

/// A timeout races the completion of an operation in flight and a
/// deletion: one final event; a deletion never keeps the timeout from
/// ending the operation.
#[test]
fn timeout_races_completion_and_del() {
    model(|| {
        let rig = Rig::new();
        let (t, q) = rig.send_in_use(Some(Duration::from_secs(1)));
        let h = rig.tm.handle();
        let h2 = rig.tm.handle();
        let at = rig.now + Duration::from_secs(2);
        let sink = rig.fake.sink();
        let a = thread::spawn(move || {
            h.handle_timeout(at);
        });
        let b = thread::spawn(move || sink.complete(&q, Ok(8)));
        h2.del(t).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        let log = rig.finish(&[t]);
        assert!(matches!(
            final_status(&log, t),
            Status::Ok | Status::Cancelled | Status::TimedOut
        ));
    });
}

/// Stop with abort races a completion in flight and a deletion of an idle
/// receive buffer: each buffer completes once, STOPPED comes once, after
/// them.
#[test]
fn stop_abort_races_completion_and_del() {
    model(|| {
        let rig = Rig::new();
        let (t1, q1) = rig.send_in_use(None);
        let t2 = rig
            .tm
            .add_msg_recv(rig.buffer(None), RecvParams::default())
            .unwrap();
        let h = rig.tm.handle();
        let h2 = rig.tm.handle();
        let sink = rig.fake.sink();
        let a = thread::spawn(move || h.stop(true).unwrap());
        let b = thread::spawn(move || sink.complete(&q1, Ok(8)));
        let _ = h2.del(t2).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        rig.finish(&[t1, t2]);
    });
}

/// The callback counter and the deferred STOPPED: a graceful stop while
/// another thread runs the buffer's completion callback. STOPPED waits for
/// the callback, whichever finishes first.
#[test]
fn stopped_waits_for_running_callbacks() {
    model(|| {
        let rig = Rig::new();
        let (t, q) = rig.send_in_use(None);
        let d = rig.fake.sink().complete_deferred(&q, Ok(8));
        let h = rig.tm.handle();
        let a = thread::spawn(move || d.run());
        let fake = rig.fake.clone();
        let b = thread::spawn(move || {
            h.stop(false).unwrap();
            fake.pump();
        });
        a.join().unwrap();
        b.join().unwrap();
        rig.finish(&[t]);
    });
}

/// Two messages land in one multi-message receive buffer from two
/// transport threads while the application deletes it: events in claim
/// order, exactly one final event, the last.
#[test]
fn messages_race_del_of_a_multi_message_buffer() {
    model(|| {
        let rig = Rig::new();
        let t = rig
            .tm
            .add_msg_recv(
                rig.buffer(None),
                RecvParams {
                    max_receive_msgs: 2,
                    min_receive_size: 8,
                },
            )
            .unwrap();
        let (s1, s2) = (rig.fake.sink(), rig.fake.sink());
        let c1 = s1.claim_recv(8).ok();
        let c2 = s2.claim_recv(8).ok();
        let h = rig.tm.handle();
        let a = thread::spawn(move || {
            if let Some(c) = c1 {
                s1.post_msg(c, 8, "ep:a");
            }
        });
        let b = thread::spawn(move || {
            if let Some(c) = c2 {
                s2.post_msg(c, 8, "ep:b");
            }
        });
        let _ = h.del(t).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        let log = rig.finish(&[t]);
        let offsets: Vec<usize> = log
            .iter()
            .filter_map(|s| match s {
                Seen::Buf(k, _, Status::Ok, off) if *k == t => Some(*off),
                _ => None,
            })
            .collect();
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        assert_eq!(offsets, sorted, "events out of claim order: {log:?}");
    });
}

/// A deletion of an idle receive buffer races its timeout and a graceful
/// stop: one final event.
#[test]
fn del_timeout_and_stop_of_an_idle_buffer() {
    model(|| {
        let rig = Rig::new();
        let t = rig
            .tm
            .add_msg_recv(
                rig.buffer(Some(Duration::from_secs(1))),
                RecvParams::default(),
            )
            .unwrap();
        let (h, h2) = (rig.tm.handle(), rig.tm.handle());
        let at = rig.now + Duration::from_secs(2);
        let fake = rig.fake.clone();
        let a = thread::spawn(move || {
            h.handle_timeout(at);
            fake.pump();
        });
        let fake = rig.fake.clone();
        let b = thread::spawn(move || {
            h2.stop(false).unwrap();
            fake.pump();
        });
        let _ = rig.tm.del(t).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        let log = rig.finish(&[t]);
        assert!(matches!(
            final_status(&log, t),
            Status::Cancelled | Status::TimedOut
        ));
    });
}

/// The transport gives back an operation it claimed (release_claim) while
/// a graceful stop, which spares buffers in use, runs: the released
/// buffer is then the core's to complete, once.
#[test]
fn release_claim_races_graceful_stop() {
    model(|| {
        let rig = Rig::new();
        let (t, q) = rig.send_in_use(None);
        let h = rig.tm.handle();
        let sink = rig.fake.sink();
        let fake = rig.fake.clone();
        let a = thread::spawn(move || {
            h.stop(false).unwrap();
            fake.pump();
        });
        let b = thread::spawn(move || sink.release_claim(&q));
        a.join().unwrap();
        b.join().unwrap();
        let log = rig.finish(&[t]);
        assert_eq!(final_status(&log, t), Status::Cancelled);
    });
}

/// Synchronous delivery: completions posted from a transport thread race
/// `deliver_all` on the application's thread and a deletion; every event
/// is delivered exactly once, by some `deliver_all`.
#[test]
fn sync_delivery_races_posts() {
    model(|| {
        let rig = Rig::with_mode(true);
        let (t1, q1) = rig.send_in_use(None);
        let t2 = rig
            .tm
            .add_msg_recv(rig.buffer(None), RecvParams::default())
            .unwrap();
        let sink = rig.fake.sink();
        let h = rig.tm.handle();
        let a = thread::spawn(move || sink.complete(&q1, Ok(8)));
        let b = thread::spawn(move || {
            h.deliver_all().unwrap();
        });
        let _ = rig.tm.del(t2).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        rig.finish(&[t1, t2]);
    });
}
