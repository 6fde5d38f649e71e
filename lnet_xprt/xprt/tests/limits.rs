//! LNet's message limit: one LNet message carries at most `LNET_MTU`
//! (1 MiB), as in Motr's LNet transport. A longer send is refused at add
//! with `MessageTooLarge` and the buffer handed back untouched; a send of
//! exactly 1 MiB goes through; nothing stays queued. And one transport
//! per LNet node: a node's events go to one consumer.

use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{
    BufVec, Domain, NetError, QueueType, RecvParams, TmState, event_channel, ignore_tm_events,
};

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_message_above_one_mib_is_refused_with_message_too_large_and_nothing_lost() {
    let mut c = LnetConfig::new(&["127.0.77.1@tcp".parse().unwrap()]);
    c.accept_port = 0;
    let x = LnetTransport::new(vec![Lnet::start(c).unwrap()], LnetXprtConfig::default()).unwrap();
    let dom = Domain::new(&x).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("0@lo:12345:30:*").unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    let me = tm.ep().unwrap();
    let (cbs, events) = event_channel(8);
    let data: Vec<u8> = (0..=MIB).map(|i| (i % 251) as u8).collect();
    let mut big = dom
        .register(BufVec::with_len(MIB + 1, 64 * 1024))
        .unwrap()
        .with_callbacks(cbs.clone());
    big.bufvec_mut().copy_in(0, &data).unwrap();
    let refused = tm.add_msg_send(big, &me, MIB + 1).unwrap_err();
    assert!(
        matches!(refused.error, NetError::MessageTooLarge { len, space } if len == MIB + 1 && space == MIB),
        "{:?}",
        refused.error
    );
    assert_eq!(refused.error.errno(), -90, "-EMSGSIZE");
    // The buffer is back, its bytes as they were, and nothing is queued.
    let mut big = refused.buffer;
    assert_eq!(big.bufvec().to_vec(0, MIB + 1).unwrap(), data);
    assert_eq!(tm.queued(), 0);
    // Exactly the limit goes through, into a receive buffer of 1 MiB.
    tm.add_msg_recv(
        dom.register(BufVec::with_len(MIB, 64 * 1024))
            .unwrap()
            .with_callbacks(cbs.clone()),
        RecvParams::default(),
    )
    .unwrap();
    big.set_callbacks(cbs.clone());
    tm.add_msg_send(big, &me, MIB).unwrap();
    let mut got = 0;
    for _ in 0..2 {
        let ev = events.recv_timeout(WAIT).unwrap();
        assert!(ev.is_ok(), "{ev:?}");
        if ev.queue() == QueueType::MsgRecv {
            assert_eq!(ev.length(), MIB);
            assert!(
                ev.with_data(|b| b.to_vec(0, MIB).unwrap() == data[..MIB])
                    .unwrap()
            );
        }
        got += 1;
    }
    assert_eq!(got, 2);
    drop((cbs, me));
    tm.stop(false).unwrap();
    tm.wait_stopped(WAIT).unwrap();
    tm.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}

#[test]
fn a_second_transport_over_a_node_is_refused_until_the_first_is_gone() {
    let mut c = LnetConfig::new(&["127.0.77.2@tcp".parse().unwrap()]);
    c.accept_port = 0;
    let l = Lnet::start(c).unwrap();
    let first = LnetTransport::new(vec![l.clone()], LnetXprtConfig::default()).unwrap();
    // Two would each take events the other waits for.
    let second = LnetTransport::new(vec![l.clone()], LnetXprtConfig::default());
    match second {
        Err(NetError::Busy(why)) => assert!(why.contains("127.0.77.2@tcp"), "{why}"),
        other => panic!("a second transport over one node: {other:?}"),
    }
    // Clones share the one transport, as the refusal says.
    let shared = first.clone();
    let dom = Domain::new(&shared).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("127.0.77.2@tcp:12345:30:*").unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    tm.stop(false).unwrap();
    tm.wait_stopped(WAIT).unwrap();
    tm.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    drop((first, shared));
    // Gone (every clone dropped, the domain finalised): the node may
    // carry a new one at once.
    let again = LnetTransport::new(vec![l.clone()], LnetXprtConfig::default()).unwrap();
    drop(again);
    l.shutdown();
}

/// TMIDs as Motr's LNet transport hands them out: `*` takes the highest
/// free one, an explicit TMID in use (by a `*` machine or another) is
/// refused with `AddrInUse`, a `*` skips TMIDs taken explicitly, and a
/// finalised machine's TMID is free again.
#[test]
fn wildcard_tmids_are_unique_skip_explicit_ones_and_come_back() {
    let mut c = LnetConfig::new(&["127.0.77.3@tcp".parse().unwrap()]);
    c.accept_port = 0;
    let x = LnetTransport::new(vec![Lnet::start(c).unwrap()], LnetXprtConfig::default()).unwrap();
    let dom = Domain::new(&x).unwrap();
    // Starts a machine at `addr`: its TMID, or why it failed (at once or
    // with its FAILED event).
    let start = |addr: &str| {
        let (cb, events) = colibri_net::tm_event_channel(8);
        let tm = dom.tm_init(cb).unwrap();
        let failure = match tm.start(addr) {
            Err(e) => Some(e),
            Ok(()) => loop {
                let ev = events.recv_timeout(WAIT).expect("a state change");
                if let colibri_net::TmEventKind::StateChange { state, status, .. } = ev.kind {
                    match (state, status) {
                        (TmState::Started, _) => break None,
                        (TmState::Failed, Err(e)) => break Some(e),
                        _ => {}
                    }
                }
            },
        };
        drop(events);
        match failure {
            None => {
                let tmid = tm
                    .ep()
                    .unwrap()
                    .addr()
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .to_owned();
                Ok((tm, tmid))
            }
            Some(e) => {
                tm.fini().map_err(|e| e.error).unwrap();
                Err(e)
            }
        }
    };
    let (a, ta) = start("127.0.77.3@tcp:12345:33:*").unwrap();
    let (b, tb) = start("127.0.77.3@tcp:12345:33:*").unwrap();
    assert_eq!((ta.as_str(), tb.as_str()), ("4095", "4094"));
    let (e, te) = start("127.0.77.3@tcp:12345:33:4093").unwrap();
    assert_eq!(te, "4093");
    for taken in ["4095", "4093"] {
        let err = start(&format!("127.0.77.3@tcp:12345:33:{taken}")).unwrap_err();
        assert!(matches!(err, NetError::AddrInUse(_)), "{err:?}");
    }
    let (d, td) = start("127.0.77.3@tcp:12345:33:*").unwrap();
    assert_eq!(td, "4092", "skips the explicit 4093");
    // Another portal has its own TMIDs.
    let (p, tp) = start("127.0.77.3@tcp:12345:34:*").unwrap();
    assert_eq!(tp, "4095");
    let stop = |tm: colibri_net::TransferMachine| {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    };
    stop(a);
    let (a2, ta2) = start("127.0.77.3@tcp:12345:33:*").unwrap();
    assert_eq!(ta2, "4095", "free again once its machine is gone");
    for tm in [a2, b, e, d, p] {
        stop(tm);
    }
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}
