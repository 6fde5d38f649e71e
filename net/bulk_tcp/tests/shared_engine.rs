//! A shared engine: many domains, a fixed number of I/O threads, messages
//! between domains on the same thread and on different threads, and the
//! threads gone once the engine and its domains are.
//!
//! One test in this binary: it counts the process's I/O threads, which
//! another test running in parallel would change.

use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_bulk_tcp::{TcpConfig, TcpEngine, TcpTransport};
use colibri_net::{
    BufVec, Domain, NetError, QueueType, RecvParams, TmState, event_channel, ignore_tm_events,
};

const WAIT: Duration = Duration::from_secs(30);

/// Threads of this process named like the transport's I/O threads.
fn io_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "colibri-tcp-io")
        .count()
}

/// Waits until `f` holds (threads exit after their last user lets go).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + WAIT;
    while !f() {
        assert!(
            Instant::now() < end,
            "{what}: still not true after {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn many_domains_share_a_fixed_set_of_io_threads() {
    let before = io_threads();
    let engine = TcpEngine::new(2, &TcpConfig::default()).unwrap();
    // A thread names itself once it runs.
    eventually("two I/O threads", || io_threads() == before + 2);
    let xprt = TcpTransport::new(TcpConfig::shared(&engine));
    let n = 40;
    let doms: Vec<Domain> = (0..n).map(|_| Domain::new(&xprt).unwrap()).collect();

    let tms: Vec<_> = doms
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let tm = d.tm_init(ignore_tm_events()).unwrap();
            tm.start(&format!("127.0.0.1:0:{}", i + 1)).unwrap();
            tm
        })
        .collect();
    for tm in &tms {
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
    }
    assert_eq!(io_threads(), before + 2, "no thread per domain");
    // A machine on a shared thread cannot be pinned for itself alone.
    let extra = doms[0].tm_init(ignore_tm_events()).unwrap();
    assert!(matches!(
        extra.confine(&[0]),
        Err(NetError::Unsupported { .. })
    ));
    extra.fini().unwrap();

    // Each domain sends to the next one (neighbours are on different
    // threads, every other one on the same), a message each way.
    let (cbs, events) = event_channel(4 * n);
    for (tm, d) in tms.iter().zip(&doms) {
        let b = d
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(Arc::clone(&cbs));
        tm.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    for i in 0..n {
        let to = tms[(i + 1) % n].ep().unwrap().addr().to_string();
        let ep = tms[i].ep_create(&to).unwrap();
        let mut b = doms[i]
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(Arc::clone(&cbs));
        b.bufvec_mut()
            .copy_in(0, &(i as u64).to_le_bytes())
            .unwrap();
        tms[i].add_msg_send(b, &ep, 8).unwrap();
    }
    let mut got = vec![false; n];
    for _ in 0..2 * n {
        let ev = events.recv_timeout(WAIT).expect("an event");
        assert!(ev.is_ok(), "{:?}", ev.error());
        if ev.queue() == QueueType::MsgRecv {
            let m = ev.message().unwrap();
            let from = u64::from_le_bytes(m[..8].try_into().unwrap()) as usize;
            assert!(!got[from], "message {from} twice");
            got[from] = true;
        }
    }
    assert!(got.iter().all(|&g| g), "every message arrived once");

    for tm in &tms {
        tm.stop(true).unwrap();
    }
    for tm in tms {
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().unwrap();
    }
    drop(cbs);
    for d in doms {
        d.fini().unwrap();
    }
    assert_eq!(
        io_threads(),
        before + 2,
        "the engine's threads outlive its domains"
    );
    drop(xprt);
    drop(engine);
    eventually("the engine's threads exit", || io_threads() == before);
}
