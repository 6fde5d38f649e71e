//! Fault injection: LNet's drop and delay rules (`net_fault.c`, `lctl net_drop_add`,
//! `lctl net_delay_add`).
//!
//! A rule matches messages by source NID, destination NID, local (receiving)
//! NID, portal mask and message-type mask; `ANY` matches every NID and
//! `255.255.255.255@net` every NID on that net. A portal mask restricts a rule
//! to PUT and GET. A rule fires either once in every `rate` matches (at a
//! random position within each window of `rate` matches) or once per
//! `interval` (at a random time within each window).
//!
//! * **Drop rules without a health mask** act on *receive*: the message is
//!   lost silently before any processing ([`FaultInjector::on_receive`]).
//! * **Drop rules with a health mask** act on *send*: the message fails as if
//!   the network reported one of the health errors in the mask
//!   ([`FaultInjector::on_send`]), which drives the normal health and resend
//!   logic.
//! * **Delay rules** act on both paths: the message is held for `latency`.
//!
//! The injector is sans-IO: it takes `now` and returns verdicts; the node
//! holds delayed messages and releases them when their time comes. Its
//! randomness comes from a seeded [`Rng`], so runs replay exactly.

use std::time::Duration;

use crate::ids::Nid;
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::{MAX_PORTALS, MsgType};

/// Errors adding fault rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// `rate` and `interval` are both zero or both set.
    #[error("exactly one of rate or interval must be set")]
    BadTrigger,
    /// A delay rule needs a non-zero latency.
    #[error("delay rule without latency")]
    NoLatency,
    /// The health mask has bits outside the known health errors.
    #[error("unknown health error bits {0:#x}")]
    BadHealthMask(u32),
}

/// Message-type mask bits (`-m` option): ACK 0x1, PUT 0x2, GET 0x4, REPLY 0x8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MsgMask(pub u32);

impl MsgMask {
    /// Every message type (a mask of 0 means the same).
    pub const ALL: Self = Self(0xf);

    /// The mask with only `ty`'s bit (HELLO has none).
    #[must_use]
    pub const fn of(ty: MsgType) -> Self {
        Self(match ty {
            MsgType::Ack => 0x1,
            MsgType::Put => 0x2,
            MsgType::Get => 0x4,
            MsgType::Reply => 0x8,
            MsgType::Hello => 0,
        })
    }

    /// Union.
    #[must_use]
    pub const fn with(self, ty: MsgType) -> Self {
        Self(self.0 | Self::of(ty).0)
    }

    fn matches(self, ty: MsgType) -> bool {
        let mask = if self.0 == 0 { Self::ALL.0 } else { self.0 };
        mask & Self::of(ty).0 != 0
    }
}

/// One simulated health error (`-e` option), as the bit of `lnet_msg_hstatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HealthError {
    /// `LOCAL_INTERRUPT` (1<<1).
    LocalInterrupt,
    /// `LOCAL_DROPPED` (1<<2).
    LocalDropped,
    /// `LOCAL_ABORTED` (1<<3).
    LocalAborted,
    /// `LOCAL_NO_ROUTE` (1<<4).
    LocalNoRoute,
    /// `LOCAL_ERROR` (1<<5).
    LocalError,
    /// `LOCAL_TIMEOUT` (1<<6).
    LocalTimeout,
    /// `REMOTE_ERROR` (1<<7).
    RemoteError,
    /// `REMOTE_DROPPED` (1<<8).
    RemoteDropped,
    /// `REMOTE_TIMEOUT` (1<<9).
    RemoteTimeout,
    /// `NETWORK_TIMEOUT` (1<<10).
    NetworkTimeout,
}

impl HealthError {
    /// Every health error, in bit order.
    pub const ALL: [Self; 10] = [
        Self::LocalInterrupt,
        Self::LocalDropped,
        Self::LocalAborted,
        Self::LocalNoRoute,
        Self::LocalError,
        Self::LocalTimeout,
        Self::RemoteError,
        Self::RemoteDropped,
        Self::RemoteTimeout,
        Self::NetworkTimeout,
    ];

