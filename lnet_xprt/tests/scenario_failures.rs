//! Seed 001's failure cases, each produced by a fault rule, with the reaction
//! the seed and lnet.md 7.2 document.
//!
//! | case | fault rule | reaction |
//! |---|---|---|
//! | node interface fails | send rule, src = our o2ib NI, LOCAL_DROPPED | local NI health −100, resent over the other NI, delivered |
//! | peer interface unreachable | send rule, dst = peer o2ib NI, REMOTE_DROPPED | peer NI health −100, resent to the other peer NI, delivered |
//! | all peer interfaces on a net unreachable | send rule, dst = 255.255.255.255@o2ib | o2ib peer NIs lose health, traffic moves to tcp, local NI untouched |
//! | all interfaces of a peer unreachable | send rule, dst = ANY, REMOTE_DROPPED | 1 try + 2 resends, then SEND fails; peer NIs lose health |
//! | PUT+ACK timeout | receive rule at initiator, ACK | ACK event `TimedOut` after the transaction timeout, next hop loses health, no resend |
//! | GET+REPLY timeout | receive rule at initiator, REPLY | REPLY event `TimedOut`, next hop loses health |
//! | dropped PUT | receive rule at target, PUT | SEND succeeds, nothing else: LNet cannot tell |
//! | network timeout | send rule, NETWORK_TIMEOUT | local and peer NI health −100, no resend, SEND fails |
//! | local error | send rule, LOCAL_ERROR | local NI health −100, no resend, SEND fails |

mod common;
use common::{nid, post_any};

use std::time::Duration;

use colibri_lnet::fault::{DropRuleSpec, FaultMatch, HealthError, MsgMask, Trigger};
use colibri_lnet::health::MAX_HEALTH;
use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::matching::{EventKind, MdOptions, MdSpec, OpError, Threshold, Unlink};
use colibri_lnet::sim::{Sim, Topology};
use colibri_lnet::time::Time;
use colibri_lnet::wire::MsgType;

const C_TCP: &str = "10.0.0.1@tcp";
const C_IB: &str = "192.168.0.1@o2ib";
const S_TCP: &str = "10.0.0.2@tcp";
const S_IB: &str = "192.168.0.2@o2ib";
const PORTAL: u32 = 10;

/// Two dual-rail nodes; the client has already discovered the server (one
/// PUT+ACK) and its events are cleared.
fn warmed_up(seed: u64) -> Sim {
    let mut sim = Sim::new(
        Topology::new(seed)
            .node("client", &[C_TCP, C_IB])
            .node("server", &[S_TCP, S_IB])
            .latency("tcp", Duration::from_micros(50))
            .latency("o2ib", Duration::from_micros(5)),
    )
    .unwrap();
    for (portal, op) in [(PORTAL, MdOptions::OP_PUT), (PORTAL + 1, MdOptions::OP_GET)] {
        let mem_1 = sim.register_mem("server", vec![5; 64]);
        post_any(
            &mut sim,
            "server",
            portal,
            MdSpec::new(mem_1, op | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE),
        );
    }
    put(&mut sim, true, 999);
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(
        sim.node("client")
            .discovery()
            .peers()
            .peer_of(nid(S_TCP))
            .unwrap()
            .ni_count(),
        2
    );
    sim.take_events("client");
    sim.take_events("server");
    sim
}

fn put(sim: &mut Sim, ack: bool, bits: u64) {
    let mem_2 = sim.register_mem("client", vec![1; 8]);
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(
                MdSpec::new(mem_2, MdOptions::empty())
                    .threshold(Threshold::Count(if ack { 2 } else { 1 }))
                    .unlink(Unlink::Unlink),
            )
        })
        .unwrap();
    let t = ProcessId::lustre(nid(S_TCP));
    sim.with_node("client", |n, now| {
        n.put(now, md, ack, t, PORTAL, bits, 0, 0)
    })
    .unwrap();
}

fn get(sim: &mut Sim, bits: u64) {
    let mem_3 = sim.register_mem("client", vec![0; 8]);
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(
                MdSpec::new(mem_3, MdOptions::empty())
                    .threshold(Threshold::Count(2))
                    .unlink(Unlink::Unlink),
            )
        })
        .unwrap();
    let t = ProcessId::lustre(nid(S_TCP));
    sim.with_node("client", |n, now| n.get(now, md, t, PORTAL + 1, bits, 0))
        .unwrap();
}

fn send_rule(sim: &mut Sim, name: &str, matcher: FaultMatch, err: HealthError) {
    sim.with_node(name, |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher,
                trigger: Trigger::Rate(1),
                health_mask: err.bit(),
            },
        )
    })
    .unwrap();
}

fn recv_rule(sim: &mut Sim, name: &str, ty: MsgType) {
    sim.with_node(name, |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: FaultMatch::ANY.types(MsgMask::of(ty)),
                trigger: Trigger::Rate(1),
                health_mask: 0,
            },
        )
    })
    .unwrap();
}

