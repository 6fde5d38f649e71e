//! Per-session ordering, receive side: the reorder window of one session
//! and direction, and its acknowledgement state. Epochs of the send side.
//!
//! Messages of one session and direction carry `(epoch, seq, low)` (see
//! [`crate::wire`]). [`Inbound`] hands them out strictly in sequence
//! order, each once: a message ahead of a missing one is held (at most
//! [`MAX_WINDOW`] sequence numbers ahead), a message already received is a
//! duplicate, a message of an older epoch is stale, and a newer epoch
//! restarts the sequence at its `low`. [`AckState`] tracks what has been
//! handed out and what the peer was told.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::wire::MAX_WINDOW;

/// A new sequence epoch: larger than every epoch this process made before
/// and, as long as the wall clock does not step back across a restart,
/// than those of earlier processes (nanoseconds since 1970, bumped past
/// the last one).
pub(crate) fn new_epoch() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX >> 1));
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let e = now.max(last + 1);
        match LAST.compare_exchange_weak(last, e, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return e,
            Err(l) => last = l,
        }
    }
}

/// The current time, read from the clock at most once and only when
/// needed (clock reads are a measurable part of a round trip here).
#[derive(Debug, Default)]
pub(crate) struct Now(Option<Instant>);

impl Now {
    /// Not read yet.
    pub(crate) fn lazy() -> Self {
        Self(None)
    }

    /// Already known.
    pub(crate) fn at(t: Instant) -> Self {
        Self(Some(t))
    }

    /// The time (read now if it was not yet).
    pub(crate) fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// What became of a message offered to an [`Inbound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// In order: ready to be handed out, with the held messages it
    /// unblocked.
    Ready,
    /// Ahead of a missing message: held until the gap fills.
    Held,
    /// Received before (or given up on): dropped.
    Duplicate,
    /// From an epoch older than the current one: dropped.
    Stale,
    /// [`MAX_WINDOW`] or more ahead of the missing message: dropped.
    OutOfWindow,
}

/// What the receiver has handed out and acknowledged, in its current
/// epoch.
#[derive(Debug, Default)]
pub(crate) struct AckState {
    epoch: u64,
    /// Highest sequence number handed out (all below it were too).
    delivered: u64,
    /// Highest sequence number acknowledged to the peer.
    acked: u64,
    /// Highest sequence number whose message asked for an immediate
    /// acknowledgement.
    wanted: u64,
    /// When a delayed acknowledgement is due.
    pub(crate) due: Option<Instant>,
}

impl AckState {
    /// The acknowledgement to put in an outgoing message, if any.
    pub(crate) fn current(&self) -> Option<(u64, u64)> {
        (self.delivered > 0).then_some((self.epoch, self.delivered))
    }

    /// Records that [`AckState::current`] went out.
    pub(crate) fn sent(&mut self) {
        self.acked = self.delivered;
        self.due = None;
    }

    /// A message that carried an acknowledgement was lost: the next one
    /// must carry it again.
    pub(crate) fn lost(&mut self) {
        self.acked = 0;
    }

    /// Something handed out has not been acknowledged.
    pub(crate) fn pending(&self) -> bool {
        self.delivered > self.acked
    }

    /// The peer asked for an acknowledgement of a message now handed out.
    pub(crate) fn urgent(&self) -> bool {
        self.wanted > self.acked && self.delivered >= self.wanted
    }
}

/// The receive side of one session and direction.
#[derive(Debug)]
pub(crate) struct Inbound<T> {
    epoch: u64,
    expected: u64,
    held: BTreeMap<u64, T>,
    /// Since when the oldest gap has blocked held messages.
    gap_since: Option<Instant>,
    ready: VecDeque<(u64, u64, T)>,
    /// A thread is handing out this session's messages (one at a time,
    /// so that handlers of one session never run concurrently).
    pub(crate) dispatching: bool,
    /// Acknowledgement state.
    pub(crate) ack: AckState,
}

impl<T> Default for Inbound<T> {
    fn default() -> Self {
        Self {
            epoch: 0,
            expected: 1,
            held: BTreeMap::new(),
            gap_since: None,
            ready: VecDeque::new(),
            dispatching: false,
            ack: AckState::default(),
        }
    }
}

impl<T> Inbound<T> {
    /// A sequence that has already handed out `epoch` up to `seq` (to
    /// acknowledge messages refused without keeping any state).
    pub(crate) fn acknowledging(epoch: u64, seq: u64) -> Self {
        let mut s = Self::default();
        s.switch(epoch, seq + 1);
        s.ack.delivered = seq;
        s
    }

    fn switch(&mut self, epoch: u64, low: u64) -> usize {
        let dropped = self.held.len();
        self.held.clear();
        self.gap_since = None;
        self.epoch = epoch;
        self.expected = low;
        self.ack = AckState {
            epoch,
            due: self.ack.due,
            ..AckState::default()
        };
        dropped
    }

