//! What a stopped machine's address (its *tomb*) answers: a message gets
//! a NAK `Unreachable`, a bulk request or verdict a GONE, and a control
//! message that expects no answer (DELIVERED, NAK, ABORT, GONE) nothing.
//! Two tombs that answered each other's GONE would exchange GONEs for as
//! long as both addresses stayed free.

use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{Domain, TmState, ignore_tm_events};

#[path = "support/raw.rs"]
mod raw;
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
        let deadline = std::time::Instant::now() + WAIT;
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
            assert!(std::time::Instant::now() < deadline, "{what}: {n} sent");
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(sends(), n, "{what}: LNet messages keep leaving");
        if let Some(w) = want {
            assert_eq!(n, w, "{what}");
        }
        n
    };
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
