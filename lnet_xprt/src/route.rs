//! Routes to remote nets, route selection and gateway aliveness (Lustre's routing design,
//! lnet.md section 6).
//!
//! A [`Route`] says "net X is reachable through gateway G (a NID on one of
//! our nets), `hops` away, with priority P". [`RouteTable`] holds them,
//! validates additions as Lustre does, picks a route for a message
//! ([`RouteTable::select`]: priority, then hops, then the gateway's health,
//! queued bytes and credits, then round robin) and tracks whether each route
//! is alive from the gateway's answers to **router pings**.
//!
//! The router checker is a timer like every other in this crate: ask
//! [`RouteTable::poll_timeout`], call [`RouteTable::handle_timeout`], send the
//! returned [`RouterPing`]s (a GET on portal 0, as a discovery ping) and feed
//! the replies to [`RouteTable::on_router_ping_reply`] (or failures to
//! [`RouteTable::on_router_ping_failed`]).
//!
//! The table also carries the node's own "routing enabled" switch
//! (`lnetctl set routing`): a node forwards messages for others only when it
//! is on.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::health::Health;
use crate::ids::{Net, Nid};
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::{NiStatus, PingFeatures, PingInfo};

const TARGET: &str = "colibri_lnet::route";

/// Route parameters (lnet.md 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// Router checker period (`alive_router_check_interval`, 60 s); zero
    /// switches the checker off (routes then keep their last state).
    pub check_interval: Duration,
    /// How long to wait for a router ping reply (`router_ping_timeout`, 50 s).
    pub router_ping_timeout: Duration,
    /// `avoid_asym_router_failure` (on): a single-hop route is alive only if
    /// the gateway's NI on the remote net is up too.
    pub avoid_asym_router_failure: bool,
    /// `check_routers_before_use` (off): routes start dead until the first
    /// ping reply instead of alive.
    pub check_routers_before_use: bool,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            check_interval: Duration::from_secs(60),
            router_ping_timeout: Duration::from_secs(50),
            avoid_asym_router_failure: true,
            check_routers_before_use: false,
        }
    }
}

/// Errors of route configuration (`lnet_add_route`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The gateway is `LNET_NID_ANY` or a loopback NID.
    #[error("{0} cannot be a gateway")]
    InvalidGateway(Nid),
    /// Routes to the loopback net or to `ANY` make no sense.
    #[error("cannot route to net {0}")]
    InvalidNet(Net),
    /// The gateway sits on the net it is supposed to lead to.
    #[error("gateway {gateway} is on the target net {net}")]
    GatewayOnTargetNet {
        /// Target net.
        net: Net,
        /// Gateway.
        gateway: Nid,
    },
    /// Hop count outside `1..=255`.
    #[error("hop count {0} is outside 1..=255")]
    BadHops(u32),
    /// The target net is one of ours (`-EEXIST`).
    #[error("net {0} is a local net")]
    NetIsLocal(Net),
    /// No local NI on the gateway's net (`-EHOSTUNREACH`).
    #[error("gateway {0} is not on a local net")]
    GatewayUnreachable(Nid),
    /// The same gateway is already a route to this net (`-EEXIST`).
    #[error("route to {net} via {gateway} already exists")]
    Duplicate {
        /// Target net.
        net: Net,
        /// Gateway.
        gateway: Nid,
    },
    /// No such route.
    #[error("no route to {net} via {gateway}")]
    NotFound {
        /// Target net.
        net: Net,
        /// Gateway.
        gateway: Nid,
    },
}

/// One route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    net: Net,
    gateway: Nid,
    hops: Option<u8>,
    priority: u32,
    alive: bool,
    single_hop: Option<bool>,
    seq: u64,
}

impl Route {
    /// The remote net this route leads to.
    #[must_use]
    pub const fn net(&self) -> Net {
        self.net
    }

    /// The gateway NID (on one of our nets).
    #[must_use]
    pub const fn gateway(&self) -> Nid {
        self.gateway
    }

    /// Configured hop count (`None` = undefined, counted as 1).
    #[must_use]
    pub const fn hops(&self) -> Option<u8> {
        self.hops
    }

    /// Priority (0 is best).
    #[must_use]
    pub const fn priority(&self) -> u32 {
        self.priority
    }

    /// Whether the route is usable.
    #[must_use]
    pub const fn is_alive(&self) -> bool {
        self.alive
    }

    /// Whether the gateway's last ping reply listed a NID on the remote net
    /// (`None` before any reply).
    #[must_use]
    pub const fn single_hop(&self) -> Option<bool> {
        self.single_hop
    }

