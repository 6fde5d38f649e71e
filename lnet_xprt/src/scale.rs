//! Fabrics of any size for the simulator: the scale scenario of
//! `colibri bench --scale` and of the 1,024-node test.
//!
//! A [`Fabric`] of K nodes is clients on two nets (`tcp` and `tcp1`),
//! servers on a third (`tcp2`), and routers with an NI on each of the three
//! nets, every client and server holding a route through every router
//! (Lustre's usual "many gateways, same hops" set-up). With no routers, the
//! clients and servers share `tcp` and talk directly. In a [`Fabric::round`]
//! every client PUTs 64 bytes, with an ACK, to a server (client `i` to
//! server `i mod S`), and the run goes on until every PUT has its final
//! event; the round reports what happened and how many wire messages it
//! took. [`Fabric::kill_router`] marks a router's NIs down, as a crashed
//! router looks to its peers.
//!
//! ```
//! use colibri_lnet::scale::{Fabric, FabricShape};
//!
//! let mut f = Fabric::build(FabricShape::for_nodes(16), 7)?;
//! let r = f.round()?;
//! assert_eq!(r.acked, f.shape().clients);
//! assert!(r.wire_messages >= 4 * f.shape().clients); // PUT and ACK, two hops each
//! # Ok::<(), colibri_lnet::sim::SimError>(())
//! ```

use std::time::Duration;

use crate::ids::{Nid, ProcessId};
use crate::matching::{
    EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use crate::node::{NiConfig, NodeConfig};
use crate::sim::{Sim, SimError, Topology};

/// The portal the servers receive on.
const PORTAL: u32 = 12;
/// Bytes per PUT.
const PUT_LEN: u32 = 64;

/// How many nodes of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricShape {
    /// Clients (half on `tcp`, half on `tcp1`; all on `tcp` without
    /// routers).
    pub clients: usize,
    /// Routers (each on `tcp`, `tcp1` and `tcp2`).
    pub routers: usize,
    /// Servers (on `tcp2`; on `tcp` without routers).
    pub servers: usize,
}

impl FabricShape {
    /// A split of `k` nodes (at least 2): one router per 128 nodes (none
    /// below 8 nodes), one server per 16, the rest clients.
    #[must_use]
    pub fn for_nodes(k: usize) -> Self {
        let k = k.max(2);
        let routers = if k < 8 { 0 } else { (k / 128).max(2) };
        let servers = (k / 16).max(1);
        Self {
            clients: k - routers - servers,
            routers,
            servers,
        }
    }

    /// Nodes in all.
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.clients + self.routers + self.servers
    }
}

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// PUTs whose ACK came back.
    pub acked: usize,
    /// PUTs that failed (their final event carried an error).
    pub failed: usize,
    /// Messages that crossed a wire (one per hop).
    pub wire_messages: usize,
    /// Virtual time the round took.
    pub virtual_time: Duration,
}

/// A simulated fabric and the state of its clients. See the
/// [module docs](self).
#[derive(Debug)]
pub struct Fabric {
    sim: Sim,
    shape: FabricShape,
    clients: Vec<Client>,
    servers: Vec<Nid>,
    routers: Vec<Vec<Nid>>,
}

#[derive(Debug)]
struct Client {
    name: String,
    data: MemRef,
}

fn ip(net_octet: u32, i: usize) -> String {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    format!("10.{net_octet}.{}.{}", (i >> 8) & 0xff, i & 0xff)
}

impl Fabric {
    /// Builds the fabric, seeded: routes installed, servers' buffers
    /// posted, clients' data registered.
    ///
    /// # Errors
    /// A node's configuration refused (see [`Sim::new`]).
    pub fn build(shape: FabricShape, seed: u64) -> Result<Self, SimError> {
        let routed = shape.routers > 0;
        let mut topo = Topology::new(seed)
            .default_latency(Duration::from_micros(5))
            .jitter(Duration::from_micros(1))
            .max_steps(50_000_000)
            .trace_limit(1 << 16);
        let nid = |s: String| -> Result<Nid, SimError> { Ok(s.parse::<Nid>()?) };
        let node = |nids: Vec<Nid>, routing: bool| {
            let mut cfg = NodeConfig::new(nids.into_iter().map(NiConfig::new).collect());
            cfg.routing = routing;
            cfg
        };
        let mut routers = Vec::new();
        for r in 0..shape.routers {
            let nids = vec![
                nid(format!("{}@tcp", ip(200, r)))?,
                nid(format!("{}@tcp1", ip(201, r)))?,
                nid(format!("{}@tcp2", ip(202, r)))?,
            ];
            topo = topo.node_with(&format!("router{r}"), node(nids.clone(), true));
            routers.push(nids);
        }
        let mut servers = Vec::new();
        for s in 0..shape.servers {
            let n = if routed {
                nid(format!("{}@tcp2", ip(2, s)))?
            } else {
                nid(format!("{}@tcp", ip(0, 60_000 + s)))?
            };
            let name = format!("server{s}");
            topo = topo.node_with(&name, node(vec![n], false));
            for gw in &routers {
                topo = topo
                    .route(&name, "tcp", &gw[2].to_string(), Some(1), 0)
                    .route(&name, "tcp1", &gw[2].to_string(), Some(1), 0);
            }
            servers.push(n);
        }
        let mut names = Vec::new();
        for c in 0..shape.clients {
            let on_tcp1 = routed && c % 2 == 1;
            let n = if on_tcp1 {
                nid(format!("{}@tcp1", ip(1, c)))?
            } else {
                nid(format!("{}@tcp", ip(0, c)))?
            };
            let name = format!("client{c}");
            topo = topo.node_with(&name, node(vec![n], false));
            for gw in &routers {
                let via = if on_tcp1 { gw[1] } else { gw[0] };
                topo = topo.route(&name, "tcp2", &via.to_string(), Some(1), 0);
            }
            names.push(name);
        }
        let mut sim = Sim::new(topo)?;
        for s in 0..shape.servers {
            let name = format!("server{s}");
            let mem = sim.register_mem(&name, vec![0; PUT_LEN as usize]);
            sim.with_node(&name, |n, now| {
                let me = n.me_attach(MeSpec {
                    portal: PORTAL,
                    match_id: ProcessId::ANY,
                    match_bits: 0,
                    ignore_bits: !0,
                    unlink: Unlink::Retain,
                    pos: InsertPos::After,
                })?;
                // The sender's offset (0): every PUT lands in the same place.
                n.md_attach(
                    now,
                    me,
                    MdSpec::new(mem, MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE),
                )
            })
            .map_err(|error| SimError::Node {
                name: name.clone(),
                error,
            })?;
        }
        let clients = names
            .into_iter()
            .map(|name| {
                let data = sim.register_mem(&name, vec![0x5a; PUT_LEN as usize]);
                Client { name, data }
            })
            .collect();
        Ok(Self {
            sim,
            shape,
            clients,
            servers,
            routers,
        })
    }

