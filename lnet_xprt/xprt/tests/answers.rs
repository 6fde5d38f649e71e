//! Only the machine a message went to can end its send: DELIVERED and
//! NAK name the send by its sequence number, and sequence numbers are per
//! sender, so the same number from anyone else (here: forged, for every
//! number the send could have) is ignored.

use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, NetError, QueueType, TmState, event_channel, ignore_tm_events};

#[path = "support/raw.rs"]
mod raw;
use raw::{ctl, hdr, raw_put};

const WAIT: Duration = Duration::from_secs(30);

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
        let hdr = hdr(4, 42, 7, seq);
        raw_put(&l, 42, ctl_bits, hdr, ctl(5, seq, 16u64.to_le_bytes()));
        raw_put(
            &l,
            42,
            ctl_bits,
            hdr,
            ctl(4, seq, [11, 0, 0, 0, 0, 0, 0, 0]),
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
