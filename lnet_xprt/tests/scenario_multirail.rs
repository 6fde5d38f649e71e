//! Multi-Rail scenarios (seed 000 and lnet.md 3-4, 7): discovery of a peer
//! with NIs on two nets, traffic spread over both rails, a failing rail and
//! its recovery, a local NI added and pushed, two peers merged.

mod common;
use common::{nid, post_any};

use std::collections::BTreeSet;
use std::time::Duration;

use colibri_lnet::discovery::PeerState;
use colibri_lnet::fault::{DropRuleSpec, FaultMatch, HealthError, MsgMask, Trigger};
use colibri_lnet::health::MAX_HEALTH;
use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::matching::{EventKind, MdHandle, MdOptions, MdSpec, Threshold, Unlink};
use colibri_lnet::node::{NiConfig, NodeConfig};
use colibri_lnet::sim::{Sim, Topology, TraceRecord};
use colibri_lnet::time::Time;
use colibri_lnet::wire::MsgType;

const C_TCP: &str = "10.0.0.1@tcp";
const C_IB: &str = "192.168.0.1@o2ib";
const S_TCP: &str = "10.0.0.2@tcp";
const S_IB: &str = "192.168.0.2@o2ib";
const PORTAL: u32 = 10;

/// Client and server, each with one NI on tcp and one on o2ib.
fn two_rails(seed: u64) -> Sim {
    let mut sim = Sim::new(
        Topology::new(seed)
            .node("client", &[C_TCP, C_IB])
            .node("server", &[S_TCP, S_IB])
            .latency("tcp", Duration::from_micros(50))
            .latency("o2ib", Duration::from_micros(5)),
    )
    .unwrap();
    post_sink(&mut sim, "server");
    sim
}

/// A PUT sink on `PORTAL` that accepts everything.
fn post_sink(sim: &mut Sim, name: &str) -> MdHandle {
    let mem_1 = sim.register_mem(name, vec![0; 64]);
    post_any(
        sim,
        name,
        PORTAL,
        MdSpec::new(
            mem_1,
            MdOptions::OP_PUT | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE,
        ),
    )
}

/// Client PUTs (with ACK) `n` messages to `to`, one every `gap`.
fn put_n(sim: &mut Sim, to: &str, n: usize, gap: Duration) {
    put_from(sim, "client", to, n, gap);
}

/// Node `from` PUTs (with ACK) `n` messages to `to`, one every `gap`.
fn put_from(sim: &mut Sim, from: &str, to: &str, n: usize, gap: Duration) {
    let target = ProcessId::lustre(nid(to));
    for i in 0..n {
        let mem_2 = sim.register_mem(from, vec![i as u8; 8]);
        let md = sim
            .with_node(from, |node, _| {
                node.md_bind(
                    MdSpec::new(mem_2, MdOptions::empty())
                        .threshold(Threshold::Count(2))
                        .unlink(Unlink::Unlink),
                )
            })
            .unwrap();
        sim.with_node(from, |node, now| {
            node.put(now, md, true, target, PORTAL, i as u64, 0, 0)
        })
        .unwrap();
        sim.run_for(gap).unwrap();
    }
}

/// User PUTs (8-byte payload: 80 bytes on the wire) delivered client →
/// server since trace index `from`, as (client NI, server NI) pairs.
fn client_puts(sim: &Sim, from: usize) -> Vec<(Nid, Nid)> {
    let client = sim.node("client").nids();
    sim.trace()[from..]
        .iter()
        .filter(|t: &&TraceRecord| {
            t.outcome == Ok(MsgType::Put.to_u32()) && client.contains(&t.from) && t.len == 72 + 8
        })
        .map(|t| (t.from, t.to))
        .collect()
}

fn acks(sim: &Sim) -> usize {
    acks_of(sim, "client")
}

/// Successful ACKs node `name` received.
fn acks_of(sim: &Sim, name: &str) -> usize {
    sim.events(name)
        .iter()
        .filter(|(_, e)| e.kind() == EventKind::Ack && e.status().is_ok())
        .count()
}

