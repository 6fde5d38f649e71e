//! Interface health, resend decisions and recovery pings (Lustre's LNet health design, lnet.md
//! section 7).
//!
//! Every local NI and every peer NI has a [`Health`] value in `0..=1000`,
//! starting at 1000. Each message completion is classified with a
//! [`HealthStatus`]; its [`Reaction`] says whether the local NI, the peer NI
//! or both lose `sensitivity` (100) points and whether the message may be
//! resent. Successes add `sensitivity` back. An interface below 1000 is put
//! in *recovery*: it is pinged, with back-off 1, 2, 4, … 512 s and then every
//! 900 s, until it is healthy again.
//!
//! [`HealthMonitor`] keeps these values per NID and is sans-IO: the node
//! reports completions with [`HealthMonitor::on_completion`] (which answers
//! "resend or not"), asks [`HealthMonitor::poll_timeout`] when the next
//! recovery ping is due, and calls [`HealthMonitor::handle_timeout`], which
//! returns the [`RecoveryPing`]s to send.
//!
//! ```
//! use colibri_lnet::health::{Completion, HealthConfig, HealthMonitor, HealthStatus};
//! use colibri_lnet::ids::Nid;
//! use colibri_lnet::time::Time;
//!
//! let (ni1, ni2): (Nid, Nid) = ("10.0.0.1@tcp".parse()?, "10.0.1.1@tcp1".parse()?);
//! let peer: Nid = "10.0.0.2@tcp".parse()?;
//! let mut h = HealthMonitor::new(HealthConfig::default())?;
//! h.add_local_ni(ni1);
//! h.add_local_ni(ni2);
//! let now = Time::from_secs(1);
//! // The local NI dropped the message: it loses 100 points, resend elsewhere.
//! let v = h.on_completion(now, &Completion::send(HealthStatus::LocalDropped, ni1, Some(peer), 2));
//! assert!(v.resend);
//! assert_eq!(h.local_health(ni1).value(), 900);
//! // It is in recovery: a ping is due at once.
//! assert_eq!(h.poll_timeout(), Some(now));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::fault::HealthError as FaultHealthError;
use crate::ids::Nid;
use crate::nidmap::{NidMap, nid_map};
use crate::time::Time;

const TARGET: &str = "colibri_lnet::health";

/// `LNET_MAX_HEALTH_VALUE`.
pub const MAX_HEALTH: u32 = 1000;

/// A health value, always in `0..=1000`. Higher is healthier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Health(u32);

impl Health {
    /// Fully healthy (1000): every interface starts here.
    pub const MAX: Self = Self(MAX_HEALTH);
    /// Completely unhealthy.
    pub const ZERO: Self = Self(0);

    /// A health value.
    ///
    /// # Errors
    /// [`HealthParamError::OutOfRange`] above 1000.
    pub const fn new(value: u32) -> Result<Self, HealthParamError> {
        if value > MAX_HEALTH {
            Err(HealthParamError::OutOfRange(value))
        } else {
            Ok(Self(value))
        }
    }

    /// The value.
    #[must_use]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// Whether this is [`Health::MAX`].
    #[must_use]
    pub const fn is_max(self) -> bool {
        self.0 == MAX_HEALTH
    }

    /// Lowered by `by`, saturating at 0.
    #[must_use]
    pub const fn decreased(self, by: u32) -> Self {
        Self(self.0.saturating_sub(by))
    }

    /// Raised by `by`, saturating at 1000.
    #[must_use]
    pub const fn increased(self, by: u32) -> Self {
        let v = self.0.saturating_add(by);
        Self(if v > MAX_HEALTH { MAX_HEALTH } else { v })
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::MAX
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Invalid health values or parameters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HealthParamError {
    /// A health value above 1000.
    #[error("health value {0} is above 1000")]
    OutOfRange(u32),
    /// `sensitivity` above 1000.
    #[error("health sensitivity {0} is above 1000")]
    Sensitivity(u32),
    /// `retry_count` must be below the transaction timeout in seconds.
    #[error("retry count {retry_count} must be below the transaction timeout ({timeout_secs} s)")]
    RetryCount {
        /// The retry count.
        retry_count: u32,
        /// The transaction timeout, seconds.
        timeout_secs: u64,
    },
    /// With health off (sensitivity 0) there are no resends.
    #[error("retry count must be 0 when health sensitivity is 0")]
    RetryWithoutHealth,
    /// The transaction timeout must be at least one second.
    #[error("transaction timeout must be at least 1 s")]
    TransactionTimeout,
    /// The maximum recovery ping interval must be at least one second.
    #[error("maximum recovery ping interval must be at least 1 s")]
    RecoveryInterval,
}

/// Health parameters (lnet.md 7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Points lost per failure and gained per success
    /// (`lnet_health_sensitivity`, 100; 0 turns health off).
    pub sensitivity: u32,
    /// Maximum resends of one message (`lnet_retry_count`, 2).
    pub retry_count: u32,
    /// `lnet_transaction_timeout` (150 s).
    pub transaction_timeout: Duration,
    /// Peer NIs stop being recovered this long after they were last seen
    /// alive (`lnet_recovery_limit`; `None` = recover forever, the default).
    pub recovery_limit: Option<Duration>,
    /// Back-off cap for recovery pings (`lnet_max_recovery_ping_interval`,
    /// 900 s).
    pub max_recovery_ping_interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            sensitivity: 100,
            retry_count: 2,
            transaction_timeout: Duration::from_secs(150),
            recovery_limit: None,
            max_recovery_ping_interval: Duration::from_secs(900),
        }
    }
}

impl HealthConfig {
    /// Checks the parameter rules of lnet.md 7.1.
    ///
    /// # Errors
    /// The first rule broken.
    pub fn validate(&self) -> Result<(), HealthParamError> {
        if self.sensitivity > MAX_HEALTH {
            return Err(HealthParamError::Sensitivity(self.sensitivity));
        }
        let tt = self.transaction_timeout.as_secs();
        if tt == 0 {
            return Err(HealthParamError::TransactionTimeout);
        }
        if u64::from(self.retry_count) >= tt {
            return Err(HealthParamError::RetryCount {
                retry_count: self.retry_count,
                timeout_secs: tt,
            });
        }
        if self.sensitivity == 0 && self.retry_count > 0 {
            return Err(HealthParamError::RetryWithoutHealth);
        }
        if self.max_recovery_ping_interval.as_secs() == 0 {
            return Err(HealthParamError::RecoveryInterval);
        }
        Ok(())
    }

