//! Node behaviour through the simulator: PUT/ACK, GET/REPLY, events, lazy
//! portals, timeouts, fault rules, protocol errors, replay.

mod common;
use common::nid;

use std::time::Duration;

use colibri_lnet::fault::{DelayRuleSpec, DropRuleSpec, FaultMatch, HealthError, MsgMask, Trigger};
use colibri_lnet::ids::ProcessId;
use colibri_lnet::matching::{
    EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, MemRef, OpError, Threshold, Unlink,
};
use colibri_lnet::node::{NodeError, RxAction};
use colibri_lnet::sim::{Sim, SimError, Topology};
use colibri_lnet::time::Time;
use colibri_lnet::wire::{Body, HEADER_LEN, Header, LNET_MTU, MsgType, WireError, WireHandle};

/// Two single-NI nodes with discovery off (so the wire carries only what
/// the test sends; discovery has its own scenarios).
fn pair(seed: u64) -> Sim {
    Sim::new(
        Topology::new(seed)
            .node("a", &["10.0.0.1@tcp"])
            .node("b", &["10.0.0.2@tcp"])
            .latency("tcp", Duration::from_micros(50))
            .configure("a", |c| c.discovery = false)
            .configure("b", |c| c.discovery = false),
    )
    .unwrap()
}

/// Posts a receive MD on `portal` of node `name`.
fn post(sim: &mut Sim, name: &str, portal: u32, bits: u64, spec: MdSpec) -> MdHandle {
    sim.with_node(name, |n, now| {
        let me = n
            .me_attach(MeSpec {
                portal,
                match_id: ProcessId::ANY,
                match_bits: bits,
                ignore_bits: 0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })
            .unwrap();
        n.md_attach(now, me, spec).unwrap()
    })
}

/// Binds an MD over `mem` on node `name`, unlinked after `threshold`
/// operations (a PUT's or GET's source or sink).
fn bind(sim: &mut Sim, name: &str, mem: MemRef, threshold: u32) -> MdHandle {
    sim.with_node(name, |n, _| {
        n.md_bind(
            MdSpec::new(mem, MdOptions::empty())
                .threshold(Threshold::Count(threshold))
                .unlink(Unlink::Unlink),
        )
    })
    .unwrap()
}

fn kinds(sim: &Sim, name: &str) -> Vec<EventKind> {
    sim.events(name).iter().map(|(_, e)| e.kind()).collect()
}

#[test]
fn put_with_ack_delivers_data_and_events() {
    let mut sim = pair(1);
    let inbox = sim.register_mem("b", vec![0; 16]);
    let target = post(
        &mut sim,
        "b",
        5,
        0x77,
        MdSpec::new(inbox, MdOptions::OP_PUT),
    );
    let hello = sim.register_mem("a", b"hello".to_vec());
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(
                MdSpec::new(hello, MdOptions::empty())
                    .threshold(Threshold::Count(2))
                    .unlink(Unlink::Unlink)
                    .user_ptr(9),
            )
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, true, b, 5, 0x77, 0, 0xabc))
        .unwrap();
    sim.run_until_idle().unwrap();

    // Target: one PUT event with the data, header data and sizes.
    let ev = &sim.events("b")[0].1;
    assert_eq!(ev.kind(), EventKind::Put);
    assert_eq!(ev.md, target);
    assert_eq!(ev.info.hdr_data, 0xabc);
    assert_eq!((ev.info.rlength, ev.info.mlength), (5, 5));
    assert_eq!(ev.info.initiator.nid, nid("10.0.0.1@tcp"));
    assert_eq!(&sim.mem("b", inbox.key)[..5], b"hello");
    assert_eq!(ev.mem, inbox);

    // Initiator: SEND and ACK in either order; the last one unlinks the MD.
    let mut k = kinds(&sim, "a");
    k.sort_by_key(|k| *k as u8);
    assert_eq!(k.len(), 2);
    assert!(k.contains(&EventKind::Send) && k.contains(&EventKind::Ack));
    let evs = sim.events("a");
    assert!(
        evs.iter()
            .all(|(_, e)| e.status().is_ok() && e.user_ptr == 9)
    );
    assert!(evs.last().unwrap().1.unlinked);
    let ack = evs
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Ack)
        .unwrap();
    assert_eq!(ack.1.info.mlength, 5);
    // The trace shows exactly a PUT (type 1) and an ACK (type 0) on the wire.
    let types: Vec<_> = sim.trace().iter().map(|t| t.outcome.unwrap()).collect();
    assert_eq!(types, vec![1, 0]);
}