    /// The mask bit.
    #[must_use]
    pub const fn bit(self) -> u32 {
        1 << (match self {
            Self::LocalInterrupt => 1,
            Self::LocalDropped => 2,
            Self::LocalAborted => 3,
            Self::LocalNoRoute => 4,
            Self::LocalError => 5,
            Self::LocalTimeout => 6,
            Self::RemoteError => 7,
            Self::RemoteDropped => 8,
            Self::RemoteTimeout => 9,
            Self::NetworkTimeout => 10,
        })
    }

    /// A mask of several errors.
    #[must_use]
    pub fn mask(errors: &[Self]) -> u32 {
        errors.iter().fold(0, |m, e| m | e.bit())
    }
}

/// `lnet_fault_attr` minus the trigger: which messages a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultMatch {
    /// Source NID (header `src_nid`); `ANY` or a net wildcard allowed.
    pub src: Nid,
    /// Destination NID (header `dest_nid`).
    pub dst: Nid,
    /// Local NID (the receiving NI; `ANY` on the send path).
    pub local: Nid,
    /// Portal bitmask; non-zero restricts the rule to PUT/GET on those portals.
    pub portal_mask: u64,
    /// Message types.
    pub msg_mask: MsgMask,
}

impl FaultMatch {
    /// Matches everything.
    pub const ANY: Self = Self {
        src: Nid::ANY,
        dst: Nid::ANY,
        local: Nid::ANY,
        portal_mask: 0,
        msg_mask: MsgMask(0),
    };

    /// Matches messages from `src` to `dst`.
    #[must_use]
    pub const fn between(src: Nid, dst: Nid) -> Self {
        Self {
            src,
            dst,
            ..Self::ANY
        }
    }

    /// Restricts to message types.
    #[must_use]
    pub const fn types(mut self, mask: MsgMask) -> Self {
        self.msg_mask = mask;
        self
    }

    /// Restricts to a portal (PUT/GET only).
    #[must_use]
    pub const fn portal(mut self, portal: u32) -> Self {
        if portal < MAX_PORTALS {
            self.portal_mask |= 1 << portal;
        }
        self
    }

    fn nid_matches(rule: Nid, nid: Nid) -> bool {
        rule.is_any()
            || rule == nid
            || (rule.is_net_wildcard() && !nid.is_any() && rule.net() == nid.net())
    }

    /// Whether a message matches.
    #[must_use]
    pub fn matches(&self, m: &FaultMsg) -> bool {
        if !Self::nid_matches(self.src, m.src)
            || !Self::nid_matches(self.dst, m.dst)
            || !Self::nid_matches(self.local, m.local)
        {
            return false;
        }
        if !self.msg_mask.matches(m.msg_type) {
            return false;
        }
        if self.portal_mask != 0 {
            match (m.msg_type, m.portal) {
                (MsgType::Put | MsgType::Get, Some(p)) if p < MAX_PORTALS => {
                    if self.portal_mask & (1 << p) == 0 {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        true
    }
}

/// The facts a rule looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultMsg {
    /// Header source NID.
    pub src: Nid,
    /// Header destination NID.
    pub dst: Nid,
    /// Receiving NI (`ANY` when sending).
    pub local: Nid,
    /// Message type.
    pub msg_type: MsgType,
    /// Portal of a PUT/GET.
    pub portal: Option<u32>,
}

/// When a rule fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// Once in every `n` matching messages (random position per window); 1 = always.
    Rate(u32),
    /// Once per interval, at a random time within each window.
    Interval(Duration),
}

/// A drop rule (`lnet_fault_attr.u.drop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropRuleSpec {
    /// Which messages.
    pub matcher: FaultMatch,
    /// When.
    pub trigger: Trigger,
    /// Health errors to simulate on send (0 = silent drop on receive).
    pub health_mask: u32,
}

/// A delay rule (`lnet_fault_attr.u.delay`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DelayRuleSpec {
    /// Which messages.
    pub matcher: FaultMatch,
    /// When.
    pub trigger: Trigger,
    /// How long a matched message is held.
    pub latency: Duration,
}

