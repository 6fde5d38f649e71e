//! Multi-Rail dynamic discovery: the per-peer state machine of Lustre's dynamic discovery design.
//!
//! [`Discovery`] owns the node's [`PeerTable`] and a discovery state per peer.
//! It is sans-IO: every input is a `handle_*` (or DLC) call that takes `now`,
//! and every output is a list of [`Action`]s the caller carries out (send a
//! ping, send a push, send or fail a message). Nothing here blocks: where the
//! design has a sender "wait until woken by the discovery thread", the message
//! is **parked** on its peer and comes back later as an [`Action::Transmit`]
//! (discovery done) or [`Action::Fail`] (discovery failed).
//!
//! # States and events
//!
//! States ([`PeerState`]): `Init` (no peer object yet: the NID is unknown or
//! its peer NI is detached), `Verify` (configured by DLC, not yet checked),
//! `Discovery` (queued for the discovery thread), `WaitPingResponse` (ping
//! sent), `PushSent` (our ping buffer pushed, waiting for the ACK), `Active`.
//!
//! Events ([`PeerEvent`]) and the calls that feed them:
//!
//! | event | call |
//! |---|---|
//! | `RECV_ACK` | [`Discovery::handle_push_ack`] |
//! | `RECV_PING_PUSH` | [`Discovery::handle_push`] |
//! | `RECV_PING_REPLY` | [`Discovery::handle_ping_reply`] |
//! | `SEND` | [`Discovery::handle_send`] |
//! | `DLC_ADD_PEER_NI` | [`Discovery::dlc_add_peer_nis`] |
//! | `DLC_DEL_PEER_NI` | [`Discovery::dlc_del_peer_nis`] |
//! | `DLC_LOCAL_NI_CFG_UPDATE` | [`Discovery::local_ni_config_changed`] |
//!
//! The full table as implemented is in `lnet_xprt/DESIGN-peers.md`.
//!
//! # Driving it (calling-order contract)
//!
//! 1. On every message the node sends to a peer, call
//!    [`handle_send`](Discovery::handle_send) and carry out the actions: a
//!    [`Action::Transmit`] means "run pathway selection and send now".
//! 2. On every message received, call [`note_receive`](Discovery::note_receive)
//!    (it records the sender and returns the initiator NID for matching).
//!    Discovery traffic itself is recognised by the node (portal 0, ping
//!    match bits) and fed with `handle_ping_reply`, `handle_push`,
//!    `handle_push_ack` and the failure calls.
//! 3. The discovery thread's work (sending pings for queued peers) and the
//!    ping/push response timeouts are timers: ask
//!    [`poll_timeout`](Discovery::poll_timeout) and call
//!    [`handle_timeout`](Discovery::handle_timeout) at or after that time.
//!    Queued work is due as soon as it is queued. Early or repeated calls are
//!    harmless.
//!
//! ```
//! use colibri_lnet::discovery::{Action, Discovery, DiscoveryConfig, PeerState, SendClass};
//! use colibri_lnet::ids::Nid;
//! use colibri_lnet::wire::{NiStatus, PingFeatures, PingInfo, PingNi};
//! use colibri_lnet::time::Time;
//!
//! let peer: Nid = "10.0.0.2@tcp".parse()?;
//! let peer_ib: Nid = "192.168.0.2@o2ib".parse()?;
//! let me: Nid = "10.0.0.1@tcp".parse()?;
//! let mut dd: Discovery<&str> = Discovery::new(DiscoveryConfig::default(), 1);
//! let now = Time::from_secs(1);
//!
//! // First send: the message is parked and the peer queued for discovery.
//! assert!(dd.handle_send(now, peer, "hello", SendClass::Normal).is_empty());
//! assert_eq!(dd.state_of(peer), PeerState::Discovery);
//!
//! // The discovery thread's turn: a ping goes out.
//! let due = dd.poll_timeout().unwrap();
//! let actions = dd.handle_timeout(due);
//! assert!(matches!(actions[0], Action::SendPing { to, .. } if to == peer));
//!
//! // The reply says: Multi-Rail, two NIs. We push our NIs and release the message.
//! let up = |nid| PingNi { nid, status: NiStatus::Up, msg_size: 0 };
//! let info = PingInfo {
//!     features: PingFeatures::NI_STATUS
//!         .with(PingFeatures::MULTI_RAIL)
//!         .with(PingFeatures::DISCOVERY),
//!     pid: 12345,
//!     seqno: 7,
//!     lo_msg_size: 0,
//!     nis: vec![up(peer), up(peer_ib)],
//! };
//! let actions = dd.handle_ping_reply(now, peer, me, info);
//! assert!(actions.iter().any(|a| matches!(a, Action::SendPush { .. })));
//! assert!(actions.iter().any(|a| matches!(a, Action::Transmit { msg: "hello", .. })));
//! assert_eq!(dd.state_of(peer), PeerState::PushSent);
//! assert_eq!(dd.peers().peer_of(peer_ib).unwrap().ni_count(), 2);
//! # Ok::<(), colibri_lnet::ids::IdError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::ids::{Net, Nid};
use crate::peer::{Peer, PeerError, PeerId, PeerTable};
use crate::time::Time;
use crate::wire::{NiStatus, PingFeatures, PingInfo};

const TARGET: &str = "colibri_lnet::discovery";

/// Why a [`PingInfo`] is not acceptable (`lnet_ping_info_validate`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PingInfoError {
    /// The `NI_STATUS` feature bit is missing (old-style buffer).
    #[error("ping data lacks the NI_STATUS feature")]
    NoNiStatus,
    /// No interface besides loopback.
    #[error("ping data lists no interface")]
    Empty,
    /// An entry is `LNET_NID_ANY` or a loopback NID.
    #[error("ping data entry {index} is not a valid peer NID: {nid}")]
    BadNid {
        /// Index in [`PingInfo::nis`].
        index: usize,
        /// The NID.
        nid: Nid,
    },
    /// A push must come from a Multi-Rail node.
    #[error("push from a node that is not Multi-Rail")]
    NotMultiRail,
}

/// Checks what discovery relies on beyond what the wire decoder already
/// checked (`lnet_ping_info_validate`): `NI_STATUS` set, at least one NI
/// besides loopback, no loopback or ANY entry.
///
/// # Errors
/// The first problem found.
pub fn validate_ping_info(info: &PingInfo) -> Result<(), PingInfoError> {
    if !info.features.contains(PingFeatures::NI_STATUS) {
        return Err(PingInfoError::NoNiStatus);
    }
    if info.nis.is_empty() {
        return Err(PingInfoError::Empty);
    }
    if let Some((index, ni)) = info
        .nis
        .iter()
        .enumerate()
        .find(|(_, ni)| ni.nid.is_any() || ni.nid.is_lo())
    {
        return Err(PingInfoError::BadNid { index, nid: ni.nid });
    }
    Ok(())
}

fn merge_data(info: &PingInfo) -> Vec<(Nid, NiStatus)> {
    info.nis.iter().map(|n| (n.nid, n.status)).collect()
}

const fn is_multi_rail(info: &PingInfo) -> bool {
    info.features.contains(PingFeatures::MULTI_RAIL)
}

const fn has_discovery(info: &PingInfo) -> bool {
    info.features.contains(PingFeatures::DISCOVERY)
}

/// Discovery parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Dynamic discovery on (`lnetctl set discovery 1`, the default).
    pub enabled: bool,
    /// How long to wait for a ping REPLY (`lnet_transaction_timeout`, 150 s).
    pub ping_timeout: Duration,
    /// How long to wait for the ACK of a push (`lnet_transaction_timeout`).
    pub push_timeout: Duration,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ping_timeout: Duration::from_secs(150),
            push_timeout: Duration::from_secs(150),
        }
    }
}

/// Discovery state of a peer (as Lustre's discovery design names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerState {
    /// `LNET_PEER_STATE_INIT`: no peer object (unknown or detached NID).
    Init,
    /// `LNET_PEER_STATE_VERIFY`: known (DLC, or a failed discovery) but not
    /// verified; the next send starts discovery.
    Verify,
    /// `LNET_PEER_STATE_DISCOVERY`: queued for the discovery thread.
    Discovery,
    /// `LNET_PEER_STATE_WAIT_PING_RESPONSE`: ping sent, waiting for the reply.
    WaitPingResponse,
    /// `LNET_PEER_STATE_PUSH_SENT`: our ping buffer pushed, waiting for ACK.
    PushSent,
    /// `LNET_PEER_STATE_ACTIVE`: usable.
    Active,
}

impl PeerState {
    /// Lustre's name, e.g. `LNET_PEER_STATE_ACTIVE`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Init => "LNET_PEER_STATE_INIT",
            Self::Verify => "LNET_PEER_STATE_VERIFY",
            Self::Discovery => "LNET_PEER_STATE_DISCOVERY",
            Self::WaitPingResponse => "LNET_PEER_STATE_WAIT_PING_RESPONSE",
            Self::PushSent => "LNET_PEER_STATE_PUSH_SENT",
            Self::Active => "LNET_PEER_STATE_ACTIVE",
        }
    }
}

impl fmt::Display for PeerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The events of Lustre's discovery state table (used in logs and statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerEvent {
    /// `LNET_EVENT_RECV_ACK`: the ACK of our push.
    RecvAck,
    /// `LNET_EVENT_RECV_PING_PUSH`.
    RecvPingPush,
    /// `LNET_EVENT_RECV_PING_REPLY`.
    RecvPingReply,
    /// `LNET_EVENT_SEND`.
    Send,
    /// `LNET_EVENT_DLC_ADD_PEER_NI`.
    DlcAddPeerNi,
    /// `LNET_EVENT_DLC_DEL_PEER_NI`.
    DlcDelPeerNi,
    /// `LNET_EVENT_DLC_LOCAL_NI_CFG_UPDATE`.
    DlcLocalNiCfgUpdate,
}

/// Whether a message may trigger discovery (lnet.md 1.3 and 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendClass {
    /// A PUT or GET on a non-reserved portal: discovers the peer first.
    Normal,
    /// ACK, REPLY, or reserved-portal (ping/push) traffic: never parked, never
    /// starts discovery, always sent at once to the given NID.
    NoDiscovery,
}

/// Why discovery could not complete; parked messages fail with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// No ping REPLY within the ping timeout (`-ETIMEDOUT`).
    #[error("discovery ping to {0} timed out")]
    PingTimeout(Nid),
    /// The ping could not be sent (the node reported a send failure).
    #[error("discovery ping to {0} could not be sent")]
    PingSendFailed(Nid),
    /// The peer was deleted with the last local net it could be reached on
    /// ([`Discovery::local_net_removed`]).
    #[error("local net {0} deleted")]
    NetDeleted(Net),
    /// The ping REPLY was malformed (`-EPROTO`).
    #[error("invalid ping reply from {nid}: {error}")]
    InvalidReply {
        /// Who replied.
        nid: Nid,
        /// What was wrong.
        error: PingInfoError,
    },
    /// The destination can never be a peer (`LNET_NID_ANY`).
    #[error("{0} is not a valid destination")]
    InvalidTarget(Nid),
}

/// A ping failure reported by the node ([`Discovery::handle_ping_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PingFailure {
    /// The GET could not be sent (LND or send-path error).
    SendFailed,
    /// The REPLY did not fit the buffer: the peer has `needed_nis` entries.
    /// Discovery pings again with a buffer that large (lnet.md 3.5).
    Truncated {
        /// Number of NI entries the peer's ping buffer holds.
        needed_nis: u32,
    },
}

/// Something the node must do, returned by the discovery calls. Carry them out
/// in order.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action<M> {
    /// Send a discovery ping: an LNet GET on portal 0 with the ping match
    /// bits to `to`, with room for at least `max_nis` NI entries in the
    /// reply. Feed the outcome back with
    /// [`handle_ping_reply`](Discovery::handle_ping_reply) or
    /// [`handle_ping_failure`](Discovery::handle_ping_failure).
    SendPing {
        /// The peer being discovered.
        peer: PeerId,
        /// NID to ping (the peer's primary NID, or the NID an older push
        /// came from).
        to: Nid,
        /// Reply buffer size, in NI entries (at least 16).
        max_nis: u32,
        /// Send to exactly `to`, not to whichever NI of a Multi-Rail peer
        /// selection picks: a check of the NID an older push came from,
        /// whose other NIs may be gone with the peer's last incarnation.
        exact: bool,
    },
    /// Push our ping buffer (sequence `seq`) to `to`: an LNet PUT with ACK on
    /// portal 0, ping match bits, from local NI `from` when given (else
    /// selection picks). Feed the ACK to
    /// [`handle_push_ack`](Discovery::handle_push_ack).
    SendPush {
        /// The peer.
        peer: PeerId,
        /// Destination NID.
        to: Nid,
        /// Local NI to send from, if it matters (the NI that got the reply).
        from: Option<Nid>,
        /// Our ping buffer sequence number being pushed.
        seq: u32,
    },
    /// Send this message now: run pathway selection towards `target` and
    /// hand it to the credit queues. Released parked messages come out in the
    /// order they were parked.
    Transmit {
        /// The destination peer (`None` for loopback).
        peer: Option<PeerId>,
        /// The NID the message was sent to.
        target: Nid,
        /// The message.
        msg: M,
    },
    /// Finalize this message with `error`; it will not be sent.
    Fail {
        /// The NID the message was sent to.
        target: Nid,
        /// The message.
        msg: M,
        /// Why.
        error: DiscoveryError,
    },
    /// A peer NI's advertised status changed. `Up` → `Down` counts as a
    /// remote failure for health (lnet.md 3.7).
    PeerNiStatus {
        /// The peer NI.
        nid: Nid,
        /// Previous status.
        old: NiStatus,
        /// New status.
        new: NiStatus,
    },
    /// Peer `absorbed` turned out to be the same node as `into` and was
    /// merged into it (its NIs moved, its parked messages taken over).
    PeersMerged {
        /// The surviving peer.
        into: PeerId,
        /// The deleted peer.
        absorbed: PeerId,
    },
}

