//! LNet's legacy module parameters (`networks=`, `ip2nets=`, `routes=`)
//! turned into the YAML that `colibri lnet import` (and `lnetctl import`)
//! reads, as Lustre's `lnet_legacy2yaml` converts them for sites leaving
//! `modprobe.d` behind: `colibri lnet legacy2yaml`.
//!
//! The conversion is textual: nets, interface names, IP patterns and
//! gateways are written as they were given (patterns are not expanded),
//! after a check that each reads as what it claims to be, so that a typo
//! is reported here and not at import. Sources accumulate in the order
//! they are added ([`Legacy::add_modprobe`], [`Legacy::add_param`],
//! [`Legacy::add_inline`]); the document lists `net:`, then `ip2nets:`,
//! then `route:`.
//!
//! ```
//! use colibri_lnet_rt::legacy::Legacy;
//!
//! let mut l = Legacy::default();
//! l.add_inline(r#"options lnet ip2nets="tcp0(eth0) 10.0.0.*" routes="o2ib 2 10.0.0.[1-2]@tcp0:5""#)?;
//! assert_eq!(
//!     l.to_yaml(),
//!     "ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n      \
//!      ip-range:\n          0: 10.0.0.*\nroute:\n    - net: o2ib\n      \
//!      gateway: 10.0.0.[1-2]@tcp0\n      hop: 2\n      priority: 5\n"
//! );
//! # Ok::<(), colibri_lnet_rt::legacy::LegacyError>(())
//! ```

use colibri_lnet::ids::{LndType, Net};

use crate::yaml::Doc;

/// A legacy text that does not convert. The messages name the faulty
/// rule and say what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LegacyError {
    /// An `ip2nets` rule that is not `NET[(IF,...)] PATTERN...`.
    #[error(
        "ip2nets rule '{rule}': cannot parse the rule header (expected 'NET[(IF,...)] IP-PATTERN...')"
    )]
    RuleHeader {
        /// The rule.
        rule: String,
    },
    /// A word where an IP pattern should be that is not one.
    #[error(
        "ip2nets rule '{rule}': invalid IP pattern '{token}' (an IPv4 pattern of four dotted parts, each a number, '*' or a bracketed list; or an IPv6 address[/prefix])"
    )]
    IpPattern {
        /// The rule.
        rule: String,
        /// The word.
        token: String,
    },
    /// A second net inside one `ip2nets` rule.
    #[error(
        "ip2nets rule '{rule}': '{token}' looks like a second net: multiple network rules must be separated by semicolons (;)"
    )]
    MissingDelimiter {
        /// The rule.
        rule: String,
        /// The word that looks like a net.
        token: String,
    },
    /// A `networks` item that is not `NET[(IF,...)]`.
    #[error("invalid network specification '{spec}': {why}")]
    NetworkSpec {
        /// The item.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// A net name LNet does not know.
    #[error("'{rule}': '{net}' is not a net: {why}")]
    Net {
        /// The rule or route.
        rule: String,
        /// The name.
        net: String,
        /// Why it does not parse.
        why: String,
    },
    /// `()`: an interface list with no name in it.
    #[error("'{rule}': empty interface list")]
    EmptyInterfaces {
        /// The rule.
        rule: String,
    },
    /// A hop count outside 1 to 255.
    #[error("routes: hopcount {hop} out of range 1-255 in '{route}'")]
    HopRange {
        /// The route.
        route: String,
        /// The hop count as written.
        hop: String,
    },
    /// A route without its gateway, or with a value that is not a number.
    #[error("routes: {why} in '{route}'")]
    Route {
        /// The route.
        route: String,
        /// What is wrong with it.
        why: String,
    },
    /// A route naming more than one gateway (one per route in YAML).
    #[error(
        "routes: multiple gateway specifications found in '{route}' ({gateways}): separate routes with semicolons (;)"
    )]
    MultipleGateways {
        /// The route.
        route: String,
        /// The gateways it names.
        gateways: String,
    },
    /// A gateway that is not a NID or NID range.
    #[error("routes: '{gateway}' in '{route}' is not a gateway NID: {why}")]
    Gateway {
        /// The route.
        route: String,
        /// The gateway as written.
        gateway: String,
        /// Why it does not parse.
        why: String,
    },
    /// `name=` with nothing after it, or a quote that does not close.
    #[error("{name}=: {why}")]
    Assignment {
        /// The parameter.
        name: &'static str,
        /// What is wrong.
        why: &'static str,
    },
    /// `--default-hop` outside 1 to 255.
    #[error("--default-hop value {0} out of range (1-255)")]
    DefaultHop(u32),
}

