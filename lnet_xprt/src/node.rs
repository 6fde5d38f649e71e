//! The sans-IO LNet node: local NIs, the send and receive paths, events.
//!
//! A [`Node`] is plain state. It never reads a clock, opens a socket or
//! spawns a thread; the driver (a real LND in production, the
//! [simulator](crate::sim) in tests) feeds it inputs and pulls outputs.
//!
//! # Calling-order contract
//!
//! * **Inputs** (each takes `now`, which must never go backwards):
//!   the LNet API ([`Node::put`], [`Node::get`], [`Node::ping`], MEs and MDs),
//!   configuration ([`Node::add_ni`], fault rules, …),
//!   [`Node::handle_receive`] for every message an LND received,
//!   [`Node::handle_tx_done`] once for every [`Transmit`] taken from
//!   [`Node::poll_transmit`], and [`Node::handle_timeout`] at or after the time
//!   [`Node::poll_timeout`] asked for (early or repeated calls are harmless).
//! * **Outputs**, pulled after any input until they return `None`:
//!   [`Node::poll_transmit`] (encoded messages for an LND to carry from a local
//!   NI to a next-hop NID), [`Node::poll_event`] (LNet events for user MDs) and
//!   [`Node::poll_timeout`] (the next time the node wants `handle_timeout`).
//!
//! # Send path
//!
//! `put`/`get` → MD commit → discovery gate → pathway selection (local NI,
//! peer NI or gateway) → credits → send-side fault rules → encode →
//! [`Transmit`]. Completion ([`Node::handle_tx_done`]) finalizes the message
//! (SEND event, GET event for a served REPLY) or, on failure, applies the
//! health rules and resends or fails it.
//!
//! # Receive path
//!
//! decode → header checks ("should have gone direct") → receive-side fault
//! rules → forward (router) or match → PUT/GET events, ACK and REPLY
//! generation, ACK/REPLY delivery to the initiator's MD. LNet's own traffic
//! on the reserved portal (ping and push) is served by internal MEs and MDs.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::credits::{
    CreditError, Fwd, NetTunables, PoolKind, RouterBufferConfig, RouterCredits, TxCredits,
};
use crate::discovery::{
    Action, Discovery, DiscoveryConfig, DiscoveryError, PingFailure, SendClass,
};
use crate::fault::{
    DelayRuleSpec, DropRuleSpec, FaultError, FaultInjector, FaultMsg, HealthError, RecvVerdict,
    RuleId, SendVerdict,
};
use crate::health::{
    Completion, Direction, HealthConfig, HealthMonitor, HealthParamError, HealthStatus,
    LocalStatusChange, NiSide, RecoveryPing, Verdict,
};
use crate::ids::{LNET_PID_LUSTRE, Net, Nid, Pid, ProcessId};
use crate::matching::{
    DelayedOutcome, Event, EventInfo, EventKind, InsertPos, MatchError, MatchInfo, MatchOutcome,
    MatchTable, Matched, MdHandle, MdOptions, MdSpec, MeHandle, MeSpec, Op, OpError, ResponseMatch,
    Threshold, Unlink,
};
use crate::peer::PeerError;
use crate::route::{Route, RouteConfig, RouteError, RouteTable};
use crate::select::{
    LocalNiInfo as SelLocalNi, Pathway, PeerNiInfo, SelectConfig, Selector, SendRequest,
};
use crate::time::Time;
use crate::wire::{
    Body, Header, LNET_MTU, Message, MsgType, NiStatus, PING_ENTRY_LEN, PING_HEADER_LEN,
    PING_INFO_MIN_SIZE, PING_MATCHBITS, PingFeatures, PingInfo, PingNi, RESERVED_PORTAL, WireError,
    WireHandle,
};

/// Errors returned by node inputs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Matching API misuse.
    #[error(transparent)]
    Match(#[from] MatchError),
    /// Malformed message received (the LND should close the connection).
    #[error("protocol error: {0}")]
    Wire(#[from] WireError),
    /// A header that is valid but wrong for this node (`-EPROTO`).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// Fault rule misuse.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// Invalid health parameters.
    #[error(transparent)]
    Health(#[from] HealthParamError),
    /// Peer table / DLC error (e.g. `Busy` while the peer is being discovered).
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Route configuration error.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Credit configuration error.
    #[error(transparent)]
    Credit(#[from] CreditError),
    /// The NID is not one of this node's NIs.
    #[error("{0} is not a local NI")]
    NoSuchNi(Nid),
    /// The NI already exists.
    #[error("{0} is already a local NI")]
    DuplicateNi(Nid),
    /// The target cannot be sent to (`LNET_NID_ANY`, portal out of range, …).
    #[error("invalid target or argument: {0}")]
    Invalid(&'static str),
    /// Unknown transmit id in `handle_tx_done`.
    #[error("unknown transmit id {0:?}")]
    NoSuchTransmit(TxId),
}

/// Configuration of one local NI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NiConfig {
    /// The NI's NID.
    pub nid: Nid,
    /// NI tx credits (`credits`, default 256).
    pub credits: u32,
    /// Per-peer-NI tx credits (`peer_credits`, default 8).
    pub peer_credits: u32,
}

impl NiConfig {
    /// An NI with Lustre's default credits.
    #[must_use]
    pub const fn new(nid: Nid) -> Self {
        Self {
            nid,
            credits: 256,
            peer_credits: 8,
        }
    }
}

/// Node configuration (module parameters and `lnetctl set` values). Build it
/// with [`NodeConfig::new`] and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeConfig {
    /// Our pid (12345 for kernel LNet).
    pub pid: Pid,
    /// Local NIs, in configuration order (the first is the primary NID).
    pub nis: Vec<NiConfig>,
    /// Forward messages for other nodes (`lnetctl set routing 1`).
    pub routing: bool,
    /// Dynamic discovery (`lnetctl set discovery`).
    pub discovery: bool,
    /// `lnet_transaction_timeout` (150 s).
    pub transaction_timeout: Duration,
    /// `lnet_retry_count` (2).
    pub retry_count: u32,
    /// `lnet_health_sensitivity` (100).
    pub health_sensitivity: u32,
    /// Seed for the node's randomness (fault rules, route insertion).
    pub seed: u64,
    /// Interface cookie put into wire handles (identifies this LNet instance).
    pub interface_cookie: u64,
    /// Router buffer pools (used when routing is on).
    pub router_buffers: RouterBufferConfig,
}

impl NodeConfig {
    /// Lustre defaults with the given NIs.
    #[must_use]
    pub fn new(nis: Vec<NiConfig>) -> Self {
        Self {
            pid: LNET_PID_LUSTRE,
            nis,
            routing: false,
            discovery: true,
            transaction_timeout: Duration::from_secs(150),
            retry_count: 2,
            health_sensitivity: 100,
            seed: 0,
            interface_cookie: 0x1ce_c0de,
            router_buffers: RouterBufferConfig::default(),
        }
    }
}

/// Identifies one [`Transmit`] for [`Node::handle_tx_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxId(u64);

/// An encoded message for an LND to carry.
#[derive(Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Report completion with this id.
    pub id: TxId,
    /// Local NI to send from.
    pub from: Nid,
    /// Next-hop NID (the final peer NI, or a gateway).
    pub to: Nid,
    /// Header and payload, encoded.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transmit")
            .field("id", &self.id)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// Counters (`lnetctl stats show`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NodeStats {
    /// Messages handed to LNDs.
    pub send_count: u64,
    /// Messages received and accepted.
    pub recv_count: u64,
    /// Messages forwarded (router).
    pub route_count: u64,
    /// Messages dropped (no match, fault rule, routing off, …).
    pub drop_count: u64,
    /// Malformed or misdirected messages.
    pub protocol_errors: u64,
    /// Resends after a failure.
    pub resend_count: u64,
    /// ACK/REPLY that did not come in time.
    pub response_timeout_count: u64,
    /// Sends that failed (after resends).
    pub send_failures: u64,
    /// Pushes received and accepted.
    pub push_received: u64,
    /// Pushes sent.
    pub push_sent: u64,
    /// Pings served.
    pub ping_served: u64,
}

/// Information about one local NI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalNiInfo {
    /// NID.
    pub nid: Nid,
    /// Status advertised in the ping buffer.
    pub status: NiStatus,
    /// Messages sent from it.
    pub send_count: u64,
    /// Messages received on it.
    pub recv_count: u64,
}

#[derive(Clone, Debug)]
struct LocalNi {
    cfg: NiConfig,
    status: NiStatus,
    send_count: u64,
    recv_count: u64,
}

/// Why a message exists and what completing it means.
#[derive(Clone, Debug)]
enum Role {
    /// A PUT or GET from a bound MD.
    Request { md: MdHandle },
    /// An ACK we generate for a PUT.
    Ack,
    /// A REPLY serving a GET; the GET event for `md` follows its completion.
    Reply { md: MdHandle, info: EventInfo },
    /// A message we forward as a router: it holds a router credit of the
    /// peer NI it came from and a buffer of `pool`.
    Forward { from: Nid, pool: PoolKind },
}

/// A message on the send path (opaque; parked by discovery, queued for
/// credits, or in flight).
#[derive(Clone, Debug)]
pub struct OutMsg {
    header: Header,
    payload: Vec<u8>,
    role: Role,
    /// Target process (for events).
    target: ProcessId,
    /// Local NID to send from, if fixed (responses).
    src_nid: Option<Nid>,
    /// Next hop to use, if fixed (responses go back the way they came).
    rtr_nid: Option<Nid>,
    /// Resends so far.
    retries: u32,
    /// Past this the message is not resent.
    deadline: Time,
    /// Path chosen for the current attempt: (local NI, next hop).
    path: Option<(Nid, Nid)>,
    /// Send through the LND even to a local NID (local recovery pings).
    via_lnd: bool,
    /// Never resend (recovery pings).
    no_resend: bool,
    /// Holds a peer NI and an NI tx credit on `path`.
    holds_credits: bool,
}

impl OutMsg {
    /// The message's final destination.
    #[must_use]
    pub fn dest(&self) -> Nid {
        self.header.dest_nid
    }

    /// The message type.
    #[must_use]
    pub fn msg_type(&self) -> MsgType {
        self.header.msg_type()
    }

    fn discovery_class(&self) -> SendClass {
        // lnet_msg_discovery: only PUT/GET requests on non-reserved portals
        // discover; responses, LNet's own traffic and forwarded messages never do.
        match self.role {
            Role::Request { .. } if self.header.body.portal() != Some(RESERVED_PORTAL) => {
                SendClass::Normal
            }
            _ => SendClass::NoDiscovery,
        }
    }
}

/// A received message, kept while delayed (fault rules, lazy portal).
#[derive(Clone, Debug)]
pub struct RxMsg {
    header: Header,
    payload: Vec<u8>,
    ni: Nid,
    from: Nid,
}

/// Why LNet pinged someone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PingPurpose {
    /// `Node::ping` (`lnetctl ping`).
    User,
    /// Discovery of a peer.
    Discovery,
    /// Health recovery of a local NI or a peer NI.
    Recovery(NiSide),
    /// Router checker ping of a gateway.
    Router,
}