#[test]
fn put_without_ack_has_only_send() {
    let mut sim = pair(2);
    let inbox = sim.register_mem("b", vec![0; 16]);
    post(&mut sim, "b", 5, 1, MdSpec::new(inbox, MdOptions::OP_PUT));
    let data = sim.register_mem("a", vec![1; 3]);
    let src = bind(&mut sim, "a", data, 1);
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(kinds(&sim, "a"), vec![EventKind::Send]);
    assert!(sim.events("a")[0].1.unlinked);
    assert_eq!(kinds(&sim, "b"), vec![EventKind::Put]);
    assert_eq!(sim.trace().len(), 1);
}

#[test]
fn get_with_reply() {
    let mut sim = pair(3);
    let served_mem = sim.register_mem("b", b"0123456789".to_vec());
    let served = post(
        &mut sim,
        "b",
        7,
        42,
        MdSpec::new(served_mem, MdOptions::OP_GET | MdOptions::MANAGE_REMOTE),
    );
    let sink_mem = sim.register_mem("a", vec![0; 4]);
    let sink = bind(&mut sim, "a", sink_mem, 2);
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.get(now, sink, b, 7, 42, 3))
        .unwrap();
    sim.run_until_idle().unwrap();
    // Target: GET event after the REPLY went out.
    let get = &sim.events("b")[0].1;
    assert_eq!(
        (get.kind(), get.md, get.info.offset, get.info.mlength),
        (EventKind::Get, served, 3, 4)
    );
    // Initiator: REPLY carries bytes 3..7, SEND too; the REPLY may come first.
    let evs = sim.events("a");
    assert_eq!(evs.len(), 2);
    let reply = evs
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Reply)
        .unwrap();
    assert_eq!(reply.1.info.mlength, 4);
    let last = &evs.last().unwrap().1;
    assert!(last.unlinked);
    assert_eq!(last.mem, sink_mem);
    assert_eq!(sim.mem("a", sink_mem.key), b"3456");
}

#[test]
fn get_without_match_times_out() {
    let mut sim = pair(4);
    let sink_mem = sim.register_mem("a", vec![0; 4]);
    let sink = bind(&mut sim, "a", sink_mem, 2);
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.get(now, sink, b, 7, 42, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(sim.node("b").stats().drop_count, 1);
    let evs = sim.events("a");
    let reply = evs
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Reply)
        .unwrap();
    assert_eq!(reply.1.status(), Err(OpError::TimedOut));
    // The timeout fires after the transaction timeout (150 s).
    assert!(reply.0 >= Time::from_secs(150));
    assert!(evs.last().unwrap().1.unlinked);
    assert_eq!(sim.node("a").stats().response_timeout_count, 1);
}

#[test]
fn lazy_portal_holds_put_until_md_attached() {
    let mut sim = pair(5);
    sim.with_node("b", |n, _| n.set_lazy_portal(9, true))
        .unwrap();
    let late = sim.register_mem("a", b"late".to_vec());
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(late, MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, true, b, 9, 3, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    assert!(sim.events("b").is_empty());
    assert!(!kinds(&sim, "a").contains(&EventKind::Ack));
    let inbox = sim.register_mem("b", vec![0; 8]);
    post(&mut sim, "b", 9, 3, MdSpec::new(inbox, MdOptions::OP_PUT));
    sim.run_until_idle().unwrap();
    assert_eq!(kinds(&sim, "b"), vec![EventKind::Put]);
    assert_eq!(&sim.mem("b", inbox.key)[..4], b"late");
    assert!(kinds(&sim, "a").contains(&EventKind::Ack));
}

#[test]
fn ack_disable_suppresses_ack() {
    let mut sim = pair(6);
    let inbox = sim.register_mem("b", vec![0; 8]);
    post(
        &mut sim,
        "b",
        5,
        1,
        MdSpec::new(inbox, MdOptions::OP_PUT | MdOptions::ACK_DISABLE),
    );
    let data = sim.register_mem("a", vec![1; 3]);
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)))
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, true, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    // No ACK on the wire; the initiator's ACK times out.
    assert_eq!(sim.trace().len(), 1);
    let ack = sim
        .events("a")
        .iter()
        .find(|(_, e)| e.kind() == EventKind::Ack)
        .unwrap();
    assert_eq!(ack.1.status(), Err(OpError::TimedOut));
}

