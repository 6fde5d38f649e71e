//! The node side of the control socket: a running [`Lnet`] and the
//! commands' handlers, with `lnetctl`'s YAML keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_lnet::credits::PoolKind;
use colibri_lnet::discovery::PeerState;
use colibri_lnet::fault::{
    DelayRuleSpec, DropRuleSpec, FaultMatch, HealthError, MsgMask, RuleId, Trigger,
};
use colibri_lnet::health::{HealthStatus, NiSide};
use colibri_lnet::ids::{Net, Nid};
use colibri_lnet::matching::{Event, MdHandle};
use colibri_lnet::nidrange;
use colibri_lnet::node::{DEFAULT_PEER_TIMEOUT, MsgTypeCounts, NiConfig, Node, ResponseTracking};
use colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet::udsp::Rule;
use colibri_lnet::wire::{NiStatus, PingFeatures, PingInfo};
use crossbeam_channel::Sender;
use parking_lot::Mutex;

use super::selftest::{self, SelftestTarget};
use super::{Command, Failure, FaultArgs, FaultKind, errno};
use crate::conf::{self, GLOBALS, NodeConf};
use crate::yaml::Doc;
use crate::{Lnet, LnetError};

/// Gives each event to whoever waits for its MD (the selftest's
/// operations); other events (the selftest target's, operations given up
/// on) are dropped.
#[derive(Debug, Default)]
pub(crate) struct EventRouter {
    waiters: Mutex<HashMap<MdHandle, Sender<Event>>>,
}

impl EventRouter {
    pub(crate) fn dispatch(&self, ev: Event) {
        let mut w = self.waiters.lock();
        let tx = if ev.unlinked {
            w.remove(&ev.md)
        } else {
            w.get(&ev.md).cloned()
        };
        drop(w);
        if let Some(tx) = tx {
            // Never block the event thread: a waiter holds room for its
            // operation's two events.
            let _ = tx.try_send(ev);
        }
    }

    pub(crate) fn wait_for(&self, md: MdHandle, tx: Sender<Event>) {
        self.waiters.lock().insert(md, tx);
    }

    pub(crate) fn forget(&self, md: MdHandle) {
        self.waiters.lock().remove(&md);
    }
}

#[derive(Clone, Debug)]
struct FaultEntry {
    id: RuleId,
    kind: FaultKind,
    src: Nid,
    dst: Nid,
    args: FaultArgs,
}

#[derive(Debug)]
struct State {
    /// Global settings recorded without effect here.
    extra: BTreeMap<String, i64>,
    accept_port: u16,
    accept_port_bulk: Option<u16>,
    accept: AcceptPolicy,
    conns_per_peer: u32,
    faults: Vec<FaultEntry>,
    /// The configuration the node started with (`lnet configure --all`
    /// applies it again).
    startup: NodeConf,
    /// LNet taken down by `lnet unconfigure` (Lustre's `ln_refcount` 0):
    /// every command but `lnet configure|unconfigure` fails `ENETDOWN`.
    down: bool,
    /// The interface each NI is on, where one was named or holds its IP
    /// (`net show` and `export` print it; the node keeps NIDs only).
    interfaces: BTreeMap<Nid, String>,
}

/// A node run as a process: its [`Lnet`], the selftest target it serves,
/// and what `lnetctl` shows that the node itself does not keep.
#[derive(Debug)]
pub struct Daemon {
    lnet: Lnet,
    pub(crate) events: Arc<EventRouter>,
    st: Mutex<State>,
    _target: SelftestTarget,
}

fn lnet_fail(op: &str, object: &str, e: &LnetError) -> Failure {
    Failure::new(op, object, e.errno(), e.to_string())
}

fn conf_fail(op: &str, object: &str, e: &conf::ConfError) -> Failure {
    Failure::new(op, object, e.errno(), e.to_string())
}

/// `health stats` of an interface in `lnetctl net show -v` (local) or
/// `peer show -v` (peer) shape: its health value, the failed completions
/// counted on it by status, the recovery pings sent since it was last
/// heard from and when the next is due (seconds on the node's clock, 0
/// when not in recovery); a local NI's `fatal_error` is 1 while the socket
/// LND's link watch finds its interface down or its IP gone.
fn health_stats(n: &Node, side: NiSide, nid: Nid) -> Doc {
    let h = n.health();
    let counts = h.failure_counts(side, nid);
    let count = |s: HealthStatus| {
        HealthStatus::ALL
            .iter()
            .position(|x| *x == s)
            .map_or(0, |i| counts[i])
    };
    let ni = h.ni_health(side, nid);
    let (ping_count, next_ping) = ni.map_or((0, 0), |x| {
        (
            x.ping_count,
            x.next_ping.map_or(0, |t| t.since_epoch().as_secs()),
        )
    });
    match side {
        NiSide::Local => Doc::map()
            .with(
                "fatal_error",
                i64::from(n.ni_info(nid).is_some_and(|i| i.fatal)),
            )
            .with("health value", h.local_health(nid).value())
            .with("interrupts", count(HealthStatus::LocalInterrupt))
            .with("dropped", count(HealthStatus::LocalDropped))
            .with("aborted", count(HealthStatus::LocalAborted))
            .with("no route", count(HealthStatus::LocalNoRoute))
            .with("timeouts", count(HealthStatus::LocalTimeout))
            .with("error", count(HealthStatus::LocalError))
            .with("ping_count", ping_count)
            .with("next_ping", next_ping),
        NiSide::Peer => Doc::map()
            .with("health value", h.peer_health(nid).value())
            .with("dropped", count(HealthStatus::RemoteDropped))
            .with("timeout", count(HealthStatus::RemoteTimeout))
            .with("error", count(HealthStatus::RemoteError))
            .with("network timeout", count(HealthStatus::NetworkTimeout))
            .with("ping_count", ping_count)
            .with("next_ping", next_ping),
    }
}

/// An interface's `statistics` with its per-operation latencies, as
/// Lustre's netlink dump gives them (`lnet_nl_put_latency`): for
/// `put_egress`, `get_rtt` and `put_ack`, the samples and the least, most
/// and mean nanoseconds (zeros without samples).
fn with_latency(mut d: Doc, l: &colibri_lnet::node::OpLatency) -> Doc {
    for (name, x) in [
        ("put_egress", l.put_egress),
        ("get_rtt", l.get_rtt),
        ("put_ack", l.put_ack),
    ] {
        d.push(&format!("{name}_samples"), x.samples);
        d.push(&format!("{name}_min_nsec"), x.min_ns);
        d.push(&format!("{name}_max_nsec"), x.max_ns);
        d.push(&format!("{name}_avg_nsec"), x.avg_ns());
    }
    d
}

fn nid_arg(s: &str, op: &str, object: &str) -> Result<Nid, Failure> {
    conf::parse_nid(s, "nid").map_err(|e| conf_fail(op, object, &e))
}

/// NIDs and NID ranges, as `lnetctl` takes them (`4.4.4.[1-3]@tcp`; see
/// `colibri_lnet::nidrange`), each item a list of its own; at most
/// `nidrange::MAX_NIDS` in all.
fn nid_list_arg(items: &[String], op: &str, object: &str) -> Result<Vec<Nid>, Failure> {
    let mut out = Vec::new();
    for item in items {
        let nids = nidrange::expand_nid_list(item).map_err(|e| {
            let errno = match e {
                nidrange::NidListError::TooMany { .. } => errno::E2BIG,
                _ => errno::EINVAL,
            };
            Failure::new(op, object, errno, e.to_string())
        })?;
        out.extend(nids);
        if out.len() > nidrange::MAX_NIDS {
            return Err(Failure::new(
                op,
                object,
                errno::E2BIG,
                format!(
                    "{items:?} name more than the {} NIDs allowed",
                    nidrange::MAX_NIDS
                ),
            ));
        }
    }
    Ok(out)
}

/// Nothing, or the warnings of an import.
fn warnings(warn: Vec<String>) -> Doc {
    if warn.is_empty() {
        Doc::Null
    } else {
        Doc::map().with(
            "warnings",
            warn.into_iter().map(Doc::from).collect::<Vec<_>>(),
        )
    }
}

fn net_arg(s: &str, op: &str, object: &str) -> Result<Net, Failure> {
    conf::parse_net(s, "net").map_err(|e| conf_fail(op, object, &e))
}