/// Internal MDs used by LNet itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InternalMd {
    PingTarget,
    PushTarget,
    /// Sink of a ping we sent to `to`.
    PingSink {
        to: Nid,
        purpose: PingPurpose,
    },
    /// Source of a push to `to` with our sequence `seq`.
    PushSource {
        to: Nid,
        seq: u32,
    },
}

/// A response we are waiting for.
#[derive(Clone, Copy, Debug)]
struct Tracker {
    md: MdHandle,
    kind: EventKind,
    deadline: Time,
    info: EventInfo,
    /// Next hop the request went to (health blame on timeout).
    next_hop: Option<Nid>,
}

/// What a ping returned ([`Node::poll_ping_result`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingResult {
    /// The pinged NID.
    pub nid: Nid,
    /// The peer's ping buffer, or why there is none.
    pub result: Result<PingInfo, PingError>,
}

/// Why a ping failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PingError {
    /// No reply in time, or the GET failed.
    #[error("ping failed: {0}")]
    Op(#[from] OpError),
    /// The reply was not a valid ping buffer.
    #[error("bad ping reply: {0}")]
    Wire(#[from] WireError),
}

/// A sans-IO LNet node. See the [module docs](self) for the calling contract.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    nis: Vec<LocalNi>,
    table: MatchTable<RxMsg>,
    internal: BTreeMap<MdHandle, InternalMd>,
    faults: FaultInjector,
    msgs: BTreeMap<u64, OutMsg>,
    next_msg: u64,
    outbox: VecDeque<Transmit>,
    events: VecDeque<Event>,
    trackers: BTreeMap<u64, Tracker>,
    next_tracker: u64,
    delayed_rx: BTreeMap<(Time, u64), RxMsg>,
    delayed_tx: BTreeMap<(Time, u64), u64>,
    next_delay: u64,
    loopback: VecDeque<(Nid, Vec<u8>)>,
    ping_seq: u32,
    ping_target: Option<MdHandle>,
    push_target_size: usize,
    pushes_received: VecDeque<(Nid, PingInfo)>,
    ping_results: VecDeque<PingResult>,
    pending_delayed: Vec<DelayedOutcome<RxMsg>>,
    disc: Discovery<OutMsg>,
    health: HealthMonitor,
    routes: RouteTable,
    selector: Selector,
    credits: TxCredits<u64>,
    rtr_credits: RouterCredits<RxMsg>,
    /// The local NI of the message being received (for internal events).
    rx_ni: Option<Nid>,
    stats: NodeStats,
}

fn event_info(kind: EventKind) -> EventInfo {
    EventInfo {
        kind,
        target: ProcessId::ANY,
        initiator: ProcessId::ANY,
        source: Nid::ANY,
        sender: Nid::ANY,
        msg_type: None,
        portal: 0,
        match_bits: 0,
        rlength: 0,
        mlength: 0,
        offset: 0,
        hdr_data: 0,
        status: Ok(()),
    }
}

/// Whether two NIDs belong to the same peer (ME NID rule of lnet.md 2.2).
fn same_peer(peers: &crate::peer::PeerTable, a: Nid, b: Nid) -> bool {
    peers
        .peer_id_of(a)
        .is_some_and(|pa| peers.peer_id_of(b) == Some(pa))
}

fn health_to_op_error(h: HealthError) -> OpError {
    match h {
        HealthError::LocalNoRoute | HealthError::RemoteError => OpError::Unreachable,
        HealthError::LocalTimeout | HealthError::RemoteTimeout | HealthError::NetworkTimeout => {
            OpError::TimedOut
        }
        HealthError::LocalAborted => OpError::Canceled,
        _ => OpError::NetworkError,
    }
}

impl Node {
    /// A node with the given configuration, its ping and push targets posted.
    ///
    /// # Errors
    /// Duplicate or invalid NIs.
    pub fn new(cfg: NodeConfig) -> Result<Self, NodeError> {
        let health = HealthMonitor::new(HealthConfig {
            sensitivity: cfg.health_sensitivity,
            retry_count: cfg.retry_count,
            transaction_timeout: cfg.transaction_timeout,
            ..HealthConfig::default()
        })?;
        let disc = Discovery::new(
            DiscoveryConfig {
                enabled: cfg.discovery,
                ping_timeout: cfg.transaction_timeout,
                push_timeout: cfg.transaction_timeout,
            },
            1,
        );
        let mut routes = RouteTable::new(RouteConfig::default(), cfg.seed ^ 0x7047e);
        routes.set_routing(cfg.routing);
        let mut node = Self {
            disc,
            health,
            routes,
            selector: Selector::new(SelectConfig::default()),
            credits: TxCredits::new(),
            rtr_credits: RouterCredits::new(cfg.router_buffers)?,
            rx_ni: None,
            faults: FaultInjector::new(cfg.seed ^ 0xfa17),
            table: MatchTable::new(cfg.interface_cookie),
            nis: Vec::new(),
            internal: BTreeMap::new(),
            msgs: BTreeMap::new(),
            next_msg: 1,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            trackers: BTreeMap::new(),
            next_tracker: 1,
            delayed_rx: BTreeMap::new(),
            delayed_tx: BTreeMap::new(),
            next_delay: 1,
            loopback: VecDeque::new(),
            ping_seq: 0,
            ping_target: None,
            push_target_size: PING_INFO_MIN_SIZE,
            pushes_received: VecDeque::new(),
            ping_results: VecDeque::new(),
            pending_delayed: Vec::new(),
            stats: NodeStats::default(),
            cfg: NodeConfig {
                nis: Vec::new(),
                ..cfg.clone()
            },
        };
        for ni in &cfg.nis {
            node.insert_ni(*ni)?;
        }
        node.table.set_lazy(RESERVED_PORTAL, true)?;
        node.post_ping_target()?;
        node.post_push_target()?;
        Ok(node)
    }

