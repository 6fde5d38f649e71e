//! The node's configuration as `lnetctl export` writes it (YAML), read
//! with warnings for what has no meaning here, written back in the same
//! shape, and turned into an [`LnetConfig`] or applied to a running node.
//!
//! Shape (keys exactly as `liblnetconfig`):
//!
//! ```yaml
//! net:
//!     - net type: tcp
//!       local NI(s):
//!         - nid: 127.0.0.1@tcp
//!           tunables:
//!               peer_timeout: 0
//!               peer_credits: 8
//!               peer_buffer_credits: 0
//!               credits: 256
//!           lnd tunables:
//!               conns_per_peer: 1
//! peer:
//!     - primary nid: 127.0.0.2@tcp
//!       Multi-Rail: True
//!       peer ni:
//!         - nid: 127.0.0.2@tcp
//! route:
//!     - net: tcp1
//!       gateway: 127.0.0.3@tcp
//!       hop: -1
//!       priority: 0
//! routing:
//!     enable: 0
//! buffers:
//!     tiny: 2048
//!     small: 16384
//!     large: 1024
//! global:
//!     discovery: 1
//!     accept_port: 988
//! ```
//!
//! ## Example
//!
//! ```
//! use colibri_lnet_rt::conf::NodeConf;
//!
//! let text = "net:
//!     - net type: tcp
//!       local NI(s):
//!         - nid: 127.0.0.1@tcp
//!           interfaces:
//!               0: eth0
//! ";
//! let (conf, warnings) = NodeConf::from_yaml(text)?;
//! assert_eq!(conf.nis[0].nid.to_string(), "127.0.0.1@tcp");
//! // An interface that does not hold the NID's IP is ignored, with a
//! // warning (the NI listens on its NID's IP). Without `nid`, the NI's
//! // NID is the first named interface's IPv4 address on the net.
//! assert!(warnings[0].contains("eth0"));
//! assert!(conf.to_yaml().starts_with("net:\n    - net type: tcp\n"));
//! // An unknown key is an error that says where.
//! let e = NodeConf::from_yaml("net:\n    - net typ: tcp\n").unwrap_err();
//! assert_eq!(e.to_string(), "net[0]: invalid key 'net typ' (unknown)");
//! # Ok::<(), colibri_lnet_rt::conf::ConfError>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use colibri_lnet::credits::RouterBufferConfig;
use colibri_lnet::ids::{Net, Nid};
use colibri_lnet::node::{DEFAULT_PEER_TIMEOUT, NiConfig, Node, ResponseTracking, RoutingState};
use colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet::udsp::{Rule, Udsp};

use crate::LnetConfig;
use crate::yaml::Doc;

/// A configuration file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfError {
    /// Not YAML.
    #[error(transparent)]
    Yaml(#[from] crate::yaml::YamlError),
    /// A key this program does not know (a typo, or a newer `lnetctl`).
    #[error("{at}: invalid key '{key}' (unknown)")]
    UnknownKey {
        /// Where (`net[0].local NI(s)[1]`).
        at: String,
        /// The key.
        key: String,
    },
    /// A value of the wrong type or out of range.
    #[error("{at}: {what}")]
    Invalid {
        /// Where.
        at: String,
        /// What is wrong.
        what: String,
    },
}

impl ConfError {
    fn invalid(at: &str, what: impl Into<String>) -> Self {
        Self::Invalid {
            at: at.to_owned(),
            what: what.into(),
        }
    }

    /// `EINVAL`, as `lnetctl import` reports a bad file.
    #[must_use]
    pub const fn errno(&self) -> i32 {
        22
    }
}

/// One local NI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NiConf {
    /// The NID: its IP is the address the NI listens on.
    pub nid: Nid,
    /// `credits` (256).
    pub credits: u32,
    /// `peer_credits` (8).
    pub peer_credits: u32,
    /// `peer_buffer_credits` (0 = `peer_credits`): router credits per
    /// peer NI when the node routes.
    pub peer_buffer_credits: u32,
    /// `lnd tunables: conns_per_peer` (`None`: the socket LND's default).
    pub conns_per_peer: Option<u32>,
    /// `lnd tunables: tos`, 0 to 255 (`None`, or -1 in a file: the socket
    /// LND's `tos`).
    pub tos: Option<i32>,
    /// `tunables: peer_timeout` in seconds (-1 in a file: 180, Lustre's
    /// default; 0: no peer aliveness on a router).
    pub peer_timeout: u32,
    /// The interface the NI is on (`interfaces: 0:`), when it was named
    /// and holds the NID's IP: `net show` and `export` print it.
    pub interface: Option<String>,
}

impl NiConf {
    /// Gives `other` (an NI of the same net) this NI's LNet tunables
    /// (`credits`, `peer_credits`, `peer_buffer_credits`,
    /// `peer_timeout`): Lustre keeps them per net, from the net's first
    /// NI, and warns that "all tunables of NIs of a net should be the
    /// same" when a later NI brings others. The LND's (`conns_per_peer`,
    /// `tos`) stay the NI's own. Returns whether `other`'s changed.
    pub fn take_net_tunables(&self, other: &mut Self) -> bool {
        let net = self.to_ni_config().net_tunables();
        let changed = other.to_ni_config().net_tunables() != net;
        [
            other.credits,
            other.peer_credits,
            other.peer_buffer_credits,
            other.peer_timeout,
        ] = net;
        changed
    }

    /// An NI with Lustre's default tunables (the node's, [`NiConfig::new`])
    /// and no interface named.
    #[must_use]
    pub const fn new(nid: Nid) -> Self {
        let d = NiConfig::new(nid);
        Self {
            nid,
            credits: d.credits,
            peer_credits: d.peer_credits,
            peer_buffer_credits: d.peer_buffer_credits,
            conns_per_peer: None,
            tos: None,
            peer_timeout: d.peer_timeout,
            interface: None,
        }
    }

    /// The node's configuration of this NI.
    #[must_use]
    pub fn to_ni_config(&self) -> NiConfig {
        let mut c = NiConfig::new(self.nid);
        c.credits = self.credits;
        c.peer_credits = self.peer_credits;
        c.peer_buffer_credits = self.peer_buffer_credits;
        c.conns_per_peer = self.conns_per_peer.unwrap_or(0);
        c.tos = self.tos.unwrap_or(-1);
        c.peer_timeout = self.peer_timeout;
        c
    }
}

/// A DLC-configured peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConf {
    /// `primary nid`.
    pub primary: Nid,
    /// `Multi-Rail`.
    pub multi_rail: bool,
    /// `peer ni` NIDs (the primary included when listed).
    pub nids: Vec<Nid>,
}

/// A route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConf {
    /// Remote net.
    pub net: Net,
    /// Gateway on one of our nets.
    pub gateway: Nid,
    /// `hop` (`None` = -1, undefined).
    pub hop: Option<u32>,
    /// `priority`.
    pub priority: u32,
}

/// `global:` names in `lnetctl global show` order, with Lustre's defaults,
/// then the router checker's module parameters (`alive_router_check_interval`,
/// `router_ping_timeout`, `avoid_asym_router_failure`,
/// `check_routers_before_use`: Lustre's module parameters of those names,
/// settable here). Those marked `false` are recorded and shown but
/// change nothing here, as [`no_effect_reason`] says: `numa_range` (no NUMA
/// distances: every NI is as near as any other), `recovery_interval` and
/// `router_sensitivity` (deprecated in Lustre, which ignores them too);
/// `lnd_timeout` is derived and shown only.
pub const GLOBALS: &[(&str, i64, bool)] = &[
    ("numa_range", 0, false),
    ("max_interfaces", 200, true),
    ("discovery", 1, true),
    ("drop_asym_route", 0, true),
    ("retry_count", 2, true),
    ("transaction_timeout", 150, true),
    ("health_sensitivity", 100, true),
    ("recovery_interval", 1, false),
    ("router_sensitivity", 100, false),
    ("lnd_timeout", 50, false),
    ("response_tracking", 3, true),
    ("recovery_limit", 0, true),
    ("max_recovery_ping_interval", 900, true),
    ("alive_router_check_interval", 60, true),
    ("router_ping_timeout", 50, true),
    ("avoid_asym_router_failure", 1, true),
    ("check_routers_before_use", 0, true),
];

/// Why a global marked without effect in [`GLOBALS`] changes nothing
/// (the warning `set`, `run` and `import` give for a non-default value).
#[must_use]
pub fn no_effect_reason(name: &str) -> Option<&'static str> {
    Some(match name {
        "numa_range" => {
            "no NUMA here: NIs have no device distance, so a NUMA range changes no NI choice"
        }
        "recovery_interval" => {
            "deprecated in Lustre and ignored: recovery pings back off from 1 s up to max_recovery_ping_interval"
        }
        "router_sensitivity" => {
            "deprecated in Lustre (LU-18444) and ignored: a route's aliveness follows its gateway's NI status"
        }
        _ => return None,
    })
}

/// A node's configuration (what `export` writes and `import`/`run` read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConf {
    /// Local NIs, the primary first.
    pub nis: Vec<NiConf>,
    /// Configured peers.
    pub peers: Vec<PeerConf>,
    /// Routes.
    pub routes: Vec<RouteConf>,
    /// `routing: enable:`.
    pub routing: Option<bool>,
    /// `buffers:` (each `None` = default).
    pub buffers: [Option<u32>; 3],
    /// `global:` values given (names of [`GLOBALS`]).
    pub global: BTreeMap<String, i64>,
    /// `global: accept_port:` (988).
    pub accept_port: Option<u16>,
    /// `global: accept_port_bulk:` (Lustre 2.17's module parameter: the
    /// port of bulk connections; none: `accept_port`).
    pub accept_port_bulk: Option<u16>,
    /// `global: accept:` `secure|all|none` (Lustre's module parameter).
    pub accept: Option<AcceptPolicy>,
    /// `udsp:` selection policies, in index order.
    pub udsp: Vec<Rule>,
}

/// Lustre's default acceptor port.
pub const DEFAULT_ACCEPT_PORT: u16 = 988;

fn at_idx(at: &str, key: &str, i: usize) -> String {
    if at.is_empty() {
        format!("{key}[{i}]")
    } else {
        format!("{at}.{key}[{i}]")
    }
}

fn at_key(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn entries<'a>(d: &'a Doc, at: &str) -> Result<&'a [(String, Doc)], ConfError> {
    match d {
        Doc::Map(m) => Ok(m),
        Doc::Null => Ok(&[]),
        _ => Err(ConfError::invalid(at, "expected a map")),
    }
}

/// A sequence; a single map stands for a one-item sequence.
fn seq<'a>(d: &'a Doc, at: &str) -> Result<Vec<&'a Doc>, ConfError> {
    match d {
        Doc::Seq(v) => Ok(v.iter().collect()),
        Doc::Map(_) => Ok(vec![d]),
        Doc::Null => Ok(Vec::new()),
        _ => Err(ConfError::invalid(at, "expected a list")),
    }
}

fn int(d: &Doc, at: &str) -> Result<i64, ConfError> {
    d.as_i64().ok_or_else(|| wrong_value(d, at, "a number"))
}

/// A value that is missing or not `what`, in the words of `lnetctl
/// import` ("no value", "invalid value").
fn wrong_value(d: &Doc, at: &str, what: &str) -> ConfError {
    match d {
        Doc::Null => ConfError::invalid(at, format!("no value (expected {what})")),
        other => ConfError::invalid(
            at,
            format!("invalid value {} (expected {what})", show(other)),
        ),
    }
}

fn uint(d: &Doc, at: &str, max: u64) -> Result<u64, ConfError> {
    let v = int(d, at)?;
    u64::try_from(v)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| ConfError::invalid(at, format!("{v} is outside 0..={max}")))
}

fn show(d: &Doc) -> String {
    d.as_text().unwrap_or_else(|| d.to_json())
}

fn text(d: &Doc, at: &str) -> Result<String, ConfError> {
    d.as_text()
        .ok_or_else(|| ConfError::invalid(at, "expected a value"))
}

/// Parses a NID as `lnetctl` writes it.
///
/// # Errors
/// Text that is not a NID, `LNET_NID_ANY`.
pub fn parse_nid(s: &str, at: &str) -> Result<Nid, ConfError> {
    let nid: Nid = s
        .trim()
        .parse()
        .map_err(|e| ConfError::invalid(at, format!("'{s}' is not a NID: {e}")))?;
    if nid.is_any() {
        return Err(ConfError::invalid(at, format!("'{s}' is not a NID")));
    }
    Ok(nid)
}

/// Parses a net name (`tcp`, `tcp1`).
///
/// # Errors
/// Text that is not a net.
pub fn parse_net(s: &str, at: &str) -> Result<Net, ConfError> {
    s.trim()
        .parse()
        .map_err(|e| ConfError::invalid(at, format!("'{s}' is not a net: {e}")))
}

