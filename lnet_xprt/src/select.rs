//! Multi-Rail pathway selection (`lnet_select_pathway`, lnet.md section 4).
//!
//! For each message the node asks a [`Selector`] which local NI to send from
//! and which peer NI (or gateway) to send to. The choice follows Lustre's
//! comparison chains, first difference wins:
//!
//! - **local net** (Multi-Rail requests): peer-net health higher → peer-net
//!   priority lower → local-net health higher → local-net priority lower →
//!   peer net less recently used → local net less recently used;
//! - **local NI**: not fatal → health higher → priority lower → NUMA distance
//!   lower (distances below `numa_range` count as equal) → tx credits higher
//!   → less recently used;
//! - **peer NI**: health higher → priority lower → preferred by the chosen
//!   local NI → tx credits higher → less recently used.
//!
//! Health dominates; credits only break ties between equally healthy
//! interfaces; round robin breaks the remaining ties, which spreads traffic
//! over all equal rails.
//!
//! Special cases: a **non-Multi-Rail** peer always gets the NID it was sent
//! to, from one consistent local NI (the first one chosen is remembered);
//! with a **source NI given** (responses, and resends of one RPC) the message
//! goes from exactly that NI to exactly the given NID, so **replies go back
//! the way the request came**; a destination on a net we have no NI on goes
//! through a gateway chosen by [`RouteTable::select`].
//!
//! The selector owns only the round-robin stamps and the non-Multi-Rail
//! preferences. Everything else (health, credits, priorities) is read
//! through [`PathStats`], which the node implements over its health monitor
//! and credit queues.

use std::collections::BTreeMap;

use crate::health::Health;
use crate::ids::{Net, Nid};
use crate::nidmap::NidMap;
use crate::peer::{Peer, PeerId};
use crate::route::{GatewayRank, RouteQuery, RouteTable};

const TARGET: &str = "colibri_lnet::select";

/// Lowest selection priority (`LNET_MAX_SELECTION_PRIORITY`); 0 is best.
pub const DEFAULT_PRIORITY: u32 = u32::MAX;

/// Selection parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectConfig {
    /// `lnet_numa_range` (0): NUMA distances below this count as equal.
    pub numa_range: u32,
}

/// What selection needs to know about one of the node's NIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalNiInfo {
    /// The NI's NID.
    pub nid: Nid,
    /// Its health.
    pub health: Health,
    /// Its selection priority (0 best).
    pub priority: u32,
    /// NUMA distance from the message's memory to the NI's device.
    pub distance: u32,
    /// Available tx credits (negative: messages are queued).
    pub tx_credits: i32,
    /// The LND reported a fatal error on it.
    pub fatal: bool,
}

impl LocalNiInfo {
    /// A healthy NI with default priority, distance 0 and no credits data.
    #[must_use]
    pub const fn new(nid: Nid) -> Self {
        Self {
            nid,
            health: Health::MAX,
            priority: DEFAULT_PRIORITY,
            distance: 0,
            tx_credits: 0,
            fatal: false,
        }
    }
}

/// What selection needs to know about one peer NI (or gateway NI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerNiInfo {
    /// Its health.
    pub health: Health,
    /// Its selection priority (0 best).
    pub priority: u32,
    /// Available tx credits.
    pub tx_credits: i32,
    /// Bytes queued towards it (used to rank gateways).
    pub queued_bytes: u64,
}

impl Default for PeerNiInfo {
    fn default() -> Self {
        Self {
            health: Health::MAX,
            priority: DEFAULT_PRIORITY,
            tx_credits: 0,
            queued_bytes: 0,
        }
    }
}

/// Live facts selection reads; the node implements this over its health
/// monitor, credit queues and (optional) priority rules. A closure
/// `Fn(Nid) -> PeerNiInfo` implements it with default net priorities.
pub trait PathStats {
    /// Health, priority, credits and queued bytes of a peer NI.
    fn peer_ni(&self, nid: Nid) -> PeerNiInfo;

