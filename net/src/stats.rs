//! Per-queue statistics.

use std::time::Duration;

use serde::Serialize;

/// Counters of one queue of a transfer machine.
///
/// Maintained under the transfer machine's lock and read (optionally with an
/// atomic reset) through [`crate::TmHandle::stats`]. No interpretation is
/// made here; upper layers (RPC formation) read the raw figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Successful adds.
    pub adds: u64,
    /// Deletions of queued buffers (by `del`, or by a stop that cancelled
    /// them).
    pub dels: u64,
    /// Successful completion events (including each message of a
    /// multi-message receive buffer).
    pub s_events: u64,
    /// Failed completion events, plus messages dropped because no receive
    /// buffer was available (MSG_RECV).
    pub f_events: u64,
    /// Bytes moved by successful events (received length for the receive
    /// queues, sent length for the others).
    pub bytes: u64,
    /// Largest single successful event, in bytes.
    pub max_bytes: u64,
    /// Total time buffers spent queued, counted when they leave the queue.
    pub time_in_queue: Duration,
    /// Longest time one buffer spent queued.
    pub max_time_in_queue: Duration,
}

impl QueueStats {
    /// Records an event; `len` counts only for successful ones, and
    /// `in_queue` only for final events (the buffer left the queue).
    pub(crate) fn record_event(&mut self, ok: bool, len: usize, in_queue: Option<Duration>) {
        if ok {
            self.s_events += 1;
            let len = len as u64;
            self.bytes += len;
            self.max_bytes = self.max_bytes.max(len);
        } else {
            self.f_events += 1;
        }
        if let Some(t) = in_queue {
            self.time_in_queue += t;
            self.max_time_in_queue = self.max_time_in_queue.max(t);
        }
    }

    /// Adds another queue's counters into this one (for totals).
    pub fn merge(&mut self, other: &Self) {
        self.adds += other.adds;
        self.dels += other.dels;
        self.s_events += other.s_events;
        self.f_events += other.f_events;
        self.bytes += other.bytes;
        self.max_bytes = self.max_bytes.max(other.max_bytes);
        self.time_in_queue += other.time_in_queue;
        self.max_time_in_queue = self.max_time_in_queue.max(other.max_time_in_queue);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_merge() {
        let mut s = QueueStats::default();
        s.record_event(true, 10, None);
        s.record_event(true, 30, Some(Duration::from_millis(2)));
        s.record_event(false, 99, Some(Duration::from_millis(5)));
        assert_eq!(
            (s.s_events, s.f_events, s.bytes, s.max_bytes),
            (2, 1, 40, 30)
        );
        assert_eq!(s.time_in_queue, Duration::from_millis(7));
        assert_eq!(s.max_time_in_queue, Duration::from_millis(5));
        let mut t = QueueStats::default();
        t.merge(&s);
        t.merge(&s);
        assert_eq!(t.bytes, 80);
        assert_eq!(t.max_bytes, 30);
    }
}
