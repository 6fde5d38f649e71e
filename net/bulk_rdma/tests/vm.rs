//! RDMA-specific tests. Except `domain_needs_a_device`, they need an RDMA
//! device and are `#[ignore]`d; `.ci/run` runs them in the Soft-RoCE VM
//! with `--include-ignored`.
//!
//! * many segments on both sides, so every transfer is split at both
//!   sides' segment boundaries and across work requests (rxe allows 32
//!   SGEs per request);
//! * large registrations (64 MiB in 1 MiB segments) moved both ways;
//! * a peer process killed with SIGKILL in the middle of a GET, a PUT, a
//!   message it is reading, and a GET our engine is writing into it: every
//!   buffer of ours completes exactly once, with `ConnectionReset`, and the
//!   transfer machine then stops and finalises cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use colibri_bulk_rdma::{RdmaConfig, RdmaEngine, RdmaTransport};
use colibri_net::{BufVec, Domain, NetBufDesc, NetError, QueueType, RecvParams, Transport};
use colibri_ut::{Factory, Node, pattern};

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1000);

struct Rdma(RdmaConfig);

impl Factory for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(RdmaTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        "127.0.0.1:1:1".to_string()
    }
}

fn has_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// Without a device, making a domain fails with an error that says so;
/// with one, it works. (Runs everywhere.)
#[test]
fn domain_needs_a_device() {
    let xprt = RdmaTransport::new(RdmaConfig::default());
    match Domain::new(&xprt) {
        Ok(dom) => {
            assert!(has_device(), "a domain without an RDMA device");
            dom.fini().unwrap();
        }
        Err(e) => {
            assert!(
                !has_device(),
                "domain init failed with a device present: {e}"
            );
            assert!(e.to_string().contains("no RDMA device"), "{e}");
        }
    }
}

fn shaped(n: &Node, lens: &[usize], data: Option<&[u8]>) -> colibri_net::NetBuffer {
    let mut b = n.buf_vec(BufVec::from_segments(
        lens.iter().map(|&l| vec![0u8; l]).collect(),
    ));
    if let Some(d) = data {
        b.bufvec_mut().copy_in(0, d).unwrap();
    }
    b
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn many_segments_split_across_work_requests() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    // 300 odd-sized segments against 7: at least 10 work requests per
    // transfer, each boundary of either side a split point.
    let many: Vec<usize> = (0..300).map(|i| 97 + (i * 31) % 200).collect();
    let total: usize = many.iter().sum();
    let few = [total / 7 + 1; 7];
    let data = pattern(7, total);
    // Message: many segments sent, read into few.
    let dest = a.ep(&b.addr);
    b.tm.add_msg_recv(shaped(&b, &few, None), RecvParams::default())
        .unwrap();
    a.tm.add_msg_send(shaped(&a, &many, Some(&data)), &dest, total)
        .unwrap();
    let ev = b.next_event_on(QueueType::MsgRecv);
    assert_eq!(ev.message().unwrap(), data);
    drop(ev);
    assert!(a.next_event_on(QueueType::MsgSend).status().is_ok());
    // GET: few passive segments written into many.
    let (_, d) =
        b.tm.add_passive_send(shaped(&b, &few, Some(&data)), total, None)
            .unwrap();
    a.tm.add_active_recv(shaped(&a, &many, None), &d).unwrap();
    let ev = a.next_event_on(QueueType::ActiveBulkRecv);
    assert_eq!(ev.message().unwrap(), data);
    drop(ev);
    assert!(b.next_event_on(QueueType::PassiveBulkSend).status().is_ok());
    // PUT: many active segments read into few.
    let (_, d) = b.tm.add_passive_recv(shaped(&b, &few, None), None).unwrap();
    a.tm.add_active_send(shaped(&a, &many, Some(&data)), &d, total)
        .unwrap();
    assert!(a.next_event_on(QueueType::ActiveBulkSend).status().is_ok());
    let ev = b.next_event_on(QueueType::PassiveBulkRecv);
    assert_eq!(ev.message().unwrap(), data);
    drop(ev);
    drop(dest);
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn large_registrations_both_ways() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    let len = 64 << 20;
    let data = pattern(11, len);
    let (_, d) =
        b.tm.add_passive_send(b.buf_with(&data, 1 << 20), len, None)
            .unwrap();
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(len, 4 << 20)), &d)
        .unwrap();
    let ev = a.next_event_on(QueueType::ActiveBulkRecv);
    assert!(ev.message().unwrap() == data, "GET data differs");
    drop(ev);
    assert!(b.next_event_on(QueueType::PassiveBulkSend).status().is_ok());
    let (_, d) =
        b.tm.add_passive_recv(b.buf_vec(BufVec::with_len(len, 1 << 20)), None)
            .unwrap();
    a.tm.add_active_send(a.buf_with(&data, 4 << 20), &d, len)
        .unwrap();
    assert!(a.next_event_on(QueueType::ActiveBulkSend).status().is_ok());
    let ev = b.next_event_on(QueueType::PassiveBulkRecv);
    assert!(ev.message().unwrap() == data, "PUT data differs");
    drop(ev);
    a.shutdown();
    b.shutdown();
}

