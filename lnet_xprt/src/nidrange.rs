//! NID lists with ranges, as `lnetctl` takes them (`peer add --nid`,
//! `peer del --nid`, `route add --gateway`, `ping`, `discover`).
//!
//! A list is NID expressions separated by commas; an expression is a NID
//! whose address may hold bracketed number ranges in place of numbers, one
//! per dotted part of an IPv4 address or for the whole of a numeric one
//! (Lustre's `nidstrings` grammar):
//!
//! ```text
//! list     := expr { ',' expr }           (a comma inside [ ] is the range's)
//! expr     := address '@' net
//! address  := a NID address, any number of which may be [ range { ',' range } ]
//! range    := n | n '-' m | n '-' m '/' step          (n <= m, step >= 1)
//! ```
//!
//! Expansion keeps the order written, the leftmost range varying slowest:
//! `6.6.[6-7].[0-4/2]@tcp` is 6.6.6.0, 6.6.6.2, 6.6.6.4, 6.6.7.0, 6.6.7.2
//! and 6.6.7.4. As in `lnetctl`, `*` is refused (it names no NID), and a
//! list may name at most [`MAX_NIDS`] NIDs, checked before anything is
//! made, so an expression cannot ask for billions.
//!
//! ```
//! use colibri_lnet::nidrange::expand_nid_list;
//!
//! let nids = expand_nid_list("4.4.4.[1-3]@tcp,[8-12/4]@gni")?;
//! let text: Vec<String> = nids.iter().map(ToString::to_string).collect();
//! assert_eq!(text, ["4.4.4.1@tcp", "4.4.4.2@tcp", "4.4.4.3@tcp", "8@gni", "12@gni"]);
//! # Ok::<(), colibri_lnet::nidrange::NidListError>(())
//! ```

use crate::ids::{IdError, Nid};

/// The most NIDs one list may name (`lnetctl`'s `LNET_MAX_NIDS_PER_PEER`).
pub const MAX_NIDS: usize = 128;

/// Why a NID list could not be expanded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NidListError {
    /// Nothing but commas and blanks.
    #[error("no NID in {0:?}")]
    Empty(String),
    /// `*` names every NID, not a list of them.
    #[error("asterisk not allowed in a NID list: {0:?}")]
    Asterisk(String),
    /// A `[` without its `]`, a `]` without its `[`, or brackets inside
    /// brackets.
    #[error("unbalanced brackets in {0:?}")]
    Brackets(String),
    /// A range that is not `n`, `n-m` or `n-m/step` of decimal numbers, or
    /// one whose end is below its start, or a step of 0.
    #[error("bad range {range:?} in {expr:?}: {why}")]
    BadRange {
        /// The range text.
        range: String,
        /// The expression it is in.
        expr: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// More than [`MAX_NIDS`] NIDs.
    #[error("{expr:?} names more than the {max} NIDs allowed")]
    TooMany {
        /// The list.
        expr: String,
        /// The limit.
        max: usize,
    },
    /// An expanded NID is not a NID (an IPv4 part above 255, a net that does
    /// not exist, ...).
    #[error("{expr:?} is not a NID: {source}")]
    Nid {
        /// The expression, as written.
        expr: String,
        /// Why its expansion is not a NID.
        source: IdError,
    },
}

/// Splits a NID list at the commas that are not inside brackets, trimming
/// blanks and dropping empty pieces.
#[must_use]
pub fn split_nid_list(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// Expands a NID list (see the [module docs](self)) into its NIDs, in the
/// order written, duplicates kept.
///
/// # Errors
/// [`NidListError`]: an empty list, `*`, unbalanced brackets, a bad range,
/// more than [`MAX_NIDS`] NIDs, or an expansion that is not a NID.
pub fn expand_nid_list(s: &str) -> Result<Vec<Nid>, NidListError> {
    let exprs = split_nid_list(s);
    if exprs.is_empty() {
        return Err(NidListError::Empty(s.to_owned()));
    }
    let mut plans = Vec::with_capacity(exprs.len());
    let mut total = 0usize;
    for e in exprs {
        let plan = Plan::parse(e)?;
        total = total.saturating_add(plan.count());
        if total > MAX_NIDS {
            return Err(NidListError::TooMany {
                expr: s.to_owned(),
                max: MAX_NIDS,
            });
        }
        plans.push((e, plan));
    }
    let mut out = Vec::with_capacity(total);
    for (e, plan) in plans {
        plan.expand(e, &mut out)?;
    }
    Ok(out)
}

/// One expression: literal text between bracket groups, each group the
/// numbers it stands for.
struct Plan<'a> {
    /// `literals.len() == groups.len() + 1`.
    literals: Vec<&'a str>,
    groups: Vec<Vec<u64>>,
}

