//! A deterministic fabric simulator for [`Node`]s.
//!
//! The simulator owns several nodes with NIs on several nets, a virtual clock
//! and a seeded scheduler. It plays the LNDs: every [`Transmit`](crate::node::Transmit) a node emits
//! is carried, **as encoded bytes**, to the node owning the next-hop NID
//! (which must be on the same net as the sending NI), after the net's latency
//! plus a seeded jitter, and is fed to that node's [`Node::handle_receive`],
//! so every message crosses the real encoders and decoders. The sender gets
//! [`Node::handle_tx_done`] when the message is delivered (LNDs are
//! connection-oriented), or a health error when it cannot be:
//!
//! | situation | sender sees |
//! |---|---|
//! | delivered | `Ok` |
//! | sending NI marked down ([`Sim::set_ni_down`]) | `LocalDropped` |
//! | next-hop NI marked down | `RemoteDropped` |
//! | no node owns the next-hop NID, or it is on another net | `RemoteError` |
//!
//! Fault rules live in the nodes ([`Node::add_drop_rule`]), as in LNet.
//!
//! The same seed and the same inputs replay the same run, event for event
//! ([`Sim::trace`]). Runs are bounded: [`Sim::run_until`] and
//! [`Sim::run_until_idle`] fail with [`SimError::StepLimit`] instead of
//! spinning forever, so a livelock becomes a test failure.
//!
//! ```
//! use std::time::Duration;
//! use colibri_lnet::sim::{Sim, Topology};
//!
//! let topo = Topology::new(7)
//!     .node("a", &["10.0.0.1@tcp"])
//!     .node("b", &["10.0.0.2@tcp"])
//!     .latency("tcp", Duration::from_micros(20));
//! let mut sim = Sim::new(topo)?;
//! let b = "10.0.0.2@tcp".parse()?;
//! sim.with_node("a", |node, now| node.ping(now, b))?;
//! sim.run_until_idle()?;
//! let result = sim.node_mut("a").poll_ping_result().expect("ping finished");
//! assert_eq!(result.result.unwrap().primary_nid(), Some(b));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::fault::HealthError;
use crate::ids::{IdError, Net, Nid};
use crate::matching::Event;
use crate::node::{NiConfig, Node, NodeConfig, NodeError, TxId};
use crate::rng::Rng;
use crate::time::Time;

/// Errors building or running a simulation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A NID or net in the topology did not parse.
    #[error("topology: {0}")]
    Id(#[from] IdError),
    /// A node rejected its configuration.
    #[error("node {name}: {error}")]
    Node {
        /// The node.
        name: String,
        /// The error.
        error: NodeError,
    },
    /// Two nodes (or two NIs) claim the same NID.
    #[error("NID {0} is configured twice")]
    DuplicateNid(Nid),
    /// Two nodes have the same name.
    #[error("node name {0:?} used twice")]
    DuplicateName(String),
    /// The run did not settle within the step budget (a livelock).
    #[error("step limit of {0} reached: the run does not settle")]
    StepLimit(u64),
    /// A line of a textual topology could not be understood.
    #[error("topology line {line}: {msg}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
}

/// A description of the fabric: nodes, their NIs, per-net latency.
#[derive(Clone, Debug)]
pub struct Topology {
    seed: u64,
    nodes: Vec<(String, NodeConfig)>,
    latency: BTreeMap<Net, Duration>,
    default_latency: Duration,
    jitter: Duration,
    max_steps: u64,
    routes: Vec<RouteSpec>,
    errors: Vec<SimError>,
}

/// A route to install on a node when the simulation starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RouteSpec {
    node: usize,
    net: Net,
    gateway: Nid,
    hops: Option<u32>,
    priority: u32,
}

impl Topology {
    /// An empty fabric; `seed` drives every random choice of the run.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            nodes: Vec::new(),
            latency: BTreeMap::new(),
            default_latency: Duration::from_micros(10),
            jitter: Duration::from_micros(2),
            max_steps: 1_000_000,
            routes: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Adds a node with Lustre defaults and the given NIDs (first = primary).
    #[must_use]
    pub fn node(mut self, name: &str, nids: &[&str]) -> Self {
        let mut nis = Vec::new();
        for s in nids {
            match s.parse::<Nid>() {
                Ok(n) => nis.push(NiConfig::new(n)),
                Err(e) => self.errors.push(e.into()),
            }
        }
        self.nodes.push((name.to_owned(), NodeConfig::new(nis)));
        self
    }

