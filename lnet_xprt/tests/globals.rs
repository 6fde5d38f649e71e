//! `lnetctl set` globals and the counters `lnetctl` prints, on the
//! simulator's manual clock: each global changes what the node does.

mod common;
use common::{nid, post_any};

use std::time::Duration;

use colibri_lnet::ids::ProcessId;
use colibri_lnet::matching::{EventKind, MdHandle, MdOptions, MdSpec, OpError, Threshold};
use colibri_lnet::node::ResponseTracking;
use colibri_lnet::sim::{Sim, Topology};
use colibri_lnet::time::Time;

/// client (tcp) — r1, r2 (tcp, o2ib1) — server (o2ib1). The client goes
/// out through r1 only; the server's only route back is through r2.
fn asym(seed: u64) -> Sim {
    let topo = Topology::parse(&format!(
        "seed {seed}\n\
         node client 10.0.0.1@tcp\n\
         node r1 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
         node r2 10.0.0.4@tcp 192.168.1.4@o2ib1 routing\n\
         node server 192.168.1.2@o2ib1\n\
         route client o2ib1 10.0.0.3@tcp hops 1\n\
         route server tcp 192.168.1.4@o2ib1 hops 1\n\
         latency tcp 50us\n\
         latency o2ib1 20us\n"
    ))
    .unwrap();
    let mut sim = Sim::new(topo).unwrap();
    sim.with_node("client", |n, now| n.set_discovery(now, false))
        .unwrap();
    sim.with_node("server", |n, now| n.set_discovery(now, false))
        .unwrap();
    sim
}

fn bind(sim: &mut Sim, node: &str, bytes: Vec<u8>, count: u32) -> MdHandle {
    let mem = sim.register_mem(node, bytes);
    sim.with_node(node, |n, _| {
        n.md_bind(MdSpec::new(mem, MdOptions::empty()).threshold(Threshold::Count(count)))
    })
    .unwrap()
}

fn put(sim: &mut Sim, from: &str, to: &str, portal: u32, ack: bool) -> MdHandle {
    let md = bind(sim, from, b"hello".to_vec(), if ack { 2 } else { 1 });
    let target = ProcessId::lustre(nid(to));
    sim.with_node(from, |n, now| n.put(now, md, ack, target, portal, 0, 0, 0))
        .unwrap();
    md
}

fn kinds(sim: &mut Sim, node: &str) -> Vec<(EventKind, Result<(), OpError>, bool)> {
    sim.take_events(node)
        .into_iter()
        .map(|(_, e)| (e.kind(), e.status(), e.unlinked))
        .collect()
}

#[test]
fn drop_asym_route_drops_what_came_through_a_gateway_we_do_not_route_back_through() {
    let mut sim = asym(1);
    let inbox = sim.register_mem("server", vec![0; 16]);
    post_any(&mut sim, "server", 4, MdSpec::new(inbox, MdOptions::OP_PUT));
    // Off (the default): the PUT through r1 is delivered.
    put(&mut sim, "client", "192.168.1.2@o2ib1", 4, false);
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(&sim.mem("server", inbox.key)[..5], b"hello");
    assert!(
        kinds(&mut sim, "server")
            .iter()
            .any(|k| k.0 == EventKind::Put)
    );
    let before = sim.node("server").stats();

    // On: the same PUT is dropped at the server, counted for the node, the
    // receiving NI and the gateway's peer NI (as a dropped PUT).
    sim.node_mut("server").set_drop_asym_route(true);
    put(&mut sim, "client", "192.168.1.2@o2ib1", 4, false);
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(kinds(&mut sim, "server").is_empty(), "nothing delivered");
    let s = sim.node("server").stats();
    assert_eq!(s.drop_count, before.drop_count + 1);
    assert_eq!(s.drop_length, before.drop_length + 5);
    let gw = sim
        .node("server")
        .peer_ni_stats(nid("192.168.1.3@o2ib1"))
        .unwrap();
    assert_eq!((gw.drop_count, gw.dropped.put), (1, 1));
    let ni = sim
        .node("server")
        .ni_info(nid("192.168.1.2@o2ib1"))
        .unwrap();
    assert_eq!((ni.drop_count, ni.dropped.put), (1, 1));

    // A route back through r1 makes the path symmetric again.
    sim.with_node("server", |n, now| {
        n.add_route(
            now,
            "tcp".parse().unwrap(),
            nid("192.168.1.3@o2ib1"),
            Some(1),
            0,
        )
    })
    .unwrap();
    put(&mut sim, "client", "192.168.1.2@o2ib1", 4, false);
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(
        kinds(&mut sim, "server")
            .iter()
            .any(|k| k.0 == EventKind::Put)
    );
    assert_eq!(sim.node("server").stats().drop_count, s.drop_count);
}