fn bool_val(d: &Doc, at: &str) -> Result<bool, ConfError> {
    match d {
        Doc::Bool(b) => Ok(*b),
        Doc::Int(0) => Ok(false),
        Doc::Int(1) => Ok(true),
        Doc::Str(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Doc::Str(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        other => Err(wrong_value(other, at, "True/False or 1/0")),
    }
}

fn unknown(at: &str, key: &str) -> ConfError {
    ConfError::UnknownKey {
        at: if at.is_empty() {
            "top level".to_owned()
        } else {
            at.to_owned()
        },
        key: key.to_owned(),
    }
}

/// One selection policy as `lnetctl udsp show` prints it (and `export`
/// writes it): its index, the expressions it has, and a priority rule's
/// `action`.
#[must_use]
pub fn udsp_doc(idx: usize, r: &Rule) -> Doc {
    let mut d = Doc::map().with("idx", idx);
    for (key, e) in [("src", r.src()), ("dst", r.dst()), ("rte", r.rte())] {
        if let Some(e) = e {
            d.push(key, e.to_string());
        }
    }
    if let Some(p) = r.priority() {
        d.push("action", Doc::map().with("priority", p));
    }
    d
}

/// Only `tcp` nets (and the implicit `lo`) have an LND here.
fn check_net_type(net: Net, at: &str) -> Result<(), ConfError> {
    match net.lnd().name() {
        Some("tcp") => Ok(()),
        _ => Err(ConfError::invalid(
            at,
            format!("net type {net}: only tcp nets are supported by this node"),
        )),
    }
}

impl NodeConf {
    /// An empty configuration (no NI: the node has only `0@lo`).
    #[must_use]
    pub fn empty() -> Self {
        Self {
            nis: Vec::new(),
            peers: Vec::new(),
            routes: Vec::new(),
            routing: None,
            buffers: [None; 3],
            global: BTreeMap::new(),
            accept_port: None,
            accept_port_bulk: None,
            accept: None,
            udsp: Vec::new(),
        }
    }

    /// Reads a configuration in `lnetctl export` shape. The returned
    /// warnings name what was ignored (interface names, CPTs, values of
    /// settings that change nothing here).
    ///
    /// # Errors
    /// Malformed YAML, unknown keys, values that do not parse (NIDs, nets,
    /// numbers), unsupported net types, a route to a local net.
    pub fn from_yaml(text: &str) -> Result<(Self, Vec<String>), ConfError> {
        let doc = Doc::from_yaml(text)?;
        Self::from_doc(&doc)
    }

    /// As [`NodeConf::from_yaml`], from a parsed document.
    ///
    /// # Errors
    /// As [`NodeConf::from_yaml`].
    pub fn from_doc(doc: &Doc) -> Result<(Self, Vec<String>), ConfError> {
        let mut c = Self::empty();
        let mut warn = Vec::new();
        if !matches!(doc, Doc::Map(_) | Doc::Null) {
            return Err(ConfError::invalid(
                "top level",
                "expected a map of net:, peer:, route:, routing:, buffers:, global:",
            ));
        }
        for (k, v) in entries(doc, "")? {
            match k.as_str() {
                "net" => c.read_nets(v, &mut warn)?,
                "peer" => c.read_peers(v)?,
                "route" => c.read_routes(v)?,
                "routing" => c.read_routing(v, &mut warn)?,
                "buffers" => c.read_buffers(v)?,
                "global" => c.read_global(v, &mut warn)?,
                "statistics" | "ping" | "discover" => {}
                "udsp" => c.read_udsp(v)?,
                "ip2nets" => c.read_ip2nets(v, &mut warn)?,
                "numa" => {
                    warn.push(format!("{k}: not supported here, ignored"));
                }
                other => return Err(unknown("", other)),
            }
        }
        let local: Vec<Net> = c.nis.iter().map(|n| n.nid.net()).collect();
        for (i, r) in c.routes.iter().enumerate() {
            if local.contains(&r.net) {
                return Err(ConfError::invalid(
                    &at_idx("", "route", i),
                    format!("route to {}: {} is a local net", r.net, r.net),
                ));
            }
        }
        Ok((c, warn))
    }

    /// Adds what LNet's module parameters say, in their string forms, as
    /// a node started by `modprobe lnet networks=... routes=...` is
    /// configured (`colibri lnet run --networks ...`):
    ///
    /// * `networks`: nets separated by commas or blanks, each with its
    ///   interfaces in parentheses (`tcp0(eth0,eth1),tcp1(eth2)`): an NI
    ///   on each interface; a net without any takes the first interface
    ///   that is up and not `lo`;
    /// * `ip2nets`: rules `NETS RANGE...` separated by `;`, as the kernel
    ///   reads them (`kernel_ip2nets`): the nets of every rule matching an
    ///   address of this machine, as `networks`; not with `networks`, as
    ///   LNet refuses both at once;
    /// * `routes`: routes separated by `;`, each a remote net, a hop count
    ///   if any, then gateways, each a NID or a NID range with its
    ///   priority after a colon (`tcp2 2 10.0.0.[1-2]@tcp:1`).
    ///
    /// Returns warnings.
    ///
    /// # Errors
    /// A malformed parameter, an interface that is missing or down, a
    /// NID given twice, a route to a local net.
    pub fn add_module_params(
        &mut self,
        networks: Option<&str>,
        ip2nets: Option<&str>,
        routes: Option<&str>,
    ) -> Result<Vec<String>, ConfError> {
        let warn = Vec::new();
        if networks.is_some() && ip2nets.is_some() {
            return Err(ConfError::invalid(
                "networks",
                "give networks or ip2nets, not both (LNet refuses both at once)",
            ));
        }
        let ifaces = || {
            crate::sock::link::read_ifaddrs().map_err(|e| {
                ConfError::invalid(
                    "networks",
                    format!("cannot read this machine's interfaces: {e}"),
                )
            })
        };
        // The nets `networks` names, or those of the `ip2nets` rules that
        // match an address of this machine, as the kernel turns ip2nets
        // into a networks string.
        let nets = match (networks, ip2nets) {
            (Some(n), _) => Some((parse_networks(n)?, ifaces()?)),
            (None, Some(s)) => {
                let t = ifaces()?;
                // No IPv6 table (no IPv6 in this kernel): IPv6 ranges match
                // nothing.
                let v6 = crate::sock::link::read_ipv6_addrs().unwrap_or_default();
                Some((kernel_ip2nets(s, &t, &v6)?, t))
            }
            (None, None) => None,
        };
        if let Some((rules, t)) = nets {
            for rule in rules {
                let chosen = rule
                    .choose(&t, &[])
                    .map_err(|why| ConfError::invalid(&rule.at, why))?;
                for (name, ip) in chosen {
                    let nid = rule.net.nid_ipv4(ip);
                    if self.nis.iter().any(|x| x.nid == nid) {
                        return Err(ConfError::invalid(&rule.at, format!("{nid} given twice")));
                    }
                    let mut ni = NiConf::new(nid);
                    ni.interface = Some(name);
                    self.nis.push(ni);
                }
            }
        }
        if let Some(r) = routes {
            self.routes.extend(parse_routes(r)?);
        }
        let local: Vec<Net> = self.nis.iter().map(|n| n.nid.net()).collect();
        if let Some(r) = self.routes.iter().find(|r| local.contains(&r.net)) {
            return Err(ConfError::invalid(
                "routes",
                format!("route to {}: {} is a local net", r.net, r.net),
            ));
        }
        Ok(warn)
    }

    /// `ip2nets:`, lnetctl's rules matched against this machine's
    /// interfaces ([`resolve_ip2nets`]).
    fn read_ip2nets(&mut self, v: &Doc, warn: &mut Vec<String>) -> Result<(), ConfError> {
        let rules = seq(v, "ip2nets")?
            .into_iter()
            .enumerate()
            .map(|(i, rule)| Ip2netsRule::from_doc(rule, &at_idx("", "ip2nets", i), warn))
            .collect::<Result<Vec<_>, _>>()?;
        let have: Vec<Nid> = self.nis.iter().map(|n| n.nid).collect();
        let nis = resolve_ip2nets(&rules, &have, warn)?;
        self.nis.extend(nis);
        Ok(())
    }

    fn read_nets(&mut self, v: &Doc, warn: &mut Vec<String>) -> Result<(), ConfError> {
        for (i, net) in seq(v, "net")?.into_iter().enumerate() {
            let at = at_idx("", "net", i);
            let mut net_type = None;
            let mut nis = None;
            let mut defaults = NetDefaults::default();
            for (k, v) in entries(net, &at)? {
                match k.as_str() {
                    "net type" => net_type = Some(parse_net(&text(v, &at_key(&at, k))?, &at)?),
                    "local NI(s)" => nis = Some(v),
                    // Tunables of the net: those of each NI that gives
                    // none of its own (sanity-lnet 170).
                    "tunables" => defaults.tunables = Some((v, at_key(&at, k))),
                    "lnd tunables" => defaults.lnd = Some((v, at_key(&at, k))),
                    other => return Err(unknown(&at, other)),
                }
            }
            let net_type = net_type.ok_or_else(|| ConfError::invalid(&at, "missing 'net type'"))?;
            if net_type == Nid::LO_0.net() {
                continue; // 0@lo always exists
            }
            check_net_type(net_type, &at)?;
            let Some(nis) = nis else {
                // `networks=tcp` as `legacy2yaml` writes it: as the module
                // parameter (and `net add --net tcp`), an NI on the first
                // interface that is up and not a loopback.
                let rule = Ip2netsRule::new(&at, net_type, Vec::new(), &[])?;
                let have: Vec<Nid> = self.nis.iter().map(|n| n.nid).collect();
                let chosen = resolve_ip2nets(&[rule], &have, warn)?;
                self.nis.extend(chosen);
                continue;
            };
            for (j, ni) in seq(nis, &at_key(&at, "local NI(s)"))?
                .into_iter()
                .enumerate()
            {
                let at = at_idx(&at, "local NI(s)", j);
                for mut n in read_ni(ni, &at, net_type, &defaults, warn)? {
                    if self.nis.iter().any(|x| x.nid == n.nid) {
                        return Err(ConfError::invalid(&at, format!("{} given twice", n.nid)));
                    }
                    if let Some(first) = self.nis.iter().find(|x| x.nid.net() == net_type)
                        && first.take_net_tunables(&mut n)
                    {
                        warn.push(format!(
                            "{at}: all tunables of NIs of a net should be the same: {} takes those of {} (the net's)",
                            n.nid, first.nid
                        ));
                    }
                    self.nis.push(n);
                }
            }
        }
        Ok(())
    }

    fn read_peers(&mut self, v: &Doc) -> Result<(), ConfError> {
        for (i, p) in seq(v, "peer")?.into_iter().enumerate() {
            let at = at_idx("", "peer", i);
            let (mut primary, mut mr, mut nids) = (None, true, Vec::new());
            for (k, v) in entries(p, &at)? {
                let kat = at_key(&at, k);
                match k.as_str() {
                    "primary nid" => primary = Some(parse_nid(&text(v, &kat)?, &kat)?),
                    "Multi-Rail" => mr = bool_val(v, &kat)?,
                    "peer ni" => {
                        for (j, ni) in seq(v, &kat)?.into_iter().enumerate() {
                            let nat = at_idx(&at, "peer ni", j);
                            let mut nid = None;
                            for (k, v) in entries(ni, &nat)? {
                                match k.as_str() {
                                    "nid" => {
                                        nid = Some(parse_nid(&text(v, &nat)?, &at_key(&nat, k))?);
                                    }
                                    // `peer show` state, not configuration.
                                    "state"
                                    | "max_ni_tx_credits"
                                    | "available_tx_credits"
                                    | "min_tx_credits"
                                    | "tx_q_num_of_buf"
                                    | "available_rtr_credits"
                                    | "min_rtr_credits"
                                    | "refcount"
                                    | "statistics"
                                    | "sent_stats"
                                    | "received_stats"
                                    | "dropped_stats"
                                    | "health stats"
                                    | "udsp info" => {}
                                    other => return Err(unknown(&nat, other)),
                                }
                            }
                            nids.push(
                                nid.ok_or_else(|| ConfError::invalid(&nat, "missing 'nid'"))?,
                            );
                        }
                    }
                    "peer state" | "discovery state" | "lock_prim_nid" | "udsp info" => {}
                    other => return Err(unknown(&at, other)),
                }
            }
            let primary =
                primary.ok_or_else(|| ConfError::invalid(&at, "missing 'primary nid'"))?;
            self.peers.push(PeerConf {
                primary,
                multi_rail: mr,
                nids,
            });
        }
        Ok(())
    }

    /// `udsp:` as `lnetctl udsp show` and `export` write it: `idx`, `src`,
    /// `dst`, `rte`, `action: priority:`; the rules are taken in the order
    /// written.
    fn read_udsp(&mut self, v: &Doc) -> Result<(), ConfError> {
        for (i, r) in seq(v, "udsp")?.into_iter().enumerate() {
            let at = at_idx("", "udsp", i);
            let (mut src, mut dst, mut rte, mut prio) = (None, None, None, None);
            for (k, v) in entries(r, &at)? {
                let kat = at_key(&at, k);
                match k.as_str() {
                    "idx" => {
                        uint(v, &kat, u64::from(u32::MAX))?;
                    }
                    "src" => src = Some(text(v, &kat)?),
                    "dst" => dst = Some(text(v, &kat)?),
                    "rte" => rte = Some(text(v, &kat)?),
                    "action" => {
                        for (ak, av) in entries(v, &kat)? {
                            let aat = at_key(&kat, ak);
                            match ak.as_str() {
                                "priority" => {
                                    prio = Some(
                                        u32::try_from(uint(av, &aat, u64::from(u32::MAX))?)
                                            .unwrap_or(0),
                                    );
                                }
                                other => return Err(unknown(&kat, other)),
                            }
                        }
                    }
                    other => return Err(unknown(&at, other)),
                }
            }
            let rule = Rule::parse(src.as_deref(), dst.as_deref(), rte.as_deref(), prio)
                .map_err(|e| ConfError::invalid(&at, e.to_string()))?;
            self.udsp.push(rule);
        }
        Ok(())
    }

    fn read_routes(&mut self, v: &Doc) -> Result<(), ConfError> {
        for (i, r) in seq(v, "route")?.into_iter().enumerate() {
            let at = at_idx("", "route", i);
            let (mut net, mut gw, mut hop, mut prio) = (None, None, None, 0);
            for (k, v) in entries(r, &at)? {
                let kat = at_key(&at, k);
                match k.as_str() {
                    "net" => net = Some(parse_net(&text(v, &kat)?, &kat)?),
                    "gateway" => gw = Some(parse_nid(&text(v, &kat)?, &kat)?),
                    "hop" => {
                        let h = int(v, &kat)?;
                        hop = match h {
                            -1 => None,
                            1..=255 => Some(u32::try_from(h).unwrap_or(1)),
                            _ => {
                                return Err(ConfError::invalid(
                                    &kat,
                                    format!("hop {h} is outside 1..=255 (or -1)"),
                                ));
                            }
                        };
                    }
                    "priority" => {
                        prio = u32::try_from(uint(v, &kat, u64::from(u32::MAX))?).unwrap_or(0);
                    }
                    "state" | "type" | "health_sensitivity" => {}
                    other => return Err(unknown(&at, other)),
                }
            }
            self.routes.push(RouteConf {
                net: net.ok_or_else(|| ConfError::invalid(&at, "missing 'net'"))?,
                gateway: gw.ok_or_else(|| ConfError::invalid(&at, "missing 'gateway'"))?,
                hop,
                priority: prio,
            });
        }
        Ok(())
    }

    fn read_routing(&mut self, v: &Doc, warn: &mut Vec<String>) -> Result<(), ConfError> {
        // `lnetctl export --backup` writes a map, plain `export` a list of
        // `cpt[N]:` pool states and `enable:`.
        for item in seq(v, "routing")? {
            for (k, v) in entries(item, "routing")? {
                match k.as_str() {
                    "enable" => self.routing = Some(bool_val(v, "routing.enable")?),
                    k if k.starts_with("cpt[") => {
                        if !warn.iter().any(|w| w.starts_with("routing: cpt")) {
                            warn.push(format!(
                                "routing: {k} pool states ignored (one partition here; sizes come from buffers:)"
                            ));
                        }
                    }
                    other => return Err(unknown("routing", other)),
                }
            }
        }
        Ok(())
    }

    fn read_buffers(&mut self, v: &Doc) -> Result<(), ConfError> {
        for (k, v) in entries(v, "buffers")? {
            let i = match k.as_str() {
                "tiny" => 0,
                "small" => 1,
                "large" => 2,
                other => return Err(unknown("buffers", other)),
            };
            let at = at_key("buffers", k);
            let n = uint(v, &at, u64::from(u32::MAX))?;
            if n == 0 {
                return Err(ConfError::invalid(&at, "0 buffers"));
            }
            self.buffers[i] = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        Ok(())
    }

    fn read_global(&mut self, v: &Doc, warn: &mut Vec<String>) -> Result<(), ConfError> {
        for (k, v) in entries(v, "global")? {
            let at = at_key("global", k);
            match k.as_str() {
                "accept_port" => {
                    self.accept_port =
                        Some(u16::try_from(uint(v, &at, u64::from(u16::MAX))?).unwrap_or(0));
                }
                "accept_port_bulk" => {
                    self.accept_port_bulk =
                        Some(u16::try_from(uint(v, &at, u64::from(u16::MAX))?).unwrap_or(0));
                }
                "accept" => {
                    self.accept = Some(match text(v, &at)?.as_str() {
                        "secure" => AcceptPolicy::Secure,
                        "all" => AcceptPolicy::All,
                        "none" => AcceptPolicy::None,
                        other => {
                            return Err(ConfError::invalid(
                                &at,
                                format!("'{other}': expected secure, all or none"),
                            ));
                        }
                    });
                }
                "max_intf" => {
                    let val = int(v, &at)?;
                    check_global("max_interfaces", val, &at)?;
                    self.global.insert("max_interfaces".into(), val);
                }
                name => {
                    let Some((_, default, effect)) = GLOBALS.iter().find(|g| g.0 == name) else {
                        return Err(unknown("global", name));
                    };
                    let val = int(v, &at)?;
                    check_global(name, val, &at)?;
                    if !effect
                        && val != *default
                        && let Some(why) = no_effect_reason(name)
                    {
                        warn.push(format!(
                            "global.{name} = {val}: recorded, but has no effect on this node ({why})"
                        ));
                    }
                    self.global.insert(name.to_owned(), val);
                }
            }
        }
        Ok(())
    }

    /// The node's configuration: NIs listen on `ip:accept_port`.
    #[must_use]
    pub fn to_lnet_config(&self) -> LnetConfig {
        let nids: Vec<Nid> = self.nis.iter().map(|n| n.nid).collect();
        let mut cfg = LnetConfig::new(&nids);
        cfg.node.nis = self.nis.iter().map(NiConf::to_ni_config).collect();
        cfg.accept_port = self.accept_port.unwrap_or(DEFAULT_ACCEPT_PORT);
        cfg.accept_port_bulk = self.accept_port_bulk;
        if let Some(a) = self.accept {
            cfg.accept = a;
        }
        if let Some(r) = self.routing {
            cfg.node.routing = r;
        }
        let mut udsp = Udsp::default();
        for r in &self.udsp {
            // A rule met twice in one file counts once.
            let _ = udsp.add(r.clone(), None);
        }
        cfg.node.udsp = udsp;
        let d = RouterBufferConfig::default();
        cfg.node.router_buffers = RouterBufferConfig {
            tiny: self.buffers[0].unwrap_or(d.tiny),
            small: self.buffers[1].unwrap_or(d.small),
            large: self.buffers[2].unwrap_or(d.large),
        };
        if let Some(v) = self.global.get("discovery") {
            cfg.node.discovery = *v != 0;
        }
        if let Some(v) = self.global.get("retry_count") {
            cfg.node.retry_count = u32::try_from(*v).unwrap_or(0);
        }
        if let Some(v) = self.global.get("transaction_timeout") {
            cfg.node.transaction_timeout = Duration::from_secs(u64::try_from(*v).unwrap_or(1));
        }
        if let Some(v) = self.global.get("health_sensitivity") {
            cfg.node.health_sensitivity = u32::try_from(*v).unwrap_or(0);
            // Health off means no resends: Lustre's `sensitivity_set`
            // sets the retry count to 0 with it.
            if cfg.node.health_sensitivity == 0 {
                cfg.node.retry_count = 0;
            }
        }
        let secs = |v: &i64| Duration::from_secs(u64::try_from(*v).unwrap_or(0));
        if let Some(v) = self.global.get("drop_asym_route") {
            cfg.node.drop_asym_route = *v != 0;
        }
        if let Some(v) = self.global.get("response_tracking") {
            cfg.node.response_tracking = u32::try_from(*v)
                .ok()
                .and_then(ResponseTracking::from_level)
                .unwrap_or_default();
        }
        if let Some(v) = self.global.get("recovery_limit") {
            cfg.node.recovery_limit = (*v > 0).then(|| secs(v));
        }
        if let Some(v) = self.global.get("max_recovery_ping_interval") {
            cfg.node.max_recovery_ping_interval = secs(v);
        }
        if let Some(v) = self.global.get("alive_router_check_interval") {
            cfg.node.router_check_interval = secs(v);
        }
        if let Some(v) = self.global.get("router_ping_timeout") {
            cfg.node.router_ping_timeout = secs(v);
        }
        if let Some(v) = self.global.get("avoid_asym_router_failure") {
            cfg.node.avoid_asym_router_failure = *v != 0;
        }
        if let Some(v) = self.global.get("check_routers_before_use") {
            cfg.node.check_routers_before_use = *v != 0;
        }
        if let Some(v) = self.global.get("max_interfaces") {
            cfg.node.max_interfaces = u32::try_from(*v).unwrap_or(u32::MAX);
        }
        cfg
    }

    /// The configuration of a running node: its NIs and tunables, the
    /// DLC-configured peers (discovered ones are found again by discovery),
    /// routes, routing, buffers and global settings (`extra` holds the
    /// recorded values of settings without effect, and `accept`).
    #[must_use]
    pub fn of_node(
        node: &Node,
        conns_per_peer: u32,
        accept_port: u16,
        accept: AcceptPolicy,
        extra: &BTreeMap<String, i64>,
    ) -> Self {
        let cfg = node.config();
        let nis = cfg
            .nis
            .iter()
            .map(|n| NiConf {
                nid: n.nid,
                credits: n.credits,
                peer_credits: n.peer_credits,
                peer_buffer_credits: n.peer_buffer_credits,
                conns_per_peer: Some(if n.conns_per_peer == 0 {
                    conns_per_peer
                } else {
                    n.conns_per_peer
                }),
                tos: (n.tos >= 0).then_some(n.tos),
                peer_timeout: n.peer_timeout,
                interface: None,
            })
            .collect();
        let peers = node
            .discovery()
            .peers()
            .peers()
            .filter(|p| p.is_configured())
            .map(|p| PeerConf {
                primary: p.primary_nid(),
                multi_rail: p.is_multi_rail(),
                nids: p.nids().collect(),
            })
            .collect();
        let routes = node
            .routes()
            .routes()
            .map(|r| RouteConf {
                net: r.net(),
                gateway: r.gateway(),
                hop: r.hops().map(u32::from),
                priority: r.priority(),
            })
            .collect();
        let rb = cfg.router_buffers;
        let mut global = extra.clone();
        global.insert("discovery".into(), i64::from(cfg.discovery));
        global.insert("retry_count".into(), i64::from(cfg.retry_count));
        global.insert(
            "transaction_timeout".into(),
            i64::try_from(cfg.transaction_timeout.as_secs()).unwrap_or(i64::MAX),
        );
        global.insert(
            "health_sensitivity".into(),
            i64::from(cfg.health_sensitivity),
        );
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        global.insert("drop_asym_route".into(), i64::from(cfg.drop_asym_route));
        global.insert(
            "response_tracking".into(),
            i64::from(cfg.response_tracking.level()),
        );
        global.insert("recovery_limit".into(), cfg.recovery_limit.map_or(0, secs));
        global.insert(
            "max_recovery_ping_interval".into(),
            secs(cfg.max_recovery_ping_interval),
        );
        global.insert(
            "alive_router_check_interval".into(),
            secs(cfg.router_check_interval),
        );
        global.insert("router_ping_timeout".into(), secs(cfg.router_ping_timeout));
        global.insert(
            "avoid_asym_router_failure".into(),
            i64::from(cfg.avoid_asym_router_failure),
        );
        global.insert(
            "check_routers_before_use".into(),
            i64::from(cfg.check_routers_before_use),
        );
        global.insert("max_interfaces".into(), i64::from(cfg.max_interfaces));
        for (name, default, _) in GLOBALS {
            global.entry((*name).to_owned()).or_insert(*default);
        }
        Self {
            nis,
            peers,
            routes,
            // What the node is becoming: a stop under way exports as off,
            // a start as on.
            routing: Some(matches!(
                node.routing_state(),
                RoutingState::Enabled | RoutingState::Starting
            )),
            buffers: [Some(rb.tiny), Some(rb.small), Some(rb.large)],
            global,
            accept_port: Some(accept_port),
            // The daemon knows it (`Daemon::export`).
            accept_port_bulk: None,
            accept: Some(accept),
            udsp: node.udsp().rules().to_vec(),
        }
    }

    /// The `lnetctl export --backup` document.
    #[must_use]
    pub fn to_doc(&self) -> Doc {
        let mut doc = Doc::map();
        let mut nets: Vec<(Net, Vec<Doc>)> = Vec::new();
        for n in &self.nis {
            let mut ni = Doc::map().with("nid", n.nid.to_string());
            if let Some(i) = &n.interface {
                ni.push("interfaces", Doc::map().with("0", i.as_str()));
            }
            ni.push(
                "tunables",
                Doc::map()
                    .with("peer_timeout", n.peer_timeout)
                    .with("peer_credits", n.peer_credits)
                    .with("peer_buffer_credits", n.peer_buffer_credits)
                    .with("credits", n.credits),
            );
            let mut lnd = Doc::map();
            if let Some(c) = n.conns_per_peer {
                lnd.push("conns_per_peer", c);
            }
            if let Some(t) = n.tos {
                lnd.push("tos", t);
            }
            ni.push(
                "lnd tunables",
                if lnd == Doc::map() { Doc::Null } else { lnd },
            );
            // Adjacent NIs of one net share an entry; the order of the NIs
            // (the first is the primary NID) is kept whatever it is.
            match nets.last_mut() {
                Some((net, v)) if *net == n.nid.net() => v.push(ni),
                _ => nets.push((n.nid.net(), vec![ni])),
            }
        }
        if !nets.is_empty() {
            doc.push(
                "net",
                nets.into_iter()
                    .map(|(net, nis)| {
                        Doc::map()
                            .with("net type", net.to_string())
                            .with("local NI(s)", nis)
                    })
                    .collect::<Vec<_>>(),
            );
        }
        if !self.peers.is_empty() {
            doc.push("peer", self.peers.iter().map(peer_doc).collect::<Vec<_>>());
        }
        if !self.routes.is_empty() {
            doc.push(
                "route",
                self.routes
                    .iter()
                    .map(|r| {
                        Doc::map()
                            .with("net", r.net.to_string())
                            .with("gateway", r.gateway.to_string())
                            .with("hop", r.hop.map_or(-1, i64::from))
                            .with("priority", r.priority)
                    })
                    .collect::<Vec<_>>(),
            );
        }
        if !self.udsp.is_empty() {
            doc.push(
                "udsp",
                self.udsp
                    .iter()
                    .enumerate()
                    .map(|(i, r)| udsp_doc(i, r))
                    .collect::<Vec<_>>(),
            );
        }
        if let Some(r) = self.routing {
            doc.push("routing", Doc::map().with("enable", i64::from(r)));
        }
        if self.buffers.iter().any(Option::is_some) {
            let mut b = Doc::map();
            for (name, v) in ["tiny", "small", "large"].iter().zip(self.buffers) {
                if let Some(v) = v {
                    b.push(name, v);
                }
            }
            doc.push("buffers", b);
        }
        let mut g = Doc::map();
        for (name, _, _) in GLOBALS {
            if let Some(v) = self.global.get(*name) {
                g.push(name, *v);
            }
        }
        if let Some(p) = self.accept_port {
            g.push("accept_port", p);
        }
        if let Some(p) = self.accept_port_bulk {
            g.push("accept_port_bulk", p);
        }
        if let Some(a) = self.accept {
            g.push("accept", accept_name(a));
        }
        if !matches!(&g, Doc::Map(m) if m.is_empty()) {
            doc.push("global", g);
        }
        doc
    }

    /// [`NodeConf::to_doc`] as YAML.
    #[must_use]
    pub fn to_yaml(&self) -> String {
        self.to_doc().to_yaml()
    }
}

/// `secure`, `all` or `none`.
#[must_use]
pub const fn accept_name(a: AcceptPolicy) -> &'static str {
    match a {
        AcceptPolicy::Secure => "secure",
        AcceptPolicy::All => "all",
        AcceptPolicy::None => "none",
    }
}

fn peer_doc(p: &PeerConf) -> Doc {
    Doc::map()
        .with("primary nid", p.primary.to_string())
        .with("Multi-Rail", Doc::Bool(p.multi_rail))
        .with(
            "peer ni",
            p.nids
                .iter()
                .map(|n| Doc::map().with("nid", n.to_string()))
                .collect::<Vec<_>>(),
        )
}

/// The rules `lnetctl set` applies to a global value.
///
/// # Errors
/// Out-of-range values.
pub fn check_global(name: &str, val: i64, at: &str) -> Result<(), ConfError> {
    let ok = match name {
        "discovery"
        | "drop_asym_route"
        | "avoid_asym_router_failure"
        | "check_routers_before_use" => (0..=1).contains(&val),
        "transaction_timeout" | "recovery_interval" | "router_ping_timeout" => {
            (1..=i64::from(u32::MAX)).contains(&val)
        }
        "response_tracking" => (0..=3).contains(&val),
        "router_sensitivity" => (0..=100).contains(&val),
        "health_sensitivity" => (0..=1000).contains(&val),
        "max_recovery_ping_interval" => (1..=i64::from(u32::MAX)).contains(&val),
        "max_interfaces" => (16..=i64::from(u32::MAX)).contains(&val),
        "recovery_limit" | "alive_router_check_interval" => {
            (0..=i64::from(u32::MAX)).contains(&val)
        }
        _ => val >= 0,
    };
    if ok {
        Ok(())
    } else {
        Err(ConfError::invalid(
            at,
            format!("{val} is out of range for {name}"),
        ))
    }
}

/// The texts of a list written as a map of indexes (`0: eth0`, lnetctl's
/// form), a sequence, or one scalar.
fn texts(v: &Doc) -> Vec<String> {
    match v {
        Doc::Map(m) => m.iter().filter_map(|(_, v)| v.as_text()).collect(),
        Doc::Seq(s) => s.iter().filter_map(Doc::as_text).collect(),
        other => other.as_text().into_iter().collect(),
    }
}

/// An `ip2nets` IP range (`192.168.*.[1-9/2,20]`) as an expression
/// matching NIDs on `net`: four dotted parts, each `*`, a number or a
/// bracketed list of `n`, `n-m`, `n-m/step`, numbers 0 to 255 (as
/// `cfs_ip_addr_parse` reads them).
pub(crate) fn ipv4_range(r: &str, net: Net) -> Option<colibri_lnet::udsp::Expr> {
    let parts = split_outside_brackets(r).filter(|p| !p.is_empty()).count();
    let byte_sized = r
        .split(|c: char| !c.is_ascii_digit())
        .all(|n| n.is_empty() || n.parse::<u8>().is_ok());
    if parts != 4 || !byte_sized {
        return None;
    }
    colibri_lnet::udsp::Expr::parse(&format!("{r}@{net}"))
        .ok()
        .filter(|e| !e.is_net())
}

/// One `ip-range` of an `ip2nets` rule.
#[derive(Clone, Debug)]
pub(crate) enum IpRange {
    /// An IPv4 pattern ([`ipv4_range`]) over the rule's net.
    V4(colibri_lnet::udsp::Expr),
    /// An IPv6 address with a prefix length (`fd00::5`, `fd00::/64`; 128
    /// when none is given), matched against the interfaces' IPv6
    /// addresses, as Lustre 2.16's rules take them. The NI still takes the
    /// interface's IPv4 address: NIDs here are IPv4.
    V6 {
        /// The address.
        addr: std::net::Ipv6Addr,
        /// How many leading bits must match, 0 to 128.
        prefix: u8,
    },
}

impl IpRange {
    /// An IPv4 pattern on `net` or an IPv6 address or prefix.
    pub(crate) fn parse(r: &str, net: Net) -> Option<Self> {
        if let Some(e) = ipv4_range(r, net) {
            return Some(Self::V4(e));
        }
        let (addr, prefix) = match r.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().ok().filter(|p| *p <= 128)?),
            None => (r, 128),
        };
        Some(Self::V6 {
            addr: addr.parse().ok()?,
            prefix,
        })
    }

    /// Whether the interface `name`, holding `ip` and the IPv6 addresses
    /// of `v6` (all interfaces'), is in this range on `net`.
    fn holds(
        &self,
        net: Net,
        name: &str,
        ip: std::net::Ipv4Addr,
        v6: &[(String, std::net::Ipv6Addr)],
    ) -> bool {
        match self {
            Self::V4(e) => e.matches(net.nid_ipv4(ip)),
            Self::V6 { addr, prefix } => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*prefix)).unwrap_or(0);
                v6.iter()
                    .any(|(n, a)| n == name && u128::from(*a) & mask == u128::from(*addr) & mask)
            }
        }
    }
}