    /// Adds a node with a full configuration.
    #[must_use]
    pub fn node_with(mut self, name: &str, cfg: NodeConfig) -> Self {
        self.nodes.push((name.to_owned(), cfg));
        self
    }

    /// Changes the configuration of an already added node.
    #[must_use]
    pub fn configure(mut self, name: &str, f: impl FnOnce(&mut NodeConfig)) -> Self {
        if let Some((_, cfg)) = self.nodes.iter_mut().find(|(n, _)| n == name) {
            f(cfg);
        }
        self
    }

    /// Adds a route on node `name` (which must already be added) to `net`
    /// through `gateway` (`lnetctl route add`).
    #[must_use]
    pub fn route(
        mut self,
        name: &str,
        net: &str,
        gateway: &str,
        hops: Option<u32>,
        priority: u32,
    ) -> Self {
        let Some(node) = self.nodes.iter().position(|(n, _)| n == name) else {
            self.errors.push(SimError::Parse {
                line: 0,
                msg: format!("route on unknown node {name:?}"),
            });
            return self;
        };
        match (net.parse::<Net>(), gateway.parse::<Nid>()) {
            (Ok(net), Ok(gateway)) => self.routes.push(RouteSpec {
                node,
                net,
                gateway,
                hops,
                priority,
            }),
            (Err(e), _) | (_, Err(e)) => self.errors.push(e.into()),
        }
        self
    }

    /// One-way latency on `net` (e.g. `"tcp"`, `"o2ib1"`).
    #[must_use]
    pub fn latency(mut self, net: &str, d: Duration) -> Self {
        match net.parse::<Net>() {
            Ok(n) => {
                self.latency.insert(n, d);
            }
            Err(e) => self.errors.push(e.into()),
        }
        self
    }

    /// Latency of nets without an explicit one.
    #[must_use]
    pub fn default_latency(mut self, d: Duration) -> Self {
        self.default_latency = d;
        self
    }

    /// Maximum random extra delay per message (seeded).
    #[must_use]
    pub fn jitter(mut self, d: Duration) -> Self {
        self.jitter = d;
        self
    }

    /// Step budget of each run call ([`Sim::run_until`], [`Sim::run_until_idle`], …).
    #[must_use]
    pub fn max_steps(mut self, n: u64) -> Self {
        self.max_steps = n;
        self
    }

