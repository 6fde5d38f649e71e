//! The core against a scriptable fake transport: the test plays the
//! transport's part (posting STARTED, completions, messages) through the
//! sink, to check what the core guarantees whatever the transport does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colibri_net::xprt::{
    Caps, DelReason, EpAddr, Limits, QueuedBuf, TmSink, Transport, XprtDomain, XprtTm,
};
use colibri_net::{
    BufVec, BufferCallbacks, Domain, NetError, QueueType, RecvParams, Result, TmEventKind, TmId,
    TmState, event_channel, ignore_tm_events, tm_event_channel,
};
use parking_lot::Mutex;

#[derive(Debug, Default)]
struct Script {
    sink: Option<TmSink>,
    queued: Vec<QueuedBuf>,
    dels: Vec<(QueuedBuf, DelReason)>,
    fail_add: bool,
    extra: Vec<u8>,
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
        self.script.lock().sink.clone().expect("started")
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
    fn tm_init(&self, _tm: TmId) -> Result<Box<dyn XprtTm>> {
        Ok(Box::new(self.clone()))
    }
}

impl XprtTm for Fake {
    fn start(&self, sink: &TmSink, addr: &str) -> Result<()> {
        if addr == "bad" {
            return Err(NetError::InvalidAddress {
                addr: addr.into(),
                reason: "fake".into(),
            });
        }
        self.script.lock().sink = Some(sink.clone());
        Ok(())
    }
    fn stop(&self, sink: &TmSink, _abort: bool) -> Result<()> {
        self.script.lock().sink = Some(sink.clone());
        Ok(())
    }
    fn fini(&self) {}
    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
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
    fn buf_add(&self, _sink: &TmSink, buf: &QueuedBuf) -> Result<()> {
        let mut s = self.script.lock();
        if s.fail_add {
            return Err(NetError::Busy("fake refuses".into()));
        }
        s.queued.push(buf.clone());
        Ok(())
    }
    fn buf_del(&self, _sink: &TmSink, buf: &QueuedBuf, reason: DelReason) {
        self.script.lock().dels.push((buf.clone(), reason));
    }
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
    // Complete whatever the core asked to delete, as a transport would.
    let dels: Vec<_> = std::mem::take(&mut fake.script.lock().dels);
    for (q, _) in dels {
        fake.sink().complete(&q, Err(NetError::Cancelled));
    }
    fake.sink().post_stopped();
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
    let mut b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs.clone());
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
    let b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs);
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
    let b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs);
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
        ev.recv_timeout(Duration::from_millis(50)).is_none(),
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
fn stopped_with_buffers_left_completes_them_once() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(8);
    for _ in 0..3 {
        let b = dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(cbs.clone());
        tm.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    tm.stop(false).unwrap();
    // A buggy transport: posts STOPPED without completing anything.
    fake.sink().post_stopped();
    tm.wait_stopped(Duration::from_secs(5)).unwrap();
    for _ in 0..3 {
        let e = ev.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(e.error(), Some(&NetError::Cancelled));
    }
    // Its late completions change nothing.
    let late: Vec<_> = std::mem::take(&mut fake.script.lock().queued);
    for q in late {
        fake.sink().complete(&q, Ok(1));
    }
    assert!(ev.recv_timeout(Duration::from_millis(50)).is_none());
    tm.fini().unwrap();
    drop(cbs);
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
    fake.sink().post_stopped();
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
    let b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs);
    tm.add_msg_recv(b, RecvParams::default()).unwrap();
    assert!(matches!(
        tm.start("bad"),
        Err(NetError::InvalidAddress { .. })
    ));
    assert_eq!(tm.state(), TmState::Failed);
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
        let b = dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(cbs.clone());
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

#[test]
fn message_from_an_unparseable_sender_fails_that_message() {
    let fake = Fake::new(Caps::new(1));
    let (dom, tm) = started(&fake);
    let (cbs, ev) = event_channel(4);
    let b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs);
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
    let victim = e.victim.expect("sizes fail the passive buffer too");
    sink.complete(&victim, Err(e.error));
    let pe = ev.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(matches!(pe.error(), Some(NetError::TooBig(_))));
    drop((victim, peer, pe));
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
    send::<colibri_net::xprt::Delivery>();
    send::<colibri_net::AddError>();
}
