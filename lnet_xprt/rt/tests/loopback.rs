//! The runtime core and the loopback LND: PUT+ACK, GET+REPLY to `0@lo`,
//! and to one's own NID (which, as in Lustre, takes the socket LND to the
//! node's own listener), ping of oneself, bytes verified; API errors.

mod common;

use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{
    EventKind, MdHandle, MdOptions, MdSpec, MemKey, MemRef, Threshold, Unlink,
};
use colibri_lnet_rt::{Lnet, LnetConfig, LnetError, MemRegion, Start};
use common::*;

fn node(ip: &str) -> Lnet {
    init_tracing();
    let mut cfg = LnetConfig::new(&[nid(&format!("{ip}@tcp"))]);
    cfg.accept_port = 0;
    Lnet::start(cfg).unwrap()
}

#[test]
fn put_with_ack_to_self() {
    for (ip, to, over_lo) in [
        ("127.0.1.1", "0@lo", true),
        ("127.0.1.5", "127.0.1.5@tcp", false),
    ] {
        put_with_ack_to(ip, to, over_lo);
    }
}

fn put_with_ack_to(ip: &str, to: &str, over_lo: bool) {
    let lnet = node(ip);
    let me = ProcessId::lustre(nid(to));
    let inbox = MemRegion::zeroed(64 * 1024);
    let target = post(&lnet, &inbox, 9, 0x55, MdOptions::OP_PUT);
    let data = pattern(64 * 1024, 1);
    let src = MemRegion::from_vec(data.clone());
    let md = bind(&lnet, &src);
    lnet.put(md, true, me, 9, 0x55, 0, 0xfeed).unwrap();
    let evs = until_final(&lnet, md);
    let mine = kinds(&evs, md);
    assert!(
        mine.contains(&EventKind::Send) && mine.contains(&EventKind::Ack),
        "{mine:?}"
    );
    assert!(
        evs.iter()
            .filter(|e| e.md == md)
            .all(|e| e.status().is_ok())
    );
    let put = events_until(&lnet, |_| true);
    let put_ev = evs
        .iter()
        .chain(put.iter())
        .find(|e| e.md == target && e.kind() == EventKind::Put)
        .expect("PUT event");
    assert_eq!(put_ev.info.mlength, 64 * 1024);
    assert_eq!(put_ev.info.hdr_data, 0xfeed);
    assert_eq!(inbox.to_vec(), data);
    let rs = lnet.runtime_stats();
    if over_lo {
        assert_eq!(rs.loopback_copy_bytes, 64 * 1024);
    } else {
        // Written to the node's own listener and read back.
        assert_eq!(rs.loopback_copy_bytes, 0);
        assert!(rs.socket_write_bytes >= 64 * 1024, "{rs:?}");
        assert!(rs.socket_read_bytes >= 64 * 1024, "{rs:?}");
    }
    assert_eq!(rs.user_copy_bytes, 0);
    lnet.shutdown();
}

#[test]
fn get_with_reply_from_self() {
    let lnet = node("127.0.1.2");
    let me = ProcessId::lustre(nid("127.0.1.2@tcp"));
    let data = pattern(100_000, 7);
    let served = MemRegion::from_vec(data.clone());
    let source = post(&lnet, &served, 11, 3, MdOptions::OP_GET);
    let sink = MemRegion::zeroed(100_000);
    let md = bind(&lnet, &sink);
    lnet.get(md, me, 11, 3, 0).unwrap();
    let evs = until_final(&lnet, md);
    assert!(kinds(&evs, md).contains(&EventKind::Reply));
    assert_eq!(sink.to_vec(), data);
    // The served side's GET event: among those already taken, or later.
    if !evs
        .iter()
        .any(|e| e.md == source && e.kind() == EventKind::Get)
    {
        events_until(&lnet, |e| {
            e.iter()
                .any(|e| e.md == source && e.kind() == EventKind::Get)
        });
    }
    lnet.shutdown();
}

