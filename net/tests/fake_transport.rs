//! The core against a scriptable fake transport: the test plays the
//! transport's part (posting STARTED, completions, messages, running the
//! core's deliveries) through the sink, to check what the core guarantees
//! whatever the transport does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colibri_net::xprt::{
    Caps, DelReason, Delivery, EpAddr, Limits, QueuedBuf, TmSink, Transport, XprtDomain, XprtTm,
};
use colibri_net::{
    BufVec, BufferCallbacks, Clock, Domain, DomainConfig, NetError, QueueType, RecvParams, Result,
    TmEventKind, TmId, TmState, event_channel, ignore_tm_events, tm_event_channel,
};
use parking_lot::Mutex;

#[derive(Debug, Default)]
struct Script {
    sink: Option<TmSink>,
    queued: Vec<QueuedBuf>,
    dels: Vec<(QueuedBuf, DelReason)>,
    /// The core's deliveries, run by `pump` (the fake's "thread").
    deliveries: Vec<Delivery>,
    stopped: usize,
    fail_add: bool,
    extra: Vec<u8>,
    /// Addresses parsed (each one is an end point created).
    parsed: usize,
}

#[derive(Debug, Clone)]
struct Fake {
    caps: Caps,
    script: Arc<Mutex<Script>>,
}

impl Fake {
    fn new(caps: Caps) -> Self {
        Self {
            caps,
            script: Arc::default(),
        }
    }
    fn sink(&self) -> TmSink {
        self.script.lock().sink.clone().expect("initialised")
    }

    /// Runs the deliveries the core handed over, as a transport thread
    /// would; returns how many ran.
    fn pump(&self) -> usize {
        let mut n = 0;
        loop {
            let ds: Vec<Delivery> = std::mem::take(&mut self.script.lock().deliveries);
            if ds.is_empty() {
                return n;
            }
            n += ds.len();
            for d in ds {
                d.run();
            }
        }
    }
}

impl Transport for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(self.clone()))
    }
}

impl XprtDomain for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn limits(&self) -> Limits {
        Limits::new(1 << 20, 1 << 20, 16, 512)
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn tm_init(&self, _tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        self.script.lock().sink = Some(sink);
        Ok(Box::new(self.clone()))
    }
}

impl XprtTm for Fake {
    fn start(&self, addr: &str) -> Result<()> {
        if addr == "bad" {
            return Err(NetError::InvalidAddress {
                addr: addr.into(),
                reason: "fake".into(),
            });
        }
        Ok(())
    }
    fn stop(&self, _abort: bool) -> Result<()> {
        Ok(())
    }
    fn stopped(&self) {
        self.script.lock().stopped += 1;
    }
    fn fini(&self) {}
    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        self.script.lock().parsed += 1;
        if addr.starts_with("ep:") {
            Ok(EpAddr {
                addr: addr.to_string(),
                data: Arc::new(()),
            })
        } else {
            Err(NetError::InvalidAddress {
                addr: addr.into(),
                reason: "not ep:...".into(),
            })
        }
    }
    fn desc_extra(&self, _buf: &QueuedBuf) -> Result<Vec<u8>> {
        Ok(self.script.lock().extra.clone())
    }
    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        let mut s = self.script.lock();
        if s.fail_add {
            return Err(NetError::Busy("fake refuses".into()));
        }
        s.queued.push(buf.clone());
        Ok(())
    }
    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        self.script.lock().dels.push((buf.clone(), reason));
    }
    fn deliver(&self, delivery: Delivery) {
        self.script.lock().deliveries.push(delivery);
    }
}

/// A registered 64-byte buffer with `cbs`.
fn buf64(dom: &Domain, cbs: &Arc<BufferCallbacks>) -> colibri_net::NetBuffer {
    dom.register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(Arc::clone(cbs))
}

fn started(fake: &Fake) -> (Domain, colibri_net::TransferMachine) {
    let dom = Domain::new(fake).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("ep:me").unwrap();
    fake.sink().post_started("ep:me");
    assert_eq!(tm.state(), TmState::Started);
    (dom, tm)
}

