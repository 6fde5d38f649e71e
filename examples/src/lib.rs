//! # colibri-examples: programs that use the Colibri RPC layer
//!
//! Each example is a small library module (so that tests and the `colibri`
//! command-line program run the very same code) and a binary in
//! `examples/` that runs it on loopback with one command:
//!
//! | example | command | what it shows |
//! |---|---|---|
//! | [`ping`] | `cargo run -p colibri-examples --example ping` | a server answering pings, a client measuring round trips |
//! | [`bulk_file`] | `cargo run -p colibri-examples --example bulk_file` | a file service moving byte ranges through bulk descriptors; a client copying a file through it and checking its checksum |
//! | [`echo`] | `cargo run -p colibri-examples --example rpc_echo` | typed requests and replies through serde |
//!
//! All of them run over the in-memory transport, client and server in one
//! process; the same code runs between two processes by address over TCP
//! (`ping --serve ADDR` / `ping --connect ADDR`, and the `colibri serve` /
//! `colibri ping` commands with `--xprt tcp`).

#![forbid(unsafe_code)]

pub mod bulk_file;
pub mod echo;
pub mod ping;

/// The error type of the examples: anything printable.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