    fn release(&mut self, now: &mut Now) {
        if self.held.is_empty() {
            self.gap_since = None;
            return;
        }
        while let Some(m) = self.held.remove(&self.expected) {
            self.ready.push_back((self.epoch, self.expected, m));
            self.expected += 1;
        }
        // Progress restarts the gap clock.
        self.gap_since = (!self.held.is_empty()).then(|| now.get());
    }

    /// Offers message `(epoch, seq)` whose sender has every message below
    /// `low` acknowledged. Returns what became of it and how many held
    /// messages of an older epoch were dropped because of it.
    pub(crate) fn offer(
        &mut self,
        epoch: u64,
        seq: u64,
        low: u64,
        ack_now: bool,
        msg: T,
        now: &mut Now,
    ) -> (Offer, usize) {
        let mut dropped = 0;
        if epoch < self.epoch {
            return (Offer::Stale, 0);
        }
        if epoch > self.epoch {
            // A new sequence (or the first one we see): everything below
            // `low` was handed out by an earlier state of ours.
            dropped = self.switch(epoch, low);
        } else if low > self.expected {
            // The peer has acknowledgements we never sent (our state was
            // lost and rebuilt): trust them.
            self.held.retain(|&s, _| s >= low);
            self.expected = low;
            self.release(now);
        }
        if seq < self.expected {
            return (Offer::Duplicate, dropped);
        }
        if seq - self.expected >= MAX_WINDOW {
            return (Offer::OutOfWindow, dropped);
        }
        if ack_now {
            self.ack.wanted = self.ack.wanted.max(seq);
        }
        if seq > self.expected {
            if self.held.contains_key(&seq) {
                return (Offer::Duplicate, dropped);
            }
            self.held.insert(seq, msg);
            if self.gap_since.is_none() {
                self.gap_since = Some(now.get());
            }
            return (Offer::Held, dropped);
        }
        self.ready.push_back((self.epoch, seq, msg));
        self.expected += 1;
        self.release(now);
        (Offer::Ready, dropped)
    }

    /// Takes the next message ready to be handed out, and counts it as
    /// delivered (for acknowledgements).
    pub(crate) fn pop_ready(&mut self) -> Option<T> {
        let (e, s, m) = self.ready.pop_front()?;
        if e == self.ack.epoch {
            self.ack.delivered = self.ack.delivered.max(s);
        }
        Some(m)
    }

    /// Takes every message ready to be handed out, in order (as
    /// [`Inbound::pop_ready`]).
    #[cfg(test)]
    pub(crate) fn take_ready(&mut self) -> Vec<T> {
        std::iter::from_fn(|| self.pop_ready()).collect()
    }

    /// True when messages wait to be handed out.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Messages held behind a gap.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// When the oldest gap must be given up on.
    pub(crate) fn gap_deadline(&self, timeout: std::time::Duration) -> Option<Instant> {
        self.gap_since.map(|t| t + timeout)
    }

    /// Gives up on the missing messages before the first held one: the
    /// held messages become ready. Returns how many sequence numbers were
    /// skipped.
    pub(crate) fn skip_gap(&mut self, now: Instant) -> u64 {
        let Some(&first) = self.held.keys().next() else {
            return 0;
        };
        let skipped = first - self.expected;
        self.expected = first;
        self.release(&mut Now::at(now));
        skipped
    }

    /// Nothing held, ready or being handed out.
    pub(crate) fn is_idle(&self) -> bool {
        self.held.is_empty() && self.ready.is_empty() && !self.dispatching
    }

    /// Forgets everything (shutdown).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.ready.clear();
        self.gap_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn in_order_held_duplicates() {
        let now = t0();
        let mut i = Inbound::default();
        assert_eq!(
            i.offer(5, 2, 1, false, 'b', &mut Now::at(now)),
            (Offer::Held, 0)
        );
        assert_eq!(
            i.offer(5, 2, 1, false, 'b', &mut Now::at(now)),
            (Offer::Duplicate, 0)
        );
        assert_eq!(i.gap_deadline(std::time::Duration::ZERO), Some(now));
        assert!(!i.has_ready());
        assert_eq!(
            i.offer(5, 1, 1, false, 'a', &mut Now::at(now)),
            (Offer::Ready, 0)
        );
        assert_eq!(i.take_ready(), vec!['a', 'b']);
        assert_eq!(i.ack.current(), Some((5, 2)));
        assert!(i.ack.pending() && !i.ack.urgent());
        assert_eq!(
            i.offer(5, 1, 1, false, 'a', &mut Now::at(now)),
            (Offer::Duplicate, 0)
        );
        assert_eq!(
            i.offer(4, 3, 1, false, 'x', &mut Now::at(now)),
            (Offer::Stale, 0)
        );
        assert_eq!(
            i.offer(5, 3 + MAX_WINDOW, 1, false, 'x', &mut Now::at(now)),
            (Offer::OutOfWindow, 0)
        );
        assert_eq!(i.gap_deadline(std::time::Duration::ZERO), None);
        i.ack.sent();
        assert!(!i.ack.pending());
    }