fn stop(fake: &Fake, tm: &colibri_net::TransferMachine) {
    tm.stop(true).unwrap();
    // Complete whatever in-flight operation the core asked to end, as a
    // transport would, and run the core's deliveries.
    let dels: Vec<_> = std::mem::take(&mut fake.script.lock().dels);
    for (q, _) in dels {
        fake.sink().complete(&q, Err(NetError::Cancelled));
    }
    fake.pump();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
}

/// Stops, then finalises the transfer machine and the domain (which
/// fails if anything was left registered or referenced).
fn shutdown(fake: &Fake, tm: colibri_net::TransferMachine, dom: Domain) {
    stop(fake, &tm);
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn optional_features_are_refused_not_faked() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let tm2 = dom.tm_init(ignore_tm_events()).unwrap();
    assert!(matches!(
        tm2.set_sync_delivery(),
        Err(NetError::Unsupported { .. })
    ));
    assert!(matches!(
        tm2.confine(&[0]),
        Err(NetError::Unsupported { .. })
    ));
    tm2.fini().unwrap();
    let (cbs, _ev) = event_channel(4);
    let mut b = buf64(&dom, &cbs);
    b.set_timeout(Some(std::time::Instant::now() + Duration::from_secs(9)));
    let e = tm.add_msg_recv(b, RecvParams::default()).unwrap_err();
    assert!(matches!(
        e.error,
        NetError::Unsupported {
            what: "buffer timeouts",
            ..
        }
    ));
    drop(e);
    let b = buf64(&dom, &cbs);
    let e = tm.add_msg_recv(b, RecvParams::multi(8, 4)).unwrap_err();
    assert!(matches!(e.error, NetError::Unsupported { .. }));
    drop(e);
    shutdown(&fake, tm, dom);
}

#[test]
fn transport_refusing_an_add_gets_the_buffer_back_untouched() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, _ev) = event_channel(4);
    fake.script.lock().fail_add = true;
    let b = dom
        .register(BufVec::from_bytes(b"keep me"))
        .unwrap()
        .with_callbacks(cbs);
    let (e, b) = tm
        .add_msg_recv(b, RecvParams::default())
        .unwrap_err()
        .into_parts();
    assert!(matches!(e, NetError::Busy(_)));
    assert_eq!(b.bufvec().to_vec(0, 7).unwrap(), b"keep me");
    assert_eq!(tm.queued(), 0);
    assert_eq!(tm.stats(QueueType::MsgRecv, false).adds, 0);
    drop(b);
    shutdown(&fake, tm, dom);
}

#[test]
fn duplicate_and_late_completions_are_ignored() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    let ep = tm.ep_create("ep:peer").unwrap();
    let b = buf64(&dom, &cbs);
    let t = tm.add_msg_send(b, &ep, 10).unwrap();
    let q = fake.script.lock().queued.pop().unwrap();
    assert_eq!(q.token(), t);
    assert_eq!(q.length(), 10);
    assert_eq!(q.end_point(), Some(ep.clone()));
    let sink = fake.sink();
    sink.complete(&q, Ok(10));
    sink.complete(&q, Err(NetError::Cancelled));
    sink.complete(&q, Ok(10));
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(e.is_ok());
    assert!(
        ev.recv_timeout(Duration::from_millis(50)).is_err(),
        "exactly one completion"
    );
    assert!(!sink.begin_use(&q), "a completed buffer cannot be used");
    assert_eq!(
        q.end_point(),
        None,
        "the send's end point reference ended with it"
    );
    let st = tm.stats(QueueType::MsgSend, false);
    assert_eq!((st.s_events, st.f_events), (1, 0));
    drop((e, ep));
    shutdown(&fake, tm, dom);
}

#[test]
fn stop_completes_idle_buffers_and_posts_stopped_itself() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    for _ in 0..3 {
        let b = buf64(&dom, &cbs);
        tm.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    tm.stop(false).unwrap();
    // The core completed them, not the transport: nothing was asked of it,
    // and it was told the machine stopped.
    assert!(fake.script.lock().dels.is_empty());
    assert_eq!(fake.script.lock().stopped, 1);
    // The state changes as STOPPED is delivered, on the transport's thread.
    assert_eq!(tm.state(), TmState::Stopping);
    assert!(ev.try_recv().is_none(), "no callback inside stop");
    assert_eq!(
        fake.pump(),
        3,
        "three buffer deliveries (STOPPED follows the last one)"
    );
    assert_eq!(tm.state(), TmState::Stopped);
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    for _ in 0..3 {
        let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(e.error(), Some(&NetError::Cancelled));
    }
    // A transport's late completions change nothing.
    let late: Vec<_> = std::mem::take(&mut fake.script.lock().queued);
    for q in late {
        fake.sink().complete(&q, Ok(1));
    }
    assert!(ev.recv_timeout(Duration::from_millis(50)).is_err());
    tm.fini().unwrap();
    drop(cbs);
    dom.fini().unwrap();
}

