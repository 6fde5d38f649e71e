//! # colibri-lnet: the LNet protocol core
//!
//! An LNet-style network stack for Colibri, written as **sans-IO state
//! machines**: nothing in this crate opens a socket, spawns a thread or reads a
//! clock. Every input is a `handle_*(now, …)` call, every output is pulled with
//! a `poll_*` call, and every timer is a deadline the driver asks for and
//! feeds back. Threads and sockets drive the machines in production; tests
//! drive them with a virtual clock and a deterministic fabric simulator.
//!
//! Modules, bottom up:
//!
//! ```text
//!   ids, time, rng       NIDs, nets, process ids; monotonic time; seeded PRNG
//!   wire                 72-byte LE message header, ping buffer (byte-exact with Lustre)
//!   matching             portals, MEs, MDs, events (PUT/GET/REPLY/ACK/SEND/UNLINK)
//!   fault                drop and delay rules (lctl net_drop_add / net_delay_add)
//!   peer, discovery      peer tables, Multi-Rail discovery state machine (seed 000)
//!   select               Multi-Rail pathway selection
//!   credits              peer NI / NI tx credits, router credits and buffer pools
//!   route                routes table, route choice, gateway aliveness
//!   health               health values, failure reactions, recovery pings (seed 001)
//!   node                 the LNet node tying them together: send and receive paths
//!   socklnd              Lustre's socket LND protocol without sockets: acceptor request,
//!                        V3 HELLO, ksock_msg framing, handshake decisions, back-off
//!   sim                  deterministic fabric simulator driving several nodes
//!   scale                fabrics of any size for the simulator (scale bench, 1,024-node test)
//! ```
//!
//! See `DESIGN.md` (identifiers, wire, matching, faults, node, simulator, and
//! the socket LND protocol in [`socklnd`]) and
//! `DESIGN-peers.md` (peers, discovery, selection, credits, routes, health)
//! in the crate folder.
//!
//! ## Example
//!
//! Two nodes on a simulated `tcp` net; `a` PUTs five bytes into a buffer
//! that `b` posted, asking for an ACK. MD memory belongs to the application
//! (here the simulator's arena); every message crosses the real wire
//! encoders and decoders, and the payload goes from `a`'s memory to `b`'s
//! without passing through either node.
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet::ids::{Nid, ProcessId};
//! use colibri_lnet::matching::{EventKind, InsertPos, MdOptions, MdSpec, MeSpec, Threshold, Unlink};
//! use colibri_lnet::sim::{Sim, Topology};
//!
//! let mut sim = Sim::new(Topology::parse(
//!     "seed 1\nnode a 10.0.0.1@tcp\nnode b 10.0.0.2@tcp\nlatency tcp 20us\n",
//! )?)?;
//!
//! // b: a match entry on portal 4 with an MD over 16 bytes of b's memory.
//! let inbox = sim.register_mem("b", vec![0; 16]);
//! sim.with_node("b", |n, now| {
//!     let me = n.me_attach(MeSpec {
//!         portal: 4,
//!         match_id: ProcessId::ANY,
//!         match_bits: 0x42,
//!         ignore_bits: 0,
//!         unlink: Unlink::Retain,
//!         pos: InsertPos::After,
//!     })?;
//!     n.md_attach(now, me, MdSpec::new(inbox, MdOptions::OP_PUT))
//! })?;
//!
//! // a: a bound MD with the data (threshold 2: SEND and ACK), then PUT.
//! let b: Nid = "10.0.0.2@tcp".parse()?;
//! let data = sim.register_mem("a", b"hello".to_vec());
//! sim.with_node("a", |n, now| {
//!     let md = n.md_bind(MdSpec::new(data, MdOptions::empty())
//!         .threshold(Threshold::Count(2)))?;
//!     n.put(now, md, true, ProcessId::lustre(b), 4, 0x42, 0, 0)
//! })?;
//! sim.run_for(Duration::from_secs(1))?;
//!
//! assert_eq!(&sim.mem("b", inbox.key)[..5], b"hello");
//! let kinds: Vec<EventKind> = sim.events("a").iter().map(|(_, e)| e.kind()).collect();
//! assert!(kinds.contains(&EventKind::Send) && kinds.contains(&EventKind::Ack));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

/// The operations of a `u32` bit-set newtype (`struct T(u32)`): `empty`,
/// `bits`, `contains`, `with`, `without` and `|`.
macro_rules! bit_set {
    ($t:ty) => {
        impl $t {
            /// No bits.
            #[must_use]
            pub const fn empty() -> Self {
                Self(0)
            }
            /// The raw bits.
            #[must_use]
            pub const fn bits(self) -> u32 {
                self.0
            }
            /// Whether every bit of `other` is set.
            #[must_use]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }
            /// `self` with the bits of `other` set.
            #[must_use]
            pub const fn with(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }
            /// `self` with the bits of `other` cleared.
            #[must_use]
            pub const fn without(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }
        }

        impl std::ops::BitOr for $t {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                self.with(rhs)
            }
        }
    };
}

pub mod credits;
mod deque;
pub mod discovery;
pub mod fault;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod health;
pub mod ids;
pub mod matching;
pub mod nidmap;
pub mod nidrange;
pub mod node;
pub mod peer;
pub mod rng;
pub mod route;
pub mod scale;
pub mod select;
pub mod sim;
pub mod socklnd;
pub mod time;
pub mod udsp;
pub mod wire;