    #[test]
    fn new_epoch_drops_held_and_starts_at_low() {
        let now = t0();
        let mut i = Inbound::default();
        i.offer(1, 1, 1, false, 1, &mut Now::at(now));
        i.offer(1, 3, 1, false, 3, &mut Now::at(now));
        assert_eq!(i.held(), 1);
        // Ready messages of the old epoch stay; held ones go.
        assert_eq!(
            i.offer(2, 2, 1, false, 22, &mut Now::at(now)),
            (Offer::Held, 1)
        );
        assert_eq!(
            i.offer(2, 1, 1, false, 21, &mut Now::at(now)),
            (Offer::Ready, 0)
        );
        assert_eq!(i.take_ready(), vec![1, 21, 22]);
        assert_eq!(i.ack.current(), Some((2, 2)));
        // The old epoch is stale now.
        assert_eq!(
            i.offer(1, 2, 1, false, 2, &mut Now::at(now)),
            (Offer::Stale, 0)
        );
        // A fresh receiver of a sequence acknowledged up to 40 starts at
        // 41.
        let mut f = Inbound::default();
        assert_eq!(
            f.offer(9, 42, 41, false, 42, &mut Now::at(now)),
            (Offer::Held, 0)
        );
        assert_eq!(
            f.offer(9, 41, 41, false, 41, &mut Now::at(now)),
            (Offer::Ready, 0)
        );
        assert_eq!(f.take_ready(), vec![41, 42]);
        // A low beyond what we handed out (state rebuilt) is trusted.
        assert_eq!(
            f.offer(9, 50, 45, false, 50, &mut Now::at(now)),
            (Offer::Held, 0)
        );
        assert_eq!(
            f.offer(9, 44, 44, false, 44, &mut Now::at(now)),
            (Offer::Duplicate, 0)
        );
        assert_eq!(
            f.offer(9, 46, 46, false, 46, &mut Now::at(now)),
            (Offer::Ready, 0)
        );
        assert_eq!(f.take_ready(), vec![46]);
        assert_eq!(f.held(), 1);
        assert_eq!(f.skip_gap(now), 3);
        assert_eq!(f.take_ready(), vec![50]);
        assert!(f.is_idle());
    }

    #[test]
    fn urgent_acknowledgement_once_handed_out() {
        let now = t0();
        let mut i = Inbound::default();
        i.offer(1, 2, 1, true, (), &mut Now::at(now));
        assert!(!i.ack.urgent(), "the flagged message is still held");
        i.offer(1, 1, 1, false, (), &mut Now::at(now));
        i.take_ready();
        assert!(i.ack.urgent());
        i.ack.sent();
        assert!(!i.ack.urgent());
        let a = Inbound::<()>::acknowledging(7, 9);
        assert_eq!(a.ack.current(), Some((7, 9)));
    }

    #[test]
    fn gap_skip_hands_out_held_messages() {
        let now = t0();
        let mut i = Inbound::default();
        i.offer(1, 1, 1, false, 1, &mut Now::at(now));
        i.offer(1, 4, 1, false, 4, &mut Now::at(now));
        i.offer(1, 5, 1, false, 5, &mut Now::at(now));
        i.offer(1, 7, 1, false, 7, &mut Now::at(now));
        assert_eq!(i.take_ready(), vec![1]);
        assert_eq!(i.skip_gap(now), 2);
        assert_eq!(i.take_ready(), vec![4, 5]);
        // The gap clock restarted for 6.
        assert!(i.gap_deadline(std::time::Duration::ZERO).is_some());
        assert_eq!(
            i.offer(1, 2, 1, false, 2, &mut Now::at(now)),
            (Offer::Duplicate, 0)
        );
        assert_eq!(
            i.offer(1, 6, 1, false, 6, &mut Now::at(now)),
            (Offer::Ready, 0)
        );
        assert_eq!(i.take_ready(), vec![6, 7]);
        assert!(i.is_idle());
    }

    proptest! {
        /// Any arrival order, with duplicates, within the window: every
        /// message handed out exactly once, in sequence order.
        #[test]
        fn any_order_in_order_out(
            n in 1u64..200,
            keys in proptest::collection::vec(any::<u64>(), 200),
            dups in proptest::collection::vec(0u64..200, 0..50),
        ) {
            let now = t0();
            let mut arrivals: Vec<(u64, u64)> = (1..=n).map(|s| (keys[(s - 1) as usize], s)).collect();
            arrivals.extend(dups.iter().filter(|&&d| d < n).map(|&d| (keys[(n - 1 - d) as usize] ^ 1, d + 1)));
            arrivals.sort();
            let mut i = Inbound::default();
            let mut out = Vec::new();
            for (_, s) in arrivals {
                i.offer(3, s, 1, false, s, &mut Now::at(now));
                out.extend(i.take_ready());
            }
            prop_assert_eq!(out, (1..=n).collect::<Vec<_>>());
            prop_assert!(i.is_idle());
            prop_assert_eq!(i.ack.current(), Some((3, n)));
        }
    }
}
