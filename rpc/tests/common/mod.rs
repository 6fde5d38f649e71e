//! Scenarios that every transport runs (`rpc.rs` over bulk_mem,
//! `rpc_tcp.rs` over TCP, `rpc_lnet.rs` over LNet), and the helpers they
//! share.
//!
//! Every scenario is bounded in time (calls carry timeouts, waits have
//! deadlines) and checks that both machines hand their domains back with
//! every buffer deregistered.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use colibri_bulk_mem::{MemConfig, MemTransport};
use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::Transport;
use colibri_rpc::{BulkArg, CallHandle, CallOpts, ReplyHandle, RpcConfig, RpcError, RpcMachine};
use parking_lot::Mutex;

pub(crate) const ECHO: u32 = 1;
pub(crate) const COUNT: u32 = 2;
pub(crate) const SLOW: u32 = 3;
pub(crate) const NEVER: u32 = 4;
pub(crate) const READ: u32 = 5;
pub(crate) const WRITE: u32 = 6;

/// Where a test's machines live: a transport, and a fresh address for
/// each machine.
pub(crate) struct Net {
    xprt: Arc<dyn Transport>,
    /// True over a transport between processes (TCP, RDMA).
    pub(crate) tcp: bool,
    /// Over LNet: the NIDs of the nodes machines alternate between.
    lnet: Option<&'static [&'static str]>,
}

/// NIDs of the LNet nodes of `Net::lnet`.
const LNET_NIDS: [&str; 2] = ["127.0.50.1@tcp", "127.0.50.2@tcp"];
/// The nodes of [`Net::lnet_threads`].
const LNET_THREADS_NIDS: [&str; 2] = ["127.0.53.1@tcp", "127.0.53.2@tcp"];

impl Net {
    /// The in-memory transport, one worker per transfer machine.
    pub(crate) fn mem() -> Self {
        Self::mem_workers(1)
    }

    /// The in-memory transport with `n` worker threads per transfer
    /// machine: callbacks of different receive buffers run concurrently,
    /// and two sends may be copied in either order.
    pub(crate) fn mem_workers(n: usize) -> Self {
        Self {
            xprt: Arc::new(MemTransport::new(MemConfig {
                workers: n,
                ..MemConfig::default()
            })),
            tcp: false,
            lnet: None,
        }
    }

    /// The TCP transport over loopback.
    pub(crate) fn tcp() -> Self {
        Self {
            xprt: Arc::new(TcpTransport::new(TcpConfig::default())),
            tcp: true,
            lnet: None,
        }
    }

    /// The LNet transport over the socket LND: two LNet nodes of this
    /// process (shared by the tests of the binary), machines alternately
    /// on each.
    pub(crate) fn lnet() -> Self {
        static XPRT: std::sync::OnceLock<colibri_lnet_xprt::LnetTransport> =
            std::sync::OnceLock::new();
        Self::lnet_on(&XPRT, &LNET_NIDS, false)
    }

    /// The LNet transport with a delivery thread per transfer machine
    /// (`LnetXprtConfig::thread_per_tm`), on two other nodes.
    pub(crate) fn lnet_threads() -> Self {
        static XPRT: std::sync::OnceLock<colibri_lnet_xprt::LnetTransport> =
            std::sync::OnceLock::new();
        Self::lnet_on(&XPRT, &LNET_THREADS_NIDS, true)
    }

