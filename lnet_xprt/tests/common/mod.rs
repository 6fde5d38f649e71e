//! Helpers shared by the simulator tests.

#![allow(dead_code)]

use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::matching::{InsertPos, MdHandle, MdSpec, MeSpec, Unlink};
use colibri_lnet::sim::Sim;

/// A NID from its text.
pub(crate) fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

/// Attaches `md` on `node` behind an ME on `portal` that matches any peer
/// and any match bits, and keeps it (`Unlink::Retain`).
pub(crate) fn post_any(sim: &mut Sim, node: &str, portal: u32, md: MdSpec) -> MdHandle {
    sim.with_node(node, |n, now| {
        let me = n
            .me_attach(MeSpec {
                portal,
                match_id: ProcessId::ANY,
                match_bits: 0,
                ignore_bits: !0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })
            .unwrap();
        n.md_attach(now, me, md).unwrap()
    })
}