/// The NIs `net add` makes, each with the interface it is on when one
/// was named: `--nid` alone (its interface is the one holding its IP, if
/// any), or `--net` with `--if` (an NI on each interface, its NID the
/// interface's first IPv4 address, as socklnd makes it), or `--net`
/// alone (the first interface up and not a loopback, as socklnd picks).
/// Every interface is looked up before anything is added.
fn ni_targets(
    nid: Option<&str>,
    net: Option<&str>,
    interfaces: Option<&str>,
) -> Result<Vec<(Nid, Option<String>)>, Failure> {
    let fail = |errno, descr: String| Failure::new("add", "net", errno, descr);
    let table = || {
        crate::sock::link::read_ifaddrs().map_err(|e| {
            fail(
                errno::EIO,
                format!("cannot read this machine's interfaces: {e}"),
            )
        })
    };
    let names: Vec<&str> = interfaces
        .map(|i| {
            i.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default();
    match (nid, net) {
        (Some(n), None) if names.is_empty() => {
            let nid = nid_arg(n, "add", "net")?;
            let ip = std::net::Ipv4Addr::from(nid.addr());
            let name = table()
                .ok()
                .and_then(|t| crate::sock::link::interface_of(ip, &t).map(str::to_owned));
            Ok(vec![(nid, name)])
        }
        (Some(_), _) => Err(fail(
            errno::EINVAL,
            "give --nid, or --net with --if, not both".into(),
        )),
        (None, Some(net)) => {
            let net = net_arg(net, "add", "net")?;
            if net.is_lo() {
                return Err(fail(errno::EINVAL, "the lo net is always there".into()));
            }
            let t = table()?;
            if names.is_empty() {
                let i = crate::sock::link::default_interface(&t).ok_or_else(|| {
                    fail(
                        errno::ENODEV,
                        "no interface is up (besides loopbacks): name one with --if".into(),
                    )
                })?;
                return Ok(vec![(net.nid_ipv4(i.addr), Some(i.name.clone()))]);
            }
            let mut out: Vec<(Nid, Option<String>)> = Vec::new();
            for name in names {
                let ip = crate::sock::link::interface_ip(name, &t)
                    .map_err(|m| fail(errno::ENODEV, m))?;
                let nid = net.nid_ipv4(ip);
                if out.iter().any(|(n, _)| *n == nid) {
                    return Err(fail(
                        errno::EEXIST,
                        format!("{name} is named twice ({nid})"),
                    ));
                }
                out.push((nid, Some(name.to_owned())));
            }
            Ok(out)
        }
        (None, None) if names.is_empty() => Err(fail(
            errno::EINVAL,
            "give --nid, or --net (with --if)".into(),
        )),
        (None, None) => Err(fail(errno::EINVAL, "--if needs --net".into())),
    }
}

/// The NIs `net add --ip2net RULES` makes: the rules resolved against
/// this machine's interfaces as an `ip2nets:` section is
/// ([`conf::resolve_ip2nets`]); EEXIST when every NI they choose is
/// there already (sanity-lnet 199).
fn ip2net_targets(spec: &str, have: &[Nid]) -> Result<Vec<(Nid, Option<String>)>, Failure> {
    let rules = conf::Ip2netsRule::parse_list(spec).map_err(|e| conf_fail("add", "net", &e))?;
    let mut warn = Vec::new();
    let nis = conf::resolve_ip2nets(&rules, have, &mut warn)
        .map_err(|e| Failure::new("add", "net", errno::ENODEV, e.to_string()))?;
    if nis.is_empty() {
        return Err(Failure::new(
            "add",
            "net",
            errno::EEXIST,
            format!(
                "every NI the rules choose is configured already: {}",
                warn.join("; ")
            ),
        ));
    }
    Ok(nis.into_iter().map(|n| (n.nid, n.interface)).collect())
}

/// `*` (or nothing) is any NID; `*@NET` every NID of a net, as `lctl`'s
/// fault rules read it (the `255.255.255.255@NET` wildcard).
fn any_nid(s: Option<&str>, op: &str, object: &str) -> Result<Nid, Failure> {
    match s {
        None | Some("*") => Ok(Nid::ANY),
        Some(s) if s.starts_with("*@") => Ok(net_arg(&s[2..], op, object)?.wildcard_nid()),
        Some(s) => s.parse().map_err(|e| {
            Failure::new(
                op,
                object,
                errno::EINVAL,
                format!("'{s}' is not a NID: {e}"),
            )
        }),
    }
}

fn nid_text(n: Nid) -> String {
    if n.is_any() {
        "*".into()
    } else {
        n.to_string()
    }
}

const fn status_name(s: NiStatus) -> &'static str {
    match s {
        NiStatus::Up => "up",
        NiStatus::Down => "down",
        NiStatus::Invalid => "NA",
    }
}

fn health_status_key(s: HealthStatus) -> Option<&'static str> {
    Some(match s {
        HealthStatus::Ok => return None,
        HealthStatus::LocalInterrupt => "local_interrupt_count",
        HealthStatus::LocalDropped => "local_dropped_count",
        HealthStatus::LocalAborted => "local_aborted_count",
        HealthStatus::LocalNoRoute => "local_no_route_count",
        HealthStatus::LocalTimeout => "local_timeout_count",
        HealthStatus::LocalError => "local_error_count",
        HealthStatus::RemoteDropped => "remote_dropped_count",
        HealthStatus::RemoteError => "remote_error_count",
        HealthStatus::RemoteTimeout => "remote_timeout_count",
        HealthStatus::NetworkTimeout => "network_timeout_count",
    })
}

fn health_error_name(h: HealthError) -> &'static str {
    match h {
        HealthError::LocalInterrupt => "local_interrupt",
        HealthError::LocalDropped => "local_dropped",
        HealthError::LocalAborted => "local_aborted",
        HealthError::LocalNoRoute => "local_no_route",
        HealthError::LocalError => "local_error",
        HealthError::LocalTimeout => "local_timeout",
        HealthError::RemoteError => "remote_error",
        HealthError::RemoteDropped => "remote_dropped",
        HealthError::RemoteTimeout => "remote_timeout",
        HealthError::NetworkTimeout => "network_timeout",
        _ => "other",
    }
}

/// `ping` / `discover` output for one peer.
pub(crate) fn ping_doc(info: &PingInfo) -> Doc {
    Doc::map()
        .with(
            "primary nid",
            info.primary_nid()
                .map_or_else(|| "0@lo".to_owned(), |n| n.to_string()),
        )
        .with(
            "Multi-Rail",
            Doc::Bool(info.features.contains(PingFeatures::MULTI_RAIL)),
        )
        .with(
            "peer ni",
            info.nis
                .iter()
                .map(|n| Doc::map().with("nid", n.nid.to_string()))
                .collect::<Vec<_>>(),
        )
}

impl Daemon {
    /// Starts a node from its configuration: the runtime, the configured
    /// peers and routes, and the selftest target.
    ///
    /// # Errors
    /// No NI, a listener that cannot be bound, a peer or route the node
    /// refuses.
    pub fn start(conf: &NodeConf) -> Result<Arc<Self>, Failure> {
        Self::start_with(conf, |_| {})
    }

    /// [`Daemon::start`] with `tune` applied to the runtime's
    /// configuration first: settings that are not Lustre's and so have
    /// no place in its YAML (`LnetConfig::splice_pipes`, `spin`, thread
    /// counts).
    ///
    /// # Errors
    /// As [`Daemon::start`].
    pub fn start_with(
        conf: &NodeConf,
        tune: impl FnOnce(&mut crate::LnetConfig),
    ) -> Result<Arc<Self>, Failure> {
        if conf.nis.is_empty() {
            return Err(Failure::new(
                "configure",
                "net",
                errno::EINVAL,
                "the configuration has no tcp NI (net: with a local NI(s): nid:)",
            ));
        }
        let mut cfg = conf.to_lnet_config();
        tune(&mut cfg);
        let (accept_port, accept_port_bulk, accept, cpp) = (
            cfg.accept_port,
            cfg.accept_port_bulk,
            cfg.accept,
            cfg.tcp.conns_per_peer_for_speed(None),
        );
        let events = Arc::new(EventRouter::default());
        let ev = events.clone();
        let lnet = Lnet::start_with_handler(cfg, move |e| ev.dispatch(e))
            .map_err(|e| lnet_fail("configure", "net", &e))?;
        let fail = |e: Failure| {
            lnet.shutdown();
            e
        };
        for p in &conf.peers {
            let nids: Vec<Nid> = p.nids.iter().copied().filter(|n| *n != p.primary).collect();
            lnet.add_peer(p.primary, &nids, p.multi_rail)
                .map_err(|e| fail(lnet_fail("add", "peer_ni", &e)))?;
        }
        for r in &conf.routes {
            lnet.add_route(r.net, r.gateway, r.hop, r.priority)
                .map_err(|e| fail(lnet_fail("add", "route", &e)))?;
        }
        let target =
            selftest::serve(&lnet).map_err(|e| fail(lnet_fail("configure", "selftest", &e)))?;
        let extra = conf
            .global
            .iter()
            .filter(|(k, _)| GLOBALS.iter().any(|g| g.0 == k.as_str() && !g.2))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        Ok(Arc::new(Self {
            lnet,
            events,
            st: Mutex::new(State {
                extra,
                accept_port,
                accept_port_bulk,
                accept,
                conns_per_peer: cpp,
                faults: Vec::new(),
                startup: conf.clone(),
                down: false,
                interfaces: conf
                    .nis
                    .iter()
                    .filter_map(|n| Some((n.nid, n.interface.clone()?)))
                    .collect(),
            }),
            _target: target,
        }))
    }

    /// The node.
    #[must_use]
    pub fn lnet(&self) -> &Lnet {
        &self.lnet
    }

    /// Stops the node (connections closed, threads joined).
    pub fn shutdown(&self) {
        self.lnet.shutdown();
    }

    /// Notes the interface an NI was added on (`None`: none known).
    fn note_interface(&self, nid: Nid, interface: Option<String>) {
        let mut st = self.st.lock();
        match interface {
            Some(name) => st.interfaces.insert(nid, name),
            None => st.interfaces.remove(&nid),
        };
    }

    /// The interface of each NI that has one known.
    fn interfaces(&self) -> BTreeMap<Nid, String> {
        self.st.lock().interfaces.clone()
    }

    /// The running configuration (`export`).
    #[must_use]
    pub fn export(&self) -> NodeConf {
        let st = self.st.lock();
        let (extra, cpp, port, bulk, acc) = (
            st.extra.clone(),
            st.conns_per_peer,
            st.accept_port,
            st.accept_port_bulk,
            st.accept,
        );
        drop(st);
        let mut conf = self
            .lnet
            .with_node(|n| NodeConf::of_node(n, cpp, port, acc, &extra));
        conf.accept_port_bulk = bulk;
        // The socket LND's, which `net set --conns-per-peer` changes.
        let interfaces = self.interfaces();
        for ni in &mut conf.nis {
            if let Some(c) = self.lnet.conns_per_peer(ni.nid) {
                ni.conns_per_peer = Some(c);
            }
            ni.interface = interfaces.get(&ni.nid).cloned();
        }
        conf
    }

    /// One line of statistics (printed when the node stops).
    #[must_use]
    pub fn summary(&self) -> String {
        let s = self.lnet.stats();
        let r = self.lnet.runtime_stats();
        format!(
            "send_count={} recv_count={} route_count={} drop_count={} send_length={} recv_length={} conns_established={} conns_closed={} splice_bytes={}",
            s.send_count,
            s.recv_count,
            s.route_count,
            s.drop_count,
            s.send_length,
            s.recv_length,
            r.conns_established,
            r.conns_closed,
            r.splice_write_bytes
        )
    }

