//! What a stopped machine's address (its *tomb*) answers: a message gets
//! a NAK `Unreachable`, a bulk request or verdict a GONE, and a control
//! message that expects no answer (DELIVERED, NAK, ABORT, GONE) nothing.
//! Two tombs that answered each other's GONE would exchange GONEs for as
//! long as both addresses stayed free.

use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{MdOptions, MdSpec, MemRef, Threshold, Unlink};
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{Domain, TmState, ignore_tm_events};

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

/// Our header data: magic 0xC1, sequence, TMID, portal, kind.
fn hdr(kind: u64, portal: u64, tmid: u64, seq: u64) -> u64 {
    (0xC1 << 56) | (seq << 32) | (tmid << 16) | (portal << 8) | kind
}

/// A GONE (kind 6) for sequence number `xid`.
fn gone(xid: u64) -> Vec<u8> {
    let mut b = b"CLNC".to_vec();
    b.extend_from_slice(&[1, 6, 0, 0]);
    b.extend_from_slice(&xid.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b
}

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
    let quiet = |what: &str| {
        // Whatever answers there are leave at once; then nothing more.
        std::thread::sleep(Duration::from_millis(300));
        let n = sends();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(sends(), n, "{what}: LNet messages keep leaving");
        n
    };
    let before = quiet("at rest");
    let ctl_bits = |tmid: u64| (tmid << 52) | (1 << 50);
    let msg_bits = |tmid: u64| tmid << 52;
    // A GONE (a note, kind 4) at tomb `a`, from tomb `b`'s address:
    // nothing answers it.
    raw_put(&l, 41, ctl_bits(a), hdr(4, 41, b, 5), gone(5));
    let n = quiet("a GONE at a tomb");
    assert_eq!(n, before + 1, "only the GONE left");
    // A control message that expects an answer (kind 2), from `b`: `a`
    // answers GONE once, and `b`, a tomb too, does not answer that.
    raw_put(&l, 41, ctl_bits(a), hdr(2, 41, b, 6), gone(6));
    let m = quiet("a request between two tombs");
    assert_eq!(m, n + 2, "the request and one GONE");
    // A message from `b`: one NAK, not answered either.
    raw_put(&l, 41, msg_bits(a), hdr(1, 41, b, 7), vec![1; 8]);
    let k = quiet("a message between two tombs");
    assert_eq!(k, m + 2, "the message and one NAK");
    drop(dom);
    drop(x);
    l.shutdown();
}
