//! Peer tables: peers, peer nets and peer NIs (Lustre's Multi-Rail design, lnet.md section 3.1).
//!
//! A *peer* is a remote node. It owns one *peer net* per LNet network it is
//! reachable on, and each peer net owns the *peer NIs* (remote interfaces,
//! named by NID) of the peer on that network:
//!
//! ```text
//!   PeerTable
//!     ├── peers: PeerId → Peer { primary NID, Multi-Rail?, DLC-configured?, nets }
//!     │                     └── PeerNet { net, NIDs (in order) }
//!     └── NIs:   Nid → PeerNi { peer: Some(PeerId) | None (detached), status }
//! ```
//!
//! Every peer has a **primary NID**, the identity of the node; its peer net
//! comes first and the primary NID comes first within it. A peer NI that
//! belongs to no peer is **detached**: the receive path creates detached peer
//! NIs for unknown senders, DLC deletion on an active peer and discovery
//! (a peer that no longer lists a NID) detach NIs rather than forget them.
//!
//! The table enforces its invariants itself (every NID belongs to at most one
//! peer, no empty peer nets, no empty peers, primary first); every mutation
//! that could break one returns a [`PeerError`] instead. It knows nothing of
//! discovery states, health or credits: [`crate::discovery`] drives it, and
//! health and credits are kept per NID by their own modules.
//!
//! Iteration orders are deterministic (B-tree maps), so a simulation run with
//! the same inputs sees the same peers in the same order.

use std::collections::BTreeMap;

use crate::ids::{Net, Nid};
use crate::nidmap::NidMap;
use crate::wire::NiStatus;

/// A stable handle naming one peer of a [`PeerTable`].
///
/// Handles are never reused within one table, so a handle kept after its peer
/// was deleted (or merged into another) simply finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId(u64);

impl PeerId {
    /// The raw handle value (for logs and statistics).
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer#{}", self.0)
    }
}

/// Errors of peer table operations and of the DLC (configuration) calls of
/// [`crate::discovery::Discovery`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// `LNET_NID_ANY` and loopback NIDs cannot be peer NIDs.
    #[error("{0} cannot be a peer NID")]
    InvalidNid(Nid),
    /// The NID already belongs to a different peer.
    #[error("NID {nid} already belongs to the peer with primary NID {owner}")]
    NidInUse {
        /// The NID asked for.
        nid: Nid,
        /// Primary NID of the peer that owns it.
        owner: Nid,
    },
    /// No peer owns this NID.
    #[error("no peer has NID {0}")]
    NotFound(Nid),
    /// No peer has this handle (deleted or merged away).
    #[error("no peer with handle {0}")]
    NoSuchPeer(PeerId),
    /// The NID is known but is not part of the given peer.
    #[error("NID {nid} is not a NID of the peer with primary NID {primary}")]
    NotInPeer {
        /// The NID asked for.
        nid: Nid,
        /// Primary NID of the peer.
        primary: Nid,
    },
    /// A non-Multi-Rail peer can have at most one NID per net (`-ENOTUNIQ`).
    #[error("non-Multi-Rail peer {primary} already has NID {existing} on net {net}")]
    NotUnique {
        /// Primary NID of the peer.
        primary: Nid,
        /// The NID it already has on that net.
        existing: Nid,
        /// The net.
        net: Net,
    },
    /// DLC asked for a Multi-Rail setting that contradicts the configured one.
    #[error("peer {primary} is configured with Multi-Rail = {configured}")]
    MultiRailConflict {
        /// Primary NID of the peer.
        primary: Nid,
        /// The Multi-Rail setting already configured.
        configured: bool,
    },
    /// The peer is being discovered; DLC changes are refused until it is done
    /// (Lustre's discovery design: "Reject request -EBUSY").
    #[error("peer {0} is busy with discovery; retry when discovery has finished")]
    Busy(Nid),
    /// The NID is the locked primary of another peer that has other NIDs
    /// too: a merge does not take it (Lustre's `lnet_peer_add_nid` flags
    /// both peers `LNET_PEER_BAD_CONFIG` and leaves them apart).
    #[error("NID {nid} is the locked primary NID of another peer with more NIDs")]
    PrimaryLocked {
        /// The NID asked for.
        nid: Nid,
    },
    /// The peer is a router: one of its NIDs is a route's gateway, so DLC
    /// neither deletes it nor makes it a configured peer (Lustre's
    /// `lnet_peer_ni_del_locked` and `lnet_del_peer_ni`: `-EBUSY`).
    #[error("peer {primary} is a router (gateway {gateway}): it cannot be deleted or re-created")]
    Gateway {
        /// Primary NID of the peer.
        primary: Nid,
        /// Its NID that a route uses as gateway.
        gateway: Nid,
    },
    /// DLC named as a primary NID a NID of another peer whose primary NID
    /// is locked (Lustre's `lnet_peer_add`: `-EALREADY`, the peer keeps
    /// the primary NID it was first given).
    #[error("NID {nid} belongs to the peer with locked primary NID {owner}")]
    OwnerPrimaryLocked {
        /// The NID asked for as a primary.
        nid: Nid,
        /// The locked primary NID of the peer that owns it.
        owner: Nid,
    },
    /// A state that cannot hold (`peer set --state`): a peer that is not
    /// Multi-Rail keeps at most one NID per net.
    #[error("peer {primary} has several NIDs on net {net}: it must stay Multi-Rail")]
    MustStayMultiRail {
        /// Primary NID of the peer.
        primary: Nid,
        /// A net where it has several NIDs.
        net: Net,
    },
}

/// One remote interface of a peer, or a detached one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerNi {
    nid: Nid,
    peer: Option<PeerId>,
    status: NiStatus,
    configured: bool,
}

impl PeerNi {
    /// The interface's NID.
    #[must_use]
    pub const fn nid(&self) -> Nid {
        self.nid
    }

    /// The peer it belongs to, or `None` when detached.
    #[must_use]
    pub const fn peer(&self) -> Option<PeerId> {
        self.peer
    }

    /// Whether the NI belongs to no peer.
    #[must_use]
    pub const fn is_detached(&self) -> bool {
        self.peer.is_none()
    }

    /// The status the peer last advertised for it.
    #[must_use]
    pub const fn status(&self) -> NiStatus {
        self.status
    }

    /// Whether DLC (configuration) added this NI.
    #[must_use]
    pub const fn is_configured(&self) -> bool {
        self.configured
    }
}

/// The NIs of one peer on one net, in order (the primary NID first on the
/// primary net).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerNet {
    net: Net,
    nids: Vec<Nid>,
}

impl PeerNet {
    /// The net.
    #[must_use]
    pub const fn net(&self) -> Net {
        self.net
    }

    /// The peer's NIDs on this net, in order.
    #[must_use]
    pub fn nids(&self) -> &[Nid] {
        &self.nids
    }
}

/// A remote node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    id: PeerId,
    primary: Nid,
    multi_rail: bool,
    configured: bool,
    mr_configured: bool,
    no_discovery: bool,
    /// The primary NID stays what it was made with
    /// (`LNET_PEER_LOCK_PRIMARY`).
    lock_primary: bool,
    /// When the primary was locked, in the table's lock order (Lustre's
    /// `lp_prim_lock_ts`): of two locked peers that turn out to be one
    /// node, the NID locked first stays primary.
    lock_seq: u64,
    /// A merge met this peer's locked primary NID in another locked peer
    /// (`LNET_PEER_BAD_CONFIG`, for information).
    bad_config: bool,
    nets: Vec<PeerNet>,
}

impl Peer {
    /// The peer's handle.
    #[must_use]
    pub const fn id(&self) -> PeerId {
        self.id
    }

    /// The primary NID: the node's identity (matching uses it as initiator).
    #[must_use]
    pub const fn primary_nid(&self) -> Nid {
        self.primary
    }

    /// Whether the peer is Multi-Rail (all its NIs may be used for a message).
    #[must_use]
    pub const fn is_multi_rail(&self) -> bool {
        self.multi_rail
    }