/// The three legacy parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// `networks=`: nets with their interfaces, separated by commas.
    Networks,
    /// `ip2nets=`: rules separated by `;`.
    Ip2nets,
    /// `routes=`: routes separated by `;`.
    Routes,
}

impl Param {
    const ALL: [Self; 3] = [Self::Networks, Self::Ip2nets, Self::Routes];

    const fn name(self) -> &'static str {
        match self {
            Self::Networks => "networks",
            Self::Ip2nets => "ip2nets",
            Self::Routes => "routes",
        }
    }
}

/// A net of `networks=` and its interfaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetSpec {
    /// The net as written (`tcp0`).
    pub net: String,
    /// Its interfaces, in order.
    pub interfaces: Vec<String>,
}

/// An `ip2nets` rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    /// The net as written.
    pub net: String,
    /// Its interfaces, in order.
    pub interfaces: Vec<String>,
    /// Its IP patterns as written (`192.168.[1-2].*`).
    pub ranges: Vec<String>,
}

/// A route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// The remote net.
    pub net: String,
    /// The gateway: a NID or a NID range as written.
    pub gateway: String,
    /// The hop count, if given.
    pub hop: Option<u32>,
    /// The priority, if given.
    pub priority: Option<u32>,
}

/// What the legacy sources said, in the order they were added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Legacy {
    /// From `networks=`.
    pub nets: Vec<NetSpec>,
    /// From `ip2nets=`.
    pub rules: Vec<RuleSpec>,
    /// From `routes=`.
    pub routes: Vec<RouteSpec>,
}

impl Legacy {
    /// Whether nothing was read.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.rules.is_empty() && self.routes.is_empty()
    }

    /// Adds one parameter's value, or a file of them: `ip2nets` rules and
    /// routes separated by `;` or new lines, nets by commas or new lines;
    /// `#` starts a comment that runs to the end of its line.
    ///
    /// # Errors
    /// The first entry that does not convert; nothing is added then.
    pub fn add_param(&mut self, param: Param, text: &str) -> Result<(), LegacyError> {
        let mut next = self.clone();
        let text = uncomment(&join_continued(text));
        match param {
            Param::Ip2nets => {
                for rule in entries(&text, ';') {
                    next.rules.push(parse_rule(rule)?);
                }
            }
            Param::Routes => {
                for route in entries(&text, ';') {
                    next.routes.push(parse_route(route)?);
                }
            }
            Param::Networks => {
                for line in text.lines() {
                    for spec in split_outside(line, ',', '(', ')') {
                        let spec = spec.trim();
                        if !spec.is_empty() {
                            next.nets.push(parse_network(spec)?);
                        }
                    }
                }
            }
        }
        *self = next;
        Ok(())
    }

    /// Adds what a `modprobe.d` file gives LNet: the `networks=`,
    /// `ip2nets=` and `routes=` of its `options lnet ...` lines (a line
    /// ending in `\` goes on with the next); other lines and other
    /// modules' options are skipped.
    ///
    /// # Errors
    /// As [`Legacy::add_param`], or a malformed assignment.
    pub fn add_modprobe(&mut self, text: &str) -> Result<(), LegacyError> {
        let mut next = self.clone();
        for line in join_continued(text).lines() {
            let line = line.trim();
            let mut words = line.split_whitespace();
            if words.next() != Some("options") || words.next() != Some("lnet") {
                continue;
            }
            for (param, body) in assignments(line)? {
                next.add_param(param, &body)?;
            }
        }
        *self = next;
        Ok(())
    }

    /// Adds an inline text (or standard input): assignments such as
    /// `options lnet 'ip2nets="..." routes="..."'` or `networks=tcp0(eth0)`,
    /// or, with no assignment in it, `ip2nets` rules.
    ///
    /// # Errors
    /// As [`Legacy::add_param`], or a malformed assignment.
    pub fn add_inline(&mut self, text: &str) -> Result<(), LegacyError> {
        let text = join_continued(text);
        let found = assignments(&text)?;
        if found.is_empty() {
            return self.add_param(Param::Ip2nets, &text);
        }
        let mut next = self.clone();
        for (param, body) in found {
            next.add_param(param, &body)?;
        }
        *self = next;
        Ok(())
    }

    /// Gives the routes without a hop count this one
    /// (`--default-hop`); explicit hop counts stay.
    ///
    /// # Errors
    /// A hop count outside 1 to 255.
    pub fn set_default_hop(&mut self, hop: u32) -> Result<(), LegacyError> {
        if !(1..=255).contains(&hop) {
            return Err(LegacyError::DefaultHop(hop));
        }
        for r in self.routes.iter_mut().filter(|r| r.hop.is_none()) {
            r.hop = Some(hop);
        }
        Ok(())
    }

    /// The document: `net:`, `ip2nets:`, `route:`, each only when it has
    /// entries; lists as lnetctl writes them (maps of indexes).
    #[must_use]
    pub fn to_doc(&self) -> Doc {
        let indexed = |items: &[String]| {
            Doc::Map(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (i.to_string(), Doc::from(s.as_str())))
                    .collect(),
            )
        };
        let mut d = Doc::map();
        if !self.nets.is_empty() {
            let nets = self.nets.iter().map(|n| {
                let mut e = Doc::map().with("net type", n.net.as_str());
                if !n.interfaces.is_empty() {
                    let ni = Doc::map().with("interfaces", indexed(&n.interfaces));
                    e.push("local NI(s)", vec![ni]);
                }
                e
            });
            d.push("net", nets.collect::<Vec<_>>());
        }
        if !self.rules.is_empty() {
            let rules = self.rules.iter().map(|r| {
                let mut e = Doc::map().with("net-spec", r.net.as_str());
                if !r.interfaces.is_empty() {
                    e.push("interfaces", indexed(&r.interfaces));
                }
                e.with("ip-range", indexed(&r.ranges))
            });
            d.push("ip2nets", rules.collect::<Vec<_>>());
        }
        if !self.routes.is_empty() {
            let routes = self.routes.iter().map(|r| {
                let mut e = Doc::map()
                    .with("net", r.net.as_str())
                    .with("gateway", r.gateway.as_str());
                if let Some(h) = r.hop {
                    e.push("hop", h);
                }
                if let Some(p) = r.priority {
                    e.push("priority", p);
                }
                e
            });
            d.push("route", routes.collect::<Vec<_>>());
        }
        d
    }

    /// [`Legacy::to_doc`] in lnetctl's YAML layout (empty when nothing
    /// was read).
    #[must_use]
    pub fn to_yaml(&self) -> String {
        self.to_doc().to_yaml()
    }
}

