//! The six buffer queues of a transfer machine.

use serde::{Deserialize, Serialize};

/// The logical queue a buffer is added to. The queue decides the operation
/// performed on the buffer.
///
/// The queues are not FIFOs: completion order is arbitrary. They are the
/// sets of buffers a transfer machine currently owns, by purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QueueType {
    /// Buffers waiting for unsolicited messages.
    MsgRecv,
    /// Messages to send to an end point.
    MsgSend,
    /// Memory a remote transfer machine will write into (it does an active
    /// bulk send against this buffer's descriptor).
    PassiveBulkRecv,
    /// Memory a remote transfer machine will read from (it does an active
    /// bulk receive against this buffer's descriptor).
    PassiveBulkSend,
    /// Memory this transfer machine reads into from a remote passive send
    /// buffer named by a descriptor.
    ActiveBulkRecv,
    /// Memory this transfer machine writes from into a remote passive
    /// receive buffer named by a descriptor.
    ActiveBulkSend,
}

impl QueueType {
    /// Number of queues.
    pub const COUNT: usize = 6;

    /// All queues, in index order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::MsgRecv,
        Self::MsgSend,
        Self::PassiveBulkRecv,
        Self::PassiveBulkSend,
        Self::ActiveBulkRecv,
        Self::ActiveBulkSend,
    ];

    /// Index of the queue in per-queue arrays (0..6).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The queue with the given index, if it is in range.
    pub const fn from_index(i: usize) -> Option<Self> {
        if i < Self::COUNT {
            Some(Self::ALL[i])
        } else {
            None
        }
    }

    /// Wire code of the queue (used in descriptors): index + 1, so that a
    /// zeroed field is never a valid queue.
    pub const fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The queue of a wire code, if valid.
    pub const fn from_code(code: u8) -> Option<Self> {
        if code == 0 {
            None
        } else {
            Self::from_index(code as usize - 1)
        }
    }

    /// True for the passive bulk queues (adding to them produces a
    /// descriptor).
    pub const fn is_passive(self) -> bool {
        matches!(self, Self::PassiveBulkRecv | Self::PassiveBulkSend)
    }

    /// True for the active bulk queues (adding to them needs a descriptor).
    pub const fn is_active(self) -> bool {
        matches!(self, Self::ActiveBulkRecv | Self::ActiveBulkSend)
    }

    /// True for the queues whose buffers receive data (message receive,
    /// passive and active bulk receive): their completion events report the
    /// received length.
    pub const fn is_recv(self) -> bool {
        matches!(
            self,
            Self::MsgRecv | Self::PassiveBulkRecv | Self::ActiveBulkRecv
        )
    }

    /// For an active queue, the passive queue its descriptors must come
    /// from; for a passive queue, the active queue that may use its
    /// descriptors. `None` for the message queues.
    pub const fn bulk_peer(self) -> Option<Self> {
        match self {
            Self::ActiveBulkRecv => Some(Self::PassiveBulkSend),
            Self::ActiveBulkSend => Some(Self::PassiveBulkRecv),
            Self::PassiveBulkSend => Some(Self::ActiveBulkRecv),
            Self::PassiveBulkRecv => Some(Self::ActiveBulkSend),
            Self::MsgRecv | Self::MsgSend => None,
        }
    }

    /// Short lower-case name, for logs and tables.
    pub const fn name(self) -> &'static str {
        match self {
            Self::MsgRecv => "msg-recv",
            Self::MsgSend => "msg-send",
            Self::PassiveBulkRecv => "passive-bulk-recv",
            Self::PassiveBulkSend => "passive-bulk-send",
            Self::ActiveBulkRecv => "active-bulk-recv",
            Self::ActiveBulkSend => "active-bulk-send",
        }
    }
}

impl std::fmt::Display for QueueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_zero_is_invalid() {
        for q in QueueType::ALL {
            assert_eq!(QueueType::from_code(q.code()), Some(q));
            assert_eq!(QueueType::from_index(q.index()), Some(q));
        }
        assert_eq!(QueueType::from_code(0), None);
        assert_eq!(QueueType::from_code(7), None);
    }

    #[test]
    fn bulk_pairing_is_symmetric() {
        for q in QueueType::ALL {
            if let Some(p) = q.bulk_peer() {
                assert_eq!(p.bulk_peer(), Some(q));
                assert_ne!(p.is_active(), q.is_active());
            }
        }
    }
}