#[test]
fn stop_with_abort_reaches_a_buffer_whose_del_was_ignored() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    let ep = tm.ep_create("ep:peer").unwrap();
    let b = buf64(&dom, &cbs);
    let t = tm.add_msg_send(b, &ep, 10).unwrap();
    let q = fake.script.lock().queued.pop().unwrap();
    assert!(fake.sink().begin_use(&q));
    assert!(tm.del(t).unwrap());
    assert!(!tm.del(t).unwrap(), "a second del is a no-op");
    // A transport that ignored the del: the stop asks again.
    tm.stop(true).unwrap();
    let reasons: Vec<DelReason> = fake.script.lock().dels.iter().map(|d| d.1).collect();
    assert_eq!(reasons, [DelReason::Cancel, DelReason::Stop]);
    assert_eq!(tm.state(), TmState::Stopping);
    fake.sink().complete(&q, Err(NetError::Cancelled));
    fake.pump();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(e.error(), Some(&NetError::Cancelled));
    drop((e, ep, q));
    fake.script.lock().dels.clear();
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn timeouts_on_a_manual_clock_reach_idle_and_in_flight_buffers() {
    let fake = Fake::new(Caps::new(1).with_timeouts());
    let manual = Clock::manual();
    let dom =
        Domain::with_config(&fake, DomainConfig::default().with_clock(manual.clock())).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    let (cbs, ev) = event_channel(8);
    // Before start: a receive buffer times out in INITIALIZED too.
    let mut b = buf64(&dom, &cbs);
    b.set_timeout(Some(manual.now() + Duration::from_secs(1)));
    tm.add_msg_recv(b, RecvParams::default()).unwrap();
    assert_eq!(
        tm.next_deadline(),
        Some(manual.now() + Duration::from_secs(1))
    );
    manual.advance(Duration::from_millis(999));
    assert_eq!(fake.pump(), 0);
    manual.advance(Duration::from_millis(1));
    assert_eq!(fake.pump(), 1);
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(e.error(), Some(&NetError::TimedOut));
    drop(e);
    assert_eq!(tm.next_deadline(), None);
    // In flight and already deleted: the timeout still reaches it.
    tm.start("ep:me").unwrap();
    fake.sink().post_started("ep:me");
    let ep = tm.ep_create("ep:peer").unwrap();
    let mut b = buf64(&dom, &cbs);
    b.set_timeout(Some(manual.now() + Duration::from_secs(2)));
    let t = tm.add_msg_send(b, &ep, 8).unwrap();
    let q = fake.script.lock().queued.pop().unwrap();
    assert!(fake.sink().begin_use(&q));
    assert!(tm.del(t).unwrap());
    manual.advance(Duration::from_secs(3));
    let reasons: Vec<DelReason> = fake.script.lock().dels.drain(..).map(|d| d.1).collect();
    assert_eq!(reasons, [DelReason::Cancel, DelReason::Timeout]);
    fake.sink().complete(&q, Err(NetError::Cancelled));
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(e.error(), Some(&NetError::TimedOut));
    drop((e, ep, q));
    shutdown(&fake, tm, dom);
}

