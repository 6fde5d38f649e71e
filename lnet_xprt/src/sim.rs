//! A deterministic fabric simulator for [`Node`]s.
//!
//! The simulator owns several nodes with NIs on several nets, a virtual clock
//! and a seeded scheduler. It plays the LNDs, exactly as a real driver would:
//!
//! * **Memory.** Each node has a memory arena (key → bytes) standing for the
//!   application's memory: tests [register](Sim::register_mem) buffers, build
//!   MDs over the returned [`MemRef`]s and [read](Sim::mem) them back.
//! * **Send.** Every [`Transmit`] a node emits is carried as bytes — its
//!   encoded header followed by the payload the driver gathers from the
//!   arena, a router buffer or the inline bytes (the "vectored socket write")
//!   — to the node owning the next-hop NID (which must be on the same net as
//!   the sending NI), after the net's latency plus a seeded jitter.
//! * **Receive, in two steps.** The receiver's driver hands the 72-byte
//!   header to [`Node::handle_header`] and does what the [`RxAction`] says:
//!   copies the payload into the arena at the given place (the "socket
//!   read"), into a router buffer, or into an inline vector, or skips it,
//!   then calls [`Node::handle_payload`]. A parked message
//!   ([`RxAction::Wait`]) stalls its connection (a directed NI pair): later
//!   messages on it queue behind it until [`Node::poll_rx_action`] says where
//!   its payload goes. Router buffers are freed when
//!   [`Node::poll_rx_release`] names them.
//! * **Loopback.** Transmits from and to `0@lo` are fed back to the sending
//!   node at once (the loopback LND), one memory-to-memory copy.
//!
//! Every message crosses the real encoders and decoders, and [`CopyStats`]
//! counts the payload bytes each driver moves. The sender gets
//! [`Node::handle_tx_done`] when the message reaches the receiver's
//! connection (LNDs are connection-oriented), or a health error when it
//! cannot be:
//!
//! | situation | sender sees |
//! |---|---|
//! | delivered | `Ok` |
//! | sending NI marked down ([`Sim::set_ni_down`]) | `LocalDropped` |
//! | next-hop NI marked down | `RemoteDropped` |
//! | no node owns the next-hop NID, or it is on another net | `RemoteError` |
//! | the payload's memory is not in the sender's arena | `LocalError` |
//!
//! [`Sim::set_payload_faults`] makes payload reads on an NI fail at a seeded
//! rate (a connection breaking mid-payload, or while its message is parked):
//! the receiver gets [`PayloadOutcome::Failed`]. Only that message is lost.
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use crate::fault::HealthError;
use crate::ids::{IdError, Net, Nid};
use crate::matching::{Event, MemKey, MemRef};
use crate::node::{
    NiConfig, Node, NodeConfig, NodeError, Payload, PayloadOutcome, RxAction, RxId, Transmit, TxId,
};
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::HEADER_LEN;

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
    trace_limit: Option<usize>,
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
            trace_limit: None,
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

    /// Keeps at most about `n` of the most recent trace records (the
    /// oldest are dropped in batches; [`Sim::trace_total`] still counts
    /// them all), so a long or large run does not grow without bound.
    /// Unbounded by default; [`Sim::take_trace`] streams it instead.
    #[must_use]
    pub fn trace_limit(mut self, n: usize) -> Self {
        self.trace_limit = Some(n.max(1));
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

/// Payload bytes one node's simulated driver moved. Header bytes are not
/// counted. At an end node a PUT's payload is written once from the
/// sender's memory and read once into the target's memory; a router reads it
/// once into a router buffer and writes it once from there. Nothing else
/// copies payload bytes (the node's own copies of LNet's ping and push data
/// are in [`NodeStats::payload_bytes_copied`](crate::node::NodeStats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CopyStats {
    /// Payload bytes written to the wire from memory (caller memory, router
    /// buffers, inline payloads): the socket writes.
    pub socket_write_bytes: u64,
    /// Payload bytes read from the wire into memory (caller memory, router
    /// buffers, inline vectors): the socket reads.
    pub socket_read_bytes: u64,
    /// Payload bytes skipped on the wire ([`RxAction::Discard`], the
    /// truncated part of a delivery).
    pub discarded_bytes: u64,
    /// Payload bytes the loopback LND copied from memory to memory.
    pub loopback_copy_bytes: u64,
    /// Of `socket_write_bytes`: [`Payload::Inline`] bytes (LNet's own ping
    /// and push data, made by the node).
    pub inline_write_bytes: u64,
    /// Of `socket_read_bytes`: [`RxAction::Inline`] bytes (LNet's own ping
    /// and push data, handed to the node).
    pub inline_read_bytes: u64,
}