    fn lnet_on(
        xprt: &'static std::sync::OnceLock<colibri_lnet_xprt::LnetTransport>,
        nids: &'static [&'static str],
        threads: bool,
    ) -> Self {
        use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
        use colibri_lnet_rt::{Lnet, LnetConfig};
        let x = xprt.get_or_init(|| {
            let nodes: Vec<Lnet> = nids
                .iter()
                .map(|n| {
                    let mut cfg = LnetConfig::new(&[n.parse().unwrap()]);
                    cfg.accept_port = 0;
                    cfg.accept = AcceptPolicy::All;
                    cfg.node.transaction_timeout = Duration::from_secs(10);
                    Lnet::start(cfg).expect("LNet node")
                })
                .collect();
            Lnet::introduce(&nodes);
            colibri_lnet_xprt::LnetTransport::new(
                nodes,
                colibri_lnet_xprt::LnetXprtConfig::default().thread_per_tm(threads),
            )
            .expect("transport")
        });
        Self {
            xprt: Arc::new(x.clone()),
            tcp: false,
            lnet: Some(nids),
        }
    }

    /// The verbs RDMA transport (needs a device: the Soft-RoCE VM).
    pub(crate) fn rdma() -> Self {
        Self {
            xprt: Arc::new(RdmaTransport::new(RdmaConfig::default())),
            tcp: true,
            lnet: None,
        }
    }

    /// The transport.
    pub(crate) fn xprt(&self) -> &dyn Transport {
        &*self.xprt
    }

    /// A machine at a fresh address (its own domain). Tests run in
    /// parallel in one process, and a stopped machine's address must not
    /// be taken over by another test's machine while its peers still talk
    /// to it: bulk_mem services are never reused; over TCP every machine
    /// gets its own free port.
    pub(crate) fn machine(&self, cfg: RpcConfig) -> RpcMachine {
        static SERVICE: AtomicU64 = AtomicU64::new(100);
        let n = SERVICE.fetch_add(1, Ordering::Relaxed);
        let addr = match self.lnet {
            Some(nids) => format!(
                "{}:12345:{}:*",
                nids[(n % nids.len() as u64) as usize],
                20 + n % 16
            ),
            None => format!("127.0.0.1:0:{n}"),
        };
        RpcMachine::start_on(&*self.xprt, &addr, cfg).expect("start")
    }
}

/// Shuts a machine down and checks that every buffer came back.
pub(crate) fn finish(m: RpcMachine) {
    let dom = m.shutdown().expect("shutdown");
    assert_eq!(dom.buffer_count(), 0, "buffers left registered");
    dom.fini().expect("domain fini");
}

/// A server answering ECHO with the request's payload.
pub(crate) fn echo_server(net: &Net, cfg: RpcConfig) -> RpcMachine {
    let s = net.machine(cfg);
    s.on(ECHO, |req, reply| {
        let p = req.payload().to_vec();
        reply.ok(&p);
    });
    s
}

/// Calls of every size that fits, one too large, an unknown opcode.
pub(crate) fn request_reply_and_sizes(net: &Net) {
    let server = echo_server(net, RpcConfig::default());
    let client = net.machine(RpcConfig::default());
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

/// 8 threads x 300 calls on one session.
pub(crate) fn concurrent_calls(net: &Net) {
    let server = echo_server(net, RpcConfig::default());
    let client = net.machine(RpcConfig::default().with_max_in_flight(4));
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

/// One-way items of two sessions, batched and not: each session's items
/// arrive in order, each once.
pub(crate) fn batching_preserves_order(net: &Net) {
    let server = net.machine(RpcConfig::default());
    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    server.on(COUNT, move |req, reply| {
        assert!(reply.is_oneway());
        let n = u32::from_le_bytes(req.payload()[..4].try_into().unwrap());
        sn.lock().push((req.session(), n));
    });
    // Batched: a delay lets items accumulate; 64-byte items.
    let client = net.machine(RpcConfig::default().with_batch_delay(Duration::from_millis(5)));
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
    let client = net.machine(
        RpcConfig::default()
            .with_batching(false)
            .with_max_in_flight(8),
    );
    let c = client.session(server.addr()).unwrap();
    for i in 0..200u32 {
        c.post(COUNT, &i.to_le_bytes()).unwrap();
    }
    c.flush(Duration::from_secs(10)).unwrap();
    let st = c.stats();
    assert_eq!((st.items_sent, st.msgs_sent), (200, 200));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let order: Vec<u32> = seen
            .lock()
            .iter()
            .filter(|(s, _)| *s == c.id())
            .map(|x| x.1)
            .collect();
        if order.len() == 200 {
            assert_eq!(order, (0..200).collect::<Vec<_>>(), "unbatched order");
            break;
        }
        assert!(Instant::now() < deadline, "{} of 200 items", order.len());
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    finish(client);
    finish(server);
}

/// Resends after timeouts: the handler runs once per call.
pub(crate) fn resend_executes_once(net: &Net) {
    let server = net.machine(RpcConfig::default());
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    // The reply waits until the server has seen at least two resends
    // (a watcher below), not for a fixed time: on a loaded machine the
    // client's timer may fire late, and a resend the client made may still
    // be on its way (or, once the call is answered, taken back unsent).
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let g = go.clone();
    server.on(SLOW, move |req, reply| {
        r.fetch_add(1, Ordering::SeqCst);
        let p = req.payload().to_vec();
        let g = g.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !g.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            reply.ok(&p);
        });
    });
    let client = net.machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let opts = CallOpts::new()
        .timeout(Duration::from_millis(80))
        .retries(100);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while server.stats().duplicates < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            go.store(true, Ordering::SeqCst);
        });
        assert_eq!(s.call_with(SLOW, b"once", opts).unwrap(), b"once");
    });
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