#[test]
fn drop_asym_route_leaves_direct_traffic_alone() {
    let mut sim = asym(2);
    sim.node_mut("server").set_drop_asym_route(true);
    let inbox = sim.register_mem("server", vec![0; 16]);
    post_any(&mut sim, "server", 4, MdSpec::new(inbox, MdOptions::OP_PUT));
    // r1 itself is on the server's net: not routed, not dropped.
    put(&mut sim, "r1", "192.168.1.2@o2ib1", 4, false);
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(
        kinds(&mut sim, "server")
            .iter()
            .any(|k| k.0 == EventKind::Put)
    );
    assert_eq!(sim.node("server").stats().drop_count, 0);
}

/// Two nodes on one net; the server has nothing on portal 9, so PUTs and
/// GETs there are dropped and their ACK/REPLY never comes.
fn pair(seed: u64, tt: u64) -> Sim {
    let topo = Topology::new(seed)
        .node("a", &["10.0.0.1@tcp"])
        .node("b", &["10.0.0.2@tcp"])
        .configure("a", |c| {
            c.discovery = false;
            c.transaction_timeout = Duration::from_secs(tt);
        })
        .configure("b", |c| c.discovery = false)
        .latency("tcp", Duration::from_micros(20));
    Sim::new(topo).unwrap()
}

fn get(sim: &mut Sim, from: &str, to: &str, portal: u32) -> MdHandle {
    let md = bind(sim, from, vec![0; 8], 2);
    let target = ProcessId::lustre(nid(to));
    sim.with_node(from, |n, now| n.get(now, md, target, portal, 0, 0))
        .unwrap();
    md
}

#[test]
fn response_tracking_decides_which_operations_time_out() {
    for (mode, put_times_out, get_times_out) in [
        (ResponseTracking::Both, true, true),
        (ResponseTracking::Get, false, true),
        (ResponseTracking::Put, true, false),
        (ResponseTracking::None, false, false),
    ] {
        let mut sim = pair(3, 10);
        sim.node_mut("a").set_response_tracking(mode);
        let p = put(&mut sim, "a", "10.0.0.2@tcp", 9, true);
        let g = get(&mut sim, "a", "10.0.0.2@tcp", 9);
        sim.run_for(Duration::from_secs(30)).unwrap();
        let evs = sim.take_events("a");
        let timed_out = |md: MdHandle| {
            evs.iter()
                .any(|(_, e)| e.md == md && e.status() == Err(OpError::TimedOut) && e.unlinked)
        };
        assert_eq!(timed_out(p), put_times_out, "{mode:?} PUT");
        assert_eq!(timed_out(g), get_times_out, "{mode:?} GET");
        let s = sim.node("a").stats();
        assert_eq!(
            s.response_timeout_count,
            u64::from(put_times_out) + u64::from(get_times_out)
        );
        // Untracked operations end when their MD is unlinked, at once.
        for (md, tracked) in [(p, put_times_out), (g, get_times_out)] {
            if !tracked {
                sim.with_node("a", |n, now| n.md_unlink(now, md)).unwrap();
                sim.run_for(Duration::from_millis(1)).unwrap();
                let evs = sim.take_events("a");
                assert_eq!(evs.len(), 1, "{mode:?}: one final event {evs:?}");
                assert!(evs[0].1.unlinked && evs[0].1.md == md);
            }
        }
    }
}

