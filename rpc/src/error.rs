//! The error type of the RPC layer.
//!
//! [`RpcError`] covers local refusals (bad arguments, a machine shutting
//! down, an item too large for a message), transport failures (wrapping
//! [`NetError`]), and failures the server reports in its reply. Failures
//! that cross the wire travel as a signed 32-bit status: `0` for success,
//! the negative errno value of the variant otherwise
//! ([`RpcError::errno`], [`RpcError::from_status`]); handlers may also
//! return their own codes ([`RpcError::Remote`]).

use std::fmt;
use std::io;

use colibri_net::NetError;

/// Result alias of this crate.
pub type Result<T, E = RpcError> = std::result::Result<T, E>;

/// Wire status of a server that does not know the request's opcode.
pub const STATUS_UNKNOWN_OPCODE: i32 = -38; // ENOSYS
/// Wire status of a request the server could not decode.
pub const STATUS_PROTOCOL: i32 = -71; // EPROTO
/// Wire status of a resent request whose reply left the reply cache.
pub const STATUS_STALE: i32 = -116; // ESTALE
/// Wire status of a request whose handler dropped its reply handle.
pub const STATUS_NO_REPLY: i32 = -61; // ENODATA
/// Wire status of a request refused because the server is stopping.
pub const STATUS_SHUTDOWN: i32 = -108; // ESHUTDOWN
/// Wire status of a request whose payload failed to decode as the
/// handler's type.
pub const STATUS_INVALID: i32 = -22; // EINVAL
/// Wire status of a request refused because the server has as many
/// sessions as it takes (`RpcConfig::max_sessions`).
pub const STATUS_BUSY: i32 = -16; // EBUSY

/// Every failure of the RPC layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The messaging layer failed (the message could not be sent, a bulk
    /// transfer failed, the peer is unreachable, ...).
    #[error("transport: {0}")]
    Net(#[from] NetError),
    /// No reply came within the call's timeout (after every resend).
    /// `ETIMEDOUT`.
    #[error("call timed out")]
    TimedOut,
    /// The call was cancelled. `ECANCELED`.
    #[error("call cancelled")]
    Cancelled,
    /// The RPC machine is shutting down or has stopped. `ESHUTDOWN`.
    #[error("RPC machine shut down")]
    Shutdown,
    /// The server has no handler for the opcode. `ENOSYS`.
    #[error("server has no handler for opcode {0}")]
    UnknownOpcode(u32),
    /// A peer sent something that is not a valid RPC message, or reported
    /// that we did. `EPROTO`.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An item does not fit in one message; send the data through bulk
    /// instead. `EMSGSIZE`.
    #[error(
        "item of {len} bytes does not fit in a message (at most {max} bytes); send it with bulk"
    )]
    TooBig {
        /// Encoded size of the item.
        len: usize,
        /// Largest item a message can carry.
        max: usize,
    },
    /// A resent request's reply was evicted from the server's reply cache;
    /// the request was not executed again. `ESTALE`.
    #[error("reply no longer in the server's reply cache (request not re-executed)")]
    Stale,
    /// The server has as many client sessions as it takes
    /// (`RpcConfig::max_sessions`) and refused this one's request. `EBUSY`.
    #[error("server busy: too many client sessions")]
    Busy,
    /// A message of the session failed for good (the transport's failure
    /// is given), or its receiver stopped acknowledging, so the session
    /// restarted its message sequence; this call's request was in a
    /// message the server may or may not have handled. `ECONNABORTED`.
    #[error(
        "session restarted its message sequence ({0}): the request may or may not have been handled"
    )]
    SessionReset(String),
    /// The server's handler dropped its reply handle without replying.
    /// `ENODATA`.
    #[error("server handler finished without replying")]
    NoReply,
    /// The server's handler failed with this status.
    #[error("server handler failed with status {0}")]
    Remote(i32),
    /// A typed payload could not be encoded or decoded. `EINVAL`.
    #[error("codec: {0}")]
    Codec(String),
    /// An argument is out of range. `EINVAL`.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The API was used against its contract (a handle polled after it
    /// completed, a result taken twice, ...). `EINVAL`.
    #[error("API misuse: {0}")]
    ApiMisuse(String),
}

/// `Ok` when the calling thread may block; `ApiMisuse` naming `what` and
/// the fix on a thread that delivers events (a transport thread running a
/// handler or a callback, the machine's timer thread).
pub(crate) fn check_may_block(what: &str) -> Result<()> {
    if colibri_net::wait::on_delivery_thread() {
        return Err(RpcError::ApiMisuse(blocked_text(what)));
    }
    Ok(())
}

fn blocked_text(what: &str) -> String {
    format!(
        "{what} would block a thread that delivers events (a transport thread running \
         a handler or a callback, or the machine's timer thread): the completion it \
         waits for may need this very thread. Register the handler with \
         RpcHandle::on_blocking (it runs on the handler pool, where waiting is allowed) \
         or RpcHandle::on_async and .await the operation, or use on_complete"
    )
}