    /// Carries out one command; `partial` receives intermediate results
    /// (and returns `false` when nobody listens any more).
    ///
    /// # Errors
    /// The command's failure, `lnetctl`-style.
    pub fn handle(
        &self,
        cmd: Command,
        partial: &mut dyn FnMut(Doc) -> bool,
    ) -> Result<Doc, Failure> {
        if self.st.lock().down
            && !matches!(
                cmd,
                Command::LnetConfigure { .. } | Command::LnetUnconfigure
            )
        {
            // As Lustre's: with LNet down, `LNetNIInit(LNET_PID_ANY)` and
            // the netlink handlers refuse everything but (un)configuring.
            let (op, object) = cmd.names();
            return Err(Failure::new(op, object, errno::ENETDOWN, "LNet stack down"));
        }
        match cmd {
            Command::NetAdd {
                nid,
                net,
                interfaces,
                ip2net,
                credits,
                peer_credits,
                peer_buffer_credits,
                conns_per_peer,
                tos,
                peer_timeout,
            } => {
                let nis = match ip2net {
                    Some(spec) if nid.is_none() && net.is_none() && interfaces.is_none() => {
                        ip2net_targets(&spec, &self.lnet.nids())?
                    }
                    Some(_) => {
                        return Err(Failure::new(
                            "add",
                            "net",
                            errno::EINVAL,
                            "--ip2net goes alone (no --nid, --net or --if)",
                        ));
                    }
                    None => ni_targets(nid.as_deref(), net.as_deref(), interfaces.as_deref())?,
                };
                let mut ni = NiConfig::new(nis[0].0);
                if let Some(t) = peer_timeout {
                    // -1: the default, as lnetctl's.
                    ni.peer_timeout = match t {
                        -1 => DEFAULT_PEER_TIMEOUT,
                        t => u32::try_from(t).map_err(|_| {
                            Failure::new(
                                "add",
                                "net",
                                errno::EINVAL,
                                format!("invalid peer timeout {t}: -1, 0 or seconds"),
                            )
                        })?,
                    };
                }
                if let Some(t) = tos {
                    ni.tos = i32::try_from(t)
                        .ok()
                        .filter(|t| (-1..=255).contains(t))
                        .ok_or_else(|| {
                            Failure::new(
                                "add",
                                "net",
                                errno::EINVAL,
                                format!("invalid ToS {t}: must be -1 to 255"),
                            )
                        })?;
                }
                if let Some(c) = credits {
                    ni.credits = c;
                }
                if let Some(c) = peer_credits {
                    ni.peer_credits = c;
                }
                if let Some(c) = peer_buffer_credits {
                    ni.peer_buffer_credits = c;
                }
                if let Some(c) = conns_per_peer {
                    if !(1..=127).contains(&c) {
                        return Err(Failure::new(
                            "add",
                            "net",
                            errno::EINVAL,
                            format!("conns_per_peer {c} is outside 1..=127"),
                        ));
                    }
                    ni.conns_per_peer = c;
                }
                // A net that exists keeps its tunables (Lustre's are the
                // net's, from its first NI; its warning goes to the log).
                if let Some(w) = self.net_tunables(&mut ni) {
                    tracing::warn!(target: "colibri_lnet_rt::ctl", "{w}");
                }
                // All the interfaces' NIs, or none: one that fails takes
                // back those added before it.
                for (i, (nid, _)) in nis.iter().enumerate() {
                    if let Err(e) = self.lnet.add_ni(NiConfig { nid: *nid, ..ni }) {
                        for (added, _) in &nis[..i] {
                            let _ = self.lnet.del_ni(*added);
                        }
                        return Err(lnet_fail("add", "net", &e));
                    }
                }
                for (nid, interface) in nis {
                    self.note_interface(nid, interface);
                }
                Ok(Doc::Null)
            }
            Command::NetDel {
                nid,
                net,
                interfaces,
            } => self.net_del(nid.as_deref(), net.as_deref(), interfaces.as_deref()),
            Command::NetSet {
                nid,
                all,
                health,
                conns_per_peer,
                net,
                lnd_timeout,
            } => {
                let lnd = match (net, lnd_timeout) {
                    (None, None) => None,
                    (Some(net), Some(t)) => {
                        let net = net_arg(&net, "set", "lnd_timeout")?;
                        let t = u32::try_from(t).map_err(|_| {
                            Failure::new(
                                "set",
                                "lnd_timeout",
                                errno::EINVAL,
                                format!("invalid LND timeout {t}: must be 0 to {}", u32::MAX),
                            )
                        })?;
                        Some((net, t))
                    }
                    (None, Some(_)) => {
                        return Err(Failure::new(
                            "set",
                            "lnd_timeout",
                            errno::EINVAL,
                            "--lnd-timeout needs --net".to_owned(),
                        ));
                    }
                    (Some(_), None) => {
                        return Err(Failure::new(
                            "set",
                            "net",
                            errno::EINVAL,
                            "--net is for --lnd-timeout".to_owned(),
                        ));
                    }
                };
                // lnetctl ignores a negative count (sanity-lnet test 230).
                let conns_per_peer = match conns_per_peer {
                    Some(c) if c < 0 => {
                        if health.is_none() && lnd.is_none() {
                            return Ok(Doc::Null);
                        }
                        None
                    }
                    Some(c) => Some(u32::try_from(c).map_err(|_| {
                        Failure::new(
                            "set",
                            "net",
                            errno::EINVAL,
                            format!("conns_per_peer {c} is outside 0..=127"),
                        )
                    })?),
                    None => None,
                };
                if lnd.is_none() || nid.is_some() || all || health.is_some() {
                    self.set_ni(NiSide::Local, nid.as_deref(), all, health, conns_per_peer)?;
                }
                if let Some((net, t)) = lnd {
                    self.lnet
                        .set_lnd_timeout(net, t)
                        .map_err(|e| lnet_fail("set", "lnd_timeout", &e))?;
                }
                Ok(Doc::Null)
            }
            Command::PeerSet {
                nid,
                all,
                health,
                state,
            } => {
                if let Some(bits) = state {
                    let fail = |msg: String| Failure::new("set", "peer_ni", errno::EINVAL, msg);
                    let one = match (nid.as_deref(), all) {
                        (Some(n), false) => nid_arg(n, "set", "peer_ni")?,
                        _ => return Err(fail("--state sets one peer: give --nid NID".into())),
                    };
                    let bits = u32::try_from(bits)
                        .map_err(|_| fail(format!("peer state {bits} is not a 32-bit flag set")))?;
                    self.lnet
                        .set_peer_state(one, bits)
                        .map_err(|e| lnet_fail("set", "peer_ni", &e))?;
                    if health.is_none() {
                        return Ok(Doc::Null);
                    }
                }
                self.set_ni(NiSide::Peer, nid.as_deref(), all, health, None)
            }
            Command::NetShow {
                net,
                verbose,
                detail,
            } => {
                let net = net.map(|n| net_arg(&n, "show", "net")).transpose()?;
                self.net_show(net, verbose || detail > 0, detail)
            }
            Command::PeerAdd {
                prim_nid,
                nids,
                non_mr,
                lock_prim,
            } => {
                let prim = nid_arg(&prim_nid, "add", "peer_ni")?;
                let nids = nid_list_arg(&nids, "add", "peer_ni")?;
                self.lnet
                    .add_peer(prim, &nids, !non_mr)
                    .map_err(|e| lnet_fail("add", "peer_ni", &e))?;
                if lock_prim {
                    self.lnet
                        .set_peer_primary_locked(prim, true)
                        .map_err(|e| lnet_fail("add", "peer_ni", &e))?;
                }
                Ok(Doc::Null)
            }
            Command::PeerDel {
                prim_nid,
                nids,
                force,
            } => {
                let prim = nid_arg(&prim_nid, "del", "peer_ni")?;
                let nids = nid_list_arg(&nids, "del", "peer_ni")?;
                // A gateway is a peer even before it has an entry (the
                // node answers EBUSY for it).
                let (known, gateway) = self.lnet.with_node(|n| {
                    (
                        n.discovery().peers().peer_of(prim).map(|p| p.primary_nid()),
                        n.routes().is_gateway(prim),
                    )
                });
                if known != Some(prim) && !gateway {
                    return Err(Failure::new(
                        "del",
                        "peer_ni",
                        errno::ENOENT,
                        format!("{prim} is not the primary NID of a peer"),
                    ));
                }
                if force {
                    self.lnet
                        .set_peer_primary_locked(prim, false)
                        .map_err(|e| lnet_fail("del", "peer_ni", &e))?;
                }
                self.lnet
                    .del_peer(prim, &nids)
                    .map_err(|e| lnet_fail("del", "peer_ni", &e))?;
                Ok(Doc::Null)
            }
            Command::PeerShow {
                nid,
                verbose,
                detail,
            } => {
                let nid = nid.map(|n| nid_arg(&n, "show", "peer")).transpose()?;
                self.peer_show(nid, verbose || detail > 0, detail)
            }
            Command::PeerList => Ok(self.lnet.with_node(|n| {
                let primaries = n.discovery().peers().peers().map(|p| p.primary_nid());
                Doc::map().with(
                    "peer list",
                    primaries
                        .chain(n.untabled_peer_nis())
                        .map(|nid| Doc::map().with("nid", nid.to_string()))
                        .collect::<Vec<_>>(),
                )
            })),
            Command::RouteAdd {
                net,
                gateway,
                hop,
                priority,
            } => {
                let net = net_arg(&net, "add", "route")?;
                // A gateway range adds a route through each (lnetctl's).
                let gws = nid_list_arg(std::slice::from_ref(&gateway), "add", "route")?;
                let hop = match hop {
                    None | Some(-1) => None,
                    Some(h @ 1..=255) => Some(u32::try_from(h).unwrap_or(1)),
                    Some(h) => {
                        return Err(Failure::new(
                            "add",
                            "route",
                            errno::EINVAL,
                            format!("hop {h} is outside 1..=255 (or -1)"),
                        ));
                    }
                };
                if self.lnet.nids().iter().any(|n| n.net() == net) {
                    return Err(Failure::new(
                        "add",
                        "route",
                        errno::EEXIST,
                        format!("route to {net}: {net} is a local net"),
                    ));
                }
                for gw in gws {
                    self.lnet
                        .add_route(net, gw, hop, priority.unwrap_or(0))
                        .map_err(|e| lnet_fail("add", "route", &e))?;
                }
                Ok(Doc::Null)
            }
            Command::RouteDel { net, gateway } => {
                let net = net_arg(&net, "del", "route")?;
                for gw in nid_list_arg(std::slice::from_ref(&gateway), "del", "route")? {
                    self.lnet
                        .del_route(net, gw)
                        .map_err(|e| lnet_fail("del", "route", &e))?;
                }
                Ok(Doc::Null)
            }
            Command::RouteShow {
                net,
                gateway,
                verbose,
            } => {
                let net = net.map(|n| net_arg(&n, "show", "route")).transpose()?;
                let gw = gateway.map(|n| nid_arg(&n, "show", "route")).transpose()?;
                Ok(self.route_show(net, gw, verbose))
            }
            Command::RoutingShow => Ok(self.routing_show()),
            Command::Set { name, value } => self.set(&name, &value),
            Command::GlobalShow => Ok(self.global_show()),
            Command::DebugRecovery { peer } => {
                // As the netlink form of `lnetctl debug recovery`: a
                // mapping `nid-0`, `nid-1`, ... under its header, and
                // ENOENT when the queue is empty.
                let (side, header) = if peer {
                    (NiSide::Peer, "Peer NI recovery")
                } else {
                    (NiSide::Local, "Local NI recovery")
                };
                let nids = self.lnet.with_node(|n| n.health().in_recovery(side));
                if nids.is_empty() {
                    return Err(Failure::new(
                        "show",
                        "recovery",
                        errno::ENOENT,
                        "No NIDs in recovery",
                    ));
                }
                let mut m = Doc::map();
                for (i, nid) in nids.iter().enumerate() {
                    m.push(&format!("nid-{i}"), nid.to_string());
                }
                Ok(Doc::map().with(header, m))
            }
            Command::LnetUnconfigure => {
                if self.st.lock().down {
                    // Already down: nothing to take away (Lustre returns 0).
                    return Ok(Doc::Null);
                }
                let out = self.unconfigure();
                // Down even if something could not be taken away: the
                // error says what, and `lnet configure` starts again.
                self.st.lock().down = true;
                out
            }
            Command::LnetConfigure { all } => {
                self.st.lock().down = false;
                if all {
                    let yaml = self.st.lock().startup.to_yaml();
                    self.import(&yaml)
                } else {
                    Ok(Doc::Null)
                }
            }
            Command::UdspAdd {
                src,
                dst,
                rte,
                priority,
                idx,
            } => {
                let fail = |e: String| Failure::new("add", "udsp", errno::EINVAL, e);
                let priority = priority
                    .map(|p| u32::try_from(p).map_err(|_| fail(format!("invalid priority {p}"))))
                    .transpose()?;
                let idx = idx
                    .map(|i| usize::try_from(i).map_err(|_| fail(format!("invalid index {i}"))))
                    .transpose()?;
                let rule = Rule::parse(src.as_deref(), dst.as_deref(), rte.as_deref(), priority)
                    .map_err(|e| fail(e.to_string()))?;
                self.lnet
                    .udsp_add(rule, idx)
                    .map_err(|e| lnet_fail("add", "udsp", &e))?;
                Ok(Doc::Null)
            }
            Command::UdspDel { idx, all } => {
                let idx = match (idx, all) {
                    (Some(_), true) => {
                        return Err(Failure::new(
                            "del",
                            "udsp",
                            errno::EINVAL,
                            "give --idx or --all, not both",
                        ));
                    }
                    (None, false) => {
                        return Err(Failure::new(
                            "del",
                            "udsp",
                            errno::EINVAL,
                            "give --idx N or --all",
                        ));
                    }
                    (None, true) | (Some(-1), false) => None,
                    (Some(i), false) => Some(usize::try_from(i).map_err(|_| {
                        Failure::new("del", "udsp", errno::EINVAL, format!("invalid index {i}"))
                    })?),
                };
                self.lnet
                    .udsp_del(idx)
                    .map_err(|e| lnet_fail("del", "udsp", &e))?;
                Ok(Doc::Null)
            }
            Command::UdspShow { idx } => {
                let rules = self.lnet.with_node(|n| n.udsp().rules().to_vec());
                let only = idx.and_then(|i| usize::try_from(i).ok());
                if let Some(i) = idx
                    && only.is_none_or(|i| i >= rules.len())
                {
                    return Err(Failure::new(
                        "show",
                        "udsp",
                        errno::ENOENT,
                        format!("no rule at index {i}"),
                    ));
                }
                let items: Vec<Doc> = rules
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| only.is_none_or(|o| o == *i))
                    .map(|(i, r)| conf::udsp_doc(i, r))
                    .collect();
                // No rule: nothing printed, as lnetctl.
                Ok(if items.is_empty() {
                    Doc::Null
                } else {
                    Doc::map().with("udsp", Doc::Seq(items))
                })
            }
            Command::DebugPeer { nid } => {
                let nid = nid_arg(&nid, "debug", "peer")?;
                Ok(self.debug_peer(nid))
            }
            Command::StatsShow => Ok(self.stats_show()),
            Command::StatsReset => {
                self.lnet.reset_stats();
                Ok(Doc::Null)
            }
            Command::Ping {
                nids,
                timeout_ms,
                source,
            } => self.ping(&nids, timeout_ms, source.as_deref(), partial),
            Command::Discover {
                nids,
                force,
                timeout_ms,
            } => self.discover(&nids, force, timeout_ms),
            Command::Export => Ok(self.export().to_doc()),
            Command::Import { yaml, del: false } => self.import(&yaml),
            Command::Import { yaml, del: true } => self.import_del(&yaml),
            Command::FaultAdd { kind, rule } => self.fault_add(kind, rule),
            Command::FaultDel {
                kind,
                source,
                dest,
                all,
            } => self.fault_del(kind, source.as_deref(), dest.as_deref(), all),
            Command::FaultShow { kind } => Ok(self.fault_show(kind)),
            Command::FaultReset { kind } => {
                self.lnet
                    .reset_fault_rules(kind == FaultKind::Drop, kind == FaultKind::Delay);
                Ok(Doc::Null)
            }
            Command::Selftest(spec) => selftest::run(self, &spec, partial),
        }
    }

    /// `net set` / `peer set`: `--health V` (and, for a local NI,
    /// `--conns-per-peer N`) of one interface (`--nid`) or of every one of
    /// its side (`--all`).
    /// `lnetctl debug peer --nid NID`: the peer NI's line of Lustre's
    /// `lnet_debug_peer` (NID, aliveness, peer credits, router credits and
    /// their low mark, send credits and their low mark, queued bytes),
    /// written to the node's log as Lustre writes it to the kernel's, and
    /// answered as a YAML mapping of the same fields. A NID the node does
    /// not know shows what a new peer NI would have (Lustre creates one),
    /// with `known: false`.
    fn debug_peer(&self, nid: Nid) -> Doc {
        self.lnet.with_node(|n| {
            let table = n.discovery().peers();
            let ni = table.ni(nid);
            let c = PeerNiCredits::of(n, nid);
            let aliveness = ni.map_or("NA", |ni| status_name(ni.status()));
            tracing::warn!(target: "colibri_lnet::debug",
                "{:<24} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5} {}",
                nid.to_string(), aliveness, c.max_tx, c.rtr, c.min_rtr, c.tx, c.min_tx,
                c.queued_bytes);
            let primary = ni
                .and_then(colibri_lnet::peer::PeerNi::peer)
                .and_then(|id| table.peer(id))
                .map_or_else(|| "none".to_owned(), |p| p.primary_nid().to_string());
            Doc::map().with(
                "peer debug",
                Doc::Seq(vec![
                    Doc::map()
                        .with("nid", nid.to_string())
                        .with("known", Doc::Bool(ni.is_some()))
                        .with("primary nid", primary)
                        .with("aliveness", aliveness)
                        .with("peer_tx_credits", c.max_tx)
                        .with("rtr_credits", c.rtr)
                        .with("min_rtr_credits", c.min_rtr)
                        .with("tx_credits", c.tx)
                        .with("min_tx_credits", c.min_tx)
                        .with("tx_q_num_of_buf", c.queued)
                        .with("tx_q_nob", c.queued_bytes),
                ]),
            )
        })
    }

    fn set_ni(
        &self,
        side: NiSide,
        nid: Option<&str>,
        all: bool,
        health: Option<i64>,
        conns_per_peer: Option<u32>,
    ) -> Result<Doc, Failure> {
        let object = match side {
            NiSide::Local => "net",
            NiSide::Peer => "peer_ni",
        };
        let fail = |errno, msg: String| Failure::new("set", object, errno, msg);
        let nid = match (nid, all) {
            (Some(_), true) => {
                return Err(fail(errno::EINVAL, "give --nid or --all, not both".into()));
            }
            (Some(n), false) => Some(nid_arg(n, "set", object)?),
            (None, true) => None,
            (None, false) => return Err(fail(errno::EINVAL, "give --nid NID or --all".into())),
        };
        let value = match health {
            None if conns_per_peer.is_none() => {
                let what = match side {
                    NiSide::Local => "give --health or --conns-per-peer",
                    NiSide::Peer => "give --health or --state",
                };
                return Err(fail(errno::EINVAL, format!("nothing to set: {what}")));
            }
            None => None,
            Some(v) if v < 0 => {
                return Err(fail(
                    errno::EINVAL,
                    format!("health value {v} is negative (0 to 1000)"),
                ));
            }
            // Above the maximum is the maximum, as in Lustre.
            Some(v) => Some(u32::try_from(v).unwrap_or(u32::MAX)),
        };
        if let Some(c) = conns_per_peer {
            self.lnet
                .set_conns_per_peer(nid, c)
                .map_err(|e| lnet_fail("set", object, &e))?;
        }
        if let Some(v) = value {
            self.lnet
                .set_ni_health(side, nid, v)
                .map_err(|e| lnet_fail("set", object, &e))?;
        }
        Ok(Doc::Null)
    }

    fn net_del(
        &self,
        nid: Option<&str>,
        net: Option<&str>,
        interfaces: Option<&str>,
    ) -> Result<Doc, Failure> {
        let nids: Vec<Nid> = match (nid, net) {
            (Some(n), _) => vec![nid_arg(n, "del", "net")?],
            (None, Some(net)) => {
                let net = net_arg(net, "del", "net")?;
                // `--if`: the net's NIs on those interfaces only.
                let names: Option<Vec<&str>> =
                    interfaces.map(|i| i.split(',').map(str::trim).collect());
                let on = self.interfaces();
                let v: Vec<Nid> = self
                    .lnet
                    .nids()
                    .into_iter()
                    .filter(|n| n.net() == net)
                    .filter(|n| {
                        names.as_ref().is_none_or(|names| {
                            on.get(n).is_some_and(|i| names.contains(&i.as_str()))
                        })
                    })
                    .collect();
                if v.is_empty() {
                    return Err(Failure::new(
                        "del",
                        "net",
                        errno::ENOENT,
                        match interfaces {
                            Some(i) => format!("no local NI of net {net} on {i}"),
                            None => format!("no local NI on net {net}"),
                        },
                    ));
                }
                v
            }
            (None, None) => {
                return Err(Failure::new(
                    "del",
                    "net",
                    errno::EINVAL,
                    "give --nid or --net",
                ));
            }
        };
        for n in nids {
            self.lnet
                .del_ni(n)
                .map_err(|e| lnet_fail("del", "net", &e))?;
        }
        Ok(Doc::Null)
    }

    fn net_show(&self, only: Option<Net>, verbose: bool, detail: u32) -> Result<Doc, Failure> {
        let cpp = self.st.lock().conns_per_peer;
        let interfaces = self.interfaces();
        let doc = self.lnet.with_node(|n| {
            let mut nets: Vec<(Net, Vec<Doc>)> = Vec::new();
            let lo = Nid::LO_0;
            // (The loopback NI's traffic is not counted apart.)
            let lo_ni = Doc::map().with("nid", lo.to_string()).with("status", "up");
            nets.push((lo.net(), vec![lo_ni]));
            for ni in &n.config().nis {
                let info = n.ni_info(ni.nid);
                let ip = std::net::Ipv4Addr::from(ni.nid.addr().to_be_bytes());
                let mut d = Doc::map()
                    .with("nid", ni.nid.to_string())
                    .with("status", info.map_or("down", |i| status_name(i.status)))
                    .with(
                        "interfaces",
                        Doc::map().with(
                            "0",
                            interfaces.get(&ni.nid).cloned().unwrap_or(ip.to_string()),
                        ),
                    );
                if verbose {
                    d.push(
                        "statistics",
                        with_latency(
                            Doc::map()
                                .with("send_count", info.map_or(0, |i| i.send_count))
                                .with("recv_count", info.map_or(0, |i| i.recv_count))
                                .with("drop_count", info.map_or(0, |i| i.drop_count)),
                            &info.map(|i| i.latency).unwrap_or_default(),
                        ),
                    );
                    if detail >= 2
                        && let Some(i) = info
                    {
                        push_by_type(&mut d, &i.sent, &i.received, &i.dropped);
                    }
                    d.push("health stats", health_stats(n, NiSide::Local, ni.nid));
                    if detail >= 4 {
                        let u = n.udsp();
                        d.push(
                            "udsp info",
                            udsp_info(
                                u.local_net_priority(ni.nid.net()),
                                u.local_ni_priority(ni.nid),
                            ),
                        );
                    }
                    d.push(
                        "tunables",
                        Doc::map()
                            .with("peer_timeout", ni.peer_timeout)
                            .with("peer_credits", ni.peer_credits)
                            .with("peer_buffer_credits", ni.peer_buffer_credits)
                            .with("credits", ni.credits),
                    );
                    let mut lnd = Doc::map().with(
                        "conns_per_peer",
                        self.lnet.conns_per_peer(ni.nid).unwrap_or(cpp),
                    );
                    // The socket LND's timeout in force
                    // (`ksocknal_timeout`) and IP type of service (-1:
                    // the system's), as Lustre's socklnd shows them.
                    if let (Some(timeout), Some(t)) =
                        (self.lnet.sock_timeout(), self.lnet.tcp_tunables())
                    {
                        lnd.push("timeout", timeout.as_secs());
                        let tos = if ni.tos >= 0 { ni.tos } else { t.tos };
                        lnd.push("tos", i64::from(tos));
                    }
                    d.push("lnd tunables", lnd);
                    d.push(
                        "tx credits",
                        Doc::map()
                            .with("available", n.tx_credits().ni_credits(ni.nid))
                            .with(
                                "min",
                                n.tx_credits()
                                    .ni(ni.nid)
                                    .map_or(i64::from(ni.credits), |q| q.min_credits()),
                            ),
                    );
                }
                match nets.iter_mut().find(|(net, _)| *net == ni.nid.net()) {
                    Some((_, v)) => v.push(d),
                    None => nets.push((ni.nid.net(), vec![d])),
                }
            }
            nets.retain(|(net, _)| only.is_none_or(|o| o == *net));
            nets
        });
        if doc.is_empty() {
            return Err(Failure::new(
                "show",
                "net",
                errno::ENOENT,
                format!(
                    "no local NI on net {}",
                    only.map(|n| n.to_string()).unwrap_or_default()
                ),
            ));
        }
        Ok(Doc::map().with(
            "net",
            doc.into_iter()
                .map(|(net, nis)| {
                    Doc::map()
                        .with("net type", net.to_string())
                        .with("local NI(s)", nis)
                })
                .collect::<Vec<_>>(),
        ))
    }

    fn peer_show(&self, only: Option<Nid>, verbose: bool, detail: u32) -> Result<Doc, Failure> {
        let peers = self.lnet.with_node(|n| {
            let table = n.discovery().peers();
            let list: Vec<_> = match only {
                Some(nid) => table.peer_of(nid).into_iter().collect(),
                None => table.peers().collect(),
            };
            let mut docs: Vec<Doc> = list
                .into_iter()
                .map(|p| {
                    let state = (
                        n.discovery().lustre_state(p.id()),
                        n.discovery().peer_state(p.id()).name(),
                    );
                    let nids: Vec<Nid> = p.nids().collect();
                    peer_doc(
                        n,
                        p.primary_nid(),
                        p.is_multi_rail(),
                        state,
                        &nids,
                        verbose,
                        detail,
                    )
                })
                .collect();
            for nid in n.untabled_peer_nis() {
                if only.is_none_or(|o| o == nid) {
                    docs.push(peer_doc(
                        n,
                        nid,
                        false,
                        (0, PeerState::Init.name()),
                        &[nid],
                        verbose,
                        detail,
                    ));
                }
            }
            docs
        });
        if let (Some(nid), true) = (only, peers.is_empty()) {
            return Err(Failure::new(
                "show",
                "peer",
                errno::ENOENT,
                format!("no peer has NID {nid}"),
            ));
        }
        Ok(Doc::map().with("peer", peers))
    }

    fn route_show(&self, net: Option<Net>, gw: Option<Nid>, verbose: bool) -> Doc {
        let routes = self.lnet.with_node(|n| {
            n.routes()
                .routes()
                .filter(|r| net.is_none_or(|x| x == r.net()) && gw.is_none_or(|g| g == r.gateway()))
                .map(|r| {
                    let mut d = Doc::map()
                        .with("net", r.net().to_string())
                        .with("gateway", r.gateway().to_string());
                    if verbose {
                        d.push("hop", r.hops().map_or(-1, i64::from));
                        d.push("priority", r.priority());
                        d.push("state", if r.is_alive() { "up" } else { "down" });
                        d.push(
                            "type",
                            match r.single_hop() {
                                Some(false) => "multi-hop",
                                _ => "single-hop",
                            },
                        );
                    }
                    d
                })
                .collect::<Vec<_>>()
        });
        Doc::map().with("route", routes)
    }

    fn routing_show(&self) -> Doc {
        self.lnet.with_node(|n| {
            let rc = n.router_credits();
            let pool = |k: PoolKind, pages: i64| {
                let q = rc.pool(k);
                Doc::map()
                    .with("npages", pages)
                    .with("nbuffers", q.max())
                    .with("credits", q.credits())
                    .with("mincredits", q.min_credits())
            };
            let cfg = n.config();
            Doc::map()
                .with(
                    "routing",
                    vec![
                        Doc::map().with(
                            "cpt[0]",
                            Doc::map()
                                .with("tiny", pool(PoolKind::Tiny, 0))
                                .with("small", pool(PoolKind::Small, 1))
                                .with("large", pool(PoolKind::Large, 256)),
                        ),
                        // Lustre's ln_routing: 2 stopping, 3 starting.
                        Doc::map().with("enable", i64::from(n.routing_state().code())),
                    ],
                )
                .with(
                    "buffers",
                    Doc::map()
                        .with("tiny", cfg.router_buffers.tiny)
                        .with("small", cfg.router_buffers.small)
                        .with("large", cfg.router_buffers.large),
                )
        })
    }

    fn global_show(&self) -> Doc {
        let conf = self.export();
        let lnd_timeout = self
            .lnet
            .with_node(|n| n.health().config().lnd_timeout().as_secs());
        let mut g = Doc::map();
        for (name, default, _) in GLOBALS {
            let v = if *name == "lnd_timeout" {
                i64::try_from(lnd_timeout).unwrap_or(i64::MAX)
            } else {
                conf.global.get(*name).copied().unwrap_or(*default)
            };
            g.push(name, v);
        }
        g.push(
            "accept_port",
            conf.accept_port.unwrap_or(conf::DEFAULT_ACCEPT_PORT),
        );
        let port = conf.accept_port.unwrap_or(conf::DEFAULT_ACCEPT_PORT);
        g.push("accept_port_bulk", conf.accept_port_bulk.unwrap_or(port));
        g.push("accept", conf::accept_name(conf.accept.unwrap_or_default()));
        Doc::map().with("global", g)
    }

    fn stats_show(&self) -> Doc {
        let (s, hs) = self.lnet.with_node(|n| (n.stats(), *n.health().stats()));
        let mut d = Doc::map()
            .with("msgs_alloc", s.msgs_alloc)
            .with("msgs_max", s.msgs_max)
            .with("rst_alloc", s.rst_alloc)
            .with("errors", s.protocol_errors)
            .with("send_count", s.send_count)
            .with("resend_count", s.resend_count)
            .with("response_timeout_count", s.response_timeout_count);
        for (i, st) in HealthStatus::ALL.iter().enumerate() {
            if let Some(k) = health_status_key(*st) {
                d.push(k, hs.by_status.get(i).copied().unwrap_or(0));
            }
        }
        d.push("failed_resends", hs.failed_resends);
        d.push("successful_resends", hs.successful_resends);
        d.push("recv_count", s.recv_count);
        d.push("route_count", s.route_count);
        d.push("drop_count", s.drop_count);
        d.push("send_length", s.send_length);
        d.push("recv_length", s.recv_length);
        d.push("route_length", s.route_length);
        d.push("drop_length", s.drop_length);
        Doc::map().with("statistics", d)
    }

    fn set(&self, name: &str, value: &str) -> Result<Doc, Failure> {
        let v: i64 = value.trim().parse().map_err(|_| {
            Failure::new(
                "set",
                name,
                errno::EINVAL,
                format!("{name}: '{value}' is not a number"),
            )
        })?;
        let bad = |what: &str| Failure::new("set", name, errno::EINVAL, format!("{name}: {what}"));
        let u32v = || u32::try_from(v).map_err(|_| bad(&format!("{v} is out of range")));
        let flag = || match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad("expected 0 or 1")),
        };
        let lf = |e: LnetError| lnet_fail("set", name, &e);
        match name {
            "routing" => self.lnet.set_routing(flag()?).map_err(lf)?,
            "discovery" => self.lnet.set_discovery(flag()?).map_err(lf)?,
            "retry_count" | "transaction_timeout" | "health_sensitivity" => {
                let c = self.lnet.with_node(|n| n.config().clone());
                let (mut sens, mut retry, mut tt) =
                    (c.health_sensitivity, c.retry_count, c.transaction_timeout);
                match name {
                    "retry_count" => retry = u32v()?,
                    "transaction_timeout" => {
                        if v < 1 {
                            return Err(bad("must be at least 1"));
                        }
                        tt = Duration::from_secs(u64::from(u32v()?));
                    }
                    _ => {
                        sens = u32v()?;
                        // Turning health off turns resends off
                        // (Lustre's `sensitivity_set`).
                        if sens == 0 {
                            retry = 0;
                        }
                    }
                }
                self.lnet.set_health(sens, retry, tt).map_err(lf)?;
            }
            "drop_asym_route" => self.lnet.set_drop_asym_route(flag()?).map_err(lf)?,
            "response_tracking" => {
                let mode = u32::try_from(v)
                    .ok()
                    .and_then(ResponseTracking::from_level)
                    .ok_or_else(|| bad("expected 0 (none), 1 (GET), 2 (PUT) or 3 (both)"))?;
                self.lnet.set_response_tracking(mode).map_err(lf)?;
            }
            "recovery_limit" | "max_recovery_ping_interval" => {
                let c = self.lnet.with_node(|n| n.config().clone());
                let (mut limit, mut max) = (c.recovery_limit, c.max_recovery_ping_interval);
                let secs = Duration::from_secs(u64::from(u32v()?));
                if name == "recovery_limit" {
                    limit = (!secs.is_zero()).then_some(secs);
                } else {
                    if secs.is_zero() {
                        return Err(bad("must be at least 1"));
                    }
                    max = secs;
                }
                self.lnet.set_recovery(limit, max).map_err(lf)?;
            }
            "alive_router_check_interval" => {
                let secs = Duration::from_secs(u64::from(u32v()?));
                self.lnet.set_router_check_interval(secs).map_err(lf)?;
            }
            "router_ping_timeout" => {
                let secs = u32v()?;
                if secs == 0 {
                    return Err(bad("must be at least 1"));
                }
                let secs = Duration::from_secs(u64::from(secs));
                self.lnet.set_router_ping_timeout(secs).map_err(lf)?;
            }
            "avoid_asym_router_failure" => {
                self.lnet
                    .set_avoid_asym_router_failure(flag()?)
                    .map_err(lf)?;
            }
            "check_routers_before_use" => {
                self.lnet
                    .set_check_routers_before_use(flag()?)
                    .map_err(lf)?;
            }
            "max_interfaces" | "max_intf" => {
                let n = u32v()?;
                if n < 16 {
                    return Err(bad("must be at least 16 (LNET_INTERFACES_MIN)"));
                }
                self.lnet.set_max_interfaces(n).map_err(lf)?;
            }
            "tiny_buffers" | "small_buffers" | "large_buffers" => {
                let kind = match name {
                    "tiny_buffers" => PoolKind::Tiny,
                    "small_buffers" => PoolKind::Small,
                    _ => PoolKind::Large,
                };
                self.lnet.set_router_buffers(kind, u32v()?).map_err(lf)?;
            }
            other => {
                let Some((_, _, false)) = GLOBALS.iter().find(|g| g.0 == other) else {
                    return Err(Failure::new(
                        "set",
                        other,
                        errno::EINVAL,
                        format!("unknown setting '{other}'"),
                    ));
                };
                if other == "lnd_timeout" {
                    return Err(bad("derived from transaction_timeout and retry_count"));
                }
                conf::check_global(other, v, other).map_err(|e| conf_fail("set", other, &e))?;
                self.st.lock().extra.insert(other.to_owned(), v);
                if let Some(why) = conf::no_effect_reason(other) {
                    tracing::warn!(target: "colibri_lnet_rt::ctl", setting = other, value = v, "{why}");
                    return Ok(Doc::map().with(
                        "warnings",
                        vec![Doc::from(format!(
                            "{other} = {v}: recorded, but has no effect on this node ({why})"
                        ))],
                    ));
                }
            }
        }
        Ok(Doc::Null)
    }

    fn ping(
        &self,
        nids: &[String],
        timeout_ms: u64,
        source: Option<&str>,
        partial: &mut dyn FnMut(Doc) -> bool,
    ) -> Result<Doc, Failure> {
        let source = match source {
            Some(src) => {
                let src = nid_arg(src, "manage", "ping")?;
                if !self.lnet.nids().contains(&src) {
                    return Err(Failure::new(
                        "manage",
                        "ping",
                        errno::EINVAL,
                        format!("source {src} is not a local NI"),
                    ));
                }
                Some(src)
            }
            None => None,
        };
        let targets = nid_list_arg(nids, "manage", "ping")?;
        if targets.is_empty() {
            return Err(Failure::new(
                "manage",
                "ping",
                errno::EINVAL,
                "no NID to ping",
            ));
        }
        let timeout = Duration::from_millis(timeout_ms.max(1));
        let mut out = Vec::new();
        for nid in targets {
            match self.lnet.ping_from(nid, source, timeout) {
                Ok(info) => out.push(ping_doc(&info)),
                Err(e) => {
                    if !out.is_empty() {
                        partial(Doc::map().with("ping", std::mem::take(&mut out)));
                    }
                    let descr = match e {
                        LnetError::TimedOut => {
                            format!("failed to ping {nid}: timed out after {timeout:?}")
                        }
                        e => format!("failed to ping {nid}: {e}"),
                    };
                    return Err(Failure::new("manage", "ping", errno::EHOSTUNREACH, descr));
                }
            }
        }
        Ok(Doc::map().with("ping", out))
    }

    fn discover(&self, nids: &[String], force: bool, timeout_ms: u64) -> Result<Doc, Failure> {
        let targets = nid_list_arg(nids, "manage", "discover")?;
        let mut out = Vec::new();
        for nid in targets {
            if nid == Nid::LO_0 {
                // Lustre makes a loopback peer with discovery off
                // (`lnet_peer_alloc`: "no need to ever use a different
                // interface when sending messages to myself") and answers
                // with it (sanity-lnet 217); here 0@lo is no peer of the
                // table, and its answer is the same.
                out.push(
                    Doc::map()
                        .with("primary nid", nid.to_string())
                        .with("Multi-Rail", Doc::Bool(false))
                        .with("peer ni", vec![Doc::map().with("nid", nid.to_string())]),
                );
                continue;
            }
            self.lnet
                .discover(nid, force)
                .map_err(|e| lnet_fail("manage", "discover", &e))?;
            // Discovery runs in the node; its end shows in the peer table.
            let deadline = Instant::now() + Duration::from_millis(timeout_ms.max(1));
            let info = loop {
                let done = self.lnet.with_node(|n| {
                    let d = n.discovery();
                    let st = d.state_of(nid);
                    let failed = d.last_error(nid).map(ToString::to_string);
                    (st, failed, d.peers().peer_of(nid).cloned())
                });
                match done {
                    (PeerState::Active, _, Some(p)) => break Ok(p),
                    (PeerState::Verify, Some(err), _) => break Err(err),
                    _ if Instant::now() >= deadline => break Err("timed out".to_owned()),
                    _ => std::thread::sleep(Duration::from_millis(10)),
                }
            };
            match info {
                Ok(p) => out.push(
                    Doc::map()
                        .with("primary nid", p.primary_nid().to_string())
                        .with("Multi-Rail", Doc::Bool(p.is_multi_rail()))
                        .with(
                            "peer ni",
                            p.nids()
                                .map(|n| Doc::map().with("nid", n.to_string()))
                                .collect::<Vec<_>>(),
                        ),
                ),
                Err(why) => {
                    return Err(Failure::new(
                        "manage",
                        "discover",
                        errno::EHOSTUNREACH,
                        format!("failed to discover {nid}: {why}"),
                    ));
                }
            }
        }
        Ok(Doc::map().with("discover", out))
    }

    /// `lnetctl import --del`: takes away what the file describes, as
    /// Lustre's `lookup_del_tbl` does: its NIs; each peer whole when its
    /// `peer ni` list is absent or names the primary NID, else the NIs
    /// listed; its routes; routing off when the file has a `routing`
    /// section; the `global` values it names back to their defaults
    /// (discovery on, asymmetric routes accepted, `max_interfaces` 200,
    /// `numa_range` 0; Lustre resets only these). Buffers stay.
    /// `lnetctl lnet unconfigure`: everything the node was configured
    /// with goes, as Lustre's `LNetNIFini` takes LNet down: its NIs (and so
    /// their connections), routes, peers (configured, locked, discovered
    /// or known from traffic), selection policies and fault rules; routing
    /// off; counters zeroed. Globals and router buffer sizes stay, as
    /// Lustre's module parameters do. The node keeps running with `0@lo`
    /// only, its control socket open, and refuses every command but `lnet
    /// configure` (which brings it up with `0@lo`, and with `--all` the
    /// startup configuration again) and `lnet unconfigure`.
    fn unconfigure(&self) -> Result<Doc, Failure> {
        let mut conf = self.export();
        conf.global.clear();
        conf.buffers = [None; 3];
        let warn = self.import_del(&conf.to_yaml())?;
        // LNet going down stops forwarding at once, not gracefully.
        self.lnet
            .disable_routing_now()
            .map_err(|e| lnet_fail("unconfigure", "routing", &e))?;
        // What the export does not hold.
        let peers: Vec<Nid> = self.lnet.with_node(|n| {
            n.discovery()
                .peers()
                .peers()
                .map(colibri_lnet::peer::Peer::primary_nid)
                .collect()
        });
        for p in peers {
            let _ = self.lnet.set_peer_primary_locked(p, false);
            self.lnet
                .del_peer(p, &[])
                .map_err(|e| lnet_fail("unconfigure", "peer", &e))?;
        }
        let faults = std::mem::take(&mut self.st.lock().faults);
        for f in &faults {
            self.lnet.remove_fault_rule(f.id);
        }
        self.lnet.forget_traffic_peers();
        self.lnet.reset_stats();
        Ok(warn)
    }

    fn import_del(&self, yaml: &str) -> Result<Doc, Failure> {
        let (c, warn) = NodeConf::from_yaml(yaml).map_err(|e| conf_fail("import", "config", &e))?;
        // Selection policies: the rule with the same criteria and action.
        for r in &c.udsp {
            let at = self
                .lnet
                .with_node(|n| n.udsp().rules().iter().position(|x| x == r));
            if let Some(i) = at {
                self.lnet
                    .udsp_del(Some(i))
                    .map_err(|e| lnet_fail("import", "udsp", &e))?;
            }
        }
        for r in &c.routes {
            self.lnet
                .del_route(r.net, r.gateway)
                .map_err(|e| lnet_fail("import", "route", &e))?;
        }
        for p in &c.peers {
            self.lnet
                .del_peer(p.primary, &p.nids)
                .map_err(|e| lnet_fail("import", "peer", &e))?;
        }
        for ni in &c.nis {
            self.lnet
                .del_ni(ni.nid)
                .map_err(|e| lnet_fail("import", "net", &e))?;
        }
        if c.routing.is_some() {
            self.lnet
                .set_routing(false)
                .map_err(|e| lnet_fail("import", "routing", &e))?;
        }
        for (name, default) in [
            ("discovery", "1"),
            ("drop_asym_route", "0"),
            ("max_interfaces", "200"),
            ("numa_range", "0"),
        ] {
            if c.global.contains_key(name) {
                self.set(name, default)?;
            }
        }
        Ok(warnings(warn))
    }

    /// Gives `ni`, about to be added, the LNet tunables (`credits`,
    /// `peer_credits`, `peer_buffer_credits`, `peer_timeout`) of the NIs
    /// its net has already, as Lustre keeps them per net; the warning
    /// Lustre logs when they differed.
    fn net_tunables(&self, ni: &mut NiConfig) -> Option<String> {
        let net = ni.nid.net();
        let first = self.lnet.with_node(|n| {
            n.config()
                .nis
                .iter()
                .find(|x| x.nid.net() == net && x.nid != ni.nid)
                .cloned()
        })?;
        let (mine, theirs) = (ni.net_tunables(), first.net_tunables());
        ni.set_net_tunables(theirs);
        (mine != theirs).then(|| {
            format!(
                "net: all tunables of NIs of a net should be the same: {} takes those of {net} (credits {}, peer_credits {}, peer_buffer_credits {}, peer_timeout {})",
                ni.nid, theirs[0], theirs[1], theirs[2], theirs[3]
            )
        })
    }

    fn import(&self, yaml: &str) -> Result<Doc, Failure> {
        let (c, mut warn) =
            NodeConf::from_yaml(yaml).map_err(|e| conf_fail("import", "config", &e))?;
        let have: Vec<NiConfig> = self.lnet.with_node(|n| n.config().nis.clone());
        for ni in &c.nis {
            if let Some(h) = have.iter().find(|h| h.nid == ni.nid) {
                let cpp = self.lnet.conns_per_peer(h.nid).unwrap_or(0);
                if h.net_tunables() != ni.to_ni_config().net_tunables()
                    || ni.conns_per_peer.is_some_and(|c| c != cpp)
                    || ni.tos.unwrap_or(-1) != h.tos
                {
                    warn.push(format!(
                        "net: {} exists; its tunables are those it was added with (credits {}, peer_credits {}, peer_buffer_credits {}, peer_timeout {}, conns_per_peer {cpp}, tos {}), unchanged: delete and add it to change them",
                        ni.nid, h.credits, h.peer_credits, h.peer_buffer_credits, h.peer_timeout, h.tos
                    ));
                }
                continue;
            }
            let mut cfg = ni.to_ni_config();
            if let Some(w) = self.net_tunables(&mut cfg) {
                tracing::warn!(target: "colibri_lnet_rt::ctl", "{w}");
                warn.push(w);
            }
            self.lnet
                .add_ni(cfg)
                .map_err(|e| lnet_fail("import", "net", &e))?;
            self.note_interface(ni.nid, ni.interface.clone());
        }
        if c.accept_port
            .is_some_and(|p| p != self.st.lock().accept_port)
            || c.accept_port_bulk
                .is_some_and(|p| Some(p) != self.st.lock().accept_port_bulk)
            || c.accept.is_some_and(|a| a != self.st.lock().accept)
        {
            warn.push(
                "global: accept_port, accept_port_bulk and accept are set when the node starts; unchanged".into(),
            );
        }
        for p in &c.peers {
            let exists = self.lnet.with_node(|n| {
                n.discovery().peers().peer_of(p.primary).is_some_and(|x| {
                    x.primary_nid() == p.primary && p.nids.iter().all(|nid| x.contains(*nid))
                })
            });
            if exists {
                continue;
            }
            let nids: Vec<Nid> = p.nids.iter().copied().filter(|n| *n != p.primary).collect();
            self.lnet
                .add_peer(p.primary, &nids, p.multi_rail)
                .map_err(|e| lnet_fail("import", "peer", &e))?;
        }
        for r in &c.routes {
            let exists = self
                .lnet
                .with_node(|n| n.routes_to(r.net).iter().any(|x| x.gateway() == r.gateway));
            if !exists {
                self.lnet
                    .add_route(r.net, r.gateway, r.hop, r.priority)
                    .map_err(|e| lnet_fail("import", "route", &e))?;
            }
        }
        for r in &c.udsp {
            match self.lnet.udsp_add(r.clone(), None) {
                // There already: an import adds what is missing.
                Err(e) if e.errno() == errno::EALREADY => {}
                other => {
                    other.map_err(|e| lnet_fail("import", "udsp", &e))?;
                }
            }
        }
        if let Some(on) = c.routing {
            self.lnet
                .set_routing(on)
                .map_err(|e| lnet_fail("import", "routing", &e))?;
        }
        for (name, v) in ["tiny_buffers", "small_buffers", "large_buffers"]
            .iter()
            .zip(c.buffers)
        {
            if let Some(v) = v {
                self.set(name, &v.to_string())?;
            }
        }
        for (name, v) in &c.global {
            if name == "lnd_timeout" {
                continue;
            }
            self.set(name, &v.to_string())?;
        }
        Ok(warnings(warn))
    }

    fn fault_add(&self, kind: FaultKind, a: FaultArgs) -> Result<Doc, Failure> {
        let obj = match kind {
            FaultKind::Drop => "drop",
            FaultKind::Delay => "delay",
        };
        let bad = |what: String| Failure::new("add", obj, errno::EINVAL, what);
        let src = any_nid(a.source.as_deref(), "add", obj)?;
        let dst = any_nid(a.dest.as_deref(), "add", obj)?;
        let local = any_nid(a.local.as_deref(), "add", obj)?;
        let trigger = match (a.rate, a.interval) {
            (Some(0), _) => return Err(bad("--rate must be at least 1".into())),
            (Some(r), None) => Trigger::Rate(r),
            (None, Some(0)) => return Err(bad("--interval must be at least 1".into())),
            (None, Some(i)) => Trigger::Interval(Duration::from_secs(i)),
            _ => return Err(bad("give exactly one of --rate and --interval".into())),
        };
        let mut m = FaultMatch::between(src, dst);
        m.local = local;
        for p in &a.portals {
            if *p >= 64 {
                return Err(bad(format!("portal {p} is outside 0..64")));
            }
            m = m.portal(*p);
        }
        let mut mask = MsgMask(0);
        for t in &a.messages {
            mask = mask.with(match t.to_ascii_lowercase().as_str() {
                "put" => colibri_lnet::wire::MsgType::Put,
                "ack" => colibri_lnet::wire::MsgType::Ack,
                "get" => colibri_lnet::wire::MsgType::Get,
                "reply" => colibri_lnet::wire::MsgType::Reply,
                other => {
                    return Err(bad(format!(
                        "message type '{other}': expected put, ack, get or reply"
                    )));
                }
            });
        }
        m = m.types(mask);
        let id = match kind {
            FaultKind::Drop => {
                if a.latency.is_some() {
                    return Err(bad("--latency is for delay rules".into()));
                }
                let mut errs = Vec::new();
                for h in &a.health_errors {
                    let e = HealthError::ALL
                        .iter()
                        .find(|e| health_error_name(**e) == h.to_ascii_lowercase())
                        .ok_or_else(|| {
                            bad(format!(
                                "health error '{h}': expected one of {}",
                                HealthError::ALL
                                    .iter()
                                    .map(|e| health_error_name(*e))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ))
                        })?;
                    errs.push(*e);
                }
                self.lnet
                    .add_drop_rule(DropRuleSpec {
                        matcher: m,
                        trigger,
                        health_mask: HealthError::mask(&errs),
                    })
                    .map_err(|e| lnet_fail("add", obj, &e))?
            }
            FaultKind::Delay => {
                if !a.health_errors.is_empty() {
                    return Err(bad("--health_error is for drop rules".into()));
                }
                let Some(lat) = a.latency.filter(|l| *l > 0) else {
                    return Err(bad("delay rules need --latency SECS (at least 1)".into()));
                };
                self.lnet
                    .add_delay_rule(DelayRuleSpec {
                        matcher: m,
                        trigger,
                        latency: Duration::from_secs(lat),
                    })
                    .map_err(|e| lnet_fail("add", obj, &e))?
            }
        };
        self.st.lock().faults.push(FaultEntry {
            id,
            kind,
            src,
            dst,
            args: a,
        });
        Ok(Doc::Null)
    }

    fn fault_del(
        &self,
        kind: FaultKind,
        source: Option<&str>,
        dest: Option<&str>,
        all: bool,
    ) -> Result<Doc, Failure> {
        let obj = match kind {
            FaultKind::Drop => "drop",
            FaultKind::Delay => "delay",
        };
        if !all && source.is_none() && dest.is_none() {
            return Err(Failure::new(
                "del",
                obj,
                errno::EINVAL,
                "give --all, or --source and/or --dest",
            ));
        }
        let src = any_nid(source, "del", obj)?;
        let dst = any_nid(dest, "del", obj)?;
        let mut st = self.st.lock();
        let (gone, keep): (Vec<FaultEntry>, Vec<FaultEntry>) =
            std::mem::take(&mut st.faults).into_iter().partition(|f| {
                f.kind == kind
                    && (all || ((src.is_any() || f.src == src) && (dst.is_any() || f.dst == dst)))
            });
        st.faults = keep;
        drop(st);
        if gone.is_empty() {
            return Err(Failure::new("del", obj, errno::ENOENT, "no matching rule"));
        }
        for f in &gone {
            self.lnet.remove_fault_rule(f.id);
        }
        Ok(Doc::map().with("removed", gone.len()))
    }

    fn fault_show(&self, kind: Option<FaultKind>) -> Doc {
        let faults = self.st.lock().faults.clone();
        let rules = faults
            .iter()
            .filter(|f| kind.is_none_or(|k| k == f.kind))
            .map(|f| {
                let st = self.lnet.fault_stats(f.id).unwrap_or_default();
                let mut d = Doc::map()
                    .with(
                        "rule type",
                        match f.kind {
                            FaultKind::Drop => "drop",
                            FaultKind::Delay => "delay",
                        },
                    )
                    .with("source", nid_text(f.src))
                    .with("dest", nid_text(f.dst));
                if let Some(l) = &f.args.local {
                    d.push("local", l.as_str());
                }
                match (f.args.rate, f.args.interval) {
                    (Some(r), _) => d.push("rate", r),
                    (_, Some(i)) => d.push("interval", i),
                    _ => {}
                }
                if !f.args.portals.is_empty() {
                    d.push(
                        "portal",
                        f.args
                            .portals
                            .iter()
                            .map(|p| Doc::from(*p))
                            .collect::<Vec<_>>(),
                    );
                }
                if !f.args.messages.is_empty() {
                    d.push("message", f.args.messages.join(","));
                }
                if let Some(l) = f.args.latency {
                    d.push("latency", l);
                }
                if !f.args.health_errors.is_empty() {
                    d.push("health_error", f.args.health_errors.join(","));
                }
                d.push(
                    "statistics",
                    Doc::map()
                        .with("matched", st.matched)
                        .with("put", st.put)
                        .with("ack", st.ack)
                        .with("get", st.get)
                        .with("reply", st.reply)
                        .with(
                            match f.kind {
                                FaultKind::Drop => "dropped",
                                FaultKind::Delay => "delayed",
                            },
                            st.fired,
                        ),
                );
                d
            })
            .collect::<Vec<_>>();
        Doc::map().with("fault", rules)
    }
}