    /// Whether DLC configured this peer; discovery never adds, moves or
    /// removes its NIDs, nor changes its primary or Multi-Rail setting.
    #[must_use]
    pub const fn is_configured(&self) -> bool {
        self.configured
    }

    /// Whether the primary NID is locked (`lnetctl peer add --lock_prim`,
    /// Lustre's `LNET_PEER_LOCK_PRIMARY` for peers its upper layers
    /// create): discovery never changes it, and a DLC delete that names it
    /// (or the whole peer) keeps it, removing the other NIDs.
    #[must_use]
    pub const fn is_primary_locked(&self) -> bool {
        self.lock_primary
    }

    /// Whether a merge found this peer's configuration contradicting
    /// another's: both claimed one NID as their locked primary
    /// (`LNET_PEER_BAD_CONFIG`). For information only.
    #[must_use]
    pub const fn is_bad_config(&self) -> bool {
        self.bad_config
    }

    /// Whether the peer advertised that discovery is off on its side
    /// (`LNET_PEER_NO_DISCOVERY`).
    #[must_use]
    pub const fn no_discovery(&self) -> bool {
        self.no_discovery
    }

    /// The peer nets, the primary NID's net first.
    #[must_use]
    pub fn nets(&self) -> &[PeerNet] {
        &self.nets
    }

    /// The peer net for `net`, if the peer has NIs there.
    #[must_use]
    pub fn net(&self, net: Net) -> Option<&PeerNet> {
        self.nets.iter().find(|pn| pn.net == net)
    }

    /// All NIDs of the peer, primary first, net by net.
    pub fn nids(&self) -> impl Iterator<Item = Nid> + '_ {
        self.nets.iter().flat_map(|pn| pn.nids.iter().copied())
    }

    /// Number of NIs.
    #[must_use]
    pub fn ni_count(&self) -> usize {
        self.nets.iter().map(|pn| pn.nids.len()).sum()
    }

    /// Whether `nid` is one of the peer's NIDs.
    #[must_use]
    pub fn contains(&self, nid: Nid) -> bool {
        self.net(nid.net()).is_some_and(|pn| pn.nids.contains(&nid))
    }

    fn push_nid(&mut self, nid: Nid) {
        match self.nets.iter_mut().find(|pn| pn.net == nid.net()) {
            Some(pn) => pn.nids.push(nid),
            None => self.nets.push(PeerNet {
                net: nid.net(),
                nids: vec![nid],
            }),
        }
    }

    fn remove_nid(&mut self, nid: Nid) {
        if let Some(pn) = self.nets.iter_mut().find(|pn| pn.net == nid.net()) {
            pn.nids.retain(|&n| n != nid);
        }
        self.nets.retain(|pn| !pn.nids.is_empty());
    }

    /// Restores "primary net first, primary NID first" after a change.
    fn order_primary_first(&mut self) {
        let primary = self.primary;
        if let Some(pos) = self.nets.iter().position(|pn| pn.net == primary.net()) {
            let pn = self.nets.remove(pos);
            self.nets.insert(0, pn);
            let nids = &mut self.nets[0].nids;
            if let Some(i) = nids.iter().position(|&n| n == primary) {
                let p = nids.remove(i);
                nids.insert(0, p);
            }
        }
    }
}

/// Outcome of [`PeerTable::merge`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MergeReport {
    /// NIDs that were added to the peer (new or previously detached).
    pub added: Vec<Nid>,
    /// NIDs moved from another peer into this one, with their old peer.
    pub moved: Vec<(Nid, PeerId)>,
    /// Other peers that turned out to be this node and were deleted; their
    /// NIs listed in the data now belong to the merged peer.
    pub absorbed: Vec<PeerId>,
    /// NIDs of the peer the data no longer lists; they are now detached.
    pub detached: Vec<Nid>,
    /// NIDs listed in the data that could not be taken, and why (owned by a
    /// DLC-configured peer, invalid NID).
    pub skipped: Vec<(Nid, PeerError)>,
    /// `(old, new)` primary NID if it changed.
    pub primary_changed: Option<(Nid, Nid)>,
    /// Peer NIs whose advertised status changed: `(nid, old, new)`.
    pub status_changes: Vec<(Nid, NiStatus, NiStatus)>,
}

/// Outcome of [`PeerTable::delete_nids`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteReport {
    /// NIDs removed from the peer (deleted, or detached if so asked).
    pub removed: Vec<Nid>,
    /// NIDs in the request that were not NIDs of this peer (skipped).
    pub skipped: Vec<Nid>,
    /// Whether the peer itself was deleted because it had no NI left.
    pub peer_deleted: bool,
}

/// The peer / peer net / peer NI tables of one node.
#[derive(Clone, Debug, Default)]
pub struct PeerTable {
    peers: BTreeMap<PeerId, Peer>,
    nis: NidMap<PeerNi>,
    next_id: u64,
    /// The next [`Peer::lock_seq`].
    next_lock_seq: u64,
    /// NIDs that left a peer since [`PeerTable::take_left`] last ran.
    left: Vec<Nid>,
}

/// The flags of a peer that `lnetctl peer set --state` may set
/// ([`PeerTable::set_flags`]); discovery's own state is not among them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerFlags {
    /// `LNET_PEER_MULTI_RAIL`.
    pub multi_rail: bool,
    /// `LNET_PEER_CONFIGURED`: DLC owns the peer's NIDs.
    pub configured: bool,
    /// `LNET_PEER_LOCK_PRIMARY`.
    pub lock_primary: bool,
    /// `LNET_PEER_BAD_CONFIG`.
    pub bad_config: bool,
}

fn check_peer_nid(nid: Nid) -> Result<(), PeerError> {
    if nid.is_any() || nid.is_lo() {
        Err(PeerError::InvalidNid(nid))
    } else {
        Ok(())
    }
}

impl PeerTable {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of peers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether there are no peers (detached NIs may still exist).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The peer with handle `id`.
    #[must_use]
    pub fn peer(&self, id: PeerId) -> Option<&Peer> {
        self.peers.get(&id)
    }

    /// The peer that owns `nid`, if any.
    #[must_use]
    pub fn peer_of(&self, nid: Nid) -> Option<&Peer> {
        self.peer_id_of(nid).and_then(|id| self.peers.get(&id))
    }

    /// Handle of the peer that owns `nid`, if any.
    #[must_use]
    pub fn peer_id_of(&self, nid: Nid) -> Option<PeerId> {
        self.nis.get(&nid).and_then(|ni| ni.peer)
    }

    /// The peer NI record for `nid` (attached or detached).
    #[must_use]
    pub fn ni(&self, nid: Nid) -> Option<&PeerNi> {
        self.nis.get(&nid)
    }