#[test]
fn ping_and_push_use_the_reserved_portal() {
    let mut sim = pair(7);
    let b = nid("10.0.0.2@tcp");
    sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
    sim.run_until_idle().unwrap();
    let r = sim.node_mut("a").poll_ping_result().unwrap();
    let info = r.result.unwrap();
    assert_eq!(info.nis.len(), 1);
    assert_eq!(info.seqno, sim.node("b").ping_seq());
    assert_eq!(sim.node("b").stats().ping_served, 1);
    // No user event for LNet's own traffic.
    assert!(sim.events("a").is_empty() && sim.events("b").is_empty());

    sim.with_node("a", |n, now| n.push(now, b)).unwrap();
    sim.run_until_idle().unwrap();
    let (from, pushed) = sim.node_mut("b").poll_push().unwrap();
    assert_eq!(from, nid("10.0.0.1@tcp"));
    assert_eq!(pushed.primary_nid(), Some(nid("10.0.0.1@tcp")));
    // The push target is reposted: a second push is accepted too.
    sim.with_node("a", |n, now| n.push(now, b)).unwrap();
    sim.run_until_idle().unwrap();
    assert!(sim.node_mut("b").poll_push().is_some());
    assert_eq!(sim.node("b").stats().push_received, 2);
}

/// The ping target is rebuilt while a REPLY from it is in flight: the old
/// target stays LNet's own until its last event, which the user never sees.
#[test]
fn ping_target_rebuilt_while_serving_stays_internal() {
    let mut sim = pair(15);
    let b = nid("10.0.0.2@tcp");
    sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
    // The GET reached b (50 us + jitter); its REPLY is on the wire.
    sim.run_for(Duration::from_micros(60)).unwrap();
    assert_eq!(sim.node("b").stats().ping_served, 1);
    sim.with_node("b", |n, now| {
        n.add_ni(
            now,
            colibri_lnet::node::NiConfig::new(nid("192.168.0.2@o2ib")),
        )
    })
    .unwrap();
    sim.run_until_idle().unwrap();
    assert!(sim.node_mut("a").poll_ping_result().unwrap().result.is_ok());
    assert!(sim.events("b").is_empty(), "{:?}", sim.events("b"));
}

#[test]
fn ping_of_unknown_nid_fails() {
    let mut sim = pair(8);
    sim.with_node("a", |n, now| n.ping(now, nid("10.0.0.9@tcp")))
        .unwrap();
    sim.run_until_idle().unwrap();
    let r = sim.node_mut("a").poll_ping_result().unwrap();
    assert!(r.result.is_err());
}

#[test]
fn local_ni_added_bumps_ping_seq() {
    let mut sim = pair(9);
    let before = sim.node("b").ping_seq();
    sim.with_node("b", |n, now| {
        n.add_ni(
            now,
            colibri_lnet::node::NiConfig::new(nid("192.168.0.2@o2ib")),
        )
    })
    .unwrap();
    assert_eq!(sim.node("b").ping_seq(), before + 1);
    sim.with_node("a", |n, now| n.ping(now, nid("10.0.0.2@tcp")))
        .unwrap();
    sim.run_until_idle().unwrap();
    let info = sim
        .node_mut("a")
        .poll_ping_result()
        .unwrap()
        .result
        .unwrap();
    assert_eq!(info.nis.len(), 2);
    assert_eq!(info.nis[1].nid, nid("192.168.0.2@o2ib"));
}