    /// `lnet_lnd_timeout`: `max((transaction_timeout - 1) / (retry_count + 1), 1)`
    /// whole seconds (49 s with the defaults, 16 s with a 50 s timeout).
    #[must_use]
    pub fn lnd_timeout(&self) -> Duration {
        let tt = self.transaction_timeout.as_secs();
        let per_try = tt.saturating_sub(1) / (u64::from(self.retry_count) + 1);
        Duration::from_secs(per_try.max(1))
    }

    /// A message's deadline (`get_msg_deadline`): with an LND that reports
    /// its own timeout `lnd_timeout`, `now + lnd_timeout × (retry_count + 1)
    /// + 1 s` (151 s for socklnd's 50 s); otherwise `now + transaction_timeout`.
    #[must_use]
    pub fn message_deadline(&self, now: Time, lnd_timeout: Option<Duration>) -> Time {
        match lnd_timeout {
            Some(t) => now + t.saturating_mul(self.retry_count + 1) + Duration::from_secs(1),
            None => now + self.transaction_timeout,
        }
    }

    /// Delay before the next recovery ping of an interface that has been
    /// pinged `ping_count` times: `2^ping_count` seconds while that is below
    /// the cap (1, 2, 4, … 512 with the default 900 s cap), then the cap.
    #[must_use]
    pub fn recovery_interval(&self, ping_count: u32) -> Duration {
        let cap = self.max_recovery_ping_interval.as_secs().max(1);
        // floor(log2(cap)): the largest exponent whose power fits the cap.
        let max_exp = 63 - cap.leading_zeros();
        if ping_count <= max_exp {
            Duration::from_secs(1u64 << ping_count)
        } else {
            Duration::from_secs(cap)
        }
    }
}

/// How a message ended (`enum lnet_msg_hstatus`, lnet.md 7.2 and 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HealthStatus {
    /// Completed normally.
    Ok,
    /// The local NI was interrupted.
    LocalInterrupt,
    /// The local NI dropped the message.
    LocalDropped,
    /// The local NI aborted it.
    LocalAborted,
    /// No route from the local NI.
    LocalNoRoute,
    /// Timed out on the local NI.
    LocalTimeout,
    /// A local error that a resend will not cure (e.g. out of memory).
    LocalError,
    /// The peer NI dropped it (connection refused or reset, unreachable).
    RemoteDropped,
    /// The peer NI reported an error.
    RemoteError,
    /// Timed out on the peer NI.
    RemoteTimeout,
    /// Timed out somewhere on the network (both ends suspected).
    NetworkTimeout,
}

/// What a [`HealthStatus`] does (lnet.md 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reaction {
    /// The local NI loses `sensitivity` points and enters recovery.
    pub local_failure: bool,
    /// The peer NI loses `sensitivity` points and enters recovery.
    pub remote_failure: bool,
    /// The message may be resent (subject to the retry count and the
    /// single-rail suppressions).
    pub resend: bool,
}

impl HealthStatus {
    /// All statuses, in declaration order.
    pub const ALL: [Self; 11] = [
        Self::Ok,
        Self::LocalInterrupt,
        Self::LocalDropped,
        Self::LocalAborted,
        Self::LocalNoRoute,
        Self::LocalTimeout,
        Self::LocalError,
        Self::RemoteDropped,
        Self::RemoteError,
        Self::RemoteTimeout,
        Self::NetworkTimeout,
    ];

    /// The reaction table of lnet.md 7.2.
    #[must_use]
    pub const fn reaction(self) -> Reaction {
        let (local_failure, remote_failure, resend) = match self {
            Self::Ok => (false, false, false),
            Self::LocalInterrupt
            | Self::LocalDropped
            | Self::LocalAborted
            | Self::LocalNoRoute
            | Self::LocalTimeout => (true, false, true),
            Self::LocalError => (true, false, false),
            Self::RemoteDropped => (false, true, true),
            Self::RemoteError | Self::RemoteTimeout => (false, true, false),
            Self::NetworkTimeout => (true, true, false),
        };
        Reaction {
            local_failure,
            remote_failure,
            resend,
        }
    }
}

impl From<FaultHealthError> for HealthStatus {
    /// The status a fault rule's simulated health error produces.
    fn from(e: FaultHealthError) -> Self {
        match e {
            FaultHealthError::LocalInterrupt => Self::LocalInterrupt,
            FaultHealthError::LocalDropped => Self::LocalDropped,
            FaultHealthError::LocalAborted => Self::LocalAborted,
            FaultHealthError::LocalNoRoute => Self::LocalNoRoute,
            FaultHealthError::LocalError => Self::LocalError,
            FaultHealthError::LocalTimeout => Self::LocalTimeout,
            FaultHealthError::RemoteError => Self::RemoteError,
            FaultHealthError::RemoteDropped => Self::RemoteDropped,
            FaultHealthError::RemoteTimeout => Self::RemoteTimeout,
            FaultHealthError::NetworkTimeout => Self::NetworkTimeout,
        }
    }
}

/// Which side an interface is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NiSide {
    /// One of this node's NIs.
    Local,
    /// A peer NI.
    Peer,
}

/// Direction of a completed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// We sent it.
    Send,
    /// We received it.
    Receive,
}

/// A message completion, as reported to [`HealthMonitor::on_completion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// How it ended.
    pub status: HealthStatus,
    /// Sent or received.
    pub direction: Direction,
    /// The local NI it used.
    pub local_ni: Nid,
    /// The peer NI of the next hop, if there was one (`None` for loopback).
    pub peer_ni: Option<Nid>,
    /// How many NIs the destination peer has (single-rail suppression).
    pub peer_ni_count: usize,
    /// The peer NI is a gateway (its health is tracked even if single-rail).
    pub peer_is_gateway: bool,
    /// This node routes (as a gateway, every peer's health is tracked).
    pub i_am_router: bool,
    /// Times this message was already resent (`msg_retry_count`).
    pub retries_done: u32,
    /// The message was past its deadline: finalize without health action.
    pub past_deadline: bool,
    /// Never resend (recovery pings, send errors from the API, aborted MDs).
    pub no_resend: bool,
    /// The peer NI is one of this node's own NIs (a message to itself
    /// through the network LND): a failure is the local NI's business and
    /// puts no peer NI in recovery (`lnet_health_check`: "Do not put my
    /// interfaces into peer NI recovery").
    pub peer_is_local: bool,
}

