//! What a stopped machine's address (its *tomb*) answers: a message gets
//! a NAK `Unreachable`, a bulk request or verdict a GONE, and a control
//! message that expects no answer (DELIVERED, NAK, ABORT, GONE) nothing.
//! Two tombs that answered each other's GONE would exchange GONEs for as
//! long as both addresses stayed free. A TMID where no machine ever ran,
//! on a portal where one of ours runs, answers as a tomb does (the
//! portal's vacancy): messages, and bulk requests for a descriptor whose
//! machine is gone with its transport.

use std::time::{Duration, Instant};

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, NetError, QueueType, TmState, event_channel, ignore_tm_events};

#[path = "support/nodes.rs"]
mod nodes;
#[path = "support/raw.rs"]
mod raw;
use nodes::socklnd_nodes;
use raw::{ctl, hdr, raw_put};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn tombs_do_not_answer_what_expects_no_answer() {
    let mut cfg = LnetConfig::new(&["127.0.77.1@tcp".parse().unwrap()]);
    cfg.accept_port = 0;
    let l = Lnet::start(cfg).unwrap();
    let x = LnetTransport::new(vec![l.clone()], LnetXprtConfig::default()).unwrap();
    let dom = Domain::new(&x).unwrap();
    // Two machines on portal 41 stop: each leaves a tomb at its address.
    let mut tmids = Vec::new();
    for _ in 0..2 {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start("127.0.77.1@tcp:12345:41:*").unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tmids.push(u64::from(
            LnetAddr::parse(tm.ep().unwrap().addr())
                .unwrap()
                .tmid
                .unwrap(),
        ));
        tm.stop(false).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    }
    let (a, b) = (tmids[0], tmids[1]);
    let sends = || l.with_node(|n| n.stats().send_count);
    // Waits until `want` LNet messages left in all (or, with no count
    // expected, until the count holds still), then checks that no more
    // leave (an answer that keeps being answered would).
    let settle = |want: Option<u64>, what: &str| {
        let deadline = Instant::now() + WAIT;
        let mut n = sends();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = sends();
            let done = match want {
                Some(w) => now >= w,
                None => now == n,
            };
            n = now;
            if done {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: {n} sent");
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(sends(), n, "{what}: LNet messages keep leaving");
        if let Some(w) = want {
            assert_eq!(n, w, "{what}");
        }
        n
    };
    // The raw PUTs below go to the node's own NID, which (as in Lustre)
    // takes the socket LND and discovery of the node itself: done first,
    // so that only the PUTs and their answers are counted.
    l.discover("127.0.77.1@tcp".parse().unwrap(), false)
        .unwrap();
    let before = settle(None, "at rest");
    let ctl_bits = |tmid: u64| (tmid << 52) | (1 << 50);
    let msg_bits = |tmid: u64| tmid << 52;
    // A GONE (a note, kind 4) at tomb `a`, from tomb `b`'s address:
    // nothing answers it (only the GONE leaves).
    raw_put(&l, 41, ctl_bits(a), hdr(4, 41, b, 5), ctl(6, 5, [0; 8]));
    let n = settle(Some(before + 1), "a GONE at a tomb");
    // A control message that expects an answer (kind 2), from `b`: `a`
    // answers GONE once, and `b`, a tomb too, does not answer that.
    raw_put(&l, 41, ctl_bits(a), hdr(2, 41, b, 6), ctl(6, 6, [0; 8]));
    let m = settle(Some(n + 2), "a request between two tombs");
    // A message from `b`: one NAK, not answered either.
    raw_put(&l, 41, msg_bits(a), hdr(1, 41, b, 7), vec![1; 8]);
    settle(Some(m + 2), "a message between two tombs");
    drop(dom);
    drop(x);
    l.shutdown();
}

#[test]
fn a_message_to_a_tmid_where_no_machine_ever_ran_is_answered_unreachable() {
    // Two nodes over the socket LND; a machine runs on portal 44 of the
    // server node. A message to another TMID of that portal, where no
    // machine ever ran (so no tomb is there), finds the portal's vacancy
    // and is NAKed `Unreachable` at once, as a TCP server answers for a
    // service it does not run; one to a portal where no machine of ours
    // runs is dropped by LNet and ends by the handshake timeout.
    let nodes = socklnd_nodes(&["127.0.77.5@tcp", "127.0.77.6@tcp"]);
    let handshake = Duration::from_secs(2);
    let x = LnetTransport::new(
        nodes.clone(),
        LnetXprtConfig::default().handshake_timeout(handshake),
    )
    .unwrap();
    let dom = Domain::new(&x).unwrap();
    let start = |addr: &str| {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start(addr).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tm
    };
    let server = start("127.0.77.6@tcp:12345:44:3");
    let client = start("127.0.77.5@tcp:12345:44:*");
    let (cbs, events) = event_channel(16);
    let send = |to: &str| {
        let ep = client.ep_create(to).unwrap();
        let mut b = dom
            .register(BufVec::new(1, 32))
            .unwrap()
            .with_callbacks(cbs.clone());
        b.bufvec_mut().copy_in(0, b"is anyone there?").unwrap();
        let t0 = Instant::now();
        client.add_msg_send(b, &ep, 16).unwrap();
        let ev = events.recv_timeout(WAIT).unwrap();
        assert_eq!(ev.queue(), QueueType::MsgSend);
        (ev.error().cloned(), t0.elapsed())
    };
    for tmid in [0, 7, 4095] {
        let (err, took) = send(&format!("127.0.77.6@tcp:12345:44:{tmid}"));
        assert!(
            matches!(err, Some(NetError::Unreachable(_))),
            "TMID {tmid}: {err:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "TMID {tmid}: answered after {took:?}"
        );
    }
    // The machine that runs there still gets its messages.
    let (cbs_s, events_s) = event_channel(4);
    let rb = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs_s);
    server
        .add_msg_recv(rb, colibri_net::RecvParams::default())
        .unwrap();
    let (err, _) = send("127.0.77.6@tcp:12345:44:3");
    assert_eq!(err, None);
    let got = events_s.recv_timeout(WAIT).unwrap();
    assert_eq!((got.queue(), got.error()), (QueueType::MsgRecv, None));
    drop(got);
    // No machine of ours on portal 45: nothing answers.
    let (err, took) = send("127.0.77.6@tcp:12345:45:3");
    assert!(matches!(err, Some(NetError::TimedOut)), "{err:?}");
    assert!(took >= handshake - Duration::from_millis(100), "{took:?}");
    for tm in [client, server] {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    }
    dom.fini().map_err(|e| e.error).unwrap();
    drop(x);
    for n in nodes {
        n.shutdown();
    }
}

