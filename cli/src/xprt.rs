//! Transport choice: the `--xprt` values and the one factory that turns
//! them into transports. Adding a transport (TCP, RDMA) is one variant
//! here, one arm in [`Xprt::transport`] and one in [`Xprt::default_addr`].

use std::sync::Arc;

use clap::ValueEnum;
use colibri_bench::PairConfig;
use colibri_bulk_mem::{MemConfig, MemTransport};
use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_lnet_rt::colibri_lnet::ids::{Net, Nid};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::Transport;

/// The port LNet nodes of this program listen on (every node the same, as
/// Lustre's `accept_port`; unprivileged, so any user can run it).
pub(crate) const LNET_PORT: u16 = 7988;

/// The LNet PID of this program's transfer machines' addresses (kernel
/// LNet's, `LNET_PID_LUSTRE`).
pub(crate) const LNET_PID: u32 = colibri_lnet_rt::colibri_lnet::ids::LNET_PID_LUSTRE;

/// LNet: every transfer machine gets its own delivery thread
/// (`--tm-threads`; `LnetXprtConfig::thread_per_tm`).
static LNET_TM_THREADS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets whether LNet transports built from now on give every transfer
/// machine its own delivery thread.
pub(crate) fn set_lnet_tm_threads(on: bool) {
    LNET_TM_THREADS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// LNet: how long the socket LND's schedulers and the transport's engines
/// look for work before they sleep, in nanoseconds (`--lnet-spin`;
/// `LnetConfig::spin`, `LnetXprtConfig::spin`; `u64::MAX`: the defaults).
static LNET_SPIN_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Sets the look-before-sleep time of the LNet threads of transports built
/// from now on in polling mode.
pub(crate) fn set_lnet_spin(t: std::time::Duration) {
    let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX - 1);
    LNET_SPIN_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// LNet: socket LND schedulers per node of transports built from now on
/// (`--lnet-scheds`; 0: `LnetConfig`'s default).
static LNET_SCHEDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the schedulers per LNet node of transports built from now on (0:
/// the runtime's default).
pub(crate) fn set_lnet_scheds(n: usize) {
    LNET_SCHEDS.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// This program's settings for the LNet nodes it starts: the schedulers'
/// look before sleeping, and `--lnet-scheds` if given.
fn tune(cfg: &mut LnetConfig, spin: std::time::Duration) {
    cfg.spin = spin;
    match LNET_SCHEDS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {}
        n => cfg.nscheds = n,
    }
}

/// How long LNet's threads (the socket LND's schedulers and the
/// transport's engines) look for work before they sleep: `--lnet-spin`
/// (the defaults, 50 µs, without it) when `polling`, none otherwise (every
/// hand-off a wake-up, as the raw blocking baseline's).
fn lnet_spin(polling: bool) -> std::time::Duration {
    if !polling {
        return std::time::Duration::ZERO;
    }
    match LNET_SPIN_NS.load(std::sync::atomic::Ordering::Relaxed) {
        u64::MAX => LnetXprtConfig::default().spin,
        ns => std::time::Duration::from_nanos(ns),
    }
}

/// The LNet transport configuration of this program: the defaults, with
/// `--tm-threads` and the engines' look before sleeping.
fn lnet_xprt_config(spin: std::time::Duration) -> LnetXprtConfig {
    LnetXprtConfig::default()
        .thread_per_tm(LNET_TM_THREADS.load(std::sync::atomic::Ordering::Relaxed))
        .spin(spin)
}

/// The LNet transport over one node made from a configuration file (the
/// YAML of `colibri lnet run`: NIs, peers, routes, globals), and the
/// node's primary NID (its first NI's).
pub(crate) fn lnet_from_config(
    path: &std::path::Path,
) -> Result<(Arc<dyn Transport>, Nid), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (conf, warnings) = colibri_lnet_rt::conf::NodeConf::from_yaml(&text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for w in &warnings {
        tracing::warn!("{}: {w}", path.display());
    }
    if conf.nis.is_empty() {
        return Err(format!(
            "{}: no local NI (net: … local NI(s):)",
            path.display()
        ));
    }
    let primary = conf.nis[0].nid;
    let l = Lnet::start(conf.to_lnet_config()).map_err(|e| format!("LNet node: {e}"))?;
    let set_up = || -> Result<(), String> {
        for p in &conf.peers {
            let nids: Vec<Nid> = p.nids.iter().copied().filter(|n| *n != p.primary).collect();
            l.add_peer(p.primary, &nids, p.multi_rail)
                .map_err(|e| format!("peer {}: {e}", p.primary))?;
        }
        for r in &conf.routes {
            l.add_route(r.net, r.gateway, r.hop, r.priority)
                .map_err(|e| format!("route to {} via {}: {e}", r.net, r.gateway))?;
        }
        Ok(())
    };
    if let Err(e) = set_up() {
        l.shutdown();
        return Err(e);
    }
    match LnetTransport::new(vec![l.clone()], lnet_xprt_config(lnet_spin(true))) {
        Ok(x) => Ok((Arc::new(x), primary)),
        Err(e) => {
            l.shutdown();
            Err(e.to_string())
        }
    }
}

/// A transport the program can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Xprt {
    /// The in-memory transport: transfer machines of one process only.
    Mem,
    /// The TCP transport: transfer machines of any processes (loopback in
    /// benchmarks, compared with a raw TCP socket pair).
    Tcp,
    /// The verbs RDMA transport: needs an RDMA device (the Soft-RoCE VM,
    /// `../shared/rdma-vm/run.sh --net lo -- colibri ...`).
    Rdma,
    /// The LNet transport over Lustre's socket LND (addresses
    /// `NID:PID:PORTAL:TMID`; each process runs an LNet node per NID it
    /// uses, listening on port 7988; benchmarks run two nodes in this
    /// process, compared with a raw TCP socket pair).
    Lnet,
}

impl Xprt {
    /// Its name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Mem => "mem",
            Self::Tcp => "tcp",
            Self::Rdma => "rdma",
            Self::Lnet => "lnet",
        }
    }

    /// Builds the transport for transfer machines at the addresses `own`
    /// (LNet: one node per NID among them; `in_process`: the nodes listen
    /// on any free port and know each other, so that nothing outside is
    /// needed; otherwise they listen on [`LNET_PORT`] and find peers
    /// there).
    pub(crate) fn transport_at(
        self,
        polling: bool,
        workers: usize,
        own: &[&str],
        in_process: bool,
    ) -> Result<Arc<dyn Transport>, String> {
        if self != Self::Lnet {
            return Ok(self.transport(polling, workers));
        }
        let spin = lnet_spin(polling);
        let mut nids: Vec<Nid> = Vec::new();
        for a in own {
            let a = LnetAddr::parse(a).map_err(|e| e.to_string())?;
            if !a.nid.is_lo() && !nids.contains(&a.nid) {
                nids.push(a.nid);
            }
        }
        let mut nodes = Vec::new();
        for &nid in &nids {
            let mut cfg = LnetConfig::new(&[nid]);
            cfg.accept_port = if in_process { 0 } else { LNET_PORT };
            // Any source port: the program runs without privilege.
            cfg.accept = AcceptPolicy::All;
            cfg.node.transaction_timeout = std::time::Duration::from_secs(20);
            tune(&mut cfg, spin);
            nodes.push(Lnet::start(cfg).map_err(|e| format!("LNet node {nid}: {e}"))?);
        }
        // In one process, nodes on different nets talk through a router
        // node with an NI on each net (at `.254` of that net's first
        // node's address), which the transport keeps with its nodes.
        let mut nets: Vec<(Net, Nid)> = Vec::new();
        for n in &nodes {
            let nid = n.nids()[0];
            if !nets.iter().any(|(net, _)| *net == nid.net()) {
                nets.push((nid.net(), nid));
            }
        }
        if in_process && nets.len() > 1 {
            let gws = nets
                .iter()
                .map(|(net, nid)| net.nid((nid.addr() & !0xff) | 254))
                .collect::<Vec<Nid>>();
            let mut cfg = LnetConfig::new(&gws);
            cfg.accept_port = 0;
            cfg.accept = AcceptPolicy::All;
            cfg.node.routing = true;
            cfg.node.transaction_timeout = std::time::Duration::from_secs(20);
            tune(&mut cfg, spin);
            let router = Lnet::start(cfg).map_err(|e| format!("LNet router: {e}"))?;
            for n in &nodes {
                let own = n.nids()[0].net();
                for &gw in &gws {
                    if let Some(at) = router.listen_addr(gw) {
                        n.set_peer_addr(gw, at);
                    }
                    if gw.net() != own {
                        continue;
                    }
                    for (net, _) in &nets {
                        if *net != own {
                            n.add_route(*net, gw, Some(1), 0)
                                .map_err(|e| format!("route to {net}: {e}"))?;
                        }
                    }
                }
                let nid = n.nids()[0];
                if let Some(at) = n.listen_addr(nid) {
                    router.set_peer_addr(nid, at);
                }
            }
            nodes.push(router);
        }
        if in_process {
            Lnet::introduce(&nodes);
        }
        if nodes.is_empty() {
            let mut cfg =
                LnetConfig::new(&["127.0.0.1@tcp".parse().map_err(|e| format!("{e}"))?]);
            cfg.accept_port = 0;
            tune(&mut cfg, spin);
            nodes.push(Lnet::start(cfg).map_err(|e| e.to_string())?);
        }
        Ok(Arc::new(
            LnetTransport::new(nodes, lnet_xprt_config(spin)).map_err(|e| e.to_string())?,
        ))
    }

    /// Builds the transport: `polling` workers spin before they sleep,
    /// with `workers` threads per transfer machine.
    pub(crate) fn transport(self, polling: bool, workers: usize) -> Arc<dyn Transport> {
        match self {
            Self::Mem => {
                let base = if polling {
                    MemConfig::polling()
                } else {
                    MemConfig::blocking()
                };
                Arc::new(MemTransport::new(MemConfig {
                    workers: workers.max(1),
                    ..base
                }))
            }
            // One I/O thread per domain (`workers` does not apply); polling:
            // it spins 1 ms in epoll_wait(0) before it blocks, so a busy
            // transfer machine never sleeps.
            Self::Tcp => Arc::new(TcpTransport::new(TcpConfig {
                spin: if polling {
                    std::time::Duration::from_millis(1)
                } else {
                    std::time::Duration::ZERO
                },
                ..TcpConfig::default()
            })),
            // One engine thread per domain; polling: it spins 1 ms on the
            // CQ and the sockets before it arms the CQ and blocks.
            Self::Rdma => Arc::new(RdmaTransport::new(if polling {
                RdmaConfig::polling()
            } else {
                RdmaConfig::blocking()
            })),
            // LNet needs the addresses: see `transport_at`. An unstarted
            // node set is useless, so this builds one loopback node.
            Self::Lnet => self
                .transport_at(polling, workers, &["0@lo:12345:30:*"], true)
                .unwrap_or_else(|_| Arc::new(MemTransport::new(MemConfig::default()))),
        }
    }

    /// The address a server listens at by default, and a client's own
    /// address (port 0: any free port).
    pub(crate) fn default_addr(self, server: bool) -> &'static str {
        match (self, server) {
            (Self::Mem, true) => "127.0.0.1:4040:1",
            (Self::Mem, false) => "127.0.0.1:0:2",
            (Self::Tcp, true) => "127.0.0.1:4041:1",
            (Self::Tcp, false) => "127.0.0.1:0:2",
            (Self::Rdma, true) => "127.0.0.1:4042:1",
            (Self::Rdma, false) => "127.0.0.1:0:2",
            (Self::Lnet, true) => "127.0.0.1@tcp:12345:30:1",
            (Self::Lnet, false) => "127.0.0.2@tcp:12345:30:*",
        }
    }

    /// A `ping` client's own address when it pings another process:
    /// [`Xprt::default_addr`], except over LNet when another process's
    /// node already listens at that NID's port (a second `colibri ping`
    /// running at once): then the next loopback NID whose LNet port is
    /// free (127.0.0.3, 127.0.0.4, ...), as each LNet node of a host has
    /// its own NID. With none free, the default (whose start then says
    /// why it failed).
    pub(crate) fn client_addr(self) -> String {
        let default = self.default_addr(false).to_string();
        if self != Self::Lnet {
            return default;
        }
        let free = |ip: std::net::Ipv4Addr| std::net::TcpListener::bind((ip, LNET_PORT)).is_ok();
        (2u8..=254)
            .map(|last| std::net::Ipv4Addr::new(127, 0, 0, last))
            .find(|ip| free(*ip))
            .map_or(default, |ip| format!("{ip}@tcp:12345:30:*"))
    }

    /// Where `ping` starts its own server when given no address.
    pub(crate) fn local_server_addr(self) -> &'static str {
        match self {
            Self::Mem | Self::Tcp | Self::Rdma => "127.0.0.1:0:1",
            Self::Lnet => "127.0.0.3@tcp:12345:30:1",
        }
    }

    /// Where a benchmark starts its client and server; `routed` (LNet):
    /// on two nets, so that [`Xprt::transport_at`] puts a router between.
    pub(crate) fn pair(self, routed: bool) -> PairConfig {
        match self {
            Self::Mem | Self::Tcp | Self::Rdma => PairConfig::mem(),
            // Two nodes: every message crosses the socket LND.
            Self::Lnet => PairConfig {
                client_addr: "127.0.62.1@tcp:12345:30:*".into(),
                server_addr: if routed {
                    "127.0.63.2@tcp1:12345:31:*".into()
                } else {
                    "127.0.62.2@tcp:12345:31:*".into()
                },
                cpus: None,
            },
        }
    }

    /// True when another process can reach a server on this transport.
    pub(crate) fn crosses_processes(self) -> bool {
        match self {
            Self::Mem => false,
            Self::Tcp | Self::Rdma | Self::Lnet => true,
        }
    }
}