/// Lines ending in `\` joined with the next.
fn join_continued(text: &str) -> String {
    text.replace("\\\r\n", " ").replace("\\\n", " ")
}

/// Each line without its `#` comment.
fn uncomment(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once('#').map_or(l, |(keep, _)| keep))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The non-blank entries of `text` separated by `sep` or new lines.
fn entries(text: &str, sep: char) -> impl Iterator<Item = &str> {
    text.split([sep, '\n'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
}

/// `s` split at each `sep` outside `open`..`close`.
fn split_outside(s: &str, sep: char, open: char, close: char) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0_i32, 0);
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
        } else if c == sep && depth == 0 {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

/// The leading net name of `s` (`[A-Za-z][A-Za-z0-9]*`) and the rest.
fn net_word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let end = s
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(s.len());
    Some(s.split_at(end))
}

/// The interface names of `(a,b)` at the start of `s`, and the rest:
/// `Ok(None)` when `s` does not start with `(`; why not for a list that
/// does not close or holds a blank or a `(`.
fn interface_list(s: &str) -> Result<Option<(Vec<String>, &str)>, &'static str> {
    let Some(inner) = s.strip_prefix('(') else {
        return Ok(None);
    };
    let close = inner.find(')').ok_or("the interface list does not close")?;
    let list = &inner[..close];
    if list.contains('(') || list.chars().any(char::is_whitespace) {
        return Err("an interface list holds names separated by commas, without blanks");
    }
    let names: Vec<String> = list
        .split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(Some((names, &inner[close + 1..])))
}

fn check_net(net: &str, rule: &str) -> Result<(), LegacyError> {
    net.parse::<Net>()
        .map(|_| ())
        .map_err(|e| LegacyError::Net {
            rule: rule.to_owned(),
            net: net.to_owned(),
            why: e.to_string(),
        })
}

/// `NET[(IF,...)] PATTERN...`.
fn parse_rule(rule: &str) -> Result<RuleSpec, LegacyError> {
    let header = || LegacyError::RuleHeader {
        rule: rule.to_owned(),
    };
    let (net, rest) = net_word(rule).ok_or_else(header)?;
    let (interfaces, rest) = match interface_list(rest).map_err(|_| header())? {
        Some((names, _)) if names.is_empty() => {
            return Err(LegacyError::EmptyInterfaces {
                rule: rule.to_owned(),
            });
        }
        Some((names, rest)) => (names, rest),
        None => (Vec::new(), rest),
    };
    if !rest.starts_with(char::is_whitespace) || rest.trim().is_empty() {
        return Err(header());
    }
    check_net(net, rule)?;
    let mut ranges = Vec::new();
    for token in rest.split_whitespace() {
        if looks_like_net_spec(token) {
            return Err(LegacyError::MissingDelimiter {
                rule: rule.to_owned(),
                token: token.to_owned(),
            });
        }
        if crate::conf::IpRange::parse(token, Net::new(LndType::Tcp, 0)).is_none() {
            return Err(LegacyError::IpPattern {
                rule: rule.to_owned(),
                token: token.to_owned(),
            });
        }
        ranges.push(token.to_owned());
    }
    Ok(RuleSpec {
        net: net.to_owned(),
        interfaces,
        ranges,
    })
}

