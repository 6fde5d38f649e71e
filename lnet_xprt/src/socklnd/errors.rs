//! Socket errors as LNet health statuses (lnet.md §1.5 and §7; Lustre's
//! `ksocknal_txlist_done`, `ksocknal_process_transmit`,
//! `ksocknal_launch_packet`, `ksocknal_find_timed_out_conn`,
//! `ksocknal_process_receive` in `socklnd_cb.c`).
//!
//! What the health monitor does with each status is in
//! [`crate::health`]: `RemoteDropped` is resent, `LocalError`,
//! `RemoteError`, `RemoteTimeout` and `NetworkTimeout` are not.

use std::io::ErrorKind;

use crate::health::HealthStatus;

/// A socket error, in the terms Lustre's decisions use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SocketError {
    /// `ETIMEDOUT`.
    TimedOut,
    /// `ENETDOWN`.
    NetDown,
    /// `EHOSTUNREACH`.
    HostUnreachable,
    /// `ENETUNREACH`.
    NetUnreachable,
    /// `ECONNREFUSED`.
    ConnRefused,
    /// `ECONNRESET`.
    ConnReset,
    /// `ENOMEM` / out of buffers.
    NoMemory,
    /// The peer closed the connection (end of file).
    Eof,
    /// A protocol error on the connection (`EPROTO`, `EIO`).
    Protocol,
    /// Any other error, with its errno when known.
    Other(Option<i32>),
}

impl SocketError {
    /// From a Linux errno value (positive or negative).
    #[must_use]
    pub const fn from_errno(errno: i32) -> Self {
        match errno.unsigned_abs() {
            110 => Self::TimedOut,
            100 => Self::NetDown,
            113 => Self::HostUnreachable,
            101 => Self::NetUnreachable,
            111 => Self::ConnRefused,
            104 => Self::ConnReset,
            12 | 105 => Self::NoMemory,
            71 | 5 => Self::Protocol,
            _ => Self::Other(Some(errno)),
        }
    }

    /// From a [`std::io::ErrorKind`].
    #[must_use]
    pub fn from_io_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::TimedOut => Self::TimedOut,
            ErrorKind::NetworkDown => Self::NetDown,
            ErrorKind::HostUnreachable => Self::HostUnreachable,
            ErrorKind::NetworkUnreachable => Self::NetUnreachable,
            ErrorKind::ConnectionRefused => Self::ConnRefused,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => Self::ConnReset,
            ErrorKind::OutOfMemory => Self::NoMemory,
            ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe => Self::Eof,
            ErrorKind::InvalidData => Self::Protocol,
            _ => Self::Other(None),
        }
    }

    /// From an [`std::io::Error`]: its errno when it has one, else its kind.
    #[must_use]
    pub fn from_io_error(e: &std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(errno) => Self::from_errno(errno),
            None => Self::from_io_kind(e.kind()),
        }
    }
}

/// How an outgoing message failed in the socket LND.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TxFailure {
    /// The message waited (for a connection, or on one) and the connection
    /// failed or could not be made with this error (`ksocknal_txlist_done`).
    Queued(SocketError),
    /// Writing the message to its socket failed with this error
    /// (`ksocknal_process_transmit`).
    Send(SocketError),
    /// The message was queued, or its bytes sat unacknowledged in the
    /// socket, past `sock_timeout` (`ksocknal_find_timed_out_conn`,
    /// `ksocknal_flush_stale_txs`).
    Timeout,
    /// No connection or route to the peer could carry it
    /// (`ksocknal_launch_packet`: "No usable routes").
    NoConnection,
    /// The connection closed before the whole message was sent, without an
    /// error of its own (`ksocknal_tx_done` with bytes left).
    Incomplete,
}