/// Counters (readable without logging).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoveryStats {
    /// Pings sent.
    pub pings_sent: u64,
    /// Pushes sent.
    pub pushes_sent: u64,
    /// Ping replies merged.
    pub replies_merged: u64,
    /// Pushes merged.
    pub pushes_merged: u64,
    /// Pushes ignored because their sequence number was older than the
    /// last one seen (the peer restarted, or two pushes crossed); an
    /// `Active` peer is pinged instead.
    pub stale_pushes: u64,
    /// Pings that failed or timed out.
    pub ping_failures: u64,
    /// Pushes that failed or timed out.
    pub push_failures: u64,
    /// Events the table calls unexpected or impossible ("log error").
    pub unexpected_events: u64,
    /// Ping replies or pushes rejected as malformed.
    pub invalid_ping_info: u64,
    /// Peers absorbed by merging.
    pub peers_merged: u64,
    /// Messages parked waiting for discovery.
    pub parked: u64,
    /// Parked messages failed.
    pub failed: u64,
}

/// Minimum reply buffer, in NI entries (`LNET_INTERFACES_MIN`).
const MIN_PING_NIS: u32 = 16;

#[derive(Debug)]
struct PeerDisc<M> {
    state: PeerState,
    parked: VecDeque<(Nid, M)>,
    /// Last sequence number received from the peer (reply or push).
    peer_seq: Option<u32>,
    /// Our sequence number the peer has acknowledged.
    node_seq: Option<u32>,
    /// Sequence number of the outstanding push.
    push_seq: Option<u32>,
    /// Ping or push response deadline.
    deadline: Option<Time>,
    /// Whether one discovery round completed with discovery on.
    discovered: bool,
    /// Reply buffer size for the next ping.
    ping_nis: u32,
    last_error: Option<DiscoveryError>,
    /// Where the next discovery ping goes instead of the primary NID: the
    /// NID an older push came from (the primary may be gone with the
    /// peer's last incarnation).
    ping_at: Option<Nid>,
}

/// Sets peer `id`'s ping or push deadline, keeping the index `due` in
/// step (every change of a deadline goes through here).
fn set_deadline<M>(
    due: &mut BTreeSet<(Time, PeerId)>,
    id: PeerId,
    d: &mut PeerDisc<M>,
    at: Option<Time>,
) {
    if d.deadline == at {
        return;
    }
    if let Some(t) = d.deadline {
        due.remove(&(t, id));
    }
    if let Some(t) = at {
        due.insert((t, id));
    }
    d.deadline = at;
}

impl<M> PeerDisc<M> {
    fn new(state: PeerState) -> Self {
        Self {
            state,
            parked: VecDeque::new(),
            peer_seq: None,
            node_seq: None,
            push_seq: None,
            deadline: None,
            discovered: false,
            ping_nis: MIN_PING_NIS,
            last_error: None,
            ping_at: None,
        }
    }
}

/// The discovery state machine of one node, with its peer table.
///
/// `M` is the node's message type: messages are handed in with
/// [`handle_send`](Self::handle_send) and always come back exactly once, as
/// [`Action::Transmit`] or [`Action::Fail`].
#[derive(Debug)]
pub struct Discovery<M> {
    config: DiscoveryConfig,
    table: PeerTable,
    disc: BTreeMap<PeerId, PeerDisc<M>>,
    /// Messages parked on every peer (the sum of `disc[..].parked.len()`,
    /// kept so that counting them does not walk every peer).
    parked_now: usize,
    /// Every ping or push deadline, `(deadline, peer)`, kept in step with
    /// the peers' `deadline` by [`set_deadline`].
    due: BTreeSet<(Time, PeerId)>,
    /// Work for the discovery thread: peers in `Discovery`, with queue time.
    queue: VecDeque<(PeerId, Time)>,
    local_seq: u32,
    stats: DiscoveryStats,
}