/// `sent_stats`, `received_stats`, `dropped_stats` (`lnetctl … -v 2+`).
fn push_by_type(
    d: &mut Doc,
    sent: &MsgTypeCounts,
    received: &MsgTypeCounts,
    dropped: &MsgTypeCounts,
) {
    let by = |c: &MsgTypeCounts| {
        Doc::map()
            .with("put", c.put)
            .with("get", c.get)
            .with("reply", c.reply)
            .with("ack", c.ack)
            .with("hello", c.hello)
    };
    d.push("sent_stats", by(sent));
    d.push("received_stats", by(received));
    d.push("dropped_stats", by(dropped));
}

/// `udsp info` of `net show -v 4` and `peer show -v 4`: the priorities
/// the selection policies give the interface's net and the interface
/// (-1: none), as lnetctl prints them.
fn udsp_info(net_priority: u32, nid_priority: u32) -> Doc {
    let show = |p: u32| {
        if p == colibri_lnet::udsp::DEFAULT_PRIORITY {
            -1
        } else {
            i64::from(p)
        }
    };
    Doc::map()
        .with("net priority", show(net_priority))
        .with("nid priority", show(nid_priority))
}

/// A peer NI's credits as `peer show -v` and `debug peer` print them.
struct PeerNiCredits {
    max_tx: i64,
    tx: i64,
    min_tx: i64,
    /// Messages waiting for a credit.
    queued: usize,
    /// Bytes queued to it (`lpni_txqnob`).
    queued_bytes: u64,
    rtr: i64,
    min_rtr: i64,
}