    fn insert_ni(&mut self, ni: NiConfig) -> Result<(), NodeError> {
        if ni.nid.is_any() || ni.nid.is_lo() || ni.nid.is_net_wildcard() {
            return Err(NodeError::Invalid("NI NID"));
        }
        if self.nis.iter().any(|n| n.cfg.nid == ni.nid) {
            return Err(NodeError::DuplicateNi(ni.nid));
        }
        let tunables = NetTunables {
            credits: ni.credits,
            peer_credits: ni.peer_credits,
            peer_buffer_credits: 0,
        };
        self.credits.set_tunables(ni.nid.net(), tunables)?;
        self.rtr_credits.set_tunables(ni.nid.net(), tunables)?;
        self.health.add_local_ni(ni.nid);
        self.nis.push(LocalNi {
            cfg: ni,
            status: NiStatus::Up,
            send_count: 0,
            recv_count: 0,
        });
        self.cfg.nis.push(ni);
        Ok(())
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// Our primary NID (first configured NI), or `0@lo` if there is none.
    #[must_use]
    pub fn primary_nid(&self) -> Nid {
        self.nis.first().map_or(Nid::LO_0, |n| n.cfg.nid)
    }

    /// Our NIDs, in configuration order.
    #[must_use]
    pub fn nids(&self) -> Vec<Nid> {
        self.nis.iter().map(|n| n.cfg.nid).collect()
    }

    /// Whether `nid` is one of ours (including `0@lo`).
    #[must_use]
    pub fn is_local_nid(&self, nid: Nid) -> bool {
        nid == Nid::LO_0 || self.nis.iter().any(|n| n.cfg.nid == nid)
    }

    /// Whether we have an NI on `net`.
    #[must_use]
    pub fn is_local_net(&self, net: Net) -> bool {
        self.nis.iter().any(|n| n.cfg.nid.net() == net)
    }

    /// Information about a local NI.
    #[must_use]
    pub fn ni_info(&self, nid: Nid) -> Option<LocalNiInfo> {
        self.nis
            .iter()
            .find(|n| n.cfg.nid == nid)
            .map(|n| LocalNiInfo {
                nid: n.cfg.nid,
                status: n.status,
                send_count: n.send_count,
                recv_count: n.recv_count,
            })
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// The current ping-buffer sequence number.
    #[must_use]
    pub fn ping_seq(&self) -> u32 {
        self.ping_seq
    }

    // ------------------------------------------------------------------
    // Ping buffer, ping target, push target

    /// Our ping buffer as it is served now.
    #[must_use]
    pub fn ping_info(&self) -> PingInfo {
        let mut features = PingFeatures::NI_STATUS.with(PingFeatures::MULTI_RAIL);
        if self.cfg.discovery {
            features = features.with(PingFeatures::DISCOVERY);
        }
        if !self.cfg.routing {
            features = features.with(PingFeatures::RTE_DISABLED);
        }
        PingInfo {
            features,
            pid: self.cfg.pid,
            seqno: self.ping_seq,
            lo_msg_size: 0,
            nis: self
                .nis
                .iter()
                .map(|n| PingNi {
                    nid: n.cfg.nid,
                    status: n.status,
                    msg_size: 0,
                })
                .collect(),
        }
    }

    /// (Re)builds the ping buffer with a new sequence number and posts it
    /// (`lnet_ping_target_install_locked`).
    /// The ME of the ping and push targets: any peer, the ping match
    /// bits, on the reserved portal.
    fn reserved_me() -> MeSpec {
        MeSpec {
            portal: RESERVED_PORTAL,
            match_id: ProcessId::ANY,
            match_bits: PING_MATCHBITS,
            ignore_bits: 0,
            unlink: Unlink::Unlink,
            pos: InsertPos::After,
        }
    }

    fn post_ping_target(&mut self) -> Result<(), NodeError> {
        if let Some(old) = self.ping_target.take() {
            self.internal.remove(&old);
            if let Ok(Some(ev)) = self.table.md_unlink(old) {
                drop(ev);
            }
        }
        self.ping_seq = self.ping_seq.wrapping_add(1);
        let buf = self.ping_info().encode();
        let me = self.table.me_attach(Self::reserved_me())?;
        let (md, delayed) = self.table.md_attach(
            me,
            MdSpec::new(
                buf,
                MdOptions::OP_GET | MdOptions::TRUNCATE | MdOptions::MANAGE_REMOTE,
            ),
        )?;
        debug_assert!(delayed.is_empty(), "GET-only MD takes no delayed PUT");
        self.internal.insert(md, InternalMd::PingTarget);
        self.ping_target = Some(md);
        Ok(())
    }

    /// Posts a push target MD (`lnet_push_target_post`); pushes delayed on
    /// the lazy portal are matched against it right away.
    fn post_push_target(&mut self) -> Result<Vec<DelayedOutcome<RxMsg>>, NodeError> {
        let me = self.table.me_attach(Self::reserved_me())?;
        let (md, delayed) = self.table.md_attach(
            me,
            MdSpec::new(
                vec![0; self.push_target_size],
                MdOptions::OP_PUT | MdOptions::TRUNCATE,
            )
            .threshold(Threshold::Count(1))
            .unlink(Unlink::Unlink),
        )?;
        self.internal.insert(md, InternalMd::PushTarget);
        Ok(delayed)
    }

    // ------------------------------------------------------------------
    // Configuration

    /// Adds a local NI (`lnetctl net add`): the ping buffer is rebuilt with a
    /// new sequence number.
    ///
    /// # Errors
    /// Duplicate or invalid NID.
    pub fn add_ni(&mut self, now: Time, ni: NiConfig) -> Result<(), NodeError> {
        self.insert_ni(ni)?;
        tracing::info!(target: "colibri_lnet::node", nid = %ni.nid, "local NI added");
        self.local_config_changed(now)
    }

    /// Deletes a local NI (`lnetctl net del`).
    ///
    /// # Errors
    /// Unknown NID.
    pub fn del_ni(&mut self, now: Time, nid: Nid) -> Result<(), NodeError> {
        let idx = self
            .nis
            .iter()
            .position(|n| n.cfg.nid == nid)
            .ok_or(NodeError::NoSuchNi(nid))?;
        self.nis.remove(idx);
        self.cfg.nis.retain(|n| n.nid != nid);
        self.health.remove_local_ni(nid);
        self.local_config_changed(now)
    }

    fn local_config_changed(&mut self, now: Time) -> Result<(), NodeError> {
        self.post_ping_target()?;
        let actions = self.disc.local_ni_config_changed(now, self.ping_seq);
        self.run_actions(now, actions);
        self.after_input(now);
        Ok(())
    }

    /// Turns routing (forwarding) on or off.
    pub fn set_routing(&mut self, now: Time, on: bool) -> Result<(), NodeError> {
        self.cfg.routing = on;
        self.routes.set_routing(on);
        self.local_config_changed(now)
    }

    /// Adds a route (`lnetctl route add --net net --gateway gw [--hop] [--priority]`);
    /// `hops` `None` = undefined. The gateway is pinged by the router checker.
    ///
    /// # Errors
    /// As [`RouteTable::add_route`].
    pub fn add_route(
        &mut self,
        now: Time,
        net: Net,
        gateway: Nid,
        hops: Option<u32>,
        priority: u32,
    ) -> Result<(), NodeError> {
        let nets: Vec<Net> = self.nis.iter().map(|n| n.cfg.nid.net()).collect();
        self.routes
            .add_route(now, net, gateway, hops, priority, &nets)?;
        self.after_input(now);
        Ok(())
    }

    /// Deletes a route (`lnetctl route del`).
    ///
    /// # Errors
    /// As [`RouteTable::del_route`].
    pub fn del_route(&mut self, net: Net, gateway: Nid) -> Result<(), NodeError> {
        Ok(self.routes.del_route(net, gateway)?)
    }

    /// Peer NI and NI tx credits (`lnetctl peer show -v`, `net show -v`).
    #[must_use]
    pub fn tx_credits(&self) -> &TxCredits<u64> {
        &self.credits
    }

    /// Router credits and buffer pools (`lnetctl routing show`).
    #[must_use]
    pub fn router_credits(&self) -> &RouterCredits<RxMsg> {
        &self.rtr_credits
    }

    /// The routes table.
    #[must_use]
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// The routes to `net`.
    #[must_use]
    pub fn routes_to(&self, net: Net) -> &[Route] {
        self.routes.routes_to(net)
    }

    /// Adds a drop rule (`lctl net_drop_add`).
    ///
    /// # Errors
    /// Invalid rule.
    pub fn add_drop_rule(&mut self, now: Time, spec: DropRuleSpec) -> Result<RuleId, NodeError> {
        Ok(self.faults.add_drop(spec, now)?)
    }

    /// Adds a delay rule (`lctl net_delay_add`).
    ///
    /// # Errors
    /// Invalid rule.
    pub fn add_delay_rule(&mut self, now: Time, spec: DelayRuleSpec) -> Result<RuleId, NodeError> {
        Ok(self.faults.add_delay(spec, now)?)
    }

    /// Removes a fault rule; messages it delays are released at once.
    pub fn remove_fault_rule(&mut self, now: Time, id: RuleId) -> bool {
        let removed = self.faults.remove(id);
        if removed {
            self.flush_delayed(now);
        }
        removed
    }

    /// Statistics of a fault rule.
    #[must_use]
    pub fn fault_stats(&self, id: RuleId) -> Option<crate::fault::FaultStats> {
        self.faults.stats(id)
    }

    /// Releases every delayed message now (rules were deleted).
    fn flush_delayed(&mut self, now: Time) {
        let rx: Vec<RxMsg> = std::mem::take(&mut self.delayed_rx).into_values().collect();
        for m in rx {
            self.process_rx(now, m);
        }
        let tx: Vec<u64> = std::mem::take(&mut self.delayed_tx).into_values().collect();
        for id in tx {
            self.transmit(id);
        }
        self.after_input(now);
    }

    // ------------------------------------------------------------------
    // LNet API: MEs, MDs, PUT, GET

    /// `LNetMEAttach`.
    ///
    /// # Errors
    /// See [`MatchTable::me_attach`].
    pub fn me_attach(&mut self, spec: MeSpec) -> Result<MeHandle, NodeError> {
        if spec.portal == RESERVED_PORTAL {
            return Err(NodeError::Invalid("portal 0 is reserved for LNet"));
        }
        Ok(self.table.me_attach(spec)?)
    }

    /// `LNetMDAttach`; PUTs waiting on a lazy portal are delivered into it.
    ///
    /// # Errors
    /// See [`MatchTable::md_attach`].
    pub fn md_attach(
        &mut self,
        now: Time,
        me: MeHandle,
        spec: MdSpec,
    ) -> Result<MdHandle, NodeError> {
        let (md, delayed) = self.table.md_attach(me, spec)?;
        self.deliver_delayed_puts(now, delayed);
        self.after_input(now);
        Ok(md)
    }

    /// `LNetMDBind`.
    ///
    /// # Errors
    /// See [`MatchTable::md_bind`].
    pub fn md_bind(&mut self, spec: MdSpec) -> Result<MdHandle, NodeError> {
        Ok(self.table.md_bind(spec)?)
    }

    /// `LNetMDUnlink`; an UNLINK event is queued if the MD was idle.
    ///
    /// # Errors
    /// Unknown MD.
    pub fn md_unlink(&mut self, md: MdHandle) -> Result<(), NodeError> {
        if self.internal.contains_key(&md) {
            return Err(NodeError::Invalid("internal MD"));
        }
        if let Some(ev) = self.table.md_unlink(md)? {
            self.events.push_back(ev);
        }
        self.trackers.retain(|_, t| t.md != md);
        Ok(())
    }

    /// `LNetSetLazyPortal` / `LNetClearLazyPortal` (clearing drops waiting PUTs).
    ///
    /// # Errors
    /// Bad or reserved portal.
    pub fn set_lazy_portal(&mut self, portal: u32, lazy: bool) -> Result<(), NodeError> {
        if portal == RESERVED_PORTAL {
            return Err(NodeError::Invalid("portal 0 is reserved for LNet"));
        }
        let dropped = self.table.set_lazy(portal, lazy)?;
        self.stats.drop_count += dropped.len() as u64;
        Ok(())
    }

    /// The memory of a live MD.
    #[must_use]
    pub fn md_buffer(&self, md: MdHandle) -> Option<&[u8]> {
        self.table.md_buffer(md)
    }

    /// `LNetPut`: sends `len` bytes of a bound MD from `offset 0` to `target`.
    /// With `ack`, the MD needs threshold 2 (SEND + ACK) and the ACK is
    /// tracked for the transaction timeout.
    ///
    /// # Errors
    /// Unusable MD, bad portal or target.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &mut self,
        now: Time,
        md: MdHandle,
        ack: bool,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
        hdr_data: u64,
    ) -> Result<(), NodeError> {
        self.check_target(target, portal)?;
        self.table.commit_bound(md)?;
        let payload = self.table.read_md(md, 0, LNET_MTU);
        let ack_wmd = if ack {
            self.table.wire_handle(md)
        } else {
            WireHandle::NONE
        };
        let header = Header {
            dest_nid: target.nid,
            src_nid: Nid::ANY,
            dest_pid: target.pid,
            src_pid: self.cfg.pid,
            payload_length: u32::try_from(payload.len()).unwrap_or(LNET_MTU),
            body: Body::Put {
                ack_wmd,
                match_bits,
                hdr_data,
                ptl_index: portal,
                offset,
            },
        };
        if ack {
            self.track(now, md, EventKind::Ack, target, portal, match_bits);
        }
        self.start_request(now, header, payload, md, target);
        Ok(())
    }

    /// `LNetGet`: asks `target` for data into a bound MD (threshold 2: SEND +
    /// REPLY). The REPLY is tracked for the transaction timeout.
    ///
    /// # Errors
    /// Unusable MD, bad portal or target.
    pub fn get(
        &mut self,
        now: Time,
        md: MdHandle,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
    ) -> Result<(), NodeError> {
        self.check_target(target, portal)?;
        let sink_length = self
            .table
            .md_buffer(md)
            .map(|b| u32::try_from(b.len()).unwrap_or(LNET_MTU))
            .ok_or(MatchError::NoSuchHandle)?;
        self.table.commit_bound(md)?;
        let header = Header {
            dest_nid: target.nid,
            src_nid: Nid::ANY,
            dest_pid: target.pid,
            src_pid: self.cfg.pid,
            payload_length: 0,
            body: Body::Get {
                return_wmd: self.table.wire_handle(md),
                match_bits,
                ptl_index: portal,
                src_offset: offset,
                sink_length,
            },
        };
        self.track(now, md, EventKind::Reply, target, portal, match_bits);
        self.start_request(now, header, Vec::new(), md, target);
        Ok(())
    }

    /// Pings `nid` (`lnetctl ping`): a GET on the reserved portal; the result
    /// comes out of [`Node::poll_ping_result`].
    ///
    /// # Errors
    /// Invalid target.
    pub fn ping(&mut self, now: Time, nid: Nid) -> Result<(), NodeError> {
        self.send_ping(now, nid, INTERFACES_FOR_PING, PingPurpose::User)?;
        self.after_input(now);
        Ok(())
    }

    /// The next completed ping.
    pub fn poll_ping_result(&mut self) -> Option<PingResult> {
        self.ping_results.pop_front()
    }

    /// The next push received (sender NID and its ping buffer).
    pub fn poll_push(&mut self) -> Option<(Nid, PingInfo)> {
        self.pushes_received.pop_front()
    }

    fn send_ping(
        &mut self,
        now: Time,
        nid: Nid,
        max_nis: u32,
        purpose: PingPurpose,
    ) -> Result<(), NodeError> {
        if nid.is_any() {
            return Err(NodeError::Invalid("ping target"));
        }
        let size = (PING_HEADER_LEN + PING_ENTRY_LEN * max_nis as usize).max(PING_INFO_MIN_SIZE);
        let md = self.table.md_bind(
            MdSpec::new(vec![0; size], MdOptions::TRUNCATE)
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
        )?;
        self.internal
            .insert(md, InternalMd::PingSink { to: nid, purpose });
        let target = ProcessId::lustre(nid);
        self.table.commit_bound(md)?;
        let header = Header {
            dest_nid: nid,
            src_nid: Nid::ANY,
            dest_pid: LNET_PID_LUSTRE,
            src_pid: self.cfg.pid,
            payload_length: 0,
            body: Body::Get {
                return_wmd: self.table.wire_handle(md),
                match_bits: PING_MATCHBITS,
                ptl_index: RESERVED_PORTAL,
                src_offset: 0,
                sink_length: u32::try_from(size).unwrap_or(LNET_MTU),
            },
        };
        self.track(
            now,
            md,
            EventKind::Reply,
            target,
            RESERVED_PORTAL,
            PING_MATCHBITS,
        );
        let mut msg = self.request(now, header, Vec::new(), md, target);
        if let PingPurpose::Recovery(side) = purpose {
            // Recovery pings use exactly this NID, are never resent, and a
            // local NI is pinged through itself (lnet.md 7.3).
            msg.no_resend = true;
            if side == NiSide::Local {
                msg.via_lnd = true;
                msg.src_nid = Some(nid);
            }
        }
        self.launch(now, msg);
        Ok(())
    }

    /// Pushes our ping buffer to `nid` (a PUT with ACK on the reserved portal).
    ///
    /// # Errors
    /// Invalid target.
    pub fn push(&mut self, now: Time, nid: Nid) -> Result<(), NodeError> {
        self.send_push(now, nid, None)?;
        self.after_input(now);
        Ok(())
    }

    fn send_push(&mut self, now: Time, nid: Nid, from: Option<Nid>) -> Result<(), NodeError> {
        if nid.is_any() {
            return Err(NodeError::Invalid("push target"));
        }
        let info = self.ping_info();
        let md = self.table.md_bind(
            MdSpec::new(info.encode(), MdOptions::TRACK_RESPONSE)
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
        )?;
        self.internal.insert(
            md,
            InternalMd::PushSource {
                to: nid,
                seq: info.seqno,
            },
        );
        self.table.commit_bound(md)?;
        let target = ProcessId::lustre(nid);
        let payload = info.encode();
        let header = Header {
            dest_nid: nid,
            src_nid: Nid::ANY,
            dest_pid: LNET_PID_LUSTRE,
            src_pid: self.cfg.pid,
            payload_length: u32::try_from(payload.len()).unwrap_or(LNET_MTU),
            body: Body::Put {
                ack_wmd: self.table.wire_handle(md),
                match_bits: PING_MATCHBITS,
                hdr_data: 0,
                ptl_index: RESERVED_PORTAL,
                offset: 0,
            },
        };
        self.track(
            now,
            md,
            EventKind::Ack,
            target,
            RESERVED_PORTAL,
            PING_MATCHBITS,
        );
        let mut msg = self.request(now, header, payload, md, target);
        msg.src_nid = from.filter(|f| self.is_local_nid(*f));
        self.stats.push_sent += 1;
        self.launch(now, msg);
        Ok(())
    }

    // ------------------------------------------------------------------
    // Peers and discovery (DLC)

    /// The discovery state machine and its peer tables.
    #[must_use]
    pub fn discovery(&self) -> &Discovery<OutMsg> {
        &self.disc
    }

    /// The health of every local NI and peer NI.
    #[must_use]
    pub fn health(&self) -> &HealthMonitor {
        &self.health
    }

    /// `lnetctl peer add --prim_nid primary --nid nids…`.
    ///
    /// # Errors
    /// As [`Discovery::dlc_add_peer_nis`] (`Busy` during discovery, NID in use, …).
    pub fn dlc_add_peer(
        &mut self,
        now: Time,
        primary: Nid,
        nids: &[Nid],
        multi_rail: bool,
    ) -> Result<(), NodeError> {
        self.disc.dlc_add_peer_nis(now, primary, nids, multi_rail)?;
        self.after_input(now);
        Ok(())
    }

    /// `lnetctl peer del --prim_nid primary --nid nids…`.
    ///
    /// # Errors
    /// As [`Discovery::dlc_del_peer_nis`].
    pub fn dlc_del_peer(&mut self, now: Time, primary: Nid, nids: &[Nid]) -> Result<(), NodeError> {
        self.disc.dlc_del_peer_nis(now, primary, nids)?;
        self.after_input(now);
        Ok(())
    }

    /// `lnetctl discover nid` (non-blocking here: the result shows in the
    /// peer's discovery state).
    ///
    /// # Errors
    /// As [`Discovery::discover`].
    pub fn discover(&mut self, now: Time, nid: Nid, force: bool) -> Result<(), NodeError> {
        self.disc.discover(now, nid, force)?;
        let actions = self.disc.process_queue(now);
        self.run_actions(now, actions);
        self.after_input(now);
        Ok(())
    }

    /// `lnetctl set discovery 0|1`.
    pub fn set_discovery(&mut self, now: Time, on: bool) -> Result<(), NodeError> {
        self.cfg.discovery = on;
        self.post_ping_target()?;
        let actions = self.disc.set_enabled(now, on, self.ping_seq);
        self.run_actions(now, actions);
        self.after_input(now);
        Ok(())
    }

    /// Carries out what discovery asked for.
    fn run_actions(&mut self, now: Time, actions: Vec<Action<OutMsg>>) {
        for a in actions {
            match a {
                Action::Transmit { msg, .. } => self.route_and_post(now, msg),
                Action::Fail { msg, error, .. } => {
                    let e = match error {
                        DiscoveryError::PingTimeout(_) => OpError::TimedOut,
                        DiscoveryError::InvalidReply { .. } => OpError::Protocol,
                        _ => OpError::Unreachable,
                    };
                    tracing::debug!(target: "colibri_lnet::node", %error, "parked message failed");
                    self.fail_msg(now, msg, e);
                }
                Action::SendPing { to, max_nis, .. } => {
                    if let Err(e) = self.send_ping(now, to, max_nis, PingPurpose::Discovery) {
                        tracing::warn!(target: "colibri_lnet::node", %to, error = %e, "cannot send discovery ping");
                        let more = self
                            .disc
                            .handle_ping_failure(now, to, PingFailure::SendFailed);
                        self.run_actions(now, more);
                    }
                }
                Action::SendPush { to, from, .. } => {
                    if let Err(e) = self.send_push(now, to, from) {
                        tracing::warn!(target: "colibri_lnet::node", %to, error = %e, "cannot send push");
                        let more = self.disc.handle_push_failure(now, to);
                        self.run_actions(now, more);
                    }
                }
                Action::PeerNiStatus { nid, old, new } => {
                    // An interface the peer now reports DOWN counts as a
                    // remote failure (lnet.md 3.7).
                    if old == NiStatus::Up && new == NiStatus::Down {
                        let h = self.health.peer_health(nid);
                        let v = self.health.set_health(
                            now,
                            NiSide::Peer,
                            nid,
                            h.decreased(self.cfg.health_sensitivity),
                        );
                        self.apply_verdict(now, v);
                    }
                }
                Action::PeersMerged { into, absorbed } => {
                    tracing::info!(target: "colibri_lnet::node", %into, %absorbed, "peers merged");
                }
            }
        }
    }

    fn check_target(&self, target: ProcessId, portal: u32) -> Result<(), NodeError> {
        if target.nid.is_any() {
            return Err(NodeError::Invalid("target NID is LNET_NID_ANY"));
        }
        if portal >= crate::wire::MAX_PORTALS {
            return Err(NodeError::Match(MatchError::BadPortal(portal)));
        }
        Ok(())
    }

    fn track(
        &mut self,
        now: Time,
        md: MdHandle,
        kind: EventKind,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
    ) {
        let mut info = event_info(kind);
        info.target = target;
        info.portal = portal;
        info.match_bits = match_bits;
        let id = self.next_tracker;
        self.next_tracker += 1;
        self.trackers.insert(
            id,
            Tracker {
                md,
                kind,
                deadline: now + self.cfg.transaction_timeout,
                info,
                next_hop: None,
            },
        );
    }

    fn untrack(&mut self, md: MdHandle) -> Option<Tracker> {
        let key = self
            .trackers
            .iter()
            .find(|(_, t)| t.md == md)
            .map(|(k, _)| *k)?;
        self.trackers.remove(&key)
    }

    fn request(
        &self,
        now: Time,
        header: Header,
        payload: Vec<u8>,
        md: MdHandle,
        target: ProcessId,
    ) -> OutMsg {
        OutMsg {
            header,
            payload,
            role: Role::Request { md },
            target,
            src_nid: None,
            rtr_nid: None,
            retries: 0,
            deadline: now + self.cfg.transaction_timeout,
            path: None,
            via_lnd: false,
            no_resend: false,
            holds_credits: false,
        }
    }

    fn start_request(
        &mut self,
        now: Time,
        header: Header,
        payload: Vec<u8>,
        md: MdHandle,
        target: ProcessId,
    ) {
        let msg = self.request(now, header, payload, md, target);
        self.launch(now, msg);
        self.after_input(now);
    }

    // ------------------------------------------------------------------
    // Send path

    fn new_msg_id(&mut self) -> u64 {
        let id = self.next_msg;
        self.next_msg += 1;
        id
    }

    /// Chooses the pathway with the Multi-Rail selector (lnet.md 4):
    /// returns (local NI, next hop, destination NID for the header).
    fn select_path(&mut self, msg: &OutMsg) -> Result<(Nid, Nid, Nid), OpError> {
        let dst = msg.header.dest_nid;
        let response = matches!(
            msg.role,
            Role::Ack | Role::Reply { .. } | Role::Forward { .. }
        );
        let req = SendRequest {
            dst,
            src: msg.src_nid,
            // Routers forward to exactly the header's destination (no
            // Multi-Rail forwarding, see DESIGN.md).
            response,
            rtr: msg.rtr_nid,
            recovery: msg.no_resend,
            reserved_portal: msg.header.body.portal() == Some(RESERVED_PORTAL),
        };
        let health = &self.health;
        let credits = &self.credits;
        let clamp = |c: i64| i32::try_from(c).unwrap_or(if c < 0 { i32::MIN } else { i32::MAX });
        let local: Vec<SelLocalNi> = self
            .nis
            .iter()
            .map(|n| SelLocalNi {
                health: health.local_health(n.cfg.nid),
                tx_credits: clamp(credits.ni_credits(n.cfg.nid)),
                ..SelLocalNi::new(n.cfg.nid)
            })
            .collect();
        let stats = |nid: Nid| PeerNiInfo {
            health: health.peer_health(nid),
            tx_credits: clamp(credits.peer_ni_credits(nid)),
            queued_bytes: credits.queued_bytes(nid),
            ..PeerNiInfo::default()
        };
        let peer = self.disc.peers().peer_of(dst);
        match self
            .selector
            .select(&req, peer, &local, &stats, &mut self.routes)
        {
            Ok(Pathway::Direct { local, peer_ni }) => Ok((local, peer_ni, peer_ni)),
            Ok(Pathway::Routed {
                local,
                gateway,
                peer_ni,
            }) => Ok((local, gateway, peer_ni)),
            Ok(Pathway::Loopback) => Ok((Nid::LO_0, Nid::LO_0, Nid::LO_0)),
            Err(e) => {
                tracing::debug!(target: "colibri_lnet::node", %dst, error = %e, "no pathway");
                Err(OpError::Unreachable)
            }
        }
    }

    /// Runs a message through the send path: loopback, or the discovery gate
    /// (which may park it until the peer is discovered).
    fn launch(&mut self, now: Time, mut msg: OutMsg) {
        let dst = msg.header.dest_nid;
        if self.is_local_nid(dst) && !msg.via_lnd {
            // Loopback LND: no credits, no selection.
            let src = if dst == Nid::LO_0 { Nid::LO_0 } else { dst };
            if !matches!(msg.role, Role::Forward { .. }) {
                msg.header.src_nid = src;
            }
            msg.path = Some((src, dst));
            let id = self.new_msg_id();
            let bytes = crate::wire::encode_message(&msg.header, &msg.payload);
            self.msgs.insert(id, msg);
            self.loopback.push_back((dst, bytes));
            self.complete(now, id, Ok(()));
            return;
        }
        if msg.via_lnd {
            self.route_and_post(now, msg);
            return;
        }
        let class = msg.discovery_class();
        let actions = self.disc.handle_send(now, dst, msg, class);
        self.run_actions(now, actions);
    }

    /// Pathway selection, then the credit queues and the wire.
    fn route_and_post(&mut self, now: Time, mut msg: OutMsg) {
        let dst = msg.header.dest_nid;
        match self.select_path(&msg) {
            Ok((local, next_hop, dest)) => {
                if !matches!(msg.role, Role::Forward { .. }) {
                    msg.header.src_nid = local;
                    msg.header.dest_nid = dest;
                }
                msg.path = Some((local, next_hop));
                msg.holds_credits = true;
                let bytes = msg.header.payload_length;
                let id = self.new_msg_id();
                self.msgs.insert(id, msg);
                // Peer NI credit, then NI credit; strictly FIFO when short.
                for tx in self.credits.send(local, next_hop, bytes, id) {
                    self.post_send(now, tx.item);
                }
            }
            Err(e) => {
                tracing::debug!(target: "colibri_lnet::node", dst = %dst, "no path");
                self.fail_msg(now, msg, e);
            }
        }
    }

    /// After credits: send-side fault rules, then hand to the LND.
    fn post_send(&mut self, now: Time, id: u64) {
        let Some(msg) = self.msgs.get(&id) else {
            return;
        };
        if let Role::Request { md } = msg.role
            && self.table.md_is_aborted(md)
        {
            // Not yet handed to the LND: canceled, never resent.
            if let Some(msg) = self.msgs.remove(&id) {
                self.return_credits(now, &msg);
                self.fail_msg(now, msg, OpError::Canceled);
            }
            return;
        }
        let fm = FaultMsg {
            src: msg.header.src_nid,
            dst: msg.header.dest_nid,
            local: Nid::ANY,
            msg_type: msg.header.msg_type(),
            portal: msg.header.body.portal(),
        };
        match self.faults.on_send(&fm, now) {
            SendVerdict::Pass => self.transmit(id),
            SendVerdict::Fail(_, h) => self.complete(now, id, Err(h)),
            SendVerdict::Delay(_, until) => {
                let k = self.next_delay;
                self.next_delay += 1;
                self.delayed_tx.insert((until, k), id);
            }
        }
    }

    fn transmit(&mut self, id: u64) {
        let Some(msg) = self.msgs.get(&id) else {
            return;
        };
        let Some((from, to)) = msg.path else { return };
        let bytes = crate::wire::encode_message(&msg.header, &msg.payload);
        if let Some(ni) = self.nis.iter_mut().find(|n| n.cfg.nid == from) {
            ni.send_count += 1;
        }
        self.stats.send_count += 1;
        self.outbox.push_back(Transmit {
            id: TxId(id),
            from,
            to,
            bytes,
        });
    }

    /// The LND finished with a transmit: `Ok` if the next hop got it, else the
    /// health status it reported.
    ///
    /// # Errors
    /// [`NodeError::NoSuchTransmit`] for an unknown or already completed id.
    pub fn handle_tx_done(
        &mut self,
        now: Time,
        id: TxId,
        result: Result<(), HealthError>,
    ) -> Result<(), NodeError> {
        if !self.msgs.contains_key(&id.0) {
            return Err(NodeError::NoSuchTransmit(id));
        }
        self.complete(now, id.0, result);
        self.after_input(now);
        Ok(())
    }

    /// Number of NIs of the peer owning `nid` (1 if unknown).
    fn peer_ni_count(&self, nid: Nid) -> usize {
        self.disc
            .peers()
            .peer_of(nid)
            .map_or(1, |p| p.ni_count().max(1))
    }

    /// Gives back the tx credits (and, for forwarded messages, the router
    /// credit and buffer) a finished message held, and posts the messages
    /// that were waiting for them, in FIFO order.
    fn return_credits(&mut self, now: Time, msg: &OutMsg) {
        if let (true, Some((local, next_hop))) = (msg.holds_credits, msg.path) {
            match self
                .credits
                .complete(local, next_hop, msg.header.payload_length)
            {
                Ok(ready) => {
                    for tx in ready {
                        self.post_send(now, tx.item);
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "colibri_lnet::node", error = %e, "tx credit accounting")
                }
            }
        }
    }

    /// A forwarded message is done: its router buffer and router credit come
    /// back, and forwarded messages waiting for them go on.
    fn return_router_credits(&mut self, now: Time, from: Nid, pool: PoolKind) {
        match self.rtr_credits.forwarded(from, pool) {
            Ok(ready) => {
                for f in ready {
                    self.forward_now(now, f);
                }
            }
            Err(e) => {
                tracing::warn!(target: "colibri_lnet::node", error = %e, "router credit accounting")
            }
        }
    }

    /// Finalizes (or resends) message `id`, applying the health rules.
    fn complete(&mut self, now: Time, id: u64, result: Result<(), HealthError>) {
        let Some(mut msg) = self.msgs.remove(&id) else {
            return;
        };
        self.return_credits(now, &msg);
        msg.holds_credits = false;
        let loopback = msg.path.is_some_and(|(l, _)| self.is_local_nid(l))
            && !msg.via_lnd
            && self.is_local_nid(msg.header.dest_nid);
        if let (Some((local, next_hop)), false) = (msg.path, loopback) {
            let status = result.map_or_else(HealthStatus::from, |()| HealthStatus::Ok);
            let aborted = matches!(msg.role, Role::Request { md } if self.table.md_is_aborted(md));
            let c = Completion {
                status,
                direction: Direction::Send,
                local_ni: local,
                peer_ni: Some(next_hop),
                peer_ni_count: self.peer_ni_count(msg.header.dest_nid),
                peer_is_gateway: next_hop != msg.header.dest_nid,
                i_am_router: self.cfg.routing,
                retries_done: msg.retries,
                past_deadline: now > msg.deadline,
                no_resend: msg.no_resend || aborted,
            };
            let v = self.health.on_completion(now, &c);
            self.apply_verdict(now, v);
            if let Err(h) = result {
                tracing::debug!(target: "colibri_lnet::node", ?h, dst = %msg.header.dest_nid, resend = v.resend, "send failed");
                if v.resend {
                    msg.retries += 1;
                    msg.path = None;
                    self.stats.resend_count += 1;
                    // Resends skip the discovery gate: the peer is already known.
                    self.route_and_post(now, msg);
                } else {
                    self.fail_msg(now, msg, health_to_op_error(h));
                }
                return;
            }
            if let Role::Request { md } = msg.role
                && let Some(t) = self.trackers.values_mut().find(|t| t.md == md)
            {
                t.next_hop = Some(next_hop);
            }
        }
        match result {
            Ok(()) => self.finalize_ok(now, msg),
            Err(h) => self.fail_msg(now, msg, health_to_op_error(h)),
        }
    }

    /// Acts on a health verdict's local NI status change: the ping buffer is
    /// rebuilt and peers are pushed (lnet.md 7.1).
    fn apply_verdict(&mut self, now: Time, v: Verdict) {
        let Some(change) = v.local_status else { return };
        let (nid, status) = match change {
            LocalStatusChange::Down(n) => (n, NiStatus::Down),
            LocalStatusChange::Up(n) => (n, NiStatus::Up),
        };
        let Some(ni) = self.nis.iter_mut().find(|n| n.cfg.nid == nid) else {
            return;
        };
        if ni.status == status {
            return;
        }
        ni.status = status;
        tracing::info!(target: "colibri_lnet::node", %nid, ?status, "local NI status changed");
        if let Err(e) = self.post_ping_target() {
            tracing::warn!(target: "colibri_lnet::node", error = %e, "cannot rebuild ping buffer");
            return;
        }
        let actions = self.disc.local_ni_config_changed(now, self.ping_seq);
        self.run_actions(now, actions);
    }

    fn finalize_ok(&mut self, now: Time, msg: OutMsg) {
        match msg.role {
            Role::Request { md } => {
                let mut info = event_info(EventKind::Send);
                info.target = msg.target;
                info.initiator = ProcessId::new(msg.header.src_nid, msg.header.src_pid);
                info.source = msg.header.src_nid;
                info.sender = msg.header.src_nid;
                info.msg_type = Some(msg.header.msg_type());
                info.portal = msg.header.body.portal().unwrap_or(0);
                info.match_bits = msg.header.body.match_bits().unwrap_or(0);
                info.rlength = msg.header.payload_length;
                info.mlength = msg.header.payload_length;
                if let Body::Put { hdr_data, .. } = msg.header.body {
                    info.hdr_data = hdr_data;
                }
                self.finish_md(now, md, info);
            }
            Role::Reply { md, info } => self.finish_md(now, md, info),
            Role::Ack => {}
            Role::Forward { from, pool } => self.return_router_credits(now, from, pool),
        }
    }

    fn fail_msg(&mut self, now: Time, msg: OutMsg, err: OpError) {
        self.stats.send_failures += 1;
        match msg.role {
            Role::Request { md } => {
                let mut info = event_info(EventKind::Send);
                info.target = msg.target;
                info.msg_type = Some(msg.header.msg_type());
                info.portal = msg.header.body.portal().unwrap_or(0);
                info.match_bits = msg.header.body.match_bits().unwrap_or(0);
                info.rlength = msg.header.payload_length;
                info.status = Err(err);
                // No response will come: stop tracking it. An internal MD is
                // also released (nobody else would unlink it).
                self.untrack(md);
                let internal = self.internal.get(&md).copied();
                self.finish_md(now, md, info);
                if internal.is_some()
                    && self.table.md_is_active(md)
                    && let Ok(Some(ev)) = self.table.md_unlink(md)
                {
                    self.route_event(now, ev);
                }
            }
            Role::Reply { md, mut info } => {
                info.status = Err(err);
                self.finish_md(now, md, info);
            }
            Role::Ack => {}
            Role::Forward { from, pool } => {
                tracing::debug!(target: "colibri_lnet::node", dst = %msg.header.dest_nid, error = %err, "forwarding failed");
                self.return_router_credits(now, from, pool);
            }
        }
    }

    fn finish_md(&mut self, now: Time, md: MdHandle, info: EventInfo) {
        if let Some(ev) = self.table.finish(md, info) {
            self.route_event(now, ev);
        }
    }

    /// Delivers an event to the user, or to LNet itself for internal MDs.
    fn route_event(&mut self, now: Time, ev: Event) {
        let Some(kind) = self.internal.get(&ev.md).copied() else {
            self.events.push_back(ev);
            return;
        };
        if ev.unlinked {
            self.internal.remove(&ev.md);
        }
        match (kind, ev.kind()) {
            (InternalMd::PingSink { to, purpose }, EventKind::Reply) => {
                let result = match ev.status() {
                    Err(e) => Err(PingError::Op(e)),
                    Ok(()) => {
                        let data = ev
                            .buffer
                            .as_deref()
                            .or_else(|| self.table.md_buffer(ev.md))
                            .unwrap_or(&[]);
                        let n = (ev.info.mlength as usize).min(data.len());
                        PingInfo::decode(&data[..n]).map_err(PingError::Wire)
                    }
                };
                self.ping_done(now, to, purpose, result);
            }
            (InternalMd::PingSink { to, purpose }, EventKind::Send) if ev.status().is_err() => {
                let e = ev.status().err().unwrap_or(OpError::NetworkError);
                self.ping_done(now, to, purpose, Err(PingError::Op(e)));
            }
            (InternalMd::PushTarget, EventKind::Put) => {
                let data = ev.buffer.as_deref().unwrap_or(&[]);
                let n = (ev.info.mlength as usize).min(data.len());
                match PingInfo::decode(&data[..n]) {
                    Ok(info) => {
                        self.stats.push_received += 1;
                        self.pushes_received
                            .push_back((ev.info.source, info.clone()));
                        let actions = self.disc.handle_push(now, ev.info.source, info);
                        self.run_actions(now, actions);
                    }
                    Err(WireError::Truncated { needed, .. }) => {
                        // Grow the push target for next time (lnet_push_target_resize).
                        self.push_target_size = self.push_target_size.max(needed);
                        self.stats.drop_count += 1;
                    }
                    Err(e) => {
                        tracing::debug!(target: "colibri_lnet::node", error = %e, "bad push");
                        self.stats.drop_count += 1;
                    }
                }
                match self.post_push_target() {
                    Ok(delayed) => self.pending_delayed.extend(delayed),
                    Err(e) => {
                        tracing::warn!(target: "colibri_lnet::node", error = %e, "cannot repost push target");
                    }
                }
            }
            (InternalMd::PushSource { to, .. }, EventKind::Ack) => {
                let actions = if ev.status().is_ok() {
                    self.disc.handle_push_ack(now, to)
                } else {
                    self.disc.handle_push_failure(now, to)
                };
                self.run_actions(now, actions);
            }
            (InternalMd::PushSource { to, .. }, EventKind::Send) if ev.status().is_err() => {
                let actions = self.disc.handle_push_failure(now, to);
                self.run_actions(now, actions);
            }
            _ => {}
        }
    }

    /// A ping we sent finished (reply, failure or timeout).
    fn ping_done(
        &mut self,
        now: Time,
        to: Nid,
        purpose: PingPurpose,
        result: Result<PingInfo, PingError>,
    ) {
        match purpose {
            PingPurpose::User => self.ping_results.push_back(PingResult { nid: to, result }),
            PingPurpose::Router => match result {
                Ok(info) => self.routes.on_router_ping_reply(now, to, &info),
                Err(e) => {
                    tracing::debug!(target: "colibri_lnet::node", gw = %to, error = %e, "router ping failed");
                    self.routes.on_router_ping_failed(now, to);
                }
            },
            PingPurpose::Recovery(side) => {
                let v = self.health.on_recovery_ping_result(
                    now,
                    RecoveryPing { side, nid: to },
                    result.is_ok(),
                );
                self.apply_verdict(now, v);
            }
            PingPurpose::Discovery => {
                let actions = match result {
                    Ok(info) => {
                        let local = self.rx_ni.unwrap_or_else(|| self.primary_nid());
                        self.disc.handle_ping_reply(now, to, local, info)
                    }
                    Err(PingError::Wire(WireError::Truncated { needed, .. })) => {
                        let needed_nis =
                            u32::try_from(needed.saturating_sub(PING_HEADER_LEN) / PING_ENTRY_LEN)
                                .unwrap_or(u32::MAX);
                        self.disc.handle_ping_failure(
                            now,
                            to,
                            PingFailure::Truncated { needed_nis },
                        )
                    }
                    // A response timeout is discovery's own timer's business.
                    Err(PingError::Op(OpError::TimedOut)) => Vec::new(),
                    Err(e) => {
                        tracing::debug!(target: "colibri_lnet::node", %to, error = %e, "discovery ping failed");
                        self.disc
                            .handle_ping_failure(now, to, PingFailure::SendFailed)
                    }
                };
                self.run_actions(now, actions);
            }
        }
    }

    // ------------------------------------------------------------------
    // Receive path

    /// An LND received `bytes` on local NI `ni` from the next hop `from`.
    ///
    /// # Errors
    /// Malformed or misdirected messages ([`NodeError::Wire`],
    /// [`NodeError::Protocol`]): the LND should close the connection. Silent
    /// drops (no match, fault rules, routing disabled) are not errors.
    pub fn handle_receive(
        &mut self,
        now: Time,
        ni: Nid,
        from: Nid,
        bytes: &[u8],
    ) -> Result<(), NodeError> {
        let r = self.receive(now, ni, from, bytes);
        self.after_input(now);
        r
    }

    fn receive(&mut self, now: Time, ni: Nid, from: Nid, bytes: &[u8]) -> Result<(), NodeError> {
        if ni != Nid::LO_0 && !self.nis.iter().any(|n| n.cfg.nid == ni) {
            return Err(NodeError::NoSuchNi(ni));
        }
        if ni != Nid::LO_0 && from.net() != ni.net() {
            self.stats.protocol_errors += 1;
            return Err(NodeError::Protocol(
                "sender is not on the receiving NI's net",
            ));
        }
        let msg = match Message::decode(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.stats.protocol_errors += 1;
                tracing::debug!(target: "colibri_lnet::node", from = %from, error = %e, "malformed message");
                return Err(e.into());
            }
        };
        let header = msg.header;
        if header.msg_type() == MsgType::Hello {
            self.stats.protocol_errors += 1;
            return Err(NodeError::Protocol(
                "HELLO outside the socket LND handshake",
            ));
        }
        if let Some(n) = self.nis.iter_mut().find(|n| n.cfg.nid == ni) {
            n.recv_count += 1;
        }
        let for_me =
            header.dest_nid == ni || (ni == Nid::LO_0 && self.is_local_nid(header.dest_nid));
        if !for_me {
            if header.dest_nid.net() == ni.net() {
                self.stats.protocol_errors += 1;
                tracing::warn!(target: "colibri_lnet::node", dst = %header.dest_nid, from = %from, "should have gone direct");
                return Err(NodeError::Protocol(
                    "message for a NID on the receiving net should have gone direct",
                ));
            }
            if self.is_local_nid(header.dest_nid) {
                self.stats.protocol_errors += 1;
                return Err(NodeError::Protocol("message for another local NID"));
            }
            if !self.cfg.routing {
                self.stats.drop_count += 1;
                tracing::debug!(target: "colibri_lnet::node", dst = %header.dest_nid, "routing disabled: dropped");
                return Ok(());
            }
        }
        let rx = RxMsg {
            header,
            payload: msg.payload,
            ni,
            from,
        };
        let fm = FaultMsg {
            src: header.src_nid,
            dst: header.dest_nid,
            local: ni,
            msg_type: header.msg_type(),
            portal: header.body.portal(),
        };
        match self.faults.on_receive(&fm, now) {
            RecvVerdict::Pass => self.process_rx(now, rx),
            RecvVerdict::Drop(_) => self.stats.drop_count += 1,
            RecvVerdict::Delay(_, until) => {
                let k = self.next_delay;
                self.next_delay += 1;
                self.delayed_rx.insert((until, k), rx);
            }
        }
        Ok(())
    }