    /// All peers, in handle order.
    pub fn peers(&self) -> impl Iterator<Item = &Peer> + '_ {
        self.peers.values()
    }

    /// All detached peer NIs, in NID order.
    pub fn detached(&self) -> impl Iterator<Item = &PeerNi> + '_ {
        let mut v: Vec<&PeerNi> = self.nis.values().filter(|ni| ni.peer.is_none()).collect();
        v.sort_unstable_by_key(|ni| ni.nid);
        v.into_iter()
    }

    /// Forgets the detached peer NIs on `net`; returns their NIDs.
    pub fn forget_detached_on(&mut self, net: Net) -> Vec<Nid> {
        let gone: Vec<Nid> = self
            .nis
            .values()
            .filter(|ni| ni.peer.is_none() && ni.nid.net() == net)
            .map(|ni| ni.nid)
            .collect();
        for nid in &gone {
            self.nis.remove(nid);
        }
        gone
    }

    /// The primary NID of the peer owning `nid`, or `nid` itself when no peer
    /// owns it. Matching uses this as the message initiator (lnet.md 2.2).
    #[must_use]
    pub fn primary_nid(&self, nid: Nid) -> Nid {
        self.peer_of(nid).map_or(nid, Peer::primary_nid)
    }

    /// Receive path (`lnet_peer_recv_data`): makes sure a peer NI record exists
    /// for `nid`, creating a detached one if the NID is unknown.
    ///
    /// # Errors
    /// [`PeerError::InvalidNid`] for `LNET_NID_ANY` and loopback NIDs.
    pub fn ensure_ni(&mut self, nid: Nid) -> Result<&PeerNi, PeerError> {
        check_peer_nid(nid)?;
        Ok(self.nis.entry(nid).or_insert_with(|| PeerNi {
            nid,
            peer: None,
            status: NiStatus::Invalid,
            configured: false,
        }))
    }

    /// Creates a single-NI peer whose primary NID is `nid` (the send path on a
    /// detached or unknown NID, Lustre's discovery design, "Sending"). The peer is not
    /// Multi-Rail and not configured until discovery or DLC says otherwise.
    ///
    /// # Errors
    /// [`PeerError::InvalidNid`], or [`PeerError::NidInUse`] if `nid` already
    /// belongs to a peer.
    pub fn create_peer(&mut self, nid: Nid) -> Result<PeerId, PeerError> {
        check_peer_nid(nid)?;
        if let Some(owner) = self.peer_of(nid) {
            return Err(PeerError::NidInUse {
                nid,
                owner: owner.primary,
            });
        }
        let id = PeerId(self.next_id);
        self.next_id += 1;
        self.peers.insert(
            id,
            Peer {
                id,
                primary: nid,
                multi_rail: false,
                configured: false,
                mr_configured: false,
                no_discovery: false,
                lock_primary: false,
                lock_seq: 0,
                bad_config: false,
                nets: vec![PeerNet {
                    net: nid.net(),
                    nids: vec![nid],
                }],
            },
        );
        self.ensure_ni(nid)?;
        if let Some(ni) = self.nis.get_mut(&nid) {
            ni.peer = Some(id);
        }
        tracing::debug!(target: "colibri_lnet::peer", %nid, peer = %id, "peer created");
        Ok(id)
    }

    /// Sets the Multi-Rail and "peer has discovery off" flags (used by
    /// discovery when a ping reply or push says what the peer is). Has no
    /// effect on a DLC-configured peer's Multi-Rail setting.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`]; [`PeerError::NotUnique`] when clearing
    /// Multi-Rail on a peer that has two NIDs on one net (reduce it first with
    /// [`reduce_to`](Self::reduce_to)).
    pub fn set_discovered_flags(
        &mut self,
        id: PeerId,
        multi_rail: bool,
        no_discovery: bool,
    ) -> Result<(), PeerError> {
        let peer = self.peers.get_mut(&id).ok_or(PeerError::NoSuchPeer(id))?;
        if !peer.mr_configured {
            if !multi_rail && let Some(pn) = peer.nets.iter().find(|pn| pn.nids.len() > 1) {
                return Err(PeerError::NotUnique {
                    primary: peer.primary,
                    existing: pn.nids[0],
                    net: pn.net,
                });
            }
            peer.multi_rail = multi_rail;
        }
        peer.no_discovery = no_discovery;
        Ok(())
    }

    /// Attaches `nid` (unknown or detached) to peer `id`.
    ///
    /// # Errors
    /// [`PeerError::InvalidNid`], [`PeerError::NoSuchPeer`],
    /// [`PeerError::NidInUse`] if another peer owns it, and
    /// [`PeerError::NotUnique`] for a second NID on one net of a non-Multi-Rail
    /// peer. Attaching a NID the peer already has is a no-op.
    pub fn attach(&mut self, id: PeerId, nid: Nid) -> Result<(), PeerError> {
        check_peer_nid(nid)?;
        let peer = self.peers.get(&id).ok_or(PeerError::NoSuchPeer(id))?;
        match self.nis.get(&nid).and_then(|ni| ni.peer) {
            Some(owner) if owner == id => return Ok(()),
            Some(owner) => {
                return Err(PeerError::NidInUse {
                    nid,
                    owner: self.peers[&owner].primary,
                });
            }
            None => {}
        }
        if !peer.multi_rail
            && let Some(pn) = peer.net(nid.net())
        {
            return Err(PeerError::NotUnique {
                primary: peer.primary,
                existing: pn.nids[0],
                net: nid.net(),
            });
        }
        self.ensure_ni(nid)?;
        if let Some(ni) = self.nis.get_mut(&nid) {
            ni.peer = Some(id);
        }
        if let Some(peer) = self.peers.get_mut(&id) {
            peer.push_nid(nid);
        }
        Ok(())
    }

    /// Removes `nid` from its peer, keeping it as a detached peer NI when
    /// `keep_detached`, forgetting it otherwise. Empty peer nets are deleted;
    /// a peer left without NIs is deleted (returns its handle). Removing the
    /// primary NID of a peer that keeps other NIs makes its first remaining
    /// NID primary.
    fn unlink(&mut self, nid: Nid, keep_detached: bool) -> Option<PeerId> {
        let owner = self.nis.get(&nid).and_then(|ni| ni.peer);
        if owner.is_some() {
            self.left.push(nid);
        }
        if keep_detached {
            if let Some(ni) = self.nis.get_mut(&nid) {
                ni.peer = None;
                ni.configured = false;
            }
        } else {
            self.nis.remove(&nid);
        }
        let id = owner?;
        let peer = self.peers.get_mut(&id)?;
        peer.remove_nid(nid);
        if peer.nets.is_empty() {
            self.peers.remove(&id);
            tracing::debug!(target: "colibri_lnet::peer", peer = %id, "peer deleted (no NI left)");
            return Some(id);
        }
        if peer.primary == nid {
            peer.primary = peer.nets[0].nids[0];
            peer.order_primary_first();
        }
        None
    }

    /// Detaches every NI of peer `id` and deletes the peer. The NIs stay
    /// known as detached peer NIs.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`].
    pub fn delete_peer(&mut self, id: PeerId) -> Result<Vec<Nid>, PeerError> {
        let peer = self.peers.remove(&id).ok_or(PeerError::NoSuchPeer(id))?;
        let nids: Vec<Nid> = peer.nids().collect();
        self.left.extend_from_slice(&nids);
        for nid in &nids {
            if let Some(ni) = self.nis.get_mut(nid) {
                ni.peer = None;
                ni.configured = false;
            }
        }
        Ok(nids)
    }

    /// The NIDs that left their peer (deleted, detached, or with their
    /// peer) since the last call and belong to no peer now, sorted: a node
    /// forgets what it kept about them (health, counters, selection), as
    /// Lustre frees a deleted `lnet_peer_ni`.
    /// A NID moved to another peer is not among them.
    pub fn take_left(&mut self) -> Vec<Nid> {
        if self.left.is_empty() {
            return Vec::new();
        }
        let mut left = std::mem::take(&mut self.left);
        left.retain(|&n| self.peer_of(n).is_none());
        left.sort_unstable();
        left.dedup();
        left
    }

    /// Locks or unlocks peer `id`'s primary NID
    /// ([`Peer::is_primary_locked`]).
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`].
    pub fn set_primary_locked(&mut self, id: PeerId, locked: bool) -> Result<(), PeerError> {
        let peer = self.peers.get_mut(&id).ok_or(PeerError::NoSuchPeer(id))?;
        if locked && !peer.lock_primary {
            self.next_lock_seq += 1;
            peer.lock_seq = self.next_lock_seq;
        }
        peer.lock_primary = locked;
        Ok(())
    }

    /// Sets peer `id`'s flags at once (`lnetctl peer set --state`, "for
    /// test and debug only"): clearing `configured` hands the peer's NIDs
    /// to discovery, setting it takes them back for DLC.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`]; [`PeerError::MustStayMultiRail`] when
    /// `multi_rail` is cleared on a peer with several NIDs on one net.
    /// Nothing is changed on error.
    pub fn set_flags(&mut self, id: PeerId, flags: PeerFlags) -> Result<(), PeerError> {
        let peer = self.peers.get(&id).ok_or(PeerError::NoSuchPeer(id))?;
        if !flags.multi_rail
            && let Some(pn) = peer.nets.iter().find(|pn| pn.nids.len() > 1)
        {
            return Err(PeerError::MustStayMultiRail {
                primary: peer.primary,
                net: pn.net,
            });
        }
        self.set_primary_locked(id, flags.lock_primary)?;
        let peer = self.peers.get_mut(&id).ok_or(PeerError::NoSuchPeer(id))?;
        peer.multi_rail = flags.multi_rail;
        peer.configured = flags.configured;
        peer.bad_config = flags.bad_config;
        let nids: Vec<Nid> = peer.nids().collect();
        for nid in nids {
            if let Some(ni) = self.nis.get_mut(&nid) {
                ni.configured = flags.configured;
            }
        }
        Ok(())
    }

    /// Makes `nid` (already a NID of peer `id`) the primary NID.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`], [`PeerError::NotInPeer`].
    pub fn set_primary(&mut self, id: PeerId, nid: Nid) -> Result<(), PeerError> {
        let peer = self.peers.get_mut(&id).ok_or(PeerError::NoSuchPeer(id))?;
        if !peer.contains(nid) {
            return Err(PeerError::NotInPeer {
                nid,
                primary: peer.primary,
            });
        }
        peer.primary = nid;
        peer.order_primary_first();
        Ok(())
    }

    /// Checks a DLC add (`lnet_peer_add_peer_ni`) without changing anything:
    /// returns the peer that owns `primary` (if any), or an error if a NID is
    /// invalid or belongs to a different peer (Lustre's discovery design: "ensure that the peer
    /// NIDs provided are all unique to this peer"; the whole operation is
    /// refused so that nothing has to be rolled back).
    ///
    /// # Errors
    /// [`PeerError::InvalidNid`], [`PeerError::NidInUse`],
    /// [`PeerError::MultiRailConflict`], [`PeerError::NotUnique`].
    pub fn check_dlc_add(
        &self,
        primary: Nid,
        nids: &[Nid],
        multi_rail: bool,
    ) -> Result<Option<PeerId>, PeerError> {
        check_peer_nid(primary)?;
        for &nid in nids {
            check_peer_nid(nid)?;
        }
        let owner = self.peer_id_of(primary);
        for &nid in nids {
            if let Some(other) = self.peer_id_of(nid)
                && Some(other) != owner
            {
                return Err(PeerError::NidInUse {
                    nid,
                    owner: self.peers[&other].primary,
                });
            }
        }
        if let Some(id) = owner {
            let peer = &self.peers[&id];
            if peer.mr_configured && peer.multi_rail != multi_rail {
                return Err(PeerError::MultiRailConflict {
                    primary: peer.primary,
                    configured: peer.multi_rail,
                });
            }
        }
        if !multi_rail {
            // One NID per net for a non-Multi-Rail peer, counting what it has.
            let mut per_net: BTreeMap<Net, Nid> = BTreeMap::new();
            // The peer's own NIDs count too: a Multi-Rail peer that
            // discovery gave two NIDs on one net cannot be made non-MR.
            let have: Vec<Nid> = owner
                .map(|id| self.peers[&id].nids().collect())
                .unwrap_or_default();
            per_net.entry(primary.net()).or_insert(primary);
            for &nid in have.iter().chain(nids) {
                let existing = *per_net.entry(nid.net()).or_insert(nid);
                if existing != nid {
                    return Err(PeerError::NotUnique {
                        primary,
                        existing,
                        net: nid.net(),
                    });
                }
            }
        }
        Ok(owner)
    }

    /// Applies a DLC add after [`check_dlc_add`](Self::check_dlc_add): creates
    /// the peer with `primary` if needed, adds the NIDs it does not have yet
    /// (duplicates and the primary repeated in `nids` are ignored), and marks
    /// the peer and the NIs as configured with the given Multi-Rail setting.
    ///
    /// # Errors
    /// As [`check_dlc_add`](Self::check_dlc_add); nothing is changed on error.
    pub fn dlc_add(
        &mut self,
        primary: Nid,
        nids: &[Nid],
        multi_rail: bool,
    ) -> Result<PeerId, PeerError> {
        let owner = self.check_dlc_add(primary, nids, multi_rail)?;
        let id = match owner {
            Some(id) => id,
            None => self.create_peer(primary)?,
        };
        if let Some(peer) = self.peers.get_mut(&id) {
            peer.configured = true;
            peer.mr_configured = true;
            peer.multi_rail = multi_rail;
        }
        for &nid in std::iter::once(&primary).chain(nids) {
            self.attach(id, nid)?;
            if let Some(ni) = self.nis.get_mut(&nid) {
                ni.configured = true;
            }
        }
        Ok(id)
    }

    /// DLC deletion (`lnet_peer_del_peer_ni`) of `nids` from peer `id`; an
    /// empty `nids`, or one naming the primary NID, deletes every NI and so
    /// the peer (Lustre's `lnet_del_peer_ni`: the primary goes with its
    /// peer), unless the primary is locked: then it stays and the other
    /// NIDs go (`lnet_reset_peer`). NIDs that are not the peer's are
    /// skipped (Lustre's discovery design: "if not unique skip that
    /// peer_ni"). `keep_detached` keeps the removed NIs as detached peer
    /// NIs instead of forgetting them.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`]; nothing is changed on error.
    pub fn delete_nids(
        &mut self,
        id: PeerId,
        nids: &[Nid],
        keep_detached: bool,
    ) -> Result<DeleteReport, PeerError> {
        let peer = self.peers.get(&id).ok_or(PeerError::NoSuchPeer(id))?;
        let mut report = DeleteReport::default();
        let mut remove: Vec<Nid> = Vec::new();
        if nids.is_empty() {
            remove.extend(peer.nids());
        } else {
            for &nid in nids {
                if peer.contains(nid) {
                    if !remove.contains(&nid) {
                        remove.push(nid);
                    }
                } else if !report.skipped.contains(&nid) {
                    report.skipped.push(nid);
                }
            }
        }
        if remove.contains(&peer.primary) {
            if peer.lock_primary {
                // Lustre's lnet_reset_peer: the primary stays, the rest go.
                remove = peer.nids().filter(|&n| n != peer.primary).collect();
            } else {
                for nid in peer.nids() {
                    if !remove.contains(&nid) {
                        remove.push(nid);
                    }
                }
            }
        }
        for nid in remove {
            if self.unlink(nid, keep_detached).is_some() {
                report.peer_deleted = true;
            }
            report.removed.push(nid);
        }
        Ok(report)
    }

    /// Merges what a peer said about itself (a ping reply or push) into peer
    /// `id` (Lustre's discovery design, "When processing PING REPLY or PING PUSH", lnet.md 3.7).
    ///
    /// `data` lists the peer's NIDs with their status, **primary first**.
    /// Statuses of NIDs the peer already has are always updated. When
    /// `may_change_nids` is false (DLC-configured peer, non-Multi-Rail peer,
    /// discovery off) nothing else changes. Otherwise:
    /// - NIDs that are unknown or detached are attached to the peer;
    /// - NIDs that belong to another, non-configured peer are moved here,
    ///   since discovery gives the latest view of the node. Taking another
    ///   peer's primary NID absorbs that peer: it is deleted and its other NIs
    ///   are detached (those listed in `data` are attached here). NIDs owned by
    ///   a DLC-configured peer are skipped (DLC wins). When the absorbed
    ///   peer's primary was locked, it becomes this peer's locked primary,
    ///   unless this peer's own primary was locked before it (Lustre keeps
    ///   the NID locked first); a locked primary whose peer has other NIDs
    ///   is not taken, and both peers are marked [`Peer::is_bad_config`];
    /// - the data's primary becomes the peer's primary (unless configured);
    /// - the peer's NIDs that the data does not list are detached.
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`]. Problems with single NIDs are reported in
    /// [`MergeReport::skipped`] and do not stop the merge.
    pub fn merge(
        &mut self,
        id: PeerId,
        data: &[(Nid, NiStatus)],
        may_change_nids: bool,
    ) -> Result<MergeReport, PeerError> {
        let peer = self.peers.get(&id).ok_or(PeerError::NoSuchPeer(id))?;
        // Lustre: discovery never changes the NIDs of a DLC-configured peer
        // (DLC wins) nor of a non-Multi-Rail one.
        let may_change = may_change_nids && !peer.configured && peer.multi_rail;
        let mut report = MergeReport::default();
        let mut listed: Vec<Nid> = Vec::with_capacity(data.len());
        // The locked primary of a peer being absorbed, with its lock order.
        let mut inherit_lock: Option<(Nid, u64)> = None;
        for &(nid, status) in data {
            if let Err(e) = check_peer_nid(nid) {
                report.skipped.push((nid, e));
                continue;
            }
            if listed.contains(&nid) {
                continue;
            }
            listed.push(nid);
            let owner = self.peer_id_of(nid);
            if owner != Some(id) {
                if !may_change {
                    continue;
                }
                if let Some(other) = owner {
                    let other_peer = &self.peers[&other];
                    if other_peer.configured {
                        report.skipped.push((
                            nid,
                            PeerError::NidInUse {
                                nid,
                                owner: other_peer.primary,
                            },
                        ));
                        continue;
                    }
                    if other_peer.primary == nid {
                        if other_peer.lock_primary && other_peer.ni_count() > 1 {
                            // Lustre keeps both apart and flags them.
                            tracing::warn!(target: "colibri_lnet::peer", %nid, locked_in = %other,
                                peer = %id, "NID is another peer's locked primary; not merged");
                            for p in [id, other] {
                                if let Some(p) = self.peers.get_mut(&p) {
                                    p.bad_config = true;
                                }
                            }
                            report.skipped.push((nid, PeerError::PrimaryLocked { nid }));
                            continue;
                        }
                        // The other peer is this node: absorb it. A locked
                        // primary of the other peer stays the node's
                        // primary unless this peer's was locked before it.
                        let locked = other_peer.lock_primary.then_some(other_peer.lock_seq);
                        self.delete_peer(other)?;
                        report.absorbed.push(other);
                        tracing::info!(target: "colibri_lnet::peer", %nid, absorbed = %other,
                            into = %id, "peers merged: same node");
                        inherit_lock = locked.map(|seq| (nid, seq));
                    } else {
                        self.unlink(nid, true);
                    }
                    report.moved.push((nid, other));
                } else {
                    report.added.push(nid);
                }
                if let Err(e) = self.attach(id, nid) {
                    report.skipped.push((nid, e));
                    continue;
                }
                if let Some((locked_nid, seq)) = inherit_lock.take() {
                    let this = &self.peers[&id];
                    if !this.lock_primary || seq < this.lock_seq {
                        let old = this.primary;
                        self.set_primary(id, locked_nid)?;
                        let this = self.peers.get_mut(&id).ok_or(PeerError::NoSuchPeer(id))?;
                        this.lock_primary = true;
                        this.lock_seq = seq;
                        if old != locked_nid {
                            report.primary_changed = Some((old, locked_nid));
                        }
                    }
                }
            }
            if let Some(ni) = self.nis.get_mut(&nid)
                && ni.status != status
            {
                report.status_changes.push((nid, ni.status, status));
                ni.status = status;
            }
        }
        if !may_change {
            return Ok(report);
        }
        // Primary NID: the data's first valid entry, if we now own it.
        if let Some(&new_primary) = listed.first() {
            let old = self.peers[&id].primary;
            if new_primary != old
                && !self.peers[&id].lock_primary
                && self.peer_id_of(new_primary) == Some(id)
            {
                self.set_primary(id, new_primary)?;
                report.primary_changed = Some((old, new_primary));
            }
        }
        // Detach what the peer no longer lists (never the current primary).
        let stale: Vec<Nid> = {
            let peer = &self.peers[&id];
            peer.nids()
                .filter(|n| !listed.contains(n) && *n != peer.primary)
                .collect()
        };
        for nid in stale {
            self.unlink(nid, true);
            report.detached.push(nid);
        }
        // Keep the data's net order after the primary net, as Lustre does.
        if let Some(peer) = self.peers.get_mut(&id) {
            let rank = |net: Net| {
                listed
                    .iter()
                    .position(|n| n.net() == net)
                    .unwrap_or(usize::MAX)
            };
            peer.nets.sort_by_key(|pn| rank(pn.net));
            for pn in &mut peer.nets {
                let pos = |n: &Nid| listed.iter().position(|l| l == n).unwrap_or(usize::MAX);
                pn.nids.sort_by_key(pos);
            }
            peer.order_primary_first();
        }
        Ok(report)
    }

    /// Detaches every NI of peer `id` except `keep`, which becomes primary
    /// (a Multi-Rail peer that turned out not to be one any more is reduced
    /// to the NID that answered, lnet.md 3.5).
    ///
    /// # Errors
    /// [`PeerError::NoSuchPeer`], [`PeerError::NotInPeer`].
    pub fn reduce_to(&mut self, id: PeerId, keep: Nid) -> Result<Vec<Nid>, PeerError> {
        self.set_primary(id, keep)?;
        let others: Vec<Nid> = self.peers[&id].nids().filter(|&n| n != keep).collect();
        for &nid in &others {
            self.unlink(nid, true);
        }
        Ok(others)
    }

    /// Checks the table invariants; returns a description of the first
    /// violation. Used by tests; cheap enough for debug assertions.
    #[must_use]
    pub fn invariant_violation(&self) -> Option<String> {
        for (id, peer) in &self.peers {
            if peer.id != *id {
                return Some(format!("{id} stored under wrong key"));
            }
            if peer.nets.is_empty() {
                return Some(format!("{id} has no NI"));
            }
            if peer.nets[0].nids.first() != Some(&peer.primary) {
                return Some(format!("{id}: primary {} is not first", peer.primary));
            }
            for pn in &peer.nets {
                if pn.nids.is_empty() {
                    return Some(format!("{id}: empty peer net {}", pn.net));
                }
                if peer.nets.iter().filter(|o| o.net == pn.net).count() != 1 {
                    return Some(format!("{id}: net {} listed twice", pn.net));
                }
                for nid in &pn.nids {
                    if nid.net() != pn.net {
                        return Some(format!("{id}: {nid} under net {}", pn.net));
                    }
                    if self.nis.get(nid).and_then(|ni| ni.peer) != Some(*id) {
                        return Some(format!("{id}: {nid} not owned back"));
                    }
                }
            }
            if !peer.multi_rail && peer.nets.iter().any(|pn| pn.nids.len() > 1) {
                return Some(format!("{id}: non-MR peer with two NIDs on one net"));
            }
        }
        for (nid, ni) in &self.nis {
            if let Some(id) = ni.peer {
                match self.peers.get(&id) {
                    Some(p) if p.contains(*nid) => {}
                    _ => return Some(format!("{nid} points at {id} which lacks it")),
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn up(s: &str) -> (Nid, NiStatus) {
        (nid(s), NiStatus::Up)
    }

    fn mr_peer(t: &mut PeerTable, primary: &str) -> PeerId {
        let id = t.create_peer(nid(primary)).unwrap();
        t.set_discovered_flags(id, true, false).unwrap();
        id
    }

    #[test]
    fn create_and_lookup() {
        let mut t = PeerTable::new();
        let id = t.create_peer(nid("10.0.0.1@tcp")).unwrap();
        assert_eq!(t.peer_id_of(nid("10.0.0.1@tcp")), Some(id));
        assert_eq!(t.primary_nid(nid("10.0.0.1@tcp")), nid("10.0.0.1@tcp"));
        assert_eq!(t.primary_nid(nid("10.0.0.9@tcp")), nid("10.0.0.9@tcp"));
        assert!(matches!(
            t.create_peer(nid("10.0.0.1@tcp")),
            Err(PeerError::NidInUse { .. })
        ));
        assert_eq!(
            t.create_peer(Nid::LO_0),
            Err(PeerError::InvalidNid(Nid::LO_0))
        );
        assert_eq!(
            t.create_peer(Nid::ANY),
            Err(PeerError::InvalidNid(Nid::ANY))
        );
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn ensure_ni_creates_detached() {
        let mut t = PeerTable::new();
        let ni = t.ensure_ni(nid("10.0.0.7@tcp")).unwrap();
        assert!(ni.is_detached());
        assert_eq!(t.detached().count(), 1);
        assert!(t.is_empty());
        // A send later turns the detached NI into a peer.
        let id = t.create_peer(nid("10.0.0.7@tcp")).unwrap();
        assert_eq!(t.peer_id_of(nid("10.0.0.7@tcp")), Some(id));
        assert_eq!(t.detached().count(), 0);
    }

    #[test]
    fn non_mr_peer_keeps_one_nid_per_net() {
        let mut t = PeerTable::new();
        let id = t.create_peer(nid("10.0.0.1@tcp")).unwrap();
        assert!(matches!(
            t.attach(id, nid("10.0.0.2@tcp")),
            Err(PeerError::NotUnique { .. })
        ));
        t.attach(id, nid("192.168.0.1@o2ib")).unwrap();
        assert_eq!(t.peer(id).unwrap().ni_count(), 2);
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_adds_nids_and_keeps_primary_first() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, "10.0.0.1@tcp");
        let r = t
            .merge(
                id,
                &[
                    up("10.0.0.1@tcp"),
                    up("192.168.0.1@o2ib"),
                    up("10.0.0.2@tcp"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(r.added, vec![nid("192.168.0.1@o2ib"), nid("10.0.0.2@tcp")]);
        let p = t.peer(id).unwrap();
        assert_eq!(p.ni_count(), 3);
        assert_eq!(p.nets()[0].net(), nid("10.0.0.1@tcp").net());
        assert_eq!(
            p.nets()[0].nids(),
            &[nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp")]
        );
        assert_eq!(r.status_changes.len(), 3);
        assert_eq!(t.ni(nid("10.0.0.2@tcp")).unwrap().status(), NiStatus::Up);
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_changes_primary_and_detaches_unlisted() {
        let mut t = PeerTable::new();
        // We first talked to NID B; the node's primary is A and B is gone.
        let id = mr_peer(&mut t, "10.0.0.2@tcp");
        t.attach(id, nid("10.0.0.3@tcp")).unwrap();
        let r = t
            .merge(id, &[up("10.0.0.1@tcp"), up("10.0.0.3@tcp")], true)
            .unwrap();
        assert_eq!(
            r.primary_changed,
            Some((nid("10.0.0.2@tcp"), nid("10.0.0.1@tcp")))
        );
        assert_eq!(r.detached, vec![nid("10.0.0.2@tcp")]);
        assert!(t.ni(nid("10.0.0.2@tcp")).unwrap().is_detached());
        assert_eq!(t.peer(id).unwrap().primary_nid(), nid("10.0.0.1@tcp"));
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn a_locked_primary_stays_through_merges_and_deletes() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, "10.0.0.2@tcp");
        t.set_primary_locked(id, true).unwrap();
        let r = t
            .merge(id, &[up("10.0.0.1@tcp"), up("10.0.0.3@tcp")], true)
            .unwrap();
        assert_eq!(r.primary_changed, None);
        let p = t.peer(id).unwrap();
        assert_eq!(p.primary_nid(), nid("10.0.0.2@tcp"));
        assert!(p.contains(nid("10.0.0.1@tcp")) && p.contains(nid("10.0.0.3@tcp")));
        // Deleting the whole peer keeps the primary (lnet_reset_peer).
        let r = t.delete_nids(id, &[], false).unwrap();
        assert!(!r.peer_deleted);
        let left: Vec<Nid> = t.peer(id).unwrap().nids().collect();
        assert_eq!(left, vec![nid("10.0.0.2@tcp")]);
        t.set_primary_locked(id, false).unwrap();
        assert!(t.delete_nids(id, &[], false).unwrap().peer_deleted);
        assert!(t.invariant_violation().is_none());
    }

    /// Lustre's sanity-lnet test 304: a locked primary of a peer that
    /// discovery finds to be the same node stays the node's primary.
    #[test]
    fn a_merge_keeps_the_absorbed_peers_locked_primary() {
        let mut t = PeerTable::new();
        let locked = mr_peer(&mut t, "10.0.0.2@tcp");
        t.set_primary_locked(locked, true).unwrap();
        let found = mr_peer(&mut t, "10.0.0.1@tcp");
        let r = t
            .merge(found, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], true)
            .unwrap();
        assert_eq!(r.absorbed, vec![locked]);
        assert_eq!(
            r.primary_changed,
            Some((nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp")))
        );
        let p = t.peer(found).unwrap();
        assert_eq!(p.primary_nid(), nid("10.0.0.2@tcp"));
        assert!(p.is_primary_locked() && !p.is_bad_config());
        assert_eq!(p.ni_count(), 2);
        // The next merge does not move it back to the data's first NID.
        let r = t
            .merge(found, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], true)
            .unwrap();
        assert_eq!(r.primary_changed, None);
        assert!(t.invariant_violation().is_none());
    }

    /// Of two locked primaries of one node, the one locked first stays.
    #[test]
    fn of_two_locked_primaries_the_first_locked_stays() {
        for first_locked_is_absorbed in [true, false] {
            let mut t = PeerTable::new();
            let other = mr_peer(&mut t, "10.0.0.2@tcp");
            let this = mr_peer(&mut t, "10.0.0.1@tcp");
            let order = if first_locked_is_absorbed {
                [other, this]
            } else {
                [this, other]
            };
            for id in order {
                t.set_primary_locked(id, true).unwrap();
            }
            t.merge(this, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], true)
                .unwrap();
            let p = t.peer(this).unwrap();
            let want = if first_locked_is_absorbed {
                "10.0.0.2@tcp"
            } else {
                "10.0.0.1@tcp"
            };
            assert_eq!(p.primary_nid(), nid(want), "{first_locked_is_absorbed}");
            assert!(p.is_primary_locked());
            assert!(t.peer(other).is_none());
            assert!(t.invariant_violation().is_none());
        }
    }

    /// A locked primary whose peer has more NIDs is not taken: both
    /// peers are flagged, nothing moves.
    #[test]
    fn a_locked_primary_with_company_is_not_merged() {
        let mut t = PeerTable::new();
        let other = mr_peer(&mut t, "10.0.0.2@tcp");
        t.attach(other, nid("10.0.0.3@tcp")).unwrap();
        t.set_primary_locked(other, true).unwrap();
        let this = mr_peer(&mut t, "10.0.0.1@tcp");
        let r = t
            .merge(this, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], true)
            .unwrap();
        assert!(r.absorbed.is_empty());
        assert_eq!(
            r.skipped,
            vec![(
                nid("10.0.0.2@tcp"),
                PeerError::PrimaryLocked {
                    nid: nid("10.0.0.2@tcp")
                }
            )]
        );
        assert_eq!(t.peer(other).unwrap().ni_count(), 2);
        assert_eq!(t.peer(this).unwrap().ni_count(), 1);
        assert!(t.peer(this).unwrap().is_bad_config());
        assert!(t.peer(other).unwrap().is_bad_config());
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn set_flags_hands_a_configured_peer_to_discovery() {
        let mut t = PeerTable::new();
        let id = t.dlc_add(nid("10.0.0.2@tcp"), &[], true).unwrap();
        assert!(t.peer(id).unwrap().is_configured());
        let flags = PeerFlags {
            multi_rail: true,
            lock_primary: true,
            ..PeerFlags::default()
        };
        t.set_flags(id, flags).unwrap();
        let p = t.peer(id).unwrap();
        assert!(!p.is_configured() && p.is_primary_locked() && p.is_multi_rail());
        // Now a merge may absorb it.
        let found = mr_peer(&mut t, "10.0.0.1@tcp");
        let r = t
            .merge(found, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], true)
            .unwrap();
        assert_eq!(r.absorbed, vec![id]);
        // Several NIDs on one net: it must stay Multi-Rail.
        let err = t.set_flags(found, PeerFlags::default()).unwrap_err();
        assert!(matches!(err, PeerError::MustStayMultiRail { .. }), "{err}");
        assert!(
            t.peer(found).unwrap().is_primary_locked(),
            "unchanged on error"
        );
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_absorbs_a_peer_whose_primary_is_listed() {
        let mut t = PeerTable::new();
        let a = mr_peer(&mut t, "10.0.0.1@tcp");
        let b = mr_peer(&mut t, "192.168.0.1@o2ib");
        t.attach(b, nid("192.168.0.9@o2ib")).unwrap();
        // A's ping reply lists B's primary: they are the same node.
        let r = t
            .merge(a, &[up("10.0.0.1@tcp"), up("192.168.0.1@o2ib")], true)
            .unwrap();
        assert_eq!(r.absorbed, vec![b]);
        assert!(t.peer(b).is_none());
        assert_eq!(t.peer_id_of(nid("192.168.0.1@o2ib")), Some(a));
        // B's NI the data does not list stays known but detached.
        assert!(t.ni(nid("192.168.0.9@o2ib")).unwrap().is_detached());
        assert_eq!(t.len(), 1);
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_moves_a_non_primary_nid_between_peers() {
        let mut t = PeerTable::new();
        let a = mr_peer(&mut t, "10.0.0.1@tcp");
        let b = mr_peer(&mut t, "10.0.0.5@tcp");
        t.attach(b, nid("10.0.0.6@tcp")).unwrap();
        let r = t
            .merge(a, &[up("10.0.0.1@tcp"), up("10.0.0.6@tcp")], true)
            .unwrap();
        assert_eq!(r.moved, vec![(nid("10.0.0.6@tcp"), b)]);
        assert!(r.absorbed.is_empty());
        assert_eq!(t.peer(b).unwrap().ni_count(), 1);
        assert_eq!(t.peer_id_of(nid("10.0.0.6@tcp")), Some(a));
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_never_takes_nids_of_configured_peers() {
        let mut t = PeerTable::new();
        let a = mr_peer(&mut t, "10.0.0.1@tcp");
        let c = t
            .dlc_add(nid("10.0.0.7@tcp"), &[nid("10.0.0.8@tcp")], true)
            .unwrap();
        let r = t
            .merge(a, &[up("10.0.0.1@tcp"), up("10.0.0.8@tcp")], true)
            .unwrap();
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(t.peer_id_of(nid("10.0.0.8@tcp")), Some(c));
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn merge_into_configured_peer_only_updates_status() {
        let mut t = PeerTable::new();
        let c = t
            .dlc_add(nid("10.0.0.7@tcp"), &[nid("10.0.0.8@tcp")], true)
            .unwrap();
        let r = t
            .merge(
                c,
                &[up("10.0.0.9@tcp"), (nid("10.0.0.8@tcp"), NiStatus::Down)],
                true,
            )
            .unwrap();
        let p = t.peer(c).unwrap();
        assert_eq!(p.primary_nid(), nid("10.0.0.7@tcp"));
        assert_eq!(p.ni_count(), 2);
        assert!(t.ni(nid("10.0.0.9@tcp")).is_none());
        assert_eq!(
            r.status_changes,
            vec![(nid("10.0.0.8@tcp"), NiStatus::Invalid, NiStatus::Down)]
        );
    }

    #[test]
    fn merge_without_permission_changes_no_nids() {
        let mut t = PeerTable::new();
        let a = t.create_peer(nid("10.0.0.1@tcp")).unwrap();
        let r = t
            .merge(a, &[up("10.0.0.1@tcp"), up("10.0.0.2@tcp")], false)
            .unwrap();
        assert!(r.added.is_empty());
        assert_eq!(t.peer(a).unwrap().ni_count(), 1);
        assert_eq!(t.ni(nid("10.0.0.1@tcp")).unwrap().status(), NiStatus::Up);
    }

    #[test]
    fn dlc_add_rejects_nids_of_other_peers_without_change() {
        let mut t = PeerTable::new();
        let other = t.create_peer(nid("10.0.0.5@tcp")).unwrap();
        let err = t
            .dlc_add(
                nid("10.0.0.1@tcp"),
                &[nid("10.0.0.2@tcp"), nid("10.0.0.5@tcp")],
                true,
            )
            .unwrap_err();
        assert_eq!(
            err,
            PeerError::NidInUse {
                nid: nid("10.0.0.5@tcp"),
                owner: nid("10.0.0.5@tcp")
            }
        );
        assert_eq!(t.len(), 1);
        assert!(t.ni(nid("10.0.0.2@tcp")).is_none());
        assert!(t.peer(other).is_some());
    }

    #[test]
    fn dlc_add_extends_existing_peer_and_marks_configured() {
        let mut t = PeerTable::new();
        let id = t.create_peer(nid("10.0.0.1@tcp")).unwrap();
        let again = t
            .dlc_add(
                nid("10.0.0.1@tcp"),
                &[
                    nid("10.0.0.1@tcp"),
                    nid("10.0.0.2@tcp"),
                    nid("10.0.0.2@tcp"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(again, id);
        let p = t.peer(id).unwrap();
        assert!(p.is_configured());
        assert!(p.is_multi_rail());
        assert_eq!(p.ni_count(), 2);
        assert!(t.ni(nid("10.0.0.2@tcp")).unwrap().is_configured());
        assert_eq!(
            t.dlc_add(nid("10.0.0.1@tcp"), &[], false),
            Err(PeerError::MultiRailConflict {
                primary: nid("10.0.0.1@tcp"),
                configured: true
            })
        );
    }

    #[test]
    fn dlc_add_non_mr_two_nids_on_one_net_is_refused() {
        let mut t = PeerTable::new();
        assert!(matches!(
            t.dlc_add(nid("10.0.0.1@tcp"), &[nid("10.0.0.2@tcp")], false),
            Err(PeerError::NotUnique { .. })
        ));
        assert!(t.is_empty());
        let id = t
            .dlc_add(nid("10.0.0.1@tcp"), &[nid("192.168.0.1@o2ib")], false)
            .unwrap();
        assert!(!t.peer(id).unwrap().is_multi_rail());
    }

    #[test]
    fn delete_nids_rules() {
        let mut t = PeerTable::new();
        let id = t
            .dlc_add(
                nid("10.0.0.1@tcp"),
                &[nid("10.0.0.2@tcp"), nid("192.168.0.1@o2ib")],
                true,
            )
            .unwrap();
        // The primary goes with the whole peer (on a copy of the table).
        let mut whole = t.clone();
        let r = whole
            .delete_nids(id, &[nid("10.0.0.1@tcp")], false)
            .unwrap();
        assert!(r.peer_deleted && r.removed.len() == 3, "{r:?}");
        assert!(whole.peer(id).is_none());
        // Unknown NIDs are skipped; the o2ib net disappears with its last NI.
        let r = t
            .delete_nids(id, &[nid("192.168.0.1@o2ib"), nid("10.9.9.9@tcp")], true)
            .unwrap();
        assert_eq!(r.removed, vec![nid("192.168.0.1@o2ib")]);
        assert_eq!(r.skipped, vec![nid("10.9.9.9@tcp")]);
        assert_eq!(t.peer(id).unwrap().nets().len(), 1);
        assert!(t.ni(nid("192.168.0.1@o2ib")).unwrap().is_detached());
        // Deleting without keeping forgets the NI.
        t.delete_nids(id, &[nid("10.0.0.2@tcp")], false).unwrap();
        assert!(t.ni(nid("10.0.0.2@tcp")).is_none());
        // Empty list: the whole peer.
        let r = t.delete_nids(id, &[], true).unwrap();
        assert!(r.peer_deleted);
        assert!(t.peer(id).is_none());
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn reduce_to_keeps_one_nid() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, "10.0.0.1@tcp");
        t.attach(id, nid("10.0.0.2@tcp")).unwrap();
        let gone = t.reduce_to(id, nid("10.0.0.2@tcp")).unwrap();
        assert_eq!(gone, vec![nid("10.0.0.1@tcp")]);
        assert_eq!(t.peer(id).unwrap().primary_nid(), nid("10.0.0.2@tcp"));
        assert!(t.invariant_violation().is_none());
    }

    #[test]
    fn a_peer_with_two_nids_on_one_net_cannot_be_made_non_mr() {
        // Found by table_invariants_hold: a discovered Multi-Rail peer
        // with two tcp NIDs, then `peer add --non_mr` of its primary.
        let mut t = PeerTable::new();
        let id = t.create_peer(nid("10.0.0.0@tcp")).unwrap();
        t.set_discovered_flags(id, true, false).unwrap();
        t.attach(id, nid("10.0.0.2@tcp")).unwrap();
        let before = t.peers.clone();
        assert!(matches!(
            t.dlc_add(nid("10.0.0.0@tcp"), &[], false),
            Err(PeerError::NotUnique { .. })
        ));
        assert_eq!(before, t.peers);
        assert!(t.invariant_violation().is_none());
        // As Multi-Rail it is accepted.
        assert_eq!(t.dlc_add(nid("10.0.0.0@tcp"), &[], true).unwrap(), id);
        assert!(t.invariant_violation().is_none());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Create(u8),
            Ensure(u8),
            Attach(u8, u8),
            Merge(u8, Vec<(u8, bool)>),
            DlcAdd(u8, Vec<u8>, bool),
            Delete(u8, Vec<u8>, bool),
            DeletePeer(u8),
            SetMr(u8, bool),
            Lock(u8, bool),
            Flags(u8, u8),
        }

        fn nid_of(i: u8) -> Nid {
            // Eight addresses on each of two nets.
            let net = if i.is_multiple_of(2) { "tcp" } else { "o2ib" };
            nid(&format!("10.0.0.{}@{net}", i % 16))
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (any::<u8>(), any::<bool>()).prop_map(|(a, l)| Op::Lock(a, l)),
                (any::<u8>(), any::<u8>()).prop_map(|(a, f)| Op::Flags(a, f)),
                any::<u8>().prop_map(Op::Create),
                any::<u8>().prop_map(Op::Ensure),
                (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Attach(a, b)),
                (
                    any::<u8>(),
                    proptest::collection::vec((any::<u8>(), any::<bool>()), 0..5)
                )
                    .prop_map(|(a, d)| Op::Merge(a, d)),
                (
                    any::<u8>(),
                    proptest::collection::vec(any::<u8>(), 0..4),
                    any::<bool>()
                )
                    .prop_map(|(a, d, m)| Op::DlcAdd(a, d, m)),
                (
                    any::<u8>(),
                    proptest::collection::vec(any::<u8>(), 0..3),
                    any::<bool>()
                )
                    .prop_map(|(a, d, k)| Op::Delete(a, d, k)),
                any::<u8>().prop_map(Op::DeletePeer),
                (any::<u8>(), any::<bool>()).prop_map(|(a, m)| Op::SetMr(a, m)),
            ]
        }

        proptest! {
            #[test]
            fn table_invariants_hold(ops in proptest::collection::vec(op(), 1..40)) {
                let mut t = PeerTable::new();
                for op in ops {
                    let peer_at = |t: &PeerTable, i: u8| t.peer_id_of(nid_of(i));
                    match op {
                        Op::Create(i) => { let _ = t.create_peer(nid_of(i)); }
                        Op::Ensure(i) => { let _ = t.ensure_ni(nid_of(i)); }
                        Op::Attach(p, i) => {
                            if let Some(id) = peer_at(&t, p) { let _ = t.attach(id, nid_of(i)); }
                        }
                        Op::Merge(p, data) => {
                            if let Some(id) = peer_at(&t, p) {
                                let d: Vec<(Nid, NiStatus)> = data.iter()
                                    .map(|&(i, u)| (nid_of(i), if u { NiStatus::Up } else { NiStatus::Down }))
                                    .collect();
                                let mr = t.peer(id).unwrap().is_multi_rail();
                                let before = t.peer(id).unwrap().clone();
                                let table_before = t.clone();
                                let r = t.merge(id, &d, mr).unwrap();
                                // The merged peer always survives.
                                prop_assert!(t.peer(id).is_some());
                                // A locked primary stays, unless an absorbed
                                // peer's was locked first: of all of them,
                                // the first locked is the primary.
                                let first_locked = std::iter::once(&before)
                                    .chain(r.absorbed.iter().filter_map(|a| table_before.peer(*a)))
                                    .filter(|p| p.is_primary_locked())
                                    .min_by_key(|p| p.lock_seq);
                                if let Some(first) = first_locked {
                                    let after = t.peer(id).unwrap();
                                    prop_assert_eq!(after.primary_nid(), first.primary_nid());
                                    prop_assert!(after.is_primary_locked());
                                }
                                // A locked primary with other NIDs is never absorbed.
                                for a in &r.absorbed {
                                    let p = table_before.peer(*a).unwrap();
                                    prop_assert!(!(p.is_primary_locked() && p.ni_count() > 1));
                                }
                                if !mr || before.is_configured() {
                                    prop_assert_eq!(t.peer(id).unwrap().ni_count(), before.ni_count());
                                }
                                for a in r.absorbed { prop_assert!(t.peer(a).is_none()); }
                            }
                        }
                        Op::DlcAdd(p, nids, mr) => {
                            let nids: Vec<Nid> = nids.into_iter().map(nid_of).collect();
                            let before = t.clone();
                            if t.dlc_add(nid_of(p), &nids, mr).is_err() {
                                // Refused: nothing changed.
                                prop_assert_eq!(before.peers.clone(), t.peers.clone());
                            }
                        }
                        Op::Delete(p, nids, keep) => {
                            if let Some(id) = peer_at(&t, p) {
                                let nids: Vec<Nid> = nids.into_iter().map(nid_of).collect();
                                let before = t.peer(id).unwrap().clone();
                                let _ = t.delete_nids(id, &nids, keep);
                                // A locked primary outlives any delete.
                                if before.is_primary_locked() {
                                    let after = t.peer(id);
                                    prop_assert!(after.is_some_and(|p| p.primary_nid() == before.primary_nid()));
                                }
                            }
                        }
                        Op::Lock(p, l) => {
                            if let Some(id) = peer_at(&t, p) { t.set_primary_locked(id, l).unwrap(); }
                        }
                        Op::SetMr(p, mr) => {
                            if let Some(id) = peer_at(&t, p) { let _ = t.set_discovered_flags(id, mr, false); }
                        }
                        Op::Flags(p, f) => {
                            if let Some(id) = peer_at(&t, p) {
                                let flags = PeerFlags {
                                    multi_rail: f & 1 != 0,
                                    configured: f & 2 != 0,
                                    lock_primary: f & 4 != 0,
                                    bad_config: f & 8 != 0,
                                };
                                let before = t.clone();
                                if t.set_flags(id, flags).is_err() {
                                    prop_assert_eq!(before.peers.clone(), t.peers.clone());
                                } else {
                                    let after = t.peer(id).unwrap();
                                    prop_assert_eq!(after.is_multi_rail(), flags.multi_rail);
                                    prop_assert_eq!(after.is_configured(), flags.configured);
                                    prop_assert_eq!(after.is_primary_locked(), flags.lock_primary);
                                }
                            }
                        }
                        Op::DeletePeer(p) => {
                            if let Some(id) = peer_at(&t, p) { t.delete_peer(id).unwrap(); }
                        }
                    }
                    prop_assert_eq!(t.invariant_violation(), None);
                }
            }
        }
    }
}