pub(crate) fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A server that pushes a pattern into sinks (READ) and sums sources
/// (WRITE).
pub(crate) fn bulk_server(net: &Net) -> RpcMachine {
    let server = net.machine(RpcConfig::default());
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

/// Bulk reads and writes of 1 B to 1 MiB with data checks; buffers the
/// server ignores come back; wrong directions are refused.
pub(crate) fn bulk_both_directions(net: &Net) {
    let server = bulk_server(net);
    let client = net.machine(RpcConfig::default());
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

/// A server stopped while calls wait: every call fails, promptly.
pub(crate) fn peer_stopped_mid_call(net: &Net) {
    let server = net.machine(RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    server.on(NEVER, move |_req, reply| h.lock().push(reply));
    let client = net.machine(RpcConfig::default());
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
        // bulk_mem: unreachable; TCP: unreachable, or the connection
        // reset if the transport never got to reconnect.
        assert!(
            matches!(&r, Err(e @ RpcError::Net(_)) if e.peer_gone()),
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

/// A call already sent to a server that then stops fails promptly: the
/// client probes servers it waits for, and the transport reports the
/// stopped one unreachable.
pub(crate) fn stopped_server_fails_waiting_calls(net: &Net) {
    let server = net.machine(RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    server.on(NEVER, move |_req, reply| h.lock().push(reply));
    let client = net.machine(RpcConfig::default().with_probe_interval(Duration::from_millis(100)));
    let s = client.session(server.addr()).unwrap();
    // No resends, a long timeout: only the probe can tell.
    let opts = CallOpts::new().timeout(Duration::from_secs(30)).retries(0);
    let calls: Vec<_> = (0..3).map(|_| s.start(NEVER, b"", opts).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.lock().len() < 3 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    finish(server);
    held.lock().clear();
    for c in calls {
        let r = c.wait();
        assert!(
            matches!(&r, Err(e @ RpcError::Net(_)) if e.peer_gone()),
            "{r:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // What told the client is a send to the server that failed: a probe
    // (bulk_mem, TCP, LNet), or over RDMA possibly one of the requests
    // themselves, whose completion waits for the receiver's REPLY frame
    // and fails when the connection goes first.
    let st = client.stats();
    assert!(st.send_failures >= 1, "{st:?}");
    drop(s);
    finish(client);
}

/// Cancelling calls: a call the server holds completes at once with
/// `Cancelled` and its late reply is dropped; a bulk call gets its buffer
/// back; a finished call cannot be cancelled; cancels racing replies
/// complete every call exactly once.
pub(crate) fn cancel_calls(net: &Net) {
    let server = echo_server(net, RpcConfig::default());
    let held: Arc<Mutex<Vec<ReplyHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    server.on(NEVER, move |_req, reply| h.lock().push(reply));
    let client = net.machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let long = CallOpts::new().timeout(Duration::from_secs(30)).retries(0);
    let wait_held = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while held.lock().len() < n {
            assert!(
                Instant::now() < deadline,
                "the server never got the request"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };

    // A plain call, cancelled through a canceller while another thread
    // waits on the handle.
    let c = s.start(NEVER, b"", long).unwrap();
    let canceller = c.canceller();
    wait_held(1);
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || c.wait());
    std::thread::sleep(Duration::from_millis(20));
    assert!(canceller.cancel());
    assert_eq!(waiter.join().unwrap(), Err(RpcError::Cancelled));
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(!canceller.cancel(), "cancelled twice");
    assert_eq!(s.in_flight(), 0);
    // The server answers later: the reply matches nothing.
    held.lock().pop().unwrap().ok(b"late");
    assert_eq!(s.call(ECHO, b"after").unwrap(), b"after");
    // Replies come back in the order the server sent them.
    assert_eq!(client.stats().unmatched_replies, 1);

    // A bulk call: its sink comes back, cancelled.
    let sink = client.alloc(4096).unwrap();
    let id = sink.id();
    let b = s.start_bulk(NEVER, b"", vec![BulkArg::Sink { buf: sink }], long);
    wait_held(1);
    assert!(b.cancel());
    let out = b.wait().unwrap();
    assert_eq!(out.result, Err(RpcError::Cancelled));
    assert_eq!(out.buffers.len(), 1);
    assert_eq!(out.buffers[0].buffer.id(), id);
    assert!(out.buffers[0].result.is_err());
    drop(out);
    held.lock().clear(); // answered NoReply

    // A call that completed cannot be cancelled; its result stays.
    let mut c = s.start(ECHO, b"done", long).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.is_done() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!c.cancel());
    assert_eq!(c.try_result(), Some(Ok(b"done".to_vec())));

    // Cancels racing replies: every call completes once, either way.
    let n = 300;
    let calls: Vec<_> = (0..n)
        .map(|i: u32| s.start(ECHO, &i.to_le_bytes(), long).unwrap())
        .collect();
    let cancellers: Vec<_> = calls.iter().map(CallHandle::canceller).collect();
    let racer = std::thread::spawn(move || {
        cancellers
            .iter()
            .enumerate()
            .filter(|(i, c)| i % 2 == 0 && c.cancel())
            .count()
    });
    let (mut ok, mut cancelled) = (0, 0);
    for (i, c) in calls.into_iter().enumerate() {
        match c.wait() {
            Ok(p) => {
                assert_eq!(p, (i as u32).to_le_bytes());
                ok += 1;
            }
            Err(RpcError::Cancelled) => {
                assert_eq!(i % 2, 0, "call {i} was never cancelled");
                cancelled += 1;
            }
            Err(e) => panic!("call {i}: {e}"),
        }
    }
    assert_eq!(racer.join().unwrap(), cancelled);
    assert_eq!(ok + cancelled, n as usize);
    let st = client.stats();
    assert_eq!(st.cancelled, 2 + cancelled as u64);
    assert_eq!(s.stats().cancelled, st.cancelled);
    drop(s);
    finish(client);
    finish(server);
}

/// The handler a new user writes first: `on` + `bulk_push(..).wait()`.
/// The wait fails at once with `ApiMisuse` and the buffer comes back (the
/// transfer goes on and completes); the server keeps serving. The same
/// handler registered with `on_blocking` works, and so does the async
/// form. A synchronous call, a flush and a shutdown from a handler of `on`
/// fail at once too.
pub(crate) fn blocking_handlers(net: &Net) {
    let server = net.machine(RpcConfig::default().with_handler_threads(2));
    let h = server.handle();
    let misuse: Arc<Mutex<Vec<String>>> = Arc::default();
    let m2 = misuse.clone();
    server.on(READ, move |req, reply| {
        let d = req.bulk()[0].clone();
        let len = d.len as usize;
        let mut buf = h.alloc(len).unwrap();
        buf.bufvec_mut().copy_in(0, &pattern(1, len)).unwrap();
        match h.bulk_push(&d, buf, len).wait() {
            Ok(_) => reply.error(-1),
            Err(blocked) => {
                m2.lock().push(blocked.to_string());
                // Nothing is lost: finish the transfer without waiting.
                blocked
                    .into_handle()
                    .on_complete(move |done| match done.result {
                        Ok(n) => reply.ok(&(n as u64).to_le_bytes()),
                        Err(e) => reply.error(e.errno()),
                    });
            }
        }
    });
    let h = server.handle();
    server
        .on_blocking(WRITE, move |req, reply| {
            let d = req.bulk()[0].clone();
            let buf = h.alloc(d.len as usize).unwrap();
            let done = h.bulk_pull(&d, buf).wait().expect("a pool thread may wait");
            let n = done.result.unwrap();
            let data = done.buffer.bufvec().to_vec(0, n).unwrap();
            reply.ok(&data
                .iter()
                .map(|&b| u64::from(b))
                .sum::<u64>()
                .to_le_bytes());
        })
        .unwrap();
    let h = server.handle();
    server
        .on_async(SLOW, move |req, reply| {
            let h = h.clone();
            async move {
                let d = req.bulk()[0].clone();
                let len = d.len as usize;
                let mut buf = h.alloc(len).unwrap();
                buf.bufvec_mut().copy_in(0, &pattern(3, len)).unwrap();
                let done = h.bulk_push(&d, buf, len).await;
                match done.result {
                    Ok(n) => reply.ok(&(n as u64).to_le_bytes()),
                    Err(e) => reply.error(e.errno()),
                }
            }
        })
        .unwrap();
    // A handler of `on` that calls back, flushes and waits for a state:
    // each fails at once, naming the fix.
    let back = net.machine(RpcConfig::default());
    let back_addr = back.addr().to_string();
    back.on(ECHO, |req, reply| reply.ok(req.payload()));
    let h = server.handle();
    let m3 = misuse.clone();
    server.on(COUNT, move |_req, reply| {
        let s = h.session(&back_addr).unwrap();
        let e = s.call(ECHO, b"x").unwrap_err();
        m3.lock().push(e.to_string());
        let e = s.flush(Duration::from_secs(1)).unwrap_err();
        m3.lock().push(e.to_string());
        let e = colibri_rpc::block_on(async {}).unwrap_err();
        m3.lock().push(e.to_string());
        reply.ok(b"");
    });

    let client = net.machine(RpcConfig::default());
    let s = client.session(server.addr()).unwrap();
    let start = Instant::now();
    for round in 0..3 {
        let len = 64 << 10;
        let sink = client.alloc(len).unwrap();
        let out = s.call_bulk(READ, b"", vec![BulkArg::Sink { buf: sink }]);
        assert_eq!(
            out.result.unwrap(),
            (len as u64).to_le_bytes(),
            "round {round}"
        );
        assert_eq!(
            out.buffers[0].buffer.bufvec().to_vec(0, len).unwrap(),
            pattern(1, len)
        );

        let data = pattern(2 + round, len);
        let mut src = client.alloc(len).unwrap();
        src.bufvec_mut().copy_in(0, &data).unwrap();
        let out = s.call_bulk(WRITE, b"", vec![BulkArg::Source { buf: src, len }]);
        let sum = u64::from_le_bytes(out.result.unwrap().try_into().unwrap());
        assert_eq!(sum, data.iter().map(|&b| u64::from(b)).sum::<u64>());

        let sink = client.alloc(len).unwrap();
        let out = s.call_bulk(SLOW, b"", vec![BulkArg::Sink { buf: sink }]);
        assert_eq!(out.result.unwrap(), (len as u64).to_le_bytes());
        assert_eq!(
            out.buffers[0].buffer.bufvec().to_vec(0, len).unwrap(),
            pattern(3, len)
        );
    }
    s.call(COUNT, b"").unwrap();
    // Nothing froze: the whole exchange takes well under a call timeout.
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    let texts = misuse.lock().clone();
    assert_eq!(texts.len(), 6, "{texts:?}");
    for t in &texts {
        assert!(t.contains("API misuse") && t.contains("on_blocking"), "{t}");
    }
    assert!(texts[0].contains("BulkOp::wait"), "{}", texts[0]);
    assert!(texts[3].contains("Session::call"), "{}", texts[3]);
    assert!(texts[4].contains("Session::flush"), "{}", texts[4]);
    assert!(texts[5].contains("block_on"), "{}", texts[5]);
    drop(s);
    finish(client);
    finish(server);
    finish(back);
}

/// A machine dropped or shut down inside one of its own handlers does not
/// hang: the shutdown is refused with `ApiMisuse` and the machine stops on
/// a thread of its own; its client's calls fail promptly.
pub(crate) fn shutdown_from_a_handler(net: &Net) {
    let server = net.machine(RpcConfig::default());
    let slot: Arc<Mutex<Option<RpcMachine>>> = Arc::default();
    let said: Arc<Mutex<Option<String>>> = Arc::default();
    let (sl, sd) = (slot.clone(), said.clone());
    server.on(ECHO, move |_req, reply| {
        reply.ok(b"bye");
        if let Some(m) = sl.lock().take() {
            *sd.lock() = m.shutdown().err().map(|e| e.to_string());
        }
    });
    let addr = server.addr().to_string();
    *slot.lock() = Some(server);
    let client = net.machine(RpcConfig::default());
    let s = client.session(&addr).unwrap();
    let start = Instant::now();
    assert_eq!(s.call(ECHO, b"").unwrap(), b"bye");
    let deadline = Instant::now() + Duration::from_secs(10);
    while said.lock().is_none() {
        assert!(Instant::now() < deadline, "the handler did not return");
        std::thread::sleep(Duration::from_millis(1));
    }
    let text = said.lock().clone().unwrap();
    assert!(text.contains("RpcMachine::shutdown"), "{text}");
    let r = s.call_with(
        ECHO,
        b"",
        CallOpts::new().timeout(Duration::from_millis(300)),
    );
    assert!(r.is_err(), "{r:?}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    drop(s);
    finish(client);
}