impl PeerNiCredits {
    fn of(n: &Node, nid: Nid) -> Self {
        use colibri_lnet::credits::CreditQueue;
        // A peer NI on a net we have no NI on gets no credits (Lustre's
        // lnet_peer_ni_alloc without a local net).
        let local = n.is_local_net(nid.net());
        let t = n.tx_credits().tunables(nid.net());
        let tx = n.tx_credits().peer_ni(nid);
        let rtr = n.router_credits().peer(nid);
        let max_tx = if local {
            tx.map_or(i64::from(t.peer_credits), |q| i64::from(q.max()))
        } else {
            0
        };
        let max_rtr = if local {
            i64::from(t.router_credits())
        } else {
            0
        };
        Self {
            max_tx,
            tx: tx.map_or(max_tx, CreditQueue::credits),
            min_tx: tx.map_or(max_tx, CreditQueue::min_credits),
            queued: tx.map_or(0, CreditQueue::queued),
            queued_bytes: n.tx_credits().queued_bytes(nid),
            rtr: rtr.map_or(max_rtr, CreditQueue::credits),
            min_rtr: rtr.map_or(max_rtr, CreditQueue::min_credits),
        }
    }
}

fn peer_doc(
    n: &Node,
    primary: Nid,
    multi_rail: bool,
    (bits, state): (u32, &str),
    nids: &[Nid],
    verbose: bool,
    detail: u32,
) -> Doc {
    let table = n.discovery().peers();
    let mut d = Doc::map()
        .with("primary nid", primary.to_string())
        .with("Multi-Rail", Doc::Bool(multi_rail));
    if verbose {
        // Lustre's lp_state flags (273: a discovered Multi-Rail peer), and
        // the discovery design's state they come from.
        d.push("peer state", bits);
        d.push("discovery state", state);
    }
    let nis = nids
        .iter()
        .map(|&nid| {
            // Down when the LND said so (and nothing came from it since),
            // as Lustre's `lpni_ns_status`; else what its ping data says.
            let state = if n.peer_ni_down(nid) {
                "down"
            } else {
                table.ni(nid).map_or("NA", |x| status_name(x.status()))
            };
            let mut ni = Doc::map().with("nid", nid.to_string()).with("state", state);
            if verbose {
                let c = PeerNiCredits::of(n, nid);
                ni.push("max_ni_tx_credits", c.max_tx);
                ni.push("available_tx_credits", c.tx);
                ni.push("min_tx_credits", c.min_tx);
                ni.push("tx_q_num_of_buf", c.queued);
                ni.push("available_rtr_credits", c.rtr);
                ni.push("min_rtr_credits", c.min_rtr);
                let s = n.peer_ni_stats(nid).unwrap_or_default();
                ni.push(
                    "statistics",
                    with_latency(
                        Doc::map()
                            .with("send_count", s.send_count)
                            .with("recv_count", s.recv_count)
                            .with("drop_count", s.drop_count)
                            .with("send_length", s.send_length)
                            .with("recv_length", s.recv_length),
                        &s.latency,
                    ),
                );
                if detail >= 2 {
                    push_by_type(&mut ni, &s.sent, &s.received, &s.dropped);
                }
                ni.push("health stats", health_stats(n, NiSide::Peer, nid));
                if detail >= 4 {
                    let u = n.udsp();
                    ni.push(
                        "udsp info",
                        udsp_info(u.peer_net_priority(nid.net()), u.peer_ni_priority(nid)),
                    );
                }
            }
            ni
        })
        .collect::<Vec<_>>();
    d.push("peer ni", nis);
    d
}
