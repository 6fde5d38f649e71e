//! # colibri-rpc: RPC over Colibri transfer machines
//!
//! The upper layer a messaging transport needs: it supplies receive
//! buffers, matches requests and replies, batches small items into
//! messages ("formation"), moves large data through buffer descriptors,
//! and lets servers finish a request later from any thread. It runs over
//! any transport of [`colibri_net`].
//!
//! ```text
//!  RpcMachine ── one TransferMachine (own Domain)
//!   ├── receive buffers: multi-message, re-queued as they fill
//!   ├── send buffers: a pool of message-sized registered buffers
//!   ├── client Sessions ── xids, calls in flight, timeouts, resends,
//!   │                      formation queue (items -> messages)
//!   ├── handlers per opcode ── Request + ReplyHandle (reply any time,
//!   │                          from any thread)
//!   ├── server sessions ── reply cache (at-most-once), reply queue
//!   ├── per session and direction ── message sequence, reorder window,
//!   │                                acknowledgements, ordered dispatch
//!   └── timer thread ── timeouts, resends, delayed batches, refused
//!                       messages, acknowledgements, probes
//! ```
//!
//! * **Calls**: blocking ([`Session::call`]), asynchronous
//!   ([`Session::start`] returns a [`CallHandle`] that can be waited on,
//!   polled, given a callback, or `.await`ed: it is a plain
//!   [`Future`], and [`block_on`] is enough to run it),
//!   one-way ([`Session::post`]). Each call has a timeout per attempt and a
//!   number of resends ([`CallOpts`]); a resent request carries the same
//!   xid, and the server answers it from its bounded reply cache when it
//!   already ran it, so a handler runs at most once per call. A call in
//!   flight can be cancelled ([`CallHandle::cancel`], or a [`Canceller`]
//!   from another thread): it completes at once with
//!   [`RpcError::Cancelled`].
//! * **Formation**: items to the same session are packed into one message
//!   up to [`RpcConfig::max_msg_size`]; a message leaves when it is full,
//!   when the [`RpcConfig::batch_delay`] has passed, or at once when the
//!   delay is zero; at most [`RpcConfig::max_in_flight`] messages per
//!   session are in flight, and items queue behind them. An item larger
//!   than a message is refused with [`RpcError::TooBig`]: its data goes
//!   through bulk.
//! * **Ordering**: the messages of each session and direction are
//!   numbered; the receiver hands them out strictly in order, each once,
//!   whatever order the transport delivers them in (several transport
//!   threads, two connections), holding early ones and dropping
//!   duplicates, and runs one session's handlers one at a time. Refused
//!   messages (no receive buffer) are sent again with the same number;
//!   receivers acknowledge what they handled, and a sender keeps at most
//!   [`RpcConfig::window`] messages unacknowledged. A message that fails
//!   for good restarts the session's sequence and fails the calls that may
//!   not have arrived ([`RpcError::SessionReset`]).
//! * **Bulk**: [`Session::start_bulk`] adds the client's buffers to
//!   passive queues (usable only by the server) and sends their
//!   descriptors in the request; the server's handler moves the data with
//!   [`RpcHandle::bulk_pull`] / [`RpcHandle::bulk_push`] and then replies.
//!   The call completes only once the reply *and* every client buffer are
//!   back (the reply may arrive first).
//! * **Typed payloads** through serde ([`codec`]): [`Session::call_typed`],
//!   [`RpcHandle::on_typed`]; raw bytes are always possible.
//! * **Wire format** ([`wire`]): fixed little-endian headers with magic
//!   and version, every field checked; decoders never panic. Unknown
//!   opcodes and malformed requests get an error reply.
//! * Statistics ([`RpcStats`], [`SessionStats`]) and `tracing` spans per
//!   session (`rpc_session`, `rpc_server_session`).
//!
//! ## Threads and locks
//!
//! Handlers registered with [`RpcHandle::on`], reply routing and completion
//! callbacks run on the transport's threads, never with a transfer machine
//! lock held, one thread at a time per session. Those threads deliver the
//! completions, so a blocking wait there ([`BulkOp::wait`],
//! [`CallHandle::wait`], [`Session::call`], [`block_on`], ...) fails at once
//! with [`RpcError::ApiMisuse`] instead of freezing the server. A handler
//! that needs to wait is registered with [`RpcHandle::on_blocking`] (it
//! runs on the machine's handler pool, [`RpcConfig::handler_threads`]) or
//! [`RpcHandle::on_async`] (a future polled on that pool, which `.await`s
//! its bulk transfers); both have bulk examples. Each session has its own lock, taken before the transfer
//! machine's (sends are added under it) and never while calling user code.
//! See `rpc/DESIGN.md`.
//!
//! ## Example
//!
//! ```
//! use colibri_bulk_mem::MemTransport;
//! use colibri_rpc::{RpcConfig, RpcMachine};
//!
//! # fn main() -> Result<(), colibri_rpc::RpcError> {
//! let xprt = MemTransport::default();
//! let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:1", RpcConfig::default())?;
//! server.on(1, |req, reply| {
//!     let mut v = req.payload().to_vec();
//!     v.reverse();
//!     reply.ok(&v);
//! });
//! let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:2", RpcConfig::default())?;
//! let session = client.session(server.addr())?;
//!
//! // Blocking.
//! assert_eq!(session.call(1, b"abc")?, b"cba");
//! // Asynchronous, awaited without a runtime.
//! let call = session.start(1, b"xyz", Default::default())?;
//! assert_eq!(colibri_rpc::block_on(call)??, b"zyx");
//! // Unknown opcode: an error reply.
//! assert!(matches!(session.call(9, b""), Err(colibri_rpc::RpcError::UnknownOpcode(9))));
//!
//! drop(session);
//! let cdom = client.shutdown()?;
//! let sdom = server.shutdown()?;
//! assert_eq!(cdom.buffer_count() + sdom.buffer_count(), 0);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod bulk;
mod call;
pub mod codec;
mod completion;
mod config;
mod error;
mod machine;
mod seq;
mod server;
mod session;
mod stats;
pub mod wire;
mod workers;

pub use bulk::{BulkOp, BulkOpFuture};
pub use call::{BulkArg, BulkCall, BulkDone, BulkOutcome, CallHandle, Canceller, block_on};
pub use config::{CallOpts, RpcConfig};
pub use error::{
    BlockedWait, Result, RpcError, STATUS_BUSY, STATUS_INVALID, STATUS_NO_REPLY, STATUS_PROTOCOL,
    STATUS_SHUTDOWN, STATUS_STALE, STATUS_UNKNOWN_OPCODE,
};
pub use machine::{RpcHandle, RpcMachine};
pub use server::{ReplyHandle, Request};
pub use session::Session;
pub use stats::{RpcStats, SessionStats};
pub use wire::{BulkDesc, BulkKind, MsgHeader};
