//! User Defined Selection Policies (Lustre's UDSP, `lnetctl udsp`).
//!
//! A policy is a rule that makes some interfaces preferred over others
//! when Multi-Rail selection ([`crate::select`]) chooses a pathway. Each
//! rule names interfaces by an expression, a net (`tcp`, `tcp1`,
//! `o2ib[0-3]`) or NIDs (`10.0.0.[1-9]@tcp`, `*.*.*.*@tcp1`), in one or
//! two of three roles, and carries an action:
//!
//! | rule | what it sets |
//! |---|---|
//! | `--src EXPR --priority P` | the priority of our nets (a net expression) or NIs (NIDs) it matches |
//! | `--dst EXPR --priority P` | the priority of the peer nets or peer NIs it matches |
//! | `--src A --dst B` | peer NIs matching B prefer our NIs matching A (Lustre's NID pair rule) |
//! | `--dst B --rte R` | peer NIs matching B prefer gateways matching R (router rule) |
//!
//! Priority 0 is the best; an interface no rule matches has the lowest,
//! [`DEFAULT_PRIORITY`]. Health always comes first: priorities and
//! preferences only rank interfaces that are equally healthy.
//!
//! Rules are kept in index order. Lustre applies every rule to every
//! matching construct in reverse index order, so the rule with the
//! lowest index that matches an interface decides; here that rule is
//! found when selection asks (the same outcome, and a deleted rule takes
//! its effect with it at once, where Lustre resets what it had set and
//! leaves other rules' effects on those interfaces until they are applied
//! again). Adding a rule with the same criteria as an existing one
//! changes that one's priority, or fails with `EALREADY` when it is the
//! same rule (`lnet_udsp_add_policy`).
//!
//! ```
//! use colibri_lnet::udsp::{Rule, Udsp};
//!
//! let mut u = Udsp::default();
//! u.add(Rule::parse(Some("tcp1"), None, None, Some(0))?, None)?;
//! assert_eq!(u.local_net_priority("tcp1".parse()?), 0);
//! assert_eq!(u.local_net_priority("tcp".parse()?), colibri_lnet::udsp::DEFAULT_PRIORITY);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use crate::ids::{LndType, Net, Nid};

/// The priority of an interface no rule matches
/// (`LNET_MAX_SELECTION_PRIORITY`, shown as -1 by lnetctl).
pub const DEFAULT_PRIORITY: u32 = crate::select::DEFAULT_PRIORITY;

/// The most rules a node keeps.
pub const MAX_RULES: usize = 1024;

/// Why a rule could not be made or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UdspError {
    /// An expression that is neither a net nor a NID expression.
    #[error("invalid expression '{expr}': {why}")]
    BadExpr {
        /// The text.
        expr: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A combination of roles and action Lustre does not apply.
    #[error("invalid rule: {0}")]
    BadRule(&'static str),
    /// The same rule is there already (`-EALREADY`).
    #[error("the rule is there already (index {0})")]
    Exists(usize),
    /// No rule at that index (`-ENOENT`).
    #[error("no rule at index {0}")]
    NoSuchIndex(usize),
    /// [`MAX_RULES`] rules are there already.
    #[error("too many rules (at most {MAX_RULES})")]
    TooMany,
}

/// Numbers a part of an expression stands for: `*`, or ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Nums {
    Any,
    /// `(first, last, step)` ranges.
    Ranges(Vec<(u64, u64, u64)>),
}

impl Nums {
    fn matches(&self, n: u64) -> bool {
        match self {
            Self::Any => true,
            Self::Ranges(r) => r
                .iter()
                .any(|&(a, b, step)| n >= a && n <= b && (n - a).is_multiple_of(step)),
        }
    }