#[test]
fn sync_delivery_holds_buffer_events_only() {
    let fake = Fake::new(Caps::new(1).with_sync_delivery());
    let dom = Domain::new(&fake).unwrap();
    let (cb, tm_events) = tm_event_channel(8);
    let tm = dom.tm_init(cb).unwrap();
    tm.set_sync_delivery().unwrap();
    tm.start("ep:me").unwrap();
    fake.sink().post_started("ep:me");
    assert!(
        matches!(
            tm_events.try_recv().map(|e| e.kind),
            Some(TmEventKind::StateChange {
                state: TmState::Started,
                ..
            })
        ),
        "STARTED is delivered at once"
    );
    let (cbs, ev) = event_channel(8);
    let b = buf64(&dom, &cbs);
    tm.add_msg_recv(b, RecvParams::default()).unwrap();
    tm.stop(true).unwrap();
    fake.pump();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    assert!(
        matches!(
            tm_events.try_recv().map(|e| e.kind),
            Some(TmEventKind::StateChange {
                state: TmState::Stopped,
                ..
            })
        ),
        "STOPPED is delivered without deliver_all"
    );
    assert!(ev.try_recv().is_none(), "the buffer event waits");
    assert!(tm.events_pending());
    assert_eq!(tm.deliver_all().unwrap(), 1);
    assert_eq!(
        ev.try_recv().and_then(|e| e.error().cloned()),
        Some(NetError::Cancelled)
    );
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn late_started_never_resurrects() {
    let fake = Fake::new(Caps::new(1));
    let dom = Domain::new(&fake).unwrap();
    let (cb, events) = tm_event_channel(8);
    let tm = dom.tm_init(cb).unwrap();
    tm.start("ep:me").unwrap();
    tm.stop(false).unwrap();
    fake.sink().post_started("ep:me");
    assert_eq!(tm.state(), TmState::Stopping);
    assert_eq!(fake.pump(), 1);
    assert_eq!(tm.state(), TmState::Stopped);
    fake.sink().post_started("ep:me");
    assert_eq!(tm.state(), TmState::Stopped);
    let kinds: Vec<TmEventKind> = std::iter::from_fn(|| events.try_recv())
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds.len(), 1, "{kinds:?}");
    assert!(matches!(
        kinds[0],
        TmEventKind::StateChange {
            state: TmState::Stopped,
            ..
        }
    ));
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn synchronous_start_failure_fails_the_tm_and_cancels_queued_receives() {
    let fake = Fake::new(Caps::new(1));
    let dom = Domain::new(&fake).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    let (cbs, ev) = event_channel(4);
    let b = buf64(&dom, &cbs);
    tm.add_msg_recv(b, RecvParams::default()).unwrap();
    assert!(matches!(
        tm.start("bad"),
        Err(NetError::InvalidAddress { .. })
    ));
    assert_eq!(tm.state(), TmState::Failed);
    fake.pump();
    assert_eq!(
        ev.recv_timeout(Duration::from_secs(5)).unwrap().error(),
        Some(&NetError::Cancelled)
    );
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn panicking_callback_does_not_lose_the_machine() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let cbs = Arc::new(BufferCallbacks::new().on(QueueType::MsgRecv, move |_, _| {
        if c2.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("application bug");
        }
    }));
    for _ in 0..2 {
        let b = buf64(&dom, &cbs);
        tm.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    let qs: Vec<_> = std::mem::take(&mut fake.script.lock().queued);
    for q in &qs {
        fake.sink().complete(q, Err(NetError::Cancelled));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        dom.buffer_count(),
        0,
        "the panicking callback's buffer was released"
    );
    drop(qs);
    shutdown(&fake, tm, dom);
}

/// Messages from `senders` distinct peers, twice round; returns how many
/// end points the core created (addresses parsed) for them.
fn parses_for_senders(cfg: DomainConfig, senders: usize) -> usize {
    let fake = Fake::new(Caps::new(1));
    let dom = Domain::with_config(&fake, cfg).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("ep:me").unwrap();
    fake.sink().post_started("ep:me");
    let (cbs, ev) = event_channel(4);
    let before = fake.script.lock().parsed;
    for round in 0..2 {
        for i in 0..senders {
            tm.add_msg_recv(buf64(&dom, &cbs), RecvParams::default())
                .unwrap();
            let claim = fake.sink().claim_recv(5).unwrap();
            fake.sink().post_msg(claim, 5, &format!("ep:{i}"));
            let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(e.is_ok(), "round {round} sender {i}: {e:?}");
        }
    }
    let parsed = fake.script.lock().parsed - before;
    shutdown(&fake, tm, dom);
    parsed
}

#[test]
fn senders_stay_cached_up_to_the_configured_size() {
    // 300 clients in turn: by default each end point is made once.
    assert_eq!(parses_for_senders(DomainConfig::default(), 300), 300);
    // A cache of 10 cannot hold them: every message makes one again.
    assert_eq!(
        parses_for_senders(DomainConfig::default().with_sender_cache(10), 300),
        600
    );
}

#[test]
fn message_from_an_unparseable_sender_fails_that_message() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(4);
    let b = buf64(&dom, &cbs);
    tm.add_msg_recv(b, RecvParams::default()).unwrap();
    let claim = fake.sink().claim_recv(5).unwrap();
    fake.sink().post_msg(claim, 5, "garbage");
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(matches!(e.error(), Some(NetError::Protocol(_))), "{e:?}");
    assert!(e.sender().is_none());
    drop(e);
    shutdown(&fake, tm, dom);
}

