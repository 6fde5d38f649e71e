//! Errors of the runtime's API, with errno-like codes.

use colibri_lnet::ids::Nid;
use colibri_lnet::matching::{MatchError, MemKey};
use colibri_lnet::node::{NodeError, PingError};
use colibri_lnet::udsp::UdspError;

/// An error from the [`crate::Lnet`] API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LnetError {
    /// The node refused the call (bad handle, portal, target, option, …).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A [`colibri_lnet::matching::MemRef`] names no registered region, or
    /// a range beyond its end.
    #[error("memory {key:?} [{offset}, +{len}) is not a registered region or is out of its bounds")]
    BadMemory {
        /// The key.
        key: MemKey,
        /// The offset.
        offset: u64,
        /// The length.
        len: u32,
    },
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A socket could not be set up (listener, address).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A ping failed.
    #[error("ping of {nid} failed: {error}")]
    Ping {
        /// The pinged NID.
        nid: Nid,
        /// Why.
        error: PingError,
    },
    /// No answer in the time given.
    #[error("timed out")]
    TimedOut,
    /// The runtime is shut down.
    #[error("the LNet runtime is shut down")]
    Shutdown,
}

const EINVAL: i32 = 22;
const ENOENT: i32 = 2;
const EBUSY: i32 = 16;
const EEXIST: i32 = 17;
const EPROTO: i32 = 71;
const EPERM: i32 = 1;
const ETIMEDOUT: i32 = 110;
const ESHUTDOWN: i32 = 108;
const EIO: i32 = 5;
const EFAULT: i32 = 14;
const EHOSTUNREACH: i32 = 113;
const ENOSPC: i32 = 28;
const ENOTUNIQ: i32 = 76;
const EALREADY: i32 = 114;

impl LnetError {
    /// The (positive) Linux errno Lustre would return for this error.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::Node(e) => node_errno(e),
            Self::BadMemory { .. } => EFAULT,
            Self::Config(_) => EINVAL,
            Self::Io { source, .. } => source.raw_os_error().unwrap_or(EIO),
            Self::Ping { .. } => EHOSTUNREACH,
            Self::TimedOut => ETIMEDOUT,
            Self::Shutdown => ESHUTDOWN,
        }
    }
}

fn node_errno(e: &NodeError) -> i32 {
    match e {
        NodeError::Match(m) => match m {
            MatchError::NoSuchHandle => ENOENT,
            MatchError::MeBusy => EBUSY,
            MatchError::PortalKindMismatch(_) => EPERM,
            _ => EINVAL,
        },
        NodeError::Wire(_) | NodeError::Protocol(_) => EPROTO,
        NodeError::Peer(p) => {
            use colibri_lnet::peer::PeerError;
            // As Lustre's peer.c answers the same cases.
            match p {
                PeerError::Busy(_) | PeerError::Gateway { .. } => EBUSY,
                PeerError::NotFound(_) | PeerError::NoSuchPeer(_) | PeerError::NotInPeer { .. } => {
                    ENOENT
                }
                PeerError::NidInUse { .. } | PeerError::PrimaryLocked { .. } => EEXIST,
                PeerError::NotUnique { .. } => ENOTUNIQ,
                PeerError::MultiRailConflict { .. } => EPERM,
                PeerError::OwnerPrimaryLocked { .. } => EALREADY,
                _ => EINVAL,
            }
        }
        NodeError::NoSuchNi(_)
        | NodeError::NoSuchPeerNi(_)
        | NodeError::NoSuchTransmit(_)
        | NodeError::NoSuchRx(_) => ENOENT,
        NodeError::DuplicateNi(_) => EEXIST,
        NodeError::RoutingStopping => EBUSY,
        NodeError::Udsp(u) => match u {
            UdspError::Exists(_) => EALREADY,
            UdspError::NoSuchIndex(_) => ENOENT,
            UdspError::TooMany => ENOSPC,
            _ => EINVAL,
        },
        NodeError::TooManyNis(_) => ENOSPC,
        _ => EINVAL,
    }
}
