//! Identifiers and small value types of transfer machines: they import
//! nothing from the rest of the crate.

use std::fmt;

/// Identifier of a transfer machine, unique in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TmId(pub u64);

impl fmt::Display for TmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tm{}", self.0)
    }
}

/// States of a transfer machine.
///
/// ```text
/// UNDEFINED -> INITIALIZED -> STARTING -> STARTED -> STOPPING -> STOPPED
///                   |             |  \                   ^          |
///                   |             |   `-> FAILED         |          v
///                   `-------------+----------------------'      UNDEFINED (fini)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmState {
    /// Finalised (or never initialised).
    Undefined,
    /// Initialised, not started. Message receive buffers may be added.
    Initialized,
    /// Start requested; STARTED or FAILED follows as an event.
    Starting,
    /// Operational.
    Started,
    /// Stop requested; STOPPED follows as an event once every buffer
    /// completed.
    Stopping,
    /// Stopped; may only be finalised.
    Stopped,
    /// Start failed; may only be finalised.
    Failed,
}

/// Parameters of a message receive buffer: how many messages it may hold.
///
/// The buffer stays queued after a message while it has at least
/// `min_receive_size` bytes left and has received fewer than
/// `max_receive_msgs` messages. The default is one message per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvParams {
    /// Space that must remain for the buffer to stay queued (at least 1).
    pub min_receive_size: usize,
    /// Most messages the buffer takes (at least 1).
    pub max_receive_msgs: u32,
}

impl Default for RecvParams {
    fn default() -> Self {
        Self::single()
    }
}

impl RecvParams {
    /// One message per buffer.
    pub const fn single() -> Self {
        Self {
            min_receive_size: 1,
            max_receive_msgs: 1,
        }
    }

    /// Up to `max_msgs` messages, while at least `min_size` bytes remain.
    pub const fn multi(min_size: usize, max_msgs: u32) -> Self {
        Self {
            min_receive_size: min_size,
            max_receive_msgs: max_msgs,
        }
    }
}

/// Identifies one add of a buffer: use it to cancel the operation
/// ([`TmHandle::del`](crate::TmHandle::del)) or to query its state. A token never matches a later
/// add of the same buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufToken {
    pub(crate) tm: u64,
    pub(crate) key: u64,
}

impl BufToken {
    /// The transfer machine of the add.
    pub fn tm(&self) -> TmId {
        TmId(self.tm)
    }

    /// The token as a number (what descriptors carry).
    pub fn raw(&self) -> u64 {
        self.key
    }
}