#[test]
fn md_track_options_override_the_global() {
    let mut sim = pair(4, 10);
    sim.node_mut("a")
        .set_response_tracking(ResponseTracking::None);
    let mem = sim.register_mem("a", vec![0; 8]);
    let md = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(mem, MdOptions::TRACK_RESPONSE).threshold(Threshold::Count(2)))
        })
        .unwrap();
    let target = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.get(now, md, target, 9, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(30)).unwrap();
    let evs = kinds(&mut sim, "a");
    assert!(
        evs.contains(&(EventKind::Reply, Err(OpError::TimedOut), true)),
        "{evs:?}"
    );
}

#[test]
fn unlinking_an_md_waiting_for_its_reply_ends_it_at_once() {
    let mut sim = pair(5, 100);
    let g = get(&mut sim, "a", "10.0.0.2@tcp", 9);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let sent = kinds(&mut sim, "a");
    assert_eq!(sent, vec![(EventKind::Send, Ok(()), false)]);
    let t0 = sim.now();
    sim.with_node("a", |n, now| n.md_unlink(now, g)).unwrap();
    sim.run_for(Duration::from_millis(1)).unwrap();
    let evs = sim.take_events("a");
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert!(evs[0].1.unlinked && evs[0].1.md == g);
    assert!(evs[0].0 <= t0 + Duration::from_millis(1), "at once");
    // Nothing more at the transaction timeout.
    sim.run_for(Duration::from_secs(200)).unwrap();
    assert!(sim.take_events("a").is_empty());
    assert_eq!(sim.node("a").stats().response_timeout_count, 0);

    // Unlinked while its GET is still with the LND: the send's completion
    // is the one final event, at once too.
    let g = get(&mut sim, "a", "10.0.0.2@tcp", 9);
    sim.with_node("a", |n, now| n.md_unlink(now, g)).unwrap();
    let t0 = sim.now();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let evs = sim.take_events("a");
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert!(evs[0].1.unlinked && evs[0].1.md == g);
    assert!(evs[0].0 <= t0 + Duration::from_secs(1));
    sim.run_for(Duration::from_secs(200)).unwrap();
    assert!(sim.take_events("a").is_empty());
}

#[test]
fn recovery_limits_are_settable_and_checked() {
    let mut sim = pair(6, 10);
    let n = sim.node_mut("a");
    n.set_recovery_params(Some(Duration::from_secs(30)), Duration::from_secs(8))
        .unwrap();
    let c = *n.health().config();
    assert_eq!(c.recovery_limit, Some(Duration::from_secs(30)));
    assert_eq!(c.max_recovery_ping_interval, Duration::from_secs(8));
    // The back-off now stops at 8 s: 1, 2, 4, 8, 8 …
    let seq: Vec<u64> = (0..6).map(|k| c.recovery_interval(k).as_secs()).collect();
    assert_eq!(seq, vec![1, 2, 4, 8, 8, 8]);
    assert!(n.set_recovery_params(None, Duration::ZERO).is_err());
    assert_eq!(
        n.config().max_recovery_ping_interval,
        Duration::from_secs(8)
    );
}

#[test]
fn max_recovery_ping_interval_caps_the_recovery_back_off() {
    // a's NI fails its sends (LOCAL_DROPPED): its health drops and it is
    // pinged through itself with back-off 1, 2, 4 … capped at the setting.
    let run = |cap: Option<u64>| {
        let mut sim = pair(7, 10);
        if let Some(cap) = cap {
            sim.node_mut("a")
                .set_recovery_params(None, Duration::from_secs(cap))
                .unwrap();
        }
        sim.set_ni_down(nid("10.0.0.1@tcp"), true);
        put(&mut sim, "a", "10.0.0.2@tcp", 9, false);
        sim.run_for(Duration::from_secs(1)).unwrap();
        let at = sim.node("a").stats().send_count;
        sim.run_for(Duration::from_secs(40)).unwrap();
        sim.node("a").stats().send_count - at
    };
    let default = run(None);
    let capped = run(Some(2));
    // Default cap (900 s): pings at +1, +2, +4, +8, +16 s: about 5 in 40 s;
    // a 2 s cap: one every 2 s, about 20.
    assert!(
        default <= 6,
        "{default} recovery pings with the default cap"
    );
    assert!(capped >= 15, "{capped} recovery pings with a 2 s cap");
}

