//! Statistics of an RPC machine and of its sessions.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of an RPC machine (client and server sides), read with
/// [`RpcHandle::stats`](crate::RpcHandle::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RpcStats {
    /// Calls started.
    pub calls: u64,
    /// Calls completed with a successful reply.
    pub calls_ok: u64,
    /// Calls completed with a failure (local, transport, timeout or
    /// the server's).
    pub calls_failed: u64,
    /// Requests resent after a timeout.
    pub resends: u64,
    /// Calls that timed out after their last attempt.
    pub timeouts: u64,
    /// Calls cancelled by their caller (also counted in `calls_failed`).
    pub cancelled: u64,
    /// One-way items posted.
    pub posts: u64,
    /// Replies received that matched no call in flight (late, duplicate).
    pub unmatched_replies: u64,
    /// Requests received and given to a handler.
    pub requests: u64,
    /// One-way items received and given to a handler.
    pub oneways: u64,
    /// Replies sent.
    pub replies: u64,
    /// Resent requests answered from the reply cache, or dropped because
    /// the first copy is still being executed.
    pub duplicates: u64,
    /// Resent requests whose reply had left the cache (answered `Stale`).
    pub stale: u64,
    /// Cached replies dropped because the client said it has them (the
    /// replied-below mark its requests carry).
    pub replies_pruned: u64,
    /// Items naming an opcode with no handler.
    pub unknown_opcodes: u64,
    /// Messages or items that failed to decode.
    pub protocol_errors: u64,
    /// Messages sent.
    pub msgs_sent: u64,
    /// Items sent (in `msgs_sent` messages).
    pub items_sent: u64,
    /// Bytes sent in messages.
    pub bytes_sent: u64,
    /// Messages received.
    pub msgs_received: u64,
    /// Items received.
    pub items_received: u64,
    /// Bytes received in messages.
    pub bytes_received: u64,
    /// Message sends that failed.
    pub send_failures: u64,
    /// Messages sent again after the receiver refused them (no free
    /// receive buffer) or the connection broke, with the same sequence
    /// number.
    pub send_retries: u64,
    /// Messages received ahead of a missing one and held until it came.
    pub msgs_held: u64,
    /// Messages received twice (a send that failed after the receiver had
    /// it, then sent again) and dropped.
    pub msgs_duplicate: u64,
    /// Messages dropped unhandled: of an epoch the sender had given up,
    /// held when it gave up, or too far ahead of a missing one.
    pub msgs_discarded: u64,
    /// Missing messages given up on after `gap_timeout` (the messages held
    /// behind them were then handled).
    pub msgs_skipped: u64,
    /// Times a session restarted its message sequence (a message failed
    /// for good, the peer was gone, or nothing was acknowledged).
    pub seq_resets: u64,
    /// One-way items in messages that failed for good (their receiver may
    /// or may not have handled them).
    pub items_lost: u64,
    /// Acknowledgements sent on their own (not carried by a message).
    pub acks_sent: u64,
    /// Probes sent to servers that calls wait for.
    pub probes_sent: u64,
    /// Messages refused because the machine had `max_sessions` server
    /// sessions.
    pub sessions_refused: u64,
    /// Requests (answered `Busy`) and one-way items (dropped) in refused
    /// messages.
    pub items_refused: u64,
    /// Request handlers that panicked (their requests were answered
    /// `NoReply`).
    pub handler_panics: u64,
    /// Requests for handlers of the handler pool answered `Busy` because
    /// the pool held `handler_queue` requests already.
    pub handler_busy: u64,
    /// Bulk transfers completed successfully (both sides).
    pub bulk_ok: u64,
    /// Bytes moved by successful bulk transfers.
    pub bulk_bytes: u64,
}

impl RpcStats {
    /// Average items per message sent.
    pub fn items_per_msg(&self) -> f64 {
        if self.msgs_sent == 0 {
            0.0
        } else {
            self.items_sent as f64 / self.msgs_sent as f64
        }
    }
}

/// Counters of one client session, read with
/// [`Session::stats`](crate::Session::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SessionStats {
    /// Calls started.
    pub calls: u64,
    /// Replies received.
    pub replies: u64,
    /// Requests resent.
    pub resends: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Calls cancelled by their caller.
    pub cancelled: u64,
    /// One-way items posted.
    pub posts: u64,
    /// Messages sent.
    pub msgs_sent: u64,
    /// Items sent.
    pub items_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
}

impl SessionStats {
    /// Average items per message sent.
    pub fn items_per_msg(&self) -> f64 {
        if self.msgs_sent == 0 {
            0.0
        } else {
            self.items_sent as f64 / self.msgs_sent as f64
        }
    }
}

macro_rules! counters {
    ($($f:ident),* $(,)?) => {
        /// The machine's live counters.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $f: AtomicU64,)*
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> RpcStats {
                RpcStats {
                    $($f: self.$f.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counters!(
    calls,
    calls_ok,
    calls_failed,
    resends,
    timeouts,
    cancelled,
    posts,
    unmatched_replies,
    requests,
    oneways,
    replies,
    duplicates,
    stale,
    replies_pruned,
    unknown_opcodes,
    protocol_errors,
    msgs_sent,
    items_sent,
    bytes_sent,
    msgs_received,
    items_received,
    bytes_received,
    send_failures,
    send_retries,
    msgs_held,
    msgs_duplicate,
    msgs_discarded,
    msgs_skipped,
    seq_resets,
    items_lost,
    acks_sent,
    probes_sent,
    sessions_refused,
    items_refused,
    handler_panics,
    handler_busy,
    bulk_ok,
    bulk_bytes,
);

/// Adds `n` to a counter.
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