    /// Parses a textual description, one statement per line (`#` comments):
    ///
    /// ```text
    /// seed 42
    /// node client 10.0.0.1@tcp 192.168.0.1@o2ib
    /// node router 10.0.0.3@tcp 192.168.1.3@o2ib1 routing
    /// node server 192.168.1.2@o2ib1
    /// route client o2ib1 10.0.0.3@tcp hops 1 priority 0
    /// route server tcp 192.168.1.3@o2ib1
    /// latency tcp 50us
    /// jitter 5us
    /// ```
    ///
    /// A `node` line may end with the flags `routing` and `nodiscovery`; a
    /// `route` line names the node, the remote net and the gateway, and may
    /// add `hops N` and `priority P`.
    /// Durations take the suffixes `ns`, `us`, `ms`, `s`.
    ///
    /// # Errors
    /// [`SimError::Parse`] or [`SimError::Id`].
    pub fn parse(text: &str) -> Result<Self, SimError> {
        let mut topo = Self::new(0);
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |msg: &str| SimError::Parse {
                line: i + 1,
                msg: msg.to_owned(),
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["seed", s] => topo.seed = s.parse().map_err(|_| err("bad seed"))?,
                ["latency", net, d] => {
                    let net: Net = net.parse()?;
                    topo.latency
                        .insert(net, parse_duration(d).ok_or_else(|| err("bad duration"))?);
                }
                ["jitter", d] => {
                    topo.jitter = parse_duration(d).ok_or_else(|| err("bad duration"))?
                }
                ["route", node, net, gw, rest @ ..] => {
                    let mut hops = None;
                    let mut priority = 0;
                    let mut it = rest.iter();
                    while let Some(key) = it.next() {
                        let val: u32 = it
                            .next()
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| err("route option needs a number"))?;
                        match *key {
                            "hops" => hops = Some(val),
                            "priority" => priority = val,
                            _ => return Err(err("unknown route option")),
                        }
                    }
                    if !topo.nodes.iter().any(|(n, _)| n == node) {
                        return Err(err("route on unknown node"));
                    }
                    topo = topo.route(node, net, gw, hops, priority);
                    if let Some(e) = topo.errors.pop() {
                        return Err(e);
                    }
                }
                ["node", name, rest @ ..] => {
                    let mut nis = Vec::new();
                    let mut routing = false;
                    let mut discovery = true;
                    for w in rest {
                        match *w {
                            "routing" => routing = true,
                            "nodiscovery" => discovery = false,
                            nid => nis.push(NiConfig::new(nid.parse()?)),
                        }
                    }
                    if nis.is_empty() {
                        return Err(err("node without NIDs"));
                    }
                    let mut cfg = NodeConfig::new(nis);
                    cfg.routing = routing;
                    cfg.discovery = discovery;
                    topo.nodes.push(((*name).to_owned(), cfg));
                }
                _ => return Err(err("unknown statement")),
            }
        }
        Ok(topo)
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return None,
    })
}

/// One message carried by the fabric (for replay checks and debugging).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TraceRecord {
    /// When it was delivered (or failed).
    pub time: Time,
    /// Sending NI.
    pub from: Nid,
    /// Next-hop NI.
    pub to: Nid,
    /// Encoded length.
    pub len: usize,
    /// Message type byte (header offset 24) and outcome.
    pub outcome: Result<u32, HealthError>,
}

#[derive(Clone, Debug)]
struct InFlight {
    src: usize,
    tx: TxId,
    from: Nid,
    to: Nid,
    bytes: Vec<u8>,
    /// `Some` = fails at delivery time with this error.
    fail: Option<HealthError>,
}

/// The simulator. See the [module docs](self).
#[derive(Debug)]
pub struct Sim {
    now: Time,
    rng: Rng,
    names: Vec<String>,
    nodes: Vec<Node>,
    events: Vec<Vec<(Time, Event)>>,
    latency: BTreeMap<Net, Duration>,
    default_latency: Duration,
    jitter: Duration,
    down: BTreeSet<Nid>,
    in_flight: BTreeMap<(Time, u64), InFlight>,
    seq: u64,
    steps: u64,
    max_steps: u64,
    trace: Vec<TraceRecord>,
    receive_errors: Vec<(Time, Nid, NodeError)>,
}

impl Sim {
    /// Builds the nodes of a topology.
    ///
    /// # Errors
    /// Bad NIDs, duplicate NIDs or names, node configuration errors.
    pub fn new(topo: Topology) -> Result<Self, SimError> {
        if let Some(e) = topo.errors.into_iter().next() {
            return Err(e);
        }
        let mut rng = Rng::new(topo.seed);
        let mut names = Vec::new();
        let mut nodes = Vec::new();
        let mut seen = BTreeSet::new();
        for (name, mut cfg) in topo.nodes {
            if names.contains(&name) {
                return Err(SimError::DuplicateName(name));
            }
            for ni in &cfg.nis {
                if !seen.insert(ni.nid) {
                    return Err(SimError::DuplicateNid(ni.nid));
                }
            }
            cfg.seed = rng.next_u64();
            cfg.interface_cookie = rng.next_u64();
            let node = Node::new(cfg).map_err(|error| SimError::Node {
                name: name.clone(),
                error,
            })?;
            names.push(name);
            nodes.push(node);
        }
        for r in &topo.routes {
            nodes[r.node]
                .add_route(Time::ZERO, r.net, r.gateway, r.hops, r.priority)
                .map_err(|error| SimError::Node {
                    name: names[r.node].clone(),
                    error,
                })?;
        }
        let n = nodes.len();
        Ok(Self {
            now: Time::ZERO,
            rng,
            names,
            nodes,
            events: vec![Vec::new(); n],
            latency: topo.latency,
            default_latency: topo.default_latency,
            jitter: topo.jitter,
            down: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            seq: 0,
            steps: 0,
            max_steps: topo.max_steps,
            trace: Vec::new(),
            receive_errors: Vec::new(),
        })
    }

