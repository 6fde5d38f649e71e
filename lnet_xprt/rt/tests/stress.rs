//! Many PUTs and GETs at once between two nodes, from several application
//! threads, sizes from 0 to 256 KiB (both CONTROL and BULK connections):
//! every operation ends with its events and every byte arrives.

mod common;

use std::sync::Arc;
use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{Event, EventKind, MdOptions};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use common::*;

const THREADS: usize = 4;
const OPS: usize = 40;

fn size(t: usize, i: usize) -> usize {
    // 0, small (< min_bulk), and bulk sizes.
    match (t * OPS + i) % 5 {
        0 => 0,
        1 => 100 + i,
        2 => 900,
        3 => 4096 + 17 * i,
        _ => 64 * 1024 + 1000 * i,
    }
}

#[test]
fn concurrent_puts_and_gets() {
    init_tracing();
    let (na, nb) = (nid("127.0.8.1@tcp"), nid("127.0.8.2@tcp"));
    let start = |n| {
        let mut cfg = LnetConfig::new(&[n]);
        cfg.accept_port = 0;
        cfg.accept = AcceptPolicy::All;
        Lnet::start(cfg).unwrap()
    };
    let a = start(na);
    let b = start(nb);
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    // b: one PUT target and one GET source per operation.
    let mut targets = Vec::new();
    for t in 0..THREADS {
        for i in 0..OPS {
            let bits = (t * 1000 + i) as u64;
            let inbox = MemRegion::zeroed(size(t, i));
            post(&b, &inbox, 30, bits, MdOptions::OP_PUT);
            let served = MemRegion::from_vec(pattern(size(t, i), (t * 7 + i) as u8 ^ 0x5a));
            post(&b, &served, 31, bits, MdOptions::OP_GET);
            targets.push(((t, i), inbox));
        }
    }
    // a's events, gathered by a collector thread.
    let q = a.event_queue().unwrap();
    let collector = std::thread::spawn(move || {
        let mut all = Vec::new();
        while let Ok(e) = q.recv_timeout(Duration::from_secs(5)) {
            all.push(e);
            if all.len() == THREADS * OPS * 4 {
                break;
            }
        }
        all
    });
    let a = Arc::new(a);
    let mut sinks = Vec::new();
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let a = a.clone();
        handles.push(std::thread::spawn(move || {
            let mut mine = Vec::new();
            for i in 0..OPS {
                let bits = (t * 1000 + i) as u64;
                let src = MemRegion::from_vec(pattern(size(t, i), (t * 3 + i) as u8));
                let md = bind(&a, &src);
                a.put(md, true, ProcessId::lustre(nb), 30, bits, 0, 0)
                    .unwrap();
                let sink = MemRegion::zeroed(size(t, i));
                let gmd = bind(&a, &sink);
                a.get(gmd, ProcessId::lustre(nb), 31, bits, 0).unwrap();
                mine.push(((t, i), md, gmd, src, sink));
            }
            mine
        }));
    }
    for h in handles {
        sinks.extend(h.join().unwrap());
    }
    let all = collector.join().unwrap();
    assert_eq!(all.len(), THREADS * OPS * 4, "missing events");
    for ((t, i), md, gmd, _src, sink) in &sinks {
        let put: Vec<EventKind> = all
            .iter()
            .filter(|e| e.md == *md)
            .map(Event::kind)
            .collect();
        let get: Vec<EventKind> = all
            .iter()
            .filter(|e| e.md == *gmd)
            .map(Event::kind)
            .collect();
        assert_eq!(put.len(), 2, "{t}/{i}: {put:?}");
        assert!(put.contains(&EventKind::Ack));
        assert_eq!(get.len(), 2, "{t}/{i}: {get:?}");
        assert!(get.contains(&EventKind::Reply));
        assert!(
            all.iter()
                .filter(|e| e.md == *md || e.md == *gmd)
                .all(|e| e.status().is_ok())
        );
        assert!(
            sink.to_vec() == pattern(size(*t, *i), (t * 7 + i) as u8 ^ 0x5a),
            "GET {t}/{i} differs"
        );
    }
    for ((t, i), inbox) in &targets {
        assert!(
            inbox.to_vec() == pattern(size(*t, *i), (t * 3 + i) as u8),
            "PUT {t}/{i} differs"
        );
    }
    assert_eq!(a.runtime_stats().user_copy_bytes, 0);
    assert_eq!(b.runtime_stats().user_copy_bytes, 0);
    a.shutdown();
    b.shutdown();
}