impl<'a> Plan<'a> {
    fn parse(expr: &'a str) -> Result<Self, NidListError> {
        if expr.contains('*') {
            return Err(NidListError::Asterisk(expr.to_owned()));
        }
        let brackets = || NidListError::Brackets(expr.to_owned());
        let mut literals = Vec::new();
        let mut groups = Vec::new();
        let mut rest = expr;
        while let Some(open) = rest.find('[') {
            let (lit, tail) = rest.split_at(open);
            if lit.contains(']') {
                return Err(brackets());
            }
            let close = tail.find(']').ok_or_else(brackets)?;
            let inner = &tail[1..close];
            if inner.contains('[') {
                return Err(brackets());
            }
            literals.push(lit);
            groups.push(parse_group(inner, expr)?);
            rest = &tail[close + 1..];
        }
        if rest.contains(']') {
            return Err(brackets());
        }
        literals.push(rest);
        Ok(Self { literals, groups })
    }

    /// How many NIDs it names (saturating).
    fn count(&self) -> usize {
        self.groups
            .iter()
            .fold(1usize, |n, g| n.saturating_mul(g.len()))
    }

    fn expand(&self, expr: &str, out: &mut Vec<Nid>) -> Result<(), NidListError> {
        // An odometer over the groups, the last one turning fastest.
        let mut at = vec![0usize; self.groups.len()];
        loop {
            let mut text = String::from(self.literals[0]);
            for (i, g) in self.groups.iter().enumerate() {
                text.push_str(&g[at[i]].to_string());
                text.push_str(self.literals[i + 1]);
            }
            let nid: Nid = text.parse().map_err(|source| NidListError::Nid {
                expr: expr.to_owned(),
                source,
            })?;
            if nid.is_any() {
                return Err(NidListError::Asterisk(expr.to_owned()));
            }
            out.push(nid);
            let mut i = self.groups.len();
            loop {
                if i == 0 {
                    return Ok(());
                }
                i -= 1;
                at[i] += 1;
                if at[i] < self.groups[i].len() {
                    break;
                }
                at[i] = 0;
            }
        }
    }
}