/// A peer process; killed (SIGKILL) and reaped on drop.
struct Peer {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Peer {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_colibri-rdma-peer"))
            .args(args)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn colibri-rdma-peer");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The value of the next line starting with `key`.
    fn expect(&mut self, key: &str) -> String {
        for l in self.lines.by_ref() {
            let l = l.expect("peer output");
            if let Some(rest) = l.strip_prefix(key) {
                return rest.trim().to_string();
            }
        }
        panic!("peer exited before printing {key}");
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Large enough to take most of a second on Soft-RoCE under emulation
/// (50-80 MB/s), so the kill lands in the middle.
const BIG: usize = 48 << 20;
/// How long after the transfer started the peer is killed.
const KILL_AFTER: Duration = Duration::from_millis(150);

/// The one final event of our buffer: `ConnectionReset` (or, if the kill
/// came too late on a fast machine, success); no second event follows.
fn one_reset(n: &Node, q: QueueType) {
    let ev = n.next_event_on(q);
    assert!(ev.is_final());
    match ev.status() {
        Err(NetError::ConnectionReset(_)) => {}
        Ok(_) => eprintln!("note: the transfer finished before the kill"),
        Err(e) => panic!("expected ConnectionReset, got {e}"),
    }
    drop(ev);
    n.expect_quiet();
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn peer_killed_mid_get() {
    let mut p = Peer::spawn(&["passive-send", &BIG.to_string()]);
    let _ = p.expect("ADDR");
    let d = NetBufDesc::from_bytes(unhex(&p.expect("DESC")));
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(BIG, 1 << 20)), &d)
        .unwrap();
    std::thread::sleep(KILL_AFTER);
    p.kill();
    one_reset(&a, QueueType::ActiveBulkRecv);
    a.shutdown();
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn peer_killed_mid_put() {
    let mut p = Peer::spawn(&["passive-recv", &BIG.to_string()]);
    let _ = p.expect("ADDR");
    let d = NetBufDesc::from_bytes(unhex(&p.expect("DESC")));
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    a.tm.add_active_send(a.buf_with(&pattern(3, BIG), 1 << 20), &d, BIG)
        .unwrap();
    std::thread::sleep(KILL_AFTER);
    p.kill();
    one_reset(&a, QueueType::ActiveBulkSend);
    a.shutdown();
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn peer_killed_mid_message() {
    let mut p = Peer::spawn(&["recv", &BIG.to_string()]);
    let addr = p.expect("ADDR");
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let dest = a.ep(&addr);
    a.tm.add_msg_send(a.buf_with(&pattern(5, BIG), 1 << 20), &dest, BIG)
        .unwrap();
    std::thread::sleep(KILL_AFTER);
    p.kill();
    one_reset(&a, QueueType::MsgSend);
    drop(dest);
    a.shutdown();
}

/// The peer GETs our passive buffer: our engine WRITEs into the dying
/// process, so the failure reaches us as error or flush completions of our
/// own work requests, which must complete the passive buffer once.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn peer_killed_while_we_write_into_it() {
    let f = Rdma(RdmaConfig::default());
    let b = Node::start(&f);
    let (_, d) =
        b.tm.add_passive_send(b.buf_with(&pattern(9, BIG), 1 << 20), BIG, None)
            .unwrap();
    let mut p = Peer::spawn(&["get", &hex(d.as_bytes()), &BIG.to_string()]);
    let _ = p.expect("ADDED");
    std::thread::sleep(KILL_AFTER);
    p.kill();
    one_reset(&b, QueueType::PassiveBulkSend);
    b.shutdown();
}

/// After a peer died, a new peer at a new address works: the engine
/// dropped the dead connection.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn traffic_after_a_peer_died() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    for round in 0..2 {
        let mut p = Peer::spawn(&["passive-send", "4096"]);
        let _ = p.expect("ADDR");
        let d = NetBufDesc::from_bytes(unhex(&p.expect("DESC")));
        a.tm.add_active_recv(a.buf(4096), &d).unwrap();
        let ev = a.next_event_on(QueueType::ActiveBulkRecv);
        let want: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        assert_eq!(ev.message().unwrap(), want, "round {round}");
        drop(ev);
        p.kill();
    }
    a.shutdown();
}

/// Waits (bounded) until the buffer is in use by the transport (or
/// already completed).
fn wait_in_use(n: &Node, t: colibri_net::BufToken) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while n.tm.buffer_state(t).is_some_and(|s| !s.in_use) {
        assert!(std::time::Instant::now() < until, "buffer never in use");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The status class of a final event.
fn outcome(ev: &colibri_net::BufferEvent) -> &'static str {
    assert!(ev.is_final(), "{ev:?}");
    match ev.status() {
        Ok(_) => "ok",
        Err(NetError::Cancelled) => "cancelled",
        Err(NetError::TimedOut) => "timed out",
        Err(e) => panic!("unexpected status {e}"),
    }
}

/// A cancel of the active side while the passive side's RDMA moves the
/// data: ABORT, then both sides complete once with the same status (the
/// abort's, or success if the data had all moved), the passive side only
/// after its work requests retired.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn cancel_of_the_active_side_mid_transfer() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    for get in [true, false] {
        let (pt, d) = if get {
            b.tm.add_passive_send(b.buf_with(&pattern(1, BIG), 1 << 20), BIG, None)
                .unwrap()
        } else {
            b.tm.add_passive_recv(b.buf_vec(BufVec::with_len(BIG, 1 << 20)), None)
                .unwrap()
        };
        let t = if get {
            a.tm.add_active_recv(a.buf_vec(BufVec::with_len(BIG, 1 << 20)), &d)
                .unwrap()
        } else {
            a.tm.add_active_send(a.buf_with(&pattern(2, BIG), 1 << 20), &d, BIG)
                .unwrap()
        };
        wait_in_use(&b, pt);
        assert!(a.tm.del(t).unwrap());
        let (aq, bq) = if get {
            (QueueType::ActiveBulkRecv, QueueType::PassiveBulkSend)
        } else {
            (QueueType::ActiveBulkSend, QueueType::PassiveBulkRecv)
        };
        let ea = a.next_event_on(aq);
        let eb = b.next_event_on(bq);
        assert_eq!(outcome(&ea), outcome(&eb), "GET {get}: both sides agree");
        if outcome(&ea) == "ok" {
            eprintln!("note: the transfer finished before the abort");
        }
        drop((ea, eb));
        a.expect_quiet();
        b.expect_quiet();
    }
    a.shutdown();
    b.shutdown();
}

