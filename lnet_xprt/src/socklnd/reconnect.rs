//! Timers of a peer's connections, as pure state driven by `now`:
//! the reconnection back-off (`ksocknal_connect`, `socklnd_cb.c`) and the
//! keepalive ping (`ksocknal_send_keepalive_locked`).

use std::time::Duration;

use crate::time::Time;

/// How long after a keepalive attempt the next one may come
/// (`ksnp_send_keepalive = now + 10`).
pub const KEEPALIVE_RETRY: Duration = Duration::from_secs(10);

/// When to try connecting to a peer again.
///
/// The interval starts at 0 (connect at once), becomes `min_reconnectms`
/// after the first failure and doubles with each further failure up to
/// `max_reconnectms`; a successful connection resets it. A lost connection
/// race waits `min_reconnectms` (the race is usually over by then).
///
/// Lustre keeps these intervals in whole seconds (`min_reconnectms / 1000`);
/// we keep milliseconds, which is the same for the defaults.
///
/// ```
/// use std::time::Duration;
/// use colibri_lnet::socklnd::Reconnect;
/// use colibri_lnet::time::Time;
///
/// let mut r = Reconnect::new(Duration::from_secs(1), Duration::from_secs(60));
/// let t = Time::from_secs(100);
/// assert!(r.may_connect(t));
/// assert_eq!(r.on_failure(t), Time::from_secs(101));
/// assert_eq!(r.on_failure(t), Time::from_secs(102));
/// assert_eq!(r.on_failure(t), Time::from_secs(104));
/// r.on_success();
/// assert!(r.may_connect(t));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    min: Duration,
    max: Duration,
    interval: Duration,
    next: Time,
    races: u32,
}

impl Reconnect {
    /// A back-off between `min` and `max` (`min_reconnectms`,
    /// `max_reconnectms`); `max` below `min` counts as `min`.
    #[must_use]
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            interval: Duration::ZERO,
            next: Time::ZERO,
            races: 0,
        }
    }

    /// Whether an attempt may start at `now`.
    #[must_use]
    pub fn may_connect(&self, now: Time) -> bool {
        now >= self.next
    }

    /// When the next attempt may start.
    #[must_use]
    pub const fn next_attempt(&self) -> Time {
        self.next
    }

    /// The current interval.
    #[must_use]
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// Connection races lost in a row (see
    /// [`super::handshake::MAX_RACE_RETRIES`]).
    #[must_use]
    pub const fn races_lost(&self) -> u32 {
        self.races
    }

    /// An attempt failed at `now`: double the interval within bounds.
    /// Returns the time of the next attempt.
    pub fn on_failure(&mut self, now: Time) -> Time {
        self.interval = self.interval.saturating_mul(2).clamp(self.min, self.max);
        self.next = now.saturating_add(self.interval);
        self.races = 0;
        self.next
    }

    /// The peer refused the connection at `now` (it won a race): wait
    /// `min_reconnectms`. Returns the time of the next attempt.
    pub fn on_lost_race(&mut self, now: Time) -> Time {
        self.interval = self.min;
        self.next = now.saturating_add(self.min);
        self.races = self.races.saturating_add(1);
        self.next
    }

    /// A connection was made: further attempts may proceed at once.
    pub fn on_success(&mut self) {
        self.interval = Duration::ZERO;
        self.next = Time::ZERO;
        self.races = 0;
    }
}

/// When to send a keepalive NOOP to a quiet peer.
///
/// After `keepalive` seconds without hearing from the peer (any bytes
/// received, or sent bytes acknowledged) a keepalive NOOP goes out on the
/// connection chosen for [`super::TxKind::Noop`] `{ nonblk: true }`, and
/// not again for [`KEEPALIVE_RETRY`]. Lustre does this only for protocol
/// V3 and V4 peers with connections; `keepalive` 0 turns it off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    idle: Duration,
    last_alive: Time,
    not_before: Time,
}