    fn effective_hops(&self) -> u8 {
        self.hops.unwrap_or(1)
    }
}

/// How a gateway ranks for route selection (its peer NI on our net).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayRank {
    /// Health of the gateway's peer NI.
    pub health: Health,
    /// Bytes queued towards it (`lpni_txqnob`): fewer is better.
    pub queued_bytes: u64,
    /// Its available tx credits: more is better.
    pub tx_credits: i32,
    /// The destination prefers it (a UDSP router rule): chosen before any
    /// other live gateway.
    pub preferred: bool,
}

impl Default for GatewayRank {
    fn default() -> Self {
        Self {
            health: Health::MAX,
            queued_bytes: 0,
            tx_credits: 0,
            preferred: false,
        }
    }
}

/// What a route lookup may use.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteQuery<'a> {
    /// Only gateways on this net (the message's source NI is fixed).
    pub src_net: Option<Net>,
    /// Use this gateway if it is a live route to the net (responses go back
    /// through the router the request came from).
    pub preferred_gateway: Option<Nid>,
    /// Nets on which we have a usable NI; gateways elsewhere are skipped.
    /// Empty means "no restriction".
    pub usable_nets: &'a [Net],
}

/// A router ping to send: a GET on portal 0 with the ping match bits to the
/// gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterPing {
    /// The gateway to ping.
    pub gateway: Nid,
}

#[derive(Clone, Debug)]
struct Gateway {
    alive: bool,
    /// Whether its last ping data (a router ping's reply or a push) said
    /// Multi-Rail with discovery on (`lnet_is_discovery_disabled` of a
    /// discovered gateway).
    discovery: bool,
    routes: usize,
    next_ping: Option<Time>,
    ping_deadline: Option<Time>,
}

/// The routes table of one node, with its router checker.
#[derive(Clone, Debug)]
pub struct RouteTable {
    config: RouteConfig,
    routes: BTreeMap<Net, Vec<Route>>,
    gateways: BTreeMap<Nid, Gateway>,
    /// The earliest `next_ping` or `ping_deadline` of the gateways, kept
    /// by every method that changes one ([`Self::refresh_next_timer`]), so
    /// that [`Self::poll_timeout`], asked after every input of the node,
    /// does not walk the gateways.
    next_timer: Option<Time>,
    rng: Rng,
    seq: u64,
    routing: bool,
}

impl RouteTable {
    /// An empty table. `seed` drives the random insertion position of new
    /// routes (so nodes with the same router list prefer different routers,
    /// deterministically for a given seed). Routing (forwarding) starts off.
    #[must_use]
    pub fn new(config: RouteConfig, seed: u64) -> Self {
        Self {
            config,
            routes: BTreeMap::new(),
            gateways: BTreeMap::new(),
            next_timer: None,
            rng: Rng::new(seed),
            seq: 0,
            routing: false,
        }
    }

    /// The configuration.
    #[must_use]
    pub const fn config(&self) -> &RouteConfig {
        &self.config
    }

    /// Whether this node forwards messages for others.
    #[must_use]
    pub const fn routing_enabled(&self) -> bool {
        self.routing
    }

    /// Changes the router checker's period (`alive_router_check_interval`)
    /// at run time: each gateway's next ping is rescheduled to `now +
    /// interval` (or sooner if it was due sooner); zero stops the checker
    /// (routes keep their last state, pings under way still end).
    pub fn set_check_interval(&mut self, now: Time, interval: Duration) {
        self.config.check_interval = interval;
        for g in self.gateways.values_mut() {
            if interval.is_zero() {
                g.next_ping = None;
            } else {
                let at = now + interval;
                g.next_ping = Some(g.next_ping.map_or(at, |t| t.min(at)));
            }
        }
        self.refresh_next_timer();
    }

    /// Changes `router_ping_timeout` (pings sent from now on).
    pub fn set_router_ping_timeout(&mut self, timeout: Duration) {
        self.config.router_ping_timeout = timeout;
    }

    /// Changes `avoid_asym_router_failure` (applied at each gateway's next
    /// answer).
    pub fn set_avoid_asym_router_failure(&mut self, on: bool) {
        self.config.avoid_asym_router_failure = on;
    }

    /// Changes `check_routers_before_use` (routes added from now on).
    pub fn set_check_routers_before_use(&mut self, on: bool) {
        self.config.check_routers_before_use = on;
    }

    fn refresh_next_timer(&mut self) {
        self.next_timer = self
            .gateways
            .values()
            .flat_map(|g| [g.next_ping, g.ping_deadline])
            .flatten()
            .min();
    }