/// Per-rule statistics (`lnet_fault_stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultStats {
    /// Messages that matched the rule's attributes.
    pub matched: u64,
    /// Matched PUTs.
    pub put: u64,
    /// Matched ACKs.
    pub ack: u64,
    /// Matched GETs.
    pub get: u64,
    /// Matched REPLYs.
    pub reply: u64,
    /// Messages dropped or delayed by the rule.
    pub fired: u64,
}

/// A rule id, for statistics and deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(u32);

#[derive(Clone, Debug)]
struct TriggerState {
    trigger: Trigger,
    /// Rate: index of the message to fire on.
    fire_at: u64,
    /// Interval: start of the next window and the firing time in the current one.
    window_end: Time,
    fire_time: Option<Time>,
}

impl TriggerState {
    fn new(trigger: Trigger, now: Time, rng: &mut Rng) -> Self {
        let mut s = Self {
            trigger,
            fire_at: 0,
            window_end: now,
            fire_time: None,
        };
        s.reset(now, rng);
        s
    }

    fn reset(&mut self, now: Time, rng: &mut Rng) {
        match self.trigger {
            Trigger::Rate(n) => self.fire_at = rng.below(u64::from(n.max(1))),
            Trigger::Interval(iv) => {
                self.window_end = now + iv;
                self.fire_time = Some(now + random_within(iv, rng));
            }
        }
    }

    /// Decides for the `count`-th (0-based) matching message at `now`.
    fn fires(&mut self, count: u64, now: Time, rng: &mut Rng) -> bool {
        match self.trigger {
            Trigger::Rate(n) => {
                let n = u64::from(n.max(1));
                let fire = count == self.fire_at;
                let next = count + 1;
                if next.is_multiple_of(n) {
                    self.fire_at = next + rng.below(n);
                }
                fire
            }
            Trigger::Interval(iv) => {
                if iv.is_zero() {
                    return false;
                }
                // Move to the window containing `now`.
                while now >= self.window_end {
                    let start = self.window_end;
                    self.window_end = start + iv;
                    self.fire_time = Some(start + random_within(iv, rng));
                }
                match self.fire_time {
                    Some(t) if now >= t => {
                        self.fire_time = None;
                        true
                    }
                    _ => false,
                }
            }
        }
    }
}

fn random_within(iv: Duration, rng: &mut Rng) -> Duration {
    let nanos = u64::try_from(iv.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.below(nanos))
}

#[derive(Clone, Debug)]
struct Rule<S> {
    id: RuleId,
    spec: S,
    state: TriggerState,
    stats: FaultStats,
}

impl<S> Rule<S> {
    fn count(&mut self, ty: MsgType) -> u64 {
        let n = self.stats.matched;
        self.stats.matched += 1;
        match ty {
            MsgType::Put => self.stats.put += 1,
            MsgType::Ack => self.stats.ack += 1,
            MsgType::Get => self.stats.get += 1,
            MsgType::Reply => self.stats.reply += 1,
            MsgType::Hello => {}
        }
        n
    }
}

/// What to do with a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecvVerdict {
    /// Process it.
    Pass,
    /// Lose it silently (counted as a drop).
    Drop(RuleId),
    /// Hold it until the given time, then process it.
    Delay(RuleId, Time),
}

/// What to do with a message about to be handed to the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendVerdict {
    /// Send it.
    Pass,
    /// Fail it with this simulated health error.
    Fail(RuleId, HealthError),
    /// Hold it until the given time, then send it.
    Delay(RuleId, Time),
}

/// The drop and delay rules of one node.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    rng: Rng,
    next_id: u32,
    drops: Vec<Rule<DropRuleSpec>>,
    delays: Vec<Rule<DelayRuleSpec>>,
}