    /// The virtual clock.
    #[must_use]
    pub fn now(&self) -> Time {
        self.now
    }

    /// Index of a node by name.
    ///
    /// # Panics
    /// If no node has that name (a bug in the test).
    #[must_use]
    pub fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("no node named {name:?}"))
    }

    /// A node by name, if there is one.
    #[must_use]
    pub fn try_node(&self, name: &str) -> Option<&Node> {
        let i = self.names.iter().position(|n| n == name)?;
        self.nodes.get(i)
    }

    /// Names of the nodes, in topology order.
    #[must_use]
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// A node by name.
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn node(&self, name: &str) -> &Node {
        &self.nodes[self.index(name)]
    }

    /// A node by name, mutably (to call its API; run the sim afterwards).
    ///
    /// # Panics
    /// If no node has that name.
    pub fn node_mut(&mut self, name: &str) -> &mut Node {
        let i = self.index(name);
        &mut self.nodes[i]
    }

    /// Calls `f` with a node and the current time (to use the node's API);
    /// run the simulation afterwards to carry what it sends.
    ///
    /// # Panics
    /// If no node has that name.
    pub fn with_node<R>(&mut self, name: &str, f: impl FnOnce(&mut Node, Time) -> R) -> R {
        let now = self.now;
        f(self.node_mut(name), now)
    }

    /// Events delivered to a node's user MDs so far, with their times.
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn events(&self, name: &str) -> &[(Time, Event)] {
        &self.events[self.index(name)]
    }

    /// Takes the events collected for a node.
    ///
    /// # Panics
    /// If no node has that name.
    pub fn take_events(&mut self, name: &str) -> Vec<(Time, Event)> {
        let i = self.index(name);
        std::mem::take(&mut self.events[i])
    }

    /// Every message the fabric carried or failed, in order.
    #[must_use]
    pub fn trace(&self) -> &[TraceRecord] {
        &self.trace
    }

    /// Messages a node rejected (protocol errors), with time and receiving NI.
    #[must_use]
    pub fn receive_errors(&self) -> &[(Time, Nid, NodeError)] {
        &self.receive_errors
    }

    /// Marks an NI (of any node) down or up: messages from or to it fail.
    pub fn set_ni_down(&mut self, nid: Nid, down: bool) {
        if down {
            self.down.insert(nid);
        } else {
            self.down.remove(&nid);
        }
    }

    fn owner(&self, nid: Nid) -> Option<usize> {
        self.nodes.iter().position(|n| n.nids().contains(&nid))
    }

    fn latency_of(&self, net: Net) -> Duration {
        self.latency
            .get(&net)
            .copied()
            .unwrap_or(self.default_latency)
    }

    /// Takes every node's outputs: transmits go into flight, events into the log.
    fn collect_outputs(&mut self) {
        for i in 0..self.nodes.len() {
            while let Some(ev) = self.nodes[i].poll_event() {
                self.events[i].push((self.now, ev));
            }
            while let Some(tx) = self.nodes[i].poll_transmit() {
                let fail = if self.down.contains(&tx.from) {
                    Some(HealthError::LocalDropped)
                } else if tx.from.net() != tx.to.net() || self.owner(tx.to).is_none() {
                    Some(HealthError::RemoteError)
                } else if self.down.contains(&tx.to) {
                    Some(HealthError::RemoteDropped)
                } else {
                    None
                };
                let jitter_ns = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
                let delay = self.latency_of(tx.from.net())
                    + Duration::from_nanos(self.rng.below(jitter_ns + 1));
                self.seq += 1;
                self.in_flight.insert(
                    (self.now + delay, self.seq),
                    InFlight {
                        src: i,
                        tx: tx.id,
                        from: tx.from,
                        to: tx.to,
                        bytes: tx.bytes,
                        fail,
                    },
                );
            }
        }
    }

    /// The next time something happens: a delivery or a node timer.
    #[must_use]
    pub fn next_time(&self) -> Option<Time> {
        let d = self.in_flight.keys().next().map(|k| k.0);
        let t = self.nodes.iter().filter_map(Node::poll_timeout).min();
        [d, t].into_iter().flatten().min()
    }

    fn deliver(&mut self, f: InFlight) {
        let outcome = match f.fail {
            Some(h) => Err(h),
            None => {
                let dst = self.owner(f.to);
                match dst {
                    Some(d) => {
                        if let Err(e) =
                            self.nodes[d].handle_receive(self.now, f.to, f.from, &f.bytes)
                        {
                            tracing::debug!(target: "colibri_lnet::sim", to = %f.to, error = %e, "receiver rejected message");
                            self.receive_errors.push((self.now, f.to, e));
                        }
                        Ok(())
                    }
                    None => Err(HealthError::RemoteError),
                }
            }
        };
        let ty = f.bytes.get(24).copied().map_or(u32::MAX, u32::from);
        self.trace.push(TraceRecord {
            time: self.now,
            from: f.from,
            to: f.to,
            len: f.bytes.len(),
            outcome: outcome.map(|()| ty),
        });
        if let Err(e) = self.nodes[f.src].handle_tx_done(self.now, f.tx, outcome) {
            tracing::warn!(target: "colibri_lnet::sim", error = %e, "tx completion rejected");
        }
    }

    /// Processes everything due at the current time.
    fn settle_now(&mut self) -> Result<(), SimError> {
        loop {
            self.bump()?;
            self.collect_outputs();
            let due: Vec<(Time, u64)> = self
                .in_flight
                .range(..=(self.now, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            let timers: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].poll_timeout().is_some_and(|t| t <= self.now))
                .collect();
            if due.is_empty() && timers.is_empty() {
                return Ok(());
            }
            for k in due {
                if let Some(f) = self.in_flight.remove(&k) {
                    self.deliver(f);
                    self.collect_outputs();
                }
            }
            for i in timers {
                self.nodes[i].handle_timeout(self.now);
            }
        }
    }

    fn bump(&mut self) -> Result<(), SimError> {
        self.steps += 1;
        if self.steps > self.max_steps {
            return Err(SimError::StepLimit(self.max_steps));
        }
        Ok(())
    }

    /// Advances to the next time something happens and processes it.
    /// Returns `false` when nothing is pending.
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn step(&mut self) -> Result<bool, SimError> {
        self.steps = 0;
        self.settle_now()?;
        match self.next_time() {
            Some(t) => {
                self.now = self.now.max(t);
                self.settle_now()?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Steps until `done(self)` holds, or `limit` of virtual time has passed.
    /// Returns whether `done` held.
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn run_until_cond(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<bool, SimError> {
        let end = self.now + limit;
        self.steps = 0;
        while !done(self) {
            match self.next_time() {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.settle_now()?;
                }
                _ => return Ok(done(self)),
            }
        }
        Ok(true)
    }

    /// Runs until the virtual clock reaches `until` (processing everything due
    /// up to and including it).
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn run_until(&mut self, until: Time) -> Result<(), SimError> {
        self.steps = 0;
        self.settle_now()?;
        while let Some(t) = self.next_time() {
            if t > until {
                break;
            }
            self.now = self.now.max(t);
            self.settle_now()?;
        }
        self.now = self.now.max(until);
        self.settle_now()
    }

    /// Runs for `d` of virtual time.
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn run_for(&mut self, d: Duration) -> Result<(), SimError> {
        self.run_until(self.now + d)
    }

    /// Runs until nothing is in flight and no node timer is pending, or the
    /// step budget is spent.
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn run_until_idle(&mut self) -> Result<(), SimError> {
        self.steps = 0;
        self.settle_now()?;
        while let Some(t) = self.next_time() {
            self.now = self.now.max(t);
            self.settle_now()?;
        }
        Ok(())
    }

    /// Runs until nothing is in flight (node timers far in the future are left
    /// pending), or the step budget is spent.
    ///
    /// # Errors
    /// [`SimError::StepLimit`].
    pub fn run_until_quiet(&mut self) -> Result<(), SimError> {
        self.steps = 0;
        self.settle_now()?;
        while let Some(&(t, _)) = self.in_flight.keys().next() {
            let timer = self.nodes.iter().filter_map(Node::poll_timeout).min();
            let next = timer.map_or(t, |x| x.min(t));
            self.now = self.now.max(next);
            self.settle_now()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5us"), Some(Duration::from_micros(5)));
        assert_eq!(parse_duration("7ms"), Some(Duration::from_millis(7)));
        assert_eq!(parse_duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("9ns"), Some(Duration::from_nanos(9)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("us"), None);
        assert_eq!(parse_duration("5h"), None);
    }

    #[test]
    fn ni_down_fails_transmits_with_lnd_statuses() {
        let topo =
            Topology::parse("node a 10.0.0.1@tcp nodiscovery\nnode b 10.0.0.2@tcp nodiscovery\n")
                .unwrap();
        let mut sim = Sim::new(topo).unwrap();
        let b = nid("10.0.0.2@tcp");
        sim.set_ni_down(b, true);
        sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
        sim.run_until_idle().unwrap();
        assert_eq!(sim.trace()[0].outcome, Err(HealthError::RemoteDropped));
        assert!(
            sim.node_mut("a")
                .poll_ping_result()
                .unwrap()
                .result
                .is_err()
        );
        sim.set_ni_down(b, false);
        sim.set_ni_down(nid("10.0.0.1@tcp"), true);
        sim.with_node("a", |n, now| n.ping(now, b)).unwrap();
        // The local NI keeps failing its recovery pings while it is down: the
        // run never goes idle, so run for a while instead.
        sim.run_for(Duration::from_secs(10)).unwrap();
        assert!(
            sim.trace()
                .iter()
                .any(|t| t.outcome == Err(HealthError::LocalDropped))
        );
        let a = nid("10.0.0.1@tcp");
        assert!(sim.node("a").health().local_health(a).value() < 1000);
        sim.set_ni_down(a, false);
        // Back up: recovery pings through itself restore it, then all is idle.
        sim.run_until_idle().unwrap();
        assert_eq!(sim.node("a").health().local_health(a).value(), 1000);
        // Nobody owns the NID: the "connection" cannot be made.
        sim.with_node("a", |n, now| n.ping(now, nid("10.0.0.9@tcp")))
            .unwrap();
        sim.run_until_idle().unwrap();
        assert_eq!(
            sim.trace().last().unwrap().outcome,
            Err(HealthError::RemoteError)
        );
    }

    #[test]
    fn step_and_conditions() {
        let topo = Topology::new(3)
            .node("a", &["10.0.0.1@tcp"])
            .node("b", &["10.0.0.2@tcp"])
            .latency("tcp", Duration::from_millis(1));
        let mut sim = Sim::new(topo).unwrap();
        assert!(!sim.step().unwrap(), "nothing to do");
        sim.with_node("a", |n, now| n.ping(now, nid("10.0.0.2@tcp")))
            .unwrap();
        assert!(sim.step().unwrap());
        assert!(sim.now() >= Time::from_millis(1));
        let done = sim
            .run_until_cond(Duration::from_secs(1), |s| s.trace().len() >= 2)
            .unwrap();
        assert!(done);
        assert!(
            !sim.run_until_cond(Duration::from_secs(1), |s| s.trace().len() >= 100)
                .unwrap()
        );
        assert_eq!(sim.index("b"), 1);
        assert!(matches!(
            Sim::new(Topology::new(1).node("a", &["bad"])),
            Err(SimError::Id(_))
        ));
        assert!(matches!(
            Sim::new(
                Topology::new(1)
                    .node("a", &["10.0.0.1@tcp"])
                    .node("a", &["10.0.0.2@tcp"])
            ),
            Err(SimError::DuplicateName(_))
        ));
    }
}