#[test]
fn receive_side_drop_rule_loses_put_silently() {
    let mut sim = pair(10);
    let inbox = sim.register_mem("b", vec![0; 8]);
    post(&mut sim, "b", 5, 1, MdSpec::new(inbox, MdOptions::OP_PUT));
    sim.with_node("b", |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
                trigger: Trigger::Rate(1),
                health_mask: 0,
            },
        )
    })
    .unwrap();
    let data = sim.register_mem("a", vec![1; 3]);
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(1)))
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    // Seed 001 "dropped PUT": the sender sees a successful SEND, nothing else.
    assert_eq!(kinds(&sim, "a"), vec![EventKind::Send]);
    assert!(sim.events("a")[0].1.status().is_ok());
    assert!(sim.events("b").is_empty());
    assert_eq!(sim.node("b").stats().drop_count, 1);
}

#[test]
fn send_side_health_rule_fails_single_rail_send_without_resend() {
    let mut sim = pair(11);
    let inbox = sim.register_mem("b", vec![0; 8]);
    post(&mut sim, "b", 5, 1, MdSpec::new(inbox, MdOptions::OP_PUT));
    sim.with_node("a", |n, now| {
        n.add_drop_rule(
            now,
            DropRuleSpec {
                matcher: FaultMatch::ANY,
                trigger: Trigger::Rate(1),
                health_mask: HealthError::RemoteDropped.bit(),
            },
        )
    })
    .unwrap();
    let data = sim.register_mem("a", vec![1; 3]);
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(1)))
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    // REMOTE_DROPPED is retryable, but both ends are single-rail: resends
    // are suppressed (LU-13501) and the send fails at once.
    assert_eq!(sim.node("a").stats().resend_count, 0);
    let ev = &sim.events("a")[0].1;
    assert_eq!(ev.kind(), EventKind::Send);
    assert_eq!(ev.status(), Err(OpError::NetworkError));
    assert!(sim.events("b").is_empty());
}

#[test]
fn delay_rule_holds_messages() {
    let mut sim = pair(12);
    let inbox = sim.register_mem("b", vec![0; 8]);
    post(&mut sim, "b", 5, 1, MdSpec::new(inbox, MdOptions::OP_PUT));
    sim.with_node("b", |n, now| {
        n.add_delay_rule(
            now,
            DelayRuleSpec {
                matcher: FaultMatch::ANY,
                trigger: Trigger::Rate(1),
                latency: Duration::from_secs(5),
            },
        )
    })
    .unwrap();
    let data = sim.register_mem("a", vec![1; 3]);
    let src = sim
        .with_node("a", |n, _| {
            n.md_bind(MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(1)))
        })
        .unwrap();
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    let (t, ev) = &sim.events("b")[0];
    assert_eq!(ev.kind(), EventKind::Put);
    assert!(*t >= Time::from_secs(5));
}

#[test]
fn misdirected_and_malformed_messages_are_protocol_errors() {
    let mut sim = pair(13);
    let now = sim.now();
    let b = sim.node_mut("b");
    let (ni, from) = (nid("10.0.0.2@tcp"), nid("10.0.0.1@tcp"));
    // Garbage.
    assert!(matches!(
        b.handle_header(now, ni, from, &[1; HEADER_LEN]),
        Err(NodeError::Wire(WireError::UnknownType(0x0101_0101)))
    ));
    let h = Header {
        dest_nid: nid("10.0.0.7@tcp"),
        src_nid: nid("10.0.0.1@tcp"),
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: 0,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 0,
            hdr_data: 0,
            ptl_index: 1,
            offset: 0,
        },
    };
    // Headers that lie about lengths: a PUT beyond LNET_MTU, a GET with a
    // payload. Clean errors; the payload is never read.
    let mut lie = h;
    lie.dest_nid = ni;
    lie.payload_length = LNET_MTU + 1;
    assert_eq!(
        b.handle_header(now, ni, from, &lie.encode()),
        Err(NodeError::Wire(WireError::PayloadTooLarge(LNET_MTU + 1)))
    );
    let mut get_bytes = lie.encode();
    get_bytes[24..28].copy_from_slice(&MsgType::Get.to_u32().to_le_bytes());
    get_bytes[28..32].copy_from_slice(&8u32.to_le_bytes());
    assert!(matches!(
        b.handle_header(now, ni, from, &get_bytes),
        Err(NodeError::Wire(WireError::PayloadNotAllowed {
            ty: MsgType::Get,
            len: 8
        }))
    ));
    // A PUT for another NID on the receiving net "should have gone direct".
    assert!(matches!(
        b.handle_header(now, ni, from, &h.encode()),
        Err(NodeError::Protocol(_))
    ));
    // A PUT for a remote net on a non-router is dropped, not an error: its
    // payload is skipped.
    let mut h2 = h;
    h2.dest_nid = nid("192.168.0.7@o2ib");
    h2.payload_length = 9;
    assert_eq!(
        b.handle_header(now, ni, from, &h2.encode()),
        Ok(RxAction::Discard { len: 9 })
    );
    assert_eq!(b.stats().drop_count, 1);
    assert_eq!(b.stats().protocol_errors, 4);
    assert_eq!(b.rx_pending(), 0);
}

