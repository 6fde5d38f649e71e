//! Property test over random simulated workloads with random fault rules and
//! payload reads failing at random (connections breaking mid-payload or
//! while their message is parked): every MD ends with exactly one
//! `unlinked` event, no operation is left hanging, no message stays parked,
//! credits all come back, and the run replays from its seed.

mod common;
use common::{nid, post_any};

use std::collections::BTreeMap;
use std::time::Duration;

use colibri_lnet::fault::{DelayRuleSpec, DropRuleSpec, FaultMatch, HealthError, MsgMask, Trigger};
use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::matching::{MdHandle, MdOptions, MdSpec, Threshold, Unlink};
use colibri_lnet::sim::{Sim, Topology, TraceRecord};
use colibri_lnet::wire::MsgType;
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Op {
    Put {
        ack: bool,
        len: u8,
    },
    Get {
        len: u8,
    },
    Wait(u16),
    /// Takes back what LNet has not sent of the k-th MD made so far
    /// (`Node::withdraw`), and unlinks it too when the flag says so.
    Cancel(u8, bool),
    /// The client deletes its o2ib NI, its last on that net (`lnetctl net
    /// del`): what was on its way there ends, peers and routes are cleaned
    /// up; later sends use tcp.
    DelNet,
}

#[derive(Clone, Copy, Debug)]
struct Faults {
    drop_put_rate: Option<u32>,
    drop_ack_rate: Option<u32>,
    send_fail_rate: Option<u32>,
    delay_rate: Option<u32>,
    payload_fail_rate: Option<u32>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), 0u8..40).prop_map(|(ack, len)| Op::Put { ack, len }),
        3 => (0u8..40).prop_map(|len| Op::Get { len }),
        3 => (0u16..2000).prop_map(Op::Wait),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(k, unlink)| Op::Cancel(k, unlink)),
        1 => Just(Op::DelNet),
    ]
}

fn faults() -> impl Strategy<Value = Faults> {
    (
        proptest::option::of(1u32..5),
        proptest::option::of(1u32..5),
        proptest::option::of(1u32..5),
        proptest::option::of(1u32..5),
        proptest::option::of(1u32..6),
    )
        .prop_map(|(a, b, c, d, e)| Faults {
            drop_put_rate: a,
            drop_ack_rate: b,
            send_fail_rate: c,
            delay_rate: d,
            payload_fail_rate: e,
        })
}

struct Outcome {
    trace: Vec<TraceRecord>,
    unlinked: BTreeMap<MdHandle, usize>,
    created: Vec<MdHandle>,
}