impl<M> Discovery<M> {
    /// A discovery machine with an empty peer table; `local_seq` is the
    /// sequence number of the node's own ping buffer.
    #[must_use]
    pub fn new(config: DiscoveryConfig, local_seq: u32) -> Self {
        Self {
            config,
            table: PeerTable::new(),
            disc: BTreeMap::new(),
            parked_now: 0,
            due: BTreeSet::new(),
            queue: VecDeque::new(),
            local_seq,
            stats: DiscoveryStats::default(),
        }
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &DiscoveryConfig {
        &self.config
    }

    /// The peer table (read-only: it changes only through discovery and DLC).
    #[must_use]
    pub const fn peers(&self) -> &PeerTable {
        &self.table
    }

    /// Counters.
    #[must_use]
    pub const fn stats(&self) -> &DiscoveryStats {
        &self.stats
    }

    /// Sequence number of the node's ping buffer as last told.
    #[must_use]
    pub const fn local_seq(&self) -> u32 {
        self.local_seq
    }

    /// The discovery state of the peer owning `nid` (`Init` if none does).
    #[must_use]
    pub fn state_of(&self, nid: Nid) -> PeerState {
        self.table
            .peer_id_of(nid)
            .map_or(PeerState::Init, |id| self.peer_state(id))
    }

    /// The discovery state of peer `id` (`Init` if it does not exist).
    #[must_use]
    pub fn peer_state(&self, id: PeerId) -> PeerState {
        self.disc.get(&id).map_or(PeerState::Init, |d| d.state)
    }

    /// Locks or unlocks the primary NID of the peer whose primary is
    /// `primary` (`lnetctl peer add --lock_prim`; see
    /// [`Peer::is_primary_locked`](crate::peer::Peer::is_primary_locked)).
    ///
    /// # Errors
    /// [`PeerError::NotFound`] when `primary` is not a peer's primary NID.
    pub fn set_primary_locked(&mut self, primary: Nid, locked: bool) -> Result<(), PeerError> {
        let id = self
            .table
            .peer_of(primary)
            .filter(|p| p.primary_nid() == primary)
            .map(Peer::id)
            .ok_or(PeerError::NotFound(primary))?;
        self.table.set_primary_locked(id, locked)
    }

    /// `lnetctl peer set --nid NID --state BITS` ("for test and debug
    /// only"): sets the flags of the peer owning `nid` from Lustre's
    /// `lp_state` bits that the peer table holds: `MULTI_RAIL` (bit 0),
    /// `CONFIGURED` (3), `LOCK_PRIMARY` (20) and `BAD_CONFIG` (21). The
    /// bits of discovery's progress (1, 4 to 12) follow this machine's
    /// state and are not set by hand (`discover --force` starts discovery
    /// again); [`Discovery::lustre_state`] reads them all back.
    ///
    /// # Errors
    /// [`PeerError::NotFound`] when no peer owns `nid`; as
    /// [`PeerTable::set_flags`].
    pub fn set_lustre_state(&mut self, nid: Nid, bits: u32) -> Result<(), PeerError> {
        let id = self.table.peer_id_of(nid).ok_or(PeerError::NotFound(nid))?;
        let bit = |n: u32| bits & (1 << n) != 0;
        self.table.set_flags(
            id,
            crate::peer::PeerFlags {
                multi_rail: bit(0),
                configured: bit(3),
                lock_primary: bit(20),
                bad_config: bit(21),
            },
        )
    }

    /// The peer's state as Lustre's `lp_state` flags, which `lnetctl peer
    /// show -v` prints as `peer state` (273 for a discovered Multi-Rail
    /// peer): `MULTI_RAIL` (bit 0), `NO_DISCOVERY` (1), `CONFIGURED` (3),
    /// `DISCOVERED` (4), `REDISCOVER` (5: its discovery failed, the next
    /// send tries again), `DISCOVERING` (6), `NIDS_UPTODATE` (8),
    /// `PING_SENT` (9), `PUSH_SENT` (10), `PING_FAILED` (11),
    /// `LOCK_PRIMARY` (20), `BAD_CONFIG` (21), from this machine's state
    /// and the peer's flags.
    #[must_use]
    pub fn lustre_state(&self, id: PeerId) -> u32 {
        let mut bits = 0;
        if let Some(p) = self.table.peer(id) {
            bits |= u32::from(p.is_multi_rail());
            bits |= u32::from(p.no_discovery()) << 1;
            bits |= u32::from(p.is_configured()) << 3;
            bits |= u32::from(p.is_primary_locked()) << 20;
            bits |= u32::from(p.is_bad_config()) << 21;
        }
        let Some(d) = self.disc.get(&id) else {
            return bits;
        };
        let failed = d.state == PeerState::Verify && d.last_error.is_some();
        bits |= u32::from(d.discovered) << 4;
        bits |= u32::from(failed) << 5;
        bits |= u32::from(matches!(
            d.state,
            PeerState::Discovery | PeerState::WaitPingResponse | PeerState::PushSent
        )) << 6;
        bits |= u32::from(d.discovered && d.state != PeerState::Verify) << 8;
        bits |= u32::from(d.state == PeerState::WaitPingResponse) << 9;
        bits |= u32::from(d.state == PeerState::PushSent) << 10;
        bits |= u32::from(failed) << 11;
        bits
    }

    /// Number of messages parked on the peer owning `nid`.
    #[must_use]
    pub fn parked_count(&self, nid: Nid) -> usize {
        self.table
            .peer_id_of(nid)
            .and_then(|id| self.disc.get(&id))
            .map_or(0, |d| d.parked.len())
    }

    /// Messages parked on every peer under discovery.
    #[must_use]
    pub fn parked_total(&self) -> usize {
        self.parked_now
    }

    /// The last sequence number the peer owning `nid` sent us.
    #[must_use]
    pub fn peer_seq(&self, nid: Nid) -> Option<u32> {
        self.disc_of(nid).and_then(|d| d.peer_seq)
    }

    /// Our ping sequence number the peer owning `nid` has acknowledged.
    #[must_use]
    pub fn acked_seq(&self, nid: Nid) -> Option<u32> {
        self.disc_of(nid).and_then(|d| d.node_seq)
    }

    /// The error of the peer's last failed discovery, if the last one failed.
    #[must_use]
    pub fn last_error(&self, nid: Nid) -> Option<&DiscoveryError> {
        self.disc_of(nid).and_then(|d| d.last_error.as_ref())
    }

    fn disc_of(&self, nid: Nid) -> Option<&PeerDisc<M>> {
        self.table.peer_id_of(nid).and_then(|id| self.disc.get(&id))
    }

    /// Receive path (`lnet_peer_recv_data`): records that a message arrived
    /// from `from` (a detached peer NI is created for an unknown sender;
    /// receiving never starts discovery) and returns the initiator NID to
    /// use for matching: the primary NID of the sender's peer, or `from`.
    pub fn note_receive(&mut self, from: Nid) -> Nid {
        if self.table.ensure_ni(from).is_err() {
            return from;
        }
        self.table.primary_nid(from)
    }

    fn set_state(&mut self, id: PeerId, state: PeerState, event: PeerEvent) {
        if let Some(d) = self.disc.get_mut(&id) {
            if d.state != state {
                tracing::debug!(target: TARGET, peer = %id, from = %d.state, to = %state,
                    ?event, "peer state change");
            }
            d.state = state;
        }
    }

    fn unexpected(&mut self, nid: Nid, state: PeerState, event: PeerEvent) {
        self.stats.unexpected_events += 1;
        tracing::warn!(target: TARGET, %nid, %state, ?event, "unexpected discovery event ignored");
    }

    fn enqueue(&mut self, id: PeerId, now: Time) {
        self.set_state(id, PeerState::Discovery, PeerEvent::Send);
        self.queue.push_back((id, now));
    }

    fn park(&mut self, id: PeerId, target: Nid, msg: M) {
        if let Some(d) = self.disc.get_mut(&id) {
            d.parked.push_back((target, msg));
            self.parked_now += 1;
            self.stats.parked += 1;
        }
    }

    fn release(&mut self, id: PeerId, out: &mut Vec<Action<M>>) {
        if let Some(d) = self.disc.get_mut(&id) {
            self.parked_now -= d.parked.len();
            out.extend(d.parked.drain(..).map(|(target, msg)| Action::Transmit {
                peer: Some(id),
                target,
                msg,
            }));
        }
    }

    /// Takes out the parked messages `pred` selects, on every peer (the
    /// messages of an MD unlinked while they waited: they will never be
    /// sent). Costs nothing while no message is parked.
    pub fn take_parked(&mut self, mut pred: impl FnMut(&M) -> bool) -> Vec<M> {
        let mut out = Vec::new();
        if self.parked_now == 0 {
            return out;
        }
        for d in self.disc.values_mut() {
            if d.parked.iter().any(|(_, m)| pred(m)) {
                let taken = crate::deque::take_where(&mut d.parked, |(_, m)| pred(m));
                out.extend(taken.into_iter().map(|(_, m)| m));
            }
        }
        self.parked_now -= out.len();
        out
    }

    fn fail_parked(&mut self, id: PeerId, error: &DiscoveryError, out: &mut Vec<Action<M>>) {
        if let Some(d) = self.disc.get_mut(&id) {
            self.stats.failed += d.parked.len() as u64;
            self.parked_now -= d.parked.len();
            out.extend(d.parked.drain(..).map(|(target, msg)| Action::Fail {
                target,
                msg,
                error: error.clone(),
            }));
        }
    }

    fn new_peer(&mut self, nid: Nid) -> Result<PeerId, PeerError> {
        let id = self.table.create_peer(nid)?;
        self.disc.insert(id, PeerDisc::new(PeerState::Init));
        Ok(id)
    }

    fn push_action(
        &mut self,
        id: PeerId,
        now: Time,
        to: Nid,
        from: Option<Nid>,
        event: PeerEvent,
    ) -> Action<M> {
        let seq = self.local_seq;
        if let Some(d) = self.disc.get_mut(&id) {
            d.push_seq = Some(seq);
            set_deadline(&mut self.due, id, d, Some(now + self.config.push_timeout));
        }
        self.stats.pushes_sent += 1;
        self.set_state(id, PeerState::PushSent, event);
        tracing::debug!(target: TARGET, peer = %id, %to, seq, "sending push");
        Action::SendPush {
            peer: id,
            to,
            from,
            seq,
        }
    }

    // ---------------------------------------------------------------- SEND

    /// Whether a message to `target` goes out at once, without a word
    /// from discovery (its peer is known and discovered): what
    /// [`handle_send`](Self::handle_send) would answer with a single
    /// `Transmit`, asked without moving the message (the send path's
    /// common case).
    #[must_use]
    pub fn sends_at_once(&self, target: Nid) -> bool {
        !target.is_any()
            && !target.is_lo()
            && self.table.peer_id_of(target).is_some_and(|id| {
                matches!(self.peer_state(id), PeerState::PushSent | PeerState::Active)
            })
    }

    /// `LNET_EVENT_SEND`: the node wants to send `msg` to `target`.
    ///
    /// | state | result |
    /// |---|---|
    /// | `Init` | peer created; discovery on: parked, `Discovery`; off: `Active` + `Transmit` |
    /// | `Verify` | discovery on: parked, `Discovery`; off: `Active` + `Transmit` |
    /// | `Discovery`, `WaitPingResponse` | parked until discovery ends |
    /// | `PushSent`, `Active` | `Transmit` |
    ///
    /// [`SendClass::NoDiscovery`] messages and loopback targets are always
    /// transmitted at once; `LNET_NID_ANY` fails with
    /// [`DiscoveryError::InvalidTarget`].
    pub fn handle_send(
        &mut self,
        now: Time,
        target: Nid,
        msg: M,
        class: SendClass,
    ) -> Vec<Action<M>> {
        if target.is_any() {
            return vec![Action::Fail {
                target,
                msg,
                error: DiscoveryError::InvalidTarget(target),
            }];
        }
        if target.is_lo() {
            return vec![Action::Transmit {
                peer: None,
                target,
                msg,
            }];
        }
        if class == SendClass::NoDiscovery {
            let _ = self.table.ensure_ni(target);
            return vec![Action::Transmit {
                peer: self.table.peer_id_of(target),
                target,
                msg,
            }];
        }
        let id = match self.table.peer_id_of(target) {
            Some(id) => id,
            // INIT + SEND: create the peer (it stays in INIT only for the
            // duration of this call).
            None => match self.new_peer(target) {
                Ok(id) => id,
                Err(e) => {
                    tracing::error!(target: TARGET, %target, %e, "cannot create peer");
                    return vec![Action::Fail {
                        target,
                        msg,
                        error: DiscoveryError::InvalidTarget(target),
                    }];
                }
            },
        };
        let state = self.peer_state(id);
        match state {
            PeerState::Init | PeerState::Verify => {
                if self.config.enabled {
                    self.enqueue(id, now);
                    self.park(id, target, msg);
                    Vec::new()
                } else {
                    self.set_state(id, PeerState::Active, PeerEvent::Send);
                    vec![Action::Transmit {
                        peer: Some(id),
                        target,
                        msg,
                    }]
                }
            }
            PeerState::Discovery | PeerState::WaitPingResponse => {
                self.park(id, target, msg);
                Vec::new()
            }
            PeerState::PushSent | PeerState::Active => vec![Action::Transmit {
                peer: Some(id),
                target,
                msg,
            }],
        }
    }

    /// Explicit discovery (`lnetctl discover NID [--force]`, and the design's
    /// "FORCE_DISCOVERY" investigation item): queue the peer owning `nid`
    /// for a ping. `Init` creates the peer; `Verify` is queued; an `Active`
    /// peer is queued only when `force` (re-ping a known peer, e.g. a
    /// gateway). A peer already being discovered is left alone.
    ///
    /// # Errors
    /// [`PeerError::InvalidNid`]; [`PeerError::Busy`] for a peer in
    /// `PushSent` (its discovery round is finishing); discovery being off is
    /// not an error: the peer is simply left as it is (lnet.md 3.8).
    pub fn discover(&mut self, now: Time, nid: Nid, force: bool) -> Result<PeerId, PeerError> {
        let id = match self.table.peer_id_of(nid) {
            Some(id) => id,
            None => self.new_peer(nid)?,
        };
        match self.peer_state(id) {
            PeerState::PushSent => return Err(PeerError::Busy(nid)),
            PeerState::Discovery | PeerState::WaitPingResponse => {}
            PeerState::Init | PeerState::Verify | PeerState::Active => {
                let queue =
                    self.config.enabled && (force || self.peer_state(id) != PeerState::Active);
                if queue {
                    self.enqueue(id, now);
                } else if self.peer_state(id) == PeerState::Init {
                    self.set_state(id, PeerState::Active, PeerEvent::Send);
                }
            }
        }
        Ok(id)
    }

    // ------------------------------------------------- discovery thread

    /// The discovery thread's turn: every peer queued in `Discovery` gets a
    /// ping and moves to `WaitPingResponse` (Lustre's discovery design, "On the DD thread").
    /// If discovery was switched off meanwhile, the peer becomes `Active` and
    /// its parked messages are released. Called by
    /// [`handle_timeout`](Self::handle_timeout) too.
    pub fn process_queue(&mut self, now: Time) -> Vec<Action<M>> {
        let mut out = Vec::new();
        while let Some((id, _)) = self.queue.pop_front() {
            if self.peer_state(id) != PeerState::Discovery {
                continue; // merged away or handled otherwise meanwhile
            }
            if self.config.enabled {
                let Some(peer) = self.table.peer(id) else {
                    continue;
                };
                let Some(d) = self.disc.get_mut(&id) else {
                    continue;
                };
                // The primary NID, unless a NID of the peer was asked for.
                let at = d.ping_at.take().filter(|&n| peer.contains(n));
                let to = at.unwrap_or_else(|| peer.primary_nid());
                set_deadline(&mut self.due, id, d, Some(now + self.config.ping_timeout));
                let max_nis = d.ping_nis;
                self.set_state(id, PeerState::WaitPingResponse, PeerEvent::Send);
                self.stats.pings_sent += 1;
                tracing::debug!(target: TARGET, peer = %id, %to, "sending discovery ping");
                out.push(Action::SendPing {
                    peer: id,
                    to,
                    max_nis,
                    exact: at.is_some(),
                });
            } else {
                self.set_state(id, PeerState::Active, PeerEvent::Send);
                self.release(id, &mut out);
            }
        }
        out
    }

    // ---------------------------------------------------- RECV_PING_REPLY

    /// `LNET_EVENT_RECV_PING_REPLY`: the peer NID `from` answered our ping
    /// with `info`; `local` is our NI that received the reply.
    ///
    /// Only a peer in `WaitPingResponse` accepts it: the data is merged into
    /// the peer (NIs added, moved from other peers, detached when no longer
    /// listed; other peers found to be the same node absorbed), parked
    /// messages are released, and a Multi-Rail peer (discovery on) is pushed
    /// our NIs from `local` to `from` and goes to `PushSent`, else `Active`.
    /// A malformed reply fails the discovery like a timeout. In every other
    /// state the reply is logged and ignored.
    pub fn handle_ping_reply(
        &mut self,
        now: Time,
        from: Nid,
        local: Nid,
        info: PingInfo,
    ) -> Vec<Action<M>> {
        let state = self.state_of(from);
        let Some(id) = self.table.peer_id_of(from) else {
            // INIT: impossible event.
            self.unexpected(from, state, PeerEvent::RecvPingReply);
            return Vec::new();
        };
        if state != PeerState::WaitPingResponse {
            self.unexpected(from, state, PeerEvent::RecvPingReply);
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Err(error) = validate_ping_info(&info) {
            self.stats.invalid_ping_info += 1;
            tracing::warn!(target: TARGET, %from, %error, "invalid ping reply");
            self.discovery_failed(
                id,
                DiscoveryError::InvalidReply { nid: from, error },
                &mut out,
            );
            return out;
        }
        if let Some(d) = self.disc.get_mut(&id) {
            d.peer_seq = Some(info.seqno);
            set_deadline(&mut self.due, id, d, None);
            d.discovered = self.config.enabled;
            d.last_error = None;
            d.ping_nis = MIN_PING_NIS;
        }
        self.merge_info(id, from, &info, &mut out);
        self.stats.replies_merged += 1;
        let multi_rail = self.table.peer(id).is_some_and(|p| p.is_multi_rail());
        // Release first: these were parked before anything sent from now on.
        self.release(id, &mut out);
        if self.config.enabled && multi_rail {
            let push = self.push_action(id, now, from, Some(local), PeerEvent::RecvPingReply);
            out.insert(0, push);
        } else {
            self.set_state(id, PeerState::Active, PeerEvent::RecvPingReply);
        }
        out
    }

    /// Applies what the peer says about itself: Multi-Rail and discovery
    /// flags, then the NID merge, then hands over absorbed peers' state.
    fn merge_info(&mut self, id: PeerId, from: Nid, info: &PingInfo, out: &mut Vec<Action<M>>) {
        let Some(peer) = self.table.peer(id) else {
            return;
        };
        let configured = peer.is_configured();
        let was_mr = peer.is_multi_rail();
        let no_discovery = !self.config.enabled || !has_discovery(info);
        let multi_rail = if configured {
            was_mr
        } else {
            self.config.enabled && has_discovery(info) && is_multi_rail(info)
        };
        if was_mr && !multi_rail && !configured {
            // Lustre marks such a peer for deletion and re-creates it as a
            // plain peer: keep only the NID that answered.
            let keep = if peer.contains(from) {
                from
            } else {
                peer.primary_nid()
            };
            if let Ok(gone) = self.table.reduce_to(id, keep) {
                tracing::info!(target: TARGET, peer = %id, ?gone, "peer is no longer Multi-Rail");
            }
        }
        if let Err(e) = self
            .table
            .set_discovered_flags(id, multi_rail, no_discovery)
        {
            tracing::error!(target: TARGET, peer = %id, %e, "cannot set peer flags");
        }
        let may_change = self.config.enabled && multi_rail && !no_discovery;
        let report = match self.table.merge(id, &merge_data(info), may_change) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(target: TARGET, peer = %id, %e, "merge failed");
                return;
            }
        };
        for (nid, e) in &report.skipped {
            tracing::warn!(target: TARGET, peer = %id, %nid, %e, "NID from ping data not taken");
        }
        for &(nid, old, new) in &report.status_changes {
            if new != NiStatus::Invalid {
                out.push(Action::PeerNiStatus { nid, old, new });
            }
        }
        for &absorbed in &report.absorbed {
            self.stats.peers_merged += 1;
            if let Some(gone) = self.disc.remove(&absorbed) {
                if let Some(t) = gone.deadline {
                    self.due.remove(&(t, absorbed));
                }
                if let Some(d) = self.disc.get_mut(&id) {
                    d.parked.extend(gone.parked);
                    d.node_seq = d.node_seq.max(gone.node_seq);
                } else {
                    // Not reached: the absorbing peer is the one whose
                    // discovery state is being updated.
                    self.parked_now -= gone.parked.len();
                }
            }
            out.push(Action::PeersMerged { into: id, absorbed });
        }
    }

    fn discovery_failed(&mut self, id: PeerId, error: DiscoveryError, out: &mut Vec<Action<M>>) {
        self.stats.ping_failures += 1;
        tracing::warn!(target: TARGET, peer = %id, %error, "discovery failed");
        self.fail_parked(id, &error, out);
        if let Some(d) = self.disc.get_mut(&id) {
            set_deadline(&mut self.due, id, d, None);
            d.last_error = Some(error);
        }
        // Lustre leaves the peer REDISCOVER: the next send tries again.
        self.set_state(id, PeerState::Verify, PeerEvent::RecvPingReply);
    }

    /// The node reports that the discovery ping to `nid` failed. A peer in
    /// `WaitPingResponse` fails its parked messages and goes to `Verify` (the
    /// next send discovers again); a truncated reply instead pings again with
    /// a buffer large enough. Ignored (and counted) in other states.
    pub fn handle_ping_failure(
        &mut self,
        now: Time,
        nid: Nid,
        failure: PingFailure,
    ) -> Vec<Action<M>> {
        let state = self.state_of(nid);
        let mut out = Vec::new();
        let Some(id) = self.table.peer_id_of(nid) else {
            self.unexpected(nid, state, PeerEvent::RecvPingReply);
            return out;
        };
        if state != PeerState::WaitPingResponse {
            self.unexpected(nid, state, PeerEvent::RecvPingReply);
            return out;
        }
        match failure {
            PingFailure::Truncated { needed_nis } => {
                let to = self.table.peer(id).map_or(nid, |p| p.primary_nid());
                if let Some(d) = self.disc.get_mut(&id) {
                    d.ping_nis = needed_nis.max(d.ping_nis);
                    set_deadline(&mut self.due, id, d, Some(now + self.config.ping_timeout));
                    self.stats.pings_sent += 1;
                    out.push(Action::SendPing {
                        peer: id,
                        to,
                        max_nis: d.ping_nis,
                        exact: false,
                    });
                }
            }
            PingFailure::SendFailed => {
                self.discovery_failed(id, DiscoveryError::PingSendFailed(nid), &mut out);
            }
        }
        out
    }

