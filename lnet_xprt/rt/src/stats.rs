//! Runtime counters: what the runtime moved and how.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the bytes the runtime moved, to check the zero-copy claim:
/// at an end node user payloads only cross the socket (one vectored write
/// at the sender, reads straight into the MD at the receiver), except the
/// small messages of CONTROL connections, which arrive several at a time
/// in one read and are copied from there ([`RuntimeStats::eager_copy_bytes`],
/// as o2iblnd copies its immediate messages); so
/// [`RuntimeStats::user_copy_bytes`] stays 0; loopback moves each payload
/// once, memory to memory, as Lustre's lolnd does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStats {
    /// Payload bytes written to sockets (from MD memory, router buffers or
    /// LNet's own inline bytes).
    pub socket_write_bytes: u64,
    /// Payload bytes read from sockets into their destination (MD memory,
    /// a router buffer, or an inline vector for LNet's own messages).
    pub socket_read_bytes: u64,
    /// Of those written, LNet's own inline bytes (ping replies, pushes).
    pub inline_write_bytes: u64,
    /// Of those read, LNet's own inline bytes.
    pub inline_read_bytes: u64,
    /// Payload bytes skipped on sockets (dropped or truncated messages).
    pub discarded_bytes: u64,
    /// Payload bytes the loopback LND moved, memory to memory (the one copy
    /// of Lustre's lolnd).
    pub loopback_copy_bytes: u64,
    /// Of those read, the payload bytes that came in with their headers in
    /// one read of a connection of small messages (CONTROL, or untyped:
    /// up to 4 KiB a read at a message boundary) and were copied from the
    /// scheduler's buffer to their destination. Payloads of bulk
    /// connections are never copied; a larger payload on a CONTROL
    /// connection only for its first bytes. A `min_bulk` of 0 sends every
    /// message on the bulk connections (no copy at all).
    pub eager_copy_bytes: u64,
    /// User payload bytes copied in user space by the runtime besides
    /// socket reads and writes, the eager copy of small messages and the
    /// loopback move: always 0 (the counter exists so tests can say so).
    pub user_copy_bytes: u64,
    /// Messages written to sockets (LNet messages and NOOPs).
    pub frames_sent: u64,
    /// Messages read from sockets (LNet messages and NOOPs).
    pub frames_received: u64,
    /// Connections established (both directions).
    pub conns_established: u64,
    /// Connections closed.
    pub conns_closed: u64,
    /// Keepalive NOOPs sent.
    pub keepalives_sent: u64,
    /// Loopback moves that failed because the source or destination
    /// memory was gone (deregistered, or a foreign memory's owner aborted
    /// it): each fails its message with one event (logged at debug level,
    /// as the application caused it).
    pub loopback_failures: u64,
    /// Times a spinning socket scheduler took its busiest connection out
    /// of the epoll set to read it directly (`LnetConfig::spin`;
    /// `lnet_xprt/rt/DESIGN.md`, "Receiving").
    pub hot_detaches: u64,
    /// Of [`RuntimeStats::socket_read_bytes`], the forwarded payload bytes
    /// a router spliced from a socket into a pipe (never in user space;
    /// `LnetConfig::splice_pipes`).
    pub splice_read_bytes: u64,
    /// Payload bytes spliced from pipes into sockets (counted in
    /// [`RuntimeStats::socket_write_bytes`] once the message is written).
    pub splice_write_bytes: u64,
    /// Forwarded payloads that did not fit a pipe half-way (their pages
    /// came in more pieces than a pipe has slots) and went on in memory.
    pub splice_spills: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) socket_write_bytes: AtomicU64,
    pub(crate) socket_read_bytes: AtomicU64,
    pub(crate) inline_write_bytes: AtomicU64,
    pub(crate) inline_read_bytes: AtomicU64,
    pub(crate) discarded_bytes: AtomicU64,
    pub(crate) loopback_copy_bytes: AtomicU64,
    pub(crate) eager_copy_bytes: AtomicU64,
    pub(crate) user_copy_bytes: AtomicU64,
    pub(crate) frames_sent: AtomicU64,
    pub(crate) frames_received: AtomicU64,
    pub(crate) conns_established: AtomicU64,
    pub(crate) conns_closed: AtomicU64,
    pub(crate) keepalives_sent: AtomicU64,
    pub(crate) loopback_failures: AtomicU64,
    pub(crate) hot_detaches: AtomicU64,
    pub(crate) splice_read_bytes: AtomicU64,
    pub(crate) splice_write_bytes: AtomicU64,
    pub(crate) splice_spills: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RuntimeStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RuntimeStats {
            socket_write_bytes: g(&self.socket_write_bytes),
            socket_read_bytes: g(&self.socket_read_bytes),
            inline_write_bytes: g(&self.inline_write_bytes),
            inline_read_bytes: g(&self.inline_read_bytes),
            discarded_bytes: g(&self.discarded_bytes),
            loopback_copy_bytes: g(&self.loopback_copy_bytes),
            eager_copy_bytes: g(&self.eager_copy_bytes),
            user_copy_bytes: g(&self.user_copy_bytes),
            frames_sent: g(&self.frames_sent),
            frames_received: g(&self.frames_received),
            conns_established: g(&self.conns_established),
            conns_closed: g(&self.conns_closed),
            keepalives_sent: g(&self.keepalives_sent),
            loopback_failures: g(&self.loopback_failures),
            hot_detaches: g(&self.hot_detaches),
            splice_read_bytes: g(&self.splice_read_bytes),
            splice_write_bytes: g(&self.splice_write_bytes),
            splice_spills: g(&self.splice_spills),
        }
    }
}
