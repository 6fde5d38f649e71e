//! Transfer machines with their own delivery threads
//! (`LnetXprtConfig::thread_per_tm`): a slow callback of one machine does
//! not hold up another machine of the same LNet node, and `confine` checks
//! its CPU set as the other transports do and pins the machine's thread.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{
    BufVec, BufferCallbacks, Domain, EndPoint, NetError, QueueType, RecvParams, TmHandle, TmState,
    TransferMachine, event_channel, ignore_tm_events,
};

const WAIT: Duration = Duration::from_secs(60);

fn transport(nid: &str, cfg: LnetXprtConfig) -> LnetTransport {
    let mut c = LnetConfig::new(&[nid.parse().unwrap()]);
    c.accept_port = 0;
    LnetTransport::new(vec![Lnet::start(c).unwrap()], cfg).unwrap()
}

fn started(dom: &Domain, portal: u32) -> TransferMachine {
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start(&format!("0@lo:12345:{portal}:*")).unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    tm
}

fn finish(tms: Vec<TransferMachine>) {
    for tm in tms {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    }
}

/// A receive callback that reports its thread's name, then (the first
/// time) waits for `gate`: the slow callback.
fn slow_callbacks(entered: Sender<String>, gate: Receiver<()>) -> Arc<BufferCallbacks> {
    Arc::new(BufferCallbacks::new().on_all(move |_, ev| {
        if ev.queue() == QueueType::MsgRecv {
            let name = std::thread::current().name().unwrap_or("").to_string();
            let _ = entered.send(name);
            // Bounded: a test that fails still ends.
            let _ = gate.recv_timeout(WAIT);
        }
    }))
}

/// A message from `from` to `to` (a receive buffer with `cbs` queued at
/// `to` first).
fn message(dom: &Domain, from: &TmHandle, to: &TmHandle, cbs: Arc<BufferCallbacks>) {
    to.add_msg_recv(
        dom.register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(cbs),
        RecvParams::default(),
    )
    .unwrap();
    let (scb, _sev) = event_channel(4);
    let mut b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(scb);
    b.bufvec_mut().copy_in(0, b"ping").unwrap();
    let ep: EndPoint = from.ep_create(to.ep().unwrap().addr()).unwrap();
    from.add_msg_send(b, &ep, 4).unwrap();
}

/// Machine A's receive callback blocks; a message to machine B of the same
/// node still reaches B's callback with thread-per-machine. With the
/// default (the node's engine runs every callback) it cannot until A's
/// callback returns: the contrast shows the test sees what it claims.
fn slow_callback_case(per_tm: bool, nid: &str) {
    let x = transport(nid, LnetXprtConfig::default().thread_per_tm(per_tm));
    let dom = Domain::new(&x).unwrap();
    let (a, b, c) = (started(&dom, 30), started(&dom, 31), started(&dom, 32));
    let (entered_tx, entered) = bounded(4);
    let (gate_tx, gate) = bounded(1);
    message(&dom, &c, &a, slow_callbacks(entered_tx, gate));
    let a_thread = entered.recv_timeout(WAIT).expect("A's callback ran");
    // A's callback is now blocked on the gate.
    let (bcb, bev) = event_channel(4);
    message(&dom, &c, &b, bcb);
    if per_tm {
        assert!(a_thread.starts_with("colibri-lnet-tm-"), "{a_thread}");
        let ev = bev
            .recv_timeout(WAIT)
            .expect("B's message came while A's callback was blocked");
        assert!(ev.is_ok(), "{ev:?}");
        assert_eq!(ev.message().unwrap(), b"ping");
        gate_tx.send(()).unwrap();
    } else {
        assert_eq!(a_thread, "colibri-lnet-xprt");
        // The engine thread is in A's callback: nothing of the node's
        // other machines can run until it returns.
        assert!(bev.recv_timeout(Duration::from_millis(300)).is_err());
        gate_tx.send(()).unwrap();
        let ev = bev.recv_timeout(WAIT).expect("B's message after A's");
        assert!(ev.is_ok(), "{ev:?}");
    }
    finish(vec![a, b, c]);
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}

#[test]
fn a_slow_callback_of_one_machine_does_not_delay_another_on_the_node() {
    slow_callback_case(true, "127.0.76.1@tcp");
}

#[test]
fn without_threads_a_slow_callback_holds_up_the_node() {
    slow_callback_case(false, "127.0.76.2@tcp");
}

#[test]
fn confine_is_declared_with_threads_only() {
    let x = transport("127.0.76.4@tcp", LnetXprtConfig::default());
    let dom = Domain::new(&x).unwrap();
    // The engine thread serves every machine of its node: not confinable.
    assert!(!dom.caps().confine);
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    assert!(matches!(
        tm.confine(&[0]),
        Err(NetError::Unsupported { .. })
    ));
    tm.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}