    /// The initiator of a request, as matching sees it: the primary NID of
    /// the source peer (lnet.md 2.2).
    fn initiator_of(&mut self, header: &Header) -> ProcessId {
        let nid = if self.is_local_nid(header.src_nid) {
            header.src_nid
        } else {
            self.disc.note_receive(header.src_nid)
        };
        ProcessId::new(nid, header.src_pid)
    }

    fn process_rx(&mut self, now: Time, rx: RxMsg) {
        self.rx_ni = Some(rx.ni);
        self.process_rx_inner(now, rx);
        self.rx_ni = None;
    }

    fn process_rx_inner(&mut self, now: Time, rx: RxMsg) {
        let h = rx.header;
        if rx.ni != Nid::LO_0 && !self.is_local_nid(rx.from) {
            // Receiving never starts discovery, but it records the sender and
            // counts as a success for the NI and the peer NI (lnet.md 7.2).
            self.disc.note_receive(rx.from);
            let c = Completion {
                peer_is_gateway: rx.from != h.src_nid,
                i_am_router: self.cfg.routing,
                ..Completion::receive(rx.ni, rx.from, self.peer_ni_count(rx.from))
            };
            let v = self.health.on_completion(now, &c);
            self.apply_verdict(now, v);
            if rx.from != h.src_nid && self.routes.is_gateway(rx.from) {
                self.routes
                    .on_message_from_gateway(now, rx.from, h.src_nid.net());
            }
        }
        if h.dest_nid != rx.ni && !(rx.ni == Nid::LO_0 && self.is_local_nid(h.dest_nid)) {
            self.forward(now, rx);
            return;
        }
        self.stats.recv_count += 1;
        match h.body {
            Body::Put {
                match_bits,
                ptl_index,
                offset,
                ..
            } => {
                let info = MatchInfo {
                    initiator: self.initiator_of(&h),
                    op: Op::Put,
                    portal: ptl_index,
                    rlength: h.payload_length,
                    roffset: offset,
                    match_bits,
                };
                self.match_put(now, info, rx);
            }
            Body::Get {
                return_wmd,
                match_bits,
                ptl_index,
                src_offset,
                sink_length,
            } => {
                let info = MatchInfo {
                    initiator: self.initiator_of(&h),
                    op: Op::Get,
                    portal: ptl_index,
                    rlength: sink_length,
                    roffset: src_offset,
                    match_bits,
                };
                let peers = self.disc.peers();
                match self
                    .table
                    .match_request(info, rx.clone(), &|a, b| same_peer(peers, a, b))
                {
                    Ok((MatchOutcome::Matched(m), _)) => self.serve_get(now, &rx, m, return_wmd),
                    Ok(_) | Err(_) => {
                        self.stats.drop_count += 1;
                        tracing::debug!(target: "colibri_lnet::node", portal = ptl_index, bits = match_bits, "GET dropped: no match");
                    }
                }
            }
            Body::Ack {
                dst_wmd, mlength, ..
            } => match self.table.match_response(dst_wmd, MsgType::Ack, mlength) {
                ResponseMatch::Matched(m) => {
                    let tracker = self.untrack(m.md);
                    let mut info = tracker.map_or_else(|| event_info(EventKind::Ack), |t| t.info);
                    info.kind = EventKind::Ack;
                    info.source = h.src_nid;
                    info.sender = rx.from;
                    info.initiator = self.initiator_of(&h);
                    info.mlength = mlength;
                    info.match_bits = h.body.match_bits().unwrap_or(info.match_bits);
                    self.finish_md(now, m.md, info);
                }
                ResponseMatch::Drop => {
                    self.stats.drop_count += 1;
                    tracing::debug!(target: "colibri_lnet::node", from = %h.src_nid, "ACK dropped: no MD");
                }
            },
            Body::Reply { dst_wmd } => {
                match self
                    .table
                    .match_response(dst_wmd, MsgType::Reply, h.payload_length)
                {
                    ResponseMatch::Matched(m) => {
                        self.table
                            .write_md(m.md, 0, &rx.payload[..m.mlength as usize]);
                        let tracker = self.untrack(m.md);
                        let mut info =
                            tracker.map_or_else(|| event_info(EventKind::Reply), |t| t.info);
                        info.kind = EventKind::Reply;
                        info.source = h.src_nid;
                        info.sender = rx.from;
                        info.initiator = self.initiator_of(&h);
                        info.rlength = h.payload_length;
                        info.mlength = m.mlength;
                        self.finish_md(now, m.md, info);
                    }
                    ResponseMatch::Drop => {
                        self.stats.drop_count += 1;
                        tracing::debug!(target: "colibri_lnet::node", from = %h.src_nid, "REPLY dropped: no MD");
                    }
                }
            }
            Body::Hello { .. } => self.stats.protocol_errors += 1,
        }
    }