/// A PUT or GET naming a portal beyond the table (>= 64) is dropped at
/// matching, as Lustre's `lnet_ptl_match_md` does: counted, not a protocol
/// error that would close the connection.
#[test]
fn portal_beyond_the_table_is_dropped_at_matching() {
    let mut sim = pair(14);
    let now = sim.now();
    let b = sim.node_mut("b");
    let put = Header {
        dest_nid: nid("10.0.0.2@tcp"),
        src_nid: nid("10.0.0.1@tcp"),
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: 3,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 0,
            hdr_data: 0,
            ptl_index: 64,
            offset: 0,
        },
    };
    let get = Header {
        payload_length: 0,
        body: Body::Get {
            return_wmd: WireHandle::NONE,
            match_bits: 0,
            ptl_index: u32::MAX,
            src_offset: 0,
            sink_length: 8,
        },
        ..put
    };
    let (ni, from) = (nid("10.0.0.2@tcp"), nid("10.0.0.1@tcp"));
    // The PUT's payload is skipped; the GET has none.
    assert_eq!(
        b.handle_header(now, ni, from, &put.encode()),
        Ok(RxAction::Discard { len: 3 })
    );
    assert_eq!(
        b.handle_header(now, ni, from, &get.encode()),
        Ok(RxAction::None)
    );
    let stats = b.stats();
    assert_eq!((stats.drop_count, stats.protocol_errors), (2, 0));
    assert_eq!(stats.recv_count, 2);
    sim.run_until_idle().unwrap();
    assert!(sim.trace().is_empty(), "nothing answered");
    assert!(sim.events("b").is_empty());
}

#[test]
fn same_seed_replays_same_run() {
    fn run(seed: u64) -> Vec<colibri_lnet::sim::TraceRecord> {
        // Discovery on: its pings and pushes are part of the replayed run.
        let mut sim = Sim::new(
            Topology::new(seed)
                .node("a", &["10.0.0.1@tcp"])
                .node("b", &["10.0.0.2@tcp"])
                .node("c", &["10.0.0.3@tcp"])
                .jitter(Duration::from_micros(40)),
        )
        .unwrap();
        for (to, portal) in [("b", 3), ("c", 4)] {
            let inbox = sim.register_mem(to, vec![0; 64]);
            post(
                &mut sim,
                to,
                portal,
                0,
                MdSpec::new(inbox, MdOptions::OP_PUT | MdOptions::TRUNCATE),
            );
        }
        for i in 0..10u32 {
            for (to, portal) in [("10.0.0.2@tcp", 3), ("10.0.0.3@tcp", 4)] {
                let data = sim.register_mem("a", vec![i as u8; 4]);
                let src = sim
                    .with_node("a", |n, _| {
                        n.md_bind(
                            MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)),
                        )
                    })
                    .unwrap();
                let t = ProcessId::lustre(nid(to));
                sim.with_node("a", |n, now| n.put(now, src, true, t, portal, 0, 0, 0))
                    .unwrap();
            }
            sim.run_for(Duration::from_micros(5)).unwrap();
        }
        sim.run_until_idle().unwrap();
        sim.trace().to_vec()
    }
    let a = run(99);
    // 20 PUT+ACK pairs, plus per peer one discovery ping (GET+REPLY) and,
    // since every node advertises MULTI_RAIL, one push (PUT+ACK).
    assert_eq!(a.len(), 48);
    assert_eq!(a, run(99));
    assert_ne!(a, run(100), "jitter depends on the seed");
}

