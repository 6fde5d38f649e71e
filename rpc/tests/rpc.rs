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
use colibri_rpc::wire::{self, ItemHeader, ItemKind, MsgHeader};
use colibri_rpc::{
    BulkArg, BulkKind, CallOpts, ReplyHandle, RpcConfig, RpcError, RpcMachine, block_on,
};
use parking_lot::Mutex;

mod common;

use common::{COUNT, ECHO, NEVER, Net, READ, echo_server, finish, pattern};

/// A machine over bulk_mem with one worker.
fn machine(cfg: RpcConfig) -> RpcMachine {
    Net::mem().machine(cfg)
}

#[test]
fn request_reply_and_sizes() {
    common::request_reply_and_sizes(&Net::mem());
}

#[test]
fn concurrent_calls_from_many_threads() {
    common::concurrent_calls(&Net::mem());
}

#[test]
fn one_way_items_and_batching_preserve_order() {
    common::batching_preserves_order(&Net::mem());
}

/// The same with three transport workers per transfer machine: messages of
/// one session are handled concurrently by the transport and may arrive
/// out of order; the sessions' sequence numbers put them back in order.
#[test]
fn one_way_items_and_batching_preserve_order_three_workers() {
    common::batching_preserves_order(&Net::mem_workers(3));
}

#[test]
fn resend_on_timeout_executes_once() {
    common::resend_executes_once(&Net::mem());
}

#[test]
fn bulk_both_directions() {
    common::bulk_both_directions(&Net::mem());
}

#[test]
fn blocking_handlers() {
    common::blocking_handlers(&Net::mem());
}

#[test]
fn shutdown_from_a_handler() {
    common::shutdown_from_a_handler(&Net::mem());
}

#[test]
fn peer_stopped_mid_call() {
    common::peer_stopped_mid_call(&Net::mem());
}

#[test]
fn cancel_calls() {
    common::cancel_calls(&Net::mem());
}

#[test]
fn async_calls_callback_poll_future() {
    let server = echo_server(&Net::mem(), RpcConfig::default());
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
    })
    .unwrap();
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