#[test]
fn descriptors_carry_transport_extra_bytes_and_identity() {
    let fake = Fake::new(Caps::new(0xabcd));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(4);
    fake.script.lock().extra = b"rkey".to_vec();
    let peer = tm.ep_create("ep:peer").unwrap();
    let b = dom
        .register(BufVec::new(1, 100))
        .unwrap()
        .with_callbacks(cbs);
    let (t, d) = tm.add_passive_send(b, 60, Some(&peer)).unwrap();
    let f = d.decode().unwrap();
    assert_eq!(f.transport_id, 0xabcd);
    assert_eq!(f.queue, QueueType::PassiveBulkSend);
    assert_eq!(f.len, 60);
    assert_eq!(f.token, t.raw());
    assert_eq!(f.owner, "ep:me");
    assert_eq!(f.actor.as_deref(), Some("ep:peer"));
    assert_eq!(f.extra, b"rkey");
    // The passive side's checks, as a transport calls them.
    let sink = fake.sink();
    let e = sink
        .claim_passive(&f, "ep:peer", QueueType::ActiveBulkRecv, 10)
        .unwrap_err();
    assert!(matches!(e.error, NetError::TooBig(_)));
    // The refusal is the requester's: the passive buffer stays queued and
    // usable, and its machine is told through an error event.
    assert!(e.notice.is_pending());
    e.notice.run();
    assert_eq!(tm.rejected_requests(), 1);
    assert_eq!(tm.queued(), 1);
    assert!(ev.try_recv().is_none());
    let ok = sink
        .claim_passive(&f, "ep:peer", QueueType::ActiveBulkRecv, 60)
        .unwrap();
    assert_eq!(ok.len, 60);
    sink.complete(&ok.buf, Ok(60));
    let pe = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(pe.is_ok());
    drop((ok, peer, pe));
    shutdown(&fake, tm, dom);
}

#[test]
fn public_types_are_send_and_sync_as_documented() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Domain>();
    send_sync::<colibri_net::TransferMachine>();
    send_sync::<colibri_net::TmHandle>();
    send_sync::<colibri_net::NetBuffer>();
    send_sync::<colibri_net::EndPoint>();
    send_sync::<colibri_net::NetBufDesc>();
    send_sync::<BufferCallbacks>();
    send_sync::<TmSink>();
    send_sync::<QueuedBuf>();
    send::<colibri_net::BufferEvent>();
    send::<Delivery>();
    send::<colibri_net::AddError>();
}

#[test]
fn try_claim_recv_has_no_effect_when_it_fails() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(4);
    let sink = fake.sink();
    assert!(sink.try_claim_recv(10).is_none());
    assert_eq!(tm.no_buffer_drops(), 0, "not counted as a loss");
    assert_eq!(tm.stats(QueueType::MsgRecv, false).f_events, 0);
    // A buffer too small is not failed either.
    tm.add_msg_recv(buf64(&dom, &cbs), RecvParams::default())
        .unwrap();
    assert!(sink.try_claim_recv(100).is_none());
    assert_eq!(tm.queued(), 1);
    assert!(ev.try_recv().is_none());
    let claim = sink.try_claim_recv(10).expect("room for 10 bytes");
    sink.post_msg(claim, 10, "ep:peer");
    assert!(ev.recv_timeout(Duration::from_secs(5)).unwrap().is_ok());
    shutdown(&fake, tm, dom);
}