#[test]
fn put_within_one_region() {
    // Source and target are ranges of the same region.
    let lnet = node("127.0.1.3");
    let me = ProcessId::lustre(nid("127.0.1.3@tcp"));
    let region = MemRegion::from_vec([vec![9u8; 100], vec![0u8; 100]].concat());
    let key = lnet.register(&region);
    let me_h = lnet.me_attach(me_on(3, 1)).unwrap();
    lnet.md_attach(
        me_h,
        MdSpec::new(MemRef::new(key, 100, 100), MdOptions::OP_PUT),
    )
    .unwrap();
    let md = lnet
        .md_bind(
            MdSpec::new(MemRef::new(key, 0, 100), MdOptions::empty())
                .threshold(Threshold::Count(1))
                .unlink(Unlink::Unlink),
        )
        .unwrap();
    lnet.put(md, false, me, 3, 1, 0, 0).unwrap();
    until_final(&lnet, md);
    events_until(&lnet, |_| region.to_vec()[100..] == [9u8; 100]);
    lnet.shutdown();
}

#[test]
fn ping_self() {
    let lnet = node("127.0.1.4");
    let info = lnet
        .ping(nid("127.0.1.4@tcp"), Duration::from_secs(10))
        .unwrap();
    assert!(
        info.nis.iter().any(|n| n.nid == nid("127.0.1.4@tcp")),
        "{info:?}"
    );
    let lo = lnet.ping(nid("0@lo"), Duration::from_secs(10)).unwrap();
    assert_eq!(lo.nis.len(), info.nis.len());
    lnet.shutdown();
}

#[test]
fn handler_gets_events_and_may_call_back() {
    init_tracing();
    let me_nid = nid("127.0.1.5@tcp");
    let mut cfg = LnetConfig::new(&[me_nid]);
    cfg.accept_port = 0;
    let (tx, rx) = crossbeam_channel::bounded(16);
    let cell: std::sync::Arc<std::sync::OnceLock<Lnet>> = Default::default();
    let c2 = cell.clone();
    let lnet = Lnet::start_with_handler(cfg, move |ev| {
        // Calling back into the runtime from the handler is allowed.
        if let Some(l) = c2.get() {
            let _ = l.stats();
        }
        let _ = tx.send(ev.kind());
    })
    .unwrap();
    let _ = cell.set(lnet.clone());
    let inbox = MemRegion::zeroed(8);
    post(&lnet, &inbox, 4, 0, MdOptions::OP_PUT);
    let src = MemRegion::from_vec(vec![5; 8]);
    let md = bind(&lnet, &src);
    lnet.put(md, true, ProcessId::lustre(me_nid), 4, 0, 0, 0)
        .unwrap();
    let mut got = Vec::new();
    while !(got.contains(&EventKind::Ack) && got.contains(&EventKind::Put)) {
        got.push(rx.recv_timeout(LIMIT).expect("event"));
    }
    assert!(matches!(
        lnet.next_event(Duration::ZERO),
        Err(LnetError::Config(_))
    ));
    assert_eq!(inbox.to_vec(), vec![5; 8]);
    lnet.shutdown();
    drop(cell);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let lnet = node("127.0.1.6");
    // Unregistered memory.
    let e = lnet
        .md_bind(MdSpec::new(
            MemRef::new(MemKey(999), 0, 4),
            MdOptions::empty(),
        ))
        .unwrap_err();
    assert!(matches!(e, LnetError::BadMemory { .. }), "{e}");
    assert_eq!(e.errno(), 14);
    // Out of the region's bounds.
    let r = MemRegion::zeroed(10);
    let key = lnet.register(&r);
    let e = lnet
        .md_bind(MdSpec::new(MemRef::new(key, 5, 10), MdOptions::empty()))
        .unwrap_err();
    assert!(matches!(e, LnetError::BadMemory { .. }));
    // A portal beyond the table.
    let md = lnet
        .md_bind(MdSpec::new(MemRef::new(key, 0, 10), MdOptions::empty()))
        .unwrap();
    let e = lnet
        .put(
            md,
            false,
            ProcessId::lustre(nid("127.0.1.6@tcp")),
            64,
            0,
            0,
            0,
        )
        .unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    // An unknown handle.
    lnet.md_unlink(md).unwrap();
    let e = lnet
        .md_unlink(MdHandle::from_cookie(0x7777_0000_0042))
        .unwrap_err();
    assert_eq!(e.errno(), 2, "{e}");
    // An MD that needs threshold 2 for an ACK... and an unsupported LND.
    let e = Lnet::start(LnetConfig::new(&[nid("10.0.0.1@o2ib")])).unwrap_err();
    assert!(matches!(e, LnetError::Config(_)));
    let _ = Threshold::Infinite;
    lnet.shutdown();
    assert!(matches!(lnet.stats(), _));
    assert!(matches!(
        lnet.md_bind(MdSpec::new(MemRef::new(key, 0, 10), MdOptions::empty())),
        Err(LnetError::Shutdown)
    ));
}

