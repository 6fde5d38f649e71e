//! A small document tree ([`Doc`]) with `lnetctl`'s YAML layout, JSON
//! output, and a YAML reader.
//!
//! `lnetctl` prints YAML with its own printer (`cYAML_print_tree`, four
//! spaces a level, sequence items as `- ` two columns deeper than their
//! siblings' keys); [`Doc::to_yaml`] reproduces that layout byte for byte so
//! that an administrator's eyes (and scripts) see what `lnetctl` shows.
//! Reading uses `yaml-rust2` (a YAML 1.2 parser, duplicate keys refused)
//! and turns its tree into a [`Doc`] whose maps keep their order.

use serde::{Deserialize, Serialize};

/// A YAML/JSON value whose maps keep their key order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Doc {
    /// `~` or an empty value (`lnd tunables:`).
    Null,
    /// `true`/`false` (YAML booleans; `lnetctl` writes `True`/`False`).
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string (also non-integer numbers as they were written).
    Str(String),
    /// A sequence.
    Seq(Vec<Doc>),
    /// A mapping, in order.
    Map(Vec<(String, Doc)>),
}

/// A YAML document that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed YAML: {0}")]
pub struct YamlError(pub String);

/// Columns per level (`cyaml.c` `INDENT`).
const INDENT: usize = 4;
/// Extra columns of a sequence item's keys (`EXTRA_IND`).
const EXTRA_IND: usize = 2;

impl Doc {
    /// An empty map.
    #[must_use]
    pub const fn map() -> Self {
        Self::Map(Vec::new())
    }

    /// Appends `key: value` to a map (no effect on other variants).
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<Self>) -> Self {
        self.push(key, value);
        self
    }

    /// Appends `key: value` to a map (no effect on other variants).
    pub fn push(&mut self, key: &str, value: impl Into<Self>) {
        if let Self::Map(m) = self {
            m.push((key.to_owned(), value.into()));
        }
    }

    /// The value of `key` in a map.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Self> {
        match self {
            Self::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The items of a sequence (empty for other variants).
    #[must_use]
    pub fn items(&self) -> &[Self] {
        match self {
            Self::Seq(v) => v,
            _ => &[],
        }
    }

    /// An integer value (a string of digits counts).
    #[must_use]
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            Self::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A scalar as text (`None` for maps, sequences and null).
    #[must_use]
    pub fn as_text(&self) -> Option<String> {
        match self {
            Self::Int(i) => Some(i.to_string()),
            Self::Str(s) => Some(s.clone()),
            Self::Bool(b) => Some(if *b { "True" } else { "False" }.to_owned()),
            _ => None,
        }
    }

    /// Reads one YAML document (an empty text is [`Doc::Null`]).
    ///
    /// # Errors
    /// Malformed YAML (with its line and column), several documents,
    /// duplicate keys, anchors/aliases or tags that do not map to a value.
    pub fn from_yaml(text: &str) -> Result<Self, YamlError> {
        let docs =
            yaml_rust2::YamlLoader::load_from_str(text).map_err(|e| YamlError(e.to_string()))?;
        match docs.len() {
            0 => Ok(Self::Null),
            1 => from_yaml_node(&docs[0]),
            n => Err(YamlError(format!(
                "{n} documents in one file, expected one"
            ))),
        }
    }

    /// `lnetctl`'s YAML layout (`cYAML_print_tree`). The top is a map.
    #[must_use]
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        match self {
            Self::Map(m) => {
                let cpi = Cpi {
                    level: 0,
                    first: false,
                    extra: 0,
                };
                for (k, v) in m {
                    print_value(&mut out, Some(k), v, cpi);
                }
            }
            Self::Seq(_) => print_value(
                &mut out,
                None,
                self,
                Cpi {
                    level: 0,
                    first: false,
                    extra: 0,
                },
            ),
            other => {
                out.push_str(&scalar_text(other));
                out.push('\n');
            }
        }
        out
    }

    /// Compact JSON, maps in order.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        json(&mut out, self);
        out
    }
}