/// A cancel of the passive side while our WRITEs move its data: it
/// completes once its work requests retired, and the requester gets the
/// same status.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn cancel_of_the_passive_side_mid_transfer() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    let (pt, d) =
        b.tm.add_passive_send(b.buf_with(&pattern(1, BIG), 1 << 20), BIG, None)
            .unwrap();
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(BIG, 1 << 20)), &d)
        .unwrap();
    wait_in_use(&b, pt);
    assert!(b.tm.del(pt).unwrap());
    let eb = b.next_event_on(QueueType::PassiveBulkSend);
    let ea = a.next_event_on(QueueType::ActiveBulkRecv);
    assert_eq!(outcome(&ea), outcome(&eb));
    drop((ea, eb));
    a.expect_quiet();
    b.expect_quiet();
    a.shutdown();
    b.shutdown();
}

/// A message cancelled by its sender while the receiver READs it: the
/// receiver's claim is given back (no event), and the receive buffer takes
/// the next message.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn cancel_of_a_message_being_read() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    let rt =
        b.tm.add_msg_recv(
            b.buf_vec(BufVec::with_len(BIG, 1 << 20)),
            RecvParams::default(),
        )
        .unwrap();
    let dest = a.ep(&b.addr);
    let t =
        a.tm.add_msg_send(a.buf_with(&pattern(4, BIG), 1 << 20), &dest, BIG)
            .unwrap();
    wait_in_use(&b, rt);
    assert!(a.tm.del(t).unwrap());
    let ea = a.next_event_on(QueueType::MsgSend);
    if outcome(&ea) == "ok" {
        eprintln!("note: the message arrived before the abort");
        drop(b.next_event_on(QueueType::MsgRecv));
    } else {
        drop(ea);
        b.expect_quiet();
        let small = pattern(5, 1000);
        a.tm.add_msg_send(a.buf_with(&small, 0), &dest, small.len())
            .unwrap();
        let ev = b.next_event_on(QueueType::MsgRecv);
        assert_eq!(ev.message().unwrap(), small);
        drop(ev);
        assert!(a.next_event_on(QueueType::MsgSend).status().is_ok());
    }
    drop(dest);
    a.shutdown();
    b.shutdown();
}