/// `tcp1` or `tcp1(eth1)`: a net where an IP pattern should be.
fn looks_like_net_spec(token: &str) -> bool {
    net_word(token).is_some_and(|(_, rest)| {
        rest.is_empty() || (rest.starts_with('(') && rest.ends_with(')') && rest.len() > 2)
    })
}

/// `NET[(IF,...)]` of `networks=`.
fn parse_network(spec: &str) -> Result<NetSpec, LegacyError> {
    let bad = |why: &str| LegacyError::NetworkSpec {
        spec: spec.to_owned(),
        why: why.to_owned(),
    };
    let (net, rest) = net_word(spec).ok_or_else(|| bad("expected NET[(IF,...)]"))?;
    let (interfaces, rest) = match interface_list(rest) {
        Err(why) => return Err(bad(why)),
        Ok(Some((names, _))) if names.is_empty() => return Err(bad("empty interface list")),
        Ok(Some((names, rest))) => (names, rest),
        Ok(None) => (Vec::new(), rest),
    };
    if !rest.trim().is_empty() {
        return Err(bad("expected NET[(IF,...)]"));
    }
    net.parse::<Net>().map_err(|e| bad(&e.to_string()))?;
    Ok(NetSpec {
        net: net.to_owned(),
        interfaces,
    })
}

/// A hop count: 1 to 255.
fn hop(value: &str, route: &str) -> Result<u32, LegacyError> {
    if !value.bytes().all(|b| b.is_ascii_digit()) || value.is_empty() {
        return Err(LegacyError::Route {
            route: route.to_owned(),
            why: format!("invalid hop value '{value}'"),
        });
    }
    value
        .parse::<u32>()
        .ok()
        .filter(|h| (1..=255).contains(h))
        .ok_or_else(|| LegacyError::HopRange {
            route: route.to_owned(),
            hop: value.to_owned(),
        })
}

fn priority(value: &str, route: &str) -> Result<u32, LegacyError> {
    value.parse::<u32>().map_err(|_| LegacyError::Route {
        route: route.to_owned(),
        why: format!("invalid priority value '{value}'"),
    })
}

fn check_gateway(gateway: &str, route: &str) -> Result<(), LegacyError> {
    colibri_lnet::nidrange::expand_nid_list(gateway)
        .map(|_| ())
        .map_err(|e| LegacyError::Gateway {
            route: route.to_owned(),
            gateway: gateway.to_owned(),
            why: e.to_string(),
        })
}

/// A route: `NET [HOPS] GATEWAY[:PRIORITY]`, or
/// `NET: { gateway: GATEWAY[, hop: HOPS][, priority: PRIORITY] }` (the
/// form of Lustre's `lustre_routes_config` files).
fn parse_route(route: &str) -> Result<RouteSpec, LegacyError> {
    let fail = |why: &str| LegacyError::Route {
        route: route.to_owned(),
        why: why.to_owned(),
    };
    if let Some((net, rest)) = net_word(route)
        && let Some(body) = rest.trim_start().strip_prefix(':')
        && let Some(body) = body.trim_start().strip_prefix('{')
    {
        let body = body
            .trim_end()
            .strip_suffix('}')
            .ok_or_else(|| fail("'{' without its '}'"))?;
        check_net(net, route)?;
        let mut spec = RouteSpec {
            net: net.to_owned(),
            gateway: String::new(),
            hop: None,
            priority: None,
        };
        for pair in split_outside(body, ',', '[', ']') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair
                .split_once(':')
                .ok_or_else(|| fail(&format!("'{pair}' is not 'key: value'")))?;
            let value = value.trim();
            match key.trim() {
                "gateway" => {
                    check_gateway(value, route)?;
                    value.clone_into(&mut spec.gateway);
                }
                "hop" => spec.hop = Some(hop(value, route)?),
                "priority" => spec.priority = Some(priority(value, route)?),
                other => {
                    return Err(fail(&format!(
                        "unknown key '{other}' (gateway, hop, priority)"
                    )));
                }
            }
        }
        if spec.gateway.is_empty() {
            return Err(fail("missing gateway"));
        }
        return Ok(spec);
    }
    let words: Vec<&str> = route.split_whitespace().collect();
    if words.len() < 2 {
        return Err(fail(
            "incomplete route specification (expected 'NET [HOPS] GATEWAY[:PRIORITY]')",
        ));
    }
    check_net(words[0], route)?;
    let (hops, gateways) = if words[1].bytes().all(|b| b.is_ascii_digit()) {
        (Some(hop(words[1], route)?), &words[2..])
    } else {
        (None, &words[1..])
    };
    let gw = match gateways {
        [] => return Err(fail("missing gateway")),
        [one] => *one,
        many => {
            return Err(LegacyError::MultipleGateways {
                route: route.to_owned(),
                gateways: many.join(", "),
            });
        }
    };
    let (gateway, prio) = match gw.rsplit_once(':') {
        Some((g, p)) if g.contains('@') => (g, Some(priority(p, route)?)),
        _ => (gw, None),
    };
    check_gateway(gateway, route)?;
    Ok(RouteSpec {
        net: words[0].to_owned(),
        gateway: gateway.to_owned(),
        hop: hops,
        priority: prio,
    })
}

