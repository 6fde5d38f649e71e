//! Only the machine a message went to can end its send: DELIVERED and
//! NAK name the send by its sequence number, and sequence numbers are per
//! sender, so the same number from anyone else (here: forged, for every
//! number the send could have) is ignored.

use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{MdOptions, MdSpec, MemRef, Threshold, Unlink};
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, NetError, QueueType, TmState, event_channel, ignore_tm_events};

const WAIT: Duration = Duration::from_secs(30);

/// PUTs `bytes` with `hdr` to `(portal, bits)` of the node itself.
fn raw_put(l: &Lnet, portal: u32, bits: u64, hdr: u64, bytes: Vec<u8>) {
    let len = bytes.len() as u32;
    let key = l.register(&MemRegion::from_vec(bytes));
    let md = l
        .md_bind(
            MdSpec::new(MemRef::new(key, 0, len), MdOptions::empty())
                .threshold(Threshold::Count(1))
                .unlink(Unlink::Unlink),
        )
        .unwrap();
    l.put(
        md,
        false,
        ProcessId::lustre(l.nids()[0]),
        portal,
        bits,
        0,
        hdr,
    )
    .unwrap();
}

/// A control note (kind 5 DELIVERED or 4 NAK) for sequence number `xid`.
fn note(kind: u8, xid: u64, tail: [u8; 8]) -> Vec<u8> {
    let mut b = b"CLNC".to_vec();
    b.extend_from_slice(&[1, kind, 0, 0]);
    b.extend_from_slice(&xid.to_le_bytes());
    b.extend_from_slice(&tail);
    b
}

#[test]
fn answers_from_another_machine_end_no_send() {
    let mut cfg = LnetConfig::new(&["127.0.78.1@tcp".parse().unwrap()]);
    cfg.accept_port = 0;
    let l = Lnet::start(cfg).unwrap();
    let mut xc = LnetXprtConfig::default();
    xc.handshake_timeout = Duration::from_secs(2);
    let x = LnetTransport::new(vec![l.clone()], xc).unwrap();
    let dom = Domain::new(&x).unwrap();
    let (cbs, ev) = event_channel(64);
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("127.0.78.1@tcp:12345:42:5").unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    let me = LnetAddr::parse(tm.ep().unwrap().addr()).unwrap();
    let tmid = u64::from(me.tmid.unwrap());
    // A send to TMID 9, where no machine is (LNet drops it, nobody
    // answers): it waits for its answer until the handshake timeout.
    let nobody = tm.ep_create("127.0.78.1@tcp:12345:42:9").unwrap();
    let mut b = dom
        .register(BufVec::new(1, 16))
        .unwrap()
        .with_callbacks(cbs);
    b.bufvec_mut().copy_in(0, b"sixteen bytes..!").unwrap();
    tm.add_msg_send(b, &nobody, 16).unwrap();
    // Every sequence number the send can have, DELIVERED (16 bytes) and
    // NAK, from TMID 7 of the same process and portal: not where the send
    // went.
    let ctl_bits = (tmid << 52) | (1 << 50);
    for seq in 1..512u64 {
        let hdr = (0xC1 << 56) | (seq << 32) | (7 << 16) | (42 << 8) | 4;
        raw_put(&l, 42, ctl_bits, hdr, note(5, seq, 16u64.to_le_bytes()));
        raw_put(
            &l,
            42,
            ctl_bits,
            hdr,
            note(4, seq, [11, 0, 0, 0, 0, 0, 0, 0]),
        );
    }
    let e = ev.recv_timeout(WAIT).unwrap();
    assert_eq!(e.queue(), QueueType::MsgSend);
    assert!(
        matches!(e.error(), Some(NetError::TimedOut)),
        "the send ended otherwise than by its timeout: {e:?}"
    );
    drop(e);
    drop(nobody);
    tm.stop(false).unwrap();
    tm.wait_stopped(WAIT).unwrap();
    tm.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    drop(x);
    l.shutdown();
}