/// The numbers of `n,n-m,n-m/step,...` (the text between brackets), at
/// most `MAX_NIDS + 1` of them (more cannot be used).
fn parse_group(inner: &str, expr: &str) -> Result<Vec<u64>, NidListError> {
    let bad = |range: &str, why| NidListError::BadRange {
        range: range.to_owned(),
        expr: expr.to_owned(),
        why,
    };
    let num = |t: &str, range: &str| -> Result<u64, NidListError> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(range, "not a decimal number"));
        }
        t.parse().map_err(|_| bad(range, "number too large"))
    };
    let mut out = Vec::new();
    for range in inner.split(',') {
        let (span, step) = match range.split_once('/') {
            Some((span, step)) => (span, num(step, range)?),
            None => (range, 1),
        };
        if step == 0 {
            return Err(bad(range, "a step of 0"));
        }
        let (first, last) = match span.split_once('-') {
            Some((a, b)) => (num(a, range)?, num(b, range)?),
            None => {
                if range.contains('/') {
                    return Err(bad(range, "a step without a range"));
                }
                let n = num(span, range)?;
                (n, n)
            }
        };
        if last < first {
            return Err(bad(range, "the end is below the start"));
        }
        let mut n = first;
        while n <= last && out.len() <= MAX_NIDS {
            out.push(n);
            n = match n.checked_add(step) {
                Some(x) => x,
                None => break,
            };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(s: &str) -> Vec<String> {
        expand_nid_list(s)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn lnetctl_examples() {
        // sanity-lnet tests 4 to 6.
        assert_eq!(
            text("4.4.4.[1-3]@tcp"),
            ["4.4.4.1@tcp", "4.4.4.2@tcp", "4.4.4.3@tcp"]
        );
        assert_eq!(text("5.5.5.[1,2,3-4]@o2ib").len(), 4);
        let six = text(
            "6.6.[6-7].[0-4/2]@tcp,6.6.[1-4/2].[0-6/3]@o2ib,[6-12/4]@gni,[6-12/4]@kfi,[6-12/4]@bxi3f",
        );
        assert_eq!(
            six,
            [
                "6.6.6.0@tcp",
                "6.6.6.2@tcp",
                "6.6.6.4@tcp",
                "6.6.7.0@tcp",
                "6.6.7.2@tcp",
                "6.6.7.4@tcp",
                "6.6.1.0@o2ib",
                "6.6.1.3@o2ib",
                "6.6.1.6@o2ib",
                "6.6.3.0@o2ib",
                "6.6.3.3@o2ib",
                "6.6.3.6@o2ib",
                "6@gni",
                "10@gni",
                "6@kfi",
                "10@kfi",
                "6@bxi3f",
                "10@bxi3f",
            ]
        );
        // Plain NIDs and blanks.
        assert_eq!(
            text(" 1.1.1.1@tcp, 2.2.2.2@tcp ,"),
            ["1.1.1.1@tcp", "2.2.2.2@tcp"]
        );
    }

    #[test]
    fn bad_lists_are_refused_clearly() {
        let err = |s: &str| expand_nid_list(s).unwrap_err();
        assert!(matches!(err(""), NidListError::Empty(_)));
        assert!(matches!(err(" , "), NidListError::Empty(_)));
        assert!(matches!(err("*@tcp"), NidListError::Asterisk(_)));
        assert!(matches!(err("1.1.1.[1-3@tcp"), NidListError::Brackets(_)));
        assert!(matches!(err("1.1.1.1-3]@tcp"), NidListError::Brackets(_)));
        assert!(matches!(err("1.1.[1.[2]]@tcp"), NidListError::Brackets(_)));
        assert!(matches!(
            err("1.1.1.[3-1]@tcp"),
            NidListError::BadRange { .. }
        ));
        assert!(matches!(
            err("1.1.1.[1-3/0]@tcp"),
            NidListError::BadRange { .. }
        ));
        assert!(matches!(
            err("1.1.1.[a]@tcp"),
            NidListError::BadRange { .. }
        ));
        assert!(matches!(
            err("1.1.1.[2/2]@tcp"),
            NidListError::BadRange { .. }
        ));
        assert!(matches!(err("1.1.1.[]@tcp"), NidListError::BadRange { .. }));
        assert!(matches!(
            err("1.1.1.[250-260]@tcp"),
            NidListError::Nid { .. }
        ));
        assert!(matches!(err("1.1.1.1@nonet"), NidListError::Nid { .. }));
        // Too many, refused before anything is made, however many.
        assert!(matches!(
            err("1.1.[0-255].[0-255]@tcp"),
            NidListError::TooMany { max: 128, .. }
        ));
        assert!(matches!(
            err("[0-99999999999]@gni"),
            NidListError::TooMany { .. }
        ));
        assert_eq!(expand_nid_list("1.1.1.[1-128]@tcp").unwrap().len(), 128);
        assert!(matches!(
            err("1.1.1.[1-128]@tcp,2.2.2.2@tcp"),
            NidListError::TooMany { .. }
        ));
    }

    proptest! {
        /// Any set of NIDs written as one range per varying part expands
        /// back to itself, in order.
        #[test]
        fn ranges_expand_to_what_they_name(
            a in 0u8..=255, b in 0u8..=255,
            c0 in 0u8..=250, clen in 0u8..4,
            d0 in 0u8..=200, dlen in 0u8..40, step in 1u8..5,
            net in 0u16..3,
        ) {
            let (c1, d1) = (c0 + clen, d0 + dlen);
            let net = if net == 0 { "tcp".to_owned() } else { format!("o2ib{net}") };
            let expr = format!("{a}.{b}.[{c0}-{c1}].[{d0}-{d1}/{step}]@{net}");
            let mut want = Vec::new();
            for c in c0..=c1 {
                for d in (d0..=d1).step_by(step.into()) {
                    want.push(format!("{a}.{b}.{c}.{d}@{net}"));
                }
            }
            match expand_nid_list(&expr) {
                Ok(nids) => {
                    prop_assert!(want.len() <= MAX_NIDS);
                    let got: Vec<String> = nids.iter().map(ToString::to_string).collect();
                    prop_assert_eq!(got, want);
                }
                Err(NidListError::TooMany { .. }) => prop_assert!(want.len() > MAX_NIDS),
                Err(e) => prop_assert!(false, "{expr}: {e}"),
            }
        }

        /// Whatever the text, expansion ends with NIDs or an error (no
        /// panic, no endless loop, never more than the limit).
        #[test]
        fn any_text_is_handled(s in "[0-9\\[\\]\\-/,.@a-z* ]{0,40}") {
            if let Ok(nids) = expand_nid_list(&s) {
                prop_assert!(!nids.is_empty() && nids.len() <= MAX_NIDS);
            }
        }
    }
}
