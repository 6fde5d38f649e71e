//! End-to-end tests of the RPC layer over the in-memory transport.
//!
//! Every test is bounded in time (calls carry timeouts, waits have
//! deadlines) and checks that both machines hand their domains back with
//! every buffer deregistered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colibri_bulk_mem::MemTransport;
use colibri_net::{
    BufVec, Domain, QueueType, RecvParams, TmState, event_channel, ignore_tm_events,
};
use colibri_rpc::wire::{self, ItemHeader, ItemKind};
use colibri_rpc::{
    BulkArg, BulkKind, CallOpts, ReplyHandle, RpcConfig, RpcError, RpcMachine, block_on,
};
use parking_lot::Mutex;

const ECHO: u32 = 1;
const COUNT: u32 = 2;
const SLOW: u32 = 3;
const NEVER: u32 = 4;
const READ: u32 = 5;
const WRITE: u32 = 6;

/// A machine at a fresh address: tests run in parallel in one process, and
/// a stopped machine's address must not be taken over by another test's
/// machine while its peers still talk to it.
fn machine(cfg: RpcConfig) -> RpcMachine {
    static SERVICE: AtomicU64 = AtomicU64::new(100);
    let addr = format!("127.0.0.1:0:{}", SERVICE.fetch_add(1, Ordering::Relaxed));
    RpcMachine::start_on(&MemTransport::default(), &addr, cfg).expect("start")
}

fn finish(m: RpcMachine) {
    let dom = m.shutdown().expect("shutdown");
    assert_eq!(dom.buffer_count(), 0, "buffers left registered");
    dom.fini().expect("domain fini");
}