/// Failed sends and reordering, forced: the server has two receive
/// buffers of one small message each, so concurrent senders keep getting
/// `NoBuffers` and send their messages again (same sequence numbers);
/// three workers per transfer machine on both sides copy and deliver
/// messages concurrently. Every one-way item of every session arrives
/// exactly once, in order.
#[test]
fn refused_and_reordered_messages_are_delivered_once_in_order() {
    const SESSIONS: u32 = 4;
    const N: u32 = 1500;
    let net = Net::mem_workers(3);
    let small = 1024;
    let server = net.machine(
        RpcConfig::default()
            .with_max_msg_size(small)
            .with_recv_buffers(2, small),
    );
    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    server.on(COUNT, move |req, _reply| {
        let n = u32::from_le_bytes(req.payload()[..4].try_into().unwrap());
        sn.lock().push((req.session(), n));
    });
    server.on(ECHO, |req, reply| {
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    let client = net.machine(
        RpcConfig::default()
            .with_max_msg_size(small)
            .with_max_in_flight(4),
    );
    let t0 = Instant::now();
    let threads: Vec<_> = (0..SESSIONS)
        .map(|k| {
            let s = client.session(server.addr()).unwrap();
            std::thread::spawn(move || {
                for i in 0..N {
                    let mut p = [0u8; 48];
                    p[..4].copy_from_slice(&i.to_le_bytes());
                    s.post(COUNT, &p).unwrap();
                    // Calls are sequenced with the items around them.
                    if i % 100 == 99 {
                        let r = s.call_with(
                            ECHO,
                            &[k as u8],
                            CallOpts::new().timeout(Duration::from_secs(30)),
                        );
                        assert_eq!(r.unwrap(), [k as u8]);
                    }
                    // Let the queue drain now and then, so that items leave
                    // in many small messages.
                    while s.queued_items() > 64 {
                        std::thread::yield_now();
                    }
                }
                s.flush(Duration::from_secs(30)).unwrap();
                s.id()
            })
        })
        .collect();
    let ids: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().len() < (SESSIONS * N) as usize {
        assert!(
            Instant::now() < deadline,
            "{} of {} items",
            seen.lock().len(),
            SESSIONS * N
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    let seen = seen.lock();
    assert_eq!(seen.len(), (SESSIONS * N) as usize, "no item twice");
    for id in ids {
        let order: Vec<u32> = seen.iter().filter(|(s, _)| *s == id).map(|x| x.1).collect();
        assert_eq!(order, (0..N).collect::<Vec<_>>(), "session {id:016x}");
    }
    let (cs, ss) = (client.stats(), server.stats());
    assert!(cs.send_retries > 0, "no NoBuffers forced: {cs:?}");
    assert_eq!((cs.seq_resets, cs.items_lost, ss.msgs_skipped), (0, 0, 0));
    assert!(t0.elapsed() < Duration::from_secs(60));
    eprintln!(
        "{} messages, {} sent again, {} held out of order, {} duplicates, {:?}",
        cs.msgs_sent,
        cs.send_retries,
        ss.msgs_held,
        ss.msgs_duplicate,
        t0.elapsed()
    );
    drop(seen);
    finish(client);
    finish(server);
}

#[test]
fn a_cancelled_request_still_queued_is_never_sent() {
    let server = machine(RpcConfig::default());
    let got: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    server.on(ECHO, move |req, reply| {
        g.lock().push(req.payload()[0]);
        reply.ok(req.payload());
    });
    // Items wait up to 10 s for company, so the first call's request is
    // still in the formation queue when it is cancelled.
    let client = machine(RpcConfig::default().with_batch_delay(Duration::from_secs(10)));
    let s = client.session(server.addr()).unwrap();
    let opts = CallOpts::new().timeout(Duration::from_secs(30));
    let a = s.start(ECHO, &[1], opts).unwrap();
    let b = s.start(ECHO, &[2], opts).unwrap();
    assert_eq!(s.queued_items(), 2);
    assert!(a.cancel());
    assert_eq!(s.queued_items(), 1);
    s.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(b.wait().unwrap(), [2]);
    assert_eq!(a.wait(), Err(RpcError::Cancelled));
    assert_eq!(*got.lock(), [2], "the cancelled request reached the server");
    assert_eq!(s.stats().items_sent, 1);
    // Cancelling the only queued item leaves nothing to send.
    let c = s.start(ECHO, &[3], opts).unwrap();
    assert!(c.cancel());
    assert_eq!(s.queued_items(), 0);
    s.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(s.stats().items_sent, 1);
    assert_eq!(client.stats().cancelled, 2);
    drop(s);
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

#[test]
fn bulk_async_many_in_flight() {
    let server = common::bulk_server(&Net::mem());
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
        let out = block_on(c).unwrap();
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
    let out = bulk.wait().unwrap();
    assert_eq!(out.result, Err(RpcError::Shutdown));
    assert_eq!(out.buffers.len(), 1);
    drop(out);
    assert!(matches!(s.call(ECHO, b""), Err(RpcError::Shutdown)));
    drop(s);
    assert_eq!(dom.buffer_count(), 0);
    held.lock().clear();
    finish(server);
}

/// Items of a received message: headers and payloads.
type RawItems = Vec<(ItemHeader, Vec<u8>)>;

/// A bare transfer machine that speaks the wire format by hand.
struct Raw {
    dom: Domain,
    tm: colibri_net::TransferMachine,
    events: colibri_net::EventReceiver,
    cbs: Arc<colibri_net::BufferCallbacks>,
    /// Re-offer receive buffers as soon as their message is read.
    auto: bool,
    parked: Mutex<Vec<colibri_net::NetBuffer>>,
}

impl Raw {
    fn new() -> Self {
        Self::with_buffers(4, 64 << 10, true)
    }

    /// `n` receive buffers of `size` bytes, one message each; unless
    /// `auto`, a buffer comes back only with [`Raw::repost`].
    fn with_buffers(n: usize, size: usize, auto: bool) -> Self {
        let dom = Domain::new(&MemTransport::default()).unwrap();
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        let (cbs, events) = event_channel(4096);
        tm.start("127.0.0.1:0:9").unwrap();
        tm.wait_for_state(TmState::Started, Duration::from_secs(5))
            .unwrap();
        let r = Self {
            dom,
            tm,
            events,
            cbs,
            auto,
            parked: Mutex::new(Vec::new()),
        };
        for _ in 0..n {
            let b = r
                .dom
                .register(BufVec::new(1, size))
                .unwrap()
                .with_callbacks(r.cbs.clone());
            r.tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
        r
    }

    fn addr(&self) -> String {
        self.tm.ep().unwrap().addr().to_string()
    }

    /// Re-offers the receive buffers kept back.
    fn repost(&self) {
        for b in self.parked.lock().drain(..) {
            self.tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
    }

    fn give_back(&self, b: colibri_net::NetBuffer) {
        if self.auto {
            self.tm.add_msg_recv(b, RecvParams::default()).unwrap();
        } else {
            self.parked.lock().push(b);
        }
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

    /// The next received message's items (send completions and
    /// acknowledgements skipped).
    fn recv(&self, wait: Duration) -> Option<RawItems> {
        self.recv_msg(wait).map(|(_, items)| items)
    }

    /// The next received message with items: its header and items.
    fn recv_msg(&self, wait: Duration) -> Option<(MsgHeader, RawItems)> {
        self.recv_any(wait, false)
    }

    /// The next received message (with `acks`, acknowledgements too).
    fn recv_any(&self, wait: Duration, acks: bool) -> Option<(MsgHeader, RawItems)> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let mut ev = self.events.recv_timeout(left).ok()?;
            if ev.queue() != QueueType::MsgRecv {
                continue;
            }
            let msg = ev.is_ok().then(|| ev.message());
            if let Some(b) = ev.take_buffer() {
                self.give_back(b);
            }
            // A message too large for the buffer fails it: skip.
            let Some(Ok(msg)) = msg else {
                continue;
            };
            let (h, items) = wire::decode_message(&msg).unwrap();
            if h.ack_only && !acks {
                continue;
            }
            return Some((
                h,
                items
                    .into_iter()
                    .map(|i| (i.header, i.payload.to_vec()))
                    .collect(),
            ));
        }
    }

    /// Waits for an acknowledgement-only message acknowledging `ack`.
    fn wait_ack(&self, ack: (u64, u64), wait: Duration) -> bool {
        let end = Instant::now() + wait;
        while let Some((h, _)) = self.recv_any(end.saturating_duration_since(Instant::now()), true)
        {
            if h.ack_only && h.ack == Some(ack) {
                return true;
            }
        }
        false
    }

    fn close(self) {
        self.tm.stop(true).unwrap();
        self.tm.wait_stopped(Duration::from_secs(10)).unwrap();
        while self.events.try_recv().is_some() {}
        self.parked.lock().clear();
        self.tm.fini().unwrap();
        assert_eq!(self.dom.buffer_count(), 0);
    }
}

/// A client-to-server message of `session`, epoch 1, number `seq`.
fn message(session: u64, seq: u64, items: &[&[u8]]) -> Vec<u8> {
    message_in(session, 1, seq, false, items)
}

/// A client-to-server message of `session` in `epoch`, number `seq`
/// (nothing acknowledged yet: low 1).
fn message_in(session: u64, epoch: u64, seq: u64, ack_now: bool, items: &[&[u8]]) -> Vec<u8> {
    let h = MsgHeader {
        session,
        epoch,
        seq,
        low: 1,
        ack_now,
        ..MsgHeader::default()
    };
    wire::encode_message(&h, items)
}

/// A one-way item of `session` whose payload is `n`.
fn oneway(session: u64, n: u32) -> Vec<u8> {
    let mut it = Vec::new();
    let h = ItemHeader {
        kind: ItemKind::OneWay,
        flags: 0,
        opcode: COUNT,
        session,
        xid: 0,
        status: 0,
        low_gap: 0,
    };
    wire::encode_item(&mut it, &h, &n.to_le_bytes(), &[]).unwrap();
    it
}

fn request(session: u64, xid: u64, opcode: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    request_low(session, xid, opcode, 0, flags, payload)
}

/// A request numbered `xid` that says every call below `low` is done
/// (`low` 0: claims nothing).
fn request_low(
    session: u64,
    xid: u64,
    opcode: u32,
    low: u64,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut it = Vec::new();
    let h = ItemHeader {
        kind: ItemKind::Request,
        flags,
        opcode,
        session,
        xid,
        status: 0,
        low_gap: ItemHeader::gap_for(xid, low),
    };
    wire::encode_item(&mut it, &h, payload, &[]).unwrap();
    it
}

/// A server answering COUNT with the payload, counting executions.
fn counting_echo(cfg: RpcConfig) -> (RpcMachine, Arc<AtomicU64>) {
    let server = machine(cfg);
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    server.on(COUNT, move |req, reply| {
        r.fetch_add(1, Ordering::SeqCst);
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    (server, runs)
}

#[test]
fn malformed_input_gets_error_replies_never_a_crash() {
    let server = echo_server(&Net::mem(), RpcConfig::default());
    let raw = Raw::new();
    let to = server.addr().to_string();
    // Garbage: no request to answer; counted.
    raw.send(&to, b"definitely not an RPC message");
    raw.send(&to, &[0u8; 100]);
    assert!(raw.recv(Duration::from_millis(200)).is_none());
    // A request with a lying payload length: an EPROTO reply.
    let mut it = request(5, 1, ECHO, 0, b"abc");
    it[28..32].copy_from_slice(&1000u32.to_le_bytes());
    raw.send(&to, &message(5, 1, &[&it]));
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(got[0].0.xid, 1);
    assert_eq!(got[0].0.status, colibri_rpc::STATUS_PROTOCOL);
    // Unknown opcode: ENOSYS; valid request: echoed. One message, three
    // items, the last one malformed (unknown kind): two replies.
    let a = request(5, 2, 99, 0, b"");
    let b = request(5, 3, ECHO, 0, b"ok");
    let mut c = request(5, 4, ECHO, 0, b"");
    c[0] = 9;
    raw.send(&to, &message(5, 2, &[&a, &b, &c]));
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
    let (server, runs) = counting_echo(RpcConfig::default().with_reply_cache(2));
    let raw = Raw::new();
    let to = server.addr().to_string();
    let sid = 0x5e55;
    for xid in 1..=3u64 {
        raw.send(
            &to,
            &message(sid, xid, &[&request(sid, xid, COUNT, 0, &[xid as u8])]),
        );
        let got = raw.recv(Duration::from_secs(10)).unwrap();
        assert_eq!((got[0].0.xid, got[0].0.status), (xid, 0));
    }
    // xid 3 is cached: a resend is answered from the cache.
    raw.send(
        &to,
        &message(sid, 4, &[&request(sid, 3, COUNT, wire::FLAG_RESEND, &[3])]),
    );
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!((got[0].0.status, got[0].1.as_slice()), (0, &[3u8][..]));
    // xid 1 was evicted (cache of 2): a resend is refused as stale.
    raw.send(
        &to,
        &message(sid, 5, &[&request(sid, 1, COUNT, wire::FLAG_RESEND, &[1])]),
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
fn replies_the_client_has_are_dropped_from_the_cache() {
    let (server, runs) = counting_echo(RpcConfig::default());
    let raw = Raw::new();
    let to = server.addr().to_string();
    let sid = 0x10e;
    // Calls 1..=3, each claiming nothing: all three replies are kept.
    for xid in 1..=3u64 {
        raw.send(
            &to,
            &message(
                sid,
                xid,
                &[&request_low(sid, xid, COUNT, 0, 0, &[xid as u8])],
            ),
        );
        assert_eq!(raw.recv(Duration::from_secs(10)).unwrap()[0].0.xid, xid);
    }
    assert_eq!(server.stats().replies_pruned, 0);
    // Call 4 says the client has every reply below 3: 1 and 2 go.
    raw.send(
        &to,
        &message(sid, 4, &[&request_low(sid, 4, COUNT, 3, 0, &[4])]),
    );
    assert_eq!(raw.recv(Duration::from_secs(10)).unwrap()[0].0.xid, 4);
    assert_eq!(server.stats().replies_pruned, 2);
    // 3 is still cached: its resend is answered, not run.
    raw.send(
        &to,
        &message(
            sid,
            5,
            &[&request_low(sid, 3, COUNT, 0, wire::FLAG_RESEND, &[3])],
        ),
    );
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (got[0].0.xid, got[0].0.status, got[0].1.as_slice()),
        (3, 0, &[3u8][..])
    );
    // A resend of 2 (which the client said it had) is stale, not run again.
    raw.send(
        &to,
        &message(
            sid,
            6,
            &[&request_low(sid, 2, COUNT, 0, wire::FLAG_RESEND, &[2])],
        ),
    );
    let got = raw.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(got[0].0.status, colibri_rpc::STATUS_STALE);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    raw.close();
    finish(server);
}

#[test]
fn a_client_keeps_the_servers_reply_cache_small() {
    // Sequential calls: each request tells the server the earlier replies
    // arrived, so the server keeps about one reply, not `reply_cache`.
    let server = echo_server(&Net::mem(), RpcConfig::default().with_reply_cache(10_000));
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    for i in 0..500u32 {
        assert_eq!(s.call(ECHO, &i.to_le_bytes()).unwrap(), i.to_le_bytes());
    }
    // With calls in flight, only the replies below the oldest one go.
    let held: Vec<_> = (0..8u32)
        .map(|i| s.start(ECHO, &i.to_le_bytes(), CallOpts::new()).unwrap())
        .collect();
    for c in held {
        c.wait().unwrap();
    }
    s.call(ECHO, b"last").unwrap();
    let st = server.stats();
    assert!(st.replies_pruned >= 500, "{st:?}");
    assert_eq!(st.stale, 0);
    drop(s);
    finish(client);
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
        // Refused at once: the outcome is there without waiting (a
        // handler of `on` may not wait).
        let done = h.bulk_pull(&d, buf).try_result().expect("refused at once");
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
    // messages run concurrently; calls, items and bulk from four threads
    // sharing one session all complete (the order of items posted by
    // different threads is not defined: see the order tests).
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

/// A server that records the payloads (`n`) of one-way COUNT items.
fn counting_server(cfg: RpcConfig) -> (RpcMachine, Arc<Mutex<Vec<u32>>>) {
    let server = machine(cfg);
    let seen: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    server.on(COUNT, move |req, _reply| {
        sn.lock()
            .push(u32::from_le_bytes(req.payload()[..4].try_into().unwrap()));
    });
    (server, seen)
}

fn wait_for(seen: &Mutex<Vec<u32>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} items: {:?}",
            seen.lock().len(),
            seen.lock()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reordering, duplicates and epochs injected by hand: the handler sees
/// every item once, in sequence order; the server acknowledges what it
/// handled.
#[test]
fn injected_reordering_duplicates_and_epochs() {
    let (server, seen) = counting_server(RpcConfig::default());
    let raw = Raw::new();
    let to = server.addr().to_string();
    let sid = 0x0dd;
    // Epoch 10: messages 1..=6 sent as 3 1 1 2 5 4 6 2.
    for seq in [3u64, 1, 1, 2, 5, 4, 6, 2] {
        raw.send(
            &to,
            &message_in(sid, 10, seq, false, &[&oneway(sid, seq as u32)]),
        );
    }
    wait_for(&seen, 6);
    // An older epoch is stale; a newer one starts over at its low.
    raw.send(&to, &message_in(sid, 9, 7, false, &[&oneway(sid, 99)]));
    raw.send(&to, &message_in(sid, 11, 2, false, &[&oneway(sid, 12)]));
    raw.send(&to, &message_in(sid, 11, 1, true, &[&oneway(sid, 11)]));
    wait_for(&seen, 8);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(*seen.lock(), vec![1, 2, 3, 4, 5, 6, 11, 12]);
    let st = server.stats();
    assert_eq!(st.msgs_duplicate, 2, "{st:?}");
    assert_eq!(st.msgs_discarded, 1, "{st:?}");
    assert!(st.msgs_held >= 3, "{st:?}");
    assert_eq!(st.oneways, 8);
    // The server acknowledges epoch 11 up to 2 (at once: message 1 asked;
    // the acknowledgement of what followed comes after the delay).
    assert!(raw.wait_ack((11, 2), Duration::from_secs(5)));
    raw.close();
    finish(server);
}

/// A message refused for lack of receive buffers is sent again with the
/// same epoch and sequence number, until the receiver takes it; later
/// messages say what was acknowledged.
#[test]
fn refused_messages_are_sent_again_with_the_same_number() {
    // One receive buffer, given back only when the test says so.
    let raw = Raw::with_buffers(1, 64 << 10, false);
    let client = machine(
        RpcConfig::default()
            .with_batching(false)
            .with_max_in_flight(4),
    );
    let s = client.session(&raw.addr()).unwrap();
    for n in 0..3u32 {
        s.post(COUNT, &n.to_le_bytes()).unwrap();
    }
    let mut got = Vec::new();
    let (h, items) = raw.recv_msg(Duration::from_secs(10)).unwrap();
    got.push((h, items));
    // The other two are refused, again and again, while the buffer is
    // kept back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stats().send_retries < 4 {
        assert!(Instant::now() < deadline, "{:?}", client.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..2 {
        raw.repost();
        got.push(raw.recv_msg(Duration::from_secs(10)).unwrap());
    }
    raw.repost();
    assert!(
        raw.recv_msg(Duration::from_millis(100)).is_none(),
        "nothing more"
    );
    let epoch = got[0].0.epoch;
    let mut seqs: Vec<u64> = got
        .iter()
        .map(|(h, items)| {
            assert_eq!((h.epoch, h.session, h.low), (epoch, s.id(), 1));
            // Message n carries item n - 1.
            assert_eq!(items[0].1, ((h.seq - 1) as u32).to_le_bytes());
            h.seq
        })
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [1, 2, 3]);
    s.flush(Duration::from_secs(10)).unwrap();
    // Acknowledge all three: the next message says so (low 4).
    let ack = MsgHeader {
        replies: true,
        ack_only: true,
        session: s.id(),
        epoch: 5,
        ack: Some((epoch, 3)),
        ..MsgHeader::default()
    };
    raw.send(client.addr(), &wire::encode_message(&ack, &[]));
    std::thread::sleep(Duration::from_millis(20));
    s.post(COUNT, &3u32.to_le_bytes()).unwrap();
    let (h, _) = raw.recv_msg(Duration::from_secs(10)).unwrap();
    assert_eq!((h.epoch, h.seq, h.low), (epoch, 4, 4));
    let st = client.stats();
    assert_eq!((st.seq_resets, st.items_lost), (0, 0));
    drop(s);
    finish(client);
    raw.close();
}

/// A message that fails for good (too large for the receiver's buffer)
/// fails its call, and the session restarts its sequence in a newer epoch
/// so that the receiver does not wait for the lost number.
#[test]
fn a_message_lost_for_good_restarts_the_sequence() {
    let raw = Raw::with_buffers(2, 512, true);
    let client = machine(RpcConfig::default());
    let s = client.session(&raw.addr()).unwrap();
    s.post(COUNT, &[1; 100]).unwrap();
    let (h1, _) = raw.recv_msg(Duration::from_secs(10)).unwrap();
    assert_eq!(h1.seq, 1);
    let r = s.call_with(
        ECHO,
        &[0; 600],
        CallOpts::new().timeout(Duration::from_secs(10)),
    );
    assert!(
        matches!(
            r,
            Err(RpcError::Net(colibri_net::NetError::MessageTooLarge { .. }))
        ),
        "{r:?}"
    );
    assert!(matches!(
        s.flush(Duration::from_secs(10)),
        Err(RpcError::Net(_))
    ));
    s.post(COUNT, &[2; 100]).unwrap();
    let (h2, _) = raw.recv_msg(Duration::from_secs(10)).unwrap();
    assert!(h2.epoch > h1.epoch, "{h1:?} then {h2:?}");
    assert_eq!((h2.seq, h2.low), (1, 1));
    assert_eq!(client.stats().seq_resets, 1);
    s.flush(Duration::from_secs(10)).unwrap();
    drop(s);
    finish(client);
    raw.close();
}

/// A missing message that never comes is given up after `gap_timeout`:
/// the messages held behind it are handled (in order) and the missing one
/// is dropped if it comes later.
#[test]
fn a_gap_that_never_fills_is_given_up() {
    let gap = Duration::from_millis(300);
    let (server, seen) =
        counting_server(RpcConfig::default().with_retry_times(Duration::from_millis(100), gap));
    let raw = Raw::new();
    let to = server.addr().to_string();
    let sid = 0x6a9;
    let t0 = Instant::now();
    for seq in [1u64, 3, 4] {
        raw.send(&to, &message(sid, seq, &[&oneway(sid, seq as u32)]));
    }
    wait_for(&seen, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(*seen.lock(), vec![1], "3 and 4 wait for 2");
    wait_for(&seen, 3);
    assert!(t0.elapsed() >= gap && t0.elapsed() < Duration::from_secs(5));
    raw.send(&to, &message(sid, 2, &[&oneway(sid, 2)]));
    raw.send(&to, &message(sid, 5, &[&oneway(sid, 5)]));
    wait_for(&seen, 4);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(*seen.lock(), vec![1, 3, 4, 5]);
    let st = server.stats();
    assert_eq!((st.msgs_skipped, st.msgs_duplicate), (1, 1));
    raw.close();
    finish(server);
}

/// A client keeps at most `window` messages unacknowledged, asks for an
/// acknowledgement at half and full window, and goes on when it comes.
#[test]
fn the_window_bounds_unacknowledged_messages() {
    let raw = Raw::new();
    let client = machine(
        RpcConfig::default()
            .with_batching(false)
            .with_max_in_flight(2)
            .with_window(4),
    );
    let s = client.session(&raw.addr()).unwrap();
    for n in 0..10u32 {
        s.post(COUNT, &n.to_le_bytes()).unwrap();
    }
    let mut next = 1;
    while next <= 10 {
        let mut batch = Vec::new();
        while let Some((h, _)) = raw.recv_msg(Duration::from_millis(100)) {
            batch.push(h);
        }
        let last = next + batch.len() as u64 - 1;
        assert!(
            !batch.is_empty() && batch.len() <= 4,
            "{} messages unacknowledged",
            batch.len()
        );
        for (i, h) in batch.iter().enumerate() {
            assert_eq!(h.seq, next + i as u64);
            // Unacknowledged messages when it left, itself included.
            let k = h.seq - h.low + 1;
            assert!(k <= 4, "{h:?}");
            assert_eq!(h.ack_now, k == 2 || k == 4, "{h:?}");
        }
        let ack = MsgHeader {
            replies: true,
            ack_only: true,
            session: s.id(),
            epoch: 1,
            ack: Some((batch[0].epoch, last)),
            ..MsgHeader::default()
        };
        raw.send(client.addr(), &wire::encode_message(&ack, &[]));
        next = last + 1;
    }
    s.flush(Duration::from_secs(10)).unwrap();
    drop(s);
    finish(client);
    raw.close();
}

/// A server with as many sessions as it takes answers a new session's
/// calls `Busy` (and drops its one-way items) until one goes idle.
#[test]
fn sessions_beyond_the_limit_are_refused() {
    let mut cfg = RpcConfig::default().with_max_sessions(1);
    cfg.session_idle = Duration::from_millis(300);
    let server = echo_server(&Net::mem(), cfg);
    let client = machine(RpcConfig::default());
    let a = client.session(server.addr()).unwrap();
    let b = client.session(server.addr()).unwrap();
    assert_eq!(a.call(ECHO, b"a").unwrap(), b"a");
    assert_eq!(b.call(ECHO, b"b"), Err(RpcError::Busy));
    b.post(ECHO, b"dropped").unwrap();
    assert_eq!(b.call(ECHO, b"b"), Err(RpcError::Busy));
    let st = server.stats();
    assert!(st.sessions_refused >= 2 && st.items_refused >= 3, "{st:?}");
    // Once a's server session is idle and forgotten, b gets in (its
    // refused messages were acknowledged: its sequence goes on).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match b.call(ECHO, b"b") {
            Ok(r) => {
                assert_eq!(r, b"b");
                break;
            }
            Err(RpcError::Busy) => {
                assert!(Instant::now() < deadline, "never admitted");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(b.call(ECHO, b"again").unwrap(), b"again");
    drop((a, b));
    finish(client);
    finish(server);
}

#[test]
fn a_stopped_server_fails_waiting_calls_promptly() {
    common::stopped_server_fails_waiting_calls(&Net::mem());
}

/// A handler that panics loses its request (answered `NoReply`), not its
/// session: later items of the session are still handled, in order; a
/// completion callback that panics does not stop the client's session
/// either.
#[test]
fn panicking_handlers_and_callbacks_do_not_stop_the_session() {
    let server = machine(RpcConfig::default());
    let seen: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    server.on(ECHO, move |req, reply| {
        let b = req.payload()[0];
        assert!(b != 13, "unlucky request");
        sn.lock().push(b);
        reply.ok(&[b]);
    });
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    assert_eq!(s.call(ECHO, &[1]).unwrap(), [1]);
    assert_eq!(s.call(ECHO, &[13]), Err(RpcError::NoReply));
    // A callback that panics, then calls that must still complete.
    s.start(ECHO, &[2], CallOpts::new())
        .unwrap()
        .on_complete(|_| panic!("callback panics"));
    let calls: Vec<_> = (3..6u8)
        .map(|i| s.start(ECHO, &[i], CallOpts::new()).unwrap())
        .collect();
    for (c, i) in calls.into_iter().zip(3..6u8) {
        assert_eq!(c.wait().unwrap(), [i]);
    }
    assert_eq!(*seen.lock(), vec![1, 2, 3, 4, 5]);
    assert_eq!(server.stats().handler_panics, 1);
    drop(s);
    finish(client);
    finish(server);
}

/// With three transport workers, one session's handlers run one at a
/// time while another session's run alongside: session a's first item
/// blocks its handler until session b's item has been handled. (The core
/// runs the callbacks of one receive buffer one at a time, so the server
/// takes one message per receive buffer here: messages of the two
/// sessions then never share one.)
#[test]
fn sessions_dispatch_in_parallel_items_of_one_session_never_do() {
    type Shared = (Mutex<(HandlerLog, bool)>, parking_lot::Condvar);
    #[derive(Default)]
    struct HandlerLog {
        running: std::collections::HashMap<u64, usize>,
        overlap: bool,
        order: Vec<(u64, u32)>,
    }
    let net = Net::mem_workers(3);
    let server = net.machine(RpcConfig::default().with_recv_buffers(64, 16 << 10));
    let shared: Arc<Shared> = Arc::new(Default::default());
    let sh = shared.clone();
    let b_id = Arc::new(AtomicU64::new(0));
    let bid = b_id.clone();
    let b_seen_while_blocked = Arc::new(AtomicUsize::new(0));
    let seen_flag = b_seen_while_blocked.clone();
    server.on(COUNT, move |req, _reply| {
        let n = u32::from_le_bytes(req.payload()[..4].try_into().unwrap());
        let sess = req.session();
        let (lock, cv) = &*sh;
        {
            let mut g = lock.lock();
            let r = g.0.running.entry(sess).or_insert(0);
            *r += 1;
            if *r > 1 {
                g.0.overlap = true;
            }
            g.0.order.push((sess, n));
            if sess == bid.load(Ordering::SeqCst) {
                g.1 = true;
                cv.notify_all();
            }
        }
        if n == 0 && sess != bid.load(Ordering::SeqCst) {
            // Session a's first item: wait (bounded) for session b's.
            let mut g = lock.lock();
            let end = Instant::now() + Duration::from_secs(10);
            while !g.1 && !cv.wait_until(&mut g, end).timed_out() {}
            if g.1 {
                seen_flag.store(1, Ordering::SeqCst);
            }
        }
        *lock.lock().0.running.get_mut(&sess).unwrap() -= 1;
    });
    let client = net.machine(RpcConfig::default().with_batching(false));
    let a = client.session(server.addr()).unwrap();
    let b = client.session(server.addr()).unwrap();
    b_id.store(b.id(), Ordering::SeqCst);
    for i in 0..50u32 {
        a.post(COUNT, &i.to_le_bytes()).unwrap();
    }
    a.flush(Duration::from_secs(10)).unwrap();
    b.post(COUNT, &7u32.to_le_bytes()).unwrap();
    b.flush(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while shared.0.lock().0.order.len() < 51 {
        assert!(Instant::now() < deadline, "items missing");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(
        b_seen_while_blocked.load(Ordering::SeqCst),
        1,
        "session b waited for session a's handler"
    );
    let g = shared.0.lock();
    assert!(!g.0.overlap, "two handlers of one session ran at once");
    let a_order: Vec<u32> =
        g.0.order
            .iter()
            .filter(|(s, _)| *s == a.id())
            .map(|x| x.1)
            .collect();
    assert_eq!(a_order, (0..50).collect::<Vec<_>>());
    drop(g);
    drop((a, b));
    finish(client);
    finish(server);
}

#[test]
fn a_full_handler_pool_answers_busy_and_survives_panics() {
    // One pool thread, at most two requests held: the third is answered
    // Busy at once; a handler that panics on the pool is counted and its
    // client gets NoReply; the pool goes on serving.
    let server = machine(
        RpcConfig::default()
            .with_handler_threads(1)
            .with_handler_queue(2),
    );
    let (go_tx, go) = crossbeam_channel::bounded::<()>(4);
    server
        .on_blocking(NEVER, move |_req, reply| {
            let _ = go.recv_timeout(Duration::from_secs(10));
            reply.ok(b"late");
        })
        .unwrap();
    server
        .on_blocking(COUNT, |req, reply| {
            assert!(req.payload() != b"boom", "handler bug");
            reply.ok(b"fine");
        })
        .unwrap();
    let client = machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let held: Vec<_> = (0..2)
        .map(|_| s.start(NEVER, b"", CallOpts::new()).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match s.call(COUNT, b"x") {
            Err(RpcError::Busy) => break,
            // The held requests may not have reached the pool yet.
            Ok(_) => assert!(Instant::now() < deadline, "never Busy"),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(server.stats().handler_busy >= 1);
    go_tx.send(()).unwrap();
    go_tx.send(()).unwrap();
    for c in held {
        assert_eq!(c.wait().unwrap(), b"late");
    }
    assert_eq!(s.call(COUNT, b"boom"), Err(RpcError::NoReply));
    assert_eq!(server.stats().handler_panics, 1);
    assert_eq!(s.call(COUNT, b"x").unwrap(), b"fine");
    drop(s);
    finish(client);
    finish(server);
}