    /// Switches forwarding on or off (`lnetctl set routing 0|1`). The node's
    /// ping buffer carries `RTE_DISABLED` while it is off.
    pub fn set_routing(&mut self, enabled: bool) {
        self.routing = enabled;
    }

    /// The routes to `net`, in selection-list order.
    #[must_use]
    pub fn routes_to(&self, net: Net) -> &[Route] {
        self.routes.get(&net).map_or(&[], Vec::as_slice)
    }

    /// Every route, net by net.
    pub fn routes(&self) -> impl Iterator<Item = &Route> + '_ {
        self.routes.values().flatten()
    }

    /// Whether `nid` is a gateway of some route.
    #[must_use]
    pub fn is_gateway(&self, nid: Nid) -> bool {
        self.gateways.contains_key(&nid)
    }

    /// Whether the gateway answered its last ping (or has not been asked).
    #[must_use]
    pub fn gateway_alive(&self, nid: Nid) -> Option<bool> {
        self.gateways.get(&nid).map(|g| g.alive)
    }

    /// Whether gateway `nid`'s last ping data said it is Multi-Rail with
    /// discovery on (false before any, or for a NID that is no gateway).
    #[must_use]
    pub fn gateway_does_discovery(&self, nid: Nid) -> bool {
        self.gateways.get(&nid).is_some_and(|g| g.discovery)
    }

    /// Whether some live route leads to `net`.
    #[must_use]
    pub fn reachable(&self, net: Net) -> bool {
        self.routes_to(net).iter().any(|r| r.alive)
    }

    /// Adds a route (`lnetctl route add`), with Lustre's checks. `local_nets`
    /// are the nets the node has NIs on. `hops` `None` means undefined. The
    /// route goes to a random position among the routes to `net`; the gateway
    /// is pinged at once.
    ///
    /// # Errors
    /// See [`RouteError`].
    pub fn add_route(
        &mut self,
        now: Time,
        net: Net,
        gateway: Nid,
        hops: Option<u32>,
        priority: u32,
        local_nets: &[Net],
    ) -> Result<(), RouteError> {
        if gateway.is_any() || gateway.is_lo() {
            return Err(RouteError::InvalidGateway(gateway));
        }
        if net.is_lo() || net == Net::ANY {
            return Err(RouteError::InvalidNet(net));
        }
        if gateway.net() == net {
            return Err(RouteError::GatewayOnTargetNet { net, gateway });
        }
        let hops = match hops {
            None => None,
            Some(h @ 1..=255) => Some(u8::try_from(h).map_err(|_| RouteError::BadHops(h))?),
            Some(h) => return Err(RouteError::BadHops(h)),
        };
        if local_nets.contains(&net) {
            return Err(RouteError::NetIsLocal(net));
        }
        if !local_nets.contains(&gateway.net()) {
            return Err(RouteError::GatewayUnreachable(gateway));
        }
        let list = self.routes.entry(net).or_default();
        if list.iter().any(|r| r.gateway == gateway) {
            return Err(RouteError::Duplicate { net, gateway });
        }
        let pos = usize::try_from(self.rng.below(list.len() as u64 + 1)).unwrap_or(0);
        let alive = !self.config.check_routers_before_use;
        list.insert(
            pos,
            Route {
                net,
                gateway,
                hops,
                priority,
                alive,
                single_hop: None,
                seq: 0,
            },
        );
        let checker = !self.config.check_interval.is_zero();
        let gw = self.gateways.entry(gateway).or_insert(Gateway {
            alive,
            discovery: false,
            routes: 0,
            next_ping: None,
            ping_deadline: None,
        });
        gw.routes += 1;
        if checker && gw.ping_deadline.is_none() {
            gw.next_ping = Some(now);
        }
        self.refresh_next_timer();
        if hops.is_none() && self.config.avoid_asym_router_failure {
            tracing::debug!(target: TARGET, %net, %gateway,
                "route with undefined hops while avoid_asym_router_failure is on");
        }
        tracing::info!(target: TARGET, %net, %gateway, ?hops, priority, "route added");
        Ok(())
    }

    /// Deletes a route (`lnetctl route del`).
    ///
    /// # Errors
    /// [`RouteError::NotFound`].
    pub fn del_route(&mut self, net: Net, gateway: Nid) -> Result<(), RouteError> {
        let list = self
            .routes
            .get_mut(&net)
            .ok_or(RouteError::NotFound { net, gateway })?;
        let pos = list
            .iter()
            .position(|r| r.gateway == gateway)
            .ok_or(RouteError::NotFound { net, gateway })?;
        list.remove(pos);
        if list.is_empty() {
            self.routes.remove(&net);
        }
        if let Some(gw) = self.gateways.get_mut(&gateway) {
            gw.routes -= 1;
            if gw.routes == 0 {
                self.gateways.remove(&gateway);
            }
        }
        self.refresh_next_timer();
        Ok(())
    }

    /// Picks a route to `net` (`lnet_find_route_locked`): among live routes
    /// whose gateway is usable, the preferred gateway if it is one of them,
    /// else gateways the destination prefers first ([`GatewayRank::preferred`],
    /// UDSP router rules), then by priority (lower), hops (fewer; undefined = 1), then the
    /// gateway's [`GatewayRank`] (health higher, queued bytes fewer, credits
    /// more), then least recently used. Returns the gateway NID.
    pub fn select(
        &mut self,
        net: Net,
        query: &RouteQuery<'_>,
        rank: impl Fn(Nid) -> GatewayRank,
    ) -> Option<Nid> {
        let list = self.routes.get_mut(&net)?;
        let usable = |r: &Route| {
            r.alive
                && query.src_net.is_none_or(|n| r.gateway.net() == n)
                && (query.usable_nets.is_empty() || query.usable_nets.contains(&r.gateway.net()))
        };
        let mut best: Option<usize> = None;
        if let Some(pref) = query.preferred_gateway {
            best = list.iter().position(|r| r.gateway == pref && usable(r));
            if best.is_none() {
                tracing::warn!(target: TARGET, %pref, %net,
                    "preferred gateway is not a live route any more; choosing another");
            }
        }
        if best.is_none() {
            for (i, r) in list.iter().enumerate() {
                if !usable(r) {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some(b) => {
                        let cur = &list[b];
                        let (ra, rb) = (rank(r.gateway), rank(cur.gateway));
                        let key = |x: &Route, g: GatewayRank| {
                            (
                                !g.preferred,
                                x.priority,
                                x.effective_hops(),
                                std::cmp::Reverse(g.health),
                                g.queued_bytes,
                                std::cmp::Reverse(g.tx_credits),
                                x.seq,
                            )
                        };
                        key(r, ra) < key(cur, rb)
                    }
                };
                if better {
                    best = Some(i);
                }
            }
        }
        let i = best?;
        self.seq += 1;
        list[i].seq = self.seq;
        Some(list[i].gateway)
    }

    /// When the router checker next has work (a ping due or a ping reply
    /// overdue).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        debug_assert_eq!(
            self.next_timer,
            self.gateways
                .values()
                .flat_map(|g| [g.next_ping, g.ping_deadline])
                .flatten()
                .min(),
            "the router checker's next timer is stale"
        );
        self.next_timer
    }

    /// Router checker: overdue ping replies count as failures (the gateway
    /// and its routes go dead); gateways whose ping is due are pinged (one
    /// outstanding ping each) and scheduled again after `check_interval`.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<RouterPing> {
        let overdue: Vec<Nid> = self
            .gateways
            .iter()
            .filter(|(_, g)| g.ping_deadline.is_some_and(|d| d <= now))
            .map(|(&n, _)| n)
            .collect();
        for gw in overdue {
            tracing::warn!(target: TARGET, %gw, "router ping timed out");
            self.on_router_ping_failed(now, gw);
        }
        let mut out = Vec::new();
        let interval = self.config.check_interval;
        let timeout = self.config.router_ping_timeout;
        for (&gateway, g) in &mut self.gateways {
            if g.ping_deadline.is_some() || g.next_ping.is_none_or(|t| t > now) {
                continue;
            }
            g.ping_deadline = Some(now + timeout);
            g.next_ping = (!interval.is_zero()).then(|| now + interval);
            out.push(RouterPing { gateway });
        }
        self.refresh_next_timer();
        out
    }

    /// The gateway answered a router ping with `info` (lnet.md 6.3): with
    /// routing disabled on it every route through it is dead; otherwise a
    /// route is dead if the gateway has no NI up on our side, and a
    /// single-hop route (the gateway lists a NID on the remote net) is alive
    /// only if one of those is up (when `avoid_asym_router_failure`).
    pub fn on_router_ping_reply(&mut self, now: Time, gateway: Nid, info: &PingInfo) {
        let _ = now;
        let Some(g) = self.gateways.get_mut(&gateway) else {
            tracing::debug!(target: TARGET, %gateway, "ping reply from a NID that is no gateway");
            return;
        };
        g.ping_deadline = None;
        self.refresh_next_timer();
        self.judge_routes(gateway, info);
    }

    /// A node pushed its ping data (a router does when its NIs' status
    /// changes): if it is a gateway of ours (the data lists the gateway's
    /// NID), its routes are judged on the data at once, as on a router ping
    /// reply, without waiting for the next ping.
    pub fn on_gateway_push(&mut self, now: Time, info: &PingInfo) {
        let _ = now;
        let gateways: Vec<Nid> = self
            .gateways
            .keys()
            .filter(|&&g| info.nis.iter().any(|n| n.nid == g))
            .copied()
            .collect();
        for gateway in gateways {
            tracing::debug!(target: TARGET, %gateway, "gateway pushed its NI status");
            self.judge_routes(gateway, info);
        }
    }

    /// The gateway's routes as its ping data shows them (lnet.md 6.3).
    fn judge_routes(&mut self, gateway: Nid, info: &PingInfo) {
        if let Some(g) = self.gateways.get_mut(&gateway) {
            g.alive = true;
            g.discovery = info.features.contains(PingFeatures::MULTI_RAIL)
                && info.features.contains(PingFeatures::DISCOVERY);
        }
        let routing = !info.features.contains(PingFeatures::RTE_DISABLED);
        let up_on = |net: Net| {
            info.nis
                .iter()
                .any(|n| n.nid.net() == net && n.status == NiStatus::Up)
        };
        let listed_on = |net: Net| info.nis.iter().any(|n| n.nid.net() == net);
        let avoid_asym = self.config.avoid_asym_router_failure;
        for r in self.routes.values_mut().flatten() {
            if r.gateway != gateway {
                continue;
            }
            let single_hop = listed_on(r.net);
            r.single_hop = Some(single_hop);
            if r.hops == Some(1) && !single_hop {
                tracing::warn!(target: TARGET, net = %r.net, %gateway,
                    "route configured with 1 hop looks multi-hop; route table may be misconfigured");
            }
            r.alive =
                routing && up_on(gateway.net()) && (!single_hop || !avoid_asym || up_on(r.net));
        }
    }

    /// An LND's word on gateway NID `gateway` (`lnet_notify` where
    /// discovery is off, here or on the gateway): every route whose
    /// gateway is that NID is alive or dead as it says, at once. The
    /// gateway itself is not judged (the LND's notices carry no reset), so
    /// traffic from it does not revive the routes; its next router ping
    /// does. Returns how many routes changed.
    pub fn on_gateway_notified(&mut self, now: Time, gateway: Nid, alive: bool) -> usize {
        let _ = now;
        let mut changed = 0;
        for r in self.routes.values_mut().flatten() {
            if r.gateway == gateway && r.alive != alive {
                r.alive = alive;
                changed += 1;
            }
        }
        if changed > 0 {
            tracing::info!(target: TARGET, %gateway, alive, routes = changed,
                "routes follow the LND's notice on their gateway");
        }
        changed
    }

    /// The router ping to `gateway` failed or timed out: the gateway is dead
    /// and so are all routes through it.
    pub fn on_router_ping_failed(&mut self, now: Time, gateway: Nid) {
        let _ = now;
        if let Some(g) = self.gateways.get_mut(&gateway) {
            g.ping_deadline = None;
            g.alive = false;
        }
        self.refresh_next_timer();
        for r in self.routes.values_mut().flatten() {
            if r.gateway == gateway {
                r.alive = false;
            }
        }
    }

    /// A message forwarded by `gateway` arrived from a node on `src_net`: a
    /// gateway considered dead is alive again, and so is its route to that
    /// net; a live gateway's routes are left as they are.
    pub fn on_message_from_gateway(&mut self, now: Time, gateway: Nid, src_net: Net) {
        let _ = now;
        let Some(g) = self.gateways.get_mut(&gateway) else {
            return;
        };
        // Only a gateway considered dead is revived (lnet_parse): a live
        // one's routes keep what its ping data said (a route it reported
        // down, or its routing stopping, stays down while it forwards what
        // is still on its way).
        if g.alive {
            return;
        }
        tracing::info!(target: TARGET, %gateway, "gateway revived by forwarded traffic");
        g.alive = true;
        for r in self.routes.values_mut().flatten() {
            if r.gateway == gateway && r.net == src_net {
                r.alive = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PingNi;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn net(s: &str) -> Net {
        s.parse().unwrap()
    }

    fn t(secs: u64) -> Time {
        Time::from_secs(secs)
    }

    const LOCAL: [&str; 2] = ["tcp", "tcp1"];

    fn local() -> Vec<Net> {
        LOCAL.iter().map(|s| net(s)).collect()
    }

    fn table() -> RouteTable {
        RouteTable::new(RouteConfig::default(), 7)
    }

    fn ping(features: PingFeatures, nis: &[(&str, NiStatus)]) -> PingInfo {
        PingInfo {
            features: features.with(PingFeatures::NI_STATUS),
            pid: 12345,
            seqno: 1,
            lo_msg_size: 0,
            nis: nis
                .iter()
                .map(|&(s, status)| PingNi {
                    nid: nid(s),
                    status,
                    msg_size: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn add_route_validation() {
        let mut r = table();
        let l = local();
        let o2ib = net("o2ib");
        assert_eq!(
            r.add_route(t(0), o2ib, Nid::ANY, None, 0, &l),
            Err(RouteError::InvalidGateway(Nid::ANY))
        );
        assert_eq!(
            r.add_route(t(0), Net::LO, nid("10.0.0.9@tcp"), None, 0, &l),
            Err(RouteError::InvalidNet(Net::LO))
        );
        assert!(matches!(
            r.add_route(t(0), o2ib, nid("192.168.0.1@o2ib"), None, 0, &l),
            Err(RouteError::GatewayOnTargetNet { .. })
        ));
        assert_eq!(
            r.add_route(t(0), o2ib, nid("10.0.0.9@tcp"), Some(0), 0, &l),
            Err(RouteError::BadHops(0))
        );
        assert_eq!(
            r.add_route(t(0), o2ib, nid("10.0.0.9@tcp"), Some(256), 0, &l),
            Err(RouteError::BadHops(256))
        );
        assert_eq!(
            r.add_route(t(0), net("tcp1"), nid("10.0.0.9@tcp"), None, 0, &l),
            Err(RouteError::NetIsLocal(net("tcp1")))
        );
        assert_eq!(
            r.add_route(t(0), o2ib, nid("10.0.0.9@tcp5"), None, 0, &l),
            Err(RouteError::GatewayUnreachable(nid("10.0.0.9@tcp5")))
        );
        r.add_route(t(0), o2ib, nid("10.0.0.9@tcp"), Some(255), 0, &l)
            .unwrap();
        assert!(matches!(
            r.add_route(t(0), o2ib, nid("10.0.0.9@tcp"), None, 3, &l),
            Err(RouteError::Duplicate { .. })
        ));
        assert!(r.is_gateway(nid("10.0.0.9@tcp")));
        r.del_route(o2ib, nid("10.0.0.9@tcp")).unwrap();
        assert!(!r.is_gateway(nid("10.0.0.9@tcp")));
        assert!(matches!(
            r.del_route(o2ib, nid("10.0.0.9@tcp")),
            Err(RouteError::NotFound { .. })
        ));
    }

    #[test]
    fn selection_priority_then_hops_then_rank_then_round_robin() {
        let mut r = table();
        let l = local();
        let o2ib = net("o2ib");
        let (g1, g2, g3, g4) = (
            nid("10.0.0.1@tcp"),
            nid("10.0.0.2@tcp"),
            nid("10.0.0.3@tcp"),
            nid("10.0.0.4@tcp"),
        );
        r.add_route(t(0), o2ib, g1, Some(3), 1, &l).unwrap();
        r.add_route(t(0), o2ib, g2, Some(2), 1, &l).unwrap();
        r.add_route(t(0), o2ib, g3, None, 1, &l).unwrap();
        r.add_route(t(0), o2ib, g4, Some(1), 0, &l).unwrap();
        let q = RouteQuery::default();
        let flat = |_| GatewayRank::default();
        // Priority 0 wins over fewer hops.
        assert_eq!(r.select(o2ib, &q, flat), Some(g4));
        r.del_route(o2ib, g4).unwrap();
        // Undefined hops count as 1: g3 beats g2 (2) and g1 (3).
        assert_eq!(r.select(o2ib, &q, flat), Some(g3));
        r.del_route(o2ib, g3).unwrap();
        assert_eq!(r.select(o2ib, &q, flat), Some(g2));
        // Equal priority and hops: health, queued bytes, credits, then RR.
        let mut r = table();
        r.add_route(t(0), o2ib, g1, None, 0, &l).unwrap();
        r.add_route(t(0), o2ib, g2, None, 0, &l).unwrap();
        let sick = |n| GatewayRank {
            health: if n == g1 {
                Health::new(900).unwrap()
            } else {
                Health::MAX
            },
            ..GatewayRank::default()
        };
        assert_eq!(r.select(o2ib, &q, sick), Some(g2));
        let busy = |n| GatewayRank {
            queued_bytes: if n == g2 { 4096 } else { 0 },
            ..GatewayRank::default()
        };
        assert_eq!(r.select(o2ib, &q, busy), Some(g1));
        let credits = |n| GatewayRank {
            tx_credits: if n == g2 { 8 } else { 2 },
            ..GatewayRank::default()
        };
        assert_eq!(r.select(o2ib, &q, credits), Some(g2));
        let picks: Vec<Nid> = (0..4).map(|_| r.select(o2ib, &q, flat).unwrap()).collect();
        assert_eq!(picks[0], g1, "least recently used first");
        assert_eq!(picks[1..], [g2, g1, g2], "round robin");
        assert_eq!(r.select(net("o2ib9"), &q, flat), None, "no route");
    }

    #[test]
    fn selection_respects_source_net_preference_and_usable_nets() {
        let mut r = table();
        let l = local();
        let o2ib = net("o2ib");
        let (g_tcp, g_tcp1) = (nid("10.0.0.1@tcp"), nid("10.1.0.1@tcp1"));
        r.add_route(t(0), o2ib, g_tcp, None, 0, &l).unwrap();
        r.add_route(t(0), o2ib, g_tcp1, None, 5, &l).unwrap();
        let flat = |_| GatewayRank::default();
        let q = RouteQuery {
            src_net: Some(net("tcp1")),
            ..RouteQuery::default()
        };
        assert_eq!(r.select(o2ib, &q, flat), Some(g_tcp1));
        let usable = [net("tcp1")];
        let q = RouteQuery {
            usable_nets: &usable,
            ..RouteQuery::default()
        };
        assert_eq!(r.select(o2ib, &q, flat), Some(g_tcp1));
        let q = RouteQuery {
            preferred_gateway: Some(g_tcp1),
            ..RouteQuery::default()
        };
        assert_eq!(
            r.select(o2ib, &q, flat),
            Some(g_tcp1),
            "response goes back via rtr"
        );
        let q = RouteQuery {
            preferred_gateway: Some(nid("10.0.0.99@tcp")),
            ..RouteQuery::default()
        };
        assert_eq!(
            r.select(o2ib, &q, flat),
            Some(g_tcp),
            "unknown rtr: normal choice"
        );
    }

    #[test]
    fn random_insertion_is_seeded() {
        let order = |seed| {
            let mut r = RouteTable::new(RouteConfig::default(), seed);
            for i in 1..=8 {
                r.add_route(
                    t(0),
                    net("o2ib"),
                    nid(&format!("10.0.0.{i}@tcp")),
                    None,
                    0,
                    &local(),
                )
                .unwrap();
            }
            r.routes_to(net("o2ib"))
                .iter()
                .map(Route::gateway)
                .collect::<Vec<_>>()
        };
        assert_eq!(order(1), order(1));
        let variants: std::collections::BTreeSet<Vec<Nid>> = (0..8).map(order).collect();
        assert!(variants.len() > 1, "different seeds give different orders");
    }

    #[test]
    fn router_checker_pings_and_times_out() {
        let mut r = table();
        let g = nid("10.0.0.1@tcp");
        r.add_route(t(10), net("o2ib"), g, None, 0, &local())
            .unwrap();
        assert!(r.reachable(net("o2ib")), "routes start alive");
        assert_eq!(r.poll_timeout(), Some(t(10)), "immediate ping on add");
        assert_eq!(r.handle_timeout(t(10)), vec![RouterPing { gateway: g }]);
        assert!(r.handle_timeout(t(10)).is_empty(), "one ping outstanding");
        assert_eq!(r.poll_timeout(), Some(t(60)), "reply deadline");
        assert!(r.handle_timeout(t(60)).is_empty());
        assert!(!r.reachable(net("o2ib")), "no reply: route dead");
        assert_eq!(r.gateway_alive(g), Some(false));
        // Next check 60 s after the first ping.
        assert_eq!(r.poll_timeout(), Some(t(70)));
        assert_eq!(r.handle_timeout(t(70)).len(), 1);
        let info = ping(
            PingFeatures::empty(),
            &[
                ("10.0.0.1@tcp", NiStatus::Up),
                ("192.168.0.1@o2ib", NiStatus::Up),
            ],
        );
        r.on_router_ping_reply(t(71), g, &info);
        assert!(r.reachable(net("o2ib")));
        assert_eq!(r.routes_to(net("o2ib"))[0].single_hop(), Some(true));
        assert_eq!(r.poll_timeout(), Some(t(130)));
    }

    #[test]
    fn aliveness_from_ping_contents() {
        let mut r = table();
        let g = nid("10.0.0.1@tcp");
        let o2ib = net("o2ib");
        r.add_route(t(0), o2ib, g, None, 0, &local()).unwrap();
        r.add_route(t(0), net("o2ib7"), g, None, 0, &local())
            .unwrap();
        // Remote NI down on a single-hop route: asymmetric failure avoided.
        r.on_router_ping_reply(
            t(1),
            g,
            &ping(
                PingFeatures::empty(),
                &[
                    ("10.0.0.1@tcp", NiStatus::Up),
                    ("192.168.0.1@o2ib", NiStatus::Down),
                ],
            ),
        );
        assert!(!r.reachable(o2ib));
        // o2ib7 is not listed: multi-hop, alive as long as our side is up.
        assert!(r.reachable(net("o2ib7")));
        assert_eq!(r.routes_to(net("o2ib7"))[0].single_hop(), Some(false));
        // Our side down: dead.
        r.on_router_ping_reply(
            t(2),
            g,
            &ping(
                PingFeatures::empty(),
                &[
                    ("10.0.0.1@tcp", NiStatus::Down),
                    ("192.168.0.1@o2ib", NiStatus::Up),
                ],
            ),
        );
        assert!(!r.reachable(o2ib));
        assert!(!r.reachable(net("o2ib7")));
        // Routing disabled on the gateway: everything through it dead.
        r.on_router_ping_reply(
            t(3),
            g,
            &ping(
                PingFeatures::RTE_DISABLED,
                &[
                    ("10.0.0.1@tcp", NiStatus::Up),
                    ("192.168.0.1@o2ib", NiStatus::Up),
                ],
            ),
        );
        assert!(!r.reachable(o2ib));
        // Without asymmetric avoidance the remote side does not matter.
        let mut r = RouteTable::new(
            RouteConfig {
                avoid_asym_router_failure: false,
                ..RouteConfig::default()
            },
            1,
        );
        r.add_route(t(0), o2ib, g, None, 0, &local()).unwrap();
        r.on_router_ping_reply(
            t(1),
            g,
            &ping(
                PingFeatures::empty(),
                &[
                    ("10.0.0.1@tcp", NiStatus::Up),
                    ("192.168.0.1@o2ib", NiStatus::Down),
                ],
            ),
        );
        assert!(r.reachable(o2ib));
    }

    #[test]
    fn check_before_use_and_revival_by_traffic() {
        let mut r = RouteTable::new(
            RouteConfig {
                check_routers_before_use: true,
                ..RouteConfig::default()
            },
            3,
        );
        let g = nid("10.0.0.1@tcp");
        r.add_route(t(0), net("o2ib"), g, None, 0, &local())
            .unwrap();
        assert!(!r.reachable(net("o2ib")), "dead until pinged");
        assert_eq!(
            r.select(net("o2ib"), &RouteQuery::default(), |_| {
                GatewayRank::default()
            }),
            None
        );
        r.on_message_from_gateway(t(5), g, net("o2ib"));
        assert!(r.reachable(net("o2ib")));
        assert_eq!(r.gateway_alive(g), Some(true));
    }

    #[test]
    fn routing_switch() {
        let mut r = table();
        assert!(!r.routing_enabled());
        r.set_routing(true);
        assert!(r.routing_enabled());
    }

    #[test]
    fn check_interval_changes_at_run_time() {
        let mut r = table();
        let g = nid("10.0.0.1@tcp");
        r.add_route(t(0), net("o2ib"), g, None, 0, &local())
            .unwrap();
        assert_eq!(r.handle_timeout(t(0)).len(), 1, "first ping at once");
        r.on_router_ping_failed(t(1), g);
        assert_eq!(r.poll_timeout(), Some(t(60)), "default period");
        r.set_check_interval(t(2), Duration::from_secs(5));
        assert_eq!(r.poll_timeout(), Some(t(7)), "a shorter period reschedules");
        assert!(r.handle_timeout(t(6)).is_empty());
        assert_eq!(r.handle_timeout(t(7)).len(), 1);
        r.on_router_ping_failed(t(7), g);
        assert_eq!(r.poll_timeout(), Some(t(12)));
        r.set_check_interval(t(8), Duration::ZERO);
        assert_eq!(r.poll_timeout(), None, "zero stops the checker");
        assert!(r.handle_timeout(t(1000)).is_empty());
        r.set_check_interval(t(1000), Duration::from_secs(60));
        assert_eq!(r.poll_timeout(), Some(t(1060)));
    }

    #[test]
    fn checker_off_never_pings() {
        let mut r = RouteTable::new(
            RouteConfig {
                check_interval: Duration::ZERO,
                ..RouteConfig::default()
            },
            3,
        );
        r.add_route(t(0), net("o2ib"), nid("10.0.0.1@tcp"), None, 0, &local())
            .unwrap();
        assert_eq!(r.poll_timeout(), None);
        assert!(r.handle_timeout(t(1000)).is_empty());
    }
}