    /// The shape it was built with.
    #[must_use]
    pub fn shape(&self) -> FabricShape {
        self.shape
    }

    /// The simulator, for inspection.
    #[must_use]
    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    /// The simulator, to drive it further.
    pub fn sim_mut(&mut self) -> &mut Sim {
        &mut self.sim
    }

    /// Every client PUTs to its server (with an ACK); runs until every
    /// PUT has its final event (ACK, or SEND with an error), or `limit` of
    /// virtual time (generous: LNet's own timeouts end every PUT before).
    ///
    /// # Errors
    /// [`SimError::StepLimit`]; a node refusing the PUT.
    pub fn round(&mut self) -> Result<Round, SimError> {
        let start = self.sim.now();
        let wire_before = self.sim.trace_total();
        let mut mds: Vec<MdHandle> = Vec::with_capacity(self.clients.len());
        for (i, c) in self.clients.iter().enumerate() {
            let target = ProcessId::lustre(self.servers[i % self.servers.len()]);
            let data = c.data;
            let md = self
                .sim
                .with_node(&c.name, |n, now| {
                    let md = n.md_bind(
                        MdSpec::new(data, MdOptions::empty()).threshold(Threshold::Count(2)),
                    )?;
                    n.put(now, md, true, target, PORTAL, 0, 0, 0)?;
                    Ok(md)
                })
                .map_err(|error| SimError::Node {
                    name: c.name.clone(),
                    error,
                })?;
            mds.push(md);
        }
        let mut round = Round::default();
        let mut pending: Vec<usize> = (0..self.clients.len()).collect();
        let limit = Duration::from_secs(600);
        let clients = &self.clients;
        let finished = |sim: &mut Sim, round: &mut Round, pending: &mut Vec<usize>| {
            pending.retain(|&i| {
                let mut done = false;
                for (_, ev) in sim.take_events(&clients[i].name) {
                    if ev.md != mds[i] {
                        continue;
                    }
                    match (ev.kind(), ev.status()) {
                        (EventKind::Ack, Ok(())) => {
                            round.acked += 1;
                            done = true;
                        }
                        (_, Err(_)) if !done => {
                            round.failed += 1;
                            done = true;
                        }
                        _ => {}
                    }
                }
                !done
            });
        };
        while !pending.is_empty() {
            // Everything in flight lands; then timers (retries, LNet's
            // own timeouts) move the rest, a slice of virtual time at once.
            self.sim.run_until_quiet()?;
            finished(&mut self.sim, &mut round, &mut pending);
            if pending.is_empty()
                || self.sim.now().saturating_duration_since(start) > limit
                || self.sim.next_time().is_none()
            {
                break;
            }
            self.sim.run_for(Duration::from_millis(100))?;
            finished(&mut self.sim, &mut round, &mut pending);
        }
        // Servers' and routers' events are not looked at: let them go, so
        // that a long run does not keep them.
        for s in 0..self.shape.servers {
            drop(self.sim.take_events(&format!("server{s}")));
        }
        for r in 0..self.shape.routers {
            drop(self.sim.take_events(&format!("router{r}")));
        }
        round.wire_messages = usize::try_from(self.sim.trace_total() - wire_before).unwrap_or(0);
        round.virtual_time = self.sim.now().saturating_duration_since(start);
        Ok(round)
    }

    /// Marks router `r`'s NIs down: nothing reaches it or leaves it, as
    /// when its process dies.
    pub fn kill_router(&mut self, r: usize) {
        if let Some(nids) = self.routers.get(r) {
            for &n in nids {
                self.sim.set_ni_down(n, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_fabrics_complete_their_rounds() {
        for k in [2, 16] {
            let mut f = Fabric::build(FabricShape::for_nodes(k), 3).unwrap();
            let r = f.round().unwrap();
            assert_eq!(r.acked, f.shape().clients, "k={k}: {r:?}");
        }
    }
}