fn client_event(sim: &Sim, kind: EventKind) -> Option<(Time, Result<(), OpError>)> {
    sim.events("client")
        .iter()
        .find(|(_, e)| e.kind() == kind)
        .map(|(t, e)| (*t, e.status()))
}

fn server_puts(sim: &Sim) -> usize {
    sim.events("server")
        .iter()
        .filter(|(_, e)| e.kind() == EventKind::Put)
        .count()
}

fn local_health(sim: &Sim, n: &str) -> u32 {
    sim.node("client").health().local_health(nid(n)).value()
}

fn peer_health(sim: &Sim, n: &str) -> u32 {
    sim.node("client").health().peer_health(nid(n)).value()
}

#[test]
fn node_interface_failure_resends_over_other_ni() {
    let mut sim = warmed_up(1);
    let mut m = FaultMatch::ANY;
    m.src = nid(C_IB);
    send_rule(&mut sim, "client", m, HealthError::LocalDropped);
    for i in 0..4 {
        put(&mut sim, true, i);
        sim.run_for(Duration::from_millis(1)).unwrap();
    }
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(server_puts(&sim), 4, "every PUT delivered");
    assert!(local_health(&sim, C_IB) < MAX_HEALTH);
    assert_eq!(local_health(&sim, C_TCP), MAX_HEALTH);
    assert_eq!(peer_health(&sim, S_IB), MAX_HEALTH, "not the peer's fault");
    assert!(sim.node("client").stats().resend_count >= 1);
    assert!(sim.events("client").iter().all(|(_, e)| e.status().is_ok()));
}

#[test]
fn peer_interface_unreachable_resends_to_other_peer_ni() {
    let mut sim = warmed_up(2);
    send_rule(
        &mut sim,
        "client",
        FaultMatch::between(Nid::ANY, nid(S_IB)),
        HealthError::RemoteDropped,
    );
    for i in 0..4 {
        put(&mut sim, true, i);
        sim.run_for(Duration::from_millis(1)).unwrap();
    }
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(server_puts(&sim), 4);
    assert!(peer_health(&sim, S_IB) < MAX_HEALTH);
    assert_eq!(peer_health(&sim, S_TCP), MAX_HEALTH);
    assert_eq!(local_health(&sim, C_IB), MAX_HEALTH, "not our NI's fault");
    assert_eq!(sim.node("client").stats().resend_count, 1);
    // Lustre's stats show counters: the resent PUT went through.
    let h = *sim.node("client").health().stats();
    assert_eq!((h.successful_resends, h.failed_resends), (1, 0));
}

#[test]
fn all_peer_interfaces_on_a_net_unreachable_moves_traffic_to_other_net() {
    let mut sim = warmed_up(3);
    let all_ib: Nid = "255.255.255.255@o2ib".parse().unwrap();
    send_rule(
        &mut sim,
        "client",
        FaultMatch::between(Nid::ANY, all_ib),
        HealthError::RemoteDropped,
    );
    let start = sim.trace().len();
    for i in 0..6 {
        put(&mut sim, true, i);
        sim.run_for(Duration::from_millis(1)).unwrap();
    }
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(server_puts(&sim), 6);
    assert!(peer_health(&sim, S_IB) < MAX_HEALTH);
    assert_eq!(local_health(&sim, C_IB), MAX_HEALTH);
    // Every delivered message went over tcp.
    assert!(
        sim.trace()[start..]
            .iter()
            .filter(|t| t.outcome.is_ok())
            .all(|t| t.from.net() == nid(C_TCP).net())
    );
}

#[test]
fn all_interfaces_of_a_peer_unreachable_fails_after_retries() {
    let mut sim = warmed_up(4);
    send_rule(
        &mut sim,
        "client",
        FaultMatch::between(Nid::ANY, Nid::ANY),
        HealthError::RemoteDropped,
    );
    put(&mut sim, true, 1);
    sim.run_for(Duration::from_millis(10)).unwrap();
    // 1 try + retry_count (2) resends, alternating rails, then failure.
    assert_eq!(sim.node("client").stats().resend_count, 2);
    let h = *sim.node("client").health().stats();
    assert_eq!((h.successful_resends, h.failed_resends), (0, 1));
    let (_, status) = client_event(&sim, EventKind::Send).unwrap();
    assert_eq!(status, Err(OpError::NetworkError));
    assert_eq!(server_puts(&sim), 0);
    assert!(peer_health(&sim, S_IB) < MAX_HEALTH);
    assert!(peer_health(&sim, S_TCP) < MAX_HEALTH);
    // The ACK will never come: no ACK event is left pending.
    sim.run_for(Duration::from_secs(200)).unwrap();
    assert!(client_event(&sim, EventKind::Ack).is_none());
}