    fn match_put(&mut self, now: Time, info: MatchInfo, rx: RxMsg) {
        let peers = self.disc.peers();
        match self
            .table
            .match_request(info, rx, &|a, b| same_peer(peers, a, b))
        {
            Ok((MatchOutcome::Matched(m), Some(rx))) => self.deliver_put(now, rx, m),
            Ok((MatchOutcome::Delayed, _)) => {
                tracing::debug!(target: "colibri_lnet::node", portal = info.portal, "PUT delayed on lazy portal");
            }
            Ok(_) | Err(_) => {
                self.stats.drop_count += 1;
                tracing::debug!(target: "colibri_lnet::node", portal = info.portal, bits = info.match_bits, "PUT dropped: no match");
            }
        }
    }

    fn deliver_delayed_puts(&mut self, now: Time, delayed: Vec<DelayedOutcome<RxMsg>>) {
        for d in delayed {
            match d {
                DelayedOutcome::Matched(rx, m) => self.deliver_put(now, rx, m),
                DelayedOutcome::Dropped(_) => self.stats.drop_count += 1,
            }
        }
    }

    /// Lands PUT data, emits the PUT event and sends the ACK if wanted.
    fn deliver_put(&mut self, now: Time, rx: RxMsg, m: Matched) {
        let h = rx.header;
        let Body::Put {
            ack_wmd,
            match_bits,
            hdr_data,
            ptl_index,
            ..
        } = h.body
        else {
            return;
        };
        let n = (m.mlength as usize).min(rx.payload.len());
        self.table.write_md(m.md, m.offset, &rx.payload[..n]);
        let ack_disabled = self
            .table
            .md_info(m.md)
            .is_some_and(|(o, _)| o.contains(MdOptions::ACK_DISABLE));
        let mut info = event_info(EventKind::Put);
        info.target = ProcessId::new(rx.ni, h.dest_pid);
        info.initiator = self.initiator_of(&h);
        info.source = h.src_nid;
        info.sender = rx.from;
        info.portal = ptl_index;
        info.match_bits = match_bits;
        info.rlength = h.payload_length;
        info.mlength = m.mlength;
        info.offset = m.offset;
        info.hdr_data = hdr_data;
        self.finish_md(now, m.md, info);
        if !ack_wmd.is_none() && !ack_disabled {
            let ack = OutMsg {
                header: Header {
                    dest_nid: h.src_nid,
                    src_nid: rx.ni,
                    dest_pid: h.src_pid,
                    src_pid: self.cfg.pid,
                    payload_length: 0,
                    body: Body::Ack {
                        dst_wmd: ack_wmd,
                        match_bits,
                        mlength: m.mlength,
                    },
                },
                payload: Vec::new(),
                role: Role::Ack,
                target: ProcessId::new(h.src_nid, h.src_pid),
                src_nid: Some(rx.ni),
                rtr_nid: Some(rx.from),
                retries: 0,
                deadline: now + self.cfg.transaction_timeout,
                path: None,
                via_lnd: false,
                no_resend: false,
                holds_credits: false,
            };
            self.launch(now, ack);
        }
    }