    /// Selection priority of a peer's net (0 best).
    fn peer_net_priority(&self, peer: &Peer, net: Net) -> u32 {
        let _ = (peer, net);
        DEFAULT_PRIORITY
    }

    /// Selection priority of one of our nets (0 best).
    fn local_net_priority(&self, net: Net) -> u32 {
        let _ = net;
        DEFAULT_PRIORITY
    }

    /// Whether peer NI `peer_ni` prefers our NI `local` (a UDSP NID pair
    /// rule): among equally healthy peer NIs of equal priority, one that
    /// prefers the chosen local NI wins.
    fn prefers_local(&self, peer_ni: Nid, local: Nid) -> bool {
        let _ = (peer_ni, local);
        false
    }

    /// Whether messages for peer NI `peer_ni` prefer gateway `gateway` (a
    /// UDSP router rule): preferred live gateways are chosen first.
    fn prefers_gateway(&self, peer_ni: Nid, gateway: Nid) -> bool {
        let _ = (peer_ni, gateway);
        false
    }
}

impl<F: Fn(Nid) -> PeerNiInfo> PathStats for F {
    fn peer_ni(&self, nid: Nid) -> PeerNiInfo {
        self(nid)
    }
}

/// One message to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRequest {
    /// The NID the message is addressed to.
    pub dst: Nid,
    /// The local NI it must leave from, if fixed (responses, resends).
    pub src: Option<Nid>,
    /// An ACK or REPLY.
    pub response: bool,
    /// For responses: the gateway the request came through (`msg_from`).
    pub rtr: Option<Nid>,
    /// A recovery ping: exactly this NID, as for a non-Multi-Rail peer.
    pub recovery: bool,
    /// Traffic on the reserved portal (ping, push): ignores the non-MR
    /// preferred source NI.
    pub reserved_portal: bool,
}

impl SendRequest {
    /// A request (PUT or GET) to `dst` from any NI.
    #[must_use]
    pub const fn to(dst: Nid) -> Self {
        Self {
            dst,
            src: None,
            response: false,
            rtr: None,
            recovery: false,
            reserved_portal: false,
        }
    }

    /// A response (ACK or REPLY) to `dst` from the NI that received the
    /// request, back through gateway `rtr` if it was routed.
    #[must_use]
    pub const fn response(dst: Nid, src: Nid, rtr: Option<Nid>) -> Self {
        Self {
            dst,
            src: Some(src),
            response: true,
            rtr,
            recovery: false,
            reserved_portal: false,
        }
    }
}

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pathway {
    /// To ourselves through the loopback LND (no credits).
    Loopback,
    /// Straight to a peer NI on a local net.
    Direct {
        /// Local NI to send from (header `src_nid`).
        local: Nid,
        /// Peer NI to send to (header `dest_nid`).
        peer_ni: Nid,
    },
    /// Through a gateway.
    Routed {
        /// Local NI to send from.
        local: Nid,
        /// Next hop.
        gateway: Nid,
        /// Final destination NID (header `dest_nid`).
        peer_ni: Nid,
    },
}

/// Why no pathway exists.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// The requested source NID is not one of our NIs.
    #[error("source {0} is not a local NI")]
    NotLocalNi(Nid),
    /// No local NI on the net the message must leave on.
    #[error("no local NI on net {0}")]
    NoLocalNi(Net),
    /// No live route to a remote net (`LOCAL_NO_ROUTE` / `-EHOSTUNREACH`).
    #[error("no route to net {0}")]
    NoRoute(Net),
    /// The peer has no NI (it was deleted).
    #[error("peer has no usable NI")]
    NoPeerNi,
}

/// The Multi-Rail selector of one node.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    config: SelectConfig,
    clock: u64,
    local_net_seq: BTreeMap<Net, u64>,
    local_ni_seq: NidMap<u64>,
    peer_net_seq: BTreeMap<(PeerId, Net), u64>,
    peer_ni_seq: NidMap<u64>,
    non_mr_pref: NidMap<Nid>,
    /// The local nets of the send being chosen (kept for its capacity).
    nets: Vec<Net>,
}

