//! Routed scenarios (seed 004): PUT+ACK and GET+REPLY through a gateway.

mod common;
use common::{nid, post_any};

use std::time::Duration;

use colibri_lnet::ids::{Net, ProcessId};
use colibri_lnet::matching::{
    EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, Threshold, Unlink,
};
use colibri_lnet::node::NodeConfig;
use colibri_lnet::sim::{Sim, Topology};

fn net(s: &str) -> Net {
    s.parse().unwrap()
}

/// client (tcp) — router (tcp, o2ib1) — server (o2ib1), routes both ways.
fn routed(seed: u64) -> Sim {
    let topo = Topology::parse(&format!(
        "seed {seed}\n\
         node client 10.0.0.1@tcp\n\
         node router 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
         node server 192.168.1.2@o2ib1\n\
         route client o2ib1 10.0.0.3@tcp hops 1\n\
         route server tcp 192.168.1.3@o2ib1 hops 1 priority 0\n\
         latency tcp 50us\n\
         latency o2ib1 5us\n"
    ))
    .unwrap();
    let sim = Sim::new(topo).unwrap();
    assert_eq!(sim.node("client").routes_to(net("o2ib1")).len(), 1);
    sim
}

fn post(sim: &mut Sim, name: &str, portal: u32, spec: MdSpec) -> MdHandle {
    sim.with_node(name, |n, now| {
        let me = n
            .me_attach(MeSpec {
                portal,
                match_id: ProcessId::ANY,
                match_bits: 0,
                ignore_bits: 0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })
            .unwrap();
        n.md_attach(now, me, spec).unwrap()
    })
}