    /// One dotted part: `*`, a number, or `[ranges]`.
    fn parse(part: &str, expr: &str) -> Result<Self, UdspError> {
        let bad = |why| UdspError::BadExpr {
            expr: expr.to_owned(),
            why,
        };
        if part == "*" {
            return Ok(Self::Any);
        }
        let inner = match part.strip_prefix('[') {
            Some(rest) => rest
                .strip_suffix(']')
                .ok_or_else(|| bad("unbalanced brackets"))?,
            None => part,
        };
        let num = |t: &str| -> Result<u64, UdspError> {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("not a decimal number"));
            }
            t.parse().map_err(|_| bad("number too large"))
        };
        let mut ranges = Vec::new();
        for r in inner.split(',') {
            if r.trim() == "*" {
                return Ok(Self::Any);
            }
            let (span, step) = match r.split_once('/') {
                Some((s, step)) => (s, num(step)?),
                None => (r, 1),
            };
            if step == 0 {
                return Err(bad("a step of 0"));
            }
            let (a, b) = match span.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let n = num(span)?;
                    (n, n)
                }
            };
            if b < a {
                return Err(bad("the end of a range is below its start"));
            }
            ranges.push((a, b, step));
        }
        Ok(Self::Ranges(ranges))
    }
}

/// A net expression: an LND type and the net numbers it covers (`tcp` is
/// `tcp0`, as in a NID).
#[derive(Clone, Debug, PartialEq, Eq)]
struct NetExpr {
    lnd: LndType,
    nums: Nums,
}

impl NetExpr {
    fn parse(text: &str, expr: &str) -> Result<Self, UdspError> {
        let bad = |why| UdspError::BadExpr {
            expr: expr.to_owned(),
            why,
        };
        // The number is what ends the text: `[ranges]`, `*` or digits
        // (a type name may hold digits itself: `o2ib1`).
        let split = if text.ends_with(']') {
            text.rfind('[').unwrap_or(0)
        } else if let Some(stripped) = text.strip_suffix('*') {
            stripped.len()
        } else {
            text.trim_end_matches(|c: char| c.is_ascii_digit()).len()
        };
        let (name, num) = text.split_at(split);
        if name.is_empty() {
            return Err(bad("no net type"));
        }
        let net: Net = format!("{name}0")
            .parse()
            .map_err(|_| bad("unknown net type"))?;
        if net.is_lo() || !net.has_name() {
            return Err(bad("unknown net type"));
        }
        let nums = if num.is_empty() {
            Nums::Ranges(vec![(0, 0, 1)])
        } else {
            Nums::parse(num, expr)?
        };
        Ok(Self {
            lnd: net.lnd(),
            nums,
        })
    }

    fn matches(&self, net: Net) -> bool {
        net.lnd() == self.lnd && self.nums.matches(u64::from(net.number()))
    }
}

/// What a rule names: a net, or NIDs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    text: String,
    net: NetExpr,
    /// The address parts (dotted for IPv4 nets, one for numeric ones);
    /// `None` for a net expression.
    addr: Option<Vec<Nums>>,
}