    /// Serves a matched GET: the REPLY carries the MD's data; the GET event
    /// follows when the REPLY has been sent.
    fn serve_get(&mut self, now: Time, rx: &RxMsg, m: Matched, return_wmd: WireHandle) {
        let h = rx.header;
        let data = self.table.read_md(m.md, m.offset, m.mlength);
        if self.internal.get(&m.md) == Some(&InternalMd::PingTarget) {
            self.stats.ping_served += 1;
        }
        let mut info = event_info(EventKind::Get);
        info.target = ProcessId::new(rx.ni, h.dest_pid);
        info.initiator = self.initiator_of(&h);
        info.source = h.src_nid;
        info.sender = rx.from;
        info.portal = h.body.portal().unwrap_or(0);
        info.match_bits = h.body.match_bits().unwrap_or(0);
        if let Body::Get { sink_length, .. } = h.body {
            info.rlength = sink_length;
        }
        info.mlength = m.mlength;
        info.offset = m.offset;
        let reply = OutMsg {
            header: Header {
                dest_nid: h.src_nid,
                src_nid: rx.ni,
                dest_pid: h.src_pid,
                src_pid: self.cfg.pid,
                payload_length: u32::try_from(data.len()).unwrap_or(LNET_MTU),
                body: Body::Reply {
                    dst_wmd: return_wmd,
                },
            },
            payload: data,
            role: Role::Reply { md: m.md, info },
            target: ProcessId::new(h.src_nid, h.src_pid),
            src_nid: Some(rx.ni),
            rtr_nid: Some(rx.from),
            retries: 0,
            deadline: now + self.cfg.transaction_timeout,
            path: None,
            via_lnd: false,
            no_resend: false,
            holds_credits: false,
        };
        self.launch(now, reply);
    }