#[test]
fn put_and_get_cross_a_router() {
    let mut sim = routed(1);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let inbox_mem = sim.register_mem("server", vec![0; 32]);
    let inbox = post(
        &mut sim,
        "server",
        4,
        MdSpec::new(inbox_mem, MdOptions::OP_PUT),
    );
    let served = sim.register_mem("server", b"server data".to_vec());
    post(
        &mut sim,
        "server",
        5,
        MdSpec::new(served, MdOptions::OP_GET),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    let data = sim.register_mem("client", b"ping!".to_vec());
    let src = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    sim.with_node("client", |n, now| n.put(now, src, true, server, 4, 0, 0, 0))
        .unwrap();
    let sink_mem = sim.register_mem("client", vec![0; 11]);
    let sink = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(sink_mem, MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    sim.with_node("client", |n, now| n.get(now, sink, server, 5, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(5)).unwrap();
    assert_eq!(&sim.mem("server", inbox_mem.key)[..5], b"ping!");
    let kinds: Vec<EventKind> = sim.events("client").iter().map(|(_, e)| e.kind()).collect();
    assert!(kinds.contains(&EventKind::Ack), "{kinds:?}");
    assert!(kinds.contains(&EventKind::Reply), "{kinds:?}");
    assert_eq!(sim.mem("client", sink_mem.key), b"server data");
    assert!(sim.node("router").stats().route_count >= 4);
    // The server saw the client's NID as the source, not the router's.
    let put = sim
        .events("server")
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Put)
        .unwrap();
    assert_eq!(put.1.md, inbox);
    assert_eq!(put.1.info.initiator.nid, nid("10.0.0.1@tcp"));
    assert_eq!(put.1.info.sender, nid("192.168.1.3@o2ib1"));
}

/// The router has one router credit per peer and one buffer per pool: a
/// burst of PUTs (small pool) and GETs (tiny pool) from the client queues at
/// the router and at the client's credit queues, strictly FIFO, and
/// everything is delivered, in order.
#[test]
fn router_credits_exhausted_messages_queue_in_order_and_are_delivered() {
    use colibri_lnet::credits::{PoolKind, RouterBufferConfig};

    let topo = Topology::parse(
        "seed 9\n\
         node client 10.0.0.1@tcp\n\
         node router 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
         node server 192.168.1.2@o2ib1\n\
         latency tcp 50us\n\
         latency o2ib1 20us\n",
    )
    .unwrap()
    .configure("router", |c| {
        for ni in &mut c.nis {
            ni.peer_credits = 1;
        }
        c.router_buffers = RouterBufferConfig {
            tiny: 1,
            small: 1,
            large: 1,
        };
    })
    .configure("client", |c| c.nis[0].peer_credits = 2);
    let mut sim = Sim::new(topo).unwrap();
    sim.with_node("client", |n, now| {
        n.add_route(now, net("o2ib1"), nid("10.0.0.3@tcp"), Some(1), 0)
    })
    .unwrap();
    sim.with_node("server", |n, now| {
        n.add_route(now, net("tcp"), nid("192.168.1.3@o2ib1"), Some(1), 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    // The server accepts PUTs on portal 4 (any bits) and serves GETs on 5.
    let inbox_mem = sim.register_mem("server", vec![0; 4096]);
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(
            inbox_mem,
            MdOptions::OP_PUT | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE,
        ),
    );
    let served = sim.register_mem("server", vec![0xab; 64]);
    post_any(
        &mut sim,
        "server",
        5,
        MdSpec::new(served, MdOptions::OP_GET | MdOptions::MANAGE_REMOTE),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    // Discover the server first (one PUT), then the burst at a single instant.
    let data = sim.register_mem("client", vec![0; 100]);
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    sim.with_node("client", |n, now| {
        n.put(now, md, true, server, 4, 1000, 0, 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let mut sinks = Vec::new();
    for i in 0..10u64 {
        let data = sim.register_mem("client", vec![i as u8; 100]);
        let md = sim
            .with_node("client", |n, _| {
                n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)))
            })
            .unwrap();
        sim.with_node("client", |n, now| n.put(now, md, true, server, 4, i, 0, 0))
            .unwrap();
        let sink_mem = sim.register_mem("client", vec![0; 8]);
        let sink = sim
            .with_node("client", |n, _| {
                n.md_bind(MdSpec::new(sink_mem, MdOptions::empty()).threshold(Threshold::Count(2)))
            })
            .unwrap();
        sim.with_node("client", |n, now| n.get(now, sink, server, 5, i, 0))
            .unwrap();
        sinks.push(sink_mem);
    }
    sim.run_for(Duration::from_secs(5)).unwrap();

    // Everything arrived, in the order it was sent.
    let puts: Vec<u64> = sim
        .events("server")
        .iter()
        .filter(|(_, e)| e.kind() == EventKind::Put && e.info.match_bits < 1000)
        .map(|(_, e)| e.info.match_bits)
        .collect();
    assert_eq!(puts, (0..10).collect::<Vec<_>>());
    let gets: Vec<u64> = sim
        .events("server")
        .iter()
        .filter(|(_, e)| e.kind() == EventKind::Get)
        .map(|(_, e)| e.info.match_bits)
        .collect();
    assert_eq!(gets, (0..10).collect::<Vec<_>>());
    let client = sim.events("client");
    assert_eq!(
        client
            .iter()
            .filter(|(_, e)| e.kind() == EventKind::Ack && e.status().is_ok())
            .count(),
        11
    );
    assert_eq!(
        client
            .iter()
            .filter(|(_, e)| e.kind() == EventKind::Reply && e.status().is_ok())
            .count(),
        10
    );
    for sink in sinks {
        assert_eq!(sim.mem("client", sink.key), &[0xab; 8]);
    }

    // Messages that found no router credit or buffer were parked with their
    // payload left in the client's connection (no copy), and everything was
    // let go: no connection stalled, no router buffer held, nothing pending.
    assert!(sim.stall_count("router") > 0);
    assert_eq!(sim.stalled("router"), 0);
    assert_eq!(sim.rx_buffers("router"), 0);
    assert_eq!(sim.node("router").rx_pending(), 0);
    // Forwarded payloads (11 PUTs of 100 bytes, 10 REPLYs of 8, and the
    // discovery traffic between client and server) crossed the router once
    // each way, as a socket read into a router buffer and a socket write
    // from it. The only bytes the router node itself touched are those of
    // its own pings (inline), exactly what its driver counted as inline.
    let rc = sim.copies("router");
    let forwarded_in = rc.socket_read_bytes - rc.inline_read_bytes;
    let forwarded_out = rc.socket_write_bytes - rc.inline_write_bytes;
    assert_eq!(forwarded_in, forwarded_out);
    assert!(forwarded_in >= 11 * 100 + 10 * 8, "{rc:?}");
    assert_eq!(
        sim.node("router").stats().payload_bytes_copied,
        rc.inline_read_bytes + rc.inline_write_bytes
    );
    assert_eq!(rc.loopback_copy_bytes, 0);

    // The queues were used: negative minimum credits, and all returned.
    let router = sim.node("router");
    let rc = router.router_credits();
    let from_client = rc.peer(nid("10.0.0.1@tcp")).unwrap();
    assert!(
        from_client.min_credits() < 0,
        "router credits min {}",
        from_client.min_credits()
    );
    assert_eq!(from_client.credits(), 1);
    assert!(rc.pool(PoolKind::Small).min_credits() < 0);
    assert!(rc.pool(PoolKind::Tiny).min_credits() < 0);
    assert_eq!(rc.pool(PoolKind::Small).credits(), 1);
    let tx = sim.node("client").tx_credits();
    let to_router = tx.peer_ni(nid("10.0.0.3@tcp")).unwrap();
    assert!(to_router.min_credits() < 0);
    assert_eq!(to_router.credits(), 2);
}

/// Seed 001: in a routed configuration the LND only tells the sender that
/// the router got the message; a bare PUT the router fails to forward is
/// lost without trace.
#[test]
fn routed_bare_put_lost_beyond_the_router_is_invisible() {
    use colibri_lnet::fault::{DropRuleSpec, FaultMatch, HealthError, MsgMask, Trigger};
    use colibri_lnet::wire::MsgType;

    let mut sim = routed(11);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let inbox_mem = sim.register_mem("server", vec![0; 32]);
    post(
        &mut sim,
        "server",
        4,
        MdSpec::new(inbox_mem, MdOptions::OP_PUT),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    // Discover the server first.
    let data = sim.register_mem("client", vec![1; 4]);
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()))
        })
        .unwrap();
    sim.with_node("client", |n, now| n.put(now, md, false, server, 4, 0, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(sim.events("server").len(), 1);
    // The router's o2ib1 side now fails every PUT it sends.
    sim.with_node("router", |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
                trigger: Trigger::Rate(1),
                health_mask: HealthError::RemoteError.bit(),
            },
        )
    })
    .unwrap();
    sim.take_events("client");
    sim.with_node("client", |n, now| n.put(now, md, false, server, 4, 0, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(200)).unwrap();
    let evs = sim.take_events("client");
    assert_eq!(evs.len(), 1);
    assert_eq!(
        (evs[0].1.kind(), evs[0].1.status()),
        (EventKind::Send, Ok(()))
    );
    assert_eq!(
        sim.events("server").len(),
        1,
        "the second PUT never arrived"
    );
    assert_eq!(sim.node("router").stats().send_failures, 1);
}

/// A router forwards a PUT naming a portal beyond the table without looking
/// at it; the target drops it at matching (no protocol error anywhere).
#[test]
fn router_forwards_a_portal_beyond_the_table_and_the_target_drops_it() {
    use colibri_lnet::wire::{Body, Header, WireHandle};

    let mut sim = routed(12);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let routed_before = sim.node("router").stats().route_count;
    let dropped_before = sim.node("server").stats().drop_count;
    let (router_before, server_before) = (sim.copies("router"), sim.copies("server"));
    let router_core_before = sim.node("router").stats().payload_bytes_copied;
    let h = Header {
        dest_nid: nid("192.168.1.2@o2ib1"),
        src_nid: nid("10.0.0.1@tcp"),
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: 4,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 0,
            hdr_data: 0,
            ptl_index: 70,
            offset: 0,
        },
    };
    // As if the client's LND had sent it to the router (the client's own
    // API refuses such a portal).
    sim.inject(
        nid("10.0.0.1@tcp"),
        nid("10.0.0.3@tcp"),
        h.encode(),
        b"data".to_vec(),
    );
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(sim.node("router").stats().route_count, routed_before + 1);
    assert_eq!(sim.node("server").stats().drop_count, dropped_before + 1);
    assert_eq!(sim.node("server").stats().protocol_errors, 0);
    assert!(sim.receive_errors().is_empty());
    assert!(sim.events("server").is_empty());
    // The router read the payload into a buffer and sent it from there; the
    // server skipped it.
    let rc = sim.copies("router");
    assert_eq!(
        (
            rc.socket_read_bytes - router_before.socket_read_bytes,
            rc.socket_write_bytes - router_before.socket_write_bytes
        ),
        (4, 4)
    );
    assert_eq!(
        sim.node("router").stats().payload_bytes_copied,
        router_core_before
    );
    assert_eq!(
        sim.copies("server").discarded_bytes - server_before.discarded_bytes,
        4
    );
    assert_eq!(sim.rx_buffers("router"), 0);
}

/// Lustre's sanity-lnet tests 105 and 106: a router's peer is neither
/// re-created nor deleted by DLC (`-EBUSY`); once no route names it, it is
/// an ordinary peer again.
#[test]
fn dlc_leaves_a_routers_peer_alone() {
    use colibri_lnet::node::NodeError;
    use colibri_lnet::peer::PeerError;
    let mut sim = routed(7);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let gw = nid("10.0.0.3@tcp");
    let is_gateway = |r: Result<(), NodeError>| matches!(r, Err(NodeError::Peer(PeerError::Gateway { gateway, .. })) if gateway == gw);
    let r = sim.with_node("client", |n, now| n.dlc_add_peer(now, gw, &[], true));
    assert!(is_gateway(r), "peer add of a gateway");
    let r = sim.with_node("client", |n, now| n.dlc_del_peer(now, gw, &[]));
    assert!(is_gateway(r), "peer del of a gateway");
    // Traffic still crosses the router.
    let inbox_mem = sim.register_mem("server", vec![0; 8]);
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(inbox_mem, MdOptions::OP_PUT | MdOptions::TRUNCATE),
    );
    let data = sim.register_mem("client", b"ping!".to_vec());
    let src = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()))
        })
        .unwrap();
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    sim.with_node("client", |n, now| {
        n.put(now, src, false, server, 4, 0, 0, 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(&sim.mem("server", inbox_mem.key)[..5], b"ping!");
    // Without the route, DLC may take the peer.
    sim.with_node("client", |n, _| n.del_route(net("o2ib1"), gw))
        .unwrap();
    sim.with_node("client", |n, now| n.dlc_add_peer(now, gw, &[], true))
        .unwrap();
    assert!(
        sim.node("client")
            .discovery()
            .peers()
            .peer_of(gw)
            .unwrap()
            .is_configured()
    );
    sim.with_node("client", |n, now| n.dlc_del_peer(now, gw, &[]))
        .unwrap();
}

/// A UDSP router rule (`udsp add --dst o2ib1 --rte 10.0.0.4@tcp`): the
/// client's messages for the remote net go through that router while it
/// lives, and through the other when it is taken out of the rule.
#[test]
fn a_router_rule_picks_the_gateway() {
    use colibri_lnet::udsp::Rule;
    let topo = Topology::parse(
        "seed 9\n\
         node client 10.0.0.1@tcp\n\
         node r1 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
         node r2 10.0.0.4@tcp 192.168.1.4@o2ib1 routing\n\
         node server 192.168.1.2@o2ib1\n\
         route client o2ib1 10.0.0.3@tcp hops 1\n\
         route client o2ib1 10.0.0.4@tcp hops 1\n\
         route server tcp 192.168.1.3@o2ib1 hops 1\n\
         route server tcp 192.168.1.4@o2ib1 hops 1\n\
         latency tcp 10us\n\
         latency o2ib1 5us\n",
    )
    .unwrap();
    let mut sim = Sim::new(topo).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let inbox = sim.register_mem("server", vec![0; 64]);
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(
            inbox,
            MdOptions::OP_PUT | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE,
        ),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    let routed_by = |sim: &mut Sim| -> (u64, u64) {
        let before = (
            sim.node("r1").stats().route_count,
            sim.node("r2").stats().route_count,
        );
        for i in 0..10u64 {
            let data = sim.register_mem("client", vec![1; 8]);
            let md = sim
                .with_node("client", |n, _| {
                    n.md_bind(MdSpec::new(data, MdOptions::empty()))
                })
                .unwrap();
            sim.with_node("client", |n, now| n.put(now, md, false, server, 4, i, 0, 0))
                .unwrap();
            sim.run_for(Duration::from_millis(2)).unwrap();
        }
        sim.run_for(Duration::from_millis(50)).unwrap();
        (
            sim.node("r1").stats().route_count - before.0,
            sim.node("r2").stats().route_count - before.1,
        )
    };
    let (r1, r2) = routed_by(&mut sim);
    assert!(r1 > 0 && r2 > 0, "both routers without a rule: {r1} {r2}");
    sim.with_node("client", |n, _| {
        n.udsp_add(
            Rule::parse(None, Some("o2ib1"), Some("10.0.0.4@tcp"), None).unwrap(),
            None,
        )
    })
    .unwrap();
    assert_eq!(routed_by(&mut sim), (0, 10));
    sim.with_node("client", |n, _| n.udsp_del(Some(0))).unwrap();
    sim.with_node("client", |n, _| {
        n.udsp_add(
            Rule::parse(None, Some("192.168.1.2@o2ib1"), Some("10.0.0.3@tcp"), None).unwrap(),
            None,
        )
    })
    .unwrap();
    assert_eq!(routed_by(&mut sim), (10, 0));
}

/// Sanity-lnet's router topology (tests 222-225) with its module
/// parameters (`alive_router_check_interval=5 router_ping_timeout=5`): a
/// client on tcp, a router, a peer on o2ib1, no route yet.
fn aliveness(seed: u64, avoid_asym: bool, discovery: bool) -> Sim {
    let mut topo = Topology::new(seed)
        .node("client", &["10.0.0.1@tcp"])
        .node("router", &["10.0.0.3@tcp", "192.168.1.3@o2ib1"])
        .node("rpeer", &["192.168.1.2@o2ib1"]);
    for name in ["client", "router", "rpeer"] {
        topo = topo.configure(name, |c| {
            c.router_check_interval = Duration::from_secs(5);
            c.router_ping_timeout = Duration::from_secs(5);
            c.avoid_asym_router_failure = avoid_asym;
            c.discovery = discovery;
            c.transaction_timeout = Duration::from_secs(10);
            c.routing = name == "router";
        });
    }
    Sim::new(topo).unwrap()
}

fn ni_status(sim: &Sim, node: &str, ni: &str) -> colibri_lnet::wire::NiStatus {
    sim.node(node).ni_info(nid(ni)).unwrap().status
}

fn route_alive(sim: &Sim, node: &str, to: &str) -> bool {
    sim.node(node).routes_to(net(to))[0].is_alive()
}

/// Whether `from` gets an answer to an LNet ping of `to`.
fn pings(sim: &mut Sim, from: &str, to: &str) -> bool {
    sim.with_node(from, |n, now| n.ping(now, nid(to))).unwrap();
    sim.run_for(Duration::from_secs(11)).unwrap();
    let r = sim.node_mut(from).poll_ping_result().unwrap();
    assert_eq!(r.nid, nid(to));
    r.result.is_ok()
}

/// Sanity-lnet 222-225 (`do_aarf_enabled_test`, `do_aarf_disabled_test`):
/// a router's NIs are down until something pings them and go down again
/// `router_ping_timeout + alive_router_check_interval` after the last
/// ping; with `avoid_asym_router_failure` a route is alive only while the
/// router's NIs on both of its nets are up.
fn router_nis_live_on_pings(avoid_asym: bool, discovery: bool) {
    let (client_gw, rpeer_gw) = ("10.0.0.3@tcp", "192.168.1.3@o2ib1");
    let mut sim = aliveness(22, avoid_asym, discovery);
    let up = colibri_lnet::wire::NiStatus::Up;
    let down = colibri_lnet::wire::NiStatus::Down;
    // Nobody pings the router: both NIs go down after 5 + 5 s.
    sim.run_for(Duration::from_secs(9)).unwrap();
    assert_eq!(ni_status(&sim, "router", client_gw), up);
    sim.run_for(Duration::from_secs(2)).unwrap();
    assert_eq!(
        (
            ni_status(&sim, "router", client_gw),
            ni_status(&sim, "router", rpeer_gw)
        ),
        (down, down)
    );
    // The client's route: its router pings wake the router's tcp NI.
    sim.with_node("client", |n, now| {
        n.add_route(now, net("o2ib1"), nid(client_gw), None, 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(6)).unwrap();
    assert_eq!(
        (
            ni_status(&sim, "router", client_gw),
            ni_status(&sim, "router", rpeer_gw)
        ),
        (up, down)
    );
    assert_eq!(route_alive(&sim, "client", "o2ib1"), !avoid_asym);
    if avoid_asym {
        assert!(!pings(&mut sim, "client", "192.168.1.2@o2ib1"));
    }
    // The symmetric route wakes the other NI, and the routes come up.
    sim.with_node("rpeer", |n, now| {
        n.add_route(now, net("tcp"), nid(rpeer_gw), None, 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(11)).unwrap();
    assert_eq!(
        (
            ni_status(&sim, "router", client_gw),
            ni_status(&sim, "router", rpeer_gw)
        ),
        (up, up)
    );
    assert!(route_alive(&sim, "client", "o2ib1"));
    assert!(route_alive(&sim, "rpeer", "tcp"));
    assert!(pings(&mut sim, "client", "192.168.1.2@o2ib1"));
    assert!(pings(&mut sim, "rpeer", "10.0.0.1@tcp"));
    // The client goes (its route and NI with it): the router's tcp NI goes
    // down once the silence lasts, and the peer's route with it when
    // asymmetric failures are avoided.
    sim.with_node("client", |n, _| n.del_route(net("o2ib1"), nid(client_gw)))
        .unwrap();
    sim.with_node("client", |n, now| n.del_ni(now, nid("10.0.0.1@tcp")))
        .unwrap();
    sim.run_for(Duration::from_secs(21)).unwrap();
    assert_eq!(
        (
            ni_status(&sim, "router", client_gw),
            ni_status(&sim, "router", rpeer_gw)
        ),
        (down, up)
    );
    assert_eq!(route_alive(&sim, "rpeer", "tcp"), !avoid_asym);
}

#[test]
fn router_nis_live_on_pings_with_avoid_asym_router_failure() {
    router_nis_live_on_pings(true, true);
}

#[test]
fn router_nis_live_on_pings_with_avoid_asym_router_failure_discovery_off() {
    router_nis_live_on_pings(true, false);
}

#[test]
fn router_nis_live_on_pings_without_avoid_asym_router_failure() {
    router_nis_live_on_pings(false, true);
}

#[test]
fn router_nis_live_on_pings_without_avoid_asym_router_failure_discovery_off() {
    router_nis_live_on_pings(false, false);
}

/// Peer aliveness on a router (Lustre's `lnet_check_message_drop`, sanity-lnet
/// 227): once the router's LND reports the server's NI dead, what the router
/// would forward to it is dropped and counted for that peer NI, until a
/// message from the server says it is back; a net whose `peer_timeout` is 0
/// has no aliveness and forwards anyway.
#[test]
fn a_router_drops_what_it_would_forward_to_a_dead_peer() {
    let server_nid = nid("192.168.1.2@o2ib1");
    let router_far = nid("192.168.1.3@o2ib1");
    let mut sim = routed(12);
    sim.run_for(Duration::from_secs(1)).unwrap();
    let inbox_mem = sim.register_mem("server", vec![0; 64]);
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(inbox_mem, MdOptions::OP_PUT | MdOptions::TRUNCATE),
    );
    let server = ProcessId::lustre(server_nid);
    let mut offset = 0;
    // One PUT without an ACK from the client; whether it reached the
    // server's buffer.
    let mut put = |sim: &mut Sim| -> bool {
        offset += 1;
        let data = sim.register_mem("client", vec![7; 1]);
        let src = sim
            .with_node("client", |n, _| {
                n.md_bind(MdSpec::new(data, MdOptions::empty()))
            })
            .unwrap();
        let before = sim
            .mem("server", inbox_mem.key)
            .iter()
            .filter(|&&b| b == 7)
            .count();
        sim.with_node("client", |n, now| {
            n.put(now, src, false, server, 4, 0, offset, 0)
        })
        .unwrap();
        sim.run_for(Duration::from_secs(1)).unwrap();
        sim.mem("server", inbox_mem.key)
            .iter()
            .filter(|&&b| b == 7)
            .count()
            > before
    };
    assert!(put(&mut sim));
    let dropped = |sim: &Sim| {
        sim.node("router")
            .peer_ni_stats(server_nid)
            .map_or(0, |s| s.dropped.put)
    };
    // The server's interface dies, and the router's LND says so.
    sim.set_ni_down(server_nid, true);
    sim.with_node("router", |n, now| {
        n.notify(now, router_far, server_nid, false)
    });
    assert!(sim.node("router").peer_ni_down(server_nid));
    let sent_before = sim
        .node("router")
        .peer_ni_stats(server_nid)
        .map_or(0, |s| s.sent.put);
    assert!(!put(&mut sim), "forwarded to a dead peer");
    assert!(!put(&mut sim), "forwarded to a dead peer");
    assert_eq!(dropped(&sim), 2);
    assert_eq!(
        sim.node("router")
            .peer_ni_stats(server_nid)
            .map_or(0, |s| s.sent.put),
        sent_before,
        "nothing was sent to the dead peer"
    );
    assert!(sim.node("router").peer_ni_down(server_nid));
    // The server comes back and pings the router: it is up again.
    sim.set_ni_down(server_nid, false);
    sim.with_node("server", |n, now| n.ping(now, router_far))
        .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(!sim.node("router").peer_ni_down(server_nid));
    assert!(put(&mut sim));
    // Notices of another net's NID or of the router's own are ignored.
    sim.with_node("router", |n, now| {
        n.notify(now, router_far, nid("10.0.0.1@tcp"), false);
        n.notify(now, router_far, router_far, false);
    });
    assert!(!sim.node("router").peer_ni_down(nid("10.0.0.1@tcp")));
    // Without peer aliveness on that net, the router forwards anyway.
    let mut topo_sim = {
        let topo = Topology::parse(
            "seed 13\n\
             node client 10.0.0.1@tcp\n\
             node router 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\n\
             node server 192.168.1.2@o2ib1\n\
             route client o2ib1 10.0.0.3@tcp hops 1\n\
             route server tcp 192.168.1.3@o2ib1 hops 1\n",
        )
        .unwrap()
        .configure("router", |c| {
            for ni in &mut c.nis {
                ni.peer_timeout = 0;
            }
        });
        Sim::new(topo).unwrap()
    };
    topo_sim.run_for(Duration::from_secs(1)).unwrap();
    let inbox = topo_sim.register_mem("server", vec![0; 8]);
    post_any(
        &mut topo_sim,
        "server",
        4,
        MdSpec::new(inbox, MdOptions::OP_PUT | MdOptions::TRUNCATE),
    );
    topo_sim.with_node("router", |n, now| {
        n.notify(now, router_far, server_nid, false)
    });
    let data = topo_sim.register_mem("client", vec![9; 1]);
    let src = topo_sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()))
        })
        .unwrap();
    topo_sim
        .with_node("client", |n, now| {
            n.put(now, src, false, server, 4, 0, 0, 0)
        })
        .unwrap();
    topo_sim.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(topo_sim.mem("server", inbox.key)[0], 9);
}

/// A client (NIs `client`) on tcp and a server on o2ib1, routed both ways
/// through two routers, r0 and r1 (routing on); `tune` applies to every
/// node's configuration.
fn two_routers(seed: u64, client: &[&str], tune: impl Fn(&mut NodeConfig)) -> Topology {
    let mut topo = Topology::new(seed)
        .node("client", client)
        .node("r0", &["10.0.0.3@tcp", "192.168.1.3@o2ib1"])
        .node("r1", &["10.0.0.4@tcp", "192.168.1.4@o2ib1"])
        .node("server", &["192.168.1.2@o2ib1"])
        .route("client", "o2ib1", "10.0.0.3@tcp", None, 0)
        .route("client", "o2ib1", "10.0.0.4@tcp", None, 0)
        .route("server", "tcp", "192.168.1.3@o2ib1", None, 0)
        .route("server", "tcp", "192.168.1.4@o2ib1", None, 0);
    for name in ["client", "r0", "r1", "server"] {
        topo = topo.configure(name, |c| {
            c.routing = name.starts_with('r');
            tune(c);
        });
    }
    topo
}

/// Sanity-lnet 257 ("Test graceful router shutdown/startup"): while a
/// client streams PUTs to a server through two routers, one router's
/// routing is switched off and later on again; it advertises the stop at
/// once and forwards what still comes for the interval, and forwards before
/// it advertises a start, so no message is dropped and every PUT is
/// acknowledged (a router that stopped at once dropped the PUTs that came
/// before the client's next router ping).
#[test]
fn a_router_stops_and_starts_routing_without_dropping() {
    let topo = two_routers(257, &["10.0.0.1@tcp"], |c| {
        c.router_check_interval = Duration::from_secs(1);
        c.router_ping_timeout = Duration::from_secs(1);
        // No pushes: the client learns of the change from its router
        // pings only, as with discovery off in Lustre.
        c.discovery = false;
    });
    let mut sim = Sim::new(topo.default_latency(Duration::from_millis(50))).unwrap();
    sim.run_for(Duration::from_secs(3)).unwrap();
    let inbox = sim.register_mem("server", vec![0; 8]);
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(inbox, MdOptions::OP_PUT | MdOptions::TRUNCATE),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    // A PUT every 20 ms for `secs` seconds; the count of ACKs that came.
    let stream = |sim: &mut Sim, secs: u64| {
        let data = sim.register_mem("client", vec![1; 8]);
        let mut acks = 0;
        for _ in 0..secs * 50 {
            let md = sim
                .with_node("client", |n, _| {
                    n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)))
                })
                .unwrap();
            sim.with_node("client", |n, now| n.put(now, md, true, server, 4, 0, 0, 0))
                .unwrap();
            sim.run_for(Duration::from_millis(20)).unwrap();
        }
        sim.run_for(Duration::from_secs(1)).unwrap();
        for (_, e) in sim.take_events("client") {
            if e.kind() == EventKind::Ack {
                assert_eq!(e.status(), Ok(()), "{e:?}");
                acks += 1;
            }
        }
        acks
    };
    assert_eq!(stream(&mut sim, 1), 50);
    let through = |sim: &Sim| sim.node("r0").stats().route_count;
    assert!(through(&sim) > 0, "both routers carry the stream");
    sim.with_node("r0", |n, now| n.set_routing(now, false))
        .unwrap();
    assert_eq!(
        sim.node("r0").routing_state(),
        colibri_lnet::node::RoutingState::Stopping
    );
    assert_eq!(stream(&mut sim, 5), 250);
    assert_eq!(
        sim.node("r0").routing_state(),
        colibri_lnet::node::RoutingState::Disabled
    );
    let after_stop = through(&sim);
    assert_eq!(stream(&mut sim, 1), 50);
    assert_eq!(
        through(&sim),
        after_stop,
        "nothing through a stopped router"
    );
    sim.with_node("r0", |n, now| n.set_routing(now, true))
        .unwrap();
    assert_eq!(stream(&mut sim, 5), 250);
    assert_eq!(
        sim.node("r0").routing_state(),
        colibri_lnet::node::RoutingState::Enabled
    );
    assert!(through(&sim) > after_stop, "r0 routes again");
    for r in ["r0", "r1"] {
        assert_eq!(sim.node(r).stats().drop_count, 0, "{r} dropped");
    }
}

