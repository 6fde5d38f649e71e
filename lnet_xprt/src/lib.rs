//! # colibri-lnet: the LNet protocol core
//!
//! An LNet-style network stack for Colibri, written as **sans-IO state
//! machines**: nothing in this crate opens a socket, spawns a thread or reads a
//! clock. Every input is a `handle_*(now, …)` call, every output is pulled with
//! a `poll_*` call, and every timer is a deadline the driver asks for and
//! feeds back. Threads and sockets drive the machines in production; tests
//! drive them with a virtual clock and a deterministic fabric simulator.
//!
//! Layers, bottom up:
//!
//! ```text
//!   ids, time            NIDs, nets, process ids; monotonic time
//!   wire                 72-byte LE message header, ping buffer (byte-exact with Lustre)
//! ```
//!
//! ## Example
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet::ids::{LndType, Net, Nid, ProcessId};
//! use colibri_lnet::time::Time;
//!
//! let nid: Nid = "10.0.0.1@tcp".parse()?;
//! assert_eq!(nid.net(), Net::new(LndType::Tcp, 0));
//! let target = ProcessId::lustre(nid);
//! assert_eq!(target.to_string(), "12345-10.0.0.1@tcp");
//!
//! // Deadlines are plain values computed from the caller's `now`.
//! let now = Time::from_secs(10);
//! let deadline = now + Duration::from_secs(150);
//! assert_eq!(deadline.saturating_duration_since(now), Duration::from_secs(150));
//! # Ok::<(), colibri_lnet::ids::IdError>(())
//! ```
#![forbid(unsafe_code)]

pub mod credits;
pub mod discovery;
pub mod fault;
pub mod health;
pub mod ids;
pub mod matching;
pub mod node;
pub mod peer;
pub mod rng;
pub mod route;
pub mod select;
pub mod sim;
pub mod time;
pub mod wire;