    /// Forwards a message for another node (router).
    /// A message for another node arrived (router): it needs a router
    /// credit of the peer NI it came from and a router buffer of the right
    /// size before it is received and sent on (lnet.md 6.4-6.5).
    fn forward(&mut self, now: Time, rx: RxMsg) {
        self.stats.route_count += 1;
        let from = rx.from;
        match self.rtr_credits.receive(from, rx.header.payload_length, rx) {
            Ok(ready) => {
                for f in ready {
                    self.forward_now(now, f);
                }
            }
            Err(e) => {
                self.stats.drop_count += 1;
                tracing::debug!(target: "colibri_lnet::node", error = %e, "cannot forward");
            }
        }
    }

    /// A forwarded message holds its router credit and buffer: send it on.
    fn forward_now(&mut self, now: Time, f: Fwd<RxMsg>) {
        let rx = f.item;
        let msg = OutMsg {
            header: rx.header,
            payload: rx.payload,
            role: Role::Forward {
                from: f.from,
                pool: f.pool,
            },
            target: ProcessId::new(rx.header.dest_nid, rx.header.dest_pid),
            src_nid: None,
            rtr_nid: None,
            retries: 0,
            // Routers do not drop messages past their deadline (LU-17854).
            deadline: Time::MAX,
            path: None,
            via_lnd: false,
            no_resend: false,
            holds_credits: false,
        };
        self.launch(now, msg);
    }

    // ------------------------------------------------------------------
    // Timers and outputs

    /// The next time [`Node::handle_timeout`] has work, if any.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let trackers = self.trackers.values().map(|t| t.deadline).min();
        let rx = self.delayed_rx.keys().next().map(|k| k.0);
        let tx = self.delayed_tx.keys().next().map(|k| k.0);
        let disc = self.disc.poll_timeout();
        let health = self.health.poll_timeout();
        let routes = self.routes.poll_timeout();
        [trackers, rx, tx, disc, health, routes]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs every timer due at `now`: expired response trackers (the event
    /// reports [`OpError::TimedOut`] and the MD is unlinked), delayed
    /// messages released by fault rules.
    pub fn handle_timeout(&mut self, now: Time) {
        // Delayed receives and sends.
        while let Some((&(t, k), _)) = self.delayed_rx.iter().next() {
            if t > now {
                break;
            }
            if let Some(rx) = self.delayed_rx.remove(&(t, k)) {
                self.process_rx(now, rx);
            }
        }
        while let Some((&(t, k), _)) = self.delayed_tx.iter().next() {
            if t > now {
                break;
            }
            if let Some(id) = self.delayed_tx.remove(&(t, k)) {
                self.transmit(id);
            }
        }
        // Response timeouts (lnet_finalize_expired_responses).
        let expired: Vec<u64> = self
            .trackers
            .iter()
            .filter(|(_, t)| t.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            let Some(t) = self.trackers.remove(&k) else {
                continue;
            };
            self.stats.response_timeout_count += 1;
            tracing::debug!(target: "colibri_lnet::node", target_nid = %t.info.target.nid, kind = ?t.kind, "response timed out");
            let mut info = t.info;
            info.status = Err(OpError::TimedOut);
            // Consume the response's threshold slot, then unlink the MD so a
            // late response is dropped.
            let wmd = self.table.wire_handle(t.md);
            let kind = if t.kind == EventKind::Ack {
                MsgType::Ack
            } else {
                MsgType::Reply
            };
            match self.table.match_response(wmd, kind, 0) {
                ResponseMatch::Matched(m) => {
                    if self.table.md_is_active(m.md) {
                        let _ = self.table.md_unlink(m.md);
                    }
                    self.finish_md(now, m.md, info);
                }
                ResponseMatch::Drop => {
                    if let Ok(Some(ev)) = self.table.md_unlink(t.md) {
                        self.route_event(now, ev);
                    }
                }
            }
            // The next-hop peer NI is blamed (lnet_handle_remote_failure_locked).
            if let Some(hop) = t.next_hop
                && !self.is_local_nid(hop)
            {
                self.health.on_response_timeout(now, hop);
            }
        }
        // Discovery: queued peers to ping, ping/push deadlines.
        if self.disc.poll_timeout().is_some_and(|t| t <= now) {
            let actions = self.disc.handle_timeout(now);
            self.run_actions(now, actions);
        }
        // Router checker.
        if self.routes.poll_timeout().is_some_and(|t| t <= now) {
            for p in self.routes.handle_timeout(now) {
                if let Err(e) =
                    self.send_ping(now, p.gateway, INTERFACES_FOR_PING, PingPurpose::Router)
                {
                    tracing::debug!(target: "colibri_lnet::node", gw = %p.gateway, error = %e, "router ping not sent");
                    self.routes.on_router_ping_failed(now, p.gateway);
                }
            }
        }
        // Health: recovery pings with back-off.
        if self.health.poll_timeout().is_some_and(|t| t <= now) {
            for p in self.health.handle_timeout(now) {
                if let Err(e) = self.send_ping(
                    now,
                    p.nid,
                    INTERFACES_FOR_PING,
                    PingPurpose::Recovery(p.side),
                ) {
                    tracing::debug!(target: "colibri_lnet::node", nid = %p.nid, error = %e, "recovery ping not sent");
                }
            }
        }
        self.after_input(now);
    }

    /// The next encoded message for an LND.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.pop_front()
    }