/// A PUT from the client to `to`, and time for it to settle (discovery
/// and pushes included).
fn put_and_settle(sim: &mut Sim, to: &str) {
    put_n(sim, to, 1, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
}

/// Client and server that discovered each other (both with a PUT sink).
fn acquainted(seed: u64) -> Sim {
    let mut sim = two_rails(seed);
    post_sink(&mut sim, "client");
    put_and_settle(&mut sim, S_TCP);
    sim
}

/// Restarts node `name` with `nids` and a PUT sink, as a process that
/// came back would.
fn restart_with(sim: &mut Sim, name: &str, nids: &[&str]) {
    let nis = nids.iter().map(|n| NiConfig::new(nid(n))).collect();
    sim.restart(name, NodeConfig::new(nis)).unwrap();
    post_sink(sim, name);
}

/// Node `from` PUTs 20 messages to `to`: all are acknowledged, none goes
/// to `old`, and (unless `None`) some go to `new`.
fn twenty_reach_the_new_nis(sim: &mut Sim, from: &str, to: &str, old: &str, new: Option<&str>) {
    let first = sim.trace().len();
    let before = acks_of(sim, from);
    put_from(sim, from, to, 20, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(acks_of(sim, from), before + 20);
    let sent = &sim.trace()[first..];
    assert!(sent.iter().all(|t| t.to != nid(old)));
    if let Some(new) = new {
        assert!(sent.iter().any(|t| t.to == nid(new)));
    }
}

#[test]
fn discovers_multi_rail_peer_and_spreads_traffic_over_both_nets() {
    let mut sim = two_rails(1);
    put_n(&mut sim, S_TCP, 1, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    // Discovery: the first PUT was parked, the server pinged, its two NIs
    // merged into one Multi-Rail peer, our NIs pushed to it.
    let disc = sim.node("client").discovery();
    let peer = disc.peers().peer_of(nid(S_TCP)).expect("peer exists");
    assert!(peer.is_multi_rail());
    assert_eq!(peer.ni_count(), 2);
    assert!(peer.contains(nid(S_IB)));
    assert_eq!(disc.state_of(nid(S_IB)), PeerState::Active);
    assert_eq!(sim.node("server").stats().push_received, 1);
    assert_eq!(sim.node("server").stats().ping_served, 1);
    assert_eq!(acks(&sim), 1);

    // Traffic is spread over both rails (round robin among equals).
    let start = sim.trace().len();
    put_n(&mut sim, S_TCP, 20, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let puts = client_puts(&sim, start);
    assert_eq!(puts.len(), 20);
    let tcp = puts
        .iter()
        .filter(|(f, _)| f.net() == nid(C_TCP).net())
        .count();
    let ib = puts.len() - tcp;
    assert!(tcp >= 8 && ib >= 8, "tcp {tcp}, o2ib {ib}");
    // Each PUT stays on one net (local and peer NI on the same net).
    assert!(puts.iter().all(|(f, t)| f.net() == t.net()));
    assert_eq!(acks(&sim), 21);
    // The server's view: one MR peer with both client NIs, from the push.
    let speer = sim
        .node("server")
        .discovery()
        .peers()
        .peer_of(nid(C_IB))
        .unwrap();
    assert!(speer.contains(nid(C_TCP)));
}

#[test]
fn failing_peer_ni_loses_health_traffic_moves_and_comes_back_after_recovery() {
    let mut sim = two_rails(2);
    put_n(&mut sim, S_TCP, 4, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(acks(&sim), 4);

    // The server's o2ib NI starts dropping: the client's LND reports
    // REMOTE_DROPPED for everything sent to it (connection refused).
    let rule = sim
        .with_node("client", |n, now| {
            n.add_drop_rule(
                now,
                DropRuleSpec {
                    matcher: FaultMatch::between(Nid::ANY, nid(S_IB)),
                    trigger: Trigger::Rate(1),
                    health_mask: HealthError::RemoteDropped.bit(),
                },
            )
        })
        .unwrap();
    let start = sim.trace().len();
    put_n(&mut sim, S_TCP, 20, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    // Every PUT still arrives: failures on o2ib were resent over tcp.
    assert_eq!(acks(&sim), 24);
    let h = sim.node("client").health().peer_health(nid(S_IB)).value();
    assert!(h < MAX_HEALTH, "o2ib peer NI health {h}");
    assert_eq!(
        sim.node("client").health().peer_health(nid(S_TCP)).value(),
        MAX_HEALTH
    );
    // Once its health fell, traffic went to the healthy rail only.
    let puts = client_puts(&sim, start);
    assert!(puts.iter().all(|(_, to)| *to == nid(S_TCP)));
    // Only the first attempt on o2ib failed and was resent: after that,
    // selection avoided the unhealthy peer NI (round robin alone would have
    // sent every other PUT there).
    assert_eq!(sim.node("client").stats().resend_count, 1);
    let stats = sim.node("client").fault_stats(rule).unwrap();
    assert_eq!(stats.put, 1, "{stats:?}");

    // The rail heals: recovery pings (1 s back-off, each success +100)
    // bring the peer NI back to full health...
    assert!(sim.with_node("client", |n, now| n.remove_fault_rule(now, rule)));
    sim.run_for(Duration::from_secs(30)).unwrap();
    assert_eq!(
        sim.node("client").health().peer_health(nid(S_IB)).value(),
        MAX_HEALTH
    );
    // ...and traffic uses both rails again.
    let start = sim.trace().len();
    put_n(&mut sim, S_TCP, 20, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let puts = client_puts(&sim, start);
    let ib = puts.iter().filter(|(_, to)| *to == nid(S_IB)).count();
    assert!(ib >= 8, "o2ib carried {ib} of {}", puts.len());
}

#[test]
fn local_ni_added_is_pushed_to_the_peer() {
    let mut sim = two_rails(3);
    put_n(&mut sim, S_TCP, 1, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let pushes_before = sim.node("client").stats().push_received;
    let seq_before = sim.node("server").ping_seq();
    // The server gets a third NI (lnetctl net add): its ping buffer is
    // rebuilt with a new sequence number and pushed to its Multi-Rail peers.
    let new_ni = nid("172.16.0.2@tcp1");
    sim.with_node("server", |n, now| n.add_ni(now, NiConfig::new(new_ni)))
        .unwrap();
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(sim.node("server").ping_seq(), seq_before + 1);
    assert_eq!(sim.node("client").stats().push_received, pushes_before + 1);
    let (from, info) = std::iter::from_fn(|| sim.node_mut("client").poll_push())
        .last()
        .unwrap();
    assert!(sim.node("server").nids().contains(&from));
    assert_eq!(info.seqno, seq_before + 1);
    assert!(info.nis.iter().any(|n| n.nid == new_ni));
    // The client's peer now lists the new NI.
    let peer = sim
        .node("client")
        .discovery()
        .peers()
        .peer_of(nid(S_TCP))
        .unwrap();
    assert_eq!(peer.ni_count(), 3);
    assert!(peer.contains(new_ni));
    assert_eq!(
        sim.node("client").discovery().peer_seq(nid(S_TCP)),
        Some(seq_before + 1)
    );
}

#[test]
fn two_peers_of_one_node_are_merged() {
    let mut sim = two_rails(4);
    // The client addresses the same server through both of its NIDs before
    // knowing they are one node: two peers are created, both discovered.
    let ta = ProcessId::lustre(nid(S_TCP));
    let tb = ProcessId::lustre(nid(S_IB));
    for (i, t) in [ta, tb].into_iter().enumerate() {
        let mem_3 = sim.register_mem("client", vec![7; 8]);
        let md = sim
            .with_node("client", |n, _| {
                n.md_bind(MdSpec::new(mem_3, MdOptions::empty()).threshold(Threshold::Count(2)))
            })
            .unwrap();
        sim.with_node("client", |n, now| {
            n.put(now, md, true, t, PORTAL, i as u64, 0, 0)
        })
        .unwrap();
    }
    assert_eq!(sim.node("client").discovery().peers().len(), 2);
    assert_ne!(
        sim.node("client")
            .discovery()
            .peers()
            .peer_id_of(nid(S_TCP)),
        sim.node("client").discovery().peers().peer_id_of(nid(S_IB))
    );
    sim.run_for(Duration::from_millis(20)).unwrap();
    // The ping replies show the same node: one peer remains, with both NIDs
    // and the node's primary NID; both parked PUTs were delivered.
    let peers = sim.node("client").discovery().peers();
    assert_eq!(peers.len(), 1, "{peers:?}");
    let p = peers.peer_of(nid(S_IB)).unwrap();
    assert_eq!(p.primary_nid(), nid(S_TCP));
    assert!(p.contains(nid(S_TCP)) && p.contains(nid(S_IB)));
    assert_eq!(peers.invariant_violation(), None);
    assert_eq!(acks(&sim), 2);
    let bits: BTreeSet<u64> = sim
        .events("server")
        .iter()
        .filter(|(_, e)| e.kind() == EventKind::Put)
        .map(|(_, e)| e.info.match_bits)
        .collect();
    assert_eq!(bits, BTreeSet::from([0, 1]));
}

#[test]
fn discovery_ping_timeout_fails_parked_messages() {
    // The server drops every GET it receives: the discovery ping is lost, the
    // parked PUT fails with a timeout after the transaction timeout, and the
    // peer goes back to VERIFY (the next send discovers again).
    let mut sim = two_rails(5);
    sim.with_node("server", |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Get)),
                trigger: Trigger::Rate(1),
                health_mask: 0,
            },
        )
    })
    .unwrap();
    put_n(&mut sim, S_TCP, 1, Duration::from_millis(1));
    assert_eq!(
        sim.node("client").discovery().state_of(nid(S_TCP)),
        PeerState::WaitPingResponse
    );
    sim.run_for(Duration::from_secs(200)).unwrap();
    let evs = sim.events("client");
    let send = evs
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Send)
        .unwrap();
    assert!(send.1.status().is_err());
    assert!(send.0 >= Time::from_secs(150));
    assert!(sim.events("server").is_empty());
    assert_eq!(
        sim.node("client").discovery().state_of(nid(S_TCP)),
        PeerState::Verify
    );
}

#[test]
fn local_ni_at_zero_health_is_advertised_down_and_pushed() {
    use colibri_lnet::wire::NiStatus;

    let mut sim = two_rails(6);
    put_n(&mut sim, S_TCP, 1, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let seq = sim.node("client").ping_seq();
    // Everything the client's o2ib NI sends fails locally, recovery pings
    // through itself included.
    let mut m = FaultMatch::ANY;
    m.src = nid(C_IB);
    sim.with_node("client", |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: m,
                trigger: Trigger::Rate(1),
                health_mask: HealthError::LocalDropped.bit(),
            },
        )
    })
    .unwrap();
    put_n(&mut sim, S_TCP, 4, Duration::from_millis(1));
    sim.run_for(Duration::from_secs(120)).unwrap();
    assert_eq!(
        sim.node("client").health().local_health(nid(C_IB)).value(),
        0
    );
    assert_eq!(
        sim.node("client").ni_info(nid(C_IB)).unwrap().status,
        NiStatus::Down
    );
    assert!(sim.node("client").ping_seq() > seq);
    // The server learnt it from a push: its peer NI for C_IB is DOWN.
    let (_, info) = std::iter::from_fn(|| sim.node_mut("server").poll_push())
        .last()
        .unwrap();
    let entry = info.nis.iter().find(|n| n.nid == nid(C_IB)).unwrap();
    assert_eq!(entry.status, NiStatus::Down);
    let peer_ni = sim
        .node("server")
        .discovery()
        .peers()
        .ni(nid(C_IB))
        .unwrap();
    assert_eq!(peer_ni.status(), NiStatus::Down);
    // Every PUT was still delivered over tcp.
    assert_eq!(acks(&sim), 5);
}