fn echo_server(cfg: RpcConfig) -> RpcMachine {
    let s = machine(cfg);
    s.on(ECHO, |req, reply| {
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    s
}

#[test]
fn request_reply_and_sizes() {
    let server = echo_server(RpcConfig::default());
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    assert_eq!(s.call(ECHO, b"hello").unwrap(), b"hello");
    assert_eq!(s.call(ECHO, b"").unwrap(), b"");
    let max = client.max_payload();
    let big: Vec<u8> = (0..max).map(|i| i as u8).collect();
    assert_eq!(s.call(ECHO, &big).unwrap(), big);
    let too_big = vec![0u8; max + 1];
    assert!(matches!(
        s.call(ECHO, &too_big),
        Err(RpcError::TooBig { .. })
    ));
    assert!(matches!(s.call(77, b"x"), Err(RpcError::UnknownOpcode(77))));
    let st = client.stats();
    assert_eq!(st.calls, 4);
    assert_eq!(st.calls_ok, 3);
    assert_eq!(st.calls_failed, 1);
    assert_eq!(server.stats().unknown_opcodes, 1);
    assert_eq!(s.stats().replies, 4);
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn async_calls_callback_poll_future() {
    let server = echo_server(RpcConfig::default());
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();

    let (tx, rx) = crossbeam_like();
    s.start(ECHO, b"cb", CallOpts::new())
        .unwrap()
        .on_complete(move |r| tx.put(r));
    assert_eq!(rx.take(Duration::from_secs(10)).unwrap().unwrap(), b"cb");

    let mut h = s.start(ECHO, b"poll", CallOpts::new()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        if let Some(r) = h.try_result() {
            break r;
        }
        assert!(Instant::now() < deadline, "no reply");
        std::thread::yield_now();
    };
    assert_eq!(got.unwrap(), b"poll");
    assert!(matches!(h.wait(), Err(RpcError::ApiMisuse(_))));

    let calls: Vec<_> = (0..10u8)
        .map(|i| s.start(ECHO, &[i], CallOpts::new()).unwrap())
        .collect();
    let out = block_on(async move {
        let mut v = Vec::new();
        for c in calls {
            v.push(c.await.unwrap()[0]);
        }
        v
    });
    assert_eq!(out, (0..10).collect::<Vec<u8>>());
    drop(s);
    finish(client);
    finish(server);
}

/// A one-slot hand-off for callback results.
struct Slot<T>(Arc<(Mutex<Option<T>>, parking_lot::Condvar)>);
impl<T> Slot<T> {
    fn put(&self, v: T) {
        *self.0.0.lock() = Some(v);
        self.0.1.notify_all();
    }
    fn take(&self, d: Duration) -> Option<T> {
        let mut g = self.0.0.lock();
        let end = Instant::now() + d;
        while g.is_none() {
            if self.0.1.wait_until(&mut g, end).timed_out() {
                break;
            }
        }
        g.take()
    }
}
fn crossbeam_like<T>() -> (Slot<T>, Slot<T>) {
    let a = Arc::new((Mutex::new(None), parking_lot::Condvar::new()));
    (Slot(a.clone()), Slot(a))
}

#[test]
fn concurrent_calls_from_many_threads() {
    let server = echo_server(RpcConfig::default());
    let client = machine(RpcConfig::default().with_max_in_flight(4));
    let s = client.session(server.addr()).unwrap();
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..300u32 {
                    let msg = format!("{t}:{i}");
                    let r = s
                        .call_with(
                            ECHO,
                            msg.as_bytes(),
                            CallOpts::new().timeout(Duration::from_secs(20)),
                        )
                        .unwrap();
                    assert_eq!(r, msg.as_bytes());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = client.stats();
    assert_eq!(st.calls_ok, 8 * 300);
    assert_eq!(s.in_flight(), 0);
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn one_way_items_and_batching_preserve_order() {
    let server = machine(RpcConfig::default());
    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    server.on(COUNT, move |req, reply| {
        assert!(reply.is_oneway());
        let n = u32::from_le_bytes(req.payload()[..4].try_into().unwrap());
        sn.lock().push((req.session(), n));
    });
    // Batched: a delay lets items accumulate; 64-byte items.
    let client = machine(RpcConfig::default().with_batch_delay(Duration::from_millis(5)));
    let a = client.session(server.addr()).unwrap();
    let b = client.session(server.addr()).unwrap();
    const N: u32 = 2000;
    for i in 0..N {
        let mut p = [0u8; 64];
        p[..4].copy_from_slice(&i.to_le_bytes());
        a.post(COUNT, &p).unwrap();
        b.post(COUNT, &p).unwrap();
    }
    a.flush(Duration::from_secs(10)).unwrap();
    b.flush(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().len() < 2 * N as usize {
        assert!(
            Instant::now() < deadline,
            "only {} items arrived",
            seen.lock().len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for sess in [a.id(), b.id()] {
        let order: Vec<u32> = seen
            .lock()
            .iter()
            .filter(|(s, _)| *s == sess)
            .map(|x| x.1)
            .collect();
        assert_eq!(order, (0..N).collect::<Vec<_>>(), "per-session order");
    }
    let st = a.stats();
    assert_eq!(st.items_sent, u64::from(N));
    assert!(
        st.msgs_sent * 20 < st.items_sent,
        "batching packed {} items into {} messages",
        st.items_sent,
        st.msgs_sent
    );
    assert!(server.stats().msgs_received < u64::from(N) / 10);
    drop((a, b));
    finish(client);

    // Unbatched: one item per message.
    let client = machine(RpcConfig::default().with_batching(false));
    let c = client.session(server.addr()).unwrap();
    for i in 0..200u32 {
        c.post(COUNT, &i.to_le_bytes()).unwrap();
    }
    c.flush(Duration::from_secs(10)).unwrap();
    let st = c.stats();
    assert_eq!((st.items_sent, st.msgs_sent), (200, 200));
    drop(c);
    finish(client);
    finish(server);
}

#[test]
fn batch_delay_sends_without_a_flush() {
    let server = machine(RpcConfig::default());
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    server.on(COUNT, move |_req, _reply| {
        g.fetch_add(1, Ordering::SeqCst);
    });
    let client = machine(RpcConfig::default().with_batch_delay(Duration::from_millis(100)));
    let s = client.session(server.addr()).unwrap();
    for i in 0..3u32 {
        s.post(COUNT, &i.to_le_bytes()).unwrap();
    }
    // The timer sends them after the delay, in one message.
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.load(Ordering::SeqCst) < 3 {
        assert!(Instant::now() < deadline, "items never sent");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!((s.stats().items_sent, s.stats().msgs_sent), (3, 1));
    // A full message leaves at once, without waiting for the delay.
    let big = vec![0u8; client.max_payload()];
    let t0 = Instant::now();
    s.post(COUNT, &big).unwrap();
    s.post(COUNT, &big).unwrap();
    while got.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    s.flush(Duration::from_secs(10)).unwrap();
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn zero_delay_with_in_flight_limit_still_batches() {
    let server = machine(RpcConfig::default());
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    server.on(COUNT, move |_req, _reply| {
        g.fetch_add(1, Ordering::SeqCst);
    });
    let client = machine(RpcConfig::default().with_max_in_flight(1));
    let s = client.session(server.addr()).unwrap();
    for i in 0..5000u32 {
        s.post(COUNT, &i.to_le_bytes()).unwrap();
    }
    s.flush(Duration::from_secs(10)).unwrap();
    let st = s.stats();
    assert_eq!(st.items_sent, 5000);
    assert!(
        st.msgs_sent < 5000,
        "items queued behind the message in flight share messages"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.load(Ordering::SeqCst) < 5000 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn resend_on_timeout_executes_once() {
    let server = machine(RpcConfig::default());
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    // The first reply comes well after the client's first timeouts.
    server.on(SLOW, move |req, reply| {
        r.fetch_add(1, Ordering::SeqCst);
        let p = req.payload().to_vec();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            reply.ok(&p);
        });
    });
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let opts = CallOpts::new()
        .timeout(Duration::from_millis(80))
        .retries(10);
    assert_eq!(s.call_with(SLOW, b"once", opts).unwrap(), b"once");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(client.stats().resends >= 2);
    assert!(server.stats().duplicates >= 2);

    // A resend arriving after the reply was cached is answered from the
    // cache: make the client miss the reply by a tiny timeout.
    let runs2 = Arc::new(AtomicU64::new(0));
    let r2 = runs2.clone();
    server.on(ECHO, move |req, reply| {
        r2.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    let opts = CallOpts::new()
        .timeout(Duration::from_millis(20))
        .retries(20);
    for i in 0..5u8 {
        assert_eq!(s.call_with(ECHO, &[i], opts).unwrap(), [i]);
    }
    assert_eq!(runs2.load(Ordering::SeqCst), 5);
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn server_that_never_replies_times_out_cleanly() {
    let server = machine(RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let (h, r) = (held.clone(), runs.clone());
    server.on(NEVER, move |_req, reply| {
        r.fetch_add(1, Ordering::SeqCst);
        h.lock().push(reply);
    });
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let t0 = Instant::now();
    let opts = CallOpts::new()
        .timeout(Duration::from_millis(100))
        .retries(2);
    assert_eq!(s.call_with(NEVER, b"", opts), Err(RpcError::TimedOut));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "resends of a request in progress are not run"
    );
    assert_eq!(client.stats().timeouts, 1);
    // A handle dropped without a reply answers NoReply.
    let opts = CallOpts::new().timeout(Duration::from_secs(10));
    let call = s.start(NEVER, b"", opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.lock().len() < 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    held.lock().pop();
    assert_eq!(call.wait(), Err(RpcError::NoReply));
    held.lock().clear();
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn typed_calls() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Add {
        a: i64,
        b: i64,
        note: String,
    }
    let server = machine(RpcConfig::default());
    server.on_typed(ECHO, |q: Add, _req| {
        if q.note == "fail" {
            Err(-5)
        } else {
            Ok((q.a + q.b, q.note.len()))
        }
    });
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let r: (i64, usize) = s
        .call_typed(
            ECHO,
            &Add {
                a: 40,
                b: 2,
                note: "hi".into(),
            },
        )
        .unwrap();
    assert_eq!(r, (42, 2));
    let e = s.call_typed::<_, (i64, usize)>(
        ECHO,
        &Add {
            a: 0,
            b: 0,
            note: "fail".into(),
        },
    );
    assert_eq!(e, Err(RpcError::Remote(-5)));
    // A payload that is not an `Add` gets EINVAL.
    assert_eq!(
        s.call(ECHO, &[0xff]),
        Err(RpcError::Remote(colibri_rpc::STATUS_INVALID))
    );
    drop(s);
    finish(client);
    finish(server);
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn bulk_server() -> RpcMachine {
    let server = machine(RpcConfig::default());
    let h = server.handle();
    // READ: push a pattern (seeded by the payload) into the client's sink.
    server.on(READ, move |req, reply| {
        let Some(d) = req.bulk().first().cloned() else {
            reply.error(-22);
            return;
        };
        let len = d.len as usize;
        let mut buf = h.alloc(len).unwrap();
        buf.bufvec_mut()
            .copy_in(0, &pattern(req.payload()[0], len))
            .unwrap();
        h.bulk_push(&d, buf, len)
            .on_complete(move |done| match done.result {
                Ok(n) => reply.ok(&(n as u64).to_le_bytes()),
                Err(e) => reply.error(e.errno()),
            });
    });
    // WRITE: pull the client's source and reply with a checksum.
    let h = server.handle();
    server.on(WRITE, move |req, reply| {
        let Some(d) = req.bulk().first().cloned() else {
            reply.error(-22);
            return;
        };
        let buf = h.alloc(d.len as usize).unwrap();
        h.bulk_pull(&d, buf)
            .on_complete(move |done| match done.result {
                Ok(n) => {
                    let data = done.buffer.bufvec().to_vec(0, n).unwrap();
                    let sum: u64 = data.iter().map(|&b| u64::from(b)).sum();
                    reply.ok(&sum.to_le_bytes());
                }
                Err(e) => reply.error(e.errno()),
            });
    });
    server
}

#[test]
fn bulk_both_directions() {
    let server = bulk_server();
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    for (i, &len) in [1usize, 4096, 1 << 20].iter().enumerate() {
        // Read: the server writes into our sink.
        let sink = client.alloc(len).unwrap();
        let out = s.call_bulk(READ, &[i as u8], vec![BulkArg::Sink { buf: sink }]);
        let n = u64::from_le_bytes(out.result.unwrap().try_into().unwrap());
        assert_eq!(n as usize, len);
        assert_eq!(out.buffers.len(), 1);
        assert_eq!(out.buffers[0].result, Ok(len));
        assert_eq!(
            out.buffers[0].buffer.bufvec().to_vec(0, len).unwrap(),
            pattern(i as u8, len)
        );

        // Write: the server reads our source.
        let data = pattern(7 + i as u8, len);
        let mut src = client.alloc(len).unwrap();
        src.bufvec_mut().copy_in(0, &data).unwrap();
        let out = s.call_bulk(WRITE, b"", vec![BulkArg::Source { buf: src, len }]);
        let sum = u64::from_le_bytes(out.result.unwrap().try_into().unwrap());
        assert_eq!(sum, data.iter().map(|&b| u64::from(b)).sum::<u64>());
        assert_eq!(out.buffers[0].result, Ok(len));
    }
    // A server that ignores the buffers: they are cancelled after the
    // reply and come back with the outcome.
    server.on(ECHO, |_req, reply| reply.ok(b"ignored"));
    let sink = client.alloc(64).unwrap();
    let out = s.call_bulk(ECHO, b"", vec![BulkArg::Sink { buf: sink }]);
    assert_eq!(out.result.as_deref(), Ok(&b"ignored"[..]));
    assert!(out.buffers[0].result.is_err());
    drop(out);
    // Bulk descriptors are refused when the directions do not match.
    let src = client.alloc(16).unwrap();
    let out = s.call_bulk(READ, &[0], vec![BulkArg::Source { buf: src, len: 16 }]);
    assert!(out.result.is_err());
    assert_eq!(out.buffers.len(), 1);
    assert!(client.stats().bulk_ok >= 6);
    drop((s, out));
    finish(client);
    finish(server);
}

#[test]
fn bulk_async_many_in_flight() {
    let server = bulk_server();
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let calls: Vec<_> = (0..16u8)
        .map(|i| {
            let sink = client.alloc(8192).unwrap();
            s.start_bulk(
                READ,
                &[i],
                vec![BulkArg::Sink { buf: sink }],
                CallOpts::new(),
            )
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let out = block_on(c);
        assert!(out.result.is_ok());
        assert_eq!(
            out.buffers[0].buffer.bufvec().to_vec(0, 8192).unwrap(),
            pattern(i as u8, 8192)
        );
    }
    drop(s);
    finish(client);
    finish(server);
}

#[test]
fn peer_stopped_mid_call() {
    let server = machine(RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    server.on(NEVER, move |_req, reply| h.lock().push(reply));
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let opts = CallOpts::new()
        .timeout(Duration::from_millis(200))
        .retries(50);
    let calls: Vec<_> = (0..20)
        .map(|_| s.start(NEVER, b"", opts).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.lock().len() < 20 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    finish(server);
    held.lock().clear();
    for c in calls {
        let r = c.wait();
        assert!(
            matches!(r, Err(RpcError::Net(colibri_net::NetError::Unreachable(_)))),
            "{r:?}"
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "failed at the first resend, not the last"
    );
    // New calls to the stopped peer fail at once.
    assert!(matches!(
        s.call_with(ECHO, b"", CallOpts::new().timeout(Duration::from_secs(10))),
        Err(RpcError::Net(_))
    ));
    drop(s);
    finish(client);
}

#[test]
fn client_shutdown_fails_calls_in_flight() {
    let server = machine(RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    server.on(NEVER, move |_req, reply| h.lock().push(reply));
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let calls: Vec<_> = (0..5)
        .map(|_| s.start(NEVER, b"", CallOpts::new()).unwrap())
        .collect();
    let sink = client.alloc(4096).unwrap();
    let bulk = s.start_bulk(
        NEVER,
        b"",
        vec![BulkArg::Sink { buf: sink }],
        CallOpts::new(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.lock().len() < 6 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let dom = client.shutdown().unwrap();
    for c in calls {
        assert_eq!(c.wait(), Err(RpcError::Shutdown));
    }
    let out = bulk.wait();
    assert_eq!(out.result, Err(RpcError::Shutdown));
    assert_eq!(out.buffers.len(), 1);
    drop(out);
    assert!(matches!(s.call(ECHO, b""), Err(RpcError::Shutdown)));
    drop(s);
    assert_eq!(dom.buffer_count(), 0);
    held.lock().clear();
    finish(server);
}

/// A bare transfer machine that speaks the wire format by hand.
struct Raw {
    dom: Domain,
    tm: colibri_net::TransferMachine,
    events: colibri_net::EventReceiver,
    cbs: Arc<colibri_net::BufferCallbacks>,
}

impl Raw {
    fn new() -> Self {
        let dom = Domain::new(&MemTransport::default()).unwrap();
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        let (cbs, events) = event_channel(64);
        tm.start("127.0.0.1:0:9").unwrap();
        tm.wait_for_state(TmState::Started, Duration::from_secs(5))
            .unwrap();
        let r = Self {
            dom,
            tm,
            events,
            cbs,
        };
        for _ in 0..4 {
            let b = r
                .dom
                .register(BufVec::new(1, 64 << 10))
                .unwrap()
                .with_callbacks(r.cbs.clone());
            r.tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
        r
    }

    fn send(&self, to: &str, bytes: &[u8]) {
        let ep = self.tm.ep_create(to).unwrap();
        let mut b = self
            .dom
            .register(BufVec::from_bytes(bytes))
            .unwrap()
            .with_callbacks(self.cbs.clone());
        b.bufvec_mut().copy_in(0, bytes).unwrap();
        self.tm.add_msg_send(b, &ep, bytes.len()).unwrap();
    }

    /// The next received message's items (send completions skipped).
    fn recv(&self, wait: Duration) -> Option<Vec<(ItemHeader, Vec<u8>)>> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let mut ev = self.events.recv_timeout(left)?;
            if ev.queue() == QueueType::MsgRecv {
                let msg = ev.message().unwrap();
                if let Some(b) = ev.take_buffer() {
                    self.tm.add_msg_recv(b, RecvParams::default()).unwrap();
                }
                let items = wire::decode_message(&msg).unwrap();
                return Some(
                    items
                        .into_iter()
                        .map(|i| (i.header, i.payload.to_vec()))
                        .collect(),
                );
            }
        }
    }

    fn close(self) {
        self.tm.stop(true).unwrap();
        self.tm.wait_stopped(Duration::from_secs(10)).unwrap();
        while self.events.try_recv().is_some() {}
        self.tm.fini().unwrap();
        assert_eq!(self.dom.buffer_count(), 0);
    }
}

fn request(session: u64, xid: u64, opcode: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut it = Vec::new();
    let h = ItemHeader {
        kind: ItemKind::Request,
        flags,
        opcode,
        session,
        xid,
        status: 0,
    };
    wire::encode_item(&mut it, &h, payload, &[]).unwrap();
    it
}

#[test]
fn malformed_input_gets_error_replies_never_a_crash() {
    let server = echo_server(RpcConfig::default());
    let raw = Raw::new();
    let to = server.addr().to_string();
    // Garbage: no request to answer; counted.
    raw.send(&to, b"definitely not an RPC message");
    raw.send(&to, &[0u8; 100]);
    assert!(raw.recv(Duration::from_millis(200)).is_none());
    // A request with a lying payload length: an EPROTO reply.
    let mut it = request(5, 1, ECHO, 0, b"abc");
    it[28..32].copy_from_slice(&1000u32.to_le_bytes());
    raw.send(&to, &wire::encode_message(&[&it]));
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(got[0].0.xid, 1);
    assert_eq!(got[0].0.status, colibri_rpc::STATUS_PROTOCOL);
    // Unknown opcode: ENOSYS; valid request: echoed. One message, three
    // items, the last one malformed (unknown kind): two replies.
    let a = request(5, 2, 99, 0, b"");
    let b = request(5, 3, ECHO, 0, b"ok");
    let mut c = request(5, 4, ECHO, 0, b"");
    c[0] = 9;
    raw.send(&to, &wire::encode_message(&[&a, &b, &c]));
    let mut replies = Vec::new();
    while replies.len() < 2 {
        replies.extend(raw.recv(Duration::from_secs(10)).unwrap());
    }
    replies.sort_by_key(|r| r.0.xid);
    assert_eq!(replies[0].0.status, colibri_rpc::STATUS_UNKNOWN_OPCODE);
    assert_eq!(
        (replies[1].0.status, replies[1].1.as_slice()),
        (0, &b"ok"[..])
    );
    let st = server.stats();
    assert!(st.protocol_errors >= 4, "{st:?}");
    assert!(st.unknown_opcodes >= 1);
    // The server still serves.
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    assert_eq!(s.call(ECHO, b"alive").unwrap(), b"alive");
    drop(s);
    finish(client);
    raw.close();
    finish(server);
}

#[test]
fn reply_cache_is_bounded_and_never_reexecutes() {
    let server = machine(RpcConfig::default().with_reply_cache(2));
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    server.on(COUNT, move |req, reply| {
        r.fetch_add(1, Ordering::SeqCst);
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    let raw = Raw::new();
    let to = server.addr().to_string();
    let sid = 0x5e55;
    for xid in 1..=3u64 {
        raw.send(
            &to,
            &wire::encode_message(&[&request(sid, xid, COUNT, 0, &[xid as u8])]),
        );
        let got = raw.recv(Duration::from_secs(10)).unwrap();
        assert_eq!((got[0].0.xid, got[0].0.status), (xid, 0));
    }
    // xid 3 is cached: a resend is answered from the cache.
    raw.send(
        &to,
        &wire::encode_message(&[&request(sid, 3, COUNT, wire::FLAG_RESEND, &[3])]),
    );
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!((got[0].0.status, got[0].1.as_slice()), (0, &[3u8][..]));
    // xid 1 was evicted (cache of 2): a resend is refused as stale.
    raw.send(
        &to,
        &wire::encode_message(&[&request(sid, 1, COUNT, wire::FLAG_RESEND, &[1])]),
    );
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(got[0].0.status, colibri_rpc::STATUS_STALE);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let st = server.stats();
    assert_eq!((st.duplicates, st.stale), (1, 1));
    raw.close();
    finish(server);
}

#[test]
fn bulk_kinds_are_checked_on_the_server() {
    // Pull from a sink and push into a source are refused locally.
    let server = machine(RpcConfig::default());
    let h = server.handle();
    server.on(READ, move |req, reply| {
        let d = req.bulk()[0].clone();
        assert_eq!(d.kind, BulkKind::Sink);
        let buf = h.alloc(16).unwrap();
        let done = h.bulk_pull(&d, buf).wait();
        assert!(matches!(done.result, Err(RpcError::InvalidArgument(_))));
        reply.error(-1);
    });
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let sink = client.alloc(16).unwrap();
    let out = s.call_bulk(READ, b"", vec![BulkArg::Sink { buf: sink }]);
    assert_eq!(out.result, Err(RpcError::Remote(-1)));
    drop((s, out));
    finish(client);
    finish(server);
}

#[test]
fn public_types_are_send_and_sync() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RpcMachine>();
    send_sync::<colibri_rpc::RpcHandle>();
    send_sync::<colibri_rpc::Session>();
    send_sync::<RpcError>();
    send_sync::<colibri_rpc::Request>();
    send_sync::<ReplyHandle>();
    send_sync::<colibri_rpc::CallHandle>();
    send_sync::<colibri_rpc::BulkCall>();
    send_sync::<colibri_rpc::BulkOp>();
    send::<colibri_rpc::BulkOutcome>();
    send::<colibri_rpc::BulkDone>();
    send_sync::<RpcConfig>();
    send_sync::<colibri_rpc::RpcStats>();
}

#[test]
fn several_transport_workers() {
    // Three worker threads per transfer machine: callbacks of different
    // messages run concurrently and messages may be handled out of order
    // (so no order check here), but every call and item completes.
    let xprt = MemTransport::new(colibri_bulk_mem::MemConfig {
        workers: 3,
        ..Default::default()
    });
    let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:901", RpcConfig::default()).unwrap();
    server.on(ECHO, |req, reply| {
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    server.on(COUNT, move |_req, _reply| {
        g.fetch_add(1, Ordering::SeqCst);
    });
    let h = server.handle();
    server.on(READ, move |req, reply| {
        let d = req.bulk()[0].clone();
        let len = d.len as usize;
        let mut buf = h.alloc(len).unwrap();
        buf.bufvec_mut()
            .copy_in(0, &pattern(req.payload()[0], len))
            .unwrap();
        h.bulk_push(&d, buf, len)
            .on_complete(move |done| match done.result {
                Ok(_) => reply.ok(b""),
                Err(e) => reply.error(e.errno()),
            });
    });
    let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:902", RpcConfig::default()).unwrap();
    let s = client.session(server.addr()).unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let s = s.clone();
            let c = client.handle();
            std::thread::spawn(move || {
                for i in 0..100u8 {
                    assert_eq!(s.call(ECHO, &[t, i]).unwrap(), [t, i]);
                    s.post(COUNT, &[t]).unwrap();
                    if i % 10 == 0 {
                        let sink = c.alloc(4096).unwrap();
                        let out = s.call_bulk(READ, &[i], vec![BulkArg::Sink { buf: sink }]);
                        assert!(out.result.is_ok());
                        let data = out.buffers[0].buffer.bufvec().to_vec(0, 4096).unwrap();
                        assert_eq!(data, pattern(i, 4096));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    s.flush(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.load(Ordering::SeqCst) < 400 {
        assert!(
            Instant::now() < deadline,
            "{} of 400 items",
            got.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(s);
    finish(client);
    finish(server);
}