impl Keepalive {
    /// A timer for `keepalive` (zero = never) whose peer was last heard
    /// from at `now`.
    #[must_use]
    pub const fn new(keepalive: Duration, now: Time) -> Self {
        Self {
            idle: keepalive,
            last_alive: now,
            not_before: Time::ZERO,
        }
    }

    /// The peer showed it is alive at `now`.
    pub fn on_alive(&mut self, now: Time) {
        if now > self.last_alive {
            self.last_alive = now;
        }
    }

    /// When the peer was last heard from.
    #[must_use]
    pub const fn last_alive(&self) -> Time {
        self.last_alive
    }

    /// The earliest time [`Keepalive::poll`] may say yes, `None` if off.
    #[must_use]
    pub fn deadline(&self) -> Option<Time> {
        if self.idle.is_zero() {
            return None;
        }
        Some(
            self.last_alive
                .saturating_add(self.idle)
                .max(self.not_before),
        )
    }

    /// Whether to send a keepalive at `now`; saying yes starts the
    /// [`KEEPALIVE_RETRY`] pause.
    pub fn poll(&mut self, now: Time) -> bool {
        match self.deadline() {
            Some(d) if now >= d => {
                self.not_before = now.saturating_add(KEEPALIVE_RETRY);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut r = Reconnect::new(Duration::from_millis(1000), Duration::from_millis(60_000));
        let t = Time::from_secs(10);
        let mut seen = Vec::new();
        for _ in 0..9 {
            r.on_failure(t);
            seen.push(r.interval().as_secs());
        }
        assert_eq!(seen, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(r.next_attempt(), Time::from_secs(70));
        assert!(!r.may_connect(Time::from_secs(69)));
        assert!(r.may_connect(Time::from_secs(70)));
        r.on_success();
        assert_eq!(r.interval(), Duration::ZERO);
        assert!(r.may_connect(t));
        r.on_failure(t);
        assert_eq!(r.interval(), Duration::from_secs(1));
    }

    #[test]
    fn lost_races_wait_the_minimum() {
        let mut r = Reconnect::new(Duration::from_secs(1), Duration::from_secs(60));
        let t = Time::from_secs(5);
        for _ in 0..4 {
            r.on_failure(t);
        }
        assert_eq!(r.on_lost_race(t), Time::from_secs(6));
        assert_eq!(r.on_lost_race(t), Time::from_secs(6));
        assert_eq!(r.races_lost(), 2);
        // A failure after a race doubles from the minimum.
        r.on_failure(t);
        assert_eq!(r.interval(), Duration::from_secs(2));
        assert_eq!(r.races_lost(), 0);
        // max below min
        let mut odd = Reconnect::new(Duration::from_secs(5), Duration::from_secs(1));
        odd.on_failure(t);
        odd.on_failure(t);
        assert_eq!(odd.interval(), Duration::from_secs(5));
    }

    #[test]
    fn keepalive_after_idle_then_every_ten_seconds() {
        let mut k = Keepalive::new(Duration::from_secs(30), Time::from_secs(100));
        assert_eq!(k.deadline(), Some(Time::from_secs(130)));
        assert!(!k.poll(Time::from_secs(129)));
        assert!(k.poll(Time::from_secs(130)));
        assert!(!k.poll(Time::from_secs(135)));
        assert_eq!(k.deadline(), Some(Time::from_secs(140)));
        assert!(k.poll(Time::from_secs(140)));
        k.on_alive(Time::from_secs(141));
        assert_eq!(k.deadline(), Some(Time::from_secs(171)));
        k.on_alive(Time::from_secs(120));
        assert_eq!(k.last_alive(), Time::from_secs(141));
        let mut off = Keepalive::new(Duration::ZERO, Time::ZERO);
        assert_eq!(off.deadline(), None);
        assert!(!off.poll(Time::MAX));
    }
}