#[test]
fn recovery_limit_stops_recovering_a_peer_ni_not_seen_for_that_long() {
    // a routes (so a single-NI peer's health is tracked, lnet.md 7.2); b
    // answers a ping, then its NI goes down: a's PUT fails REMOTE_DROPPED
    // and b's NI enters recovery.
    let run = |limit: Option<u64>| {
        let mut sim = pair(11, 10);
        sim.with_node("a", |n, now| n.set_routing(now, true))
            .unwrap();
        if let Some(l) = limit {
            sim.node_mut("a")
                .set_recovery_params(Some(Duration::from_secs(l)), Duration::from_secs(900))
                .unwrap();
        }
        sim.with_node("a", |n, now| n.ping(now, nid("10.0.0.2@tcp")))
            .unwrap();
        sim.run_for(Duration::from_secs(1)).unwrap();
        assert!(sim.node_mut("a").poll_ping_result().unwrap().result.is_ok());
        sim.set_ni_down(nid("10.0.0.2@tcp"), true);
        put(&mut sim, "a", "10.0.0.2@tcp", 9, false);
        sim.run_for(Duration::from_secs(1)).unwrap();
        let at = sim.node("a").stats().send_count;
        sim.run_for(Duration::from_secs(60)).unwrap();
        sim.node("a").stats().send_count - at
    };
    let forever = run(None);
    let limited = run(Some(3));
    // Forever: pings at +1, +2, +4, +8, +16, +32 s. Limited to 3 s after
    // b was last seen: one or two more, then none.
    assert!(forever >= 4, "{forever} recovery pings without a limit");
    assert!(limited <= 2, "{limited} recovery pings with a 3 s limit");
}

#[test]
fn router_check_interval_is_settable() {
    let topo = Topology::parse(
        "seed 8\n\
         node client 10.0.0.1@tcp\n\
         node router 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
         route client o2ib1 10.0.0.3@tcp hops 1\n\
         latency tcp 50us\n",
    )
    .unwrap();
    let mut sim = Sim::new(topo).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let served = |sim: &Sim| sim.node("router").stats().ping_served;
    let first = served(&sim);
    assert_eq!(first, 1, "one router ping at once");
    sim.run_for(Duration::from_secs(50)).unwrap();
    assert_eq!(served(&sim), first, "the next one after 60 s");
    sim.with_node("client", |n, now| {
        n.set_router_check_interval(now, Duration::from_secs(5));
    });
    sim.run_for(Duration::from_secs(21)).unwrap();
    assert!(served(&sim) >= first + 4, "{} pings", served(&sim));
    sim.with_node("client", |n, now| {
        n.set_router_check_interval(now, Duration::ZERO);
    });
    let stopped = served(&sim);
    sim.run_for(Duration::from_secs(120)).unwrap();
    assert_eq!(served(&sim), stopped, "0 stops the checker");
}