    // ----------------------------------------------------- RECV_PING_PUSH

    /// `LNET_EVENT_RECV_PING_PUSH`: the peer NID `from` pushed its ping
    /// buffer `info` to us.
    ///
    /// | state | result |
    /// |---|---|
    /// | `Init` | peer created for `from`, push merged, `Active` |
    /// | `PushSent`, `Active` | merged if its sequence number is not older than the last one seen; state kept. An older one is ignored, and an `Active` peer is pinged (`Discovery`, then `WaitPingResponse`): a restarted peer numbers from the start again, and its reply is taken whatever its number |
    /// | `Verify`, `Discovery`, `WaitPingResponse` | unexpected: dropped |
    ///
    /// A malformed push, or one from a node that is not Multi-Rail, is
    /// dropped and counted.
    pub fn handle_push(&mut self, now: Time, from: Nid, info: PingInfo) -> Vec<Action<M>> {
        let state = self.state_of(from);
        let mut out = Vec::new();
        match state {
            PeerState::Verify | PeerState::Discovery | PeerState::WaitPingResponse => {
                self.unexpected(from, state, PeerEvent::RecvPingPush);
                return out;
            }
            PeerState::Init | PeerState::PushSent | PeerState::Active => {}
        }
        let valid = validate_ping_info(&info).and_then(|()| {
            if is_multi_rail(&info) {
                Ok(())
            } else {
                Err(PingInfoError::NotMultiRail)
            }
        });
        if let Err(error) = valid {
            self.stats.invalid_ping_info += 1;
            tracing::warn!(target: TARGET, %from, %error, "push dropped");
            return out;
        }
        let id = match self.table.peer_id_of(from) {
            Some(id) => {
                // Older than the last ping buffer seen: the data is not
                // taken (the seed's rule), but the peer is pinged, for a
                // push numbered lower means it restarted (it numbers from
                // the start again) or two pushes crossed, and its ping
                // reply, always taken, says which NIs it has now. Without
                // the ping, a peer that restarted with other NIs would be
                // known by its old ones for good. An equal number is taken
                // (the seed is silent; Lustre takes every push as new
                // data): the same data again, or a restart that numbered
                // as far.
                let last = self.disc.get(&id).and_then(|d| d.peer_seq);
                if last.is_some_and(|last| info.seqno < last) {
                    self.stats.stale_pushes += 1;
                    tracing::info!(target: TARGET, %from, seq = info.seqno, ?last, "push older than the last seen: ignored, peer pinged (restarted?)");
                    if state == PeerState::Active && self.config.enabled {
                        // Ping where the push came from: the primary may
                        // have gone with the peer's last incarnation.
                        if let Some(d) = self.disc.get_mut(&id) {
                            d.ping_at = Some(from);
                        }
                        self.enqueue(id, now);
                        out.extend(self.process_queue(now));
                    }
                    return out;
                }
                id
            }
            None => match self.new_peer(from) {
                Ok(id) => id,
                Err(e) => {
                    tracing::warn!(target: TARGET, %from, %e, "push from invalid NID dropped");
                    return out;
                }
            },
        };
        if let Some(d) = self.disc.get_mut(&id) {
            d.peer_seq = Some(info.seqno);
            if state == PeerState::Init {
                d.discovered = self.config.enabled;
            }
        }
        self.merge_info(id, from, &info, &mut out);
        self.stats.pushes_merged += 1;
        if state == PeerState::Init {
            self.set_state(id, PeerState::Active, PeerEvent::RecvPingPush);
        }
        // Parked messages taken over from absorbed peers, if any: this peer is
        // not being discovered, so they go now.
        self.release(id, &mut out);
        out
    }

    // ------------------------------------------------------------ RECV_ACK

    /// `LNET_EVENT_RECV_ACK`: the ACK of our push arrived from `from`.
    ///
    /// `PushSent` → `Active` (the peer now knows our ping buffer sequence
    /// number). `Init`, `WaitPingResponse`: no-op. `Verify`, `Discovery`,
    /// `Active`: unexpected, logged and ignored.
    pub fn handle_push_ack(&mut self, now: Time, from: Nid) -> Vec<Action<M>> {
        let _ = now;
        let state = self.state_of(from);
        match state {
            PeerState::Init | PeerState::WaitPingResponse => {}
            PeerState::Verify | PeerState::Discovery | PeerState::Active => {
                self.unexpected(from, state, PeerEvent::RecvAck);
            }
            PeerState::PushSent => {
                if let Some(id) = self.table.peer_id_of(from) {
                    if let Some(d) = self.disc.get_mut(&id) {
                        d.node_seq = d.push_seq.take();
                        set_deadline(&mut self.due, id, d, None);
                    }
                    self.set_state(id, PeerState::Active, PeerEvent::RecvAck);
                }
            }
        }
        Vec::new()
    }

    /// The node reports that our push to `nid` failed (send error). The peer
    /// goes `Active` without having acknowledged our sequence number; the
    /// next local configuration change pushes again. Ignored in other states.
    pub fn handle_push_failure(&mut self, now: Time, nid: Nid) -> Vec<Action<M>> {
        let _ = now;
        let state = self.state_of(nid);
        if state != PeerState::PushSent {
            self.unexpected(nid, state, PeerEvent::RecvAck);
            return Vec::new();
        }
        if let Some(id) = self.table.peer_id_of(nid) {
            self.push_failed(id);
        }
        Vec::new()
    }

    fn push_failed(&mut self, id: PeerId) {
        self.stats.push_failures += 1;
        if let Some(d) = self.disc.get_mut(&id) {
            d.push_seq = None;
            set_deadline(&mut self.due, id, d, None);
        }
        tracing::warn!(target: TARGET, peer = %id, "push not acknowledged");
        self.set_state(id, PeerState::Active, PeerEvent::RecvAck);
    }

    // ------------------------------------------------------------------ DLC

    /// `LNET_EVENT_DLC_ADD_PEER_NI` (`lnetctl peer add`): configure the peer
    /// with primary NID `primary` to have `nids` too, Multi-Rail or not. The
    /// peer becomes DLC-configured: discovery will not change its NIDs.
    ///
    /// | state | result |
    /// |---|---|
    /// | `Init` | peer created; `Verify` (discovery on) or `Active` (off) |
    /// | `Verify` | NIDs added; stays `Verify` |
    /// | `Active` | NIDs it lacks added; stays `Active` |
    /// | `Discovery`, `WaitPingResponse`, `PushSent` | [`PeerError::Busy`] |
    ///
    /// # Errors
    /// [`PeerError::Busy`]; [`PeerError::InvalidNid`]; [`PeerError::NidInUse`]
    /// when a NID belongs to another peer (nothing is changed: the design's
    /// "abort operation and roll back"); [`PeerError::NotUnique`] and
    /// [`PeerError::MultiRailConflict`] as [`PeerTable::dlc_add`].
    pub fn dlc_add_peer_nis(
        &mut self,
        now: Time,
        primary: Nid,
        nids: &[Nid],
        multi_rail: bool,
    ) -> Result<PeerId, PeerError> {
        let state = self.state_of(primary);
        match state {
            PeerState::Discovery | PeerState::WaitPingResponse | PeerState::PushSent => {
                return Err(PeerError::Busy(primary));
            }
            PeerState::Init | PeerState::Verify | PeerState::Active => {}
        }
        // `primary` is another peer's NID, not its primary (Lustre's
        // `lnet_peer_add`): a configured peer keeps it (`-EEXIST`), so does
        // one whose primary is locked (`-EALREADY`); a peer only
        // discovered is deleted and made again around `primary`.
        if let Some(owner) = self.table.peer_of(primary)
            && owner.primary_nid() != primary
        {
            let other = owner.primary_nid();
            if owner.is_configured() {
                return Err(PeerError::NidInUse {
                    nid: primary,
                    owner: other,
                });
            }
            if owner.is_primary_locked() {
                return Err(PeerError::OwnerPrimaryLocked {
                    nid: primary,
                    owner: other,
                });
            }
            // Checked before anything goes: the new peer's NIDs must be
            // free once the old peer is gone.
            for &nid in nids {
                if let Some(o) = self.table.peer_of(nid)
                    && o.primary_nid() != other
                {
                    return Err(PeerError::NidInUse {
                        nid,
                        owner: o.primary_nid(),
                    });
                }
            }
            tracing::info!(target: TARGET, %primary, old = %other, "DLC peer add: a discovered peer made again around another primary NID");
            self.dlc_del_peer_nis(now, other, &[])?;
        }
        let state = self.state_of(primary);
        let id = self.table.dlc_add(primary, nids, multi_rail)?;
        if state == PeerState::Init {
            self.disc
                .entry(id)
                .or_insert_with(|| PeerDisc::new(PeerState::Init));
            let next = if self.config.enabled {
                PeerState::Verify
            } else {
                PeerState::Active
            };
            self.set_state(id, next, PeerEvent::DlcAddPeerNi);
        }
        tracing::info!(target: TARGET, %primary, ?nids, multi_rail, state = %self.peer_state(id),
            "DLC peer add");
        Ok(id)
    }

    /// `LNET_EVENT_DLC_DEL_PEER_NI` (`lnetctl peer del`): remove `nids` from
    /// the peer that owns `primary`; an empty `nids` deletes the whole peer.
    /// NIDs that are not the peer's are skipped.
    ///
    /// | state | result |
    /// |---|---|
    /// | `Init` | [`PeerError::NotFound`] (no peer: the lookup finds nothing) |
    /// | `Verify` | NIs deleted; stays `Verify` (or the peer is gone) |
    /// | `Active` | NIs detached (kept as detached peer NIs); stays `Active` |
    /// | `Discovery`, `WaitPingResponse`, `PushSent` | [`PeerError::Busy`] |
    ///
    /// # Errors
    /// As in the table. A list naming the primary NID deletes the whole
    /// peer, as an empty one does (Lustre's `lnet_del_peer_ni`).
    pub fn dlc_del_peer_nis(
        &mut self,
        now: Time,
        primary: Nid,
        nids: &[Nid],
    ) -> Result<(), PeerError> {
        let _ = now;
        let state = self.state_of(primary);
        let keep_detached = match state {
            PeerState::Init => return Err(PeerError::NotFound(primary)),
            PeerState::Discovery | PeerState::WaitPingResponse | PeerState::PushSent => {
                return Err(PeerError::Busy(primary));
            }
            PeerState::Verify => false,
            PeerState::Active => true,
        };
        let id = self
            .table
            .peer_id_of(primary)
            .ok_or(PeerError::NotFound(primary))?;
        let report = self.table.delete_nids(id, nids, keep_detached)?;
        for nid in &report.skipped {
            tracing::warn!(target: TARGET, %primary, %nid, "DLC delete: not a NID of this peer, skipped");
        }
        if report.peer_deleted
            && let Some(gone) = self.disc.remove(&id)
        {
            self.parked_now -= gone.parked.len();
            if let Some(t) = gone.deadline {
                self.due.remove(&(t, id));
            }
        }
        tracing::info!(target: TARGET, %primary, removed = ?report.removed, "DLC peer delete");
        Ok(())
    }

    /// `LNET_EVENT_DLC_LOCAL_NI_CFG_UPDATE`: the node's own NIs changed and
    /// its ping buffer now has sequence number `new_seq`. Fed to every peer:
    /// with discovery on, an `Active` Multi-Rail peer is pushed the new
    /// buffer (on its primary NID) and goes to `PushSent`; a `PushSent` peer
    /// is pushed again. Other states: no-op (a peer being discovered gets a
    /// push when its reply arrives).
    pub fn local_ni_config_changed(&mut self, now: Time, new_seq: u32) -> Vec<Action<M>> {
        self.local_seq = new_seq;
        if !self.config.enabled {
            return Vec::new();
        }
        self.push_to_peers(now, false)
    }