    /// The next event for a user MD.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Work that follows any input: loopback deliveries and deferred work.
    fn after_input(&mut self, now: Time) {
        loop {
            let delayed = std::mem::take(&mut self.pending_delayed);
            let progressed = !delayed.is_empty();
            self.deliver_delayed_puts(now, delayed);
            let lo = self.loopback.pop_front();
            if let Some((dst, bytes)) = lo {
                let ni = if dst == Nid::LO_0 { Nid::LO_0 } else { dst };
                if let Err(e) = self.receive(now, ni, ni, &bytes) {
                    tracing::warn!(target: "colibri_lnet::node", error = %e, "loopback message rejected");
                }
                continue;
            }
            if !progressed {
                break;
            }
        }
    }
}

/// Buffer size of a `lnetctl ping` (in interfaces).
const INTERFACES_FOR_PING: u32 = crate::wire::INTERFACES_MIN;

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn node(nids: &[&str], discovery: bool) -> Node {
        let mut cfg = NodeConfig::new(nids.iter().map(|n| NiConfig::new(nid(n))).collect());
        cfg.discovery = discovery;
        Node::new(cfg).unwrap()
    }

    fn put_md(n: &mut Node, data: &[u8]) -> MdHandle {
        n.md_bind(
            MdSpec::new(data.to_vec(), MdOptions::empty())
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
        )
        .unwrap()
    }

    #[test]
    fn configuration_is_validated() {
        let dup = NodeConfig::new(vec![
            NiConfig::new(nid("10.0.0.1@tcp")),
            NiConfig::new(nid("10.0.0.1@tcp")),
        ]);
        assert!(matches!(Node::new(dup), Err(NodeError::DuplicateNi(_))));
        let lo = NodeConfig::new(vec![NiConfig::new(Nid::LO_0)]);
        assert!(matches!(Node::new(lo), Err(NodeError::Invalid(_))));
        let mut bad_health = NodeConfig::new(vec![]);
        bad_health.health_sensitivity = 5000;
        assert!(matches!(Node::new(bad_health), Err(NodeError::Health(_))));
        let mut n = node(&["10.0.0.1@tcp"], true);
        assert!(matches!(
            n.add_ni(Time::ZERO, NiConfig::new(nid("10.0.0.1@tcp"))),
            Err(NodeError::DuplicateNi(_))
        ));
        assert!(matches!(
            n.del_ni(Time::ZERO, nid("10.0.0.9@tcp")),
            Err(NodeError::NoSuchNi(_))
        ));
    }

    #[test]
    fn ping_buffer_reflects_configuration() {
        let mut n = node(&["10.0.0.1@tcp", "192.168.0.1@o2ib"], true);
        let info = n.ping_info();
        assert_eq!(info.primary_nid(), Some(nid("10.0.0.1@tcp")));
        assert_eq!(info.nis.len(), 2);
        assert!(info.features.contains(PingFeatures::DISCOVERY));
        assert!(info.features.contains(PingFeatures::RTE_DISABLED));
        assert!(info.features.contains(PingFeatures::MULTI_RAIL));
        let seq = n.ping_seq();
        n.set_routing(Time::ZERO, true).unwrap();
        assert!(!n.ping_info().features.contains(PingFeatures::RTE_DISABLED));
        n.set_discovery(Time::ZERO, false).unwrap();
        assert!(!n.ping_info().features.contains(PingFeatures::DISCOVERY));
        assert_eq!(n.ping_seq(), seq + 2);
        n.del_ni(Time::ZERO, nid("10.0.0.1@tcp")).unwrap();
        assert_eq!(n.primary_nid(), nid("192.168.0.1@o2ib"));
        assert_eq!(n.ping_seq(), seq + 3);
    }

    #[test]
    fn loopback_put_needs_no_lnd() {
        let mut n = node(&["10.0.0.1@tcp"], true);
        let me = n
            .me_attach(MeSpec {
                portal: 3,
                match_id: ProcessId::ANY,
                match_bits: 7,
                ignore_bits: 0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })
            .unwrap();
        let sink = n
            .md_attach(Time::ZERO, me, MdSpec::new(vec![0; 4], MdOptions::OP_PUT))
            .unwrap();
        let src = put_md(&mut n, b"self");
        let target = ProcessId::lustre(nid("10.0.0.1@tcp"));
        n.put(Time::ZERO, src, true, target, 3, 7, 0, 0).unwrap();
        assert!(n.poll_transmit().is_none());
        let kinds: Vec<EventKind> = std::iter::from_fn(|| n.poll_event())
            .map(|e| e.kind())
            .collect();
        assert!(kinds.contains(&EventKind::Put));
        assert!(kinds.contains(&EventKind::Send));
        assert!(kinds.contains(&EventKind::Ack));
        assert_eq!(n.md_buffer(sink).unwrap(), b"self");
    }

    #[test]
    fn transmit_then_completion_gives_send_event() {
        let mut n = node(&["10.0.0.1@tcp"], false);
        let src = put_md(&mut n, b"abc");
        let target = ProcessId::lustre(nid("10.0.0.2@tcp"));
        n.put(Time::ZERO, src, false, target, 3, 9, 0, 42).unwrap();
        let tx = n.poll_transmit().expect("a transmit");
        assert_eq!((tx.from, tx.to), (nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp")));
        let (h, payload) = crate::wire::decode_message(&tx.bytes).unwrap();
        assert_eq!(h.src_nid, nid("10.0.0.1@tcp"));
        assert_eq!(h.dest_nid, nid("10.0.0.2@tcp"));
        assert_eq!(payload, b"abc");
        assert!(
            matches!(h.body, Body::Put { hdr_data: 42, match_bits: 9, ack_wmd, .. } if ack_wmd.is_none())
        );
        assert!(n.poll_event().is_none(), "SEND only after the LND is done");
        n.handle_tx_done(Time::ZERO, tx.id, Ok(())).unwrap();
        let ev = n.poll_event().unwrap();
        assert_eq!(ev.kind(), EventKind::Send);
        assert!(ev.status().is_ok());
        assert_eq!(
            n.handle_tx_done(Time::ZERO, tx.id, Ok(())),
            Err(NodeError::NoSuchTransmit(tx.id))
        );
        assert_eq!(n.tx_credits().peer_ni_credits(nid("10.0.0.2@tcp")), 8);
    }

    #[test]
    fn peer_credits_queue_sends_fifo() {
        let mut cfg = NodeConfig::new(vec![NiConfig {
            nid: nid("10.0.0.1@tcp"),
            credits: 256,
            peer_credits: 2,
        }]);
        cfg.discovery = false;
        let mut n = Node::new(cfg).unwrap();
        let target = ProcessId::lustre(nid("10.0.0.2@tcp"));
        for i in 0..5u64 {
            let md = put_md(&mut n, &[i as u8]);
            n.put(Time::ZERO, md, false, target, 3, i, 0, 0).unwrap();
        }
        let first: Vec<Transmit> = std::iter::from_fn(|| n.poll_transmit()).collect();
        assert_eq!(first.len(), 2);
        assert_eq!(n.tx_credits().peer_ni_credits(nid("10.0.0.2@tcp")), -3);
        let bits = |t: &Transmit| Header::decode(&t.bytes).unwrap().body.match_bits();
        let mut order: Vec<Option<u64>> = first.iter().map(bits).collect();
        for t in first {
            n.handle_tx_done(Time::ZERO, t.id, Ok(())).unwrap();
            for t2 in std::iter::from_fn(|| n.poll_transmit()).collect::<Vec<_>>() {
                order.push(bits(&t2));
                n.handle_tx_done(Time::ZERO, t2.id, Ok(())).unwrap();
                for t3 in std::iter::from_fn(|| n.poll_transmit()).collect::<Vec<_>>() {
                    order.push(bits(&t3));
                    n.handle_tx_done(Time::ZERO, t3.id, Ok(())).unwrap();
                }
            }
        }
        assert_eq!(order, (0..5).map(Some).collect::<Vec<_>>());
        let q = n.tx_credits().peer_ni(nid("10.0.0.2@tcp")).unwrap();
        assert_eq!((q.credits(), q.min_credits()), (2, -3));
    }

    #[test]
    fn misuse_is_refused() {
        let mut n = node(&["10.0.0.1@tcp"], true);
        let spec = MeSpec {
            portal: RESERVED_PORTAL,
            match_id: ProcessId::ANY,
            match_bits: 0,
            ignore_bits: 0,
            unlink: Unlink::Retain,
            pos: InsertPos::After,
        };
        assert!(matches!(n.me_attach(spec), Err(NodeError::Invalid(_))));
        assert!(matches!(
            n.set_lazy_portal(0, true),
            Err(NodeError::Invalid(_))
        ));
        let md = put_md(&mut n, b"x");
        assert!(matches!(
            n.put(Time::ZERO, md, false, ProcessId::ANY, 1, 0, 0, 0),
            Err(NodeError::Invalid(_))
        ));
        assert!(matches!(
            n.put(
                Time::ZERO,
                md,
                false,
                ProcessId::lustre(nid("10.0.0.2@tcp")),
                64,
                0,
                0,
                0
            ),
            Err(NodeError::Match(MatchError::BadPortal(64)))
        ));
        assert!(matches!(
            n.handle_receive(Time::ZERO, nid("10.0.0.7@tcp"), nid("10.0.0.2@tcp"), &[]),
            Err(NodeError::NoSuchNi(_))
        ));
        assert!(matches!(
            n.handle_receive(Time::ZERO, nid("10.0.0.1@tcp"), nid("10.0.0.2@o2ib"), &[]),
            Err(NodeError::Protocol(_))
        ));
        // LNET_NID_ANY cannot be pinged.
        assert!(n.ping(Time::ZERO, Nid::ANY).is_err());
    }

    #[test]
    fn response_tracking_sets_a_timer() {
        let mut n = node(&["10.0.0.1@tcp"], false);
        assert_eq!(n.poll_timeout(), None);
        let md = put_md(&mut n, b"x");
        n.put(
            Time::from_secs(1),
            md,
            true,
            ProcessId::lustre(nid("10.0.0.2@tcp")),
            3,
            0,
            0,
            0,
        )
        .unwrap();
        assert_eq!(n.poll_timeout(), Some(Time::from_secs(151)));
        let tx = n.poll_transmit().unwrap();
        n.handle_tx_done(Time::from_secs(1), tx.id, Ok(())).unwrap();
        assert_eq!(n.poll_event().unwrap().kind(), EventKind::Send);
        n.handle_timeout(Time::from_secs(100));
        assert!(n.poll_event().is_none(), "early timeout calls are harmless");
        n.handle_timeout(Time::from_secs(151));
        let ev = n.poll_event().unwrap();
        assert_eq!(
            (ev.kind(), ev.status()),
            (EventKind::Ack, Err(OpError::TimedOut))
        );
        assert!(ev.unlinked);
    }
}