/// Stop with abort on both sides while transfers are in flight in both
/// directions: every buffer completes once, and STOPPED comes after.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn stop_with_abort_mid_transfers() {
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let b = Node::start(&f);
    let (p1, d1) =
        b.tm.add_passive_send(b.buf_with(&pattern(1, BIG), 1 << 20), BIG, None)
            .unwrap();
    let (_, d2) =
        a.tm.add_passive_recv(a.buf_vec(BufVec::with_len(BIG, 1 << 20)), None)
            .unwrap();
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(BIG, 1 << 20)), &d1)
        .unwrap();
    b.tm.add_active_send(b.buf_with(&pattern(2, BIG), 1 << 20), &d2, BIG)
        .unwrap();
    wait_in_use(&b, p1);
    let ea = a.stop(true);
    let eb = b.stop(true);
    // Each side had two buffers; some may have completed during the other
    // side's stop, after its STOPPED: count every final event.
    let mut n = ea.len() + eb.len();
    for ev in ea.iter().chain(eb.iter()) {
        assert!(ev.is_final());
        eprintln!("{:?}: {:?}", ev.queue(), ev.status());
    }
    drop((ea, eb));
    while let Some(ev) = a.events.try_recv().or_else(|| b.events.try_recv()) {
        assert!(ev.is_final());
        n += 1;
    }
    assert_eq!(n, 4, "one final event per buffer");
    a.shutdown();
    b.shutdown();
}

/// Registration pins memory: over `RLIMIT_MEMLOCK` (for a process without
/// `CAP_IPC_LOCK`: the peer runs as `nobody`), `register` fails with an
/// error that names the limit, and the buffer goes back to the caller.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn memlock_limit_is_a_clear_registration_error() {
    let peer = env!("CARGO_BIN_EXE_colibri-rdma-peer");
    let run = |limit: &str, size: &str| -> String {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .args([
                "prlimit",
                &format!("--memlock={limit}"),
                peer,
                "register",
                size,
            ])
            .stdin(Stdio::null())
            .output()
            .expect("setpriv and prlimit (util-linux) run the peer");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "peer failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    // Within the limit: registered.
    let ok = run("67108864", "1048576");
    assert!(ok.contains("REGISTERED"), "{ok}");
    // Over it: a clear error.
    let err = run("65536", "16777216");
    assert!(
        err.contains("ERROR") && err.contains("RLIMIT_MEMLOCK"),
        "{err}"
    );
}