impl Completion {
    /// A first-attempt send completion with the common defaults.
    #[must_use]
    pub const fn send(
        status: HealthStatus,
        local_ni: Nid,
        peer_ni: Option<Nid>,
        peer_ni_count: usize,
    ) -> Self {
        Self {
            status,
            direction: Direction::Send,
            local_ni,
            peer_ni,
            peer_ni_count,
            peer_is_gateway: false,
            i_am_router: false,
            retries_done: 0,
            past_deadline: false,
            no_resend: false,
            peer_is_local: false,
        }
    }

    /// A successful receive from `peer_ni` on `local_ni`.
    #[must_use]
    pub const fn receive(local_ni: Nid, peer_ni: Nid, peer_ni_count: usize) -> Self {
        Self {
            status: HealthStatus::Ok,
            direction: Direction::Receive,
            local_ni,
            peer_ni: Some(peer_ni),
            peer_ni_count,
            peer_is_gateway: false,
            i_am_router: false,
            retries_done: 0,
            past_deadline: false,
            no_resend: false,
            peer_is_local: false,
        }
    }
}

/// A change of a local NI's advertised status caused by its health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalStatusChange {
    /// Health reached 0: advertise DOWN (rebuild the ping buffer, push).
    Down(Nid),
    /// Health is back at 1000: advertise UP.
    Up(Nid),
}

/// The answer to a completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verdict {
    /// Resend the message (selection will pick a path again).
    pub resend: bool,
    /// A local NI's advertised status must change.
    pub local_status: Option<LocalStatusChange>,
}

/// A recovery ping to send: a GET on portal 0 to `nid` (for a local NI, to
/// its own NID through itself), flagged so that it is never resent and uses
/// exactly this NID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryPing {
    /// Local NI or peer NI.
    pub side: NiSide,
    /// The interface to ping.
    pub nid: Nid,
}

/// What the monitor knows about one interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NiHealth {
    /// Current health.
    pub health: Health,
    /// Recovery pings sent since the interface was last heard from.
    pub ping_count: u32,
    /// When the next recovery ping is due, if in recovery.
    pub next_ping: Option<Time>,
    /// Last time a message was received on / from it.
    pub last_alive: Option<Time>,
}

/// Global counters (`lnetctl stats show`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthStats {
    /// Completions per status, indexed like [`HealthStatus::ALL`].
    pub by_status: [u64; 11],
    /// Resends granted.
    pub resends: u64,
    /// Failures that would have been resent but had used up
    /// `retry_count` (Lustre's `failed_resends`; none when it is 0).
    pub failed_resends: u64,
    /// Messages that succeeded after at least one resend (Lustre's
    /// `successful_resends`).
    pub successful_resends: u64,
    /// Response (ACK/REPLY) timeouts.
    pub response_timeouts: u64,
    /// Recovery pings emitted.
    pub recovery_pings: u64,
    /// Failures ignored because the message was past its deadline.
    pub past_deadline: u64,
}

/// Health of the node's NIs and of its peers' NIs, with recovery.
#[derive(Clone, Debug)]
pub struct HealthMonitor {
    config: HealthConfig,
    local: NidMap<NiHealth>,
    peer: NidMap<NiHealth>,
    /// Every scheduled recovery ping, `(due, side, nid)`: the interfaces in
    /// recovery, so that the next deadline and the due pings cost what is
    /// in recovery, not how many interfaces are known.
    due: BTreeSet<(Time, NiSide, Nid)>,
    stats: HealthStats,
    /// Failed completions per interface, by status (indexed like
    /// [`HealthStatus::ALL`]): the local statuses on the local NI, the
    /// remote ones and network timeouts on the peer NI, as Lustre's
    /// `lnet_incr_hstats` counts them (`health stats` of `lnetctl net|peer
    /// show -v`). Only interfaces that failed have an entry, so the
    /// success path touches nothing more.
    failures: NidMap<[u64; 11]>,
    peer_failures: NidMap<[u64; 11]>,
}

/// Sets when `h`'s next recovery ping is due, keeping the index `due` in
/// step (every change of `next_ping` goes through here).
fn schedule(
    due: &mut BTreeSet<(Time, NiSide, Nid)>,
    side: NiSide,
    nid: Nid,
    h: &mut NiHealth,
    at: Option<Time>,
) {
    if h.next_ping == at {
        return;
    }
    if let Some(t) = h.next_ping {
        due.remove(&(t, side, nid));
    }
    if let Some(t) = at {
        due.insert((t, side, nid));
    }
    h.next_ping = at;
}