/// The dotted parts of `r`, dots inside brackets not splitting.
fn split_outside_brackets(r: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0_i32;
    r.split(move |c: char| {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        c == '.' && depth == 0
    })
}

/// The interfaces an `ip2nets` rule chose, `(name, IPv4 address)` in
/// order, or why it matches none.
type Chosen = Result<Vec<(String, std::net::Ipv4Addr)>, String>;

/// One `ip2nets` rule: a net, the interfaces it names and the IPv4
/// ranges their addresses must be in, from a file's `ip2nets:` section
/// ([`Ip2netsRule::from_doc`]) or from the module parameter's string
/// form that `net add --ip2net` takes ([`Ip2netsRule::parse_list`]). A
/// range is an IPv4 address whose parts may be `*`, a number or bracketed
/// lists of `n`, `n-m` and `n-m/step` (`192.168.*.[1-9/2,20]`).
#[derive(Clone, Debug)]
pub(crate) struct Ip2netsRule {
    /// Where it was read, for messages.
    at: String,
    net: Net,
    names: Vec<String>,
    ranges: Vec<IpRange>,
    /// The tunables of the NIs it makes (`tunables:` and `lnd
    /// tunables:` of the rule, as liblnetconfig reads them; defaults
    /// otherwise).
    template: NiConf,
}