#[test]
fn step_limit_turns_livelock_into_error() {
    // A routing loop: LNet headers have no hop count, so a message for a net
    // both routers send to each other bounces forever (lnet.md 6.4). The step
    // budget turns that livelock into an error instead of a hung test.
    let topo = Topology::parse(
        "node a 10.0.0.1@tcp\n\
         node r1 10.0.0.3@tcp 10.1.0.3@tcp1 routing\n\
         node r2 10.1.0.4@tcp1 routing\n\
         route a o2ib9 10.0.0.3@tcp\n\
         route r1 o2ib9 10.1.0.4@tcp1\n\
         route r2 o2ib9 10.1.0.3@tcp1\n\
         route r2 tcp 10.1.0.3@tcp1\n",
    )
    .unwrap()
    .max_steps(10_000);
    let mut sim = Sim::new(topo).unwrap();
    sim.run_for(Duration::from_secs(1)).unwrap();
    sim.with_node("a", |n, now| n.ping(now, nid("1.2.3.4@o2ib9")))
        .unwrap();
    assert_eq!(sim.run_until_idle(), Err(SimError::StepLimit(10_000)));
    assert!(sim.node("r1").stats().route_count > 100);
}

#[test]
fn topology_text() {
    let topo = Topology::parse(
        "# a routed fabric\nseed 3\nnode a 10.0.0.1@tcp\nnode r 10.0.0.3@tcp 192.168.1.3@o2ib1 routing\nlatency tcp 50us\njitter 1us\n",
    )
    .unwrap();
    let sim = Sim::new(topo).unwrap();
    assert!(sim.node("r").config().routing);
    assert_eq!(sim.node("r").nids().len(), 2);
    assert!(matches!(
        Topology::parse("node x"),
        Err(SimError::Parse { line: 1, .. })
    ));
    assert!(matches!(
        Topology::parse("node x 1.2.3.4@nope"),
        Err(SimError::Id(_))
    ));
    assert!(matches!(
        Topology::parse("latency tcp 5parsecs"),
        Err(SimError::Parse { .. })
    ));
    assert!(matches!(
        Sim::new(
            Topology::new(1)
                .node("a", &["10.0.0.1@tcp"])
                .node("b", &["10.0.0.1@tcp"])
        ),
        Err(SimError::DuplicateNid(_))
    ));
}

/// `lnetctl ping --source`: the ping leaves through the NI asked for, on a
/// node with two NIs on the same net; a NID that is not the node's own is
/// refused.
#[test]
fn ping_from_a_chosen_source_ni() {
    for (source, other) in [
        ("10.0.0.1@tcp", "10.0.0.3@tcp"),
        ("10.0.0.3@tcp", "10.0.0.1@tcp"),
    ] {
        let mut sim = Sim::new(
            Topology::new(5)
                .node("a", &["10.0.0.1@tcp", "10.0.0.3@tcp"])
                .node("b", &["10.0.0.2@tcp"])
                .configure("a", |c| c.discovery = false)
                .configure("b", |c| c.discovery = false),
        )
        .unwrap();
        let b = nid("10.0.0.2@tcp");
        sim.with_node("a", |n, now| n.ping_from(now, b, Some(nid(source))))
            .unwrap();
        sim.run_until_idle().unwrap();
        let result = sim.node_mut("a").poll_ping_result().expect("ping finished");
        assert!(result.result.is_ok(), "{result:?}");
        let to_b: Vec<_> = sim.trace().iter().filter(|r| r.to == b).collect();
        assert!(!to_b.is_empty());
        assert!(to_b.iter().all(|r| r.from == nid(source)), "{to_b:?}");
        assert!(!to_b.iter().any(|r| r.from == nid(other)));
    }
    let mut sim = pair(1);
    let e = sim
        .with_node("a", |n, now| {
            n.ping_from(now, nid("10.0.0.2@tcp"), Some(nid("10.0.0.9@tcp")))
        })
        .unwrap_err();
    assert!(matches!(e, NodeError::Invalid(_)), "{e:?}");
}