impl HealthMonitor {
    /// A monitor with no interfaces.
    ///
    /// # Errors
    /// `config` fails [`HealthConfig::validate`].
    pub fn new(config: HealthConfig) -> Result<Self, HealthParamError> {
        config.validate()?;
        Ok(Self {
            config,
            local: nid_map(),
            peer: nid_map(),
            due: BTreeSet::new(),
            stats: HealthStats::default(),
            failures: nid_map(),
            peer_failures: nid_map(),
        })
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// Replaces the configuration (`lnetctl set health_sensitivity`,
    /// `retry_count`, `transaction_timeout`, …); health values already
    /// recorded stay.
    ///
    /// # Errors
    /// `config` fails [`HealthConfig::validate`] (nothing changes).
    pub fn set_config(&mut self, config: HealthConfig) -> Result<(), HealthParamError> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// Counters.
    #[must_use]
    pub const fn stats(&self) -> &HealthStats {
        &self.stats
    }

    /// Zeroes the global counters ([`HealthMonitor::stats`]), as `lnetctl
    /// stats reset` does; the interfaces' health values stay.
    pub fn reset_stats(&mut self) {
        self.stats = HealthStats::default();
        self.failures.clear();
        self.peer_failures.clear();
    }

    /// Failed completions counted on an interface, by status (indexed like
    /// [`HealthStatus::ALL`]; zeros for one that never failed): on a local
    /// NI its local statuses, on a peer NI the remote ones and network
    /// timeouts. Zeroed by [`HealthMonitor::reset_stats`].
    #[must_use]
    pub fn failure_counts(&self, side: NiSide, nid: Nid) -> [u64; 11] {
        let map = match side {
            NiSide::Local => &self.failures,
            NiSide::Peer => &self.peer_failures,
        };
        map.get(&nid).copied().unwrap_or_default()
    }

    /// Registers one of the node's NIs (at full health). The number of local
    /// NIs decides whether local resends make sense.
    pub fn add_local_ni(&mut self, nid: Nid) {
        self.local.entry(nid).or_default();
    }

    /// Forgets a local NI (deleted): it leaves recovery.
    pub fn remove_local_ni(&mut self, nid: Nid) {
        if let Some(mut h) = self.local.remove(&nid) {
            schedule(&mut self.due, NiSide::Local, nid, &mut h, None);
        }
    }

    /// Forgets a peer NI (deleted): it leaves recovery.
    pub fn remove_peer_ni(&mut self, nid: Nid) {
        if let Some(mut h) = self.peer.remove(&nid) {
            schedule(&mut self.due, NiSide::Peer, nid, &mut h, None);
        }
    }

    /// Number of registered local NIs.
    #[must_use]
    pub fn local_ni_count(&self) -> usize {
        self.local.len()
    }

    /// Health of local NI `nid` (1000 if unknown).
    #[must_use]
    pub fn local_health(&self, nid: Nid) -> Health {
        self.local.get(&nid).map_or(Health::MAX, |h| h.health)
    }

    /// Health of peer NI `nid` (1000 if unknown).
    #[must_use]
    pub fn peer_health(&self, nid: Nid) -> Health {
        self.peer.get(&nid).map_or(Health::MAX, |h| h.health)
    }

    /// The best health among `nids` on `side` (a peer net's health is the
    /// max of its peer NIs'; a local net's the max of its NIs'). `None` for
    /// an empty list.
    pub fn max_health(&self, side: NiSide, nids: impl IntoIterator<Item = Nid>) -> Option<Health> {
        nids.into_iter()
            .map(|n| match side {
                NiSide::Local => self.local_health(n),
                NiSide::Peer => self.peer_health(n),
            })
            .max()
    }

    /// The interfaces of `side` in recovery (health below the maximum, a
    /// recovery ping scheduled), the next one due first: Lustre's recovery
    /// queues (`lnetctl debug recovery --local|--peer`).
    #[must_use]
    pub fn in_recovery(&self, side: NiSide) -> Vec<Nid> {
        self.due
            .iter()
            .filter(|(_, s, _)| *s == side)
            .map(|&(_, _, nid)| nid)
            .collect()
    }

    /// Everything known about an interface.
    #[must_use]
    pub fn ni_health(&self, side: NiSide, nid: Nid) -> Option<&NiHealth> {
        match side {
            NiSide::Local => self.local.get(&nid),
            NiSide::Peer => self.peer.get(&nid),
        }
    }

    /// Sets a health value by hand (`lnetctl net|peer set --health`, or an
    /// LND "peer alive again" notification with reset). Returns a local
    /// status change if one results.
    pub fn set_health(&mut self, now: Time, side: NiSide, nid: Nid, health: Health) -> Verdict {
        let map = match side {
            NiSide::Local => &mut self.local,
            NiSide::Peer => &mut self.peer,
        };
        let entry = map.entry(nid).or_default();
        let old = entry.health;
        entry.health = health;
        if health.is_max() {
            schedule(&mut self.due, side, nid, entry, None);
        } else if entry.next_ping.is_none() {
            schedule(&mut self.due, side, nid, entry, Some(now));
        }
        Verdict {
            resend: false,
            local_status: (side == NiSide::Local)
                .then(|| status_change(nid, old, health))
                .flatten(),
        }
    }

    fn change_local(&mut self, now: Time, nid: Nid, up: bool) -> Option<LocalStatusChange> {
        let sensitivity = self.config.sensitivity;
        let entry = self.local.entry(nid).or_default();
        let old = entry.health;
        if up {
            entry.health = old.increased(sensitivity);
            if entry.health.is_max() {
                schedule(&mut self.due, NiSide::Local, nid, entry, None);
            }
        } else {
            entry.health = old.decreased(sensitivity);
            if !entry.health.is_max() && entry.next_ping.is_none() {
                schedule(&mut self.due, NiSide::Local, nid, entry, Some(now));
            }
        }
        status_change(nid, old, entry.health)
    }

    /// Lowers or raises a peer NI. A lowered peer NI enters recovery only if
    /// it was ever seen alive and is within the recovery limit.
    fn change_peer(&mut self, now: Time, nid: Nid, up: bool, to_max: bool) {
        let sensitivity = self.config.sensitivity;
        let limit = self.config.recovery_limit;
        let entry = self.peer.entry(nid).or_default();
        if up {
            entry.health = if to_max {
                Health::MAX
            } else {
                entry.health.increased(sensitivity)
            };
            if entry.health.is_max() {
                schedule(&mut self.due, NiSide::Peer, nid, entry, None);
            }
        } else {
            entry.health = entry.health.decreased(sensitivity);
            let recoverable = entry
                .last_alive
                .is_some_and(|seen| limit.is_none_or(|l| now.saturating_duration_since(seen) <= l));
            if !entry.health.is_max() && recoverable && entry.next_ping.is_none() {
                schedule(&mut self.due, NiSide::Peer, nid, entry, Some(now));
            }
        }
    }

    /// A message completed (`lnet_health_check`, lnet.md 7.2): updates health
    /// and recovery, and says whether to resend.
    ///
    /// - Past its deadline and failed: no health change, no resend.
    /// - `Ok`: local NI `+sensitivity`; a receive resets the ping counts of
    ///   both ends, marks the peer NI alive and gives it `+sensitivity`
    ///   (back to 1000 at once for gateways, or when this node routes); a
    ///   send changes no peer NI.
    /// - Failures follow [`HealthStatus::reaction`]. With one local NI there
    ///   are no local resends; a single-NI peer's health is not tracked and
    ///   it gets no remote resends, unless it is a gateway or this node
    ///   routes. No resend once `retries_done >= retry_count`, nor for
    ///   `no_resend` messages.
    pub fn on_completion(&mut self, now: Time, c: &Completion) -> Verdict {
        if let Some(slot) = HealthStatus::ALL.iter().position(|&s| s == c.status) {
            self.stats.by_status[slot] += 1;
            let on = match c.status {
                HealthStatus::Ok => None,
                HealthStatus::LocalInterrupt
                | HealthStatus::LocalDropped
                | HealthStatus::LocalAborted
                | HealthStatus::LocalNoRoute
                | HealthStatus::LocalTimeout
                | HealthStatus::LocalError => Some((&mut self.failures, c.local_ni)),
                HealthStatus::RemoteDropped
                | HealthStatus::RemoteError
                | HealthStatus::RemoteTimeout
                | HealthStatus::NetworkTimeout => c.peer_ni.map(|p| (&mut self.peer_failures, p)),
            };
            if let Some((map, nid)) = on {
                map.entry(nid).or_default()[slot] += 1;
            }
        }
        let mut verdict = Verdict::default();
        if c.status == HealthStatus::Ok {
            if c.retries_done > 0 {
                self.stats.successful_resends += 1;
            }
            verdict.local_status = self.change_local(now, c.local_ni, true);
            // Any success on the local NI, sent or received, resets its
            // recovery back-off (`lnet_health_check`: `ni_ping_count = 0`
            // for every OK message), so a recovering NI whose pings now
            // succeed is pinged every second, not ever more rarely.
            if let Some(l) = self.local.get_mut(&c.local_ni) {
                l.ping_count = 0;
            }
            // Only a message received from the peer NI says its interface
            // is up (`lnet_health_check`: `msg_rx_committed`); a send the
            // LND completed says nothing about the far end, so it raises
            // no peer NI (else a recovery ping written to a dead interface
            // would heal it).
            if let Some(peer) = c.peer_ni
                && c.direction == Direction::Receive
            {
                let p = self.peer.entry(peer).or_default();
                p.ping_count = 0;
                p.last_alive = Some(now);
                let to_max = c.peer_is_gateway || c.i_am_router;
                self.change_peer(now, peer, true, to_max);
            }
            return verdict;
        }
        if c.past_deadline {
            self.stats.past_deadline += 1;
            tracing::debug!(target: TARGET, status = ?c.status, "failure past deadline: no health action");
            return verdict;
        }
        let reaction = c.status.reaction();
        let remote_tracked =
            !c.peer_is_local && (c.peer_ni_count > 1 || c.peer_is_gateway || c.i_am_router);
        if reaction.local_failure && self.config.sensitivity > 0 {
            verdict.local_status = self.change_local(now, c.local_ni, false);
        }
        if reaction.remote_failure
            && self.config.sensitivity > 0
            && remote_tracked
            && let Some(peer) = c.peer_ni
        {
            self.change_peer(now, peer, false, false);
        }
        let local_ok = !reaction.local_failure || self.local.len() > 1;
        // A router tracks its single-interface peers' health (it relies on
        // it for their aliveness) but, as anyone, resends only where the
        // next hop has another interface (lnet_health_check).
        let remote_ok = !reaction.remote_failure || c.peer_ni_count > 1 || c.peer_is_gateway;
        let wanted = reaction.resend && local_ok && remote_ok && !c.no_resend;
        verdict.resend = wanted && c.retries_done < self.config.retry_count;
        if wanted && !verdict.resend && self.config.retry_count > 0 {
            self.stats.failed_resends += 1;
        }
        if verdict.resend {
            self.stats.resends += 1;
        }
        tracing::debug!(target: TARGET, status = ?c.status, local = %c.local_ni, peer = ?c.peer_ni,
            resend = verdict.resend, "completion");
        verdict
    }

    /// An ACK or REPLY did not arrive within the transaction timeout
    /// (lnet.md 2.5): the next-hop peer NI loses health; never a resend.
    pub fn on_response_timeout(&mut self, now: Time, peer_ni: Nid) {
        self.stats.response_timeouts += 1;
        if self.config.sensitivity > 0 {
            self.change_peer(now, peer_ni, false, false);
        }
    }

    /// The outcome of a recovery ping. A successful local recovery REPLY adds
    /// `sensitivity` to the local NI; a peer NI's REPLY counts as a received
    /// message (alive, ping count reset, `+sensitivity`). A failure lowers
    /// the interface again.
    pub fn on_recovery_ping_result(
        &mut self,
        now: Time,
        ping: RecoveryPing,
        success: bool,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        match (ping.side, success) {
            (NiSide::Local, ok) => {
                verdict.local_status = self.change_local(now, ping.nid, ok);
                if ok && let Some(l) = self.local.get_mut(&ping.nid) {
                    // As any OK message on the NI (`lnet_health_check`).
                    l.ping_count = 0;
                }
            }
            (NiSide::Peer, true) => {
                let p = self.peer.entry(ping.nid).or_default();
                p.ping_count = 0;
                p.last_alive = Some(now);
                self.change_peer(now, ping.nid, true, false);
            }
            (NiSide::Peer, false) => {
                if self.config.sensitivity > 0 {
                    self.change_peer(now, ping.nid, false, false);
                }
            }
        }
        verdict
    }

    /// When the next recovery ping is due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.due.first().map(|&(t, _, _)| t)
    }