/// A blocking wait refused because the calling thread delivers events
/// (see [`RpcHandle::on_blocking`](crate::RpcHandle::on_blocking)): the
/// operation goes on, and its handle comes back in
/// [`BlockedWait::handle`] so that nothing it holds is lost. Converts
/// into [`RpcError::ApiMisuse`] (with `?`), dropping the handle.
pub struct BlockedWait<T> {
    /// The handle whose wait was refused.
    pub handle: T,
    what: &'static str,
}

impl<T> BlockedWait<T> {
    pub(crate) fn new(handle: T, what: &'static str) -> Self {
        Self { handle, what }
    }

    /// The handle back.
    pub fn into_handle(self) -> T {
        self.handle
    }

    /// The failure, as an [`RpcError::ApiMisuse`].
    pub fn error(&self) -> RpcError {
        RpcError::ApiMisuse(blocked_text(self.what))
    }
}

impl<T> fmt::Debug for BlockedWait<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockedWait")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for BlockedWait<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "API misuse: {}", blocked_text(self.what))
    }
}

impl<T> std::error::Error for BlockedWait<T> {}

impl<T> From<BlockedWait<T>> for RpcError {
    fn from(b: BlockedWait<T>) -> Self {
        b.error()
    }
}

impl RpcError {
    /// The negative errno value of the failure (the wire status).
    pub fn errno(&self) -> i32 {
        match self {
            Self::Net(e) => e.errno(),
            Self::TimedOut => -110,
            Self::Cancelled => -125,
            Self::Shutdown => STATUS_SHUTDOWN,
            Self::UnknownOpcode(_) => STATUS_UNKNOWN_OPCODE,
            Self::Protocol(_) => STATUS_PROTOCOL,
            Self::TooBig { .. } => -90,
            Self::Stale => STATUS_STALE,
            Self::NoReply => STATUS_NO_REPLY,
            Self::Busy => STATUS_BUSY,
            Self::SessionReset(_) => -103,
            Self::Remote(s) => *s,
            Self::Codec(_) | Self::InvalidArgument(_) | Self::ApiMisuse(_) => STATUS_INVALID,
        }
    }

    /// The failure a reply's nonzero `status` stands for.
    pub fn from_status(status: i32, opcode: u32) -> Self {
        match status {
            STATUS_UNKNOWN_OPCODE => Self::UnknownOpcode(opcode),
            STATUS_PROTOCOL => Self::Protocol("the server could not decode the request".into()),
            STATUS_STALE => Self::Stale,
            STATUS_NO_REPLY => Self::NoReply,
            STATUS_SHUTDOWN => Self::Shutdown,
            STATUS_BUSY => Self::Busy,
            s => Self::Remote(s),
        }
    }

    /// True for failures after which the peer is presumed gone (every
    /// call to it fails at once rather than waiting for its timeout).
    pub fn peer_gone(&self) -> bool {
        matches!(
            self,
            Self::Net(NetError::Unreachable(_) | NetError::ConnectionReset(_))
        )
    }
}

impl From<colibri_net::AddError> for RpcError {
    fn from(e: colibri_net::AddError) -> Self {
        Self::Net(e.error)
    }
}

impl From<colibri_net::RegisterError> for RpcError {
    fn from(e: colibri_net::RegisterError) -> Self {
        Self::Net(e.error)
    }
}

impl From<RpcError> for io::Error {
    fn from(err: RpcError) -> Self {
        match err {
            RpcError::Net(e) => e.into(),
            RpcError::TimedOut => io::Error::new(io::ErrorKind::TimedOut, err),
            RpcError::Cancelled => io::Error::new(io::ErrorKind::Interrupted, err),
            RpcError::Shutdown => io::Error::new(io::ErrorKind::NotConnected, err),
            RpcError::UnknownOpcode(_) => io::Error::new(io::ErrorKind::Unsupported, err),
            RpcError::TooBig { .. } => io::Error::new(io::ErrorKind::FileTooLarge, err),
            RpcError::Protocol(_) | RpcError::Codec(_) => {
                io::Error::new(io::ErrorKind::InvalidData, err)
            }
            _ => io::Error::other(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for e in [
            RpcError::UnknownOpcode(7),
            RpcError::Stale,
            RpcError::NoReply,
            RpcError::Shutdown,
            RpcError::Busy,
            RpcError::Remote(-5),
            RpcError::Remote(42),
        ] {
            assert_eq!(RpcError::from_status(e.errno(), 7), e);
        }
        assert_eq!(RpcError::TimedOut.errno(), -110);
        assert!(RpcError::Net(NetError::Unreachable("x".into())).peer_gone());
        assert!(!RpcError::TimedOut.peer_gone());
        let io: io::Error = RpcError::TimedOut.into();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
    }
}