/// Whether `rest` starts with `word =` (the next assignment).
fn starts_assignment(rest: &str) -> bool {
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    end > 0 && rest[end..].trim_start().starts_with('=')
}

/// The `networks=`, `ip2nets=` and `routes=` assignments of `text`, in
/// order: a value in single or double quotes runs to the same quote; an
/// unquoted one to the end of its line, a `;`, or the next `word=`.
fn assignments(text: &str) -> Result<Vec<(Param, String)>, LegacyError> {
    let mut out = Vec::new();
    let mut i = 0;
    'scan: while i < text.len() {
        let word_start = text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if word_start {
            for param in Param::ALL {
                let Some(after) = text[i..].strip_prefix(param.name()) else {
                    continue;
                };
                let Some(value) = after.trim_start().strip_prefix('=') else {
                    continue;
                };
                let value = value.trim_start_matches([' ', '\t']);
                let value_at = text.len() - value.len();
                if let Some(q) = value.chars().next().filter(|c| *c == '"' || *c == '\'') {
                    let body = &value[1..];
                    let close = body.find(q).ok_or(LegacyError::Assignment {
                        name: param.name(),
                        why: "the quoted value does not close",
                    })?;
                    out.push((param, body[..close].to_owned()));
                    i = value_at + 1 + close + 1;
                } else {
                    let mut end = value.find(['\n', ';']).unwrap_or(value.len());
                    for (j, c) in value[..end].char_indices() {
                        if c.is_whitespace() && starts_assignment(value[j..].trim_start()) {
                            end = j;
                            break;
                        }
                    }
                    let body = value[..end].trim();
                    if body.is_empty() {
                        return Err(LegacyError::Assignment {
                            name: param.name(),
                            why: "no value",
                        });
                    }
                    out.push((param, body.to_owned()));
                    i = value_at + end;
                }
                continue 'scan;
            }
        }
        i += text[i..].chars().next().map_or(1, char::len_utf8);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(s: &str) -> Result<String, LegacyError> {
        let mut l = Legacy::default();
        l.add_inline(s)?;
        Ok(l.to_yaml())
    }

    // The cases of Lustre's sanity-lnet 600-629, with the documents they
    // expect (which are in lnetctl's layout, as ours).

    #[test]
    fn ip2nets_rules_with_interfaces_and_ranges() {
        assert_eq!(
            inline("tcp0(eth0,eth1) 10.0.0.*; o2ib0 192.168.[1-2].*").unwrap(),
            "ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n          1: eth1\n      ip-range:\n          0: 10.0.0.*\n    - net-spec: o2ib0\n      ip-range:\n          0: 192.168.[1-2].*\n"
        );
        assert_eq!(
            inline("tcp0(eth0,eth1) 10.0.0.* 10.0.1.*").unwrap(),
            "ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n          1: eth1\n      ip-range:\n          0: 10.0.0.*\n          1: 10.0.1.*\n"
        );
    }

    #[test]
    fn ipv6_patterns_convert_quoted() {
        let y = inline("tcp(eth0) fd00:97::5/64 2001:db8::1").unwrap();
        assert_eq!(
            y,
            "ip2nets:\n    - net-spec: tcp\n      interfaces:\n          0: eth0\n      ip-range:\n          0: \"fd00:97::5/64\"\n          1: \"2001:db8::1\"\n"
        );
        assert!(inline("tcp fd00:::5").is_err());
    }

    #[test]
    fn a_pattern_starting_with_a_star_is_quoted() {
        let y = inline("tcp *.*.*.*").unwrap();
        assert_eq!(
            y,
            "ip2nets:\n    - net-spec: tcp\n      ip-range:\n          0: \"*.*.*.*\"\n"
        );
        let d = Doc::from_yaml(&y).unwrap();
        let r = &d.get("ip2nets").unwrap().items()[0];
        assert_eq!(
            r.get("ip-range")
                .unwrap()
                .get("0")
                .unwrap()
                .as_text()
                .unwrap(),
            "*.*.*.*"
        );
    }

    #[test]
    fn routes_with_hops_priorities_and_defaults() {
        assert_eq!(
            inline("routes='tcp0 1 10.0.0.1@o2ib0'").unwrap(),
            "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 1\n"
        );
        assert_eq!(
            inline("routes='tcp0 2 10.0.0.1@o2ib0:7'").unwrap(),
            "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 2\n      priority: 7\n"
        );
        let mut l = Legacy::default();
        l.add_inline("routes='tcp0 10.0.0.1@o2ib0'").unwrap();
        assert_eq!(l.routes[0].hop, None);
        l.add_inline("routes='tcp1 4 10.0.0.1@o2ib0'").unwrap();
        l.set_default_hop(3).unwrap();
        assert_eq!((l.routes[0].hop, l.routes[1].hop), (Some(3), Some(4)));
        assert_eq!(l.set_default_hop(0), Err(LegacyError::DefaultHop(0)));
        assert_eq!(l.set_default_hop(256), Err(LegacyError::DefaultHop(256)));
    }

    #[test]
    fn an_options_line_with_two_parameters() {
        assert_eq!(
            inline(r#"options lnet 'ip2nets="tcp0 10.0.0.*" routes="tcp0 1 10.0.0.2@o2ib0"'"#)
                .unwrap(),
            "ip2nets:\n    - net-spec: tcp0\n      ip-range:\n          0: 10.0.0.*\nroute:\n    - net: tcp0\n      gateway: 10.0.0.2@o2ib0\n      hop: 1\n"
        );
    }

    #[test]
    fn networks_with_and_without_interfaces() {
        assert_eq!(
            inline("options lnet networks=tcp").unwrap(),
            "net:\n    - net type: tcp\n"
        );
        assert_eq!(
            inline("options lnet networks=tcp0(eth0),o2ib(ib0)").unwrap(),
            "net:\n    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: eth0\n    - net type: o2ib\n      local NI(s):\n        - interfaces:\n              0: ib0\n"
        );
        assert_eq!(
            inline(r#"networks="tcp0(eth0,eth1)""#).unwrap(),
            "net:\n    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: eth0\n              1: eth1\n"
        );
    }

    #[test]
    fn modprobe_files_with_comments_and_continuations() {
        let text = "# LNet\noptions lnet ip2nets=\"tcp0(eth0) 10.1.0.*\"\n\n\
                    options ksocklnd routes=\"x\"\n\
                    options lnet routes=\"tcp0 1 10.1.0.1@o2ib0:9\"\n\
                    options lnet \\\n  ip2nets=\"o2ib0 192.168.1.*\"\n\
                    options lnet networks=tcp0(eth0),o2ib(ib0) routes=\"tcp1 10.1.0.2@o2ib0\"\n";
        let mut l = Legacy::default();
        l.add_modprobe(text).unwrap();
        assert_eq!(
            l.to_yaml(),
            "net:\n    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: eth0\n    - net type: o2ib\n      local NI(s):\n        - interfaces:\n              0: ib0\n\
             ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n      ip-range:\n          0: 10.1.0.*\n    - net-spec: o2ib0\n      ip-range:\n          0: 192.168.1.*\n\
             route:\n    - net: tcp0\n      gateway: 10.1.0.1@o2ib0\n      hop: 1\n      priority: 9\n    - net: tcp1\n      gateway: 10.1.0.2@o2ib0\n"
        );
    }

    #[test]
    fn the_alternative_route_form_mixes_with_the_legacy_one() {
        let mut l = Legacy::default();
        l.add_param(
            Param::Routes,
            "# routes\ntcp1: { gateway: 10.1.1.2@tcp0, priority: 3 }  # high\n\
             tcp0 1 10.2.2.3@tcp1\ntcp4: { gateway: 10.3.3.4@tcp }\n\
             tcp7: { gateway: 10.3.3.[6-12]@tcp, priority: 20, hop: 8 }; tcp2 2 10.4.4.5@tcp0:7\n\
             tcp8: {gateway: 10.3.3.[6,8]@tcp}",
        )
        .unwrap();
        let got: Vec<_> = l
            .routes
            .iter()
            .map(|r| (r.net.as_str(), r.gateway.as_str(), r.hop, r.priority))
            .collect();
        assert_eq!(
            got,
            [
                ("tcp1", "10.1.1.2@tcp0", None, Some(3)),
                ("tcp0", "10.2.2.3@tcp1", Some(1), None),
                ("tcp4", "10.3.3.4@tcp", None, None),
                ("tcp7", "10.3.3.[6-12]@tcp", Some(8), Some(20)),
                ("tcp2", "10.4.4.5@tcp0", Some(2), Some(7)),
                ("tcp8", "10.3.3.[6,8]@tcp", None, None),
            ]
        );
        assert!(l.to_yaml().contains(
            "    - net: tcp7\n      gateway: 10.3.3.[6-12]@tcp\n      hop: 8\n      priority: 20\n"
        ));
    }

    #[test]
    fn malformed_input_says_what_is_wrong() {
        let err = |s: &str| inline(s).unwrap_err().to_string();
        assert!(err("tcp0").contains("cannot parse the rule header"));
        assert!(err("tcp0(eth0 10.0.0.*").contains("cannot parse the rule header"));
        assert!(err("tcp0() 10.0.0.*").contains("empty interface list"));
        assert!(err("tcp0 10.0.0").contains("invalid IP pattern '10.0.0'"));
        assert!(err("tcp0 10.0.0.[1-").contains("invalid IP pattern"));
        assert!(err("tcp0 10.0.0.300").contains("invalid IP pattern"));
        assert!(
            err("tcp0(eth0) 10.0.0.* tcp1(eth1) 192.168.1.*")
                .contains("multiple network rules must be separated by semicolons")
        );
        assert!(err("bogus0 10.0.0.*").contains("'bogus0' is not a net"));
        assert!(err("routes='tcp0 0 10.0.0.1@o2ib0'").contains("hopcount 0 out of range 1-255"));
        assert!(err("routes='tcp0 256 10.0.0.1@o2ib0'").contains("hopcount 256 out of range"));
        assert!(
            err("routes='tcp0 99999999999 10.0.0.1@o2ib0'").contains("hopcount 99999999999 out")
        );
        assert!(
            err(r#"options lnet routes="tcp0 1 10.0.0.1@o2ib0 10.0.0.2@o2ib0""#)
                .contains("multiple gateway specifications found")
        );
        assert!(err("routes='tcp0'").contains("incomplete route"));
        assert!(err("routes='tcp0 3'").contains("missing gateway"));
        assert!(err("routes='tcp0 1 10.0.0.1@o2ib0:x'").contains("invalid priority value 'x'"));
        assert!(err("routes='tcp0 1 10.0.0.[1-@o2ib0'").contains("is not a gateway NID"));
        assert!(
            err("routes='tcp0: { gateway: 10.0.0.1@o2ib0, hop: 0 }'")
                .contains("hopcount 0 out of range")
        );
        assert!(err("routes='tcp0: { hop: 2 }'").contains("missing gateway"));
        assert!(
            err("routes='tcp0: { gateway: 10.0.0.1@tcp, color: 2 }'")
                .contains("unknown key 'color'")
        );
        assert!(err("routes='tcp0: { gateway: 10.0.0.1@tcp'").contains("without its '}'"));
        assert!(err("options lnet networks=tcp0(eth0").contains("invalid network specification"));
        assert!(err("networks=tcp0(),tcp1").contains("empty interface list"));
        assert!(err("networks='tcp0(eth0, eth1)'").contains("without blanks"));
        assert!(err("networks='tcp0 x'").contains("invalid network specification"));
        assert!(err("routes=\"tcp0 1 10.0.0.1@tcp").contains("does not close"));
        assert!(err("options lnet networks=").contains("no value"));
    }

    #[test]
    fn a_failed_source_adds_nothing() {
        let mut l = Legacy::default();
        l.add_inline("tcp0 10.0.0.*").unwrap();
        let before = l.clone();
        assert!(l.add_inline("tcp1 10.1.0.*; tcp2 10.2").is_err());
        assert!(
            l.add_modprobe("options lnet ip2nets=\"tcp3 10.3.0.*\" routes=\"x\"")
                .is_err()
        );
        assert_eq!(l, before);
        assert!(Legacy::default().is_empty() && Legacy::default().to_yaml().is_empty());
    }

    #[test]
    fn unquoted_values_end_at_the_next_assignment_or_line() {
        let mut l = Legacy::default();
        l.add_inline("networks=tcp0(eth0) routes=tcp1 10.0.0.1@tcp0;\nip2nets=tcp2 10.2.0.*")
            .unwrap();
        assert_eq!(l.nets.len(), 1);
        assert_eq!(l.routes[0].gateway, "10.0.0.1@tcp0");
        assert_eq!(l.rules[0].ranges, ["10.2.0.*"]);
        // A word that merely ends in a parameter's name is not one.
        let mut l = Legacy::default();
        l.add_inline("myroutes='x' tcp0 10.0.0.*").unwrap_err();
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn net() -> impl Strategy<Value = String> {
            (
                prop_oneof![Just("tcp"), Just("o2ib"), Just("gni")],
                0_u32..20,
            )
                .prop_map(|(t, n)| {
                    if n == 0 {
                        t.to_owned()
                    } else {
                        format!("{t}{n}")
                    }
                })
        }

        fn part() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("*".to_owned()),
                (0_u32..256).prop_map(|n| n.to_string()),
                (0_u32..200, 0_u32..50).prop_map(|(a, b)| format!("[{a}-{}]", a + b)),
                (0_u32..200, 1_u32..9).prop_map(|(a, s)| format!("[{a}-255/{s},7]")),
            ]
        }

        fn range() -> impl Strategy<Value = String> {
            proptest::collection::vec(part(), 4).prop_map(|p| p.join("."))
        }

        fn ifaces() -> impl Strategy<Value = Vec<String>> {
            proptest::collection::vec("[a-z][a-z0-9_.-]{0,6}", 0..3)
        }

        fn rule() -> impl Strategy<Value = RuleSpec> {
            (net(), ifaces(), proptest::collection::vec(range(), 1..4)).prop_map(
                |(net, interfaces, ranges)| RuleSpec {
                    net,
                    interfaces,
                    ranges,
                },
            )
        }

        fn route() -> impl Strategy<Value = RouteSpec> {
            (
                net(),
                (
                    0_u32..256,
                    0_u32..240,
                    prop_oneof![Just("tcp"), Just("o2ib1")],
                ),
                proptest::option::of(1_u32..256),
                proptest::option::of(0_u32..100),
            )
                .prop_map(|(net, (a, b, gw_net), hop, priority)| RouteSpec {
                    net,
                    gateway: format!("10.{a}.[{b}-{}].1@{gw_net}", b + 9),
                    hop,
                    priority,
                })
        }

        fn legacy_rule(r: &RuleSpec) -> String {
            let ifs = if r.interfaces.is_empty() {
                String::new()
            } else {
                format!("({})", r.interfaces.join(","))
            };
            format!("{}{ifs} {}", r.net, r.ranges.join(" "))
        }

        fn legacy_route(r: &RouteSpec) -> String {
            let hop = r.hop.map(|h| format!(" {h}")).unwrap_or_default();
            let prio = r.priority.map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}{hop} {}{prio}", r.net, r.gateway)
        }

        proptest! {
            /// Rules and routes written in the legacy form come back as
            /// they were, and the YAML reads back as what was written.
            #[test]
            fn legacy_text_converts_and_reads_back(
                rules in proptest::collection::vec(rule(), 0..4),
                routes in proptest::collection::vec(route(), 0..4),
            ) {
                let mut text = String::from("options lnet");
                if !rules.is_empty() {
                    let r: Vec<String> = rules.iter().map(legacy_rule).collect();
                    text.push_str(&format!(" ip2nets=\"{}\"", r.join("; ")));
                }
                if !routes.is_empty() {
                    let r: Vec<String> = routes.iter().map(legacy_route).collect();
                    text.push_str(&format!(" routes='{}'", r.join(";")));
                }
                let mut l = Legacy::default();
                if rules.is_empty() && routes.is_empty() {
                    // "options lnet" alone is read as an ip2nets rule.
                    prop_assert!(l.add_inline(&text).is_err());
                    return Ok(());
                }
                l.add_inline(&text).unwrap();
                prop_assert_eq!(&l.rules, &rules);
                prop_assert_eq!(&l.routes, &routes);
                let back = Doc::from_yaml(&l.to_yaml()).unwrap();
                prop_assert_eq!(back, l.to_doc());
            }

            /// Any text: an error or a document, never a panic.
            #[test]
            fn any_text_converts_or_fails_cleanly(s in "[ -~\n]{0,80}") {
                let mut l = Legacy::default();
                if l.add_inline(&s).is_ok() {
                    let _ = Doc::from_yaml(&l.to_yaml()).unwrap();
                }
                let _ = Legacy::default().add_modprobe(&s);
            }
        }
    }
}