fn max_health_of(nis: impl Iterator<Item = Health>) -> Health {
    nis.max().unwrap_or(Health::ZERO)
}

impl Selector {
    /// A selector with no history.
    #[must_use]
    pub fn new(config: SelectConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The local NI remembered for non-Multi-Rail peer NI `peer_ni`.
    #[must_use]
    pub fn preferred_source(&self, peer_ni: Nid) -> Option<Nid> {
        self.non_mr_pref.get(&peer_ni).copied()
    }

    /// Forgets the non-Multi-Rail preference of `peer_ni` (peer NI deleted).
    pub fn forget_peer_ni(&mut self, peer_ni: Nid) {
        self.non_mr_pref.remove(&peer_ni);
        self.peer_ni_seq.remove(&peer_ni);
    }

    fn stamp(&mut self, local: Nid, peer: Option<(PeerId, Net)>, peer_ni: Option<Nid>) {
        self.clock += 1;
        let c = self.clock;
        self.local_net_seq.insert(local.net(), c);
        self.local_ni_seq.insert(local, c);
        if let Some(k) = peer {
            self.peer_net_seq.insert(k, c);
        }
        if let Some(n) = peer_ni {
            self.peer_ni_seq.insert(n, c);
        }
    }

    /// The best of `local`'s NIs on `net` (`lnet_get_best_ni`).
    fn best_local_ni(&self, local: &[LocalNiInfo], net: Net) -> Option<Nid> {
        let range = self.config.numa_range;
        local
            .iter()
            .filter(|ni| ni.nid.net() == net)
            .min_by_key(|ni| {
                (
                    ni.fatal,
                    std::cmp::Reverse(ni.health),
                    ni.priority,
                    ni.distance.max(range),
                    std::cmp::Reverse(ni.tx_credits),
                    self.local_ni_seq.get(&ni.nid).copied().unwrap_or(0),
                )
            })
            .map(|ni| ni.nid)
    }

    /// The best peer NI among `nids` given the chosen local NI
    /// (`lnet_select_peer_ni`).
    fn best_peer_ni(
        &self,
        nids: &[Nid],
        local: Option<Nid>,
        stats: &impl PathStats,
    ) -> Option<Nid> {
        nids.iter().copied().min_by_key(|&n| {
            let s = stats.peer_ni(n);
            let preferred = local.is_some_and(|l| {
                self.non_mr_pref.get(&n).copied() == Some(l) || stats.prefers_local(n, l)
            });
            (
                std::cmp::Reverse(s.health),
                s.priority,
                !preferred,
                std::cmp::Reverse(s.tx_credits),
                self.peer_ni_seq.get(&n).copied().unwrap_or(0),
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        routes: &mut RouteTable,
        peer_ni: Nid,
        net: Net,
        src_net: Option<Net>,
        rtr: Option<Nid>,
        local_nets: &[Net],
        stats: &impl PathStats,
    ) -> Result<Nid, SelectError> {
        let query = RouteQuery {
            src_net,
            preferred_gateway: rtr,
            usable_nets: local_nets,
        };
        routes
            .select(net, &query, |gw| {
                let s = stats.peer_ni(gw);
                GatewayRank {
                    health: s.health,
                    queued_bytes: s.queued_bytes,
                    tx_credits: s.tx_credits,
                    preferred: stats.prefers_gateway(peer_ni, gw),
                }
            })
            .ok_or(SelectError::NoRoute(net))
    }

    /// Chooses the pathway for `req`.
    ///
    /// `peer` is the destination's peer (from the peer table; `None` for a
    /// NID no peer owns, treated as non-Multi-Rail), `local` the node's NIs
    /// (loopback excluded), `routes` the routes table.
    ///
    /// # Errors
    /// [`SelectError`] when no local NI, peer NI or route fits.
    pub fn select(
        &mut self,
        req: &SendRequest,
        peer: Option<&Peer>,
        local: &[LocalNiInfo],
        stats: &impl PathStats,
        routes: &mut RouteTable,
    ) -> Result<Pathway, SelectError> {
        if req.dst.is_lo() {
            return Ok(Pathway::Loopback);
        }
        // Built in place: a send allocates nothing for it.
        let mut local_nets = std::mem::take(&mut self.nets);
        local_nets.clear();
        local_nets.extend(local.iter().map(|ni| ni.nid.net()));
        local_nets.sort_unstable();
        local_nets.dedup();
        let r = self.select_with(req, peer, local, &local_nets, stats, routes);
        self.nets = local_nets;
        r
    }

    fn select_with(
        &mut self,
        req: &SendRequest,
        peer: Option<&Peer>,
        local: &[LocalNiInfo],
        local_nets: &[Net],
        stats: &impl PathStats,
        routes: &mut RouteTable,
    ) -> Result<Pathway, SelectError> {
        let multi_rail = peer.is_some_and(Peer::is_multi_rail) && !req.recovery;
        if let (true, Some(p)) = (multi_rail, peer) {
            // A peer that became Multi-Rail drops its sticky source NI.
            for nid in p.nids() {
                self.non_mr_pref.remove(&nid);
            }
        }
        let dst_net = req.dst.net();

        // Source given: that NI, exactly the given NID (or a route from it).
        if let Some(src) = req.src {
            if !local.iter().any(|ni| ni.nid == src) {
                return Err(SelectError::NotLocalNi(src));
            }
            return if src.net() == dst_net {
                self.stamp(src, None, Some(req.dst));
                Ok(Pathway::Direct {
                    local: src,
                    peer_ni: req.dst,
                })
            } else {
                let gateway = self.route(
                    routes,
                    req.dst,
                    dst_net,
                    Some(src.net()),
                    req.rtr,
                    local_nets,
                    stats,
                )?;
                self.stamp(src, None, Some(gateway));
                Ok(Pathway::Routed {
                    local: src,
                    gateway,
                    peer_ni: req.dst,
                })
            };
        }

        if !multi_rail || req.response {
            return self.select_exact(req, local, local_nets, multi_rail, stats, routes);
        }
        let Some(peer) = peer else {
            return Err(SelectError::NoPeerNi);
        };
        self.select_multi_rail(req, peer, local, local_nets, stats, routes)
    }

    /// Non-Multi-Rail destinations and responses: the given NID, from the
    /// best (or, for non-MR requests, the remembered) local NI.
    fn select_exact(
        &mut self,
        req: &SendRequest,
        local: &[LocalNiInfo],
        local_nets: &[Net],
        multi_rail: bool,
        stats: &impl PathStats,
        routes: &mut RouteTable,
    ) -> Result<Pathway, SelectError> {
        let sticky = !multi_rail && !req.response && !req.reserved_portal && !req.recovery;
        let remembered = self
            .non_mr_pref
            .get(&req.dst)
            .copied()
            .filter(|n| local.iter().any(|ni| ni.nid == *n));
        let dst_net = req.dst.net();
        if local_nets.contains(&dst_net) {
            let chosen = match remembered.filter(|n| sticky && n.net() == dst_net) {
                Some(n) => n,
                None => self
                    .best_local_ni(local, dst_net)
                    .ok_or(SelectError::NoLocalNi(dst_net))?,
            };
            if sticky && !self.non_mr_pref.contains_key(&req.dst) {
                tracing::debug!(target: TARGET, peer_ni = %req.dst, local = %chosen,
                    "non-MR peer: source NI fixed");
                self.non_mr_pref.insert(req.dst, chosen);
            }
            self.stamp(chosen, None, Some(req.dst));
            return Ok(Pathway::Direct {
                local: chosen,
                peer_ni: req.dst,
            });
        }
        let src_net = remembered.filter(|_| sticky).map(Nid::net);
        let gateway = self.route(
            routes, req.dst, dst_net, src_net, req.rtr, local_nets, stats,
        )?;
        let chosen = match remembered.filter(|n| sticky && n.net() == gateway.net()) {
            Some(n) => n,
            None => self
                .best_local_ni(local, gateway.net())
                .ok_or(SelectError::NoLocalNi(gateway.net()))?,
        };
        if sticky && !self.non_mr_pref.contains_key(&req.dst) {
            self.non_mr_pref.insert(req.dst, chosen);
        }
        self.stamp(chosen, None, Some(gateway));
        Ok(Pathway::Routed {
            local: chosen,
            gateway,
            peer_ni: req.dst,
        })
    }

    /// Multi-Rail requests: best local net among the peer's nets, best local
    /// NI on it, best peer NI on it; or, if the peer has no NI on a local
    /// net, best reachable peer net and peer NI through the best route.
    fn select_multi_rail(
        &mut self,
        req: &SendRequest,
        peer: &Peer,
        local: &[LocalNiInfo],
        local_nets: &[Net],
        stats: &impl PathStats,
        routes: &mut RouteTable,
    ) -> Result<Pathway, SelectError> {
        let pid = peer.id();
        let peer_net_health =
            |nids: &[Nid]| max_health_of(nids.iter().map(|&n| stats.peer_ni(n).health));
        let local_net_health = |net: Net| {
            max_health_of(
                local
                    .iter()
                    .filter(|ni| ni.nid.net() == net && !ni.fatal)
                    .map(|ni| ni.health),
            )
        };
        let best_net = peer
            .nets()
            .iter()
            .filter(|pn| local_nets.contains(&pn.net()))
            .min_by_key(|pn| {
                let net = pn.net();
                (
                    std::cmp::Reverse(peer_net_health(pn.nids())),
                    stats.peer_net_priority(peer, net),
                    std::cmp::Reverse(local_net_health(net)),
                    stats.local_net_priority(net),
                    self.peer_net_seq.get(&(pid, net)).copied().unwrap_or(0),
                    self.local_net_seq.get(&net).copied().unwrap_or(0),
                )
            });
        if let Some(pn) = best_net {
            let net = pn.net();
            let local_ni = self
                .best_local_ni(local, net)
                .ok_or(SelectError::NoLocalNi(net))?;
            let peer_ni = self
                .best_peer_ni(pn.nids(), Some(local_ni), stats)
                .ok_or(SelectError::NoPeerNi)?;
            self.stamp(local_ni, Some((pid, net)), Some(peer_ni));
            tracing::trace!(target: TARGET, dst = %req.dst, %local_ni, %peer_ni, "MR pathway");
            return Ok(Pathway::Direct {
                local: local_ni,
                peer_ni,
            });
        }
        // Remote peer: pick a reachable peer net, then a route to it.
        let remote = peer
            .nets()
            .iter()
            .filter(|pn| routes.reachable(pn.net()))
            .min_by_key(|pn| {
                (
                    std::cmp::Reverse(peer_net_health(pn.nids())),
                    stats.peer_net_priority(peer, pn.net()),
                    self.peer_net_seq
                        .get(&(pid, pn.net()))
                        .copied()
                        .unwrap_or(0),
                )
            })
            .ok_or(SelectError::NoRoute(req.dst.net()))?;
        let net = remote.net();
        let peer_ni = self
            .best_peer_ni(remote.nids(), None, stats)
            .ok_or(SelectError::NoPeerNi)?;
        let gateway = self.route(routes, peer_ni, net, None, req.rtr, local_nets, stats)?;
        let local_ni = self
            .best_local_ni(local, gateway.net())
            .ok_or(SelectError::NoLocalNi(gateway.net()))?;
        self.stamp(local_ni, Some((pid, net)), Some(peer_ni));
        Ok(Pathway::Routed {
            local: local_ni,
            gateway,
            peer_ni,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PeerTable;
    use crate::route::RouteConfig;
    use crate::time::Time;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn h(v: u32) -> Health {
        Health::new(v).unwrap()
    }

    const L_TCP: &str = "10.0.0.1@tcp";
    const L_TCP_B: &str = "10.0.0.11@tcp";
    const L_IB: &str = "192.168.0.1@o2ib";
    const P_TCP: &str = "10.0.0.2@tcp";
    const P_TCP_B: &str = "10.0.0.12@tcp";
    const P_IB: &str = "192.168.0.2@o2ib";

    fn locals(names: &[&str]) -> Vec<LocalNiInfo> {
        names.iter().map(|s| LocalNiInfo::new(nid(s))).collect()
    }

    fn flat(_: Nid) -> PeerNiInfo {
        PeerNiInfo::default()
    }

    fn no_routes() -> RouteTable {
        RouteTable::new(RouteConfig::default(), 0)
    }

    /// A Multi-Rail peer with the given NIDs (first is primary).
    fn mr_peer(t: &mut PeerTable, nids: &[&str]) -> PeerId {
        let id = t.create_peer(nid(nids[0])).unwrap();
        t.set_discovered_flags(id, true, false).unwrap();
        for n in &nids[1..] {
            t.attach(id, nid(n)).unwrap();
        }
        id
    }

    fn direct(p: Pathway) -> (Nid, Nid) {
        match p {
            Pathway::Direct { local, peer_ni } => (local, peer_ni),
            other => panic!("expected direct, got {other:?}"),
        }
    }

    #[test]
    fn loopback() {
        let mut s = Selector::default();
        let p = s
            .select(
                &SendRequest::to(Nid::LO_0),
                None,
                &[],
                &flat,
                &mut no_routes(),
            )
            .unwrap();
        assert_eq!(p, Pathway::Loopback);
    }

    #[test]
    fn mr_traffic_spreads_over_both_nets_round_robin() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP, P_IB]);
        let mut s = Selector::default();
        let local = locals(&[L_TCP, L_IB]);
        let mut r = no_routes();
        let picks: Vec<(Nid, Nid)> = (0..4)
            .map(|_| {
                direct(
                    s.select(
                        &SendRequest::to(nid(P_TCP)),
                        t.peer(id),
                        &local,
                        &flat,
                        &mut r,
                    )
                    .unwrap(),
                )
            })
            .collect();
        assert_eq!(picks[0].0.net(), picks[0].1.net());
        assert_ne!(picks[0].0.net(), picks[1].0.net(), "alternates nets");
        assert_eq!(picks[0], picks[2]);
        assert_eq!(picks[1], picks[3]);
    }

    #[test]
    fn peer_ni_health_beats_credits_beats_round_robin() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP, P_TCP_B]);
        let local = locals(&[L_TCP]);
        let mut r = no_routes();
        let req = SendRequest::to(nid(P_TCP));
        // Health first, even against many more credits.
        let mut s = Selector::default();
        let stats = |n: Nid| PeerNiInfo {
            health: if n == nid(P_TCP) { h(900) } else { Health::MAX },
            tx_credits: if n == nid(P_TCP) { 8 } else { -3 },
            ..PeerNiInfo::default()
        };
        for _ in 0..3 {
            let (_, p) = direct(s.select(&req, t.peer(id), &local, &stats, &mut r).unwrap());
            assert_eq!(p, nid(P_TCP_B));
        }
        // Equal health: credits.
        let stats = |n: Nid| PeerNiInfo {
            tx_credits: if n == nid(P_TCP) { 8 } else { 2 },
            ..PeerNiInfo::default()
        };
        for _ in 0..3 {
            let (_, p) = direct(s.select(&req, t.peer(id), &local, &stats, &mut r).unwrap());
            assert_eq!(p, nid(P_TCP));
        }
        // Equal priority 0 vs default: priority before credits.
        let stats = |n: Nid| PeerNiInfo {
            priority: if n == nid(P_TCP_B) {
                0
            } else {
                DEFAULT_PRIORITY
            },
            tx_credits: if n == nid(P_TCP) { 8 } else { 2 },
            ..PeerNiInfo::default()
        };
        let (_, p) = direct(s.select(&req, t.peer(id), &local, &stats, &mut r).unwrap());
        assert_eq!(p, nid(P_TCP_B));
        // All equal: round robin.
        let a = direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).1;
        let b = direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).1;
        assert_ne!(a, b);
    }

    #[test]
    fn local_ni_health_beats_credits_beats_round_robin() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP]);
        let mut r = no_routes();
        let req = SendRequest::to(nid(P_TCP));
        let mut s = Selector::default();
        let mut local = locals(&[L_TCP, L_TCP_B]);
        local[0].health = h(500);
        local[0].tx_credits = 100;
        assert_eq!(
            direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
            nid(L_TCP_B)
        );
        local[0].health = Health::MAX;
        local[1].tx_credits = 101;
        assert_eq!(
            direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
            nid(L_TCP_B)
        );
        // A fatal NI loses even with better health.
        local[1].tx_credits = 100;
        local[0].fatal = true;
        for _ in 0..2 {
            assert_eq!(
                direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
                nid(L_TCP_B)
            );
        }
        // All equal: round robin.
        local[0].fatal = false;
        let a = direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0;
        let b = direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0;
        assert_ne!(a, b);
    }

    #[test]
    fn numa_distance_and_range() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP]);
        let mut r = no_routes();
        let req = SendRequest::to(nid(P_TCP));
        let mut local = locals(&[L_TCP, L_TCP_B]);
        local[0].distance = 20;
        local[1].distance = 10;
        local[0].tx_credits = 50;
        let mut s = Selector::default();
        assert_eq!(
            direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
            nid(L_TCP_B),
            "closer NI wins over credits"
        );
        let mut s = Selector::new(SelectConfig { numa_range: 30 });
        assert_eq!(
            direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
            nid(L_TCP),
            "within the range distances are equal: credits decide"
        );
    }

    #[test]
    fn unhealthy_peer_net_moves_traffic_to_the_other_net() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP, P_IB]);
        let local = locals(&[L_TCP, L_IB]);
        let mut r = no_routes();
        let mut s = Selector::default();
        let stats = |n: Nid| PeerNiInfo {
            health: if n == nid(P_IB) { h(800) } else { Health::MAX },
            ..PeerNiInfo::default()
        };
        for _ in 0..4 {
            let (l, p) = direct(
                s.select(
                    &SendRequest::to(nid(P_TCP)),
                    t.peer(id),
                    &local,
                    &stats,
                    &mut r,
                )
                .unwrap(),
            );
            assert_eq!((l, p), (nid(L_TCP), nid(P_TCP)));
        }
        // Local net health counts after peer-net health.
        let mut local = local;
        local[0].health = h(100);
        let (l, _) = direct(
            s.select(
                &SendRequest::to(nid(P_TCP)),
                t.peer(id),
                &local,
                &flat,
                &mut r,
            )
            .unwrap(),
        );
        assert_eq!(l, nid(L_IB));
    }

    #[test]
    fn non_mr_peer_keeps_one_source_ni() {
        let mut t = PeerTable::new();
        let id = t.create_peer(nid(P_TCP)).unwrap();
        let mut local = locals(&[L_TCP, L_TCP_B]);
        let mut r = no_routes();
        let mut s = Selector::default();
        let req = SendRequest::to(nid(P_TCP));
        let (first, p) = direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap());
        assert_eq!(p, nid(P_TCP));
        assert_eq!(s.preferred_source(nid(P_TCP)), Some(first));
        // Even when the other NI looks better, the same source is used.
        let other = if first == nid(L_TCP) { 1 } else { 0 };
        local[other].tx_credits = 1000;
        for _ in 0..3 {
            assert_eq!(
                direct(s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap()).0,
                first
            );
        }
        // Reserved-portal traffic ignores the preference.
        let mut ping = req;
        ping.reserved_portal = true;
        assert_eq!(
            direct(s.select(&ping, t.peer(id), &local, &flat, &mut r).unwrap()).0,
            local[other].nid
        );
        // The peer becoming Multi-Rail clears it.
        t.set_discovered_flags(id, true, false).unwrap();
        s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap();
        assert_eq!(s.preferred_source(nid(P_TCP)), None);
    }

    #[test]
    fn responses_go_back_the_way_the_request_came() {
        let mut t = PeerTable::new();
        let id = mr_peer(&mut t, &[P_TCP, P_TCP_B, P_IB]);
        let local = locals(&[L_TCP, L_TCP_B, L_IB]);
        let mut r = no_routes();
        let mut s = Selector::default();
        for _ in 0..3 {
            let req = SendRequest::response(nid(P_TCP_B), nid(L_TCP), None);
            assert_eq!(
                s.select(&req, t.peer(id), &local, &flat, &mut r).unwrap(),
                Pathway::Direct {
                    local: nid(L_TCP),
                    peer_ni: nid(P_TCP_B)
                }
            );
        }
        // No preference recorded for responses, even to a non-MR peer.
        let plain = t.create_peer(nid("10.0.0.50@tcp")).unwrap();
        let req = SendRequest {
            src: None,
            ..SendRequest::response(nid("10.0.0.50@tcp"), nid(L_TCP), None)
        };
        s.select(&req, t.peer(plain), &local, &flat, &mut r)
            .unwrap();
        assert_eq!(s.preferred_source(nid("10.0.0.50@tcp")), None);
        // A source that is not ours is refused.
        let bad = SendRequest::response(nid(P_TCP), nid("10.9.9.9@tcp"), None);
        assert_eq!(
            s.select(&bad, t.peer(id), &local, &flat, &mut r),
            Err(SelectError::NotLocalNi(nid("10.9.9.9@tcp")))
        );
    }

    #[test]
    fn remote_destinations_go_through_a_gateway() {
        let mut t = PeerTable::new();
        let local = locals(&[L_TCP]);
        let mut r = no_routes();
        let gw = nid("10.0.0.254@tcp");
        let o2ib5: Net = "o2ib5".parse().unwrap();
        r.add_route(Time::ZERO, o2ib5, gw, None, 0, &[nid(L_TCP).net()])
            .unwrap();
        let far = nid("172.16.0.9@o2ib5");
        let mut s = Selector::default();
        // A plain peer.
        let plain = t.create_peer(far).unwrap();
        assert_eq!(
            s.select(&SendRequest::to(far), t.peer(plain), &local, &flat, &mut r)
                .unwrap(),
            Pathway::Routed {
                local: nid(L_TCP),
                gateway: gw,
                peer_ni: far
            }
        );
        // A Multi-Rail peer only on remote nets: reachable net chosen.
        let mr = mr_peer(&mut t, &["172.16.0.10@o2ib5", "172.17.0.10@o2ib6"]);
        let p = s
            .select(
                &SendRequest::to(nid("172.17.0.10@o2ib6")),
                t.peer(mr),
                &local,
                &flat,
                &mut r,
            )
            .unwrap();
        assert_eq!(
            p,
            Pathway::Routed {
                local: nid(L_TCP),
                gateway: gw,
                peer_ni: nid("172.16.0.10@o2ib5")
            }
        );
        // Unreachable.
        let lost = nid("1.2.3.4@o2ib9");
        assert_eq!(
            s.select(&SendRequest::to(lost), None, &local, &flat, &mut r),
            Err(SelectError::NoRoute(lost.net()))
        );
        // A routed response uses the router it came through.
        let gw2 = nid("10.0.0.253@tcp");
        r.add_route(Time::ZERO, o2ib5, gw2, None, 0, &[nid(L_TCP).net()])
            .unwrap();
        for _ in 0..3 {
            let req = SendRequest::response(far, nid(L_TCP), Some(gw2));
            assert!(matches!(
                s.select(&req, t.peer(plain), &local, &flat, &mut r).unwrap(),
                Pathway::Routed { gateway, .. } if gateway == gw2
            ));
        }
    }

    #[test]
    fn no_local_ni_on_net() {
        let mut s = Selector::default();
        let mut r = no_routes();
        let local = locals(&[L_TCP]);
        let req = SendRequest::response(nid(P_IB), nid(L_TCP), None);
        // Source on tcp, destination on o2ib with no route.
        assert_eq!(
            s.select(&req, None, &local, &flat, &mut r),
            Err(SelectError::NoRoute(nid(P_IB).net()))
        );
    }
}