/// A buffer leaves the claim list when its last message is claimed and
/// comes back when that claim is released (a message that failed on its
/// way in): the next message lands in it again, before younger buffers.
#[test]
fn a_released_last_claim_reopens_its_buffer() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    let sink = fake.sink();
    for _ in 0..2 {
        tm.add_msg_recv(buf64(&dom, &cbs), RecvParams::default())
            .unwrap();
    }
    let first = sink.claim_recv(10).unwrap();
    let second = sink.claim_recv(10).unwrap();
    assert!(
        sink.try_claim_recv(10).is_none(),
        "both buffers closed by their one message"
    );
    let first_buf = first.buf.clone();
    sink.release_recv(first);
    fake.pump();
    let again = sink
        .try_claim_recv(10)
        .expect("the released buffer reopened");
    assert_eq!(
        again.buf.token(),
        first_buf.token(),
        "the reopened buffer first"
    );
    sink.post_msg(again, 10, "ep:a");
    sink.post_msg(second, 10, "ep:b");
    for _ in 0..2 {
        let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(e.is_ok() && e.is_final());
    }
    assert!(sink.try_claim_recv(10).is_none());
    assert_eq!(tm.queued(), 0);
    shutdown(&fake, tm, dom);
}

/// A network that owns queued buffers (`Caps::network_owned`, LNet): the
/// core hands even idle buffers' cancellations to the transport, which
/// completes them; placed messages land where the network put them, and
/// only the transport's final report ends a receive buffer, even while it
/// is being cancelled.
#[test]
fn network_owned_buffers_are_ended_by_the_transport() {
    let fake = Fake::new(Caps::new(1).with_multi_message().with_network_owned());
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(16);
    let t = tm
        .add_msg_recv(
            dom.register(BufVec::new(1, 100))
                .unwrap()
                .with_callbacks(Arc::clone(&cbs)),
            RecvParams::multi(10, 5),
        )
        .unwrap();
    let q = fake.script.lock().queued.pop().unwrap();
    let sink = fake.sink();
    // Two messages where the network placed them (not where the core
    // would have: at 40, then 0).
    let c = sink.claim_recv_placed(&q, 40, 8, false).unwrap();
    sink.post_msg(c, 8, "ep:a");
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((e.offset(), e.length(), e.is_final()), (40, 8, false));
    drop(e);
    // A cancel of the (idle) buffer goes to the transport, not completed
    // by the core.
    assert!(tm.del(t).unwrap());
    fake.pump();
    assert!(ev.recv_timeout(Duration::from_millis(50)).is_err());
    assert_eq!(fake.script.lock().dels.len(), 1);
    // A message the network placed before it let go still arrives, and is
    // not final: the network says which one is.
    let c = sink.claim_recv_placed(&q, 0, 4, false).unwrap();
    sink.post_msg(c, 4, "ep:b");
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((e.offset(), e.is_final()), (0, false));
    drop(e);
    assert!(
        sink.claim_recv_placed(&q, 96, 8, false).is_none(),
        "out of bounds"
    );
    // The network let go: the transport completes it, once.
    fake.script.lock().dels.clear();
    sink.complete(&q, Err(NetError::Cancelled));
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(e.is_final() && e.error().unwrap().is_cancelled());
    assert_eq!(e.msgs_received(), 2);
    drop(e);
    assert!(sink.claim_recv_placed(&q, 0, 4, true).is_none(), "gone");
    // A message no buffer took, counted as the core counts its own.
    let notice = sink.count_no_buffers(32);
    assert!(notice.is_pending());
    drop(notice);
    assert_eq!(tm.no_buffer_drops(), 1);
    assert_eq!(tm.stats(QueueType::MsgRecv, false).f_events, 2);
    // A passive buffer never used is also the transport's to end at stop.
    let (_, _d) = tm.add_passive_recv(buf64(&dom, &cbs), None).unwrap();
    tm.stop(false).unwrap();
    let dels: Vec<_> = std::mem::take(&mut fake.script.lock().dels);
    assert_eq!(dels.len(), 1, "the idle passive buffer went to buf_del");
    assert_eq!(dels[0].1, DelReason::Stop);
    sink.complete(&dels[0].0, Err(NetError::Cancelled));
    fake.pump();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(e.is_final());
    drop(e);
    tm.fini().unwrap();
    dom.fini().unwrap();
}