fn run(seed: u64, ops: &[Op], f: Faults) -> Outcome {
    let mut sim = Sim::new(
        Topology::new(seed)
            .node("c", &["10.0.0.1@tcp", "192.168.0.1@o2ib"])
            .node("s", &["10.0.0.2@tcp", "192.168.0.2@o2ib"])
            .jitter(Duration::from_micros(30)),
    )
    .unwrap();
    for (portal, opts) in [(3, MdOptions::OP_PUT), (4, MdOptions::OP_GET)] {
        let mem_1 = sim.register_mem("s", vec![9; 32]);
        post_any(
            &mut sim,
            "s",
            portal,
            MdSpec::new(mem_1, opts | MdOptions::MANAGE_REMOTE),
        );
    }
    let rule = |rate: Option<u32>, matcher: FaultMatch, health_mask: u32| {
        rate.map(|r| DropRuleSpec {
            matcher,
            trigger: Trigger::Rate(r),
            health_mask,
        })
    };
    if let Some(r) = rule(
        f.drop_put_rate,
        FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
        0,
    ) {
        sim.with_node("s", |n, now| n.add_drop_rule(now, r))
            .unwrap();
    }
    if let Some(r) = rule(
        f.drop_ack_rate,
        FaultMatch::ANY.types(MsgMask::of(MsgType::Ack)),
        0,
    ) {
        sim.with_node("c", |n, now| n.add_drop_rule(now, r))
            .unwrap();
    }
    if let Some(r) = rule(
        f.send_fail_rate,
        FaultMatch::between(Nid::ANY, nid("192.168.0.2@o2ib")),
        HealthError::mask(&[HealthError::RemoteDropped, HealthError::LocalTimeout]),
    ) {
        sim.with_node("c", |n, now| n.add_drop_rule(now, r))
            .unwrap();
    }
    if let Some(rate) = f.delay_rate {
        sim.with_node("s", |n, now| {
            n.add_delay_rule(
                now,
                DelayRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(rate),
                    latency: Duration::from_millis(3),
                },
            )
        })
        .unwrap();
    }
    for n in [
        "10.0.0.1@tcp",
        "192.168.0.1@o2ib",
        "10.0.0.2@tcp",
        "192.168.0.2@o2ib",
    ] {
        sim.set_payload_faults(nid(n), f.payload_fail_rate);
    }
    let target = ProcessId::lustre(nid("10.0.0.2@tcp"));
    let mut created = Vec::new();
    let mut ib_gone = false;
    for (i, o) in ops.iter().enumerate() {
        match *o {
            Op::Put { ack, len } => {
                let mem_2 = sim.register_mem("c", vec![1; usize::from(len)]);
                let md = sim
                    .with_node("c", |n, _| {
                        n.md_bind(
                            MdSpec::new(mem_2, MdOptions::empty())
                                .threshold(Threshold::Count(if ack { 2 } else { 1 }))
                                .unlink(Unlink::Unlink),
                        )
                    })
                    .unwrap();
                created.push(md);
                sim.with_node("c", |n, now| n.put(now, md, ack, target, 3, i as u64, 0, 0))
                    .unwrap();
            }
            Op::Get { len } => {
                let mem_3 = sim.register_mem("c", vec![0; usize::from(len)]);
                let md = sim
                    .with_node("c", |n, _| {
                        n.md_bind(
                            MdSpec::new(mem_3, MdOptions::TRUNCATE)
                                .threshold(Threshold::Count(2))
                                .unlink(Unlink::Unlink),
                        )
                    })
                    .unwrap();
                created.push(md);
                sim.with_node("c", |n, now| n.get(now, md, target, 4, i as u64, 0))
                    .unwrap();
            }
            Op::Wait(us) => sim.run_for(Duration::from_micros(u64::from(us))).unwrap(),
            Op::DelNet => {
                if !ib_gone {
                    sim.with_node("c", |n, now| n.del_ni(now, nid("192.168.0.1@o2ib")))
                        .unwrap();
                    ib_gone = true;
                }
            }
            Op::Cancel(k, unlink) => {
                if let Some(&md) = created.get(usize::from(k) % created.len().max(1)) {
                    sim.with_node("c", |n, now| {
                        n.withdraw(now, md);
                        if unlink {
                            // Refused once it is unlinked already.
                            let _ = n.md_unlink(now, md);
                        }
                    });
                }
            }
        }
    }
    // Past every transaction timeout: nothing may still be in progress.
    sim.run_for(Duration::from_secs(400)).unwrap();
    let mut unlinked: BTreeMap<MdHandle, usize> = BTreeMap::new();
    for (_, e) in sim.events("c") {
        if e.unlinked {
            *unlinked.entry(e.md).or_default() += 1;
        }
    }
    // MDs whose send failed for good still hold the response slot (Lustre:
    // the user unlinks them); they must be idle, so unlinking them gives an
    // UNLINK event at once.
    for md in &created {
        if !unlinked.contains_key(md) {
            sim.with_node("c", |n, now| n.md_unlink(now, *md)).unwrap();
        }
    }
    sim.run_for(Duration::from_millis(1)).unwrap();
    unlinked.clear();
    for (_, e) in sim.events("c") {
        if e.unlinked {
            *unlinked.entry(e.md).or_default() += 1;
        }
    }
    // Nothing is parked or half-read anywhere.
    for n in ["c", "s"] {
        assert_eq!(sim.node(n).rx_pending(), 0, "{n}: messages pending");
        assert_eq!(sim.stalled(n), 0, "{n}: stalled connections");
    }
    // Every credit is back (those of the client's o2ib NI, and towards
    // the server's o2ib NI, only while that net is the client's).
    let (to, ni): (&[&str], &[&str]) = if ib_gone {
        (&["10.0.0.2@tcp"], &["10.0.0.1@tcp"])
    } else {
        (
            &["10.0.0.2@tcp", "192.168.0.2@o2ib"],
            &["10.0.0.1@tcp", "192.168.0.1@o2ib"],
        )
    };
    for to in to {
        let q = sim.node("c").tx_credits().peer_ni_credits(nid(to));
        assert_eq!(q, 8, "peer NI credits to {to}");
    }
    for ni in ni {
        assert_eq!(sim.node("c").tx_credits().ni_credits(nid(ni)), 256);
    }
    assert_eq!(
        sim.node("c").discovery().invariant_violation(),
        None,
        "peer table"
    );
    if ib_gone {
        // No peer of the client keeps a NID on the deleted net as its
        // primary, and no route goes through it.
        let peers = sim.node("c").discovery().peers();
        assert!(
            peers
                .peers()
                .all(|p| p.primary_nid().net() != nid("192.168.0.2@o2ib").net()),
            "a peer's primary on the deleted net"
        );
    }
    Outcome {
        trace: sim.trace().to_vec(),
        unlinked,
        created,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_md_gets_exactly_one_final_event(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..25),
        f in faults(),
    ) {
        let a = run(seed, &ops, f);
        for md in &a.created {
            prop_assert_eq!(a.unlinked.get(md).copied(), Some(1), "MD {:?}", md);
        }
        let b = run(seed, &ops, f);
        prop_assert_eq!(a.trace, b.trace);
    }
}