    /// Emits the recovery pings due at `now` and schedules the next ones
    /// with back-off ([`HealthConfig::recovery_interval`]). Peer NIs past
    /// the recovery limit leave recovery instead.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<RecoveryPing> {
        let mut out = Vec::new();
        let config = self.config;
        // The interfaces due, in (side, NID) order as a walk of the maps
        // would meet them.
        let mut due: Vec<(NiSide, Nid)> = self
            .due
            .iter()
            .take_while(|&&(t, _, _)| t <= now)
            .map(|&(_, side, nid)| (side, nid))
            .collect();
        due.sort_unstable();
        for (side, nid) in due {
            let map = match side {
                NiSide::Local => &mut self.local,
                NiSide::Peer => &mut self.peer,
            };
            let Some(h) = map.get_mut(&nid) else {
                continue;
            };
            if h.health.is_max() {
                schedule(&mut self.due, side, nid, h, None);
                continue;
            }
            if side == NiSide::Peer {
                let expired = config.recovery_limit.is_some_and(|limit| {
                    h.last_alive
                        .is_none_or(|seen| now.saturating_duration_since(seen) > limit)
                });
                if expired {
                    tracing::info!(target: TARGET, %nid, "peer NI past recovery limit: recovery stopped");
                    schedule(&mut self.due, side, nid, h, None);
                    continue;
                }
            }
            let next = now + config.recovery_interval(h.ping_count);
            schedule(&mut self.due, side, nid, h, Some(next));
            h.ping_count = h.ping_count.saturating_add(1);
            out.push(RecoveryPing { side, nid });
        }
        self.stats.recovery_pings += out.len() as u64;
        out
    }
}