    fn push_to_peers(&mut self, now: Time, forced: bool) -> Vec<Action<M>> {
        let ids: Vec<PeerId> = self.disc.keys().copied().collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(peer) = self.table.peer(id) else {
                continue;
            };
            let (primary, mr) = (peer.primary_nid(), peer.is_multi_rail());
            let push = match self.peer_state(id) {
                PeerState::PushSent => true,
                PeerState::Active => mr && (forced || self.config.enabled),
                _ => false,
            };
            if push {
                out.push(self.push_action(id, now, primary, None, PeerEvent::DlcLocalNiCfgUpdate));
            }
        }
        out
    }

    /// The NIDs that left their peer since the last call and belong to no
    /// peer now ([`PeerTable::take_left`]).
    pub fn take_left_nis(&mut self) -> Vec<Nid> {
        self.table.take_left()
    }

    /// The node's last NI on `net` was deleted (`lnetctl net del`): Lustre's
    /// `lnet_peer_tables_cleanup(net)`, run when a local net is torn down.
    /// `local_nets` are the nets the node still has NIs on. Every peer with
    /// NIs on `net`:
    /// - that has an NI on one of `local_nets` stays whole, as it is still
    ///   reachable (Lustre's "keep reachable peer on local net delete"): its
    ///   NIs on `net` become remote ones, and its primary NID, if it was on
    ///   `net` and is not locked, becomes that reachable NI (so that pushes
    ///   and discovery go where the peer can still be reached);
    /// - otherwise loses its NIs on `net` (they are forgotten); losing its
    ///   primary NID deletes the whole peer, locked or not, and the
    ///   messages parked on it fail ([`DiscoveryError::NetDeleted`]).
    ///
    /// Detached peer NIs on `net` are forgotten too.
    ///
    /// Returns the failed messages' actions.
    pub fn local_net_removed(&mut self, net: Net, local_nets: &[Net]) -> Vec<Action<M>> {
        let mut out = Vec::new();
        let hit: Vec<PeerId> = self
            .table
            .peers()
            .filter(|p| p.net(net).is_some())
            .map(Peer::id)
            .collect();
        for id in hit {
            let Some(peer) = self.table.peer(id) else {
                continue;
            };
            let primary = peer.primary_nid();
            let keep = peer
                .nids()
                .find(|n| n.net() != net && local_nets.contains(&n.net()));
            if let Some(keep) = keep {
                if primary.net() == net && !peer.is_primary_locked() {
                    // `set_primary` only fails for a NID not in the peer.
                    let _ = self.table.set_primary(id, keep);
                    tracing::info!(target: TARGET, peer = %id, old = %primary, new = %keep,
                        "local net deleted: primary NID moved to a reachable NI");
                }
                continue;
            }
            let on_net: Vec<Nid> = peer.nids().filter(|n| n.net() == net).collect();
            if primary.net() != net {
                let _ = self.table.delete_nids(id, &on_net, false);
                tracing::info!(target: TARGET, peer = %id, nids = ?on_net,
                    "local net deleted: peer NIs forgotten");
                continue;
            }
            // The primary goes, and with it the peer (`lnet_peer_del_locked`
            // does not spare a locked primary).
            let _ = self.table.set_primary_locked(id, false);
            self.fail_parked(id, &DiscoveryError::NetDeleted(net), &mut out);
            let _ = self.table.delete_nids(id, &[], false);
            if let Some(gone) = self.disc.remove(&id)
                && let Some(t) = gone.deadline
            {
                self.due.remove(&(t, id));
            }
            tracing::info!(target: TARGET, peer = %id, %primary, "local net deleted: peer deleted");
        }
        // Peer NIs of no peer on `net` (senders never discovered, NIs a
        // peer no longer lists) go too: Lustre frees every peer NI there.
        let detached = self.table.forget_detached_on(net);
        if !detached.is_empty() {
            tracing::debug!(target: TARGET, nids = ?detached, "local net deleted: detached peer NIs forgotten");
        }
        out
    }

    /// Switches discovery on or off (`lnetctl set discovery`, lnet.md 3.8);
    /// `new_seq` is the sequence number of the rebuilt ping buffer (the
    /// `DISCOVERY` feature bit changed).
    ///
    /// Off: queued peers become `Active` and their parked messages are
    /// released; Multi-Rail peers are pushed the new buffer (forced) so they
    /// learn it. On: peers that were never discovered go back to `Verify`, so
    /// the next send discovers them; Multi-Rail peers are pushed.
    pub fn set_enabled(&mut self, now: Time, enabled: bool, new_seq: u32) -> Vec<Action<M>> {
        if enabled == self.config.enabled {
            return Vec::new();
        }
        self.config.enabled = enabled;
        self.local_seq = new_seq;
        let mut out = Vec::new();
        if enabled {
            let stale: Vec<PeerId> = self
                .disc
                .iter()
                .filter(|(_, d)| d.state == PeerState::Active && !d.discovered)
                .map(|(&id, _)| id)
                .collect();
            for id in stale {
                self.set_state(id, PeerState::Verify, PeerEvent::DlcLocalNiCfgUpdate);
            }
            out.extend(self.push_to_peers(now, false));
        } else {
            out.extend(self.process_queue(now));
            out.extend(self.push_to_peers(now, true));
        }
        out
    }

    // --------------------------------------------------------------- timers

    /// The next time [`handle_timeout`](Self::handle_timeout) has work: the
    /// queue time of pending discovery work (already due), or the earliest
    /// ping or push deadline.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let queued = self
            .queue
            .iter()
            .filter(|(id, _)| self.peer_state(*id) == PeerState::Discovery)
            .map(|&(_, t)| t)
            .min();
        let deadline = self.due.first().map(|&(t, _)| t);
        match (queued, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the discovery thread's queue, then expires ping and push
    /// deadlines that are `<= now`: an expired ping fails the peer's parked
    /// messages with [`DiscoveryError::PingTimeout`] and leaves it in
    /// `Verify`; an expired push leaves it `Active`.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<Action<M>> {
        let mut out = self.process_queue(now);
        let mut expired: Vec<PeerId> = self
            .due
            .iter()
            .take_while(|&&(t, _)| t <= now)
            .map(|&(_, id)| id)
            .collect();
        // In peer order, as a walk over the peers met them.
        expired.sort_unstable();
        for id in expired {
            match self.peer_state(id) {
                PeerState::WaitPingResponse => {
                    let nid = self.table.peer(id).map_or(Nid::ANY, |p| p.primary_nid());
                    self.discovery_failed(id, DiscoveryError::PingTimeout(nid), &mut out);
                }
                PeerState::PushSent => self.push_failed(id),
                _ => {
                    if let Some(d) = self.disc.get_mut(&id) {
                        set_deadline(&mut self.due, id, d, None);
                    }
                }
            }
        }
        out
    }

    /// Checks that the peer table and the discovery states agree (every peer
    /// has a state, never `Init`; parked messages only while discovering;
    /// queued work only in `Discovery`). Returns the first violation.
    #[must_use]
    pub fn invariant_violation(&self) -> Option<String> {
        if let Some(v) = self.table.invariant_violation() {
            return Some(v);
        }
        for p in self.table.peers() {
            match self.disc.get(&p.id()) {
                None => return Some(format!("{} has no discovery state", p.id())),
                Some(d) if d.state == PeerState::Init => {
                    return Some(format!("{} left in INIT", p.id()));
                }
                Some(_) => {}
            }
        }
        let due: BTreeSet<(Time, PeerId)> = self
            .disc
            .iter()
            .filter_map(|(&id, d)| d.deadline.map(|t| (t, id)))
            .collect();
        if due != self.due {
            return Some(format!("deadline index {:?}, deadlines {due:?}", self.due));
        }
        let parked: usize = self.disc.values().map(|d| d.parked.len()).sum();
        if parked != self.parked_now {
            return Some(format!(
                "{parked} messages parked, {} counted",
                self.parked_now
            ));
        }
        for (id, d) in &self.disc {
            if self.table.peer(*id).is_none() {
                return Some(format!("{id} has a state but no peer"));
            }
            if !d.parked.is_empty()
                && !matches!(d.state, PeerState::Discovery | PeerState::WaitPingResponse)
            {
                return Some(format!("{id} has parked messages in {}", d.state));
            }
            if d.state == PeerState::Discovery && !self.queue.iter().any(|(q, _)| q == id) {
                return Some(format!("{id} in DISCOVERY but not queued"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PingNi;

    type Dd = Discovery<u32>;

    const A: &str = "10.0.0.2@tcp";
    const A_IB: &str = "192.168.0.2@o2ib";
    const A3: &str = "10.0.0.3@tcp";
    const ME: &str = "10.0.0.1@tcp";

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn t(secs: u64) -> Time {
        Time::from_secs(secs)
    }

    fn info(seq: u32, features: PingFeatures, nids: &[&str]) -> PingInfo {
        PingInfo {
            features,
            pid: 12345,
            seqno: seq,
            lo_msg_size: 0,
            nis: nids
                .iter()
                .map(|s| PingNi {
                    nid: nid(s),
                    status: NiStatus::Up,
                    msg_size: 0,
                })
                .collect(),
        }
    }

    fn mr_features() -> PingFeatures {
        PingFeatures::BASE
            .with(PingFeatures::NI_STATUS)
            .with(PingFeatures::MULTI_RAIL)
            .with(PingFeatures::DISCOVERY)
    }

    fn mr_info(seq: u32, nids: &[&str]) -> PingInfo {
        info(seq, mr_features(), nids)
    }

    fn plain_info(seq: u32, nids: &[&str]) -> PingInfo {
        info(
            seq,
            PingFeatures::BASE
                .with(PingFeatures::NI_STATUS)
                .with(PingFeatures::DISCOVERY),
            nids,
        )
    }

    fn dd() -> Dd {
        Discovery::new(DiscoveryConfig::default(), 1)
    }

    fn dd_off() -> Dd {
        Discovery::new(
            DiscoveryConfig {
                enabled: false,
                ..DiscoveryConfig::default()
            },
            1,
        )
    }

    fn pid(d: &Dd, s: &str) -> PeerId {
        d.peers().peer_id_of(nid(s)).unwrap()
    }

    fn ok(d: &Dd) {
        assert_eq!(d.invariant_violation(), None);
    }

    fn up(s: &str) -> Action<u32> {
        Action::PeerNiStatus {
            nid: nid(s),
            old: NiStatus::Invalid,
            new: NiStatus::Up,
        }
    }

    fn transmit(d: &Dd, s: &str, msg: u32) -> Action<u32> {
        Action::Transmit {
            peer: Some(pid(d, s)),
            target: nid(s),
            msg,
        }
    }

    /// A configured by DLC with a second NI: VERIFY.
    fn in_verify(d: &mut Dd) {
        d.dlc_add_peer_nis(t(1), nid(A), &[nid(A_IB)], true)
            .unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
    }

    /// First send to A (message 1 parked): DISCOVERY.
    fn in_discovery(d: &mut Dd) {
        assert!(d.handle_send(t(1), nid(A), 1, SendClass::Normal).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
    }

    /// Ping sent: WAIT_PING_RESPONSE.
    fn in_wait(d: &mut Dd) {
        in_discovery(d);
        let a = d.process_queue(t(2));
        assert_eq!(
            a,
            vec![Action::SendPing {
                peer: pid(d, A),
                to: nid(A),
                max_nis: 16,
                exact: false,
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
    }

    /// Multi-Rail reply merged, push sent, message 1 released: PUSH_SENT.
    fn in_push_sent(d: &mut Dd) {
        in_wait(d);
        let a = d.handle_ping_reply(t(3), nid(A), nid(ME), mr_info(5, &[A, A_IB]));
        assert_eq!(a.len(), 4);
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
    }

    /// Push acknowledged: ACTIVE.
    fn in_active(d: &mut Dd) {
        in_push_sent(d);
        assert!(d.handle_push_ack(t(4), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
    }

    /// `peer state` as Lustre prints it, through discovery.
    #[test]
    fn lustre_state_bits_follow_discovery() {
        let st = |d: &Dd| d.lustre_state(pid(d, A));
        let mut d = dd();
        in_wait(&mut d);
        // DISCOVERING | PING_SENT (not known to be Multi-Rail yet).
        assert_eq!(st(&d), (1 << 6) | (1 << 9));
        let mut d = dd();
        in_push_sent(&mut d);
        // MULTI_RAIL | DISCOVERED | DISCOVERING | NIDS_UPTODATE | PUSH_SENT.
        assert_eq!(st(&d), 1 | (1 << 4) | (1 << 6) | (1 << 8) | (1 << 10));
        let mut d = dd();
        in_active(&mut d);
        assert_eq!(st(&d), 273, "MULTI_RAIL | DISCOVERED | NIDS_UPTODATE");
        // Configured by DLC: MULTI_RAIL | CONFIGURED, not discovered yet.
        let mut d = dd();
        in_verify(&mut d);
        assert_eq!(st(&d), 9);
        // A failed discovery: REDISCOVER | PING_FAILED.
        let mut d = dd();
        in_wait(&mut d);
        d.handle_ping_failure(t(3), nid(A), PingFailure::SendFailed);
        assert_eq!(st(&d), (1 << 5) | (1 << 11));
    }

    // ------------------------------------------------------------ INIT

    #[test]
    fn cell_init_recv_ack() {
        let mut d = dd();
        assert!(d.handle_push_ack(t(1), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        assert_eq!(
            d.stats().unexpected_events,
            0,
            "INIT + RECV_ACK is a plain no-op"
        );
        assert!(d.peers().is_empty());
        ok(&d);
    }

    #[test]
    fn cell_init_recv_ping_push() {
        let mut d = dd();
        // The sender is known only as a detached peer NI (it sent us traffic).
        assert_eq!(d.note_receive(nid(A)), nid(A));
        assert!(d.peers().ni(nid(A)).unwrap().is_detached());
        let a = d.handle_push(t(1), nid(A), mr_info(3, &[A, A_IB]));
        assert_eq!(a, vec![up(A), up(A_IB)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert_eq!(p.ni_count(), 2);
        assert!(p.is_multi_rail());
        assert_eq!(d.peer_seq(nid(A)), Some(3));
        assert_eq!(d.stats().pushes_merged, 1);
        // Matching now sees the primary NID for traffic from either NI.
        assert_eq!(d.note_receive(nid(A_IB)), nid(A));
        ok(&d);
    }

    #[test]
    fn cell_init_recv_ping_reply() {
        let mut d = dd();
        let a = d.handle_ping_reply(t(1), nid(A), nid(ME), mr_info(3, &[A, A_IB]));
        assert!(a.is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        assert_eq!(d.stats().unexpected_events, 1, "impossible event is logged");
        assert!(d.peers().is_empty());
        ok(&d);
    }

    #[test]
    fn cell_init_send() {
        let mut d = dd();
        assert!(d.handle_send(t(1), nid(A), 7, SendClass::Normal).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.parked_count(nid(A)), 1);
        assert_eq!(
            d.poll_timeout(),
            Some(t(1)),
            "discovery work is due at once"
        );
        // The discovery thread's half of the cell.
        let a = d.handle_timeout(t(1));
        assert_eq!(
            a,
            vec![Action::SendPing {
                peer: pid(&d, A),
                to: nid(A),
                max_nis: 16,
                exact: false,
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        assert_eq!(d.poll_timeout(), Some(t(151)), "ping deadline");
        ok(&d);
    }

    #[test]
    fn cell_init_send_discovery_off() {
        let mut d = dd_off();
        let a = d.handle_send(t(1), nid(A), 7, SendClass::Normal);
        assert_eq!(a, vec![transmit(&d, A, 7)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.poll_timeout(), None);
        ok(&d);
    }

    #[test]
    fn cell_init_dlc_add_peer_ni() {
        let mut d = dd();
        let id = d
            .dlc_add_peer_nis(t(1), nid(A), &[nid(A_IB)], true)
            .unwrap();
        assert_eq!(d.peer_state(id), PeerState::Verify);
        let p = d.peers().peer(id).unwrap();
        assert!(p.is_configured());
        assert_eq!(p.ni_count(), 2);
        ok(&d);
    }

    #[test]
    fn cell_init_dlc_add_peer_ni_discovery_off() {
        let mut d = dd_off();
        let id = d
            .dlc_add_peer_nis(t(1), nid(A), &[nid(A_IB)], true)
            .unwrap();
        assert_eq!(d.peer_state(id), PeerState::Active);
        ok(&d);
    }

    #[test]
    fn cell_init_dlc_del_peer_ni() {
        let mut d = dd();
        d.note_receive(nid(A)); // detached
        assert_eq!(
            d.dlc_del_peer_nis(t(1), nid(A), &[]),
            Err(PeerError::NotFound(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        assert!(d.peers().ni(nid(A)).is_some());
        ok(&d);
    }

    #[test]
    fn cell_init_dlc_local_ni_cfg_update() {
        let mut d = dd();
        d.note_receive(nid(A));
        assert!(d.local_ni_config_changed(t(1), 2).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        assert_eq!(d.local_seq(), 2);
        ok(&d);
    }

    // ---------------------------------------------------------- VERIFY

    #[test]
    fn cell_verify_recv_ack() {
        let mut d = dd();
        in_verify(&mut d);
        assert!(d.handle_push_ack(t(2), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.stats().unexpected_events, 1);
        ok(&d);
    }

    #[test]
    fn cell_verify_recv_ping_push() {
        let mut d = dd();
        in_verify(&mut d);
        assert!(d.handle_push(t(2), nid(A), mr_info(3, &[A, A3])).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.stats().unexpected_events, 1);
        assert_eq!(d.peer_seq(nid(A)), None, "push not processed");
        assert!(d.peers().ni(nid(A3)).is_none());
        ok(&d);
    }

    #[test]
    fn cell_verify_recv_ping_reply() {
        let mut d = dd();
        in_verify(&mut d);
        assert!(
            d.handle_ping_reply(t(2), nid(A), nid(ME), mr_info(3, &[A]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.stats().unexpected_events, 1);
        ok(&d);
    }

    #[test]
    fn cell_verify_send() {
        let mut d = dd();
        in_verify(&mut d);
        assert!(
            d.handle_send(t(2), nid(A_IB), 9, SendClass::Normal)
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.parked_count(nid(A)), 1);
        // The ping goes to the primary NID.
        let a = d.handle_timeout(t(2));
        assert_eq!(
            a,
            vec![Action::SendPing {
                peer: pid(&d, A),
                to: nid(A),
                max_nis: 16,
                exact: false,
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        ok(&d);
    }

    #[test]
    fn cell_verify_send_discovery_off() {
        let mut d = dd_off();
        d.dlc_add_peer_nis(t(1), nid(A), &[], true).unwrap();
        // With discovery off DLC peers start ACTIVE; switching discovery on
        // puts never-discovered peers back to VERIFY, then off again:
        d.set_enabled(t(1), true, 2);
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        d.set_enabled(t(1), false, 3);
        let a = d.handle_send(t(2), nid(A), 9, SendClass::Normal);
        assert_eq!(a, vec![transmit(&d, A, 9)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        ok(&d);
    }

    #[test]
    fn cell_verify_dlc_add_peer_ni() {
        let mut d = dd();
        in_verify(&mut d);
        d.dlc_add_peer_nis(t(2), nid(A), &[nid(A3)], true).unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 3);
        // Not unique: a NID of another peer aborts the whole operation.
        d.handle_send(t(2), nid("10.0.0.9@tcp"), 1, SendClass::Normal);
        let err = d
            .dlc_add_peer_nis(
                t(2),
                nid(A),
                &[nid("10.0.0.8@tcp"), nid("10.0.0.9@tcp")],
                true,
            )
            .unwrap_err();
        assert!(matches!(err, PeerError::NidInUse { .. }));
        assert!(d.peers().ni(nid("10.0.0.8@tcp")).is_none(), "rolled back");
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        ok(&d);
    }

    /// `peer add --prim_nid` naming another peer's secondary NID, as
    /// Lustre's `lnet_peer_add`: a discovered peer is made again around
    /// it; a configured one keeps it (`EEXIST`), and so does one whose
    /// primary is locked (`EALREADY`).
    #[test]
    fn dlc_add_with_another_peers_secondary_as_primary() {
        let mut d = dd();
        in_active(&mut d);
        assert_eq!(d.peers().peer_of(nid(A_IB)).unwrap().primary_nid(), nid(A));
        d.dlc_add_peer_nis(t(5), nid(A_IB), &[nid(A3)], true)
            .unwrap();
        let p = d.peers().peer_of(nid(A_IB)).unwrap();
        assert_eq!(p.primary_nid(), nid(A_IB));
        assert!(p.is_configured());
        assert_eq!(p.nids().collect::<Vec<_>>().len(), 2, "A_IB and A3");
        assert!(d.peers().peer_of(nid(A)).is_none(), "the old peer is gone");
        ok(&d);

        let mut d = dd();
        in_verify(&mut d);
        let err = d.dlc_add_peer_nis(t(2), nid(A_IB), &[], true).unwrap_err();
        assert!(
            matches!(err, PeerError::NidInUse { nid: n, owner } if n == nid(A_IB) && owner == nid(A)),
            "{err:?}"
        );
        assert_eq!(d.peers().peer_of(nid(A_IB)).unwrap().primary_nid(), nid(A));

        let mut d = dd();
        in_active(&mut d);
        d.set_primary_locked(nid(A), true).unwrap();
        let err = d.dlc_add_peer_nis(t(5), nid(A_IB), &[], true).unwrap_err();
        assert!(
            matches!(err, PeerError::OwnerPrimaryLocked { .. }),
            "{err:?}"
        );
        assert_eq!(d.peers().peer_of(nid(A_IB)).unwrap().primary_nid(), nid(A));
        ok(&d);
    }

    #[test]
    fn cell_verify_dlc_del_peer_ni() {
        let mut d = dd();
        in_verify(&mut d);
        d.dlc_del_peer_nis(t(2), nid(A), &[nid(A_IB), nid("10.9.9.9@tcp")])
            .unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 1);
        assert!(d.peers().ni(nid(A_IB)).is_none(), "VERIFY deletes the NI");
        // Deleting the last NI deletes the peer.
        d.dlc_del_peer_nis(t(2), nid(A), &[nid(A)]).unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        assert!(d.peers().is_empty());
        ok(&d);
    }

    #[test]
    fn cell_verify_dlc_local_ni_cfg_update() {
        let mut d = dd();
        in_verify(&mut d);
        assert!(d.local_ni_config_changed(t(2), 2).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        ok(&d);
    }

    // ------------------------------------------------------- DISCOVERY

    #[test]
    fn cell_discovery_recv_ack() {
        let mut d = dd();
        in_discovery(&mut d);
        assert!(d.handle_push_ack(t(2), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.stats().unexpected_events, 1);
        ok(&d);
    }

    #[test]
    fn cell_discovery_recv_ping_push() {
        let mut d = dd();
        in_discovery(&mut d);
        assert!(
            d.handle_push(t(2), nid(A), mr_info(3, &[A, A_IB]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.stats().unexpected_events, 1);
        assert_eq!(d.parked_count(nid(A)), 1);
        assert!(d.peers().ni(nid(A_IB)).is_none());
        ok(&d);
    }

    #[test]
    fn cell_discovery_recv_ping_reply() {
        let mut d = dd();
        in_discovery(&mut d);
        assert!(
            d.handle_ping_reply(t(2), nid(A), nid(ME), mr_info(3, &[A, A_IB]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.stats().unexpected_events, 1);
        ok(&d);
    }

    #[test]
    fn cell_discovery_send() {
        let mut d = dd();
        in_discovery(&mut d);
        assert!(d.handle_send(t(2), nid(A), 2, SendClass::Normal).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert_eq!(d.parked_count(nid(A)), 2);
        ok(&d);
    }

    #[test]
    fn cell_discovery_dlc_add_peer_ni() {
        let mut d = dd();
        in_discovery(&mut d);
        assert_eq!(
            d.dlc_add_peer_nis(t(2), nid(A), &[nid(A_IB)], true),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert!(d.peers().ni(nid(A_IB)).is_none());
        ok(&d);
    }

    #[test]
    fn cell_discovery_dlc_del_peer_ni() {
        let mut d = dd();
        in_discovery(&mut d);
        assert_eq!(
            d.dlc_del_peer_nis(t(2), nid(A), &[]),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        ok(&d);
    }

    #[test]
    fn cell_discovery_dlc_local_ni_cfg_update() {
        let mut d = dd();
        in_discovery(&mut d);
        assert!(d.local_ni_config_changed(t(2), 2).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        ok(&d);
    }

    // ---------------------------------------------- WAIT_PING_RESPONSE

    #[test]
    fn cell_wait_ping_response_recv_ack() {
        let mut d = dd();
        in_wait(&mut d);
        assert!(d.handle_push_ack(t(3), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        assert_eq!(d.stats().unexpected_events, 0, "plain no-op");
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_recv_ping_push() {
        let mut d = dd();
        in_wait(&mut d);
        assert!(
            d.handle_push(t(3), nid(A), mr_info(3, &[A, A_IB]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        assert_eq!(d.stats().unexpected_events, 1, "dropped and ignored");
        assert_eq!(d.peer_seq(nid(A)), None);
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_recv_ping_reply() {
        let mut d = dd();
        in_wait(&mut d);
        d.handle_send(t(2), nid(A), 2, SendClass::Normal);
        let a = d.handle_ping_reply(t(3), nid(A), nid(ME), mr_info(5, &[A, A_IB]));
        let id = pid(&d, A);
        assert_eq!(
            a,
            vec![
                Action::SendPush {
                    peer: id,
                    to: nid(A),
                    from: Some(nid(ME)),
                    seq: 1
                },
                up(A),
                up(A_IB),
                transmit(&d, A, 1),
                transmit(&d, A, 2),
            ]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        assert_eq!(d.peers().peer(id).unwrap().ni_count(), 2);
        assert_eq!(d.peer_seq(nid(A)), Some(5));
        assert_eq!(d.parked_count(nid(A)), 0);
        assert_eq!(d.poll_timeout(), Some(t(153)), "push deadline");
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_recv_ping_reply_non_mr() {
        let mut d = dd();
        in_wait(&mut d);
        let a = d.handle_ping_reply(t(3), nid(A), nid(ME), plain_info(5, &[A, A_IB]));
        assert_eq!(a, vec![up(A), transmit(&d, A, 1)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert!(!p.is_multi_rail());
        assert_eq!(p.ni_count(), 1, "a non-MR peer's NIDs are not merged");
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_send() {
        let mut d = dd();
        in_wait(&mut d);
        assert!(d.handle_send(t(3), nid(A), 2, SendClass::Normal).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        assert_eq!(d.parked_count(nid(A)), 2);
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_dlc_add_peer_ni() {
        let mut d = dd();
        in_wait(&mut d);
        assert_eq!(
            d.dlc_add_peer_nis(t(3), nid(A), &[nid(A_IB)], true),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_dlc_del_peer_ni() {
        let mut d = dd();
        in_wait(&mut d);
        assert_eq!(
            d.dlc_del_peer_nis(t(3), nid(A), &[nid(A)]),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        ok(&d);
    }

    #[test]
    fn cell_wait_ping_response_dlc_local_ni_cfg_update() {
        let mut d = dd();
        in_wait(&mut d);
        assert!(d.local_ni_config_changed(t(3), 2).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        // The push sent when the reply arrives carries the new sequence.
        let a = d.handle_ping_reply(t(4), nid(A), nid(ME), mr_info(5, &[A]));
        assert!(matches!(a[0], Action::SendPush { seq: 2, .. }));
        ok(&d);
    }

    // ------------------------------------------------------- PUSH_SENT

    #[test]
    fn cell_push_sent_recv_ack() {
        let mut d = dd();
        in_push_sent(&mut d);
        assert!(d.handle_push_ack(t(4), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.acked_seq(nid(A)), Some(1));
        assert_eq!(d.poll_timeout(), None, "push deadline cleared");
        ok(&d);
    }

    #[test]
    fn cell_push_sent_recv_ping_push() {
        let mut d = dd();
        in_push_sent(&mut d);
        // Newer sequence: processed (a third NI appears).
        let a = d.handle_push(t(4), nid(A), mr_info(6, &[A, A_IB, A3]));
        assert_eq!(a, vec![up(A3)]);
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 3);
        assert_eq!(d.peer_seq(nid(A)), Some(6));
        // Older sequence: ignored; a peer busy with our push is not pinged.
        assert!(d.handle_push(t(4), nid(A), mr_info(4, &[A])).is_empty());
        assert_eq!(d.stats().stale_pushes, 1);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 3);
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        // Equal: taken (the same data again, or a restart that numbered as far).
        assert!(
            d.handle_push(t(4), nid(A), mr_info(6, &[A, A_IB]))
                .is_empty()
        );
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 2);
        ok(&d);
    }

    #[test]
    fn cell_push_sent_recv_ping_reply() {
        let mut d = dd();
        in_push_sent(&mut d);
        assert!(
            d.handle_ping_reply(t(4), nid(A), nid(ME), mr_info(7, &[A]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        assert_eq!(d.stats().unexpected_events, 1);
        assert_eq!(d.peer_seq(nid(A)), Some(5));
        ok(&d);
    }

    #[test]
    fn cell_push_sent_send() {
        let mut d = dd();
        in_push_sent(&mut d);
        let a = d.handle_send(t(4), nid(A_IB), 3, SendClass::Normal);
        assert_eq!(a, vec![transmit(&d, A_IB, 3)]);
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        ok(&d);
    }

    #[test]
    fn cell_push_sent_dlc_add_peer_ni() {
        let mut d = dd();
        in_push_sent(&mut d);
        assert_eq!(
            d.dlc_add_peer_nis(t(4), nid(A), &[nid(A3)], true),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        ok(&d);
    }

    #[test]
    fn cell_push_sent_dlc_del_peer_ni() {
        let mut d = dd();
        in_push_sent(&mut d);
        assert_eq!(
            d.dlc_del_peer_nis(t(4), nid(A), &[nid(A_IB)]),
            Err(PeerError::Busy(nid(A)))
        );
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 2);
        ok(&d);
    }

    #[test]
    fn cell_push_sent_dlc_local_ni_cfg_update() {
        let mut d = dd();
        in_push_sent(&mut d);
        let a = d.local_ni_config_changed(t(4), 2);
        assert_eq!(
            a,
            vec![Action::SendPush {
                peer: pid(&d, A),
                to: nid(A),
                from: None,
                seq: 2
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        // The ACK now acknowledges the newer sequence.
        d.handle_push_ack(t(5), nid(A));
        assert_eq!(d.acked_seq(nid(A)), Some(2));
        ok(&d);
    }

    #[test]
    fn cell_push_sent_dlc_local_ni_cfg_update_discovery_off() {
        let mut d = dd();
        in_push_sent(&mut d);
        // Switching discovery off pushes once (forced) so the peer learns it.
        let a = d.set_enabled(t(4), false, 2);
        assert!(matches!(a[..], [Action::SendPush { seq: 2, .. }]));
        assert!(d.local_ni_config_changed(t(4), 3).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        ok(&d);
    }

    // ---------------------------------------------------------- ACTIVE

    #[test]
    fn cell_active_recv_ack() {
        let mut d = dd();
        in_active(&mut d);
        assert!(d.handle_push_ack(t(5), nid(A)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.stats().unexpected_events, 1);
        ok(&d);
    }

    #[test]
    fn cell_active_recv_ping_push() {
        let mut d = dd();
        in_active(&mut d);
        // The peer lost its o2ib NI and says so: the NI is detached.
        let a = d.handle_push(t(5), nid(A), mr_info(6, &[A]));
        assert!(a.is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 1);
        assert!(d.peers().ni(nid(A_IB)).unwrap().is_detached());
        // The node is told, once, that it left.
        assert_eq!(d.take_left_nis(), vec![nid(A_IB)]);
        assert!(d.take_left_nis().is_empty());
        // The same sequence number again, from a peer that restarted with
        // its o2ib NI back: taken (and so not reported as gone).
        assert!(
            d.handle_push(t(5), nid(A), mr_info(6, &[A, A_IB]))
                .is_empty()
        );
        assert!(d.take_left_nis().is_empty());
        assert!(!d.peers().ni(nid(A_IB)).unwrap().is_detached());
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 2);
        // An older one is not taken, but the peer is pinged: its reply
        // says what it has now, whatever its number.
        let a = d.handle_push(t(6), nid(A_IB), mr_info(2, &[A_IB]));
        assert_eq!(d.stats().stale_pushes, 1);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 2);
        // To the NID the push came from, and only there.
        assert!(
            matches!(a[..], [Action::SendPing { to, exact: true, .. }] if to == nid(A_IB)),
            "{a:?}"
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        let a = d.handle_ping_reply(t(7), nid(A_IB), nid(ME), mr_info(2, &[A_IB]));
        assert!(matches!(a[..], [Action::SendPush { .. }]), "{a:?}");
        let p = d.peers().peer_of(nid(A_IB)).unwrap();
        assert_eq!((p.ni_count(), p.primary_nid()), (1, nid(A_IB)));
        assert_eq!(d.peer_seq(nid(A_IB)), Some(2));
        ok(&d);
    }

    #[test]
    fn cell_active_recv_ping_reply() {
        let mut d = dd();
        in_active(&mut d);
        assert!(
            d.handle_ping_reply(t(5), nid(A), nid(ME), mr_info(9, &[A]))
                .is_empty()
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.stats().unexpected_events, 1);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 2);
        ok(&d);
    }

    #[test]
    fn cell_active_send() {
        let mut d = dd();
        in_active(&mut d);
        let a = d.handle_send(t(5), nid(A), 4, SendClass::Normal);
        assert_eq!(a, vec![transmit(&d, A, 4)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        ok(&d);
    }

    #[test]
    fn cell_active_dlc_add_peer_ni() {
        let mut d = dd();
        in_active(&mut d);
        // A_IB is already there and is skipped; A3 is added.
        d.dlc_add_peer_nis(t(5), nid(A), &[nid(A_IB), nid(A3)], true)
            .unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert_eq!(p.ni_count(), 3);
        assert!(p.is_configured());
        ok(&d);
    }

    #[test]
    fn cell_active_dlc_del_peer_ni() {
        let mut d = dd();
        in_active(&mut d);
        d.dlc_del_peer_nis(t(5), nid(A), &[nid(A_IB)]).unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.peers().peer_of(nid(A)).unwrap().ni_count(), 1);
        assert!(
            d.peers().ni(nid(A_IB)).unwrap().is_detached(),
            "ACTIVE keeps the NI around detached"
        );
        // Naming the primary deletes the whole peer (Lustre's
        // lnet_del_peer_ni).
        d.dlc_add_peer_nis(t(5), nid(A), &[nid(A3)], true).unwrap();
        d.dlc_del_peer_nis(t(5), nid(A), &[nid(A)]).unwrap();
        assert!(d.peers().peer_of(nid(A)).is_none());
        assert!(d.peers().peer_of(nid(A3)).is_none());
        ok(&d);
    }

    #[test]
    fn cell_active_dlc_local_ni_cfg_update() {
        let mut d = dd();
        in_active(&mut d);
        let a = d.local_ni_config_changed(t(5), 2);
        assert_eq!(
            a,
            vec![Action::SendPush {
                peer: pid(&d, A),
                to: nid(A),
                from: None,
                seq: 2
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::PushSent);
        ok(&d);
    }

    #[test]
    fn cell_active_dlc_local_ni_cfg_update_non_mr_peer() {
        let mut d = dd();
        in_wait(&mut d);
        d.handle_ping_reply(t(3), nid(A), nid(ME), plain_info(5, &[A]));
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert!(d.local_ni_config_changed(t(5), 2).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        ok(&d);
    }

    // ------------------------------------------------ beyond the table

    #[test]
    fn ping_timeout_fails_parked_sends_and_rediscovers() {
        let mut d = dd();
        in_wait(&mut d);
        d.handle_send(t(3), nid(A), 2, SendClass::Normal);
        assert_eq!(d.poll_timeout(), Some(t(152)));
        assert!(
            d.handle_timeout(t(151)).is_empty(),
            "early call is harmless"
        );
        let a = d.handle_timeout(t(152));
        let err = DiscoveryError::PingTimeout(nid(A));
        assert_eq!(
            a,
            vec![
                Action::Fail {
                    target: nid(A),
                    msg: 1,
                    error: err.clone()
                },
                Action::Fail {
                    target: nid(A),
                    msg: 2,
                    error: err.clone()
                },
            ]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        assert_eq!(d.last_error(nid(A)), Some(&err));
        assert_eq!(d.stats().ping_failures, 1);
        // The next send tries again.
        assert!(
            d.handle_send(t(200), nid(A), 3, SendClass::Normal)
                .is_empty()
        );
        assert!(matches!(
            d.handle_timeout(t(200))[..],
            [Action::SendPing { .. }]
        ));
        ok(&d);
    }

    #[test]
    fn ping_send_failure_and_invalid_reply_fail_discovery() {
        let mut d = dd();
        in_wait(&mut d);
        let a = d.handle_ping_failure(t(3), nid(A), PingFailure::SendFailed);
        assert!(matches!(
            &a[..],
            [Action::Fail {
                msg: 1,
                error: DiscoveryError::PingSendFailed(_),
                ..
            }]
        ));
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);

        d.handle_send(t(4), nid(A), 2, SendClass::Normal);
        d.handle_timeout(t(4));
        let mut bad = mr_info(1, &[A]);
        bad.features = PingFeatures::MULTI_RAIL;
        let a = d.handle_ping_reply(t(5), nid(A), nid(ME), bad);
        assert!(matches!(
            &a[..],
            [Action::Fail {
                msg: 2,
                error: DiscoveryError::InvalidReply {
                    error: PingInfoError::NoNiStatus,
                    ..
                },
                ..
            }]
        ));
        assert_eq!(d.stats().invalid_ping_info, 1);
        ok(&d);
    }

    #[test]
    fn truncated_reply_pings_again_with_bigger_buffer() {
        let mut d = dd();
        in_wait(&mut d);
        let a = d.handle_ping_failure(t(3), nid(A), PingFailure::Truncated { needed_nis: 40 });
        assert_eq!(
            a,
            vec![Action::SendPing {
                peer: pid(&d, A),
                to: nid(A),
                max_nis: 40,
                exact: false,
            }]
        );
        assert_eq!(d.state_of(nid(A)), PeerState::WaitPingResponse);
        assert_eq!(d.parked_count(nid(A)), 1);
        ok(&d);
    }

    #[test]
    fn push_timeout_leaves_peer_active_without_ack() {
        let mut d = dd();
        in_push_sent(&mut d);
        assert!(d.handle_timeout(t(153)).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        assert_eq!(d.acked_seq(nid(A)), None);
        assert_eq!(d.stats().push_failures, 1);
        ok(&d);
    }

    #[test]
    fn two_peers_found_to_be_one_node_are_merged() {
        let mut d = dd();
        // Sends to both NIDs of the same node create two peers.
        d.handle_send(t(1), nid(A), 1, SendClass::Normal);
        d.handle_send(t(1), nid(A_IB), 2, SendClass::Normal);
        let pings = d.handle_timeout(t(1));
        assert_eq!(pings.len(), 2);
        let (pa, pb) = (pid(&d, A), pid(&d, A_IB));
        assert_ne!(pa, pb);
        // A's reply lists both NIDs, A_IB second: B is absorbed into A.
        let a = d.handle_ping_reply(t(2), nid(A), nid(ME), mr_info(5, &[A, A_IB]));
        assert!(a.contains(&Action::PeersMerged {
            into: pa,
            absorbed: pb
        }));
        let released: Vec<u32> = a
            .iter()
            .filter_map(|x| match x {
                Action::Transmit { msg, .. } => Some(*msg),
                _ => None,
            })
            .collect();
        assert_eq!(released, vec![1, 2], "B's parked message moves with it");
        assert_eq!(d.peers().len(), 1);
        assert_eq!(pid(&d, A_IB), pa);
        assert_eq!(d.stats().peers_merged, 1);
        // B's late reply finds a peer that is no longer waiting for it.
        assert!(
            d.handle_ping_reply(t(3), nid(A_IB), nid(ME), mr_info(5, &[A, A_IB]))
                .is_empty()
        );
        ok(&d);
    }

    #[test]
    fn reply_naming_another_primary_moves_primary() {
        let mut d = dd();
        // We first talk to the node's o2ib NID; its primary is the tcp one.
        d.handle_send(t(1), nid(A_IB), 1, SendClass::Normal);
        d.handle_timeout(t(1));
        let a = d.handle_ping_reply(t(2), nid(A_IB), nid(ME), mr_info(5, &[A, A_IB]));
        assert!(
            matches!(
                a[0],
                Action::SendPush { to, from: Some(_), .. } if to == nid(A_IB)
            ),
            "the push answers the NID pair of the reply"
        );
        let p = d.peers().peer_of(nid(A_IB)).unwrap();
        assert_eq!(p.primary_nid(), nid(A));
        assert_eq!(d.note_receive(nid(A_IB)), nid(A));
        ok(&d);
    }

    #[test]
    fn configured_peer_is_not_rewritten_by_discovery() {
        let mut d = dd();
        in_verify(&mut d);
        d.handle_send(t(2), nid(A), 1, SendClass::Normal);
        d.handle_timeout(t(2));
        // The node says it has A and A3 (not A_IB) and is not Multi-Rail.
        let mut reply = plain_info(5, &[A3, A]);
        reply.nis[1].status = NiStatus::Down;
        let a = d.handle_ping_reply(t(3), nid(A), nid(ME), reply);
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert_eq!(p.primary_nid(), nid(A));
        assert_eq!(p.nids().collect::<Vec<_>>(), vec![nid(A), nid(A_IB)]);
        assert!(p.is_multi_rail(), "DLC's Multi-Rail setting stands");
        assert!(d.peers().ni(nid(A3)).is_none());
        assert_eq!(d.peers().ni(nid(A)).unwrap().status(), NiStatus::Down);
        // Configured MR peer: the push still goes out.
        assert!(matches!(a[0], Action::SendPush { .. }));
        assert!(a.contains(&Action::PeerNiStatus {
            nid: nid(A),
            old: NiStatus::Invalid,
            new: NiStatus::Down
        }));
        ok(&d);
    }

    #[test]
    fn discovery_off_reply_changes_no_nids_and_sends_no_push() {
        let mut d = dd();
        in_wait(&mut d);
        d.set_enabled(t(2), false, 2);
        let a = d.handle_ping_reply(t(3), nid(A), nid(ME), mr_info(5, &[A, A_IB]));
        assert_eq!(a, vec![up(A), transmit(&d, A, 1)]);
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert!(
            !p.is_multi_rail(),
            "only DLC makes peers MR with discovery off"
        );
        assert!(p.no_discovery());
        assert_eq!(p.ni_count(), 1);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        ok(&d);
    }

    #[test]
    fn discovery_switched_off_releases_queued_peers() {
        let mut d = dd();
        in_discovery(&mut d);
        let a = d.set_enabled(t(2), false, 2);
        assert_eq!(a, vec![transmit(&d, A, 1)]);
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        // Switching it back on re-verifies the never-discovered peer.
        assert!(d.set_enabled(t(3), true, 3).is_empty());
        assert_eq!(d.state_of(nid(A)), PeerState::Verify);
        ok(&d);
    }

    #[test]
    fn no_discovery_messages_bypass_parking() {
        let mut d = dd();
        in_discovery(&mut d);
        let a = d.handle_send(t(2), nid(A), 5, SendClass::NoDiscovery);
        assert_eq!(a, vec![transmit(&d, A, 5)]);
        assert_eq!(d.parked_count(nid(A)), 1);
        // To an unknown NID: no peer is created, the NI is recorded.
        let a = d.handle_send(t(2), nid(A3), 6, SendClass::NoDiscovery);
        assert_eq!(
            a,
            vec![Action::Transmit {
                peer: None,
                target: nid(A3),
                msg: 6
            }]
        );
        assert_eq!(d.state_of(nid(A3)), PeerState::Init);
        // Loopback and ANY.
        assert!(matches!(
            d.handle_send(t(2), Nid::LO_0, 7, SendClass::Normal)[..],
            [Action::Transmit { peer: None, .. }]
        ));
        assert!(matches!(
            d.handle_send(t(2), Nid::ANY, 8, SendClass::Normal)[..],
            [Action::Fail {
                error: DiscoveryError::InvalidTarget(_),
                ..
            }]
        ));
        ok(&d);
    }

    #[test]
    fn push_from_non_mr_or_malformed_is_dropped() {
        let mut d = dd();
        assert!(d.handle_push(t(1), nid(A), plain_info(3, &[A])).is_empty());
        assert!(d.handle_push(t(1), nid(A), mr_info(3, &[])).is_empty());
        assert!(
            d.handle_push(t(1), nid(A), mr_info(3, &["0@lo"]))
                .is_empty()
        );
        assert_eq!(d.stats().invalid_ping_info, 3);
        assert!(d.peers().is_empty());
        ok(&d);
    }

    #[test]
    fn forced_discovery_repings_an_active_peer() {
        let mut d = dd();
        in_active(&mut d);
        d.discover(t(10), nid(A), false).unwrap();
        assert_eq!(
            d.state_of(nid(A)),
            PeerState::Active,
            "not forced: nothing to do"
        );
        d.discover(t(10), nid(A), true).unwrap();
        assert_eq!(d.state_of(nid(A)), PeerState::Discovery);
        assert!(matches!(
            d.handle_timeout(t(10))[..],
            [Action::SendPing { .. }]
        ));
        // The node stopped being Multi-Rail: the peer is reduced to one NID.
        let a = d.handle_ping_reply(t(11), nid(A), nid(ME), plain_info(9, &[A, A_IB]));
        assert!(a.is_empty());
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert!(!p.is_multi_rail());
        assert_eq!(p.ni_count(), 1);
        assert!(d.peers().ni(nid(A_IB)).unwrap().is_detached());
        assert_eq!(d.state_of(nid(A)), PeerState::Active);
        ok(&d);
    }

    #[test]
    fn explicit_discovery_of_a_new_nid_and_busy_push_sent() {
        let mut d = dd();
        let id = d.discover(t(1), nid(A3), false).unwrap();
        assert_eq!(d.peer_state(id), PeerState::Discovery);
        assert_eq!(d.parked_count(nid(A3)), 0);
        ok(&d);
        let mut d = dd();
        in_push_sent(&mut d);
        assert_eq!(d.discover(t(5), nid(A), true), Err(PeerError::Busy(nid(A))));
        assert_eq!(
            d.discover(t(5), Nid::ANY, true),
            Err(PeerError::InvalidNid(Nid::ANY))
        );
        ok(&d);
    }

    /// `lnet_peer_tables_cleanup(net)`: the peers of a deleted local net.
    #[test]
    fn a_deleted_local_net_keeps_reachable_peers_and_drops_the_rest() {
        let (tcp, ib): (Net, Net) = ("tcp".parse().unwrap(), "o2ib".parse().unwrap());
        // A (primary on tcp) also has an NI on o2ib, still a local net:
        // it stays whole, its primary moved to the reachable NI.
        let mut d = dd();
        in_active(&mut d);
        assert!(d.local_net_removed(tcp, &[ib]).is_empty());
        let p = d.peers().peer_of(nid(A)).unwrap();
        assert_eq!(p.primary_nid(), nid(A_IB));
        assert!(p.contains(nid(A)) && p.is_multi_rail());
        assert_eq!(d.state_of(nid(A_IB)), PeerState::Active);
        ok(&d);
        // A locked primary stays where it is.
        let mut d = dd();
        in_verify(&mut d);
        d.set_primary_locked(nid(A), true).unwrap();
        assert!(d.local_net_removed(tcp, &[ib]).is_empty());
        assert_eq!(d.peers().peer_of(nid(A_IB)).unwrap().primary_nid(), nid(A));
        ok(&d);
        // No other local net: the peer goes with its primary, and the
        // messages parked on it fail.
        let mut d = dd();
        in_discovery(&mut d);
        assert!(d.handle_send(t(2), nid(A), 2, SendClass::Normal).is_empty());
        let a = d.local_net_removed(tcp, &[]);
        assert_eq!(
            a,
            [1, 2]
                .map(|msg| Action::Fail {
                    target: nid(A),
                    msg,
                    error: DiscoveryError::NetDeleted(tcp),
                })
                .into_iter()
                .collect::<Vec<_>>()
        );
        assert!(d.peers().peer_of(nid(A)).is_none());
        assert_eq!(d.parked_total(), 0);
        assert_eq!(d.state_of(nid(A)), PeerState::Init);
        // A ping reply for the deleted peer finds nothing.
        assert!(
            d.handle_ping_reply(t(3), nid(A), nid(ME), mr_info(5, &[A]))
                .is_empty()
        );
        ok(&d);
        // A locked primary on the deleted net goes too, with its NIs on a
        // net that is not local.
        let mut d = dd();
        in_verify(&mut d);
        d.set_primary_locked(nid(A), true).unwrap();
        assert!(d.local_net_removed(tcp, &[]).is_empty());
        assert!(d.peers().peer_of(nid(A_IB)).is_none());
        assert!(d.peers().ni(nid(A_IB)).is_none());
        ok(&d);
        // A peer whose primary is on a remote net only loses its NIs on the
        // deleted net; peers without NIs there are untouched.
        let mut d = dd();
        d.dlc_add_peer_nis(t(1), nid(A_IB), &[nid(A)], true)
            .unwrap();
        d.dlc_add_peer_nis(t(1), nid("10.9.9.9@tcp9"), &[], false)
            .unwrap();
        assert!(d.local_net_removed(tcp, &[]).is_empty());
        let p = d.peers().peer_of(nid(A_IB)).unwrap();
        assert!(!p.contains(nid(A)));
        assert!(d.peers().ni(nid(A)).is_none());
        assert!(d.peers().peer_of(nid("10.9.9.9@tcp9")).is_some());
        ok(&d);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        const NIDS: [&str; 6] = [
            "10.0.0.2@tcp",
            "192.168.0.2@o2ib",
            "10.0.0.3@tcp",
            "10.0.0.4@tcp",
            "192.168.0.4@o2ib",
            "10.0.0.5@tcp",
        ];

        #[derive(Debug, Clone)]
        enum Ev {
            Send(usize, bool),
            Reply(usize, u32, Vec<usize>, bool),
            Push(usize, u32, Vec<usize>),
            Ack(usize),
            PingFail(usize),
            DlcAdd(usize, Vec<usize>),
            DlcDel(usize, Vec<usize>),
            CfgUpdate,
            Toggle,
            Discover(usize),
            Tick(u64),
            /// A local net deleted; `true`: o2ib (tcp stays local), else tcp.
            NetRemoved(bool),
        }

        fn ev() -> impl Strategy<Value = Ev> {
            let i = 0..NIDS.len();
            let list = proptest::collection::vec(0..NIDS.len(), 0..4);
            prop_oneof![
                4 => (i.clone(), any::<bool>()).prop_map(|(i, n)| Ev::Send(i, n)),
                3 => (i.clone(), 0..8u32, list.clone(), any::<bool>())
                    .prop_map(|(i, s, l, m)| Ev::Reply(i, s, l, m)),
                2 => (i.clone(), 0..8u32, list.clone()).prop_map(|(i, s, l)| Ev::Push(i, s, l)),
                2 => i.clone().prop_map(Ev::Ack),
                1 => i.clone().prop_map(Ev::PingFail),
                1 => (i.clone(), list.clone()).prop_map(|(i, l)| Ev::DlcAdd(i, l)),
                1 => (i.clone(), list).prop_map(|(i, l)| Ev::DlcDel(i, l)),
                1 => Just(Ev::CfgUpdate),
                1 => Just(Ev::Toggle),
                1 => i.prop_map(Ev::Discover),
                3 => (0..200u64).prop_map(Ev::Tick),
                1 => any::<bool>().prop_map(Ev::NetRemoved),
            ]
        }

        proptest! {
            /// Whatever happens, the table and states stay consistent and
            /// every message handed in comes out exactly once (transmitted or
            /// failed) or is still parked on a peer being discovered.
            #[test]
            fn messages_conserved_and_invariants_hold(evs in proptest::collection::vec(ev(), 1..60)) {
                let mut d: Discovery<u32> = Discovery::new(DiscoveryConfig::default(), 1);
                let mut now = Time::from_secs(1);
                let mut next_msg = 0u32;
                let mut out: Vec<u32> = Vec::new();
                let mut seq = 1u32;
                let me = nid(ME);
                let collect = |acts: Vec<Action<u32>>, out: &mut Vec<u32>| {
                    for a in acts {
                        match a {
                            Action::Transmit { msg, .. } | Action::Fail { msg, .. } => out.push(msg),
                            _ => {}
                        }
                    }
                };
                for e in evs {
                    let acts = match e {
                        Ev::Send(i, normal) => {
                            next_msg += 1;
                            let class = if normal { SendClass::Normal } else { SendClass::NoDiscovery };
                            d.handle_send(now, nid(NIDS[i]), next_msg, class)
                        }
                        Ev::Reply(i, s, l, mr) => {
                            let mut names: Vec<&str> = vec![NIDS[i]];
                            names.extend(l.iter().map(|&j| NIDS[j]));
                            let inf = if mr { mr_info(s, &names) } else { plain_info(s, &names) };
                            d.handle_ping_reply(now, nid(NIDS[i]), me, inf)
                        }
                        Ev::Push(i, s, l) => {
                            let mut names: Vec<&str> = vec![NIDS[i]];
                            names.extend(l.iter().map(|&j| NIDS[j]));
                            d.handle_push(now, nid(NIDS[i]), mr_info(s, &names))
                        }
                        Ev::Ack(i) => d.handle_push_ack(now, nid(NIDS[i])),
                        Ev::PingFail(i) => d.handle_ping_failure(now, nid(NIDS[i]), PingFailure::SendFailed),
                        Ev::DlcAdd(i, l) => {
                            let l: Vec<Nid> = l.iter().map(|&j| nid(NIDS[j])).collect();
                            let _ = d.dlc_add_peer_nis(now, nid(NIDS[i]), &l, true);
                            Vec::new()
                        }
                        Ev::DlcDel(i, l) => {
                            let l: Vec<Nid> = l.iter().map(|&j| nid(NIDS[j])).collect();
                            let _ = d.dlc_del_peer_nis(now, nid(NIDS[i]), &l);
                            Vec::new()
                        }
                        Ev::CfgUpdate => { seq += 1; d.local_ni_config_changed(now, seq) }
                        Ev::Toggle => {
                            seq += 1;
                            let on = !d.config().enabled;
                            d.set_enabled(now, on, seq)
                        }
                        Ev::Discover(i) => { let _ = d.discover(now, nid(NIDS[i]), true); Vec::new() }
                        Ev::Tick(s) => { now += Duration::from_secs(s); d.handle_timeout(now) }
                        Ev::NetRemoved(ib) => {
                            let (tcp, o2ib): (Net, Net) = ("tcp".parse().unwrap(), "o2ib".parse().unwrap());
                            if ib { d.local_net_removed(o2ib, &[tcp]) } else { d.local_net_removed(tcp, &[o2ib]) }
                        }
                    };
                    for n in d.take_left_nis() {
                        prop_assert!(d.peers().peer_of(n).is_none());
                    }
                    collect(acts, &mut out);
                    prop_assert_eq!(d.invariant_violation(), None);
                    let parked: usize = d.peers().peers().map(|p| d.parked_count(p.primary_nid())).sum();
                    prop_assert_eq!(out.len() + parked, next_msg as usize);
                }
                // Draining: after the timeouts pass, nothing stays parked.
                now += Duration::from_secs(1000);
                let acts = d.handle_timeout(now);
                collect(acts, &mut out);
                now += Duration::from_secs(1000);
                let acts = d.handle_timeout(now);
                collect(acts, &mut out);
                out.sort_unstable();
                let expect: Vec<u32> = (1..=next_msg).collect();
                prop_assert_eq!(out, expect);
            }
        }
    }
}
