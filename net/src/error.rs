//! Error types.
//!
//! One enum, [`NetError`], covers both the statuses that buffer completions
//! carry (`Cancelled`, `TimedOut`, `NoBuffers`, ...) and the reasons an API
//! call is refused. Every variant maps to the negative errno value a C
//! implementation (Motr's) would have used ([`NetError::errno`]), so logs
//! and wire statuses stay comparable with Motr's.
//!
//! Operations that take ownership of something hand it back when they fail:
//! [`AddError`] returns the buffer of a refused add, [`RegisterError`] the
//! memory of a refused registration and [`FiniError`] the object whose
//! finalisation was refused.

use std::fmt;
use std::io;

use crate::buffer::NetBuffer;
use crate::bufvec::BufVec;
use crate::queue::QueueType;
use crate::tm::TmState;

/// Result alias used throughout the crate.
pub type Result<T, E = NetError> = std::result::Result<T, E>;

/// Every error and failure status of the messaging layer.
///
/// `NetError` is cheap to clone and comparable, so completion statuses can be
/// matched in tests and copied into several events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The operation was cancelled (buffer deleted, or transfer machine
    /// stopped). `ECANCELED`.
    #[error("operation cancelled")]
    Cancelled,
    /// The buffer's timeout expired before the operation completed.
    /// `ETIMEDOUT`.
    #[error("operation timed out")]
    TimedOut,
    /// A buffer was added with a timeout that had already passed. `ETIME`.
    #[error("buffer timeout is already in the past")]
    TimeoutInPast,
    /// A message arrived and no receive buffer could take it. `ENOBUFS`.
    #[error("no receive buffer available")]
    NoBuffers,
    /// A message is larger than the receive buffer offered for it. `EMSGSIZE`.
    #[error("message of {len} bytes does not fit the receive buffer ({space} bytes)")]
    MessageTooLarge {
        /// Length of the message.
        len: usize,
        /// Space available in the receive buffer.
        space: usize,
    },
    /// A size limit was exceeded: a buffer larger than the transport allows,
    /// or a bulk transfer larger than the buffer on the other side. `EFBIG`.
    #[error("too big: {0}")]
    TooBig(String),
    /// The destination end point cannot be reached (no such transfer
    /// machine, or it is not started). `ENETUNREACH`.
    #[error("destination {0} unreachable")]
    Unreachable(String),
    /// The connection to the peer was reset or lost. `ECONNRESET`.
    #[error("connection reset: {0}")]
    ConnectionReset(String),
    /// A descriptor was used from a queue that does not pair with the queue
    /// it was made on (active receive needs a passive send descriptor, and
    /// active send a passive receive one). `EPERM`.
    #[error("descriptor made for {passive:?} cannot be used from {active:?}")]
    WrongQueue {
        /// Queue of the passive buffer the descriptor names.
        passive: QueueType,
        /// Queue the active buffer was added to.
        active: QueueType,
    },
    /// A descriptor was used by an end point it was not made for. `EACCES`.
    #[error("end point {requester} may not use a descriptor made for {allowed}")]
    AccessDenied {
        /// The end point that tried to use the descriptor.
        requester: String,
        /// The end point the descriptor was made for.
        allowed: String,
    },
    /// A descriptor names a buffer that is no longer queued (completed,
    /// cancelled, re-added) or never existed. `ENOENT`.
    #[error("descriptor names no queued buffer (stale or forged)")]
    NoEntry,
    /// A descriptor could not be decoded: wrong size, bad magic, version,
    /// checksum or transport. `EINVAL`.
    #[error("invalid descriptor: {0}")]
    InvalidDescriptor(String),
    /// An address string could not be parsed by the transport. `EINVAL`.
    #[error("invalid address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// Why it was refused.
        reason: String,
    },
    /// An argument is out of range (zero length, receive parameters that
    /// cannot work, an empty buffer vector, ...). `EINVAL`.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The address is already used by another transfer machine. `EADDRINUSE`.
    #[error("address {0} already in use")]
    AddrInUse(String),
    /// The object is busy: a domain with transfer machines or buffers, a
    /// transfer machine with queued buffers, end points or undelivered
    /// events. `EBUSY`.
    #[error("busy: {0}")]
    Busy(String),
    /// The operation is not allowed in the transfer machine's current state.
    /// `EINVAL` in Motr, a distinct kind here.
    #[error("{op} not allowed in transfer machine state {state:?}")]
    WrongState {
        /// The refused operation.
        op: &'static str,
        /// The state the transfer machine was in.
        state: TmState,
    },
    /// The buffer belongs to another domain than the transfer machine. `EINVAL`.
    #[error("buffer registered with another domain")]
    WrongDomain,
    /// The end point belongs to another transfer machine. `EINVAL`.
    #[error("end point {0} belongs to another transfer machine")]
    ForeignEndPoint(String),
    /// No callback is set for the queue the buffer was added to. `EINVAL`.
    #[error("no callback set for queue {0:?}")]
    NoCallback(QueueType),
    /// The transport does not support this optional operation. `ENOSYS`.
    #[error("not supported by transport {transport}: {what}")]
    Unsupported {
        /// Name of the transport.
        transport: &'static str,
        /// The missing capability.
        what: &'static str,
    },
    /// The API was used in a way its contract forbids (for example, calling
    /// into the transfer machine while reading a buffer through an event's
    /// data view). The message says what was wrong.
    #[error("API misuse: {0}")]
    ApiMisuse(String),
    /// The peer violated the wire protocol. `EPROTO`.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An operating-system error. `EIO` or the OS error's own code.
    #[error("I/O error ({kind:?}): {message}")]
    Io {
        /// The error kind of the original [`io::Error`].
        kind: io::ErrorKind,
        /// Its text.
        message: String,
    },
}