#[test]
fn deregistered_memory_fails_the_send_with_one_event() {
    let lnet = node("127.0.1.7");
    let me = ProcessId::lustre(nid("127.0.1.7@tcp"));
    let inbox = MemRegion::zeroed(8);
    post(&lnet, &inbox, 4, 0, MdOptions::OP_PUT);
    let src = MemRegion::from_vec(vec![1; 8]);
    let key = lnet.register(&src);
    let md = lnet
        .md_bind(
            MdSpec::new(MemRef::new(key, 0, 8), MdOptions::empty())
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
        )
        .unwrap();
    lnet.deregister(key);
    lnet.put(md, true, me, 4, 0, 0, 0).unwrap();
    // The send fails for good: its SEND event carries the error and no ACK
    // follows (the MD stays, with one slot left).
    let evs = events_until(&lnet, |e| e.iter().any(|e| e.md == md));
    let send: Vec<_> = evs.iter().filter(|e| e.md == md).collect();
    assert_eq!(send.len(), 1);
    assert_eq!(send[0].kind(), EventKind::Send);
    assert!(send[0].status().is_err(), "{send:#?}");
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(e) = lnet.next_event(Duration::from_millis(100)) {
        assert_ne!(e.md, md, "a second event for the failed PUT: {e:#?}");
    }
    lnet.shutdown();
}

#[test]
fn bind_start_moves_the_bytes_as_bind_and_put_do() {
    let lnet = node("127.0.1.8");
    let me = ProcessId::lustre(nid("127.0.1.8@tcp"));
    let inbox = MemRegion::zeroed(4096);
    let key_in = lnet.register(&inbox);
    // The receiver's ME and MD in one call.
    let (_me, target) = lnet
        .me_md_attach(
            me_on(13, 0x77),
            MdSpec::new(MemRef::new(key_in, 0, 4096), MdOptions::OP_PUT),
        )
        .unwrap();
    let data = pattern(4096, 3);
    let src = MemRegion::from_vec(data.clone());
    let key = lnet.register(&src);
    let md = lnet
        .bind_start(
            MdSpec::new(MemRef::new(key, 0, 4096), MdOptions::empty())
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
            Start::Put {
                ack: true,
                target: me,
                portal: 13,
                match_bits: 0x77,
                offset: 0,
                hdr_data: 9,
            },
        )
        .unwrap();
    let evs = until_final(&lnet, md);
    // One SEND and one ACK. To our own NID the PUT takes the socket LND,
    // so the ACK may be read before the SEND's completion is reported,
    // as on any network path (Lustre's too).
    let mine = kinds(&evs, md);
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(
        mine.contains(&EventKind::Send) && mine.contains(&EventKind::Ack),
        "{mine:?}"
    );
    let more = events_until(&lnet, |e| {
        evs.iter()
            .chain(e)
            .any(|e| e.md == target && e.kind() == EventKind::Put)
    });
    assert!(
        evs.iter()
            .chain(&more)
            .any(|e| e.md == target && e.info.hdr_data == 9)
    );
    assert_eq!(inbox.to_vec(), data);
    // A GET back into a fresh MD, in one call too.
    let sink = MemRegion::zeroed(4096);
    let ks = lnet.register(&sink);
    let (_, served) = lnet
        .me_md_attach(
            me_on(14, 1),
            MdSpec::new(MemRef::new(key, 0, 4096), MdOptions::OP_GET),
        )
        .unwrap();
    let g = lnet
        .bind_start(
            MdSpec::new(MemRef::new(ks, 0, 4096), MdOptions::empty())
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
            Start::Get {
                target: me,
                portal: 14,
                match_bits: 1,
                offset: 0,
            },
        )
        .unwrap();
    let evs = until_final(&lnet, g);
    assert!(kinds(&evs, g).contains(&EventKind::Reply), "{evs:?}");
    assert_eq!(sink.to_vec(), data);
    assert_ne!(served, g);
    lnet.shutdown();
}