impl Ip2netsRule {
    fn new(at: &str, net: Net, names: Vec<String>, ranges: &[String]) -> Result<Self, ConfError> {
        check_net_type(net, at)?;
        let ranges = ranges
            .iter()
            .map(|r| {
                IpRange::parse(r, net).ok_or_else(|| {
                    ConfError::invalid(
                        &at_key(at, "ip-range"),
                        format!("'{r}' is not an IPv4 range or an IPv6 address"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            at: at.to_owned(),
            net,
            names,
            ranges,
            template: NiConf::new(Nid::ANY),
        })
    }

    /// A rule of a file's `ip2nets:` section: `net-spec` (required),
    /// `interfaces` and `ip-range` (maps of indexes, as lnetctl writes
    /// them, or sequences).
    ///
    /// # Errors
    /// No `net-spec`, an unknown key, a net that is not tcp, a range that
    /// does not parse.
    fn from_doc(rule: &Doc, at: &str, warn: &mut Vec<String>) -> Result<Self, ConfError> {
        let mut net = None;
        let mut names: Vec<String> = Vec::new();
        let mut ranges: Vec<String> = Vec::new();
        let mut template = NiConf::new(Nid::ANY);
        for (k, v) in entries(rule, at)? {
            let kat = at_key(at, k);
            match k.as_str() {
                "net-spec" => net = Some(parse_net(&text(v, &kat)?, &kat)?),
                "interfaces" => names = texts(v),
                "ip-range" => ranges = texts(v),
                "tunables" => read_tunables(&mut template, v, &kat)?,
                "lnd tunables" => read_lnd_tunables(&mut template, v, &kat, warn)?,
                "seq_no" => {}
                "CPT" | "cpt" => warn.push(format!(
                    "{kat}: CPTs have no meaning here (one partition), ignored"
                )),
                other => return Err(unknown(at, other)),
            }
        }
        let net = net.ok_or_else(|| ConfError::invalid(at, "missing 'net-spec'"))?;
        check_credits(&template, at)?;
        let mut rule = Self::new(at, net, names, &ranges)?;
        rule.template = template;
        Ok(rule)
    }

    /// Rules in the string form of LNet's `ip2nets` module parameter,
    /// which `lnetctl net add --ip2net` takes: rules separated by `;`,
    /// each a net with its interfaces in parentheses, if any, then
    /// ranges separated by blanks (`tcp(eth0,eth1) 10.0.0.* 10.1.*.*;
    /// tcp1 192.168.1.[1-9]`).
    ///
    /// # Errors
    /// A rule without a net, unbalanced parentheses, a net that is not
    /// tcp, a range that does not parse.
    pub(crate) fn parse_list(s: &str) -> Result<Vec<Self>, ConfError> {
        let mut out = Vec::new();
        for (i, rule) in s
            .split(';')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .enumerate()
        {
            let at = format!("ip2net rule {} ('{rule}')", i + 1);
            let opens = rule.matches('(').count();
            if opens > 1 || opens != rule.matches(')').count() {
                return Err(ConfError::invalid(&at, "unbalanced parentheses"));
            }
            let (spec, rest) = match rule.find(')') {
                Some(close) if rule.contains('(') => rule.split_at(close + 1),
                _ => rule.split_at(rule.find(char::is_whitespace).unwrap_or(rule.len())),
            };
            let (net, names) = match spec.split_once('(') {
                Some((net, list)) => {
                    let list = list
                        .strip_suffix(')')
                        .ok_or_else(|| ConfError::invalid(&at, "unbalanced parentheses"))?;
                    let names = list
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect();
                    (net, names)
                }
                None => (spec, Vec::new()),
            };
            let net = parse_net(net.trim(), &at)?;
            let ranges: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            out.push(Self::new(&at, net, names, &ranges)?);
        }
        if out.is_empty() {
            return Err(ConfError::invalid("ip2net", "no rule"));
        }
        Ok(out)
    }

    /// The interfaces this rule chooses among `ifaces`, as liblnetconfig's
    /// `lustre_lnet_match_ip_to_intf` decides:
    ///
    /// * neither interfaces nor ranges: the first interface that is up
    ///   and not `lo`;
    /// * ranges only: every interface that is up with an address in one
    ///   of them;
    /// * interfaces: each of them, which must exist, be up and (with
    ///   ranges) have an address in one: one that does not makes the
    ///   whole rule match nothing.
    fn choose(
        &self,
        ifaces: &[crate::sock::link::IfAddr],
        v6: &[(String, std::net::Ipv6Addr)],
    ) -> Chosen {
        let in_range = |name: &str, ip: std::net::Ipv4Addr| {
            self.ranges.is_empty() || self.ranges.iter().any(|r| r.holds(self.net, name, ip, v6))
        };
        if self.names.is_empty() && self.ranges.is_empty() {
            return ifaces
                .iter()
                .find(|i| i.up && i.name != "lo")
                .map(|i| vec![(i.name.clone(), i.addr)])
                .ok_or_else(|| "no interface is up".to_owned());
        }
        if self.names.is_empty() {
            let mut out: Vec<(String, std::net::Ipv4Addr)> = Vec::new();
            for i in ifaces.iter().filter(|i| i.up && in_range(&i.name, i.addr)) {
                if !out.iter().any(|(n, _)| *n == i.name) {
                    out.push((i.name.clone(), i.addr));
                }
            }
            return if out.is_empty() {
                Err("the IP ranges match no interface that is up".to_owned())
            } else {
                Ok(out)
            };
        }
        self.names
            .iter()
            .map(|name| {
                let mine: Vec<_> = ifaces.iter().filter(|i| i.name == *name).collect();
                if mine.is_empty() {
                    return Err(format!("no interface {name} with an IPv4 address"));
                }
                if !mine.iter().any(|i| i.up) {
                    return Err(format!("interface {name} is not up"));
                }
                mine.iter()
                    .find(|i| i.up && in_range(&i.name, i.addr))
                    .map(|i| (name.clone(), i.addr))
                    .ok_or_else(|| format!("interface {name} has no address in the IP ranges"))
            })
            .collect()
    }
}

/// The `networks` module parameter: each net with its interfaces, as
/// rules without ranges (every interface named must be up; none named,
/// the first up that is not `lo`).
fn parse_networks(s: &str) -> Result<Vec<Ip2netsRule>, ConfError> {
    // Items end at commas or blanks outside parentheses.
    let mut items: Vec<String> = Vec::new();
    let (mut cur, mut depth) = (String::new(), 0_i32);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(ConfError::invalid(
                "networks",
                format!("unbalanced parentheses in '{s}'"),
            ));
        }
        if depth == 0 && (c == ',' || c.is_whitespace()) {
            if !cur.trim().is_empty() {
                items.push(std::mem::take(&mut cur));
            }
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if depth != 0 {
        return Err(ConfError::invalid(
            "networks",
            format!("unbalanced parentheses in '{s}'"),
        ));
    }
    if !cur.trim().is_empty() {
        items.push(cur);
    }
    if items.is_empty() {
        return Err(ConfError::invalid("networks", "no net"));
    }
    items
        .iter()
        .map(|item| {
            let at = format!("networks item '{item}'");
            let (net, names) = match item.split_once('(') {
                Some((net, list)) => (
                    net,
                    list.trim_end_matches(')')
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect(),
                ),
                None => (item.as_str(), Vec::new()),
            };
            Ip2netsRule::new(&at, parse_net(net.trim(), &at)?, names, &[])
        })
        .collect()
}

/// The `ip2nets` module parameter as the kernel reads it
/// (`lnet_match_networks`): rules separated by `;` or new lines, each a
/// list of nets in the `networks` form (`tcp(eth0),tcp1`) then IP ranges.
/// A rule matches when an address of an interface that is up is in one
/// of its ranges (a rule without ranges never does), and the nets of
/// every rule that matches are configured, in order: unlike lnetctl's
/// `ip2nets:` rules, two rules may each add NIs on one net (sanity-lnet
/// 208). The nets are returned as `networks` rules. Unlike the kernel,
/// which enumerates no loopback interface, `lo`'s addresses count here,
/// as an NI may be on `lo` (a machine with nothing but loopback can run
/// a node).
///
/// # Errors
/// A rule that does not parse, a net twice in one rule, no rule matching.
fn kernel_ip2nets(
    s: &str,
    ifaces: &[crate::sock::link::IfAddr],
    v6: &[(String, std::net::Ipv6Addr)],
) -> Result<Vec<Ip2netsRule>, ConfError> {
    let mut out = Vec::new();
    let mut matched = false;
    for (i, rule) in s
        .split([';', '\n'])
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .enumerate()
    {
        let at = format!("ip2nets rule {} ('{rule}')", i + 1);
        // The nets end at the first blank outside parentheses.
        let mut depth = 0_i32;
        let end = rule
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0 && c.is_whitespace()
            })
            .map_or(rule.len(), |(j, _)| j);
        let (spec, rest) = rule.split_at(end);
        let nets = parse_networks(spec).map_err(|e| ConfError::invalid(&at, e.to_string()))?;
        for (j, n) in nets.iter().enumerate() {
            if nets[..j].iter().any(|m| m.net == n.net) {
                return Err(ConfError::invalid(
                    &at,
                    format!("{} twice in one rule", n.net),
                ));
            }
        }
        let net = nets[0].net;
        let ranges = rest
            .split_whitespace()
            .map(|r| {
                IpRange::parse(r, net).ok_or_else(|| {
                    ConfError::invalid(
                        &at,
                        format!("'{r}' is not an IPv4 range or an IPv6 address"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let hit = ifaces
            .iter()
            .filter(|i| i.up)
            .any(|i| ranges.iter().any(|r| r.holds(net, &i.name, i.addr, v6)));
        if hit {
            matched = true;
            out.extend(nets);
        }
    }
    if !matched {
        return Err(ConfError::invalid(
            "ip2nets",
            "the rules match no address of an interface that is up",
        ));
    }
    Ok(out)
}

/// The `routes` module parameter: `NET [HOPS] GATEWAY[:PRIORITY] ...`,
/// routes separated by `;`, a gateway a NID or a NID range
/// (`10.0.0.[1-3]@tcp`).
fn parse_routes(s: &str) -> Result<Vec<RouteConf>, ConfError> {
    let mut out = Vec::new();
    for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let at = format!("routes entry '{entry}'");
        let mut words = entry.split_whitespace();
        let net = parse_net(words.next().unwrap_or_default(), &at)?;
        let mut words = words.peekable();
        let hop = match words.peek() {
            Some(w) if w.bytes().all(|b| b.is_ascii_digit()) => {
                let h: u32 = w
                    .parse()
                    .ok()
                    .filter(|h| (1..=255).contains(h))
                    .ok_or_else(|| {
                        ConfError::invalid(&at, format!("hop count {w} is not 1 to 255"))
                    })?;
                words.next();
                Some(h)
            }
            _ => None,
        };
        let mut any = false;
        for gw in words {
            let (list, priority) = match gw.rsplit_once(':') {
                Some((l, p)) => (
                    l,
                    p.parse::<u32>().map_err(|_| {
                        ConfError::invalid(&at, format!("priority '{p}' is not a number"))
                    })?,
                ),
                None => (gw, 0),
            };
            let gateways = colibri_lnet::nidrange::expand_nid_list(list)
                .map_err(|e| ConfError::invalid(&at, e.to_string()))?;
            for gateway in gateways {
                any = true;
                out.push(RouteConf {
                    net,
                    gateway,
                    hop,
                    priority,
                });
            }
        }
        if !any {
            return Err(ConfError::invalid(&at, "no gateway"));
        }
    }
    Ok(out)
}

/// The NIs `rules` make on this machine, none of them in `have`: each
/// rule that matches gives an NI on its net for every interface it
/// chose (NID: the interface's address on the net), unless an earlier
/// rule already configured that net (sanity-lnet 151, 152); a rule that
/// matches nothing is skipped with a warning; none matching at all is an
/// error, as lnetctl's import fails (155).
///
/// # Errors
/// The interface table cannot be read, or no rule matches.
pub(crate) fn resolve_ip2nets(
    rules: &[Ip2netsRule],
    have: &[Nid],
    warn: &mut Vec<String>,
) -> Result<Vec<NiConf>, ConfError> {
    let ifaces = crate::sock::link::read_ifaddrs().map_err(|e| {
        ConfError::invalid(
            "ip2nets",
            format!("cannot read this machine's interfaces: {e}"),
        )
    })?;
    // An IPv6 table that cannot be read (no IPv6 in this kernel) leaves
    // IPv6 ranges matching nothing.
    let v6 = crate::sock::link::read_ipv6_addrs().unwrap_or_default();
    resolve_ip2nets_in(rules, &ifaces, &v6, have, warn)
}

fn resolve_ip2nets_in(
    rules: &[Ip2netsRule],
    ifaces: &[crate::sock::link::IfAddr],
    v6: &[(String, std::net::Ipv6Addr)],
    have: &[Nid],
    warn: &mut Vec<String>,
) -> Result<Vec<NiConf>, ConfError> {
    let mut done: Vec<Net> = Vec::new();
    let mut last_miss = None;
    let mut out: Vec<NiConf> = Vec::new();
    for rule in rules {
        let at = &rule.at;
        if done.contains(&rule.net) {
            warn.push(format!(
                "{at}: {} was configured by an earlier rule; this one is skipped",
                rule.net
            ));
            continue;
        }
        let chosen = match rule.choose(ifaces, v6) {
            Ok(c) => c,
            Err(why) => {
                warn.push(format!("{at}: no match: {why}"));
                last_miss = Some(why);
                continue;
            }
        };
        done.push(rule.net);
        for (name, ip) in chosen {
            let nid = rule.net.nid_ipv4(ip);
            if have.contains(&nid) || out.iter().any(|x| x.nid == nid) {
                warn.push(format!("{at}: {nid} is configured already"));
                continue;
            }
            let mut n = rule.template.clone();
            n.nid = nid;
            n.interface = Some(name);
            out.push(n);
        }
    }
    if done.is_empty() && !rules.is_empty() {
        return Err(ConfError::invalid(
            "ip2nets",
            format!(
                "no rule matches an interface of this machine ({})",
                last_miss.unwrap_or_default()
            ),
        ));
    }
    Ok(out)
}

/// `tunables:` (`credits`, `peer_credits`, `peer_buffer_credits`,
/// `peer_timeout`) into `n`.
fn read_tunables(n: &mut NiConf, v: &Doc, kat: &str) -> Result<(), ConfError> {
    for (tk, tv) in entries(v, kat)? {
        let tat = at_key(kat, tk);
        match tk.as_str() {
            "credits" => {
                n.credits = u32::try_from(uint(tv, &tat, 1 << 20)?).unwrap_or(256);
            }
            "peer_credits" => {
                n.peer_credits = u32::try_from(uint(tv, &tat, 1 << 20)?).unwrap_or(8);
            }
            "peer_buffer_credits" => {
                n.peer_buffer_credits = u32::try_from(uint(tv, &tat, 1 << 20)?).unwrap_or(0);
            }
            "peer_timeout" => {
                // -1: the LND's default, as Lustre's
                // `lct_peer_timeout`.
                n.peer_timeout = match int(tv, &tat)? {
                    -1 => DEFAULT_PEER_TIMEOUT,
                    t => u32::try_from(t).map_err(|_| {
                        ConfError::invalid(
                            &tat,
                            format!("{t} is not a peer timeout (-1, 0 or seconds)"),
                        )
                    })?,
                };
            }
            other => return Err(unknown(kat, other)),
        }
    }
    Ok(())
}

/// `lnd tunables:` (`conns_per_peer`, `tos`) into `n`.
fn read_lnd_tunables(
    n: &mut NiConf,
    v: &Doc,
    kat: &str,
    warn: &mut Vec<String>,
) -> Result<(), ConfError> {
    for (tk, tv) in entries(v, kat)? {
        let tat = at_key(kat, tk);
        match tk.as_str() {
            "conns_per_peer" => {
                let c = uint(tv, &tat, 127)?;
                n.conns_per_peer = Some(u32::try_from(c).unwrap_or(1).max(1));
            }
            "tos" => {
                let t = int(tv, &tat)?;
                if !(-1..=255).contains(&t) {
                    return Err(ConfError::invalid(
                        &tat,
                        format!("invalid value {t} (-1 to 255)"),
                    ));
                }
                n.tos = i32::try_from(t).ok().filter(|t| *t >= 0);
            }
            "lnd_timeout" | "timeout" => {
                warn.push(format!(
                    "{tat}: not settable per NI here (`net set --net NET --lnd-timeout`), ignored"
                ));
            }
            other => return Err(unknown(kat, other)),
        }
    }
    Ok(())
}

/// Credits an NI cannot do without.
fn check_credits(n: &NiConf, at: &str) -> Result<(), ConfError> {
    if n.credits == 0 || n.peer_credits == 0 {
        return Err(ConfError::invalid(
            &at_key(at, "tunables"),
            "credits and peer_credits must be at least 1",
        ));
    }
    Ok(())
}

/// The tunables a `net` entry gives its NIs (`tunables:`, `lnd
/// tunables:` beside `local NI(s)`), with where they were read.
#[derive(Default)]
struct NetDefaults<'a> {
    tunables: Option<(&'a Doc, String)>,
    lnd: Option<(&'a Doc, String)>,
}

/// One entry of `local NI(s)`: one NI, or, given by `interfaces` alone,
/// one NI on each interface named (sanity-lnet 450), the tunables the
/// same for all.
fn read_ni(
    ni: &Doc,
    at: &str,
    net_type: Net,
    defaults: &NetDefaults<'_>,
    warn: &mut Vec<String>,
) -> Result<Vec<NiConf>, ConfError> {
    let mut n = NiConf::new(Nid::ANY);
    let mut have_nid = false;
    let mut interfaces: Option<Vec<String>> = None;
    // The net's tunables where the NI gives none.
    if let Some((v, kat)) = &defaults.tunables
        && ni.get("tunables").is_none()
    {
        read_tunables(&mut n, v, kat)?;
    }
    if let Some((v, kat)) = &defaults.lnd
        && ni.get("lnd tunables").is_none()
    {
        read_lnd_tunables(&mut n, v, kat, warn)?;
    }
    for (k, v) in entries(ni, at)? {
        let kat = at_key(at, k);
        match k.as_str() {
            "nid" => {
                n.nid = parse_nid(&text(v, &kat)?, &kat)?;
                have_nid = true;
            }
            "interfaces" => interfaces = Some(texts(v)),
            "CPT" | "dev cpt" | "cpt" => {
                warn.push(format!(
                    "{kat}: CPTs have no meaning here (one partition), ignored"
                ));
            }
            "tunables" => read_tunables(&mut n, v, &kat)?,
            "lnd tunables" => read_lnd_tunables(&mut n, v, &kat, warn)?,
            // `net show` state, not configuration.
            "status" | "statistics" | "sent_stats" | "received_stats" | "dropped_stats"
            | "health stats" | "ni_state" => {}
            other => return Err(unknown(at, other)),
        }
    }
    check_credits(&n, at)?;
    let names = interfaces.unwrap_or_default();
    if !have_nid {
        // The NID of each is its interface's IP on this net, as socklnd
        // makes it.
        if names.is_empty() {
            return Err(ConfError::invalid(
                at,
                format!("missing 'nid' or 'interfaces' (e.g. nid: 192.168.1.2@{net_type})"),
            ));
        }
        let ifaces = crate::sock::link::read_ifaddrs().map_err(|e| {
            ConfError::invalid(at, format!("cannot read this machine's interfaces: {e}"))
        })?;
        return names
            .iter()
            .map(|name| {
                let ip = crate::sock::link::interface_ip(name, &ifaces)
                    .map_err(|m| ConfError::invalid(&at_key(at, "interfaces"), m))?;
                let mut one = n.clone();
                one.nid = net_type.nid_ipv4(ip);
                one.interface = Some(name.clone());
                Ok(one)
            })
            .collect();
    } else if let Some(name) = names.first() {
        if n.nid.net() != net_type {
            return Err(ConfError::invalid(
                &at_key(at, "nid"),
                format!("{} is not on net {net_type}", n.nid),
            ));
        }
        let ip = std::net::Ipv4Addr::from(n.nid.addr());
        let holds = crate::sock::link::read_ifaddrs().is_ok_and(|ifaces| {
            crate::sock::link::interface_of(ip, &ifaces) == Some(name.as_str())
        });
        if holds && names.len() == 1 {
            n.interface = Some(name.clone());
        } else {
            warn.push(format!(
                "{at}.interfaces: {} ignored: {} listens on the address of its NID",
                names.join(","),
                n.nid
            ));
        }
    }
    if n.nid.net() != net_type {
        return Err(ConfError::invalid(
            &at_key(at, "nid"),
            format!("{} is not on net {net_type}", n.nid),
        ));
    }
    Ok(vec![n])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a real `lnetctl export` writes for a tcp node (Lustre 2.15
    /// layout, written by hand from `liblnetconfig.c`).
    pub(crate) const LNETCTL_EXPORT: &str = "net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          tunables:
              peer_timeout: 0
              peer_credits: 0
              peer_buffer_credits: 0
              credits: 0
          lnd tunables:
          dev cpt: 0
          CPT: \"[0]\"
    - net type: tcp
      local NI(s):
        - nid: 192.168.1.2@tcp
          status: up
          interfaces:
              0: eth0
          statistics:
              send_count: 10
              recv_count: 10
              drop_count: 0
          tunables:
              peer_timeout: 180
              peer_credits: 8
              peer_buffer_credits: 0
              credits: 256
          lnd tunables:
              conns_per_peer: 1
          dev cpt: -1
          CPT: \"[0]\"
route:
    - net: tcp1
      gateway: 192.168.1.3@tcp
      hop: -1
      priority: 0
      health_sensitivity: 1
peer:
    - primary nid: 192.168.1.9@tcp
      Multi-Rail: True
      peer ni:
        - nid: 192.168.1.9@tcp
          state: NA
routing:
    - cpt[0]:
          tiny:
              npages: 0
              nbuffers: 2048
              credits: 2048
              mincredits: 2048
    - enable: 0
buffers:
    tiny: 2048
    small: 16384
    large: 1024
global:
    numa_range: 0
    max_interfaces: 200
    discovery: 1
    drop_asym_route: 0
    retry_count: 2
    transaction_timeout: 150
    health_sensitivity: 100
    recovery_interval: 1
    router_sensitivity: 100
    lnd_timeout: 50
    response_tracking: 3
    recovery_limit: 0
    max_recovery_ping_interval: 900
";

    #[test]
    fn globals_are_checked_and_warn_only_without_effect() {
        let ni = "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 10.0.0.1@tcp\n";
        for bad in [
            "max_interfaces: 8",
            "max_intf: 8",
            "response_tracking: 4",
            "drop_asym_route: 2",
            "max_recovery_ping_interval: 0",
            "alive_router_check_interval: -1",
            "router_ping_timeout: 0",
            "avoid_asym_router_failure: 2",
            "check_routers_before_use: -1",
            "router_sensitivity: 101",
            "health_sensitivity: 1001",
        ] {
            let e = NodeConf::from_yaml(&format!("{ni}global:\n    {bad}\n")).unwrap_err();
            assert_eq!(e.errno(), 22, "{bad}: {e}");
        }
        let (c, warn) = NodeConf::from_yaml(&format!(
            "{ni}global:\n    numa_range: 3\n    router_sensitivity: 50\n    drop_asym_route: 1\n    response_tracking: 1\n    recovery_limit: 20\n    max_recovery_ping_interval: 30\n    max_interfaces: 64\n    alive_router_check_interval: 5\n    router_ping_timeout: 7\n    avoid_asym_router_failure: 0\n    check_routers_before_use: 1\n"
        ))
        .unwrap();
        assert_eq!(warn.len(), 2, "{warn:?}");
        assert!(warn[0].contains("numa_range") && warn[0].contains("NUMA"));
        assert!(warn[1].contains("router_sensitivity") && warn[1].contains("deprecated"));
        let n = c.to_lnet_config().node;
        assert!(n.drop_asym_route);
        assert_eq!(n.response_tracking.level(), 1);
        assert_eq!(n.recovery_limit, Some(Duration::from_secs(20)));
        assert_eq!(n.max_recovery_ping_interval, Duration::from_secs(30));
        assert_eq!(n.max_interfaces, 64);
        assert_eq!(n.router_check_interval, Duration::from_secs(5));
        assert_eq!(n.router_ping_timeout, Duration::from_secs(7));
        assert!(!n.avoid_asym_router_failure);
        assert!(n.check_routers_before_use);
    }

    #[test]
    fn lnetctl_export_is_accepted_with_warnings() {
        let (c, warn) = NodeConf::from_yaml(LNETCTL_EXPORT).unwrap();
        assert_eq!(c.nis.len(), 1);
        assert_eq!(c.nis[0].nid, "192.168.1.2@tcp".parse().unwrap());
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.peers.len(), 1);
        assert_eq!(c.routing, Some(false));
        assert!(warn.iter().any(|w| w.contains("eth0")), "{warn:?}");
        assert!(warn.iter().any(|w| w.contains("CPT")), "{warn:?}");
        assert_eq!(c.nis[0].peer_timeout, 180);
    }

    /// Sanity-lnet 231's values: -1 is the default (180), the others are
    /// kept through an export; a negative one other than -1 is refused.
    #[test]
    fn peer_timeout_survives_export() {
        let ni = |pto: &str| {
            format!(
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 10.0.0.1@tcp\n          tunables:\n              peer_timeout: {pto}\n"
            )
        };
        for (given, kept) in [("-1", 180), ("0", 0), ("60", 60), ("180", 180)] {
            let (c, warn) = NodeConf::from_yaml(&ni(given)).unwrap();
            assert!(warn.is_empty(), "{warn:?}");
            assert_eq!(c.nis[0].peer_timeout, kept);
            assert_eq!(c.to_lnet_config().node.nis[0].peer_timeout, kept);
            let text = c.to_yaml();
            assert!(text.contains(&format!("peer_timeout: {kept}\n")), "{text}");
            assert_eq!(NodeConf::from_yaml(&text).unwrap().0, c);
        }
        let e = NodeConf::from_yaml(&ni("-2")).unwrap_err();
        assert_eq!(e.errno(), 22);
    }

    /// Health off turns resends off, as Lustre's `sensitivity_set` does.
    #[test]
    fn health_sensitivity_zero_means_no_retries() {
        let text = "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 10.0.0.1@tcp\nglobal:\n    retry_count: 2\n    health_sensitivity: 0\n";
        let (c, _) = NodeConf::from_yaml(text).unwrap();
        let n = c.to_lnet_config().node;
        assert_eq!((n.health_sensitivity, n.retry_count), (0, 0));
    }

    #[test]
    fn round_trip() {
        let (c, _) = NodeConf::from_yaml(LNETCTL_EXPORT).unwrap();
        let text = c.to_yaml();
        let (c2, warn) = NodeConf::from_yaml(&text).unwrap();
        assert_eq!(c, c2, "{text}");
        assert!(warn.is_empty(), "{warn:?}");
    }

    proptest::proptest! {
        /// Whatever the file holds, reading it gives a configuration or an
        /// error, never a panic.
        #[test]
        fn any_text_is_read_or_refused(text in "[-a-z0-9 :.@\\[\\]{}\"'#|>&*!,\n]{0,200}") {
            let _ = NodeConf::from_yaml(&text);
        }

        /// Valid files with one line mangled: same.
        #[test]
        fn mangled_exports_are_read_or_refused(line in 0usize..80, junk in "[-a-z0-9 :@\\[{]{0,12}") {
            let mut lines: Vec<String> = LNETCTL_EXPORT.lines().map(str::to_owned).collect();
            let i = line % lines.len();
            lines[i] = format!("{}{junk}", &lines[i][..lines[i].len() / 2]);
            let _ = NodeConf::from_yaml(&lines.join("\n"));
        }
    }

    fn node_conf() -> impl proptest::strategy::Strategy<Value = NodeConf> {
        use proptest::prelude::*;
        let nid = |i: u8, net: &str| -> Nid { format!("10.0.{i}.1@{net}").parse().unwrap() };
        (
            prop::collection::vec(
                (
                    any::<bool>(),
                    1u32..1000,
                    1u32..100,
                    prop::option::of(1u32..4),
                ),
                1..4,
            ),
            prop::collection::vec((1u8..200, any::<bool>(), 0usize..3), 0..3),
            prop::collection::vec(
                (5u8..9, 1u8..3, prop::option::of(1u32..255), 0u32..10),
                0..3,
            ),
            prop::option::of(any::<bool>()),
            [
                prop::option::of(1u32..5000),
                prop::option::of(1u32..5000),
                prop::option::of(1u32..5000),
            ],
            prop::collection::btree_map(0usize..GLOBALS.len(), 1i64..100, 0..5),
            (
                prop::option::of(any::<u16>()),
                prop::option::of(any::<u16>()),
            ),
            prop::option::of(prop_oneof![
                Just(AcceptPolicy::Secure),
                Just(AcceptPolicy::All),
                Just(AcceptPolicy::None)
            ]),
        )
            .prop_map(
                move |(nis, peers, routes, routing, buffers, global, ports, accept)| {
                    let (accept_port, accept_port_bulk) = ports;
                    let mut used = std::collections::HashSet::new();
                    NodeConf {
                        // A net's LNet tunables are its first NI's.
                        nis: per_net_tunables(
                            nis.into_iter()
                                .enumerate()
                                .map(|(i, (second, credits, peer_credits, conns_per_peer))| {
                                    NiConf {
                                        peer_buffer_credits: credits % 3,
                                        nid: nid(
                                            u8::try_from(i).unwrap(),
                                            if second { "tcp1" } else { "tcp" },
                                        ),
                                        credits,
                                        peer_credits,
                                        conns_per_peer,
                                        tos: (credits % 5 == 0)
                                            .then(|| i32::try_from(credits % 256).unwrap_or(0)),
                                        peer_timeout: credits % 200,
                                        interface: None,
                                    }
                                })
                                .collect(),
                        ),
                        peers: peers
                            .into_iter()
                            .filter(|p| used.insert(p.0))
                            .map(|(i, mr, extra)| PeerConf {
                                primary: nid(i, "tcp"),
                                multi_rail: mr,
                                nids: (0..extra)
                                    .map(|k| nid(i.wrapping_add(u8::try_from(k).unwrap()), "tcp"))
                                    .collect(),
                            })
                            .collect(),
                        routes: routes
                            .into_iter()
                            .map(|(net, gw, hop, priority)| RouteConf {
                                net: format!("tcp{net}").parse().unwrap(),
                                gateway: nid(gw, "tcp"),
                                hop,
                                priority,
                            })
                            .collect(),
                        routing,
                        buffers,
                        global: global
                            .into_iter()
                            .map(|(i, v)| {
                                let name = GLOBALS[i].0;
                                let v = match name {
                                    "discovery"
                                    | "drop_asym_route"
                                    | "avoid_asym_router_failure"
                                    | "check_routers_before_use" => v % 2,
                                    "response_tracking" => v % 4,
                                    "max_interfaces" => v + 16,
                                    "transaction_timeout" | "max_recovery_ping_interval" => {
                                        v.max(1)
                                    }
                                    _ => v,
                                };
                                (name.to_owned(), v)
                            })
                            .collect(),
                        accept_port,
                        accept_port_bulk,
                        accept,
                        // A priority rule on a net of each NI, and a
                        // pair rule: the export writes them back.
                        udsp: nis_udsp(&used),
                    }
                },
            )
    }

    /// Selection policies for the generated configurations, from the
    /// peers' NIDs drawn.
    fn nis_udsp(seen: &std::collections::HashSet<u8>) -> Vec<Rule> {
        let mut ids: Vec<u8> = seen.iter().copied().collect();
        ids.sort_unstable();
        let mut v: Vec<Rule> = ids
            .iter()
            .take(2)
            .map(|i| {
                Rule::parse(
                    None,
                    Some(&format!("10.0.0.{i}@tcp")),
                    None,
                    Some(u32::from(*i)),
                )
                .unwrap()
            })
            .collect();
        if !seen.is_empty() {
            v.push(Rule::parse(Some("tcp1"), Some("tcp[2-4]"), None, None).unwrap());
        }
        v
    }

    /// `nis` with each net's LNet tunables those of its first NI.
    fn per_net_tunables(mut nis: Vec<NiConf>) -> Vec<NiConf> {
        for i in 1..nis.len() {
            let (before, rest) = nis.split_at_mut(i);
            if let Some(first) = before.iter().find(|x| x.nid.net() == rest[0].nid.net()) {
                first.take_net_tunables(&mut rest[0]);
            }
        }
        nis
    }

    proptest::proptest! {
        /// Export then import gives the same configuration, warning-free.
        #[test]
        fn any_configuration_survives_export(c in node_conf()) {
            let text = c.to_yaml();
            let (again, warn) = NodeConf::from_yaml(&text).unwrap();
            let noisy: Vec<&String> = warn.iter().filter(|w| !w.contains("no effect")).collect();
            proptest::prop_assert!(noisy.is_empty(), "{:?}", noisy);
            proptest::prop_assert_eq!(again, c, "{}", text);
        }
    }

    #[test]
    fn ni_order_survives_export() {
        let text = "net:
    - net type: tcp
      local NI(s):
        - nid: 10.0.0.1@tcp
    - net type: tcp1
      local NI(s):
        - nid: 10.0.1.1@tcp1
    - net type: tcp
      local NI(s):
        - nid: 10.0.0.2@tcp
";
        let (c, _) = NodeConf::from_yaml(text).unwrap();
        let (again, _) = NodeConf::from_yaml(&c.to_yaml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(c.nis[0].nid, "10.0.0.1@tcp".parse().unwrap());
    }

    /// An NI's `tos` (sanity-lnet test 232): kept through an export; -1
    /// is the LND's, as if absent.
    #[test]
    fn ni_tos_survives_export() {
        let ni = |tos: &str| {
            format!(
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 10.0.0.1@tcp\n          lnd tunables:\n              tos: {tos}\n"
            )
        };
        let (c, _) = NodeConf::from_yaml(&ni("104")).unwrap();
        assert_eq!(c.nis[0].tos, Some(104));
        let text = c.to_yaml();
        assert!(text.contains("tos: 104"), "{text}");
        assert_eq!(NodeConf::from_yaml(&text).unwrap().0, c);
        assert_eq!(c.to_lnet_config().node.nis[0].tos, 104);
        let (c, _) = NodeConf::from_yaml(&ni("-1")).unwrap();
        assert_eq!(c.nis[0].tos, None);
        assert!(!c.to_yaml().contains("tos"));
    }

    #[test]
    fn ip2nets_rules_choose_interfaces_as_lnetctl_does() {
        use crate::sock::link::tests::ifa;
        let set = [
            ifa("lo", "127.0.0.1", "255.0.0.0", true, true),
            ifa("eth0", "10.1.0.5", "255.255.0.0", false, false),
            ifa("eth1", "10.2.0.5", "255.255.0.0", true, false),
            ifa("eth2", "10.2.0.7", "255.255.0.0", true, false),
        ];
        let rule = |y: &str| {
            let d = Doc::from_yaml(y).unwrap();
            Ip2netsRule::from_doc(&d, "ip2nets[0]", &mut Vec::new())
        };
        let chosen = |y: &str| rule(y).unwrap().choose(&set, &[]);
        let got = |pairs: &[(&str, &str)]| {
            Ok(pairs
                .iter()
                .map(|(n, a)| ((*n).to_owned(), a.parse().unwrap()))
                .collect::<Vec<_>>())
        };
        // Nothing named: the first interface up that is not lo.
        assert_eq!(chosen("net-spec: tcp\n"), got(&[("eth1", "10.2.0.5")]));
        // Ranges only: every interface up with an address in one.
        let both = got(&[("eth1", "10.2.0.5"), ("eth2", "10.2.0.7")]);
        assert_eq!(
            chosen("net-spec: tcp\nip-range:\n    0: 10.2.0.[1-9/2]\n"),
            both
        );
        assert_eq!(
            chosen("net-spec: tcp\nip-range:\n    0: \"10.*.*.*\"\n"),
            both
        );
        assert_eq!(
            chosen("net-spec: tcp\nip-range:\n    0: 10.2.0.[7,100]\n    1: 9.9.9.9\n"),
            got(&[("eth2", "10.2.0.7")])
        );
        assert!(
            chosen("net-spec: tcp\nip-range:\n    0: 10.1.0.5\n").is_err(),
            "eth0 is down"
        );
        // Interfaces named: each must be there, up and in a range.
        assert_eq!(
            chosen("net-spec: tcp1\ninterfaces:\n    0: eth2\n    1: lo\n"),
            got(&[("eth2", "10.2.0.7"), ("lo", "127.0.0.1")])
        );
        let e = chosen(
            "net-spec: tcp\ninterfaces:\n    0: eth1\n    1: eth2\nip-range:\n    0: 10.2.0.5\n",
        );
        assert!(e.unwrap_err().contains("eth2 has no address"));
        assert!(
            chosen("net-spec: tcp\ninterfaces:\n    0: eth0\n")
                .unwrap_err()
                .contains("not up")
        );
        assert!(
            chosen("net-spec: tcp\ninterfaces:\n    0: eth9\n")
                .unwrap_err()
                .contains("no interface eth9")
        );
        // Malformed rules are errors, not misses.
        for (y, want) in [
            ("interfaces:\n    0: eth1\n", "missing 'net-spec'"),
            (
                "net-spec: tcp\nip-range:\n    0: 10.2.0\n",
                "not an IPv4 range",
            ),
            (
                "net-spec: tcp\nip-range:\n    0: tcp\n",
                "not an IPv4 range",
            ),
            ("net-spec: o2ib\n", "o2ib"),
            ("net-spec: tcp\ncolour: red\n", "colour"),
        ] {
            let e = rule(y).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want), "{y}: {e}");
        }
    }

    /// sanity-lnet 158-162: IPv6 ranges (an address, or an address and a
    /// prefix length) choose interfaces by their IPv6 addresses; the NI
    /// takes the interface's IPv4 address.
    #[test]
    fn ipv6_ranges_choose_interfaces_by_their_ipv6_addresses() {
        use crate::sock::link::tests::ifa;
        let set = [
            ifa("lo", "127.0.0.1", "255.0.0.0", true, true),
            ifa("eth1", "10.2.0.5", "255.255.0.0", true, false),
            ifa("eth2", "10.3.0.7", "255.255.0.0", true, false),
        ];
        let v6: Vec<(String, std::net::Ipv6Addr)> = [
            ("lo", "::1"),
            ("eth1", "fe80::1"),
            ("eth1", "fd00:97:1::5"),
            ("eth2", "fd00:97:2::7"),
        ]
        .iter()
        .map(|(n, a)| ((*n).to_owned(), a.parse().unwrap()))
        .collect();
        let nis = |spec: &str| {
            let rules = Ip2netsRule::parse_list(spec)?;
            resolve_ip2nets_in(&rules, &set, &v6, &[], &mut Vec::new()).map(|v| {
                v.into_iter()
                    .map(|n| format!("{} {}", n.nid, n.interface.unwrap_or_default()))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            nis("tcp(eth1) fd00:97:1::5").unwrap(),
            ["10.2.0.5@tcp eth1"]
        );
        assert_eq!(
            nis("tcp(eth1) fd00:97:1::5/128").unwrap(),
            ["10.2.0.5@tcp eth1"]
        );
        for prefix in [64, 32, 16, 8] {
            assert_eq!(
                nis(&format!("tcp(eth1) fd00:97:1::5/{prefix}")).unwrap(),
                ["10.2.0.5@tcp eth1"],
                "/{prefix}"
            );
        }
        // Without interfaces, every interface up with an address in range.
        assert_eq!(
            nis("tcp1 fd00:97::/32").unwrap(),
            ["10.2.0.5@tcp1 eth1", "10.3.0.7@tcp1 eth2"]
        );
        assert_eq!(nis("tcp1 ::/0").unwrap().len(), 3);
        // Two interfaces, each with its own range (sanity-lnet 160).
        assert_eq!(
            nis("tcp(eth1,eth2) fd00:97:1::5 fd00:97:2::7").unwrap(),
            ["10.2.0.5@tcp eth1", "10.3.0.7@tcp eth2"]
        );
        // A range no address is in (162), on eth2 only, or the wrong
        // interface: no match.
        for spec in [
            "tcp(eth1) 2001:db8:dead:beef::1",
            "tcp(eth2) fd00:97:1::5",
            "tcp(eth1) fd00:97:1::6",
        ] {
            let e = nis(spec).unwrap_err().to_string();
            assert!(e.contains("no rule matches"), "{spec}: {e}");
        }
        for bad in ["fd00::1/129", "fd00::1/x", "fd00:::1", "fd00::1/"] {
            let e = Ip2netsRule::parse_list(&format!("tcp {bad}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("not an IPv4 range or an IPv6 address"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn ip2net_strings_are_rules_as_the_module_parameter_writes_them() {
        use crate::sock::link::tests::ifa;
        let set = [
            ifa("lo", "127.0.0.1", "255.0.0.0", true, true),
            ifa("eth1", "10.2.0.5", "255.255.0.0", true, false),
            ifa("eth2", "10.3.0.7", "255.255.0.0", true, false),
        ];
        let nis = |spec: &str, have: &[Nid]| {
            let rules = Ip2netsRule::parse_list(spec)?;
            resolve_ip2nets_in(&rules, &set, &[], have, &mut Vec::new()).map(|v| {
                v.into_iter()
                    .map(|n| format!("{} {}", n.nid, n.interface.unwrap_or_default()))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(nis("tcp 10.2.*.*", &[]).unwrap(), ["10.2.0.5@tcp eth1"]);
        assert_eq!(
            nis(" tcp(eth2, lo) ; tcp1 10.*.*.[1-9/2]  10.9.9.9 ;", &[]).unwrap(),
            [
                "10.3.0.7@tcp eth2",
                "127.0.0.1@tcp lo",
                "10.2.0.5@tcp1 eth1",
                "10.3.0.7@tcp1 eth2"
            ]
        );
        // The first rule of a net wins; a rule matching nothing is passed.
        assert_eq!(
            nis("tcp 10.9.*.*; tcp(eth1); tcp 10.3.0.7", &[]).unwrap(),
            ["10.2.0.5@tcp eth1"]
        );
        // What is there already is not made again.
        let have: [Nid; 1] = ["10.2.0.5@tcp".parse().unwrap()];
        assert_eq!(nis("tcp(eth1)", &have).unwrap(), Vec::<String>::new());
        for (spec, want) in [
            ("tcp 10.9.9.9", "no rule matches"),
            ("tcp(eth1 10.2.0.5", "unbalanced"),
            ("tcp eth1) 10.2.0.5", "unbalanced"),
            ("tcp 10.2.0", "not an IPv4 range"),
            ("o2ib 10.2.0.5", "o2ib"),
            (" ; ", "no rule"),
        ] {
            let e = nis(spec, &[]).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    /// sanity-lnet 208: the `ip2nets` module parameter configures the
    /// nets of every rule that matches an address of this machine (two
    /// rules may each put an NI on one net), a rule matching any address
    /// even through an interface it does not name.
    #[test]
    fn the_ip2nets_module_parameter_is_read_as_the_kernel_reads_it() {
        use crate::sock::link::tests::ifa;
        let set = [
            ifa("lo", "127.0.0.1", "255.0.0.0", true, true),
            ifa("eth1", "10.2.0.5", "255.255.0.0", true, false),
            ifa("eth2", "10.3.0.7", "255.255.0.0", true, false),
            ifa("eth3", "10.4.0.9", "255.255.0.0", false, false),
        ];
        let nets = |s: &str| {
            kernel_ip2nets(s, &set, &[]).map(|v| {
                v.iter()
                    .map(|r| format!("{}({})", r.net, r.names.join(",")))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            nets("tcp(eth1) 10.2.0.5; tcp(eth2) 10.3.0.7").unwrap(),
            ["tcp(eth1)", "tcp(eth2)"]
        );
        assert_eq!(
            nets("tcp(eth1,eth2) [10,10].[2,3].0.[5,7]").unwrap(),
            ["tcp(eth1,eth2)"]
        );
        assert_eq!(
            nets("tcp(eth1),tcp1 10.3.*.*\ntcp2 10.9.*.*; tcp3 10.9.0.1 10.2.0.[1-9]").unwrap(),
            ["tcp(eth1)", "tcp1()", "tcp3()"]
        );
        // An interface that is down has no address to match; a rule
        // without ranges matches nothing.
        for s in ["tcp 10.4.0.9", "tcp(eth1)", "tcp 10.9.9.9"] {
            let e = nets(s).unwrap_err().to_string();
            assert!(e.contains("match no address"), "{s}: {e}");
        }
        for (s, want) in [
            ("tcp,tcp(eth1) 10.2.0.5", "tcp twice in one rule"),
            ("tcp(eth1 10.2.0.5", "unbalanced"),
            ("tcp 10.2.0", "not an IPv4 range"),
        ] {
            let e = nets(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn module_parameters_add_nis_and_routes() {
        let mut c = NodeConf::empty();
        let warn = c
            .add_module_params(
                Some("tcp3(lo)"),
                None,
                Some("tcp9 2 127.0.0.[5-6]@tcp3:4; tcp8 127.0.0.7@tcp3 ;"),
            )
            .unwrap();
        assert!(warn.is_empty(), "{warn:?}");
        assert_eq!(c.nis.len(), 1);
        assert_eq!(c.nis[0].nid.to_string(), "127.0.0.1@tcp3");
        assert_eq!(c.nis[0].interface.as_deref(), Some("lo"));
        let routes: Vec<String> = c
            .routes
            .iter()
            .map(|r| format!("{} {} {:?} {}", r.net, r.gateway, r.hop, r.priority))
            .collect();
        assert_eq!(
            routes,
            [
                "tcp9 127.0.0.5@tcp3 Some(2) 4",
                "tcp9 127.0.0.6@tcp3 Some(2) 4",
                "tcp8 127.0.0.7@tcp3 None 0"
            ]
        );
        let mut c = NodeConf::empty();
        c.add_module_params(None, Some("tcp4(lo) 127.*.*.*"), None)
            .unwrap();
        assert_eq!(c.nis[0].nid.to_string(), "127.0.0.1@tcp4");
        for (n, i, r, want) in [
            (Some("tcp(lo)"), Some("tcp 127.0.0.1"), None, "not both"),
            (Some("tcp(lo"), None, None, "unbalanced"),
            (Some("tcp(lo))"), None, None, "unbalanced"),
            (Some(" , "), None, None, "no net"),
            (Some("tcp(nosuch0)"), None, None, "no interface nosuch0"),
            (Some("tcp(lo),tcp(lo)"), None, None, "given twice"),
            (
                Some("tcp(lo)"),
                None,
                Some("tcp 127.0.0.9@tcp"),
                "is a local net",
            ),
            (
                Some("tcp(lo)"),
                None,
                Some("tcp9 0 127.0.0.9@tcp"),
                "hop count 0",
            ),
            (Some("tcp(lo)"), None, Some("tcp9 3"), "no gateway"),
            (
                Some("tcp(lo)"),
                None,
                Some("tcp9 127.0.0.9@tcp:high"),
                "priority 'high'",
            ),
            (Some("tcp(lo)"), None, Some("tcp9 127.0.0.9"), "127.0.0.9"),
        ] {
            let e = NodeConf::empty()
                .add_module_params(n, i, r)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{n:?} {i:?} {r:?}: {e}");
        }
    }

    /// A rule's `tunables:` and `lnd tunables:` are its NIs', as
    /// liblnetconfig's `handle_yaml_config_ip2nets` reads them.
    #[test]
    fn ip2nets_rules_carry_their_tunables() {
        // lo holds 127.0.0.1 on every Linux machine.
        let (c, _) = NodeConf::from_yaml(
            "ip2nets:\n  - net-spec: tcp5\n    interfaces:\n        0: lo\n    tunables:\n        peer_credits: 16\n        peer_timeout: 0\n    lnd tunables:\n        conns_per_peer: 4\n        tos: 3\n",
        )
        .unwrap();
        let n = &c.nis[0];
        assert_eq!(n.nid.to_string(), "127.0.0.1@tcp5");
        assert_eq!(
            (
                n.peer_credits,
                n.peer_timeout,
                n.credits,
                n.conns_per_peer,
                n.tos
            ),
            (16, 0, 256, Some(4), Some(3))
        );
        for (y, want) in [
            ("    tunables:\n        colour: 1\n", "colour"),
            ("    tunables:\n        credits: 0\n", "at least 1"),
            ("    lnd tunables:\n        tos: 300\n", "invalid value 300"),
        ] {
            let e = NodeConf::from_yaml(&format!(
                "ip2nets:\n  - net-spec: tcp5\n    interfaces:\n        0: lo\n{y}"
            ))
            .map(|_| ())
            .unwrap_err()
            .to_string();
            assert!(e.contains(want), "{y}: {e}");
        }
    }

    #[test]
    fn ip2nets_in_a_file_adds_an_ni_per_chosen_interface() {
        // lo holds 127.0.0.1 on every Linux machine.
        let (c, warn) = NodeConf::from_yaml(
            "ip2nets:\n  - net-spec: tcp\n    interfaces:\n        0: lo\n    ip-range:\n        0: 127.0.0.[0-4]\n  - net-spec: tcp\n    interfaces:\n        0: lo\n  - net-spec: tcp2\n    ip-range:\n        0: \"127.*.*.*\"\n",
        )
        .unwrap();
        let nis: Vec<(String, Option<&str>)> = c
            .nis
            .iter()
            .map(|n| (n.nid.to_string(), n.interface.as_deref()))
            .collect();
        assert_eq!(
            nis,
            [
                ("127.0.0.1@tcp".to_owned(), Some("lo")),
                ("127.0.0.1@tcp2".to_owned(), Some("lo"))
            ]
        );
        assert!(
            warn.iter()
                .any(|w| w.contains("configured by an earlier rule")),
            "{warn:?}"
        );
        assert!(c.to_yaml().contains("interfaces:\n              0: lo\n"));
        // No rule matching: an error, as lnetctl's import fails.
        let e = NodeConf::from_yaml(
            "ip2nets:\n  - net-spec: tcp\n    interfaces:\n        0: lo\n    ip-range:\n        0: 10.20.30.40\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no rule matches"), "{e}");
        assert!(NodeConf::from_yaml("ip2nets:\n  - interfaces:\n        0: lo\n").is_err());
    }

    #[test]
    fn an_ni_named_by_its_interface_takes_the_interfaces_address() {
        // lo holds 127.0.0.1 on every Linux machine.
        let (c, warn) = NodeConf::from_yaml(
            "net:\n    - net type: tcp3\n      local NI(s):\n        - interfaces:\n              0: lo\n",
        )
        .unwrap();
        assert!(warn.is_empty(), "{warn:?}");
        assert_eq!(c.nis[0].nid.to_string(), "127.0.0.1@tcp3");
        assert_eq!(c.nis[0].interface.as_deref(), Some("lo"));
        let y = c.to_yaml();
        assert!(y.contains("interfaces:\n              0: lo\n"), "{y}");
        assert_eq!(NodeConf::from_yaml(&y).unwrap().0, c);
        // Given with the NID it holds: kept, no warning.
        let (c, warn) = NodeConf::from_yaml(
            "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.0.1@tcp\n          interfaces:\n              0: lo\n",
        )
        .unwrap();
        assert!(warn.is_empty(), "{warn:?}");
        assert_eq!(c.nis[0].interface.as_deref(), Some("lo"));
        // lo does not hold 127.0.5.5 (its prefix does): ignored, warned.
        let (c, warn) = NodeConf::from_yaml(
            "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.5.5@tcp\n          interfaces:\n              0: lo\n",
        )
        .unwrap();
        assert_eq!(c.nis[0].interface, None);
        assert!(warn[0].contains("lo ignored"), "{warn:?}");
        // Two interfaces in one entry: an NI on each (sanity-lnet 450);
        // lo twice is one NID twice.
        let e = NodeConf::from_yaml(
            "net:\n    - net type: tcp\n      local NI(s):\n        - interfaces:\n              0: lo\n              1: lo\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("127.0.0.1@tcp given twice"), "{e}");
    }

    #[test]
    fn bad_inputs() {
        let cases = [
            ("net: [\n", "malformed"),
            ("nets:\n    - net type: tcp\n", "invalid key 'nets'"),
            (
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 1.2.3@tcp\n",
                "not a NID",
            ),
            (
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 1.2.3.4@tcp\n          colour: red\n",
                "invalid key 'colour'",
            ),
            (
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 1.2.3.4@tcp\n          lnd tunables:\n              tos: 256\n",
                "invalid value 256",
            ),
            (
                "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 1.2.3.4@tcp\nroute:\n    - net: tcp\n      gateway: 1.2.3.5@tcp\n",
                "local net",
            ),
            (
                "net:\n    - net type: o2ib\n      local NI(s):\n        - nid: 1.2.3.4@o2ib\n",
                "only tcp",
            ),
            (
                "net:\n    - net type: tcp\n      local NI(s):\n        - interfaces:\n              0: nosuch0\n",
                "no interface nosuch0 with an IPv4 address",
            ),
            (
                "global:\n    retry_count: many\n",
                "invalid value many (expected a number)",
            ),
            (
                "global:\n    retry_count:\n",
                "no value (expected a number)",
            ),
            ("global:\n    transaction_timeout: 0\n", "out of range"),
        ];
        for (text, want) in cases {
            let e = NodeConf::from_yaml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
