//! Runtime configuration.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use colibri_lnet::ids::Nid;
use colibri_lnet::node::{NiConfig, NodeConfig};
use colibri_lnet::socklnd::acceptor::DEFAULT_ACCEPT_PORT;
use colibri_lnet::socklnd::{AcceptPolicy, Tunables};

/// Configuration of an [`crate::Lnet`] runtime: the node (its NIs and LNet
/// tunables), the socket LND's tunables (Lustre's names and defaults), the
/// acceptor, and thread counts.
///
/// NIs on `tcp` nets (`ip@tcp`, `ip@tcp3`) get a listener on their IP and
/// [`LnetConfig::accept_port`] (or the address in [`LnetConfig::listen`]);
/// `0@lo` always exists. Other LND types are refused.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LnetConfig {
    /// The node: NIs, routing, discovery, transaction timeout, retry count,
    /// health sensitivity, router buffers (`colibri_lnet::node::NodeConfig`).
    pub node: NodeConfig,
    /// Socket LND module parameters (`sock_timeout`, `keepalive`,
    /// `conns_per_peer`, `min_bulk`, `nscheds`, `nconnds`, `tos`, TCP
    /// keepalive probes, …). An NI's `credits`, `peer_credits` and
    /// `peer_buffer_credits` are its own (`NiConfig`, the YAML's
    /// `tunables:`), not these; what the socket LND does not implement
    /// (`eager_ack`, `round_robin=0`, `peer_timeout`, zero copy, …) is
    /// listed in `lnet_xprt/rt/DESIGN.md`.
    pub tcp: Tunables,
    /// `accept`: which source ports the acceptor admits (default `secure`:
    /// privileged ports only, as Lustre).
    pub accept: AcceptPolicy,
    /// `accept_port`: the port NIs listen on and peers are connected to
    /// (default 988). 0 listens on a free port (see
    /// [`crate::Lnet::listen_addr`]); peers are then reached through
    /// [`LnetConfig::peers`] or [`crate::Lnet::set_peer_addr`].
    pub accept_port: u16,
    /// `accept_port_bulk` (Lustre 2.17): the port BULK_IN and BULK_OUT
    /// connections are made to and accepted on, CONTROL ones staying on
    /// `accept_port`; an NI then listens on both. `None` (the default):
    /// `accept_port` for every connection, one listener. (Lustre's
    /// default is 988 whatever `accept_port` is: with both at their
    /// defaults, the same.) Peers given an address
    /// ([`LnetConfig::peers`], [`crate::Lnet::set_peer_addr`]) are
    /// connected there for every type.
    pub accept_port_bulk: Option<u16>,
    /// Listen address per NI, overriding `ip:accept_port`.
    pub listen: HashMap<Nid, SocketAddr>,
    /// Where to connect to a peer NID, overriding `ip:accept_port`.
    pub peers: HashMap<Nid, SocketAddr>,
    /// Connect from a privileged source port (1023 down to 512), as Lustre
    /// does so that `accept=secure` peers admit us; when none can be bound
    /// (no privilege), an ephemeral port is used.
    pub reserved_ports: bool,
    /// Scheduler threads (socket I/O); `tcp.nscheds` 0 means this value.
    pub nscheds: usize,
    /// Connection daemons (handshakes); `tcp.nconnds` is used when this is 0.
    pub nconnds: usize,
    /// How often the reaper looks at connections (keepalives, timeouts,
    /// reconnections).
    pub tick: Duration,
    /// How long the acceptor waits for a connection request and HELLO
    /// (`accept_timeout`, 5 s).
    pub accept_timeout: Duration,
    /// How long a scheduler thread keeps looking at its sockets (its
    /// busiest connection read directly, the others by an `epoll_wait`
    /// that does not block; `sched_yield` every fourth empty look, every
    /// one when more schedulers spin than there are CPUs) after its last
    /// event before it blocks. Bytes that come meanwhile
    /// are read without a thread wake-up (15-20 µs across the CPUs of a
    /// VM, several per message exchange), at the price of CPU time while
    /// traffic flows. `Duration::ZERO` blocks at once, as Lustre's kernel
    /// schedulers do. Default 50 µs. Not a Lustre tunable.
    pub spin: Duration,
    /// Most forwarded payloads a router holds in kernel pipes at once
    /// (`lnet_xprt/rt/DESIGN.md`, "Forwarding through pipes"): a payload
    /// of 32 KiB or more that carries no checksum (and `enable_csum`
    /// off) is spliced from the incoming socket into a pipe and from
    /// there into the outgoing one, never copied through user space.
    /// Each pipe is two descriptors and, while it holds a payload, up to
    /// 1 MiB of pages counted against the user's pipe pages. Payloads
    /// beyond this many, or when a pipe cannot be made, go through
    /// memory. 0 (the default) forwards every payload through memory.
    /// It halves a router's CPU time per forwarded byte, but on one
    /// machine whose client, router and server share the CPUs over
    /// loopback it made the end-to-end stream 10-25% slower (the
    /// sender's socket pages are then held until the final receiver
    /// reads them, so the sender copies into fresh, cold pages): turn it
    /// on for a router with its own CPUs and NICs. Not a Lustre tunable
    /// (a kernel router never copies a payload at all).
    pub splice_pipes: usize,
    /// The size asked for each of those pipes: [`crate::PIPE_BYTES`]
    /// (LNet's largest payload). Tests set it lower so that payloads
    /// spill from their pipes to memory half-way.
    #[doc(hidden)]
    pub splice_pipe_bytes: usize,
    /// IPs the socket LND's link watch takes as having no link, whatever
    /// the interface table says, shared so that a test can cut and
    /// restore a link at run time (an interface cannot be taken down
    /// without privileges).
    #[doc(hidden)]
    pub link_down_ips: Arc<parking_lot::Mutex<HashSet<Ipv4Addr>>>,
}

impl LnetConfig {
    /// A node with these NIDs (the first is the primary NID) and Lustre's
    /// defaults.
    #[must_use]
    pub fn new(nids: &[Nid]) -> Self {
        Self {
            node: NodeConfig::new(nids.iter().map(|n| NiConfig::new(*n)).collect()),
            tcp: Tunables::default(),
            accept: AcceptPolicy::Secure,
            accept_port: DEFAULT_ACCEPT_PORT,
            accept_port_bulk: None,
            listen: HashMap::new(),
            peers: HashMap::new(),
            reserved_ports: true,
            nscheds: 2,
            nconnds: 2,
            tick: Duration::from_secs(1),
            accept_timeout: Duration::from_secs(5),
            spin: Duration::from_micros(50),
            splice_pipes: 0,
            splice_pipe_bytes: crate::PIPE_BYTES,
            link_down_ips: Arc::default(),
        }
    }

    /// Sets the listen address of NI `nid`.
    #[must_use]
    pub fn listen_on(mut self, nid: Nid, addr: SocketAddr) -> Self {
        self.listen.insert(nid, addr);
        self
    }

    /// Sets where peer `nid` is connected to.
    #[must_use]
    pub fn peer_addr(mut self, nid: Nid, addr: SocketAddr) -> Self {
        self.peers.insert(nid, addr);
        self
    }
}