#[test]
fn max_interfaces_bounds_what_is_taken_from_a_peer() {
    let many: Vec<String> = (1..=17).map(|i| format!("10.0.1.{i}@tcp")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let topo = Topology::new(9)
        .node("a", &["10.0.0.1@tcp"])
        .node("big", &many)
        .configure("a", |c| {
            c.discovery = false;
            c.max_interfaces = 16;
        })
        .latency("tcp", Duration::from_micros(20));
    let mut sim = Sim::new(topo).unwrap();
    let big = nid("10.0.1.1@tcp");
    sim.with_node("a", |n, now| n.ping(now, big)).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let r = sim.node_mut("a").poll_ping_result().unwrap();
    // 17 NIs and 0@lo: 18 entries.
    assert!(r.result.is_err(), "18 entries > 16: {r:?}");
    sim.node_mut("a").set_max_interfaces(17).unwrap();
    sim.with_node("a", |n, now| n.ping(now, big)).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(
        sim.node_mut("a")
            .poll_ping_result()
            .unwrap()
            .result
            .is_err()
    );
    sim.node_mut("a").set_max_interfaces(18).unwrap();
    sim.with_node("a", |n, now| n.ping(now, big)).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let r = sim.node_mut("a").poll_ping_result().unwrap();
    assert_eq!(r.result.unwrap().nis.len(), 17);
    assert!(sim.node_mut("a").set_max_interfaces(15).is_err());

    // A node's own NIs (0@lo included) stay within it too.
    let n = sim.node_mut("a");
    n.set_max_interfaces(16).unwrap();
    for i in 2..=15 {
        let nid = nid(&format!("10.0.2.{i}@tcp"));
        n.add_ni(Time::ZERO, colibri_lnet::node::NiConfig::new(nid))
            .unwrap();
    }
    let e = n
        .add_ni(
            Time::ZERO,
            colibri_lnet::node::NiConfig::new(nid("10.0.2.99@tcp")),
        )
        .unwrap_err();
    assert!(
        matches!(e, colibri_lnet::node::NodeError::TooManyNis(17)),
        "{e}"
    );
}

#[test]
fn messages_waiting_for_discovery_are_alive() {
    // Discovery on: the PUT waits for the peer's discovery (its ping).
    let topo = Topology::new(12)
        .node("a", &["10.0.0.1@tcp"])
        .node("b", &["10.0.0.2@tcp"])
        .latency("tcp", Duration::from_millis(10));
    let mut sim = Sim::new(topo).unwrap();
    put(&mut sim, "a", "10.0.0.2@tcp", 4, false);
    // The parked PUT.
    assert_eq!(sim.node("a").stats().msgs_alloc, 1);
    // The parked PUT and the discovery ping on the wire.
    sim.run_for(Duration::from_millis(1)).unwrap();
    let s = sim.node("a").stats();
    assert_eq!(s.msgs_alloc, 2, "{s:?}");
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(sim.node("a").stats().msgs_alloc, 0);
    assert!(sim.node("a").stats().msgs_max >= 2);
}

#[test]
fn counters_by_type_and_messages_alive() {
    let mut sim = pair(10, 10);
    let inbox = sim.register_mem("b", vec![0; 16]);
    post_any(&mut sim, "b", 4, MdSpec::new(inbox, MdOptions::OP_PUT));
    for _ in 0..3 {
        put(&mut sim, "a", "10.0.0.2@tcp", 4, true);
    }
    get(&mut sim, "a", "10.0.0.2@tcp", 9);
    assert_eq!(sim.node("a").stats().msgs_alloc, 4, "4 messages alive");
    sim.run_for(Duration::from_secs(1)).unwrap();
    let s = sim.node("a").stats();
    assert_eq!(s.msgs_alloc, 0);
    assert!(s.msgs_max >= 4, "{}", s.msgs_max);
    let a = nid("10.0.0.1@tcp");
    let b = nid("10.0.0.2@tcp");
    let ni = sim.node("a").ni_info(a).unwrap();
    assert_eq!((ni.sent.put, ni.sent.get, ni.received.ack), (3, 1, 3));
    let p = sim.node("a").peer_ni_stats(b).unwrap();
    assert_eq!((p.sent.put, p.sent.get, p.received.ack), (3, 1, 3));
    let bs = sim.node("b").peer_ni_stats(a).unwrap();
    assert_eq!((bs.received.put, bs.received.get, bs.sent.ack), (3, 1, 3));
    // The GET found nothing at b: dropped, as a GET.
    assert_eq!((bs.drop_count, bs.dropped.get), (1, 1));
    assert_eq!(sim.node("b").stats().drop_count, 1);
    sim.node_mut("a").reset_stats();
    let s = sim.node("a").stats();
    assert_eq!((s.msgs_max, s.send_count), (0, 0));
    assert_eq!(sim.node("a").ni_info(a).unwrap().sent.total(), 0);
}

#[test]
fn unlinking_a_tracked_put_waiting_for_its_ack_drops_its_tracker() {
    let mut sim = pair(13, 10);
    let p = put(&mut sim, "a", "10.0.0.2@tcp", 9, true);
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(sim.node("a").stats().rst_alloc, 1);
    sim.with_node("a", |n, now| n.md_unlink(now, p)).unwrap();
    assert_eq!(sim.node("a").stats().rst_alloc, 0);
    sim.run_for(Duration::from_secs(20)).unwrap();
    assert_eq!(sim.node("a").stats().response_timeout_count, 0);
}

#[test]
fn a_ping_given_up_on_leaves_nothing_behind() {
    use colibri_lnet::fault::{DropRuleSpec, FaultMatch, MsgMask, Trigger};
    use colibri_lnet::wire::MsgType;
    let mut sim = pair(14, 10);
    // b drops every GET: pings are never answered.
    sim.with_node("b", |n, now| {
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
    let b = nid("10.0.0.2@tcp");
    sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
    sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(sim.node("a").stats().rst_alloc, 2);
    // The first is given up on: gone at once, no result, no timeout later.
    assert!(sim.with_node("a", |n, now| n.abandon_ping(now, b)));
    assert_eq!(sim.node("a").stats().rst_alloc, 1);
    sim.run_for(Duration::from_secs(20)).unwrap();
    let s = sim.node("a").stats();
    assert_eq!(s.response_timeout_count, 1, "only the other ping timed out");
    let r = sim.node_mut("a").poll_ping_result().unwrap();
    assert!(r.result.is_err());
    assert!(sim.node_mut("a").poll_ping_result().is_none());
    assert!(!sim.with_node("a", |n, now| n.abandon_ping(now, b)));
    assert_eq!(s.rst_alloc, 0);
}

/// Seed 004: "if the deadline is reached while the message is queued ...
/// the transmit expires and the message is finalized" (Lustre's
/// `lnet_check_message_drop`, sanity-lnet test 253). One peer credit; a
/// delay rule holds the first GET (and its credit) past the transaction
/// timeout; the second GET, queued for that credit, is dropped when the
/// credit comes back instead of being sent: its SEND fails `TimedOut`,
/// and it counts as one dropped GET for the peer NI, the NI and the node.
/// The delayed GET itself goes out (released delayed messages skip the
/// check, as Lustre's do); routers forward whatever the time.
#[test]
fn a_message_queued_for_credits_past_its_deadline_is_dropped() {
    use colibri_lnet::fault::{DelayRuleSpec, FaultMatch, MsgMask, Trigger};
    use colibri_lnet::wire::MsgType;
    let b_nid = "10.0.0.2@tcp";
    let topo = Topology::new(11)
        .node("a", &["10.0.0.1@tcp"])
        .node("b", &[b_nid])
        .configure("a", |c| {
            c.discovery = false;
            c.retry_count = 0;
            c.transaction_timeout = Duration::from_secs(10);
            c.nis[0].peer_credits = 1;
        })
        .configure("b", |c| c.discovery = false)
        .latency("tcp", Duration::from_micros(20));
    let mut sim = Sim::new(topo).unwrap();
    let served = sim.register_mem("b", vec![7; 8]);
    post_any(&mut sim, "b", 5, MdSpec::new(served, MdOptions::OP_GET));
    sim.with_node("a", |n, now| {
        n.add_delay_rule(
            now,
            DelayRuleSpec {
                matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Get)),
                trigger: Trigger::Rate(1),
                latency: Duration::from_secs(11),
            },
        )
    })
    .unwrap();
    let first = get(&mut sim, "a", b_nid, 5);
    let second = get(&mut sim, "a", b_nid, 5);
    sim.run_for(Duration::from_secs(20)).unwrap();
    let evs = sim.take_events("a");
    let send_of = |md: MdHandle| {
        evs.iter()
            .find(|(_, e)| e.md == md && e.kind() == EventKind::Send)
            .map(|(_, e)| e.status())
    };
    assert_eq!(send_of(second), Some(Err(OpError::TimedOut)), "{evs:#?}");
    // The first's MD was unlinked by its REPLY's deadline before the delay
    // rule let it go: its SEND reports that, whatever its status.
    assert!(send_of(first).is_some(), "{evs:#?}");
    let p = sim.node("a").peer_ni_stats(nid(b_nid)).unwrap();
    assert_eq!(p.dropped.get, 1, "{p:?}");
    assert_eq!(p.sent.get, 1, "only the delayed GET left: {p:?}");
    let ni = sim.node("a").ni_info(nid("10.0.0.1@tcp")).unwrap();
    assert_eq!(ni.dropped.get, 1);
    // Every MD completed once: the second at its SEND, the first at its
    // REPLY's deadline (the REPLY comes after it).
    for md in [first, second] {
        let finals = evs.iter().filter(|(_, e)| e.md == md && e.unlinked).count();
        assert_eq!(finals, 1, "{md:?}: {evs:#?}");
    }
}
