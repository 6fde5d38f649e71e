//! Monotonic time as seen by the sans-IO state machines.
//!
//! Nothing in this crate reads a clock. Every input that depends on time takes
//! a `now: Time` argument and every timer is reported as a [`Time`] deadline,
//! so production code can feed a real monotonic clock (nanoseconds since some
//! process-local epoch) while tests feed the virtual clock of the
//! simulator (`sim`).
//!
//! [`Time`] is an opaque point on a nanosecond time line that starts at
//! [`Time::ZERO`]; it is totally ordered, and adding a [`Duration`] saturates
//! at [`Time::MAX`] instead of overflowing (a timer "never" fires).

use std::fmt;
use std::ops::{Add, AddAssign};
use std::time::Duration;

/// A point in monotonic time, in nanoseconds since an arbitrary epoch.
///
/// ```
/// use std::time::Duration;
/// use colibri_lnet::time::Time;
///
/// let t0 = Time::ZERO;
/// let t1 = t0 + Duration::from_secs(150);
/// assert!(t1 > t0);
/// assert_eq!(t1.saturating_duration_since(t0), Duration::from_secs(150));
/// assert_eq!(t0.saturating_duration_since(t1), Duration::ZERO);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The epoch: the start of the time line.
    pub const ZERO: Self = Self(0);
    /// The latest representable time; used as "never".
    pub const MAX: Self = Self(u64::MAX);

    /// A time `nanos` nanoseconds after the epoch.
    #[must_use]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// A time `millis` milliseconds after the epoch (saturating).
    #[must_use]
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// A time `secs` seconds after the epoch (saturating).
    #[must_use]
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time elapsed since the epoch.
    #[must_use]
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self - earlier`, or zero if `earlier` is later than `self`.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self - earlier`, or `None` if `earlier` is later than `self`.
    #[must_use]
    pub fn checked_duration_since(self, earlier: Self) -> Option<Duration> {
        self.0.checked_sub(earlier.0).map(Duration::from_nanos)
    }

    /// `self + d`, or `None` on overflow.
    #[must_use]
    pub fn checked_add(self, d: Duration) -> Option<Self> {
        let nanos = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(nanos).map(Self)
    }

    /// `self + d`, saturating at [`Time::MAX`].
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        self.checked_add(d).unwrap_or(Self::MAX)
    }

    /// `self - d`, saturating at [`Time::ZERO`].
    #[must_use]
    pub fn saturating_sub(self, d: Duration) -> Self {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_sub(nanos))
    }
}

impl Add<Duration> for Time {
    type Output = Self;

    /// Saturating addition (see [`Time::saturating_add`]).
    fn add(self, rhs: Duration) -> Self {
        self.saturating_add(rhs)
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl fmt::Display for Time {
    /// Seconds since the epoch with nanosecond precision, e.g. `12.000000500s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn constructors_agree() {
        assert_eq!(Time::from_secs(2), Time::from_millis(2000));
        assert_eq!(Time::from_millis(3), Time::from_nanos(3_000_000));
        assert_eq!(Time::from_secs(u64::MAX), Time::MAX);
        assert_eq!(Time::ZERO.as_nanos(), 0);
        assert_eq!(Time::from_secs(5).since_epoch(), Duration::from_secs(5));
    }

    #[test]
    fn addition_saturates() {
        assert_eq!(Time::MAX + Duration::from_secs(1), Time::MAX);
        assert_eq!(Time::ZERO + Duration::MAX, Time::MAX);
        assert_eq!(Time::ZERO.checked_add(Duration::MAX), None);
        let mut t = Time::from_secs(1);
        t += Duration::from_millis(500);
        assert_eq!(t, Time::from_millis(1500));
        assert_eq!(
            Time::from_secs(1).saturating_sub(Duration::from_secs(2)),
            Time::ZERO
        );
    }

    #[test]
    fn durations_between_times() {
        let a = Time::from_secs(10);
        let b = Time::from_secs(4);
        assert_eq!(a.saturating_duration_since(b), Duration::from_secs(6));
        assert_eq!(b.saturating_duration_since(a), Duration::ZERO);
        assert_eq!(a.checked_duration_since(b), Some(Duration::from_secs(6)));
        assert_eq!(b.checked_duration_since(a), None);
    }

    #[test]
    fn display() {
        assert_eq!(
            Time::from_nanos(12_000_000_500).to_string(),
            "12.000000500s"
        );
        assert_eq!(Time::ZERO.to_string(), "0.000000000s");
    }

    proptest! {
        #[test]
        fn add_then_since_round_trips(start in 0u64..u64::MAX / 2, d in 0u64..u64::MAX / 2) {
            let t = Time::from_nanos(start);
            let later = t + Duration::from_nanos(d);
            prop_assert!(later >= t);
            prop_assert_eq!(later.saturating_duration_since(t), Duration::from_nanos(d));
        }
    }
}