#[test]
fn put_ack_timeout_reports_timed_out_ack_and_blames_next_hop() {
    let mut sim = warmed_up(5);
    recv_rule(&mut sim, "client", MsgType::Ack);
    put(&mut sim, true, 1);
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(server_puts(&sim), 1);
    assert_eq!(client_event(&sim, EventKind::Send).unwrap().1, Ok(()));
    assert!(client_event(&sim, EventKind::Ack).is_none());
    let hops = [S_TCP, S_IB];
    let before: Vec<u32> = hops.iter().map(|n| peer_health(&sim, n)).collect();
    assert_eq!(before, vec![MAX_HEALTH; 2]);
    // Step until the ACK event appears (after the 150 s transaction timeout).
    assert!(
        sim.run_until_cond(Duration::from_secs(200), |s| client_event(
            s,
            EventKind::Ack
        )
        .is_some())
            .unwrap()
    );
    let (t, status) = client_event(&sim, EventKind::Ack).unwrap();
    assert_eq!(status, Err(OpError::TimedOut));
    assert!(t >= Time::from_secs(150));
    let stats = sim.node("client").stats();
    assert_eq!(stats.response_timeout_count, 1);
    assert_eq!(stats.resend_count, 0);
    // Exactly one of the two peer NIs (the next hop of the PUT) lost health.
    let after: Vec<u32> = hops.iter().map(|n| peer_health(&sim, n)).collect();
    assert_eq!(
        after.iter().filter(|h| **h == MAX_HEALTH - 100).count(),
        1,
        "{after:?}"
    );
    // Recovery pings bring it back.
    sim.run_for(Duration::from_secs(5)).unwrap();
    assert!(hops.iter().all(|n| peer_health(&sim, n) == MAX_HEALTH));
}

#[test]
fn get_reply_timeout_reports_timed_out_reply() {
    let mut sim = warmed_up(6);
    recv_rule(&mut sim, "client", MsgType::Reply);
    get(&mut sim, 3);
    sim.run_for(Duration::from_secs(151)).unwrap();
    // The target served the GET; the initiator never saw the REPLY.
    assert!(
        sim.events("server")
            .iter()
            .any(|(_, e)| e.kind() == EventKind::Get)
    );
    assert_eq!(client_event(&sim, EventKind::Send).unwrap().1, Ok(()));
    assert_eq!(
        client_event(&sim, EventKind::Reply).unwrap().1,
        Err(OpError::TimedOut)
    );
}

#[test]
fn dropped_put_is_invisible_to_lnet() {
    let mut sim = warmed_up(7);
    recv_rule(&mut sim, "server", MsgType::Put);
    put(&mut sim, false, 1);
    sim.run_for(Duration::from_secs(200)).unwrap();
    let evs = sim.events("client");
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].1.kind(), EventKind::Send);
    assert_eq!(evs[0].1.status(), Ok(()));
    assert_eq!(server_puts(&sim), 0);
    assert_eq!(peer_health(&sim, S_TCP), MAX_HEALTH);
    assert_eq!(peer_health(&sim, S_IB), MAX_HEALTH);
}

#[test]
fn network_timeout_lowers_both_ends_and_is_not_resent() {
    let mut sim = warmed_up(8);
    send_rule(
        &mut sim,
        "client",
        FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
        HealthError::NetworkTimeout,
    );
    put(&mut sim, true, 1);
    // The send fails at once (send-side rule): check before recovery runs.
    assert_eq!(sim.node("client").stats().resend_count, 0);
    let local = local_health(&sim, C_TCP).min(local_health(&sim, C_IB));
    let peer = peer_health(&sim, S_TCP).min(peer_health(&sim, S_IB));
    assert_eq!((local, peer), (MAX_HEALTH - 100, MAX_HEALTH - 100));
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(
        client_event(&sim, EventKind::Send).unwrap().1,
        Err(OpError::TimedOut)
    );
    assert_eq!(server_puts(&sim), 0);
    // Recovery pings (not PUTs, so the rule lets them through) restore both.
    sim.run_for(Duration::from_secs(5)).unwrap();
    assert_eq!(
        local_health(&sim, C_TCP).min(local_health(&sim, C_IB)),
        MAX_HEALTH
    );
    assert_eq!(
        peer_health(&sim, S_TCP).min(peer_health(&sim, S_IB)),
        MAX_HEALTH
    );
}

#[test]
fn local_error_lowers_local_ni_and_is_not_resent() {
    let mut sim = warmed_up(9);
    send_rule(
        &mut sim,
        "client",
        FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
        HealthError::LocalError,
    );
    put(&mut sim, true, 1);
    assert_eq!(sim.node("client").stats().resend_count, 0);
    let local = local_health(&sim, C_TCP).min(local_health(&sim, C_IB));
    assert_eq!(local, MAX_HEALTH - 100);
    assert_eq!(
        peer_health(&sim, S_TCP).min(peer_health(&sim, S_IB)),
        MAX_HEALTH
    );
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(
        client_event(&sim, EventKind::Send).unwrap().1,
        Err(OpError::NetworkError)
    );
    assert_eq!(server_puts(&sim), 0);
}