#[test]
fn confine_checks_the_cpu_set_and_pins_the_machines_thread() {
    let x = transport(
        "127.0.76.3@tcp",
        LnetXprtConfig::default().thread_per_tm(true),
    );
    let dom = Domain::new(&x).unwrap();
    assert!(dom.caps().confine);
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    // As bulk_tcp: a CPU that does not exist, an empty set.
    assert!(matches!(
        tm.confine(&[100_000]),
        Err(NetError::InvalidArgument(m)) if m.contains("does not exist")
    ));
    assert!(matches!(
        tm.confine(&[]),
        Err(NetError::InvalidArgument(m)) if m.contains("empty")
    ));
    // A receive buffer cancelled before start: its callback runs on the
    // machine's own thread already.
    let (tx, names) = bounded(8);
    let cbs = Arc::new(BufferCallbacks::new().on_all(move |_, ev| {
        let name = std::thread::current().name().unwrap_or("").to_string();
        let _ = tx.send((ev.queue(), ev.is_ok(), name));
    }));
    let early = tm
        .add_msg_recv(
            dom.register(BufVec::new(1, 64))
                .unwrap()
                .with_callbacks(cbs.clone()),
            RecvParams::default(),
        )
        .unwrap();
    tm.confine(&[0]).unwrap();
    tm.del(early).unwrap();
    let (q, ok, name) = names.recv_timeout(WAIT).unwrap();
    assert_eq!((q, ok), (QueueType::MsgRecv, false));
    assert!(name.starts_with("colibri-lnet-tm-"), "{name}");
    // Confining again re-pins the same thread.
    tm.confine(&[0]).unwrap();
    tm.start("0@lo:12345:30:*").unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    assert!(matches!(tm.confine(&[0]), Err(NetError::WrongState { .. })));
    // A message to itself: the receive callback runs on its own thread,
    // pinned to CPU 0 (the thread reports where it may run).
    let (ctx, cpus) = bounded(4);
    let pinned = Arc::new(BufferCallbacks::new().on_all(move |_, _| {
        let name = std::thread::current().name().unwrap_or("").to_string();
        let _ = ctx.send((name, core_affinity_of_current()));
    }));
    message(&dom, &tm, &tm, pinned);
    let (name, allowed) = cpus.recv_timeout(WAIT).unwrap();
    assert!(name.starts_with("colibri-lnet-tm-"), "{name}");
    if let Some(allowed) = allowed {
        assert_eq!(allowed, vec![0], "the machine's thread is pinned to CPU 0");
    }
    drop(cbs);
    finish(vec![tm]);
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}

/// The CPUs the calling thread may run on (Linux: `Cpus_allowed_list` of
/// `/proc/thread-self/status`); `None` where that cannot be read.
fn core_affinity_of_current() -> Option<Vec<usize>> {
    let s = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim()
        .to_string();
    let mut v = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => v.push(part.parse().ok()?),
        }
    }
    Some(v)
}

/// Over the socket LND, a message's receive callback runs on the
/// scheduler thread that read it (no hand-off to the engine thread), with
/// blocking waits refused there as on every delivery thread; the node's
/// loopback messages still go through the engine thread.
#[test]
fn a_message_from_another_node_is_taken_by_the_scheduler_that_read_it() {
    use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
    let node = |n: &str| {
        let mut c = LnetConfig::new(&[n.parse().unwrap()]);
        c.accept_port = 0;
        c.accept = AcceptPolicy::All;
        Lnet::start(c).unwrap()
    };
    let (an, bn) = ("127.0.76.5@tcp", "127.0.76.6@tcp");
    let (a, b) = (node(an), node(bn));
    a.set_peer_addr(
        bn.parse().unwrap(),
        b.listen_addr(bn.parse().unwrap()).unwrap(),
    );
    b.set_peer_addr(
        an.parse().unwrap(),
        a.listen_addr(an.parse().unwrap()).unwrap(),
    );
    let x = LnetTransport::new(vec![a.clone(), b.clone()], LnetXprtConfig::default()).unwrap();
    let dom = Domain::new(&x).unwrap();
    let start = |addr: &str| {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start(addr).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tm
    };
    let (ta, tb) = (
        start(&format!("{an}:12345:30:*")),
        start(&format!("{bn}:12345:30:*")),
    );
    let (tx, seen) = bounded(4);
    let cbs = Arc::new(BufferCallbacks::new().on_all(move |tm, ev| {
        if ev.queue() == QueueType::MsgRecv {
            let name = std::thread::current().name().unwrap_or("").to_string();
            // A blocking wait here would stall the scheduler: refused.
            let refused = matches!(
                tm.wait_for_state(TmState::Started, Duration::from_millis(1)),
                Err(NetError::ApiMisuse(_))
            );
            let _ = tx.send((ev.message().ok(), name, refused));
        }
    }));
    message(&dom, &tb, &ta, cbs);
    let (msg, name, refused) = seen.recv_timeout(WAIT).expect("the message came");
    assert_eq!(msg.as_deref(), Some(&b"ping"[..]));
    assert!(name.starts_with("socknal_sd"), "{name}");
    assert!(refused, "a blocking wait on a scheduler was allowed");
    finish(vec![ta, tb]);
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}