impl FaultInjector {
    /// No rules; randomness seeded with `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed),
            next_id: 0,
            drops: Vec::new(),
            delays: Vec::new(),
        }
    }

    /// Whether any rule is installed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.drops.is_empty() && self.delays.is_empty()
    }

    fn check_trigger(t: Trigger) -> Result<(), FaultError> {
        match t {
            Trigger::Rate(0) => Err(FaultError::BadTrigger),
            Trigger::Interval(d) if d.is_zero() => Err(FaultError::BadTrigger),
            _ => Ok(()),
        }
    }

    fn new_id(&mut self) -> RuleId {
        self.next_id += 1;
        RuleId(self.next_id)
    }

    /// `net_drop_add`.
    ///
    /// # Errors
    /// Zero rate/interval, unknown health bits.
    pub fn add_drop(&mut self, spec: DropRuleSpec, now: Time) -> Result<RuleId, FaultError> {
        Self::check_trigger(spec.trigger)?;
        let known = HealthError::mask(&HealthError::ALL);
        // 0xffffffff means "fully random" in Lustre; accept it as "any known error".
        if spec.health_mask != u32::MAX && spec.health_mask & !known != 0 {
            return Err(FaultError::BadHealthMask(spec.health_mask & !known));
        }
        let id = self.new_id();
        let state = TriggerState::new(spec.trigger, now, &mut self.rng);
        self.drops.push(Rule {
            id,
            spec,
            state,
            stats: FaultStats::default(),
        });
        tracing::debug!(target: "colibri_lnet::fault", ?id, ?spec, "drop rule added");
        Ok(id)
    }

    /// `net_delay_add`.
    ///
    /// # Errors
    /// Zero rate/interval or latency.
    pub fn add_delay(&mut self, spec: DelayRuleSpec, now: Time) -> Result<RuleId, FaultError> {
        Self::check_trigger(spec.trigger)?;
        if spec.latency.is_zero() {
            return Err(FaultError::NoLatency);
        }
        let id = self.new_id();
        let state = TriggerState::new(spec.trigger, now, &mut self.rng);
        self.delays.push(Rule {
            id,
            spec,
            state,
            stats: FaultStats::default(),
        });
        tracing::debug!(target: "colibri_lnet::fault", ?id, ?spec, "delay rule added");
        Ok(id)
    }

    /// `net_drop_del` / `net_delay_del` by source and destination (`ANY` =
    /// wildcard; both `ANY` deletes all). Returns the ids removed; the node
    /// must release messages held by removed delay rules.
    pub fn delete(&mut self, src: Nid, dst: Nid) -> Vec<RuleId> {
        let hit = |m: &FaultMatch| (src.is_any() || m.src == src) && (dst.is_any() || m.dst == dst);
        let mut removed = Vec::new();
        self.drops.retain(|r| {
            let del = hit(&r.spec.matcher);
            if del {
                removed.push(r.id);
            }
            !del
        });
        self.delays.retain(|r| {
            let del = hit(&r.spec.matcher);
            if del {
                removed.push(r.id);
            }
            !del
        });
        removed
    }

    /// Deletes one rule by id. Returns whether it existed.
    pub fn remove(&mut self, id: RuleId) -> bool {
        let before = self.drops.len() + self.delays.len();
        self.drops.retain(|r| r.id != id);
        self.delays.retain(|r| r.id != id);
        before != self.drops.len() + self.delays.len()
    }

    /// `net_drop_reset` / `net_delay_reset`: zero statistics and re-randomize.
    pub fn reset(&mut self, now: Time) {
        for r in &mut self.drops {
            r.stats = FaultStats::default();
            r.state.reset(now, &mut self.rng);
        }
        for r in &mut self.delays {
            r.stats = FaultStats::default();
            r.state.reset(now, &mut self.rng);
        }
    }

    /// `net_drop_reset` alone: the drop rules' statistics zeroed and
    /// triggers re-randomized.
    pub fn reset_drops(&mut self, now: Time) {
        for r in &mut self.drops {
            r.stats = FaultStats::default();
            r.state.reset(now, &mut self.rng);
        }
    }

    /// `net_delay_reset` alone.
    pub fn reset_delays(&mut self, now: Time) {
        for r in &mut self.delays {
            r.stats = FaultStats::default();
            r.state.reset(now, &mut self.rng);
        }
    }

    /// Statistics of a rule.
    #[must_use]
    pub fn stats(&self, id: RuleId) -> Option<FaultStats> {
        self.drops
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.stats)
            .or_else(|| self.delays.iter().find(|r| r.id == id).map(|r| r.stats))
    }

    fn delay_verdict(&mut self, m: &FaultMsg, now: Time) -> Option<(RuleId, Time)> {
        for r in &mut self.delays {
            if !r.spec.matcher.matches(m) {
                continue;
            }
            let n = r.count(m.msg_type);
            if r.state.fires(n, now, &mut self.rng) {
                r.stats.fired += 1;
                return Some((r.id, now + r.spec.latency));
            }
        }
        None
    }

    /// Applies the rules to a received message (`lnet_parse`): drop rules
    /// without a health mask, then delay rules. First rule that fires wins.
    pub fn on_receive(&mut self, m: &FaultMsg, now: Time) -> RecvVerdict {
        for r in &mut self.drops {
            if r.spec.health_mask != 0 || !r.spec.matcher.matches(m) {
                continue;
            }
            let n = r.count(m.msg_type);
            if r.state.fires(n, now, &mut self.rng) {
                r.stats.fired += 1;
                tracing::debug!(target: "colibri_lnet::fault", id = ?r.id, ?m, "dropping received message");
                return RecvVerdict::Drop(r.id);
            }
        }
        match self.delay_verdict(m, now) {
            Some((id, until)) => RecvVerdict::Delay(id, until),
            None => RecvVerdict::Pass,
        }
    }

    /// Applies the rules to a message about to be sent (after credits): drop
    /// rules with a health mask (the message fails with a random error from
    /// the mask), then delay rules.
    pub fn on_send(&mut self, m: &FaultMsg, now: Time) -> SendVerdict {
        for r in &mut self.drops {
            if r.spec.health_mask == 0 || !r.spec.matcher.matches(m) {
                continue;
            }
            let n = r.count(m.msg_type);
            if r.state.fires(n, now, &mut self.rng) {
                r.stats.fired += 1;
                let choices: Vec<HealthError> = HealthError::ALL
                    .into_iter()
                    .filter(|e| r.spec.health_mask & e.bit() != 0)
                    .collect();
                let idx = self.rng.below(choices.len() as u64) as usize;
                let err = choices.get(idx).copied().unwrap_or(HealthError::LocalError);
                tracing::debug!(target: "colibri_lnet::fault", id = ?r.id, ?m, ?err, "failing sent message");
                return SendVerdict::Fail(r.id, err);
            }
        }
        match self.delay_verdict(m, now) {
            Some((id, until)) => SendVerdict::Delay(id, until),
            None => SendVerdict::Pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn msg(src: &str, dst: &str, ty: MsgType, portal: Option<u32>) -> FaultMsg {
        FaultMsg {
            src: nid(src),
            dst: nid(dst),
            local: Nid::ANY,
            msg_type: ty,
            portal,
        }
    }

    #[test]
    fn nid_matching_with_wildcards() {
        let m = msg("10.0.0.1@tcp", "10.0.0.2@tcp", MsgType::Put, Some(4));
        assert!(FaultMatch::ANY.matches(&m));
        assert!(FaultMatch::between(nid("10.0.0.1@tcp"), Nid::ANY).matches(&m));
        assert!(!FaultMatch::between(nid("10.0.0.3@tcp"), Nid::ANY).matches(&m));
        let all_tcp: Nid = "255.255.255.255@tcp".parse().unwrap();
        assert!(FaultMatch::between(all_tcp, all_tcp).matches(&m));
        let all_o2ib: Nid = "255.255.255.255@o2ib".parse().unwrap();
        assert!(!FaultMatch::between(all_o2ib, Nid::ANY).matches(&m));
        let mut local = FaultMatch::ANY;
        local.local = nid("10.0.0.9@tcp");
        assert!(!local.matches(&m));
    }

    #[test]
    fn type_and_portal_masks() {
        let put = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(4));
        let ack = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Ack, None);
        let puts = FaultMatch::ANY.types(MsgMask::of(MsgType::Put));
        assert!(puts.matches(&put));
        assert!(!puts.matches(&ack));
        assert!(FaultMatch::ANY.types(MsgMask::ALL).matches(&ack));
        let p4 = FaultMatch::ANY.portal(4);
        assert!(p4.matches(&put));
        assert!(!FaultMatch::ANY.portal(5).matches(&put));
        // A portal mask restricts the rule to PUT/GET.
        assert!(!p4.matches(&ack));
        assert_eq!(MsgMask::of(MsgType::Ack).with(MsgType::Reply), MsgMask(0x9));
    }

    #[test]
    fn resets_are_per_kind() {
        let mut f = FaultInjector::new(3);
        let drop = f
            .add_drop(
                DropRuleSpec {
                    matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Put)),
                    trigger: Trigger::Rate(1),
                    health_mask: 0,
                },
                Time::ZERO,
            )
            .unwrap();
        let delay = f
            .add_delay(
                DelayRuleSpec {
                    matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Get)),
                    trigger: Trigger::Rate(1),
                    latency: Duration::from_secs(1),
                },
                Time::ZERO,
            )
            .unwrap();
        let _ = f.on_receive(
            &msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(4)),
            Time::ZERO,
        );
        let _ = f.on_receive(
            &msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Get, Some(4)),
            Time::ZERO,
        );
        assert_eq!(f.stats(drop).unwrap().matched, 1);
        assert_eq!(f.stats(delay).unwrap().matched, 1);
        f.reset_drops(Time::ZERO);
        assert_eq!(f.stats(drop).unwrap(), FaultStats::default());
        assert_eq!(f.stats(delay).unwrap().matched, 1);
        f.reset_delays(Time::ZERO);
        assert_eq!(f.stats(delay).unwrap(), FaultStats::default());
        // The rules still fire after a reset.
        let _ = f.on_receive(
            &msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(4)),
            Time::ZERO,
        );
        assert_eq!(f.stats(drop).unwrap().fired, 1);
    }

    #[test]
    fn rate_drops_one_per_window() {
        let mut f = FaultInjector::new(1);
        let id = f
            .add_drop(
                DropRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(4),
                    health_mask: 0,
                },
                Time::ZERO,
            )
            .unwrap();
        let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(1));
        for window in 0..25 {
            let drops = (0..4)
                .filter(|_| matches!(f.on_receive(&m, Time::ZERO), RecvVerdict::Drop(_)))
                .count();
            assert_eq!(drops, 1, "window {window}");
        }
        let s = f.stats(id).unwrap();
        assert_eq!((s.matched, s.put, s.fired), (100, 100, 25));
        // Health-mask rules never act on receive; plain ones never on send.
        assert_eq!(f.on_send(&m, Time::ZERO), SendVerdict::Pass);
    }

    #[test]
    fn rate_one_drops_everything() {
        let mut f = FaultInjector::new(9);
        f.add_drop(
            DropRuleSpec {
                matcher: FaultMatch::ANY,
                trigger: Trigger::Rate(1),
                health_mask: 0,
            },
            Time::ZERO,
        )
        .unwrap();
        let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Get, Some(1));
        assert!((0..10).all(|_| matches!(f.on_receive(&m, Time::ZERO), RecvVerdict::Drop(_))));
    }

    #[test]
    fn interval_drops_one_per_window() {
        let mut f = FaultInjector::new(3);
        f.add_drop(
            DropRuleSpec {
                matcher: FaultMatch::ANY,
                trigger: Trigger::Interval(Duration::from_secs(10)),
                health_mask: 0,
            },
            Time::ZERO,
        )
        .unwrap();
        let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(1));
        // One message every 100 ms for 60 s: exactly one drop per 10 s window.
        let mut per_window = [0u32; 6];
        for i in 0..600u64 {
            let now = Time::from_millis(i * 100);
            if matches!(f.on_receive(&m, now), RecvVerdict::Drop(_)) {
                per_window[(i / 100) as usize] += 1;
            }
        }
        assert_eq!(per_window, [1; 6]);
    }

    #[test]
    fn health_rules_fail_on_send_with_a_masked_error() {
        let mut f = FaultInjector::new(5);
        let mask = HealthError::mask(&[HealthError::RemoteDropped, HealthError::LocalTimeout]);
        f.add_drop(
            DropRuleSpec {
                matcher: FaultMatch::ANY,
                trigger: Trigger::Rate(1),
                health_mask: mask,
            },
            Time::ZERO,
        )
        .unwrap();
        let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(1));
        assert_eq!(f.on_receive(&m, Time::ZERO), RecvVerdict::Pass);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            match f.on_send(&m, Time::ZERO) {
                SendVerdict::Fail(_, e) => {
                    seen.insert(e);
                }
                other => panic!("expected failure, got {other:?}"),
            }
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            vec![HealthError::LocalTimeout, HealthError::RemoteDropped]
        );
        assert_eq!(
            f.add_drop(
                DropRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(1),
                    health_mask: 1,
                },
                Time::ZERO
            ),
            Err(FaultError::BadHealthMask(1))
        );
    }

    #[test]
    fn delay_rules_on_both_paths() {
        let mut f = FaultInjector::new(5);
        let id = f
            .add_delay(
                DelayRuleSpec {
                    matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Reply)),
                    trigger: Trigger::Rate(1),
                    latency: Duration::from_secs(3),
                },
                Time::ZERO,
            )
            .unwrap();
        let now = Time::from_secs(1);
        let reply = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Reply, None);
        assert_eq!(
            f.on_receive(&reply, now),
            RecvVerdict::Delay(id, Time::from_secs(4))
        );
        assert_eq!(
            f.on_send(&reply, now),
            SendVerdict::Delay(id, Time::from_secs(4))
        );
        let put = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(0));
        assert_eq!(f.on_receive(&put, now), RecvVerdict::Pass);
        assert_eq!(f.stats(id).unwrap().reply, 2);
        assert_eq!(
            f.add_delay(
                DelayRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(1),
                    latency: Duration::ZERO
                },
                now
            ),
            Err(FaultError::NoLatency)
        );
        assert_eq!(
            f.add_delay(
                DelayRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(0),
                    latency: Duration::from_secs(1)
                },
                now
            ),
            Err(FaultError::BadTrigger)
        );
    }

    #[test]
    fn delete_and_reset() {
        let mut f = FaultInjector::new(5);
        let a = nid("1.1.1.1@tcp");
        let b = nid("2.2.2.2@tcp");
        let spec = |src, dst| DropRuleSpec {
            matcher: FaultMatch::between(src, dst),
            trigger: Trigger::Rate(1),
            health_mask: 0,
        };
        let r1 = f.add_drop(spec(a, b), Time::ZERO).unwrap();
        let r2 = f.add_drop(spec(b, a), Time::ZERO).unwrap();
        f.on_receive(
            &msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(0)),
            Time::ZERO,
        );
        assert_eq!(f.stats(r1).unwrap().matched, 1);
        f.reset(Time::ZERO);
        assert_eq!(f.stats(r1).unwrap().matched, 0);
        assert_eq!(f.delete(a, Nid::ANY), vec![r1]);
        assert!(f.remove(r2));
        assert!(!f.remove(r2));
        assert!(f.is_empty());
    }

    #[test]
    fn same_seed_same_decisions() {
        let run = |seed| {
            let mut f = FaultInjector::new(seed);
            f.add_drop(
                DropRuleSpec {
                    matcher: FaultMatch::ANY,
                    trigger: Trigger::Rate(7),
                    health_mask: 0,
                },
                Time::ZERO,
            )
            .unwrap();
            let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(1));
            (0..70)
                .map(|_| matches!(f.on_receive(&m, Time::ZERO), RecvVerdict::Drop(_)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(11), run(11));
    }

    proptest! {
        #[test]
        fn rate_rule_fires_exactly_once_per_window(seed in any::<u64>(), rate in 1u32..20, windows in 1u64..10) {
            let mut f = FaultInjector::new(seed);
            let id = f.add_drop(DropRuleSpec { matcher: FaultMatch::ANY, trigger: Trigger::Rate(rate), health_mask: 0 }, Time::ZERO).unwrap();
            let m = msg("1.1.1.1@tcp", "2.2.2.2@tcp", MsgType::Put, Some(1));
            for _ in 0..(u64::from(rate) * windows) {
                let _ = f.on_receive(&m, Time::ZERO);
            }
            prop_assert_eq!(f.stats(id).unwrap().fired, windows);
        }
    }
}