#[test]
fn dlc_configured_peer_is_not_rewritten_by_discovery() {
    let mut sim = two_rails(7);
    // lnetctl peer add --prim_nid S_TCP --non_mr: only the tcp NID is known.
    sim.with_node("client", |n, now| {
        n.dlc_add_peer(now, nid(S_TCP), &[nid(S_TCP)], false)
    })
    .unwrap();
    assert_eq!(
        sim.node("client").discovery().state_of(nid(S_TCP)),
        PeerState::Verify
    );
    put_n(&mut sim, S_TCP, 4, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    // The server was pinged (its reply lists both NIs), but the configured
    // peer keeps exactly its configuration: one NI, not Multi-Rail.
    assert_eq!(sim.node("server").stats().ping_served, 1);
    let peer = sim
        .node("client")
        .discovery()
        .peers()
        .peer_of(nid(S_TCP))
        .unwrap();
    assert_eq!(peer.ni_count(), 1);
    assert!(!peer.is_multi_rail());
    assert!(!peer.contains(nid(S_IB)));
    assert_eq!(acks(&sim), 4);
    // So all traffic used the configured NID.
    assert!(client_puts(&sim, 0).iter().all(|(_, to)| *to == nid(S_TCP)));
    // DLC changes while the peer is being discovered are refused with Busy.
    let mut sim = two_rails(8);
    put_n(&mut sim, S_TCP, 1, Duration::from_micros(1));
    assert_eq!(
        sim.node("client").discovery().state_of(nid(S_TCP)),
        PeerState::WaitPingResponse
    );
    let busy = sim.with_node("client", |n, now| {
        n.dlc_add_peer(now, nid(S_TCP), &[nid(S_IB)], true)
    });
    assert!(matches!(
        busy,
        Err(colibri_lnet::node::NodeError::Peer(
            colibri_lnet::peer::PeerError::Busy(_)
        ))
    ));
}

#[test]
fn health_set_by_hand_moves_traffic_and_recovery_brings_it_back() {
    use colibri_lnet::health::NiSide;
    use colibri_lnet::node::NodeError;
    use colibri_lnet::wire::NiStatus;

    let mut sim = two_rails(8);
    put_n(&mut sim, S_TCP, 4, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(acks(&sim), 4);

    // `lnetctl peer set --nid S_IB --health 0`: the client stops sending
    // to that rail, and the NI enters recovery.
    let set = |sim: &mut Sim, side, nid: Option<Nid>, v| {
        sim.with_node("client", |n, now| n.set_ni_health(now, side, nid, v))
    };
    assert_eq!(set(&mut sim, NiSide::Peer, Some(nid(S_IB)), 0).unwrap(), 1);
    let health = |sim: &Sim, side, n: &str| match side {
        NiSide::Local => sim.node("client").health().local_health(nid(n)).value(),
        NiSide::Peer => sim.node("client").health().peer_health(nid(n)).value(),
    };
    assert_eq!(health(&sim, NiSide::Peer, S_IB), 0);
    let start = sim.trace().len();
    put_n(&mut sim, S_TCP, 20, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(acks(&sim), 24);
    let puts = client_puts(&sim, start);
    assert!(puts.iter().all(|(_, to)| *to == nid(S_TCP)), "{puts:?}");
    // The rail was healthy all along: recovery pings bring it back.
    sim.run_for(Duration::from_secs(300)).unwrap();
    assert_eq!(health(&sim, NiSide::Peer, S_IB), MAX_HEALTH);

    // `lnetctl net set --nid C_IB --health 0`: the local NI goes down;
    // `--health 1000` (or more) brings it up at once.
    assert_eq!(set(&mut sim, NiSide::Local, Some(nid(C_IB)), 0).unwrap(), 1);
    let status = |sim: &Sim| sim.node("client").ni_info(nid(C_IB)).unwrap().status;
    assert_eq!(status(&sim), NiStatus::Down);
    assert_eq!(
        set(&mut sim, NiSide::Local, Some(nid(C_IB)), 5000).unwrap(),
        1
    );
    assert_eq!(health(&sim, NiSide::Local, C_IB), MAX_HEALTH);
    assert_eq!(status(&sim), NiStatus::Up);

    // `--all`: every interface of the side.
    assert_eq!(set(&mut sim, NiSide::Local, None, 300).unwrap(), 2);
    assert_eq!(health(&sim, NiSide::Local, C_TCP), 300);
    assert_eq!(health(&sim, NiSide::Local, C_IB), 300);
    assert_eq!(set(&mut sim, NiSide::Peer, None, 700).unwrap(), 2);
    assert_eq!(health(&sim, NiSide::Peer, S_TCP), 700);

    // A NID that is not an interface of that side is refused.
    assert!(matches!(
        set(&mut sim, NiSide::Local, Some(nid(S_TCP)), 0),
        Err(NodeError::NoSuchNi(_))
    ));
    assert!(matches!(
        set(&mut sim, NiSide::Peer, Some(nid("10.9.9.9@tcp")), 0),
        Err(NodeError::NoSuchPeerNi(_))
    ));
}

/// A client that restarts with its o2ib NI at another address, after
/// `changes` changes of its NIs (each numbers its ping buffer one higher):
/// the server learns the new NIs and forgets the old one, and its messages
/// to the client all arrive.
fn restarted_peer_is_known_by_its_new_nis(seed: u64, changes: u32) {
    const NEW_IB: &str = "192.168.0.3@o2ib";
    let mut sim = two_rails(seed);
    post_sink(&mut sim, "client");
    let first_seq = sim.node("client").ping_seq();
    for i in 0..changes {
        // lnetctl net add / net del of a third NI.
        let extra = nid(&format!("172.16.0.{}@tcp1", i + 10));
        sim.with_node("client", |n, now| {
            if i % 2 == 0 {
                n.add_ni(now, NiConfig::new(extra))
            } else {
                n.del_ni(now, nid(&format!("172.16.0.{}@tcp1", i + 9)))
            }
        })
        .unwrap();
    }
    put_and_settle(&mut sim, S_TCP);
    assert_eq!(sim.node("client").ping_seq(), first_seq + changes);
    let known = |sim: &Sim| {
        let peer = sim
            .node("server")
            .discovery()
            .peers()
            .peer_of(nid(C_TCP))
            .unwrap();
        [nid(C_TCP), nid(C_IB), nid(NEW_IB)].map(|n| peer.contains(n))
    };
    assert_eq!(known(&sim), [true, true, false]);

    // The client reboots: its ping buffer is numbered from the start again,
    // no higher than the one the server saw.
    restart_with(&mut sim, "client", &[C_TCP, NEW_IB]);
    assert_eq!(sim.node("client").ping_seq(), first_seq);
    // Its first message discovers the server, then pushes its NIs.
    put_and_settle(&mut sim, S_TCP);
    assert_eq!(acks(&sim), 1);
    assert_eq!(known(&sim), [true, false, true]);
    let stale = sim.node("server").discovery().stats().stale_pushes;
    assert_eq!(stale, u64::from(changes > 0));

    // The server's messages go to the NIs the client has now.
    twenty_reach_the_new_nis(&mut sim, "server", C_TCP, C_IB, Some(NEW_IB));
}

/// The restarted client's push carries the number the server saw last:
/// taken (the seed is silent on an equal number; Lustre takes every push).
#[test]
fn a_peer_restarted_with_other_nis_is_known_by_its_new_ones() {
    restarted_peer_is_known_by_its_new_nis(9, 0);
}

/// The old incarnation had changed its NIs twice, so the restarted client's
/// push is older than what the server saw: ignored (the seed's rule), and
/// the server pings the client instead, whose reply it takes.
#[test]
fn a_peer_restarted_numbering_lower_is_pinged_and_known_by_its_new_nis() {
    restarted_peer_is_known_by_its_new_nis(10, 2);
}

/// The client comes back with its o2ib NI first and its tcp NI at another
/// address: the peer the server knew, found by the o2ib NID, takes the new
/// set, and its primary NID is the one the client now calls primary.
#[test]
fn a_peer_restarted_with_another_primary_nid_is_known_by_it() {
    const NEW_TCP: &str = "10.0.0.3@tcp";
    let mut sim = acquainted(11);
    restart_with(&mut sim, "client", &[C_IB, NEW_TCP]);
    put_and_settle(&mut sim, S_TCP);
    assert_eq!(acks(&sim), 1);
    let peers = sim.node("server").discovery().peers();
    let peer = peers.peer_of(nid(C_IB)).unwrap();
    assert!(peer.contains(nid(NEW_TCP)));
    assert!(!peer.contains(nid(C_TCP)));
    assert_eq!(peer.primary_nid(), nid(C_IB));
    twenty_reach_the_new_nis(&mut sim, "server", C_IB, C_TCP, None);
}

/// The server restarts with its o2ib NI at another address. The client's
/// sends to the old one fail over to the tcp rail; the server's first
/// message to the client discovers it and pushes the server's NIs, and the
/// client takes them, so it sends to the new address from then on.
#[test]
fn a_server_restarted_with_other_nis_is_learned_when_it_sends() {
    const NEW_IB: &str = "192.168.0.4@o2ib";
    let mut sim = acquainted(12);
    restart_with(&mut sim, "server", &[S_TCP, NEW_IB]);
    put_from(&mut sim, "server", C_TCP, 1, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let peer = sim
        .node("client")
        .discovery()
        .peers()
        .peer_of(nid(S_TCP))
        .unwrap();
    assert!(peer.contains(nid(NEW_IB)) && !peer.contains(nid(S_IB)));
    twenty_reach_the_new_nis(&mut sim, "client", S_TCP, S_IB, Some(NEW_IB));
}

/// A client that changed its NIs twice, then restarts with its o2ib NI
/// only: its push comes from a NID the server knows, numbered lower than
/// what the server saw, and the ping that checks it goes to the NID the
/// push came from, not to the old primary, which is gone.
#[test]
fn a_peer_restarted_lower_without_its_old_primary_is_pinged_where_it_is() {
    let mut sim = two_rails(13);
    post_sink(&mut sim, "client");
    for add in [true, false] {
        let extra = nid("172.16.0.10@tcp1");
        sim.with_node("client", |n, now| {
            if add {
                n.add_ni(now, NiConfig::new(extra))
            } else {
                n.del_ni(now, extra)
            }
        })
        .unwrap();
    }
    put_and_settle(&mut sim, S_TCP);
    restart_with(&mut sim, "client", &[C_IB]);
    put_and_settle(&mut sim, S_IB);
    assert_eq!(acks(&sim), 1);
    assert_eq!(sim.node("server").discovery().stats().stale_pushes, 1);
    let peers = sim.node("server").discovery().peers();
    let peer = peers.peer_of(nid(C_IB)).unwrap();
    assert!(!peer.contains(nid(C_TCP)), "the old primary is forgotten");
    assert_eq!(peer.primary_nid(), nid(C_IB));
    twenty_reach_the_new_nis(&mut sim, "server", C_IB, C_TCP, None);
}

/// UDSP (Lustre's `lnetctl udsp`): a source net rule sends everything
/// from that net's NI, a destination net rule to that net's peer NI, and
/// health still comes first; deleting the rule spreads traffic again.
#[test]
fn selection_policies_steer_traffic_by_priority() {
    use colibri_lnet::udsp::Rule;
    let mut sim = two_rails(41);
    put_and_settle(&mut sim, S_TCP);
    let rule = |src: Option<&str>, dst: Option<&str>| Rule::parse(src, dst, None, Some(0)).unwrap();
    let nets_of = |sim: &mut Sim| -> (usize, usize) {
        let start = sim.trace().len();
        put_n(sim, S_TCP, 20, Duration::from_millis(1));
        sim.run_for(Duration::from_millis(10)).unwrap();
        let puts = client_puts(sim, start);
        assert_eq!(puts.len(), 20);
        assert!(puts.iter().all(|(f, t)| f.net() == t.net()));
        let ib = puts.iter().filter(|(f, _)| *f == nid(C_IB)).count();
        (puts.len() - ib, ib)
    };
    // Our o2ib net first.
    sim.with_node("client", |n, _| n.udsp_add(rule(Some("o2ib"), None), None))
        .unwrap();
    assert_eq!(nets_of(&mut sim), (0, 20));
    // The peer's tcp net, put first at index 0 (the lowest index decides
    // between two rules; here they are on different roles, and the peer
    // net is ranked before our net).
    sim.with_node("client", |n, _| n.udsp_del(None)).unwrap();
    sim.with_node("client", |n, _| n.udsp_add(rule(None, Some("tcp")), None))
        .unwrap();
    assert_eq!(nets_of(&mut sim), (20, 0));
    // A NID rule on our tcp NI does not move traffic off o2ib by itself:
    // it ranks NIs within a net.
    sim.with_node("client", |n, _| n.udsp_del(Some(0))).unwrap();
    sim.with_node("client", |n, _| n.udsp_add(rule(Some(C_TCP), None), None))
        .unwrap();
    let (tcp, ib) = nets_of(&mut sim);
    assert!(tcp >= 8 && ib >= 8, "tcp {tcp}, o2ib {ib}");
    // No rules: both rails again.
    sim.with_node("client", |n, _| n.udsp_del(None)).unwrap();
    let (tcp, ib) = nets_of(&mut sim);
    assert!(tcp >= 8 && ib >= 8, "tcp {tcp}, o2ib {ib}");
    assert_eq!(acks(&sim), 81);
}

/// A UDSP NID pair rule: the peer NI it names prefers the local NI it
/// names, so whenever that local NI sends, it sends there.
#[test]
fn a_nid_pair_rule_pairs_rails() {
    use colibri_lnet::udsp::Rule;
    let (c1, c2, s1, s2) = (
        "10.0.0.1@tcp",
        "10.0.0.11@tcp",
        "10.0.0.2@tcp",
        "10.0.0.12@tcp",
    );
    let mut sim = Sim::new(
        Topology::new(42)
            .node("client", &[c1, c2])
            .node("server", &[s1, s2])
            .latency("tcp", Duration::from_micros(20)),
    )
    .unwrap();
    post_sink(&mut sim, "server");
    put_and_settle(&mut sim, s1);
    let pairs = |sim: &mut Sim| {
        let start = sim.trace().len();
        put_n(sim, s1, 24, Duration::from_millis(1));
        sim.run_for(Duration::from_millis(10)).unwrap();
        client_puts(sim, start)
    };
    let before = pairs(&mut sim);
    assert!(
        before.iter().any(|&p| p == (nid(c1), nid(s1))),
        "without a rule c1 also sends to s1: {before:?}"
    );
    sim.with_node("client", |n, _| {
        n.udsp_add(Rule::parse(Some(c1), Some(s2), None, None).unwrap(), None)
    })
    .unwrap();
    sim.with_node("client", |n, _| {
        n.udsp_add(Rule::parse(Some(c2), Some(s1), None, None).unwrap(), None)
    })
    .unwrap();
    let after = pairs(&mut sim);
    assert_eq!(after.len(), 24);
    for (from, to) in &after {
        let want = if *from == nid(c1) { nid(s2) } else { nid(s1) };
        assert_eq!(*to, want, "{after:?}");
    }
    assert!(after.iter().any(|(f, _)| *f == nid(c1)) && after.iter().any(|(f, _)| *f == nid(c2)));
}

/// Sanity-lnet 303 ("Check peer NI health after link down"), with the
/// socket LND's link watch as `Node::set_ni_link`: the client's o2ib NI
/// loses its link; it is marked fatal and down at once (not after failed
/// sends), the change is pushed and the server lowers that peer NI's
/// health; the client sends over tcp only. When the link is back, the NI
/// is up again and takes traffic.
#[test]
fn a_local_ni_whose_link_goes_down_is_advertised_down_and_avoided() {
    use colibri_lnet::wire::NiStatus;

    let mut sim = acquainted(7);
    let seq = sim.node("client").ping_seq();
    // The wire goes (nothing reaches the NI any more), and the LND says so.
    sim.set_ni_down(nid(C_IB), true);
    let changed = sim
        .with_node("client", |n, now| n.set_ni_link(now, nid(C_IB), false))
        .unwrap();
    assert!(changed);
    let info = sim.node("client").ni_info(nid(C_IB)).unwrap();
    assert!(info.fatal);
    assert_eq!(info.status, NiStatus::Down);
    assert!(sim.node("client").ping_seq() > seq);
    sim.run_for(Duration::from_millis(10)).unwrap();
    // The server heard it from the push.
    let server = sim.node("server");
    let peer_ni = server.discovery().peers().ni(nid(C_IB)).unwrap();
    assert_eq!(peer_ni.status(), NiStatus::Down);
    assert!(server.health().peer_health(nid(C_IB)).value() < MAX_HEALTH);
    // Every PUT leaves from tcp.
    let from = sim.trace().len();
    put_n(&mut sim, S_TCP, 6, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let puts = client_puts(&sim, from);
    assert_eq!(puts.len(), 6);
    assert!(puts.iter().all(|(c, _)| *c == nid(C_TCP)), "{puts:?}");
    // Saying it again changes nothing; an unknown NI is refused.
    assert!(
        !sim.with_node("client", |n, now| n.set_ni_link(now, nid(C_IB), false))
            .unwrap()
    );
    assert!(
        sim.with_node("client", |n, now| n.set_ni_link(
            now,
            nid("10.9.9.9@tcp"),
            false
        ))
        .is_err()
    );
    // The link comes back: up, pushed, used again.
    sim.set_ni_down(nid(C_IB), false);
    sim.with_node("client", |n, now| n.set_ni_link(now, nid(C_IB), true))
        .unwrap();
    let info = sim.node("client").ni_info(nid(C_IB)).unwrap();
    assert!(!info.fatal);
    assert_eq!(info.status, NiStatus::Up);
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(
        sim.node("server")
            .discovery()
            .peers()
            .ni(nid(C_IB))
            .unwrap()
            .status(),
        NiStatus::Up
    );
    let from = sim.trace().len();
    put_n(&mut sim, S_TCP, 6, Duration::from_millis(1));
    sim.run_for(Duration::from_millis(10)).unwrap();
    let puts = client_puts(&sim, from);
    assert!(puts.iter().any(|(c, _)| *c == nid(C_IB)), "{puts:?}");
    assert_eq!(acks(&sim), 13);
}