impl From<&str> for Doc {
    fn from(s: &str) -> Self {
        Self::Str(s.to_owned())
    }
}

impl From<String> for Doc {
    fn from(s: String) -> Self {
        Self::Str(s)
    }
}

impl From<i64> for Doc {
    fn from(i: i64) -> Self {
        Self::Int(i)
    }
}

impl From<u64> for Doc {
    fn from(i: u64) -> Self {
        Self::Int(i64::try_from(i).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Doc {
    fn from(i: u32) -> Self {
        Self::Int(i64::from(i))
    }
}

impl From<u16> for Doc {
    fn from(i: u16) -> Self {
        Self::Int(i64::from(i))
    }
}

impl From<i32> for Doc {
    fn from(i: i32) -> Self {
        Self::Int(i64::from(i))
    }
}

impl From<usize> for Doc {
    fn from(i: usize) -> Self {
        Self::Int(i64::try_from(i).unwrap_or(i64::MAX))
    }
}

impl From<Vec<Self>> for Doc {
    fn from(v: Vec<Self>) -> Self {
        Self::Seq(v)
    }
}

fn from_yaml_node(y: &yaml_rust2::Yaml) -> Result<Doc, YamlError> {
    use yaml_rust2::Yaml;
    Ok(match y {
        Yaml::Null => Doc::Null,
        Yaml::Boolean(b) => Doc::Bool(*b),
        Yaml::Integer(i) => Doc::Int(*i),
        Yaml::Real(s) | Yaml::String(s) => Doc::Str(s.clone()),
        Yaml::Array(a) => Doc::Seq(a.iter().map(from_yaml_node).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut m = Vec::with_capacity(h.len());
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) | Yaml::Real(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(YamlError(format!("unsupported map key {other:?}"))),
                };
                m.push((key, from_yaml_node(v)?));
            }
            Doc::Map(m)
        }
        Yaml::Alias(_) => return Err(YamlError("aliases are not supported".into())),
        Yaml::BadValue => return Err(YamlError("bad value".into())),
    })
}

/// `cYAML_print_info`: the level, whether this is the first entry of a
/// sequence item (printed after `- `), and the extra indentation.
#[derive(Clone, Copy)]
struct Cpi {
    level: usize,
    first: bool,
    extra: usize,
}

fn scalar_text(v: &Doc) -> String {
    match v {
        Doc::Null => String::new(),
        Doc::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
        Doc::Int(i) => i.to_string(),
        Doc::Str(s) => quote_if_needed(s),
        Doc::Seq(_) | Doc::Map(_) => String::new(),
    }
}

/// `lnetctl` writes strings as they are; we write plain what YAML reads
/// back as the same string (NIDs, names, words) and double-quote the rest
/// (so that export → import is exact).
/// Inside a plain scalar, `*`, brackets and commas are ordinary
/// characters (NID ranges `10.0.0.[1-3]@tcp`, IP patterns `10.0.*.*`):
/// only at the start would they mean an alias or a flow collection.
fn quote_if_needed(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || " ._@/+=()-*[],".contains(c);
    let first = s.chars().next();
    // A digit first: a NID, or text no YAML reader takes for a number.
    let reads_as_text = || {
        yaml_rust2::YamlLoader::load_from_str(s)
            .is_ok_and(|d| d.len() == 1 && d[0] == yaml_rust2::Yaml::String(s.to_owned()))
    };
    let plain_ok = s.chars().all(safe)
        && first.is_some_and(|c| {
            c.is_ascii_alphabetic() || (c.is_ascii_digit() && (s.contains('@') || reads_as_text()))
        })
        && !s.ends_with(' ')
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "null" | "on" | "off" | "y" | "n" | "inf" | "nan"
        );
    if plain_ok {
        return s.to_owned();
    }
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            '\r' => q.push_str("\\r"),
            c if c.is_control() || c == '\u{feff}' => {
                q.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn print_value(out: &mut String, key: Option<&str>, v: &Doc, cpi: Cpi) {
    match v {
        Doc::Map(m) => {
            if let Some(k) = key {
                if cpi.first {
                    pad(out, INDENT * cpi.level);
                    out.push_str("- ");
                } else {
                    pad(out, INDENT * cpi.level + cpi.extra);
                }
                out.push_str(k);
                out.push_str(":\n");
            }
            let mut child = Cpi {
                level: if key.is_some() {
                    cpi.level + 1
                } else {
                    cpi.level
                },
                first: key.is_none() && cpi.first,
                extra: if cpi.first { EXTRA_IND } else { cpi.extra },
            };
            for (k, v) in m {
                print_value(out, Some(k), v, child);
                child.first = false;
            }
        }
        Doc::Seq(items) => {
            if let Some(k) = key {
                // (`cyaml.c` forgets the `- ` of a sequence that opens a
                // sequence item; `lnetctl` never prints one.)
                if cpi.first {
                    pad(out, INDENT * cpi.level);
                    out.push_str("- ");
                } else {
                    pad(out, INDENT * cpi.level + cpi.extra);
                }
                out.push_str(k);
                out.push_str(":\n");
            }
            let child = Cpi {
                level: if key.is_some() {
                    cpi.level + 1
                } else {
                    cpi.level
                },
                first: true,
                extra: EXTRA_IND,
            };
            for item in items {
                match item {
                    Doc::Map(_) | Doc::Seq(_) => print_value(out, None, item, child),
                    scalar => {
                        pad(out, INDENT * child.level);
                        out.push_str("- ");
                        out.push_str(&scalar_text(scalar));
                        out.push('\n');
                    }
                }
            }
        }
        scalar => {
            let Some(k) = key else {
                out.push_str(&scalar_text(scalar));
                out.push('\n');
                return;
            };
            if cpi.first {
                pad(out, INDENT * cpi.level);
                out.push_str("- ");
            } else {
                pad(out, INDENT * cpi.level + cpi.extra);
            }
            out.push_str(k);
            out.push(':');
            if !matches!(scalar, Doc::Null) {
                out.push(' ');
                out.push_str(&scalar_text(scalar));
            }
            out.push('\n');
        }
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()));
}

fn json(out: &mut String, v: &Doc) {
    match v {
        Doc::Null => out.push_str("null"),
        Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Doc::Int(i) => out.push_str(&i.to_string()),
        Doc::Str(s) => json_str(out, s),
        Doc::Seq(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json(out, item);
            }
            out.push(']');
        }
        Doc::Map(m) => {
            out.push('{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_str(out, k);
                out.push(':');
                json(out, v);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The layout of `lnetctl net show` (Lustre manual).
    #[test]
    fn lnetctl_layout() {
        let doc = Doc::map().with(
            "net",
            vec![
                Doc::map().with("net type", "lo").with(
                    "local NI(s)",
                    vec![Doc::map().with("nid", "0@lo").with("status", "up")],
                ),
                Doc::map().with("net type", "tcp").with(
                    "local NI(s)",
                    vec![
                        Doc::map()
                            .with("nid", "192.168.122.10@tcp")
                            .with("status", "up")
                            .with("interfaces", Doc::map().with("0", "eth0"))
                            .with("lnd tunables", Doc::Null),
                    ],
                ),
            ],
        );
        let want = "net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
    - net type: tcp
      local NI(s):
        - nid: 192.168.122.10@tcp
          status: up
          interfaces:
              0: eth0
          lnd tunables:
";
        assert_eq!(doc.to_yaml(), want);
        assert_eq!(Doc::from_yaml(want).unwrap(), {
            // Keys read back as strings, `0` included.
            doc.clone()
        });
    }

    #[test]
    fn routing_sequence_of_maps() {
        let doc = Doc::map().with(
            "routing",
            vec![
                Doc::map().with(
                    "cpt[0]",
                    Doc::map().with("tiny", Doc::map().with("npages", 0_i64)),
                ),
                Doc::map().with("enable", 1_i64),
            ],
        );
        let want = "routing:
    - cpt[0]:
          tiny:
              npages: 0
    - enable: 1
";
        assert_eq!(doc.to_yaml(), want);
        assert_eq!(Doc::from_yaml(want).unwrap(), doc);
    }

    #[test]
    fn strings_that_need_quotes_round_trip() {
        for s in ["[0]", "True", "1.5", "", "a: b", "-x", "12"] {
            let doc = Doc::map().with("k", s);
            assert_eq!(
                Doc::from_yaml(&doc.to_yaml()).unwrap(),
                doc,
                "{s:?} -> {}",
                doc.to_yaml()
            );
        }
    }

    #[test]
    fn malformed_and_duplicate() {
        assert!(Doc::from_yaml("net: [\n").is_err());
        assert!(Doc::from_yaml("a: 1\na: 2\n").is_err());
        assert!(Doc::from_yaml("---\na: 1\n---\nb: 2\n").is_err());
        assert_eq!(Doc::from_yaml("").unwrap(), Doc::Null);
    }

    fn scalar() -> impl Strategy<Value = Doc> {
        prop_oneof![
            Just(Doc::Null),
            any::<bool>().prop_map(Doc::Bool),
            any::<i64>().prop_map(Doc::Int),
            "[ -~]{0,12}".prop_map(Doc::Str),
            "\\PC{0,6}".prop_map(Doc::Str),
            "[0-9.]{1,15}@tcp[0-9]?".prop_map(Doc::Str),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        "[a-zA-Z][a-zA-Z0-9_]{0,6}( [a-zA-Z(]{1,4}\\)?)?"
    }

    /// What the layout can carry: maps with unique keys, sequences of
    /// scalars or non-empty maps, non-empty nested collections.
    fn value() -> impl Strategy<Value = Doc> {
        scalar().prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec((key(), inner.clone()), 1..4).prop_map(|kv| {
                    let mut seen = std::collections::HashSet::new();
                    Doc::Map(
                        kv.into_iter()
                            .filter(|(k, _)| seen.insert(k.clone()))
                            .collect(),
                    )
                }),
                prop::collection::vec(
                    prop_oneof![
                        scalar().prop_filter("null items read back as null", |d| *d != Doc::Null),
                        prop::collection::vec((key(), inner), 1..3).prop_map(|kv| {
                            let mut seen = std::collections::HashSet::new();
                            Doc::Map(
                                kv.into_iter()
                                    .filter(|(k, _)| seen.insert(k.clone()))
                                    .collect(),
                            )
                        }),
                    ],
                    1..4
                )
                .prop_map(Doc::Seq),
            ]
        })
    }

    proptest! {
        /// Whatever we write in lnetctl's layout reads back the same.
        #[test]
        fn yaml_round_trip(kv in prop::collection::vec((key(), value()), 0..5)) {
            let mut seen = std::collections::HashSet::new();
            let doc = Doc::Map(kv.into_iter().filter(|(k, _)| seen.insert(k.clone())).collect());
            let text = doc.to_yaml();
            let back = Doc::from_yaml(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
            let want = if matches!(&doc, Doc::Map(m) if m.is_empty()) { Doc::Null } else { doc };
            prop_assert_eq!(back, want, "{}", text);
        }
    }

    #[test]
    fn json_keeps_order() {
        let d = Doc::map()
            .with("b", 1_i64)
            .with("a", vec![Doc::from("x\"y")]);
        assert_eq!(d.to_json(), r#"{"b":1,"a":["x\"y"]}"#);
    }
}