/// The eager path under load: both sides send each other 240 messages at
/// once, far more than the 32 receive slots of a connection (so credits
/// must come back, piggybacked or in CREDIT frames, for the senders to go
/// on: a SEND without a posted receive would be an RNR and reset the
/// connection), mixing 64-byte and slot-filling messages (SENDs, one of
/// them inline) with one byte more than a slot holds (READ by the
/// receiver). Every message arrives intact and every send succeeds, once;
/// the same with small queues (4 send slots, a 64-entry CQ: 16 receive
/// slots) and with the eager path turned off.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn eager_flood_both_ways_never_runs_dry() {
    use colibri_bulk_rdma::wire::MAX_EAGER;
    const N: usize = 240;
    let small = RdmaConfig {
        sq_depth: 4,
        cq_depth: 64,
        ..RdmaConfig::blocking()
    };
    let off = RdmaConfig {
        eager_slots: 0,
        ..RdmaConfig::default()
    };
    for cfg in [RdmaConfig::default(), small, off] {
        let f = Rdma(cfg);
        let a = Node::start(&f);
        let b = Node::start(&f);
        let sizes = [64, MAX_EAGER, MAX_EAGER + 1];
        let msg = |from: u8, i: usize| {
            let mut m = pattern(u64::from(from) * 1000 + i as u64, sizes[i % 3]);
            m[..4].copy_from_slice(&(i as u32).to_le_bytes());
            m[4] = from;
            m
        };
        for n in [&a, &b] {
            for _ in 0..N {
                n.tm.add_msg_recv(
                    n.buf_vec(BufVec::with_len(MAX_EAGER + 1, 1 << 12)),
                    RecvParams::default(),
                )
                .unwrap();
            }
        }
        let (to_b, to_a) = (a.ep(&b.addr), b.ep(&a.addr));
        for i in 0..N {
            a.tm.add_msg_send(a.buf_with(&msg(1, i), 1 << 12), &to_b, sizes[i % 3])
                .unwrap();
            b.tm.add_msg_send(b.buf_with(&msg(2, i), 1 << 12), &to_a, sizes[i % 3])
                .unwrap();
        }
        for (n, from) in [(&a, 2u8), (&b, 1u8)] {
            let mut seen = vec![false; N];
            let mut sent = 0;
            for _ in 0..2 * N {
                let ev = n.next_event();
                assert!(ev.is_final());
                if let Err(e) = ev.status() {
                    panic!("{:?}: {e}", ev.queue());
                }
                match ev.queue() {
                    QueueType::MsgSend => sent += 1,
                    QueueType::MsgRecv => {
                        let m = ev.message().unwrap();
                        let i = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
                        assert!(i < N && !seen[i], "message {i} twice or out of range");
                        assert_eq!(m, msg(from, i), "message {i} from {from}");
                        seen[i] = true;
                    }
                    q => panic!("event on {q:?}"),
                }
            }
            assert_eq!(sent, N);
        }
        a.expect_quiet();
        b.expect_quiet();
        drop((to_b, to_a));
        a.shutdown();
        b.shutdown();
    }
}