/// A message on the wire: header, then payload.
#[derive(Clone, Debug)]
struct Wire {
    header: [u8; HEADER_LEN],
    payload: Vec<u8>,
}

#[derive(Clone, Debug)]
struct InFlight {
    src: usize,
    /// `None` for an injected message (no sender to complete).
    tx: Option<TxId>,
    from: Nid,
    to: Nid,
    wire: Wire,
    /// `Some` = fails at delivery time with this error.
    fail: Option<HealthError>,
}

/// One node's driver: its application memory, router buffers and counters.
#[derive(Clone, Debug, Default)]
struct Driver {
    mem: BTreeMap<MemKey, Vec<u8>>,
    next_key: u64,
    rx_bufs: BTreeMap<RxId, Vec<u8>>,
    copies: CopyStats,
    /// Messages the node parked with their payload in the connection.
    stalls: u64,
}

/// A directed connection into a node: a message whose payload is still in
/// it because the node parked the message, and the messages behind it.
#[derive(Clone, Debug, Default)]
struct Link {
    stalled: Option<(RxId, Vec<u8>)>,
    backlog: VecDeque<Wire>,
}

/// Identifies a connection: (receiving node, receiving NI, sending NI).
type LinkKey = (usize, Nid, Nid);

/// The simulator. See the [module docs](self).
#[derive(Debug)]
pub struct Sim {
    now: Time,
    rng: Rng,
    names: Vec<String>,
    nodes: Vec<Node>,
    drivers: Vec<Driver>,
    /// The connections holding a parked message (and those queued behind
    /// it); an idle connection has no entry, so a delivery looks up a
    /// small map instead of one entry per connection ever used.
    links: BTreeMap<LinkKey, Link>,
    payload_faults: BTreeMap<Nid, u32>,
    events: Vec<Vec<(Time, Event)>>,
    latency: BTreeMap<Net, Duration>,
    default_latency: Duration,
    jitter: Duration,
    down: BTreeSet<Nid>,
    /// Boxed: a B-tree moves its values within a node on every removal,
    /// and a message with its 72-byte header is large.
    in_flight: BTreeMap<(Time, u64), Box<InFlight>>,
    seq: u64,
    steps: u64,
    max_steps: u64,
    trace: Vec<TraceRecord>,
    trace_limit: Option<usize>,
    trace_total: u64,
    receive_errors: Vec<(Time, Nid, NodeError)>,
    /// Node index by name.
    by_name: HashMap<String, usize>,
    /// Node index by NID (checked against the node's NIs on use: NIs can
    /// be added and deleted at run time).
    by_nid: HashMap<Nid, usize>,
    /// Nodes touched since their outputs were last taken; their timers
    /// are recomputed then. Ordered, so that the nodes are visited in
    /// index order as a full scan would.
    dirty: BTreeSet<usize>,
    /// Every node's next deadline, as `(deadline, node)`.
    timers: BTreeSet<(Time, usize)>,
    /// The deadline each node has in `timers`.
    timer_of: Vec<Option<Time>>,
    /// The connection holding each parked message.
    stalled_at: HashMap<(usize, RxId), LinkKey>,
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
        let by_name = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let by_nid = nodes
            .iter()
            .enumerate()
            .flat_map(|(i, node)| node.nids().into_iter().map(move |nid| (nid, i)))
            .collect();
        Ok(Self {
            now: Time::ZERO,
            rng,
            names,
            nodes,
            drivers: vec![Driver::default(); n],
            links: BTreeMap::new(),
            payload_faults: BTreeMap::new(),
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
            trace_limit: topo.trace_limit,
            trace_total: 0,
            receive_errors: Vec::new(),
            by_name,
            by_nid,
            // Every node may have outputs and timers from its set-up.
            dirty: (0..n).collect(),
            timers: BTreeSet::new(),
            timer_of: vec![None; n],
            stalled_at: HashMap::new(),
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
        *self
            .by_name
            .get(name)
            .unwrap_or_else(|| panic!("no node named {name:?}"))
    }

    /// A node by name, if there is one.
    #[must_use]
    pub fn try_node(&self, name: &str) -> Option<&Node> {
        let i = *self.by_name.get(name)?;
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
        // The caller may change anything: outputs and timers are looked
        // at again.
        self.dirty.insert(i);
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

    /// Takes the trace recorded so far (to stream it out of a long run).
    pub fn take_trace(&mut self) -> Vec<TraceRecord> {
        std::mem::take(&mut self.trace)
    }

    /// Messages that crossed a wire since the start, including those no
    /// longer in [`Sim::trace`].
    #[must_use]
    pub fn trace_total(&self) -> u64 {
        self.trace_total
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

    /// Makes payload reads of messages received on NI `nid` fail, one in
    /// `one_in` on average (seeded), as if the connection broke mid-payload
    /// or while the message was parked; `None` stops it.
    pub fn set_payload_faults(&mut self, nid: Nid, one_in: Option<u32>) {
        match one_in {
            Some(n) => {
                self.payload_faults.insert(nid, n.max(1));
            }
            None => {
                self.payload_faults.remove(&nid);
            }
        }
    }

    /// Puts raw bytes on the wire from NI `from` to NI `to`, as if `from`'s
    /// LND had sent them (a crafted or foreign message; nobody is told of
    /// its completion). It arrives after `to`'s net latency.
    ///
    /// # Panics
    /// If no node owns `to`.
    pub fn inject(&mut self, from: Nid, to: Nid, header: [u8; HEADER_LEN], payload: Vec<u8>) {
        let dst = self.owner(to).expect("no node owns the NID");
        self.seq += 1;
        let at = self.now + self.latency_of(to.net());
        self.in_flight.insert(
            (at, self.seq),
            Box::new(InFlight {
                src: dst,
                tx: None,
                from,
                to,
                wire: Wire { header, payload },
                fail: None,
            }),
        );
    }

    /// Breaks the connection from NI `from` into NI `to`: the message the
    /// receiver parked in it, if any, is reported lost
    /// ([`PayloadOutcome::Failed`]) and the messages queued behind it vanish
    /// unread (their senders were already told they were sent). Returns how
    /// many messages were lost.
    pub fn break_link(&mut self, from: Nid, to: Nid) -> usize {
        let Some(d) = self.owner(to) else { return 0 };
        let Some(link) = self.links.remove(&(d, to, from)) else {
            return 0;
        };
        let lost = usize::from(link.stalled.is_some()) + link.backlog.len();
        if let Some((rx, _)) = link.stalled {
            self.stalled_at.remove(&(d, rx));
            self.payload_result(d, to, rx, PayloadOutcome::Failed);
        }
        self.collect_outputs();
        lost
    }

    /// Restarts node `name` as a new incarnation built from `cfg`, as after
    /// a crash and a reboot: its NIs may differ from the old ones, and its
    /// state, memory, router buffers, routes (add them again with
    /// [`Sim::with_node`]) and collected events are gone.
    ///
    /// Its connections break. Messages on their way to the old
    /// incarnation fail at their arrival time (`REMOTE_ERROR`, as a
    /// connection reset); messages it sent that are still on the wire
    /// arrive, but nobody is told of their completion; a message another
    /// node parked on a connection from it is reported lost, and the
    /// messages queued behind it vanish.
    ///
    /// # Errors
    /// A NID another node owns ([`SimError::DuplicateNid`]), or a node
    /// configuration error.
    ///
    /// # Panics
    /// If no node has that name.
    pub fn restart(&mut self, name: &str, mut cfg: NodeConfig) -> Result<(), SimError> {
        let i = self.index(name);
        for ni in &cfg.nis {
            if self.owner(ni.nid).is_some_and(|o| o != i) {
                return Err(SimError::DuplicateNid(ni.nid));
            }
        }
        cfg.seed = self.rng.next_u64();
        cfg.interface_cookie = self.rng.next_u64();
        let node = Node::new(cfg).map_err(|error| SimError::Node {
            name: name.to_owned(),
            error,
        })?;
        let old: BTreeSet<Nid> = self.nodes[i].nids().into_iter().collect();
        // Connections into the old incarnation go with it; those from it
        // break at the other end.
        let keys: Vec<LinkKey> = self
            .links
            .keys()
            .filter(|(d, _, from)| *d == i || old.contains(from))
            .copied()
            .collect();
        for key in keys {
            let Some(link) = self.links.remove(&key) else {
                continue;
            };
            let (d, to, _) = key;
            if let Some((rx, _)) = link.stalled {
                self.stalled_at.remove(&(d, rx));
                if d != i {
                    self.payload_result(d, to, rx, PayloadOutcome::Failed);
                }
            }
        }
        for f in self.in_flight.values_mut() {
            let to_old = old.contains(&f.to) || (f.src == i && f.to == Nid::LO_0);
            if f.src == i {
                f.tx = None;
            }
            if to_old && f.fail.is_none() {
                f.fail = Some(HealthError::RemoteError);
            }
        }
        for nid in node.nids() {
            self.by_nid.insert(nid, i);
        }
        self.nodes[i] = node;
        self.drivers[i] = Driver::default();
        self.events[i].clear();
        if let Some(t) = self.timer_of[i].take() {
            self.timers.remove(&(t, i));
        }
        self.dirty.insert(i);
        self.collect_outputs();
        Ok(())
    }

    /// Registers `bytes` as application memory of node `name`; build MDs over
    /// the returned region.
    ///
    /// # Panics
    /// If no node has that name, or `bytes` is longer than `u32::MAX`.
    pub fn register_mem(&mut self, name: &str, bytes: Vec<u8>) -> MemRef {
        let i = self.index(name);
        let d = &mut self.drivers[i];
        d.next_key += 1;
        let key = MemKey(d.next_key);
        let len = u32::try_from(bytes.len()).expect("memory region too large");
        d.mem.insert(key, bytes);
        MemRef::new(key, 0, len)
    }

    /// The application memory `key` of node `name`.
    ///
    /// # Panics
    /// If no node has that name or it has no such memory.
    #[must_use]
    pub fn mem(&self, name: &str, key: MemKey) -> &[u8] {
        self.drivers[self.index(name)]
            .mem
            .get(&key)
            .unwrap_or_else(|| panic!("node {name:?} has no memory {key:?}"))
    }

    /// Payload bytes node `name`'s driver moved.
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn copies(&self, name: &str) -> CopyStats {
        self.drivers[self.index(name)].copies
    }

    /// Router buffers node `name`'s driver holds (filled for forwards and not
    /// yet released by the node).
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn rx_buffers(&self, name: &str) -> usize {
        self.drivers[self.index(name)].rx_bufs.len()
    }

    /// How many times node `name` parked a message with its payload still in
    /// the connection ([`RxAction::Wait`]).
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn stall_count(&self, name: &str) -> u64 {
        self.drivers[self.index(name)].stalls
    }

    /// Messages stuck in node `name`'s connections: parked by the node with
    /// their payload unread, or queued behind one.
    ///
    /// # Panics
    /// If no node has that name.
    #[must_use]
    pub fn stalled(&self, name: &str) -> usize {
        let i = self.index(name);
        self.links
            .iter()
            .filter(|(k, _)| k.0 == i)
            .map(|(_, l)| usize::from(l.stalled.is_some()) + l.backlog.len())
            .sum()
    }

    fn owner(&self, nid: Nid) -> Option<usize> {
        let owns = |i: usize| self.nodes[i].has_nid(nid);
        match self.by_nid.get(&nid) {
            Some(&i) if owns(i) => Some(i),
            // Not known, or moved (NIs added or deleted at run time).
            _ => (0..self.nodes.len()).find(|&i| owns(i)),
        }
    }

    fn latency_of(&self, net: Net) -> Duration {
        self.latency
            .get(&net)
            .copied()
            .unwrap_or(self.default_latency)
    }

    /// Takes every node's outputs until none is left: actions for parked
    /// messages are carried out, released router buffers freed, transmits
    /// put in flight, events logged.
    ///
    /// Only nodes touched since their outputs were last taken are visited,
    /// in passes of increasing index (as a scan of every node would visit
    /// them), and each one's next deadline is recomputed after: a step
    /// costs what happened, not how many nodes exist.
    fn collect_outputs(&mut self) {
        let mut cursor = 0;
        loop {
            let next = self
                .dirty
                .range(cursor..)
                .next()
                .or_else(|| self.dirty.first())
                .copied();
            let Some(i) = next else { break };
            self.dirty.remove(&i);
            cursor = i + 1;
            while let Some((rx, action)) = self.nodes[i].poll_rx_action() {
                self.resume(i, rx, action);
            }
            while let Some(rx) = self.nodes[i].poll_rx_release() {
                if self.drivers[i].rx_bufs.remove(&rx).is_none() {
                    tracing::warn!(target: "colibri_lnet::sim", ?rx, "release of an unknown router buffer");
                }
            }
            while let Some(ev) = self.nodes[i].poll_event() {
                self.events[i].push((self.now, ev));
            }
            while let Some(tx) = self.nodes[i].poll_transmit() {
                self.send(i, tx);
            }
            // The simulated LNDs put a transmit on the wire at once: none
            // is left to give back.
            while self.nodes[i].poll_withdrawal().is_some() {}
            self.update_timer(i);
        }
    }

    /// Files node `i`'s next deadline in the timer set.
    fn update_timer(&mut self, i: usize) {
        let t = self.nodes[i].poll_timeout();
        if self.timer_of[i] != t {
            if let Some(old) = self.timer_of[i] {
                self.timers.remove(&(old, i));
            }
            if let Some(new) = t {
                self.timers.insert((new, i));
            }
            self.timer_of[i] = t;
        }
    }

    /// The earliest node deadline (nodes touched by hand since are asked
    /// directly).
    fn next_timer(&self) -> Option<Time> {
        let filed = self.timers.first().map(|&(t, _)| t);
        let touched = self
            .dirty
            .iter()
            .filter_map(|&i| self.nodes[i].poll_timeout())
            .min();
        [filed, touched].into_iter().flatten().min()
    }

    /// The bytes of a transmit's payload, gathered from node `i`'s memory.
    fn gather(&self, i: usize, p: &Payload) -> Option<Vec<u8>> {
        let d = &self.drivers[i];
        match p {
            Payload::None => Some(Vec::new()),
            Payload::Mem(r) => {
                let buf = d.mem.get(&r.key)?;
                let start = usize::try_from(r.offset).ok()?;
                let end = start.checked_add(r.len as usize)?;
                buf.get(start..end).map(<[u8]>::to_vec)
            }
            Payload::Rx { rx, len } => d.rx_bufs.get(rx)?.get(..*len as usize).map(<[u8]>::to_vec),
            Payload::Inline(v) => Some(v.clone()),
        }
    }

    /// Puts a transmit of node `i` in flight.
    fn send(&mut self, i: usize, tx: Transmit) {
        let lo = tx.from == Nid::LO_0 || tx.to == Nid::LO_0;
        let gathered = self.gather(i, &tx.payload);
        let fail = if gathered.is_none() {
            tracing::warn!(target: "colibri_lnet::sim", payload = ?tx.payload, "payload memory not found");
            Some(HealthError::LocalError)
        } else if lo {
            None
        } else if self.down.contains(&tx.from) {
            Some(HealthError::LocalDropped)
        } else if tx.from.net() != tx.to.net() || self.owner(tx.to).is_none() {
            Some(HealthError::RemoteError)
        } else if self.down.contains(&tx.to) {
            Some(HealthError::RemoteDropped)
        } else {
            None
        };
        let payload = gathered.unwrap_or_default();
        if !lo {
            let c = &mut self.drivers[i].copies;
            c.socket_write_bytes += payload.len() as u64;
            if matches!(tx.payload, Payload::Inline(_)) {
                c.inline_write_bytes += payload.len() as u64;
            }
        }
        let delay = if lo {
            Duration::ZERO
        } else {
            let jitter_ns = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
            self.latency_of(tx.from.net()) + Duration::from_nanos(self.rng.below(jitter_ns + 1))
        };
        self.seq += 1;
        self.in_flight.insert(
            (self.now + delay, self.seq),
            Box::new(InFlight {
                src: i,
                tx: Some(tx.id),
                from: tx.from,
                to: tx.to,
                wire: Wire {
                    header: tx.header,
                    payload,
                },
                fail,
            }),
        );
    }

    /// The next time something happens: a delivery or a node timer.
    #[must_use]
    pub fn next_time(&self) -> Option<Time> {
        let d = self.in_flight.keys().next().map(|k| k.0);
        [d, self.next_timer()].into_iter().flatten().min()
    }

    fn deliver(&mut self, f: InFlight) {
        let ty = u32::from(f.wire.header[24]);
        let len = HEADER_LEN + f.wire.payload.len();
        let outcome = match f.fail {
            Some(h) => Err(h),
            None => {
                let dst = if f.to == Nid::LO_0 {
                    Some(f.src)
                } else {
                    self.owner(f.to)
                };
                match dst {
                    Some(d) => {
                        self.arrive((d, f.to, f.from), f.wire);
                        Ok(())
                    }
                    None => Err(HealthError::RemoteError),
                }
            }
        };
        if let Some(limit) = self.trace_limit
            && self.trace.len() >= limit
        {
            // Drop the older half at once: amortised constant time.
            self.trace.drain(..limit.div_ceil(2).min(self.trace.len()));
        }
        self.trace_total += 1;
        self.trace.push(TraceRecord {
            time: self.now,
            from: f.from,
            to: f.to,
            len,
            outcome: outcome.map(|()| ty),
        });
        if let Some(tx) = f.tx {
            self.dirty.insert(f.src);
            if let Err(e) = self.nodes[f.src].handle_tx_done(self.now, tx, outcome) {
                tracing::warn!(target: "colibri_lnet::sim", error = %e, "tx completion rejected");
            }
        }
    }

    /// A message reached a connection: read at once, or queued behind a
    /// parked message.
    fn arrive(&mut self, key: LinkKey, wire: Wire) {
        // Only connections holding a parked message are in `links`.
        if let Some(link) = self.links.get_mut(&key) {
            link.backlog.push_back(wire);
            return;
        }
        self.read_message(key, wire);
    }

    /// Whether the next payload read on NI `to` fails (seeded).
    fn payload_fails(&mut self, to: Nid) -> bool {
        match self.payload_faults.get(&to).copied() {
            Some(n) => self.rng.below(u64::from(n)) == 0,
            None => false,
        }
    }

    /// The driver reads a header, then does what the node says with the payload.
    fn read_message(&mut self, key: LinkKey, wire: Wire) {
        let (d, to, from) = key;
        self.dirty.insert(d);
        match self.nodes[d].handle_header(self.now, to, from, &wire.header) {
            Err(e) => {
                tracing::debug!(target: "colibri_lnet::sim", %to, error = %e, "receiver rejected message");
                self.receive_errors.push((self.now, to, e));
            }
            Ok(RxAction::Wait { rx }) => {
                if self.payload_fails(to) {
                    // The connection breaks while the message is parked.
                    self.payload_result(d, to, rx, PayloadOutcome::Failed);
                } else {
                    self.drivers[d].stalls += 1;
                    self.links.entry(key).or_default().stalled = Some((rx, wire.payload));
                    self.stalled_at.insert((d, rx), key);
                }
            }
            Ok(action) => self.read_payload(key, action, &wire.payload),
        }
    }

    /// A parked message's payload can now be read; then the connection
    /// resumes.
    fn resume(&mut self, d: usize, rx: RxId, action: RxAction) {
        let key = self.stalled_at.remove(&(d, rx)).filter(|k| {
            self.links
                .get(k)
                .and_then(|l| l.stalled.as_ref())
                .is_some_and(|(r, _)| *r == rx)
        });
        let Some(key) = key else {
            tracing::warn!(target: "colibri_lnet::sim", ?rx, "action for a message no connection holds");
            return;
        };
        let payload = self
            .links
            .get_mut(&key)
            .and_then(|l| l.stalled.take())
            .map(|(_, p)| p)
            .unwrap_or_default();
        self.read_payload(key, action, &payload);
        loop {
            let next = match self.links.get_mut(&key) {
                Some(l) if l.stalled.is_none() => l.backlog.pop_front(),
                _ => None,
            };
            let Some(wire) = next else { break };
            self.read_message(key, wire);
        }
        if self
            .links
            .get(&key)
            .is_some_and(|l| l.stalled.is_none() && l.backlog.is_empty())
        {
            self.links.remove(&key);
        }
    }

    fn payload_result(&mut self, d: usize, to: Nid, rx: RxId, outcome: PayloadOutcome) {
        self.dirty.insert(d);
        if let Err(e) = self.nodes[d].handle_payload(self.now, rx, outcome) {
            tracing::warn!(target: "colibri_lnet::sim", ?rx, error = %e, "payload completion rejected");
            self.receive_errors.push((self.now, to, e));
        }
    }

    /// Carries out a receive action with the payload bytes on the wire.
    fn read_payload(&mut self, key: LinkKey, action: RxAction, payload: &[u8]) {
        let (d, to, _) = key;
        let lo = to == Nid::LO_0;
        let (rx, got) = match action {
            RxAction::None | RxAction::Wait { .. } => return,
            RxAction::Discard { len } => {
                self.drivers[d].copies.discarded_bytes += u64::from(len);
                return;
            }
            RxAction::Deliver {
                rx,
                mem,
                discard_after,
            } => {
                if self.payload_fails(to) {
                    (rx, PayloadOutcome::Failed)
                } else if Self::write_mem(&mut self.drivers[d], mem, payload) {
                    let c = &mut self.drivers[d].copies;
                    c.discarded_bytes += u64::from(discard_after);
                    if lo {
                        c.loopback_copy_bytes += u64::from(mem.len);
                    } else {
                        c.socket_read_bytes += u64::from(mem.len);
                    }
                    (rx, PayloadOutcome::Received)
                } else {
                    tracing::warn!(target: "colibri_lnet::sim", ?mem, "delivery outside the node's memory");
                    (rx, PayloadOutcome::Failed)
                }
            }
            RxAction::Forward { rx, len, .. } => match payload.get(..len as usize) {
                Some(bytes) if !self.payload_fails(to) => {
                    let drv = &mut self.drivers[d];
                    drv.rx_bufs.insert(rx, bytes.to_vec());
                    drv.copies.socket_read_bytes += u64::from(len);
                    (rx, PayloadOutcome::Received)
                }
                _ => (rx, PayloadOutcome::Failed),
            },
            RxAction::Inline {
                rx,
                len,
                discard_after,
            } => match payload.get(..len as usize) {
                Some(bytes) if !self.payload_fails(to) => {
                    let c = &mut self.drivers[d].copies;
                    c.discarded_bytes += u64::from(discard_after);
                    if lo {
                        c.loopback_copy_bytes += u64::from(len);
                    } else {
                        c.socket_read_bytes += u64::from(len);
                        c.inline_read_bytes += u64::from(len);
                    }
                    (rx, PayloadOutcome::Inline(bytes.to_vec()))
                }
                _ => (rx, PayloadOutcome::Failed),
            },
        };
        self.payload_result(d, to, rx, got);
    }

    /// Copies the first `mem.len` payload bytes into node memory.
    fn write_mem(d: &mut Driver, mem: MemRef, payload: &[u8]) -> bool {
        let Some(src) = payload.get(..mem.len as usize) else {
            return false;
        };
        let Some(buf) = d.mem.get_mut(&mem.key) else {
            return false;
        };
        let Ok(start) = usize::try_from(mem.offset) else {
            return false;
        };
        match start
            .checked_add(src.len())
            .and_then(|end| buf.get_mut(start..end))
        {
            Some(dst) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
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
            // Due node timers, in node order (collect_outputs above left
            // every deadline filed).
            let mut timers: Vec<usize> = self
                .timers
                .range(..=(self.now, usize::MAX))
                .map(|&(_, i)| i)
                .collect();
            timers.sort_unstable();
            if due.is_empty() && timers.is_empty() {
                return Ok(());
            }
            for k in due {
                if let Some(f) = self.in_flight.remove(&k) {
                    self.deliver(*f);
                    self.collect_outputs();
                }
            }
            for i in timers {
                self.dirty.insert(i);
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
        // What the nodes were asked to do since the last run goes in flight
        // first, or the next time would not see it.
        self.settle_now()?;
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
            let next = self.next_timer().map_or(t, |x| x.min(t));
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
    fn only_connections_holding_a_parked_message_are_kept() {
        use crate::ids::ProcessId;
        use crate::matching::{InsertPos, MdOptions, MdSpec, MeSpec, Unlink};
        let topo =
            Topology::parse("node a 10.0.0.1@tcp nodiscovery\nnode b 10.0.0.2@tcp nodiscovery\n")
                .unwrap();
        let mut sim = Sim::new(topo).unwrap();
        let b = nid("10.0.0.2@tcp");
        sim.with_node("b", |n, _| n.set_lazy_portal(9, true).map(drop))
            .unwrap();
        let data = sim.register_mem("a", b"parked".to_vec());
        for _ in 0..2 {
            sim.with_node("a", |n, now| {
                let md = n.md_bind(MdSpec::new(data, MdOptions::empty()))?;
                n.put(now, md, false, ProcessId::lustre(b), 9, 0, 0, 0)
            })
            .unwrap();
        }
        sim.run_for(Duration::from_millis(1)).unwrap();
        // The first PUT waits on the lazy portal, the second behind it.
        assert_eq!((sim.stalled("b"), sim.links.len()), (2, 1));
        let inbox = sim.register_mem("b", vec![0; 12]);
        sim.with_node("b", |n, now| {
            let me = n.me_attach(MeSpec {
                portal: 9,
                match_id: ProcessId::ANY,
                match_bits: 0,
                ignore_bits: !0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })?;
            n.md_attach(now, me, MdSpec::new(inbox, MdOptions::OP_PUT))
        })
        .unwrap();
        sim.run_until_idle().unwrap();
        // Both read: the idle connection is forgotten.
        assert_eq!((sim.stalled("b"), sim.links.len()), (0, 0));
        assert_eq!(&sim.mem("b", inbox.key)[..12], b"parkedparked");
        // A message to an idle connection is read at once, keeping nothing.
        sim.with_node("a", |n, now| {
            let md = n.md_bind(MdSpec::new(data, MdOptions::empty()))?;
            n.put(now, md, false, ProcessId::lustre(b), 9, 0, 0, 0)
        })
        .unwrap();
        sim.run_until_idle().unwrap();
        assert_eq!(sim.links.len(), 0);
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
