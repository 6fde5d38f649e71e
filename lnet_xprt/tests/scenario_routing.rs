//! Routed scenarios (seed 004): PUT+ACK and GET+REPLY through a gateway.

mod common;
use common::{nid, post_any};

use std::time::Duration;

use colibri_lnet::ids::{Net, ProcessId};
use colibri_lnet::matching::{
    EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, Threshold, Unlink,
};
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
    let inbox = post(
        &mut sim,
        "server",
        4,
        MdSpec::new(vec![0; 32], MdOptions::OP_PUT),
    );
    post(
        &mut sim,
        "server",
        5,
        MdSpec::new(b"server data".to_vec(), MdOptions::OP_GET),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    let src = sim
        .with_node("client", |n, _| {
            n.md_bind(
                MdSpec::new(b"ping!".to_vec(), MdOptions::empty()).threshold(Threshold::Count(2)),
            )
        })
        .unwrap();
    sim.with_node("client", |n, now| n.put(now, src, true, server, 4, 0, 0, 0))
        .unwrap();
    let sink = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(vec![0; 11], MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    sim.with_node("client", |n, now| n.get(now, sink, server, 5, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(5)).unwrap();
    assert_eq!(&sim.node("server").md_buffer(inbox).unwrap()[..5], b"ping!");
    let kinds: Vec<EventKind> = sim.events("client").iter().map(|(_, e)| e.kind()).collect();
    assert!(kinds.contains(&EventKind::Ack), "{kinds:?}");
    assert!(kinds.contains(&EventKind::Reply), "{kinds:?}");
    assert_eq!(sim.node("client").md_buffer(sink).unwrap(), b"server data");
    assert!(sim.node("router").stats().route_count >= 4);
    // The server saw the client's NID as the source, not the router's.
    let put = sim
        .events("server")
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Put)
        .unwrap();
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
    post_any(
        &mut sim,
        "server",
        4,
        MdSpec::new(
            vec![0; 4096],
            MdOptions::OP_PUT | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE,
        ),
    );
    post_any(
        &mut sim,
        "server",
        5,
        MdSpec::new(vec![0xab; 64], MdOptions::OP_GET | MdOptions::MANAGE_REMOTE),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    // Discover the server first (one PUT), then the burst at a single instant.
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(vec![0; 100], MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    sim.with_node("client", |n, now| {
        n.put(now, md, true, server, 4, 1000, 0, 0)
    })
    .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    let mut sinks = Vec::new();
    for i in 0..10u64 {
        let md = sim
            .with_node("client", |n, _| {
                n.md_bind(
                    MdSpec::new(vec![i as u8; 100], MdOptions::empty())
                        .threshold(Threshold::Count(2)),
                )
            })
            .unwrap();
        sim.with_node("client", |n, now| n.put(now, md, true, server, 4, i, 0, 0))
            .unwrap();
        let sink = sim
            .with_node("client", |n, _| {
                n.md_bind(
                    MdSpec::new(vec![0; 8], MdOptions::empty()).threshold(Threshold::Count(2)),
                )
            })
            .unwrap();
        sim.with_node("client", |n, now| n.get(now, sink, server, 5, i, 0))
            .unwrap();
        sinks.push(sink);
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
        assert_eq!(sim.node("client").md_buffer(sink).unwrap(), &[0xab; 8]);
    }

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
    post(
        &mut sim,
        "server",
        4,
        MdSpec::new(vec![0; 32], MdOptions::OP_PUT),
    );
    let server = ProcessId::lustre(nid("192.168.1.2@o2ib1"));
    // Discover the server first.
    let md = sim
        .with_node("client", |n, _| {
            n.md_bind(MdSpec::new(vec![1; 4], MdOptions::empty()))
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
    let bytes = colibri_lnet::wire::encode_message(&h, b"data");
    // As if the client's LND had handed it to the router.
    sim.with_node("router", |n, now| {
        n.handle_receive(now, nid("10.0.0.3@tcp"), nid("10.0.0.1@tcp"), &bytes)
    })
    .unwrap();
    sim.run_for(Duration::from_millis(10)).unwrap();
    assert_eq!(sim.node("router").stats().route_count, routed_before + 1);
    assert_eq!(sim.node("server").stats().drop_count, dropped_before + 1);
    assert_eq!(sim.node("server").stats().protocol_errors, 0);
    assert!(sim.receive_errors().is_empty());
    assert!(sim.events("server").is_empty());
}