impl NetError {
    /// The negative errno value a C implementation would report.
    pub fn errno(&self) -> i32 {
        // Values are Linux's; they are only used for display and for wire
        // statuses, never passed to the OS.
        -match self {
            Self::Cancelled => 125,             // ECANCELED
            Self::TimedOut => 110,              // ETIMEDOUT
            Self::TimeoutInPast => 62,          // ETIME
            Self::NoBuffers => 105,             // ENOBUFS
            Self::MessageTooLarge { .. } => 90, // EMSGSIZE
            Self::TooBig(_) => 27,              // EFBIG
            Self::Unreachable(_) => 101,        // ENETUNREACH
            Self::ConnectionReset(_) => 104,    // ECONNRESET
            Self::WrongQueue { .. } => 1,       // EPERM
            Self::AccessDenied { .. } => 13,    // EACCES
            Self::NoEntry => 2,                 // ENOENT
            Self::InvalidDescriptor(_)
            | Self::InvalidAddress { .. }
            | Self::InvalidArgument(_)
            | Self::WrongState { .. }
            | Self::WrongDomain
            | Self::ForeignEndPoint(_)
            | Self::NoCallback(_)
            | Self::ApiMisuse(_) => 22, // EINVAL
            Self::AddrInUse(_) => 98,           // EADDRINUSE
            Self::Busy(_) => 16,                // EBUSY
            Self::Unsupported { .. } => 38,     // ENOSYS
            Self::Protocol(_) => 71,            // EPROTO
            Self::Io { .. } => 5,               // EIO
        }
    }

    /// Builds a [`NetError::Io`] from an I/O error.
    pub fn io(err: &io::Error) -> Self {
        Self::Io {
            kind: err.kind(),
            message: err.to_string(),
        }
    }

    /// True for the statuses a buffer completion carries when the
    /// application (or a stop) cancelled it.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled)
    }
}

impl From<io::Error> for NetError {
    fn from(err: io::Error) -> Self {
        Self::io(&err)
    }
}

impl From<NetError> for io::Error {
    fn from(err: NetError) -> Self {
        let kind = match &err {
            NetError::Cancelled => io::ErrorKind::Interrupted,
            NetError::TimedOut | NetError::TimeoutInPast => io::ErrorKind::TimedOut,
            NetError::NoBuffers => io::ErrorKind::OutOfMemory,
            NetError::Unreachable(_) => io::ErrorKind::NetworkUnreachable,
            NetError::ConnectionReset(_) => io::ErrorKind::ConnectionReset,
            NetError::WrongQueue { .. } | NetError::AccessDenied { .. } => {
                io::ErrorKind::PermissionDenied
            }
            NetError::NoEntry => io::ErrorKind::NotFound,
            NetError::AddrInUse(_) => io::ErrorKind::AddrInUse,
            NetError::Busy(_) => io::ErrorKind::ResourceBusy,
            NetError::Unsupported { .. } => io::ErrorKind::Unsupported,
            NetError::Io { kind, .. } => *kind,
            NetError::MessageTooLarge { .. } | NetError::TooBig(_) => io::ErrorKind::FileTooLarge,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, err)
    }
}

/// A refused [`add`](crate::TmHandle::add): the reason, and the buffer handed
/// back to the caller untouched.
#[derive(thiserror::Error)]
#[error("buffer add refused: {error}")]
pub struct AddError {
    /// Why the add was refused.
    pub error: NetError,
    /// The buffer, back in the caller's hands.
    pub buffer: NetBuffer,
}

impl fmt::Debug for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddError")
            .field("error", &self.error)
            .field("buffer", &self.buffer)
            .finish()
    }
}

impl AddError {
    /// Splits the error into its reason and the returned buffer.
    pub fn into_parts(self) -> (NetError, NetBuffer) {
        (self.error, self.buffer)
    }
}

/// A refused [`register`](crate::Domain::register): the reason and the
/// memory handed back.
#[derive(Debug, thiserror::Error)]
#[error("buffer registration refused: {error}")]
pub struct RegisterError {
    /// Why the registration was refused.
    pub error: NetError,
    /// The memory, back in the caller's hands.
    pub bufvec: BufVec,
}

/// A refused finalisation: the reason and the object, still usable, handed
/// back so that the caller can fix the cause and try again.
#[derive(thiserror::Error)]
#[error("finalisation refused: {error}")]
pub struct FiniError<T> {
    /// Why finalisation was refused.
    pub error: NetError,
    /// The object, unchanged.
    pub object: T,
}

impl<T: fmt::Debug> fmt::Debug for FiniError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FiniError")
            .field("error", &self.error)
            .field("object", &self.object)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_match_linux() {
        assert_eq!(NetError::Cancelled.errno(), -125);
        assert_eq!(NetError::TimedOut.errno(), -110);
        assert_eq!(NetError::TimeoutInPast.errno(), -62);
        assert_eq!(NetError::NoBuffers.errno(), -105);
        assert_eq!(NetError::NoEntry.errno(), -2);
        assert_eq!(
            NetError::WrongQueue {
                passive: QueueType::PassiveBulkRecv,
                active: QueueType::ActiveBulkRecv
            }
            .errno(),
            -1
        );
    }

    #[test]
    fn converts_to_io_error_with_kind() {
        let e: io::Error = NetError::TimedOut.into();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let e: io::Error = NetError::Unreachable("x".into()).into();
        assert_eq!(e.kind(), io::ErrorKind::NetworkUnreachable);
    }
}