/// Two transfer machines of one domain (one device context, one engine:
/// the control connection goes to the engine's own listener and both
/// queue pairs live in the same context) exchange a small message (eager
/// SEND), a large one (READ) and a GET (WRITE).
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn two_machines_of_one_domain() {
    use colibri_net::wait::{event_channel, tm_event_channel};
    use colibri_net::{TmEventKind, TmState};
    let f = Rdma(RdmaConfig::default());
    let a = Node::start(&f);
    let (tcb, tev) = tm_event_channel(16);
    let tm2 = a.dom.tm_init(tcb).unwrap();
    tm2.start(&f.addr()).unwrap();
    let addr2 = match tev.recv_timeout(Duration::from_secs(60)).unwrap().kind {
        TmEventKind::StateChange {
            state: TmState::Started,
            status: Ok(()),
            ep: Some(ep),
        } => ep.addr().to_string(),
        other => panic!("expected STARTED, got {other:?}"),
    };
    let (cbs2, ev2) = event_channel(64);
    let dest = a.ep(&addr2);
    for len in [100, 20_000] {
        let r = a
            .dom
            .register(BufVec::with_len(len, 1 << 12))
            .unwrap()
            .with_callbacks(cbs2.clone());
        tm2.add_msg_recv(r, RecvParams::default()).unwrap();
        let data = pattern(len as u64, len);
        a.tm.add_msg_send(a.buf_with(&data, 1 << 12), &dest, len)
            .unwrap();
        let ev = ev2.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(ev.message().unwrap(), data, "message of {len} bytes");
        drop(ev);
        assert!(a.next_event_on(QueueType::MsgSend).status().is_ok());
    }
    let data = pattern(9, 300_000);
    let mut p = a
        .dom
        .register(BufVec::with_len(data.len(), 1 << 16))
        .unwrap();
    p.bufvec_mut().copy_in(0, &data).unwrap();
    let (_, d) = tm2
        .add_passive_send(p.with_callbacks(cbs2.clone()), data.len(), None)
        .unwrap();
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(data.len(), 1 << 16)), &d)
        .unwrap();
    let ev = a.next_event_on(QueueType::ActiveBulkRecv);
    assert_eq!(ev.message().unwrap(), data);
    drop(ev);
    assert!(
        ev2.recv_timeout(Duration::from_secs(60))
            .unwrap()
            .status()
            .is_ok()
    );
    drop(dest);
    tm2.stop(true).unwrap();
    let _ = tev.recv_timeout(Duration::from_secs(60));
    tm2.fini().unwrap();
    a.shutdown();
}

/// Domains on one shared engine thread: a message and its answer between
/// two of them, a GET, `confine` refused, one domain finalised while
/// the others go on (the thread stays up, its connections too), a domain
/// added after, and a clean stop once every domain and the engine handle
/// are gone.
#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn shared_engine_serves_several_domains() {
    let engine = RdmaEngine::new(1, &RdmaConfig::default()).expect("an RDMA device");
    assert_eq!(engine.threads(), 1);
    let f = Rdma(RdmaConfig::shared(&engine));
    let a = Node::start(&f);
    let b = Node::start(&f);
    assert!(matches!(
        a.tm.confine(&[0]),
        Err(NetError::Unsupported { .. })
    ));
    let exchange = |from: &Node, to: &Node, len: usize| {
        to.tm
            .add_msg_recv(
                to.buf_vec(BufVec::with_len(len, 1 << 12)),
                RecvParams::default(),
            )
            .unwrap();
        let data = pattern(len as u64, len);
        let dest = from.ep(&to.addr);
        from.tm
            .add_msg_send(from.buf_with(&data, 1 << 12), &dest, len)
            .unwrap();
        let ev = to.next_event_on(QueueType::MsgRecv);
        assert_eq!(ev.message().unwrap(), data, "message of {len} bytes");
        drop(ev);
        assert!(from.next_event_on(QueueType::MsgSend).status().is_ok());
    };
    for len in [64, 20_000] {
        exchange(&a, &b, len);
        exchange(&b, &a, len);
    }
    let data = pattern(3, 200_000);
    let mut p = b
        .dom
        .register(BufVec::with_len(data.len(), 1 << 16))
        .unwrap();
    p.bufvec_mut().copy_in(0, &data).unwrap();
    let (_, d) =
        b.tm.add_passive_send(p.with_callbacks(b.cbs.clone()), data.len(), None)
            .unwrap();
    a.tm.add_active_recv(a.buf_vec(BufVec::with_len(data.len(), 1 << 16)), &d)
        .unwrap();
    let ev = a.next_event_on(QueueType::ActiveBulkRecv);
    assert_eq!(ev.message().unwrap(), data);
    drop(ev);
    assert!(b.next_event_on(QueueType::PassiveBulkSend).status().is_ok());
    b.shutdown();
    let c = Node::start(&f);
    exchange(&a, &c, 64);
    exchange(&c, &a, 5_000);
    a.shutdown();
    c.shutdown();
    drop(f);
    drop(engine);
}