#[test]
fn a_refused_bind_start_or_attach_leaves_nothing_behind() {
    let lnet = node("127.0.1.9");
    let me = ProcessId::lustre(nid("127.0.1.9@tcp"));
    let r = MemRegion::zeroed(64);
    let key = lnet.register(&r);
    let spec = || MdSpec::new(MemRef::new(key, 0, 64), MdOptions::empty());
    // Portal 64 is beyond the table: the PUT is refused, and the MD bound
    // for it is gone again without an event.
    let e = lnet
        .bind_start(
            spec(),
            Start::Put {
                ack: false,
                target: me,
                portal: 64,
                match_bits: 0,
                offset: 0,
                hdr_data: 0,
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    let e = lnet
        .bind_start(
            spec(),
            Start::Get {
                target: me,
                portal: 64,
                match_bits: 0,
                offset: 0,
            },
        )
        .unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    // Unregistered memory: refused before anything is bound.
    let e = lnet
        .bind_start(
            MdSpec::new(MemRef::new(MemKey(999), 0, 4), MdOptions::empty()),
            Start::Get {
                target: me,
                portal: 3,
                match_bits: 0,
                offset: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(e, LnetError::BadMemory { .. }), "{e}");
    // An MD the ME refuses (a threshold of 0 is not an MD): the ME goes too.
    let mes = lnet.with_node(|n| n.me_count());
    let e = lnet
        .me_md_attach(me_on(5, 0), spec().threshold(Threshold::Count(0)))
        .unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    assert!(
        lnet.next_event(Duration::from_millis(100)).is_err(),
        "no event"
    );
    assert_eq!(lnet.with_node(|n| n.me_count()), mes, "no ME left behind");
    // Nothing was left matching on portal 5: a PUT to it is dropped.
    let src = MemRegion::from_vec(vec![1; 8]);
    let k2 = lnet.register(&src);
    let md = lnet
        .bind_start(
            MdSpec::new(MemRef::new(k2, 0, 8), MdOptions::empty())
                .threshold(Threshold::Count(1))
                .unlink(Unlink::Unlink),
            Start::Put {
                ack: false,
                target: me,
                portal: 5,
                match_bits: 0,
                offset: 0,
                hdr_data: 0,
            },
        )
        .unwrap();
    let evs = until_final(&lnet, md);
    assert_eq!(kinds(&evs, md), vec![EventKind::Send], "{evs:?}");
    // The PUT went to our own NID through the socket LND: its send may
    // complete before the receiving side dropped it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lnet.stats().drop_count == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(lnet.stats().drop_count, 1);
    lnet.shutdown();
}