#[test]
fn restart_breaks_what_was_on_its_way_and_refuses_another_nodes_nid() {
    let mut sim = pair(21);
    // A PUT on the wire to b when b restarts fails as at a connection
    // reset; the new b knows nothing of it.
    let data = sim.register_mem("a", vec![1; 3]);
    let src = bind(&mut sim, "a", data, 1);
    let b = ProcessId::lustre(nid("10.0.0.2@tcp"));
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_for(Duration::from_micros(10)).unwrap();
    let mut cfg = colibri_lnet::node::NodeConfig::new(vec![colibri_lnet::node::NiConfig::new(
        nid("10.0.0.2@tcp"),
    )]);
    cfg.discovery = false;
    sim.restart("b", cfg.clone()).unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(kinds(&sim, "a"), vec![EventKind::Send]);
    assert!(sim.events("a")[0].1.status().is_err());
    assert!(sim.events("b").is_empty());
    assert_eq!(
        sim.trace().last().unwrap().outcome,
        Err(HealthError::RemoteError)
    );
    // The new b works.
    let inbox = sim.register_mem("b", vec![0; 16]);
    post(&mut sim, "b", 5, 1, MdSpec::new(inbox, MdOptions::OP_PUT));
    let src = bind(&mut sim, "a", data, 1);
    sim.with_node("a", |n, now| n.put(now, src, false, b, 5, 1, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(kinds(&sim, "b"), vec![EventKind::Put]);
    // a's NID is a's.
    cfg.nis = vec![colibri_lnet::node::NiConfig::new(nid("10.0.0.1@tcp"))];
    assert!(matches!(
        sim.restart("b", cfg),
        Err(SimError::DuplicateNid(_))
    ));
}

/// Per-operation latency (Lustre's `ni_latency`/`lpni_latency`, sanity-lnet
/// test 475): a PUT's egress, an acknowledged PUT's round trip to its ACK
/// and a GET's to its REPLY, each counted once on the sending NI and on
/// the peer NI, with the wire's latency in them; a PUT without ACK adds an
/// egress sample only; `reset_stats` zeroes them.
#[test]
fn operation_latencies_are_counted_on_the_ni_and_the_peer_ni() {
    let mut sim = pair(475);
    let (a, b) = (nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp"));
    let inbox = sim.register_mem("b", vec![0; 16]);
    post(
        &mut sim,
        "b",
        4,
        0,
        MdSpec::new(inbox, MdOptions::OP_PUT | MdOptions::OP_GET),
    );
    let target = ProcessId::lustre(b);
    let src = sim.register_mem("a", vec![1; 16]);
    let md = bind(&mut sim, "a", src, 2);
    sim.with_node("a", |n, now| n.put(now, md, true, target, 4, 0, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    let sink = sim.register_mem("a", vec![0; 16]);
    let md = bind(&mut sim, "a", sink, 2);
    sim.with_node("a", |n, now| n.get(now, md, target, 4, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    let src = sim.register_mem("a", vec![2; 16]);
    let md = bind(&mut sim, "a", src, 1);
    sim.with_node("a", |n, now| n.put(now, md, false, target, 4, 0, 0, 0))
        .unwrap();
    sim.run_until_idle().unwrap();
    let ni = sim.node("a").ni_info(a).unwrap().latency;
    let peer = sim.node("a").peer_ni_stats(b).unwrap().latency;
    for l in [ni, peer] {
        assert_eq!(l.put_egress.samples, 2, "{l:?}");
        assert_eq!(l.put_ack.samples, 1, "{l:?}");
        assert_eq!(l.get_rtt.samples, 1, "{l:?}");
        // A round trip crosses the wire twice (50 µs each way).
        assert!(l.put_ack.min_ns >= 100_000, "{l:?}");
        assert!(l.get_rtt.max_ns >= 100_000, "{l:?}");
        assert_eq!(l.get_rtt.avg_ns(), l.get_rtt.min_ns);
        assert!(l.put_egress.max_ns >= l.put_egress.min_ns);
    }
    // b only answered: no latency of its own.
    assert_eq!(sim.node("b").ni_info(b).unwrap().latency.get_rtt.samples, 0);
    sim.with_node("a", |n, _| n.reset_stats());
    assert_eq!(sim.node("a").ni_info(a).unwrap().latency.put_ack.samples, 0);
    assert_eq!(
        sim.node("a")
            .peer_ni_stats(b)
            .unwrap()
            .latency
            .get_rtt
            .samples,
        0
    );
}