impl TxFailure {
    /// The health status Lustre gives the message.
    #[must_use]
    pub const fn health_status(self) -> HealthStatus {
        match self {
            Self::Queued(SocketError::TimedOut) | Self::Timeout => HealthStatus::NetworkTimeout,
            Self::Queued(
                SocketError::NetDown
                | SocketError::HostUnreachable
                | SocketError::NetUnreachable
                | SocketError::ConnRefused
                | SocketError::ConnReset,
            ) => HealthStatus::RemoteDropped,
            Self::Send(SocketError::TimedOut) => HealthStatus::RemoteTimeout,
            Self::NoConnection => HealthStatus::RemoteError,
            Self::Queued(_) | Self::Send(_) | Self::Incomplete => HealthStatus::LocalError,
        }
    }
}

/// The health status of a message whose receipt fails (a checksum error,
/// or the connection failing while its payload comes in): `REMOTE_ERROR`.
pub const RECEIVE_FAILURE_STATUS: HealthStatus = HealthStatus::RemoteError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lustre_mapping() {
        use HealthStatus as H;
        use SocketError as E;
        let queued = [
            (E::TimedOut, H::NetworkTimeout),
            (E::NetDown, H::RemoteDropped),
            (E::HostUnreachable, H::RemoteDropped),
            (E::NetUnreachable, H::RemoteDropped),
            (E::ConnRefused, H::RemoteDropped),
            (E::ConnReset, H::RemoteDropped),
            (E::NoMemory, H::LocalError),
            (E::Eof, H::LocalError),
            (E::Protocol, H::LocalError),
            (E::Other(Some(22)), H::LocalError),
        ];
        for (e, h) in queued {
            assert_eq!(TxFailure::Queued(e).health_status(), h, "{e:?}");
        }
        assert_eq!(
            TxFailure::Send(E::TimedOut).health_status(),
            H::RemoteTimeout
        );
        assert_eq!(TxFailure::Send(E::ConnReset).health_status(), H::LocalError);
        assert_eq!(TxFailure::Send(E::NoMemory).health_status(), H::LocalError);
        assert_eq!(TxFailure::Timeout.health_status(), H::NetworkTimeout);
        assert_eq!(TxFailure::NoConnection.health_status(), H::RemoteError);
        assert_eq!(TxFailure::Incomplete.health_status(), H::LocalError);
        assert_eq!(RECEIVE_FAILURE_STATUS, H::RemoteError);
    }

    #[test]
    fn errno_and_io_kinds() {
        assert_eq!(SocketError::from_errno(110), SocketError::TimedOut);
        assert_eq!(SocketError::from_errno(-110), SocketError::TimedOut);
        assert_eq!(SocketError::from_errno(111), SocketError::ConnRefused);
        assert_eq!(SocketError::from_errno(104), SocketError::ConnReset);
        assert_eq!(SocketError::from_errno(113), SocketError::HostUnreachable);
        assert_eq!(SocketError::from_errno(101), SocketError::NetUnreachable);
        assert_eq!(SocketError::from_errno(100), SocketError::NetDown);
        assert_eq!(SocketError::from_errno(12), SocketError::NoMemory);
        assert_eq!(SocketError::from_errno(71), SocketError::Protocol);
        assert_eq!(SocketError::from_errno(22), SocketError::Other(Some(22)));
        assert_eq!(
            SocketError::from_errno(i32::MIN),
            SocketError::Other(Some(i32::MIN))
        );
        assert_eq!(
            SocketError::from_io_kind(ErrorKind::ConnectionRefused),
            SocketError::ConnRefused
        );
        assert_eq!(
            SocketError::from_io_kind(ErrorKind::UnexpectedEof),
            SocketError::Eof
        );
        assert_eq!(
            SocketError::from_io_kind(ErrorKind::NotFound),
            SocketError::Other(None)
        );
        let e = std::io::Error::from_raw_os_error(104);
        assert_eq!(SocketError::from_io_error(&e), SocketError::ConnReset);
        let e = std::io::Error::new(ErrorKind::TimedOut, "slow");
        assert_eq!(SocketError::from_io_error(&e), SocketError::TimedOut);
    }
}