fn status_change(nid: Nid, old: Health, new: Health) -> Option<LocalStatusChange> {
    if old.value() > 0 && new.value() == 0 {
        Some(LocalStatusChange::Down(nid))
    } else if !old.is_max() && new.is_max() {
        Some(LocalStatusChange::Up(nid))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn t(secs: u64) -> Time {
        Time::from_secs(secs)
    }

    const L1: &str = "10.0.0.1@tcp";
    const L2: &str = "192.168.0.1@o2ib";
    const P1: &str = "10.0.0.2@tcp";

    fn two_rail() -> HealthMonitor {
        let mut h = HealthMonitor::new(HealthConfig::default()).unwrap();
        h.add_local_ni(nid(L1));
        h.add_local_ni(nid(L2));
        h
    }

    #[test]
    fn health_arithmetic_saturates() {
        assert_eq!(Health::MAX.increased(100), Health::MAX);
        assert_eq!(Health::ZERO.decreased(100), Health::ZERO);
        assert_eq!(Health::new(950).unwrap().increased(100), Health::MAX);
        assert_eq!(Health::new(50).unwrap().decreased(100), Health::ZERO);
        assert_eq!(Health::new(500).unwrap().decreased(100).value(), 400);
        assert_eq!(Health::new(1001), Err(HealthParamError::OutOfRange(1001)));
        assert_eq!(Health::default(), Health::MAX);
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = HealthConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.lnd_timeout(), Duration::from_secs(49));
        let c50 = HealthConfig {
            transaction_timeout: Duration::from_secs(50),
            ..c
        };
        assert_eq!(c50.lnd_timeout(), Duration::from_secs(16));
        assert_eq!(
            c.message_deadline(t(0), Some(Duration::from_secs(50))),
            t(151),
            "socklnd deadline"
        );
        assert_eq!(c.message_deadline(t(10), None), t(160));
        assert_eq!(
            HealthConfig {
                sensitivity: 0,
                ..c
            }
            .validate(),
            Err(HealthParamError::RetryWithoutHealth)
        );
        assert_eq!(
            HealthConfig {
                sensitivity: 0,
                retry_count: 0,
                ..c
            }
            .validate(),
            Ok(())
        );
        assert_eq!(
            HealthConfig {
                sensitivity: 1001,
                ..c
            }
            .validate(),
            Err(HealthParamError::Sensitivity(1001))
        );
        assert!(matches!(
            HealthConfig {
                retry_count: 5,
                transaction_timeout: Duration::from_secs(5),
                ..c
            }
            .validate(),
            Err(HealthParamError::RetryCount { .. })
        ));
        assert!(
            HealthMonitor::new(HealthConfig {
                sensitivity: 2000,
                ..c
            })
            .is_err()
        );
    }

    #[test]
    fn back_off_sequence() {
        let c = HealthConfig::default();
        let seq: Vec<u64> = (0..12).map(|n| c.recovery_interval(n).as_secs()).collect();
        assert_eq!(seq, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]);
    }

    #[test]
    fn reaction_table() {
        use HealthStatus::*;
        let r = |s: HealthStatus| {
            let x = s.reaction();
            (x.local_failure, x.remote_failure, x.resend)
        };
        assert_eq!(r(Ok), (false, false, false));
        for s in [
            LocalInterrupt,
            LocalDropped,
            LocalAborted,
            LocalNoRoute,
            LocalTimeout,
        ] {
            assert_eq!(r(s), (true, false, true), "{s:?}");
        }
        assert_eq!(r(LocalError), (true, false, false));
        assert_eq!(r(RemoteDropped), (false, true, true));
        assert_eq!(r(RemoteError), (false, true, false));
        assert_eq!(r(RemoteTimeout), (false, true, false));
        assert_eq!(r(NetworkTimeout), (true, true, false));
    }

    #[test]
    fn fault_errors_map_to_statuses() {
        for e in FaultHealthError::ALL {
            let s = HealthStatus::from(e);
            assert_ne!(s, HealthStatus::Ok);
            assert_eq!(format!("{e:?}"), format!("{s:?}"));
        }
    }

    #[test]
    fn failures_are_counted_on_the_interface_they_happened_on() {
        let mut h = two_rail();
        let at = |s: HealthStatus| HealthStatus::ALL.iter().position(|x| *x == s).unwrap();
        for s in [
            HealthStatus::Ok,
            HealthStatus::LocalDropped,
            HealthStatus::LocalDropped,
            HealthStatus::RemoteTimeout,
            HealthStatus::NetworkTimeout,
        ] {
            h.on_completion(t(1), &Completion::send(s, nid(L1), Some(nid(P1)), 2));
        }
        let local = h.failure_counts(NiSide::Local, nid(L1));
        assert_eq!(local[at(HealthStatus::LocalDropped)], 2);
        assert_eq!(
            local.iter().sum::<u64>(),
            2,
            "remote statuses are the peer's"
        );
        let peer = h.failure_counts(NiSide::Peer, nid(P1));
        assert_eq!(peer[at(HealthStatus::RemoteTimeout)], 1);
        assert_eq!(peer[at(HealthStatus::NetworkTimeout)], 1);
        assert_eq!(peer.iter().sum::<u64>(), 2);
        assert_eq!(h.failure_counts(NiSide::Local, nid(L2)), [0; 11]);
        h.reset_stats();
        assert_eq!(h.failure_counts(NiSide::Local, nid(L1)), [0; 11]);
        assert_eq!(h.failure_counts(NiSide::Peer, nid(P1)), [0; 11]);
    }

    #[test]
    fn local_failure_lowers_local_ni_and_resends() {
        let mut h = two_rail();
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::LocalTimeout, nid(L1), Some(nid(P1)), 2),
        );
        assert!(v.resend);
        assert_eq!(h.local_health(nid(L1)).value(), 900);
        assert_eq!(h.peer_health(nid(P1)), Health::MAX);
        assert_eq!(h.stats().resends, 1);
    }

    #[test]
    fn local_error_does_not_resend() {
        let mut h = two_rail();
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::LocalError, nid(L1), Some(nid(P1)), 2),
        );
        assert!(!v.resend);
        assert_eq!(h.local_health(nid(L1)).value(), 900);
    }

    #[test]
    fn remote_dropped_lowers_peer_and_resends() {
        let mut h = two_rail();
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::RemoteDropped, nid(L1), Some(nid(P1)), 2),
        );
        assert!(v.resend);
        assert_eq!(h.peer_health(nid(P1)).value(), 900);
        assert_eq!(h.local_health(nid(L1)), Health::MAX);
    }

    #[test]
    fn network_timeout_lowers_both_without_resend() {
        let mut h = two_rail();
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::NetworkTimeout, nid(L1), Some(nid(P1)), 2),
        );
        assert!(!v.resend);
        assert_eq!(h.peer_health(nid(P1)).value(), 900);
        assert_eq!(h.local_health(nid(L1)).value(), 900);
    }

    #[test]
    fn retry_count_limits_resends() {
        let mut h = two_rail();
        let mut c = Completion::send(HealthStatus::LocalDropped, nid(L1), Some(nid(P1)), 2);
        c.retries_done = 1;
        assert!(h.on_completion(t(1), &c).resend);
        c.retries_done = 2;
        assert!(!h.on_completion(t(1), &c).resend);
        c.retries_done = 0;
        c.no_resend = true;
        assert!(!h.on_completion(t(1), &c).resend);
    }

    #[test]
    fn single_rail_suppressions() {
        // One local NI: local failures are not resent.
        let mut h = HealthMonitor::new(HealthConfig::default()).unwrap();
        h.add_local_ni(nid(L1));
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::LocalDropped, nid(L1), Some(nid(P1)), 2),
        );
        assert!(!v.resend);
        assert_eq!(h.local_health(nid(L1)).value(), 900, "health still tracked");
        // Single-NI peer: no remote health, no remote resend…
        let mut h = two_rail();
        let v = h.on_completion(
            t(1),
            &Completion::send(HealthStatus::RemoteDropped, nid(L1), Some(nid(P1)), 1),
        );
        assert!(!v.resend);
        assert_eq!(h.peer_health(nid(P1)), Health::MAX);
        // …unless it is a gateway.
        let mut c = Completion::send(HealthStatus::RemoteDropped, nid(L1), Some(nid(P1)), 1);
        c.peer_is_gateway = true;
        assert!(h.on_completion(t(1), &c).resend);
        assert_eq!(h.peer_health(nid(P1)).value(), 900);
    }

    #[test]
    fn past_deadline_failures_change_nothing() {
        let mut h = two_rail();
        let mut c = Completion::send(HealthStatus::NetworkTimeout, nid(L1), Some(nid(P1)), 2);
        c.past_deadline = true;
        let v = h.on_completion(t(1), &c);
        assert_eq!(v, Verdict::default());
        assert_eq!(h.local_health(nid(L1)), Health::MAX);
        assert_eq!(h.peer_health(nid(P1)), Health::MAX);
        assert_eq!(h.stats().past_deadline, 1);
    }

    #[test]
    fn our_own_interfaces_never_enter_peer_recovery() {
        let mut h = two_rail();
        let mut c = Completion::send(HealthStatus::NetworkTimeout, nid(L1), Some(nid(L2)), 2);
        c.peer_is_local = true;
        h.on_completion(t(1), &c);
        // The local NI pays; the "peer" NI, ours, does not.
        assert_eq!(h.local_health(nid(L1)).value(), 900);
        assert_eq!(h.peer_health(nid(L2)), Health::MAX);
        // Its failure is still counted against it, as Lustre's hstats.
        assert_eq!(
            h.failure_counts(NiSide::Peer, nid(L2)).iter().sum::<u64>(),
            1
        );
        c.peer_is_local = false;
        h.on_completion(t(2), &c);
        assert_eq!(h.peer_health(nid(L2)).value(), 900);
    }

    #[test]
    fn success_raises_and_gateway_snaps_to_max() {
        let mut h = two_rail();
        for _ in 0..3 {
            h.on_completion(
                t(1),
                &Completion::send(HealthStatus::NetworkTimeout, nid(L1), Some(nid(P1)), 2),
            );
        }
        assert_eq!(h.peer_health(nid(P1)).value(), 700);
        // A send the LND completed raises the local NI only: it says
        // nothing of the far interface (Lustre: `msg_rx_committed`).
        h.on_completion(
            t(2),
            &Completion::send(HealthStatus::Ok, nid(L1), Some(nid(P1)), 2),
        );
        assert_eq!(h.peer_health(nid(P1)).value(), 700);
        assert_eq!(h.local_health(nid(L1)).value(), 800);
        // A message received from it does.
        h.on_completion(t(2), &Completion::receive(nid(L1), nid(P1), 2));
        assert_eq!(h.peer_health(nid(P1)).value(), 800);
        let mut c = Completion::receive(nid(L1), nid(P1), 2);
        c.peer_is_gateway = true;
        h.on_completion(t(2), &c);
        assert_eq!(h.peer_health(nid(P1)), Health::MAX);
    }

    #[test]
    fn local_ni_down_at_zero_and_up_at_max() {
        let mut h = two_rail();
        let fail = Completion::send(HealthStatus::LocalError, nid(L1), None, 0);
        let mut last = None;
        for _ in 0..10 {
            last = h.on_completion(t(1), &fail).local_status;
        }
        assert_eq!(last, Some(LocalStatusChange::Down(nid(L1))));
        assert_eq!(h.local_health(nid(L1)), Health::ZERO);
        // Further failures do not repeat the change.
        assert_eq!(h.on_completion(t(1), &fail).local_status, None);
        let ping = RecoveryPing {
            side: NiSide::Local,
            nid: nid(L1),
        };
        for i in 0..10 {
            let v = h.on_recovery_ping_result(t(2), ping, true);
            if i < 9 {
                assert_eq!(v.local_status, None);
            } else {
                assert_eq!(v.local_status, Some(LocalStatusChange::Up(nid(L1))));
            }
        }
        assert_eq!(h.poll_timeout(), None, "left recovery at max");
    }

    #[test]
    fn local_recovery_pings_back_off() {
        let mut h = two_rail();
        h.on_completion(
            t(10),
            &Completion::send(HealthStatus::LocalError, nid(L1), None, 0),
        );
        let mut times = Vec::new();
        let mut now = t(10);
        for _ in 0..12 {
            now = h.poll_timeout().unwrap();
            let pings = h.handle_timeout(now);
            assert_eq!(
                pings,
                vec![RecoveryPing {
                    side: NiSide::Local,
                    nid: nid(L1)
                }]
            );
            times.push(now.saturating_duration_since(t(10)).as_secs());
        }
        assert_eq!(
            times,
            vec![0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 1923]
        );
        assert!(
            h.handle_timeout(now).is_empty(),
            "repeated call is harmless"
        );
        assert_eq!(h.stats().recovery_pings, 12);
    }

    #[test]
    fn local_recovery_success_resets_the_back_off() {
        let mut h = two_rail();
        for _ in 0..5 {
            h.on_completion(
                t(10),
                &Completion::send(HealthStatus::LocalError, nid(L1), None, 0),
            );
        }
        assert_eq!(h.local_health(nid(L1)).value(), 500);
        let ping = RecoveryPing {
            side: NiSide::Local,
            nid: nid(L1),
        };
        // Four failed pings: the back-off grows to 16 s.
        for _ in 0..4 {
            let now = h.poll_timeout().unwrap();
            assert_eq!(h.handle_timeout(now), vec![ping]);
            h.on_recovery_ping_result(now, ping, false);
        }
        assert_eq!(h.ni_health(NiSide::Local, nid(L1)).unwrap().ping_count, 4);
        assert_eq!(h.local_health(nid(L1)).value(), 100);
        // The next ping succeeds: the one after it was scheduled when it
        // left (16 s), every later one is a second apart until the NI is
        // back at full health.
        let mut now = h.poll_timeout().unwrap();
        let mut gaps = Vec::new();
        loop {
            assert_eq!(h.handle_timeout(now), vec![ping]);
            h.on_recovery_ping_result(now, ping, true);
            assert_eq!(h.ni_health(NiSide::Local, nid(L1)).unwrap().ping_count, 0);
            let Some(next) = h.poll_timeout() else { break };
            if h.local_health(nid(L1)).is_max() {
                break;
            }
            gaps.push(next.saturating_duration_since(now).as_secs());
            now = next;
        }
        assert_eq!(gaps.first(), Some(&16), "{gaps:?}");
        assert!(gaps[1..].iter().all(|g| *g == 1), "{gaps:?}");
        assert!(h.local_health(nid(L1)).is_max());
        // Any successful message on the NI resets it too.
        h.on_completion(
            t(100),
            &Completion::send(HealthStatus::LocalError, nid(L1), None, 0),
        );
        let now = h.poll_timeout().unwrap();
        h.handle_timeout(now);
        assert_eq!(h.ni_health(NiSide::Local, nid(L1)).unwrap().ping_count, 1);
        h.on_completion(
            now,
            &Completion::send(HealthStatus::Ok, nid(L1), Some(nid(P1)), 2),
        );
        assert_eq!(h.ni_health(NiSide::Local, nid(L1)).unwrap().ping_count, 0);
    }

    #[test]
    fn peer_recovery_needs_a_sign_of_life_and_respects_limit() {
        let mut h = two_rail();
        let drop = Completion::send(HealthStatus::RemoteDropped, nid(L1), Some(nid(P1)), 2);
        // Never seen alive: lowered but not recovered.
        h.on_completion(t(1), &drop);
        assert_eq!(h.peer_health(nid(P1)).value(), 900);
        assert_eq!(h.poll_timeout(), None);
        // Seen alive, then failing: recovery pings.
        h.on_completion(t(2), &Completion::receive(nid(L1), nid(P1), 2));
        assert_eq!(h.peer_health(nid(P1)).value(), 1000);
        h.on_completion(t(3), &drop);
        assert_eq!(h.poll_timeout(), Some(t(3)));
        assert_eq!(h.handle_timeout(t(3)).len(), 1);
        // A successful recovery reply resets the back-off.
        let ping = RecoveryPing {
            side: NiSide::Peer,
            nid: nid(P1),
        };
        h.on_recovery_ping_result(t(3), ping, false);
        assert_eq!(h.peer_health(nid(P1)).value(), 800);
        assert_eq!(h.ni_health(NiSide::Peer, nid(P1)).unwrap().ping_count, 1);
        h.on_recovery_ping_result(t(4), ping, true);
        assert_eq!(h.ni_health(NiSide::Peer, nid(P1)).unwrap().ping_count, 0);
        assert_eq!(h.peer_health(nid(P1)).value(), 900);

        // With a 60 s limit, a peer NI silent for longer leaves recovery.
        let mut h = HealthMonitor::new(HealthConfig {
            recovery_limit: Some(Duration::from_secs(60)),
            ..HealthConfig::default()
        })
        .unwrap();
        h.add_local_ni(nid(L1));
        h.add_local_ni(nid(L2));
        h.on_completion(t(0), &Completion::receive(nid(L1), nid(P1), 2));
        h.on_completion(t(30), &drop);
        assert_eq!(h.handle_timeout(t(30)).len(), 1);
        assert!(h.handle_timeout(t(100)).is_empty());
        assert_eq!(h.poll_timeout(), None);
    }

    #[test]
    fn response_timeout_lowers_next_hop() {
        let mut h = two_rail();
        h.on_response_timeout(t(1), nid(P1));
        assert_eq!(h.peer_health(nid(P1)).value(), 900);
        assert_eq!(h.stats().response_timeouts, 1);
        assert_eq!(
            h.max_health(NiSide::Peer, [nid(P1), nid("10.0.0.9@tcp")]),
            Some(Health::MAX)
        );
    }

    #[test]
    fn set_health_by_hand() {
        let mut h = two_rail();
        let v = h.set_health(t(1), NiSide::Local, nid(L2), Health::ZERO);
        assert_eq!(v.local_status, Some(LocalStatusChange::Down(nid(L2))));
        assert_eq!(h.poll_timeout(), Some(t(1)));
        let v = h.set_health(t(2), NiSide::Local, nid(L2), Health::MAX);
        assert_eq!(v.local_status, Some(LocalStatusChange::Up(nid(L2))));
        assert_eq!(h.poll_timeout(), None);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn health_stays_in_range(
                ops in proptest::collection::vec((0usize..11, any::<bool>(), 1usize..3, 0u64..50), 1..200),
                sensitivity in 0u32..=1000,
            ) {
                let config = HealthConfig {
                    sensitivity,
                    retry_count: if sensitivity == 0 { 0 } else { 2 },
                    ..HealthConfig::default()
                };
                let mut h = HealthMonitor::new(config).unwrap();
                h.add_local_ni(nid(L1));
                h.add_local_ni(nid(L2));
                let mut now = t(0);
                for (status, recv, peers, dt) in ops {
                    now += Duration::from_secs(dt);
                    let status = HealthStatus::ALL[status];
                    let c = if recv {
                        Completion::receive(nid(L1), nid(P1), peers)
                    } else {
                        Completion::send(status, nid(L1), Some(nid(P1)), peers)
                    };
                    let v = h.on_completion(now, &c);
                    prop_assert!(!v.resend || status.reaction().resend);
                    for p in h.handle_timeout(now) {
                        h.on_recovery_ping_result(now, p, dt % 2 == 0);
                    }
                    for n in [L1, L2] {
                        prop_assert!(h.local_health(nid(n)).value() <= MAX_HEALTH);
                    }
                    prop_assert!(h.peer_health(nid(P1)).value() <= MAX_HEALTH);
                    if let Some(next) = h.poll_timeout() {
                        prop_assert!(next > now, "due pings were all sent");
                    }
                }
            }
        }
    }
}