#[test]
fn a_bulk_request_to_a_tmid_where_no_machine_runs_is_answered_at_once() {
    // A passive buffer's descriptor outlives its machine and the
    // transport it ran on (a server process restarted at the same NID),
    // so no tomb is left at its address; a machine of the new transport
    // runs on the same portal at another TMID. An active read against the
    // old descriptor finds the portal's vacancy, whose GONE fails it at
    // once instead of at the handshake timeout.
    let nodes = socklnd_nodes(&["127.0.77.7@tcp", "127.0.77.8@tcp"]);
    let handshake = Duration::from_secs(5);
    let xprt = |n: &Lnet| {
        LnetTransport::new(
            vec![n.clone()],
            LnetXprtConfig::default().handshake_timeout(handshake),
        )
        .unwrap()
    };
    let start = |dom: &Domain, addr: &str| {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start(addr).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tm
    };
    let finish = |tm: colibri_net::TransferMachine| {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    };
    let (cbs, events) = event_channel(16);
    let old = xprt(&nodes[1]);
    let old_dom = Domain::new(&old).unwrap();
    let gone = start(&old_dom, "127.0.77.8@tcp:12345:46:3");
    let mut src = old_dom
        .register(BufVec::new(1, 4096))
        .unwrap()
        .with_callbacks(cbs.clone());
    src.bufvec_mut().copy_in(0, &[7; 4096]).unwrap();
    let (_, desc) = gone.add_passive_send(src, 4096, None).unwrap();
    finish(gone);
    let ev = events.recv_timeout(WAIT).unwrap();
    assert_eq!(ev.queue(), QueueType::PassiveBulkSend);
    drop(ev);
    old_dom.fini().map_err(|e| e.error).unwrap();
    drop(old);

    let new = xprt(&nodes[1]);
    let new_dom = Domain::new(&new).unwrap();
    let other = start(&new_dom, "127.0.77.8@tcp:12345:46:5");
    let client_x = xprt(&nodes[0]);
    let dom = Domain::new(&client_x).unwrap();
    let client = start(&dom, "127.0.77.7@tcp:12345:46:*");
    let sink = dom
        .register(BufVec::new(1, 4096))
        .unwrap()
        .with_callbacks(cbs.clone());
    let t0 = Instant::now();
    client.add_active_recv(sink, &desc).unwrap();
    let ev = events.recv_timeout(WAIT).unwrap();
    let took = t0.elapsed();
    assert_eq!(ev.queue(), QueueType::ActiveBulkRecv);
    assert!(
        matches!(ev.error(), Some(NetError::Unreachable(_))),
        "{ev:?}"
    );
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?}: {ev:?}"
    );
    drop(ev);
    finish(client);
    finish(other);
    dom.fini().map_err(|e| e.error).unwrap();
    new_dom.fini().map_err(|e| e.error).unwrap();
    drop((client_x, new));
    for n in nodes {
        n.shutdown();
    }
}
