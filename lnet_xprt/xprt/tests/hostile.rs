//! Hostile input through LNet itself: raw PUTs from the node's own LNet
//! API (garbage and forged control messages, messages without our header
//! data, oversize messages) at a transfer machine's portal; the
//! machine drops or refuses each, loses nothing of its own, and keeps
//! serving a well-behaved peer.

use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{
    BufVec, Domain, NetError, QueueType, RecvParams, TmState, event_channel, ignore_tm_events,
};

#[path = "support/raw.rs"]
mod raw;
use raw::raw_put;

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn garbage_and_forgeries_are_dropped_and_the_machine_serves_on() {
    let mut cfg = LnetConfig::new(&["127.0.76.1@tcp".parse().unwrap()]);
    cfg.accept_port = 0;
    let l = Lnet::start(cfg).unwrap();
    // Small operation ids: the forged NAK below names a sequence number
    // far from those of the machine's own sends.
    let x = LnetTransport::new(
        vec![l.clone()],
        LnetXprtConfig::default().first_op_id(Some(1)),
    )
    .unwrap();
    let dom = Domain::new(&x).unwrap();
    let (cbs, ev) = event_channel(64);
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("127.0.76.1@tcp:12345:40:*").unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    let me = tm.ep().unwrap();
    let a = LnetAddr::parse(me.addr()).unwrap();
    let tmid = u64::from(a.tmid.unwrap());
    let ctl_bits = (tmid << 52) | (1 << 50);
    let msg_bits = tmid << 52;
    // Our header data: magic 0xC1, sequence, TMID, portal, kind.
    let hdr = |kind: u64, seq: u64| (0xC1 << 56) | (seq << 32) | (tmid << 16) | (40 << 8) | kind;
    // Garbage, truncated and forged control messages.
    raw_put(&l, 40, ctl_bits, hdr(2, 0), vec![0xAB; 100]);
    raw_put(&l, 40, ctl_bits, hdr(2, 0), b"CLNC".to_vec());
    let mut forged = b"CLNC".to_vec();
    forged.extend_from_slice(&[3, 5, 0, 0]);
    forged.extend_from_slice(&7u64.to_le_bytes());
    forged.extend_from_slice(&77u64.to_le_bytes());
    // A DELIVERED and a VERDICT for operations that do not exist.
    raw_put(&l, 40, ctl_bits, hdr(2, 7), forged.clone());
    forged[5] = 2;
    forged.resize(42, 0);
    raw_put(&l, 40, ctl_bits, hdr(2, 7), forged);
    // A control message without our header data.
    raw_put(&l, 40, ctl_bits, 0, vec![1; 24]);
    // A message with no receive buffer and no header data: counted, and
    // the NAK has nowhere to go.
    raw_put(&l, 40, msg_bits, 0, vec![2; 10]);
    let deadline = std::time::Instant::now() + WAIT;
    while tm.no_buffer_drops() < 1 {
        assert!(std::time::Instant::now() < deadline, "drop not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A message carrying an acknowledgement of a send that does not
    // exist: the acknowledgement finds nothing, the message is counted.
    raw_put(
        &l,
        40,
        msg_bits | (1 << 51) | 0xFE_DCBA,
        hdr(1, 10),
        vec![4; 8],
    );
    while tm.no_buffer_drops() < 2 {
        assert!(std::time::Instant::now() < deadline, "drop not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // An oversize message fails the receive buffer it landed in.
    tm.add_msg_recv(
        dom.register(BufVec::new(1, 16))
            .unwrap()
            .with_callbacks(cbs.clone()),
        RecvParams::default(),
    )
    .unwrap();
    // (Its NAK comes back to this machine, which names itself as the
    // sender: a sequence number far from those of the machine's own
    // sends, or it would fail one of them.)
    raw_put(&l, 40, msg_bits, hdr(1, 0xAB_CDEF), vec![3; 64]);
    let e = ev.recv_timeout(WAIT).unwrap();
    assert_eq!(e.queue(), QueueType::MsgRecv);
    assert!(
        matches!(e.error(), Some(NetError::MessageTooLarge { .. })),
        "{e:?}"
    );
    drop(e);
    // Still serving: a message to itself arrives whole.
    tm.add_msg_recv(
        dom.register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(cbs.clone()),
        RecvParams::default(),
    )
    .unwrap();
    let mut b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(cbs);
    b.bufvec_mut().copy_in(0, b"still here").unwrap();
    tm.add_msg_send(b, &me, 10).unwrap();
    let mut seen = 0;
    while seen < 2 {
        let e = ev.recv_timeout(WAIT).unwrap();
        assert!(e.is_ok(), "{e:?}");
        if e.queue() == QueueType::MsgRecv {
            assert_eq!(e.message().unwrap(), b"still here");
        }
        seen += 1;
    }
    assert!(ev.recv_timeout(Duration::from_millis(200)).is_err());
    drop(me);
    tm.stop(false).unwrap();
    tm.wait_stopped(WAIT).unwrap();
    tm.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    drop(x);
    l.shutdown();
}