/// Lustre's `lnet_notify` for a gateway: where discovery is off (here or
/// on the gateway), an LND's death notice on the gateway's NID takes the
/// routes through that NID down at once, so the next message goes by the
/// other router instead of waiting for the router checker; the gateway's
/// next router ping brings them back. With discovery on both sides the
/// notice leaves the routes to the router checker; and a notice that a
/// sick NI of ours saw, while a healthier one on the net can still reach
/// the gateway, changes nothing (`lnet_local_ni_superseded`).
#[test]
fn a_gateway_death_notice_takes_its_routes_down_with_discovery_off() {
    let fabric = |discovery: bool| {
        let topo = two_routers(31, &["10.0.0.1@tcp", "10.0.0.2@tcp"], |c| {
            c.router_check_interval = Duration::from_secs(60);
            c.discovery = discovery;
        });
        let mut sim = Sim::new(topo).unwrap();
        // Routers pinged, peers discovered.
        sim.run_for(Duration::from_secs(2)).unwrap();
        assert!(pings(&mut sim, "client", "192.168.1.2@o2ib1"));
        sim
    };
    let alive = |sim: &Sim, gw: &str| {
        sim.node("client")
            .routes_to(net("o2ib1"))
            .iter()
            .find(|r| r.gateway() == nid(gw))
            .unwrap()
            .is_alive()
    };
    let (ni, r0) = (nid("10.0.0.1@tcp"), "10.0.0.3@tcp");

    let mut sim = fabric(false);
    assert!(alive(&sim, r0));
    // A notice that the sick NI saw, with a healthier NI beside it.
    sim.with_node("client", |n, now| {
        n.set_ni_health(now, colibri_lnet::health::NiSide::Local, Some(ni), 500)
    })
    .unwrap();
    sim.with_node("client", |n, now| n.notify(now, ni, nid(r0), false));
    assert!(
        alive(&sim, r0),
        "superseded NI's notice took the route down"
    );
    // The healthiest NI's notice counts.
    sim.with_node("client", |n, now| {
        n.set_ni_health(now, colibri_lnet::health::NiSide::Local, Some(ni), 1000)
    })
    .unwrap();
    sim.with_node("client", |n, now| n.notify(now, ni, nid(r0), false));
    assert!(!alive(&sim, r0), "the death notice left the route up");
    assert!(alive(&sim, "10.0.0.4@tcp"));
    // GETs the client sent to a gateway (its pings of the server; no
    // router ping comes before the next check, a minute away).
    let gets = |sim: &Sim, gw: &str| {
        sim.node("client")
            .peer_ni_stats(nid(gw))
            .map_or(0, |s| s.sent.get)
    };
    let (via_r0, via_r1) = (gets(&sim, r0), gets(&sim, "10.0.0.4@tcp"));
    for _ in 0..3 {
        assert!(pings(&mut sim, "client", "192.168.1.2@o2ib1"));
    }
    assert_eq!(gets(&sim, r0), via_r0, "r0 still used");
    assert_eq!(gets(&sim, "10.0.0.4@tcp"), via_r1 + 3);
    // The router checker's next ping of r0 brings its route back.
    sim.run_for(Duration::from_secs(30)).unwrap();
    assert!(alive(&sim, r0), "the router ping did not revive the route");

    // Discovery on both sides: the router checker alone judges routes.
    let mut sim = fabric(true);
    sim.with_node("client", |n, now| n.notify(now, ni, nid(r0), false));
    assert!(
        alive(&sim, r0),
        "a notice took a discovered gateway's route down"
    );
}