impl Expr {
    /// Parses a net expression (`tcp`, `o2ib1`, `tcp[1-3]`) or a NID
    /// expression (`10.0.0.[1-9]@tcp`, `*@gni`, `192.168.*.*@o2ib`).
    ///
    /// # Errors
    /// [`UdspError::BadExpr`].
    pub fn parse(text: &str) -> Result<Self, UdspError> {
        let t = text.trim();
        let (addr, net) = match t.rsplit_once('@') {
            Some((a, n)) => (Some(a), n),
            None => (None, t),
        };
        let net = NetExpr::parse(net, t)?;
        let addr = addr
            .map(|a| {
                if a.is_empty() {
                    return Err(UdspError::BadExpr {
                        expr: t.to_owned(),
                        why: "no address",
                    });
                }
                split_parts(a)
                    .into_iter()
                    .map(|p| Nums::parse(p, t))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        if let Some(parts) = &addr
            && parts.len() != 1
            && parts.len() != 4
        {
            return Err(UdspError::BadExpr {
                expr: t.to_owned(),
                why: "an address has 4 dotted parts (IPv4) or one (a number)",
            });
        }
        Ok(Self {
            text: t.to_owned(),
            net,
            addr,
        })
    }

    /// Whether it names a net (else NIDs).
    #[must_use]
    pub const fn is_net(&self) -> bool {
        self.addr.is_none()
    }

    /// Whether net `net` is one it names (a NID expression names the nets
    /// of its NIDs).
    #[must_use]
    pub fn matches_net(&self, net: Net) -> bool {
        self.net.matches(net)
    }

    /// Whether `nid` is one it names (a net expression names every NID of
    /// its nets).
    #[must_use]
    pub fn matches(&self, nid: Nid) -> bool {
        if !self.net.matches(nid.net()) {
            return false;
        }
        let Some(parts) = &self.addr else {
            return true;
        };
        let a = nid.addr();
        match parts.len() {
            4 => a
                .to_be_bytes()
                .iter()
                .zip(parts)
                .all(|(b, p)| p.matches(u64::from(*b))),
            _ => parts[0].matches(u64::from(a)),
        }
    }
}

/// Splits an address at dots outside brackets.
fn split_parts(a: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in a.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            '.' if depth == 0 => {
                out.push(&a[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&a[start..]);
    out
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    src: Option<Expr>,
    dst: Option<Expr>,
    rte: Option<Expr>,
    /// `Some`: a priority rule; `None`: a preference (NID pair or router).
    priority: Option<u32>,
}

impl Rule {
    /// A rule from `lnetctl udsp add`'s arguments, checked as Lustre
    /// applies them: `src` or `dst` alone need a priority; `src` with
    /// `dst`, or `dst` with `rte`, make a preference and take none.
    ///
    /// # Errors
    /// [`UdspError::BadExpr`], [`UdspError::BadRule`].
    pub fn parse(
        src: Option<&str>,
        dst: Option<&str>,
        rte: Option<&str>,
        priority: Option<u32>,
    ) -> Result<Self, UdspError> {
        let p = |e: Option<&str>| e.map(Expr::parse).transpose();
        let rule = Self {
            src: p(src)?,
            dst: p(dst)?,
            rte: p(rte)?,
            priority,
        };
        match (&rule.src, &rule.dst, &rule.rte, priority) {
            (None, None, None, _) => Err(UdspError::BadRule("give --src, --dst or --rte")),
            (Some(_), _, Some(_), _) => Err(UdspError::BadRule(
                "a router rule takes --dst and --rte, not --src",
            )),
            (None, None, Some(_), _) => Err(UdspError::BadRule(
                "a router rule needs --dst (the peers that prefer those routers)",
            )),
            (Some(_), Some(_), None, Some(_)) | (None, Some(_), Some(_), Some(_)) => Err(
                UdspError::BadRule("a NID pair or router rule takes no --priority"),
            ),
            (Some(_), None, None, None) | (None, Some(_), None, None) => Err(UdspError::BadRule(
                "a --src or --dst rule alone needs --priority",
            )),
            _ => Ok(rule),
        }
    }

    /// The local interfaces it names.
    #[must_use]
    pub const fn src(&self) -> Option<&Expr> {
        self.src.as_ref()
    }

    /// The peer interfaces it names.
    #[must_use]
    pub const fn dst(&self) -> Option<&Expr> {
        self.dst.as_ref()
    }

    /// The gateways it names.
    #[must_use]
    pub const fn rte(&self) -> Option<&Expr> {
        self.rte.as_ref()
    }

    /// Its priority (a priority rule), or `None` (a preference).
    #[must_use]
    pub const fn priority(&self) -> Option<u32> {
        self.priority
    }

    fn same_criteria(&self, other: &Self) -> bool {
        self.src == other.src && self.dst == other.dst && self.rte == other.rte
    }
}

/// A node's policies, in index order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Udsp {
    rules: Vec<Rule>,
}

impl Udsp {
    /// The rules; a rule's index is its position.
    #[must_use]
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Adds `rule` at index `idx` (moving the rules from there on one
    /// place down) or, with `None` or an index past the end, after the
    /// last. A rule with the same criteria as one there is not added: a
    /// priority rule's priority is changed; otherwise [`UdspError::Exists`].
    /// Returns the rule's index.
    ///
    /// # Errors
    /// [`UdspError::Exists`], [`UdspError::TooMany`].
    pub fn add(&mut self, rule: Rule, idx: Option<usize>) -> Result<usize, UdspError> {
        if let Some(i) = self.rules.iter().position(|r| r.same_criteria(&rule)) {
            let old = &mut self.rules[i];
            return match (old.priority, rule.priority) {
                (Some(a), Some(b)) if a != b => {
                    old.priority = Some(b);
                    Ok(i)
                }
                _ => Err(UdspError::Exists(i)),
            };
        }
        if self.rules.len() >= MAX_RULES {
            return Err(UdspError::TooMany);
        }
        let at = idx.map_or(self.rules.len(), |i| i.min(self.rules.len()));
        self.rules.insert(at, rule);
        Ok(at)
    }

    /// Deletes the rule at `idx` (the ones after it move up), or every rule
    /// with `None`.
    ///
    /// # Errors
    /// [`UdspError::NoSuchIndex`].
    pub fn del(&mut self, idx: Option<usize>) -> Result<(), UdspError> {
        match idx {
            None => self.rules.clear(),
            Some(i) if i < self.rules.len() => {
                self.rules.remove(i);
            }
            Some(i) => return Err(UdspError::NoSuchIndex(i)),
        }
        Ok(())
    }

    /// Whether there is no rule (selection then skips every question).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The priority the first priority rule matching in `role` (net
    /// rules for nets, NID rules for NIDs) gives, else the default.
    fn priority_of(
        &self,
        role: fn(&Rule) -> Option<&Expr>,
        net_rule: bool,
        hit: impl Fn(&Expr) -> bool,
    ) -> u32 {
        // Every send asks: without rules, at once.
        if self.rules.is_empty() {
            return DEFAULT_PRIORITY;
        }
        self.rules
            .iter()
            .filter(|r| r.priority.is_some() && r.src.is_some() != r.dst.is_some())
            .filter_map(|r| role(r).map(|e| (e, r.priority)))
            .find(|(e, _)| e.is_net() == net_rule && hit(e))
            .and_then(|(_, p)| p)
            .unwrap_or(DEFAULT_PRIORITY)
    }

    /// The priority of our net `net` (`--src NET --priority P`).
    #[must_use]
    pub fn local_net_priority(&self, net: Net) -> u32 {
        self.priority_of(Rule::src, true, |e| e.matches_net(net))
    }

    /// The priority of our NI `nid` (`--src NIDS --priority P`).
    #[must_use]
    pub fn local_ni_priority(&self, nid: Nid) -> u32 {
        self.priority_of(Rule::src, false, |e| e.matches(nid))
    }

    /// The priority of a peer's net `net` (`--dst NET --priority P`).
    #[must_use]
    pub fn peer_net_priority(&self, net: Net) -> u32 {
        self.priority_of(Rule::dst, true, |e| e.matches_net(net))
    }

    /// The priority of peer NI `nid` (`--dst NIDS --priority P`).
    #[must_use]
    pub fn peer_ni_priority(&self, nid: Nid) -> u32 {
        self.priority_of(Rule::dst, false, |e| e.matches(nid))
    }

    /// Whether peer NI `peer_ni` prefers our NI `local`: the first NID pair
    /// rule whose `dst` names the peer NI decides (Lustre's preferred NID
    /// list, which the rule with the lowest index fills).
    #[must_use]
    pub fn prefers_local(&self, peer_ni: Nid, local: Nid) -> bool {
        self.first_pair(peer_ni, |r| r.src.as_ref())
            .is_some_and(|src| src.matches(local))
    }

    /// Whether peer NI `peer_ni` prefers gateway `gateway` (router rule).
    #[must_use]
    pub fn prefers_gateway(&self, peer_ni: Nid, gateway: Nid) -> bool {
        self.first_pair(peer_ni, |r| r.rte.as_ref())
            .is_some_and(|rte| rte.matches(gateway))
    }

    /// Whether peer NI `peer_ni` has preferred gateways at all.
    #[must_use]
    pub fn has_preferred_gateways(&self, peer_ni: Nid) -> bool {
        self.first_pair(peer_ni, |r| r.rte.as_ref()).is_some()
    }

    fn first_pair(&self, peer_ni: Nid, action: fn(&Rule) -> Option<&Expr>) -> Option<&Expr> {
        if self.rules.is_empty() {
            return None;
        }
        self.rules
            .iter()
            .filter(|r| r.priority.is_none())
            .filter(|r| r.dst.as_ref().is_some_and(|d| d.matches(peer_ni)))
            .find_map(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn net(s: &str) -> Net {
        s.parse().unwrap()
    }

    fn prio(src: Option<&str>, dst: Option<&str>, p: u32) -> Rule {
        Rule::parse(src, dst, None, Some(p)).unwrap()
    }

    #[test]
    fn expressions_match_nets_and_nids() {
        let e = Expr::parse("tcp").unwrap();
        assert!(e.is_net() && e.matches_net(net("tcp")) && !e.matches_net(net("tcp1")));
        assert!(e.matches(nid("10.0.0.1@tcp")) && !e.matches(nid("10.0.0.1@o2ib")));
        let e = Expr::parse("o2ib[1-3/2]").unwrap();
        assert!(e.matches_net(net("o2ib1")) && e.matches_net(net("o2ib3")));
        assert!(!e.matches_net(net("o2ib2")) && !e.matches_net(net("o2ib")));
        let e = Expr::parse("10.0.[0-1].[1-9/4]@tcp1").unwrap();
        assert!(!e.is_net());
        for (n, want) in [
            ("10.0.0.1@tcp1", true),
            ("10.0.1.9@tcp1", true),
            ("10.0.1.2@tcp1", false),
            ("10.0.2.1@tcp1", false),
            ("10.0.0.1@tcp", false),
        ] {
            assert_eq!(e.matches(nid(n)), want, "{n}");
        }
        let e = Expr::parse("*.*.*.*@tcp").unwrap();
        assert!(e.matches(nid("1.2.3.4@tcp")));
        let e = Expr::parse("[6-12/2]@gni").unwrap();
        assert!(e.matches(nid("8@gni")) && !e.matches(nid("7@gni")));
        assert_eq!(e.to_string(), "[6-12/2]@gni");
        for bad in [
            "",
            "@tcp",
            "foo",
            "1.2.3@tcp",
            "1.2.[3.4@tcp",
            "1.2.3.[4-1]@tcp",
            "tcp[a]",
            "0@lo",
            "1.2.3.4@",
            "[1/0]@gni",
        ] {
            assert!(Expr::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rules_are_checked_as_lustre_applies_them() {
        assert!(Rule::parse(Some("tcp"), None, None, Some(1)).is_ok());
        assert!(Rule::parse(None, Some("tcp"), None, Some(0)).is_ok());
        assert!(Rule::parse(Some("tcp"), Some("tcp1"), None, None).is_ok());
        assert!(Rule::parse(None, Some("tcp1"), Some("tcp"), None).is_ok());
        for (s, d, r, p) in [
            (None, None, None, Some(1)),
            (Some("tcp"), None, None, None),
            (None, None, Some("tcp"), None),
            (Some("tcp"), Some("tcp1"), None, Some(1)),
            (Some("tcp"), Some("tcp1"), Some("tcp"), None),
        ] {
            assert!(
                matches!(Rule::parse(s, d, r, p), Err(UdspError::BadRule(_))),
                "{s:?} {d:?} {r:?} {p:?}"
            );
        }
    }

    #[test]
    fn the_lowest_index_that_matches_decides() {
        let mut u = Udsp::default();
        assert_eq!(u.local_net_priority(net("tcp")), DEFAULT_PRIORITY);
        u.add(prio(Some("tcp"), None, 5), None).unwrap();
        u.add(prio(Some("tcp[0-9]"), None, 7), None).unwrap();
        assert_eq!(u.local_net_priority(net("tcp")), 5);
        assert_eq!(u.local_net_priority(net("tcp4")), 7);
        // Inserted first, it decides.
        u.add(prio(Some("tcp[0-1]"), None, 1), Some(0)).unwrap();
        assert_eq!(u.local_net_priority(net("tcp")), 1);
        // Net rules set net priorities, NID rules NI priorities.
        assert_eq!(u.local_ni_priority(nid("1.1.1.1@tcp")), DEFAULT_PRIORITY);
        u.add(prio(Some("1.1.1.*@tcp"), None, 2), None).unwrap();
        assert_eq!(u.local_ni_priority(nid("1.1.1.1@tcp")), 2);
        assert_eq!(u.peer_ni_priority(nid("1.1.1.1@tcp")), DEFAULT_PRIORITY);
        u.add(prio(None, Some("1.1.1.1@tcp"), 3), None).unwrap();
        assert_eq!(u.peer_ni_priority(nid("1.1.1.1@tcp")), 3);
        u.add(prio(None, Some("o2ib"), 4), None).unwrap();
        assert_eq!(u.peer_net_priority(net("o2ib")), 4);
        // Deleting the first gives the next its say back.
        u.del(Some(0)).unwrap();
        assert_eq!(u.local_net_priority(net("tcp")), 5);
        assert_eq!(u.del(Some(99)), Err(UdspError::NoSuchIndex(99)));
        u.del(None).unwrap();
        assert!(u.is_empty());
    }

    #[test]
    fn the_same_criteria_update_the_priority_or_are_refused() {
        let mut u = Udsp::default();
        assert_eq!(u.add(prio(Some("tcp"), None, 1), None), Ok(0));
        assert_eq!(
            u.add(prio(Some("tcp"), None, 1), None),
            Err(UdspError::Exists(0))
        );
        assert_eq!(u.add(prio(Some("tcp"), None, 3), Some(5)), Ok(0));
        assert_eq!(u.rules()[0].priority(), Some(3));
        assert_eq!(u.rules().len(), 1);
    }

    #[test]
    fn pairs_and_routers_are_preferences() {
        let mut u = Udsp::default();
        let pair = Rule::parse(Some("10.0.0.1@tcp"), Some("10.0.0.[5-6]@tcp"), None, None).unwrap();
        u.add(pair, None).unwrap();
        assert!(u.prefers_local(nid("10.0.0.5@tcp"), nid("10.0.0.1@tcp")));
        assert!(!u.prefers_local(nid("10.0.0.5@tcp"), nid("10.0.0.2@tcp")));
        assert!(!u.prefers_local(nid("10.0.0.7@tcp"), nid("10.0.0.1@tcp")));
        let rtr = Rule::parse(None, Some("o2ib1"), Some("10.0.0.3@tcp"), None).unwrap();
        u.add(rtr, None).unwrap();
        assert!(u.has_preferred_gateways(nid("9.9.9.9@o2ib1")));
        assert!(u.prefers_gateway(nid("9.9.9.9@o2ib1"), nid("10.0.0.3@tcp")));
        assert!(!u.prefers_gateway(nid("9.9.9.9@o2ib1"), nid("10.0.0.4@tcp")));
        assert!(!u.has_preferred_gateways(nid("9.9.9.9@o2ib2")));
        // Priorities are not preferences.
        assert_eq!(u.peer_ni_priority(nid("10.0.0.5@tcp")), DEFAULT_PRIORITY);
    }

    proptest::proptest! {
        /// Any text gives an expression or an error, never a panic.
        #[test]
        fn parsing_never_panics(s in "[0-9a-z@.*,/\\[\\]-]{0,24}") {
            if let Ok(e) = Expr::parse(&s) {
                let _ = e.matches(nid("10.0.0.1@tcp"));
            }
        }
    }
}
