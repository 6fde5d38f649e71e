//! DLC calls through the runtime: NIs added and deleted at run time (with
//! their listeners), routes, peers, routing and discovery switches, and a
//! delay rule whose held message the runtime's timer releases.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::fault::{DelayRuleSpec, FaultMatch, Trigger};
use colibri_lnet_rt::colibri_lnet::ids::{Net, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{EventKind, MdOptions};
use colibri_lnet_rt::colibri_lnet::node::NiConfig;
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use common::*;

fn node(s: &str) -> Lnet {
    init_tracing();
    let mut cfg = LnetConfig::new(&[nid(s)]);
    cfg.accept_port = 0;
    // Any source port (tests pass without privilege; see tcp.rs).
    cfg.accept = AcceptPolicy::All;
    cfg.tick = Duration::from_millis(100);
    Lnet::start(cfg).unwrap()
}

#[test]
fn nis_routes_peers_and_switches() {
    let l = node("127.0.7.1@tcp");
    let extra = nid("127.0.7.2@tcp1");
    l.add_ni(NiConfig::new(extra)).unwrap();
    assert!(l.nids().contains(&extra));
    let addr = l.listen_addr(extra).expect("listening");
    TcpStream::connect(addr).expect("the new NI accepts");
    let info = l.ping(extra, LIMIT).unwrap();
    assert!(info.nis.iter().any(|n| n.nid == extra));
    assert!(l.add_ni(NiConfig::new(extra)).is_err(), "duplicate NI");
    l.del_ni(extra).unwrap();
    assert!(!l.nids().contains(&extra));
    assert!(l.listen_addr(extra).is_none());
    let t0 = Instant::now();
    while TcpStream::connect(addr).is_ok() {
        assert!(t0.elapsed() < LIMIT, "the deleted NI still listens");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(l.del_ni(extra).unwrap_err().errno(), 2);

    let tcp5: Net = "tcp5".parse().unwrap();
    let gw = nid("127.0.7.9@tcp");
    l.add_route(tcp5, gw, Some(1), 0).unwrap();
    assert_eq!(l.with_node(|n| n.routes_to(tcp5).len()), 1);
    l.del_route(tcp5, gw).unwrap();
    assert!(l.del_route(tcp5, gw).is_err());
    l.add_peer(nid("127.0.7.20@tcp"), &[nid("127.0.7.21@tcp")], true)
        .unwrap();
    l.del_peer(nid("127.0.7.20@tcp"), &[nid("127.0.7.21@tcp")])
        .unwrap();
    l.set_health(50, 1, Duration::from_secs(20)).unwrap();
    assert_eq!(l.with_node(|n| n.health().config().retry_count), 1);
    assert_eq!(
        l.set_health(50, 30, Duration::from_secs(20))
            .unwrap_err()
            .errno(),
        22
    );
    l.set_routing(true).unwrap();
    l.set_discovery(false).unwrap();
    assert!(l.with_node(|n| n.config().routing && !n.config().discovery));
    l.shutdown();
}

#[test]
fn delay_rule_holds_a_put_in_its_connection() {
    let (na, nb) = (nid("127.0.7.3@tcp"), nid("127.0.7.4@tcp"));
    let a = node("127.0.7.3@tcp");
    let b = node("127.0.7.4@tcp");
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    let rule = b
        .add_delay_rule(DelayRuleSpec {
            matcher: FaultMatch::between(na, nb).portal(9),
            trigger: Trigger::Rate(1),
            latency: Duration::from_millis(400),
        })
        .unwrap();
    let inbox = MemRegion::zeroed(200_000);
    let target = post(&b, &inbox, 9, 0, MdOptions::OP_PUT);
    let data = pattern(200_000, 8);
    let md = bind(&a, &MemRegion::from_vec(data.clone()));
    let t0 = Instant::now();
    a.put(md, true, ProcessId::lustre(nb), 9, 0, 0, 0).unwrap();
    let evs = events_until(&b, |e| e.iter().any(|e| e.md == target));
    assert!(
        t0.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t0.elapsed()
    );
    assert!(
        evs.iter()
            .any(|e| e.md == target && e.kind() == EventKind::Put)
    );
    assert!(inbox.to_vec() == data);
    until_final(&a, md);
    let st = b.fault_stats(rule).unwrap();
    assert_eq!(st.fired, 1, "{st:?}");
    assert!(b.remove_fault_rule(rule));
    assert_eq!(b.runtime_stats().user_copy_bytes, 0);
    a.shutdown();
    b.shutdown();
}