#[test]
fn recycled_slots_keep_nothing_alive_and_stale_tokens_miss() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    let ep = tm.ep_create("ep:peer").unwrap();
    let sink = fake.sink();
    let mut buf = Some(buf64(&dom, &cbs));
    let mut old = Vec::new();
    // Many adds in turn: after the first, each fills the slot the previous
    // one left (no other reference to it remains).
    for i in 0..100usize {
        let t = tm.add_msg_send(buf.take().unwrap(), &ep, 10).unwrap();
        let q = fake.script.lock().queued.pop().unwrap();
        assert_eq!(q.token(), t);
        assert_eq!(q.length(), 10);
        assert_eq!(q.end_point(), Some(ep.clone()));
        sink.complete(&q, Ok(10 + (i % 3)));
        drop(q);
        let mut e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(e.length(), 10 + (i % 3));
        assert!(
            ev.recv_timeout(Duration::from_millis(1)).is_err(),
            "exactly one completion per add"
        );
        buf = Some(e.take_buffer().unwrap());
        // A finished slot refers to no callbacks: only this test and the
        // buffer hold them.
        assert_eq!(Arc::strong_count(&cbs), 2, "add {i}");
        for o in &old {
            assert!(sink.lookup(*o).is_none(), "a stale token finds nothing");
            assert!(!tm.del(*o).unwrap());
        }
        old.push(t);
    }
    let st = tm.stats(QueueType::MsgSend, false);
    assert_eq!((st.adds, st.s_events, st.f_events), (100, 100, 0));
    // A receive buffer in a recycled slot starts with no reservation.
    let t = tm
        .add_msg_recv(buf.take().unwrap(), RecvParams::default())
        .unwrap();
    let claim = sink.claim_recv(64).unwrap();
    assert_eq!((claim.buf.token(), claim.offset), (t, 0));
    sink.post_msg(claim, 5, "ep:peer");
    let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((e.length(), e.offset()), (5, 0));
    drop((e, ep));
    shutdown(&fake, tm, dom);
}

/// A stream of losses that nobody reads fills a machine's event channel:
/// further error events are dropped and counted, so the transport thread
/// that runs the callback (which may serve other machines) never waits
/// on it; a state change still gets in, in place of the oldest event.
#[test]
fn a_full_event_channel_drops_errors_not_state_changes() {
    let fake = Fake::new(Caps::new(1));
    let dom = Domain::new(&fake).unwrap();
    let (cb, events) = tm_event_channel(2);
    let tm = dom.tm_init(cb).unwrap();
    tm.start("ep:me").unwrap();
    fake.sink().post_started("ep:me");
    // STARTED and one loss fill the channel; nine more losses, each
    // delivered before the next (no coalescing), are dropped.
    for _ in 0..10 {
        fake.sink().count_no_buffers(10).run();
    }
    assert_eq!(events.dropped(), 9);
    let kinds: Vec<TmEventKind> = std::iter::from_fn(|| events.try_recv())
        .map(|e| e.kind)
        .collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [
                TmEventKind::StateChange {
                    state: TmState::Started,
                    ..
                },
                TmEventKind::Error(NetError::NoBuffers)
            ]
        ),
        "{kinds:?}"
    );
    // STARTED holds the machine's end point.
    drop(kinds);
    for _ in 0..3 {
        fake.sink().count_no_buffers(10).run();
    }
    // Room for two: the third is dropped. Nobody reads: STOPPED makes
    // room by dropping the oldest loss.
    assert_eq!(events.dropped(), 10);
    tm.stop(true).unwrap();
    fake.pump();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    assert_eq!(events.dropped(), 11);
    let kinds: Vec<TmEventKind> = std::iter::from_fn(|| events.try_recv())
        .map(|e| e.kind)
        .collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [
                TmEventKind::Error(NetError::NoBuffers),
                TmEventKind::StateChange {
                    state: TmState::Stopped,
                    ..
                }
            ]
        ),
        "{kinds:?}"
    );
    tm.fini().unwrap();
    dom.fini().unwrap();
}
