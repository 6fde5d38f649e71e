//! The socket LND driver (Lustre's `ksocklnd` over real sockets).
//!
//! Threads: one acceptor per NI (mio, accepts and hands sockets to the
//! connds), `nconnds` connection daemons (blocking handshakes with
//! timeouts, both directions, passive ones first) and one more for passive
//! handshakes only, `nscheds` schedulers (mio, edge-triggered, all frame
//! I/O). The protocol decisions are `colibri_lnet::socklnd`'s.
//!
//! Locks: an NI's peer table (`SockNi::peers`) is taken without the node
//! lock and never while doing socket I/O; under it a connection's transmit
//! queue may be taken (NI lock → queue lock). The parked-message map is a
//! leaf lock (also taken under the node lock).

mod handshake;
#[allow(unsafe_code)]
pub(crate) mod link;
mod sched;

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use colibri_lnet::health::HealthStatus;
use colibri_lnet::ids::{Nid, Pid};
use colibri_lnet::nidmap::{KeyedMap, NidMap};
use colibri_lnet::node::{Payload, RxAction, RxId, Transmit, TxId, Withdrawal};
use colibri_lnet::socklnd::frame::LNET_FRAME_HDR_LEN;
use colibri_lnet::socklnd::{
    AcceptPolicy, ConnId, ConnLoad, ConnType, FrameReceiver, Keepalive, KsockMsgHeader, LocalEnd,
    PeerConns, Reconnect, SocketError, Tunables, TxFailure, TxKind,
};
use colibri_lnet::time::Time;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Mutex, RwLock};

use crate::LnetError;
use crate::core::{Input, Lnd, Shared, health_error};
use crate::stats::add;

pub(crate) use sched::SchedCmd;

const TARGET: &str = "colibri_lnet_rt::socklnd";

/// Close reasons kept for [`crate::Lnet::close_reasons`].
const CLOSE_LOG: usize = 64;

/// Socket LND settings taken from [`crate::LnetConfig`].
#[derive(Clone, Debug)]
pub(crate) struct SockCfg {
    pub(crate) tun: Tunables,
    pub(crate) accept: AcceptPolicy,
    pub(crate) accept_port: u16,
    /// `LnetConfig::accept_port_bulk`.
    pub(crate) accept_port_bulk: Option<u16>,
    pub(crate) accept_timeout: Duration,
    pub(crate) reserved_ports: bool,
    pub(crate) pid: Pid,
    /// `sock_timeout` in seconds as configured; 0: LNet's `lnd_timeout`
    /// (see [`SockLnd::sock_timeout`]).
    pub(crate) sock_timeout: u32,
    /// LNet's `lnd_timeout` when the LND starts (kept current by
    /// [`SockLnd::note_lnd_timeout`]).
    pub(crate) lnd_timeout: Duration,
    pub(crate) keepalive: Duration,
    pub(crate) conns_per_peer: u32,
    /// How long a scheduler looks for events before it blocks
    /// (`LnetConfig::spin`).
    pub(crate) spin: Duration,
    /// `LnetConfig::link_down_ips`.
    pub(crate) link_down_ips: Arc<Mutex<std::collections::HashSet<Ipv4Addr>>>,
}

/// One message waiting for, or on, a connection.
pub(crate) struct TxItem {
    /// The node's transmit id (`None` for NOOPs).
    pub(crate) id: Option<TxId>,
    /// `ksock_msg` header and, for LNet messages, the 72-byte LNet header.
    pub(crate) head: [u8; LNET_FRAME_HDR_LEN],
    pub(crate) head_len: usize,
    pub(crate) payload: Payload,
    pub(crate) queued: Time,
}

impl TxItem {
    fn lnet(tx: Transmit, now: Time) -> Self {
        let mut head = [0u8; LNET_FRAME_HDR_LEN];
        head[..24].copy_from_slice(&KsockMsgHeader::lnet().encode());
        head[24..].copy_from_slice(&tx.header);
        Self {
            id: Some(tx.id),
            head,
            head_len: LNET_FRAME_HDR_LEN,
            payload: tx.payload,
            queued: now,
        }
    }

    fn noop(h: KsockMsgHeader, now: Time) -> Self {
        let mut head = [0u8; LNET_FRAME_HDR_LEN];
        head[..24].copy_from_slice(&h.encode());
        Self {
            id: None,
            head,
            head_len: 24,
            payload: Payload::None,
            queued: now,
        }
    }

    fn kind(&self) -> TxKind {
        if self.id.is_some() {
            TxKind::Lnet {
                payload_len: self.payload.len(),
            }
        } else {
            TxKind::Noop { nonblk: true }
        }
    }

    pub(crate) fn wire_len(&self) -> u64 {
        self.head_len as u64 + u64::from(self.payload.len())
    }
}

/// A connection as the rest of the LND sees it; its socket belongs to
/// one scheduler.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) ni: Nid,
    pub(crate) peer: Nid,
    pub(crate) ctype: ConnType,
    pub(crate) sched: usize,
    pub(crate) txq: Mutex<VecDeque<TxItem>>,
    pub(crate) queued_bytes: AtomicU64,
    pub(crate) last_post: AtomicU64,
    /// Last time bytes arrived (ns).
    pub(crate) last_rx: AtomicU64,
    /// Last time bytes left, or a message was queued on an idle queue (ns).
    pub(crate) last_tx: AtomicU64,
    /// Bytes are being written (a message in progress).
    pub(crate) tx_busy: AtomicBool,
    /// A message is half read.
    pub(crate) rx_busy: AtomicBool,
    pub(crate) closing: AtomicBool,
    /// The right to write to the socket: held across every write, by the
    /// scheduler or by a thread sending on an idle connection itself
    /// ([`SockLnd::write_inline`]); it holds that thread's handle on the
    /// socket (`None` until the scheduler has the connection, and again
    /// once it closed it).
    pub(crate) writer: Mutex<Option<std::net::TcpStream>>,
    /// A message a sending thread left half written (the socket was
    /// full): the scheduler finishes it before anything else.
    pub(crate) handoff: Mutex<Option<sched::TxProgress>>,
}

impl Conn {
    fn load(&self) -> ConnLoad {
        ConnLoad {
            queued_bytes: self.queued_bytes.load(Ordering::Relaxed),
            last_post: Time::from_nanos(self.last_post.load(Ordering::Relaxed)),
        }
    }
}

/// One peer of one NI.
struct Peer {
    conns: PeerConns,
    refs: KeyedMap<ConnId, Arc<Conn>>,
    reconnect: Reconnect,
    keepalive: Keepalive,
    /// Messages waiting for a connection.
    pending: VecDeque<TxItem>,
    /// An active connection job is queued or running.
    connecting: bool,
    /// We opened a connection to it: we complete the typed set.
    active: bool,
}

/// Forwarded messages (a router buffer's payload) at most this long
/// (header and payload) are written by the sending thread when their
/// connection is idle; longer ones go to the connection's scheduler, so
/// that a router's scheduler reads the next large message while another
/// writes the previous one out. Messages from MD memory are written by
/// the sending thread whatever their length (as much as the socket takes;
/// the scheduler finishes the rest): a hand-off to a scheduler that
/// sleeps, or spins on another CPU, cost a 1 MiB PUT stream 10-25%.
const INLINE_MAX: u64 = 16 << 10;

/// One `tcp` NI.
pub(crate) struct SockNi {
    pub(crate) nid: Nid,
    pub(crate) local: LocalEnd,
    pub(crate) listen: Option<SocketAddr>,
    peers: Mutex<NidMap<Peer>>,
    /// Where it accepts bulk connections, when that is another port
    /// (`accept_port_bulk`).
    pub(crate) bulk_listen: Option<SocketAddr>,
    /// The listeners it accepts on (its port, then its bulk port if that
    /// is another), each shared with the other NIs on the same address
    /// (`tcp` and `tcp1` on one interface: Lustre's one acceptor
    /// dispatches by the connection request's NID).
    listeners: Vec<Arc<Listener>>,
    /// The NI was deleted.
    pub(crate) deleted: AtomicBool,
    /// `conns_per_peer` of this NI (BULK_IN/BULK_OUT pairs per peer),
    /// for peers met from now on (`lnetctl net set --conns-per-peer`).
    pub(crate) conns_per_peer: AtomicU32,
    /// The IP type of service of its connections (-1: the LND's `tos`).
    tos: i32,
    /// The IP whose interface carries it (its listen address's, else its
    /// NID's), which the link watch looks for.
    link_ip: Ipv4Addr,
    /// What the link watch last told LNet (up until it says otherwise).
    link_up: AtomicBool,
}

impl SockNi {
    pub(crate) fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.nid.addr())
    }

    /// The type of service its connections carry: its own, else the
    /// LND's (-1: none set).
    pub(crate) fn tos(&self, lnd: &SockLnd) -> i32 {
        if self.tos >= 0 {
            self.tos
        } else {
            lnd.cfg.tun.tos
        }
    }
}

/// A listening socket and its acceptor thread, shared by the NIs that
/// listen on its address.
pub(crate) struct Listener {
    addr: SocketAddr,
    waker: Arc<mio::Waker>,
    /// NIs using it; the last one to go stops the acceptor.
    users: AtomicUsize,
    /// Set when its last NI is deleted.
    pub(crate) stop: AtomicBool,
    /// The acceptor sends one message here once it has closed the
    /// socket, so that the address can be bound again at once.
    closed: (Sender<()>, Receiver<()>),
}

/// A listener just bound: what its acceptor thread takes.
type NewAcceptor = (mio::Poll, std::net::TcpListener, Arc<Listener>);

/// A scheduler as seen from outside.
pub(crate) struct SchedHandle {
    tx: Sender<SchedCmd>,
    waker: Arc<mio::Waker>,
}

impl SchedHandle {
    pub(crate) fn send(&self, c: SchedCmd) {
        if self.tx.send(c).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

/// Work for the connection daemons.
pub(crate) enum ConndJob {
    /// A socket the acceptor took.
    Accept(std::net::TcpStream, SocketAddr),
    /// Open connections to a peer.
    Connect(Arc<SockNi>, Nid),
    /// Stop.
    Stop,
}

/// The socket LND.
pub(crate) struct SockLnd {
    pub(crate) cfg: SockCfg,
    pub(crate) shared: Weak<Shared>,
    nis: RwLock<NidMap<Arc<SockNi>>>,
    peer_addrs: RwLock<NidMap<SocketAddr>>,
    scheds: Vec<SchedHandle>,
    next_sched: AtomicUsize,
    next_conn: AtomicU64,
    connd_tx: Sender<ConndJob>,
    /// Accepted sockets waiting for their passive handshake: a queue of
    /// their own, served first by every connd and always by one, so that
    /// connds blocked in active handshakes (waiting for a peer's answer,
    /// which may be this node's own passive side, or a node that connects
    /// back at the same moment) cannot starve them. Lustre starts more
    /// connds when all are busy (`ksnd_nconnds_max`) for the same reason.
    accept_tx: Sender<ConndJob>,
    /// Parked messages: which connection holds each.
    pub(crate) parked: Mutex<KeyedMap<RxId, (usize, ConnId)>>,
    close_log: Mutex<VecDeque<String>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Wakers of the threads that wait in a poll of their own (acceptors,
    /// the link watch), woken at shutdown.
    poll_wakers: Mutex<Vec<Arc<mio::Waker>>>,
    /// Held while the link watch reads the interface table and tells
    /// LNet what changed, so that the tick's reading and an event's
    /// cannot report two changes in the wrong order.
    link_watch: Mutex<()>,
    /// Listeners by the address they were asked to bind (a fixed port).
    listeners: Mutex<HashMap<SocketAddr, Arc<Listener>>>,
    pub(crate) stopping: AtomicBool,
    nconnds: usize,
    /// `sock_timeout`, seconds, 0: `lnd_timeout` (`lnetctl net set
    /// --lnd-timeout`, Lustre's writable module parameter).
    sock_timeout: AtomicU32,
    /// LNet's `lnd_timeout`, seconds, as the node derives it from its
    /// transaction timeout and retry count.
    lnd_timeout: AtomicU64,
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, LnetError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map_err(|source| LnetError::Io {
            what: format!("spawning thread {name}"),
            source,
        })
}

impl SockLnd {
    /// Starts schedulers and connds; NIs are added with [`SockLnd::add_ni`].
    pub(crate) fn start(
        shared: &Arc<Shared>,
        cfg: SockCfg,
        peers: HashMap<Nid, SocketAddr>,
        nscheds: usize,
        nconnds: usize,
    ) -> Result<Arc<Self>, LnetError> {
        let nscheds = nscheds.max(1);
        let nconnds = nconnds.max(1);
        let mut scheds = Vec::new();
        let mut sched_parts = Vec::new();
        for _ in 0..nscheds {
            let poll = mio::Poll::new().map_err(|source| LnetError::Io {
                what: "creating a poll instance".into(),
                source,
            })?;
            let waker = Arc::new(mio::Waker::new(poll.registry(), sched::WAKER).map_err(
                |source| LnetError::Io {
                    what: "creating a waker".into(),
                    source,
                },
            )?);
            // Commands are bounded by the connections and messages the
            // scheduler holds.
            #[allow(clippy::disallowed_methods)]
            let (tx, rx) = crossbeam_channel::unbounded();
            scheds.push(SchedHandle { tx, waker });
            sched_parts.push((poll, rx));
        }
        let (connd_tx, connd_rx) = crossbeam_channel::bounded(1024);
        let (accept_tx, accept_rx) = crossbeam_channel::bounded(1024);
        let lnd = Arc::new(Self {
            shared: Arc::downgrade(shared),
            nis: RwLock::new(NidMap::default()),
            peer_addrs: RwLock::new(peers.into_iter().collect()),
            scheds,
            next_sched: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
            connd_tx,
            accept_tx,
            parked: Mutex::new(KeyedMap::default()),
            close_log: Mutex::new(VecDeque::new()),
            threads: Mutex::new(Vec::new()),
            poll_wakers: Mutex::new(Vec::new()),
            link_watch: Mutex::new(()),
            listeners: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            nconnds,
            sock_timeout: AtomicU32::new(cfg.sock_timeout),
            lnd_timeout: AtomicU64::new(cfg.lnd_timeout.as_secs().max(1)),
            cfg,
        });
        let mut threads = Vec::new();
        for (i, (poll, rx)) in sched_parts.into_iter().enumerate() {
            let s = shared.clone();
            let l = lnd.clone();
            threads.push(spawn(&format!("socknal_sd{i:02}"), move || {
                sched::Scheduler::new(i, poll, rx, s, l).run();
            })?);
        }
        for i in 0..nconnds {
            let s = shared.clone();
            let l = lnd.clone();
            let rx: Receiver<ConndJob> = connd_rx.clone();
            let accepts: Receiver<ConndJob> = accept_rx.clone();
            threads.push(spawn(&format!("socknal_cd{i:02}"), move || {
                handshake::connd(&s, &l, &rx, &accepts);
            })?);
        }
        let s = shared.clone();
        let l = lnd.clone();
        threads.push(spawn(&format!("socknal_cd{nconnds:02}"), move || {
            handshake::passive_connd(&s, &l, &accept_rx);
        })?);
        match link::LinkEvents::open() {
            Ok(ev) => threads.push(lnd.start_link_events(ev)?),
            Err(e) => tracing::info!(target: TARGET, error = %e,
                "no link events (routing netlink): links are checked each tick only"),
        }
        lnd.threads.lock().extend(threads);
        Ok(lnd)
    }

    /// Starts the thread that waits for the kernel's link and address
    /// events and checks the NIs' links at each ([`link`]).
    fn start_link_events(
        self: &Arc<Self>,
        mut ev: link::LinkEvents,
    ) -> Result<JoinHandle<()>, LnetError> {
        const EVENTS: mio::Token = mio::Token(0);
        const WAKER: mio::Token = mio::Token(1);
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| LnetError::Io { what, source }
        };
        let mut poll = mio::Poll::new().map_err(io("creating the link watch's poll"))?;
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&ev.raw_fd()),
                EVENTS,
                mio::Interest::READABLE,
            )
            .map_err(io("registering the link events socket"))?;
        let waker = Arc::new(
            mio::Waker::new(poll.registry(), WAKER)
                .map_err(io("creating the link watch's waker"))?,
        );
        self.poll_wakers.lock().push(waker);
        let me = self.clone();
        spawn("socknal_link", move || {
            let mut events = mio::Events::with_capacity(4);
            while !me.stopping.load(Ordering::Acquire) {
                if let Err(e) = poll.poll(&mut events, None) {
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    tracing::warn!(target: TARGET, error = %e,
                        "the link watch's poll failed: links are checked each tick only");
                    return;
                }
                if me.stopping.load(Ordering::Acquire) {
                    return;
                }
                // Edge-triggered: everything waiting is read each time.
                if ev.drain()
                    && let Some(s) = me.shared.upgrade()
                {
                    me.check_links(&s);
                }
            }
        })
    }

    /// The listener on `addr`: the one another NI bound there (two nets
    /// on one interface), or a new one with what its acceptor thread
    /// needs, entered in `listeners` unless its port is any (0).
    fn listener_at(
        listeners: &mut HashMap<SocketAddr, Arc<Listener>>,
        addr: SocketAddr,
        nid: Nid,
    ) -> Result<(Arc<Listener>, Option<NewAcceptor>), LnetError> {
        if let Some(l) = listeners.get(&addr).filter(|_| addr.port() != 0) {
            l.users.fetch_add(1, Ordering::AcqRel);
            return Ok((l.clone(), None));
        }
        let l = handshake::listener(addr)?;
        let bound = l.local_addr().map_err(|source| LnetError::Io {
            what: format!("listener of {nid}"),
            source,
        })?;
        let poll = mio::Poll::new().map_err(|source| LnetError::Io {
            what: "creating a poll instance".into(),
            source,
        })?;
        let waker = Arc::new(
            mio::Waker::new(poll.registry(), handshake::ACCEPT_WAKER).map_err(|source| {
                LnetError::Io {
                    what: "creating a waker".into(),
                    source,
                }
            })?,
        );
        let shared = Arc::new(Listener {
            addr: bound,
            waker,
            users: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
            closed: crossbeam_channel::bounded(1),
        });
        if addr.port() != 0 {
            listeners.insert(addr, shared.clone());
        }
        Ok((shared.clone(), Some((poll, l, shared))))
    }

    /// Adds a `tcp` NI: binds its listener (unless `accept=none`), or
    /// shares the one already bound to its address by another NI (two
    /// nets on one interface), and its bulk listener if
    /// `accept_port_bulk` is another port.
    pub(crate) fn add_ni(
        self: &Arc<Self>,
        nid: Nid,
        listen: Option<SocketAddr>,
        incarnation: u64,
        conns_per_peer: u32,
        tos: i32,
    ) -> Result<SocketAddr, LnetError> {
        let ip = Ipv4Addr::from(nid.addr());
        let addr =
            listen.unwrap_or_else(|| SocketAddr::V4(SocketAddrV4::new(ip, self.cfg.accept_port)));
        // Bulk connections on a port of their own (Lustre's
        // `accept_port_bulk`), on the same IP.
        let bulk_addr = self
            .cfg
            .accept_port_bulk
            .filter(|p| *p != addr.port() || *p == 0)
            .map(|p| SocketAddr::new(addr.ip(), p));
        let mut new_acceptors = Vec::new();
        // Held until the NI is in the table, so that a delete of the
        // last NI on a listener cannot stop it under a new user.
        let mut listeners = self.listeners.lock();
        let mut mine: Vec<Arc<Listener>> = Vec::new();
        if self.cfg.accept.listens() {
            for at in std::iter::once(addr).chain(bulk_addr) {
                match Self::listener_at(&mut listeners, at, nid) {
                    Ok((l, new)) => {
                        mine.push(l);
                        new_acceptors.extend(new);
                    }
                    Err(e) => {
                        // The control listener taken above is given back.
                        for l in mine {
                            if l.users.fetch_sub(1, Ordering::AcqRel) == 1 {
                                listeners.retain(|_, x| !Arc::ptr_eq(x, &l));
                            }
                        }
                        return Err(e);
                    }
                }
            }
        }
        let listener = mine.first().cloned();
        let bound = listener.as_ref().map_or(addr, |l| l.addr);
        let ni = Arc::new(SockNi {
            nid,
            local: LocalEnd {
                nid,
                pid: self.cfg.pid,
                incarnation,
            },
            listen: listener.as_ref().map(|l| l.addr),
            bulk_listen: mine.get(1).map(|l| l.addr),
            peers: Mutex::new(NidMap::default()),
            listeners: mine,
            deleted: AtomicBool::new(false),
            conns_per_peer: AtomicU32::new(if conns_per_peer == 0 {
                self.cfg.conns_per_peer
            } else {
                conns_per_peer
            }),
            tos,
            link_ip: match addr {
                SocketAddr::V4(a) if !a.ip().is_unspecified() => *a.ip(),
                _ => ip,
            },
            link_up: AtomicBool::new(true),
        });
        self.nis.write().insert(nid, ni);
        drop(listeners);
        let fresh = !new_acceptors.is_empty();
        for (poll, l, shared) in new_acceptors {
            self.poll_wakers.lock().push(shared.waker.clone());
            let me = self.clone();
            let at = shared.addr;
            let t = spawn(&format!("acceptor_{ip}"), move || {
                // It owns the socket: closed when it returns.
                handshake::acceptor(&me, &shared, poll, l);
                let _ = shared.closed.0.try_send(());
            })?;
            self.threads.lock().push(t);
            tracing::info!(target: TARGET, %nid, %at, "socket LND listening");
        }
        if !fresh && self.cfg.accept.listens() {
            tracing::info!(target: TARGET, %nid, %bound,
                "socket LND listening (a listener shared with another NI)");
        }
        Ok(bound)
    }

    /// Removes an NI: its connections are closed.
    pub(crate) fn del_ni(&self, nid: Nid) {
        let Some(ni) = self.nis.write().remove(&nid) else {
            return;
        };
        ni.deleted.store(true, Ordering::Release);
        for l in &ni.listeners {
            let mut listeners = self.listeners.lock();
            if l.users.fetch_sub(1, Ordering::AcqRel) == 1 {
                l.stop.store(true, Ordering::Release);
                listeners.retain(|_, x| !Arc::ptr_eq(x, l));
                drop(listeners);
                let _ = l.waker.wake();
                // An NI added again on this address binds it anew.
                if l.closed.1.recv_timeout(Duration::from_secs(2)).is_err() {
                    tracing::warn!(target: TARGET, addr = %l.addr,
                        "the acceptor of a deleted NI has not closed its socket yet");
                }
            }
        }
        let conns: Vec<Arc<Conn>> = ni
            .peers
            .lock()
            .values()
            .flat_map(|p| p.refs.values().cloned())
            .collect();
        for c in conns {
            self.close_conn(&c, "local NI deleted");
        }
    }

    pub(crate) fn ni(&self, nid: Nid) -> Option<Arc<SockNi>> {
        self.nis.read().get(&nid).cloned()
    }

    /// The connections from local NI `local` to `peer`, by type name
    /// (`CONTROL`, `BULK_IN`, `BULK_OUT`).
    pub(crate) fn peer_conns(&self, local: Nid, peer: Nid) -> Vec<ConnType> {
        let Some(ni) = self.ni(local) else {
            return Vec::new();
        };
        let peers = ni.peers.lock();
        peers
            .get(&peer)
            .map(|p| p.conns.conns().map(|(_, t)| t).collect())
            .unwrap_or_default()
    }

    pub(crate) fn ni_for_connreq(&self, nid: Nid) -> Option<Arc<SockNi>> {
        self.ni(nid)
    }

    pub(crate) fn local_nids(&self) -> Vec<Nid> {
        self.nis.read().keys().copied().collect()
    }

    pub(crate) fn listen_addr(&self, nid: Nid) -> Option<SocketAddr> {
        self.ni(nid).and_then(|n| n.listen)
    }

    pub(crate) fn set_peer_addr(&self, nid: Nid, addr: SocketAddr) {
        self.peer_addrs.write().insert(nid, addr);
    }

    /// Where to connect to `peer` for a connection of type `ctype`: a
    /// CONTROL connection at `accept_port`, the others at
    /// `accept_port_bulk` (the same unless set), as Lustre's
    /// `lnet_connect`. An address given for the peer
    /// ([`SockLnd::set_peer_addr`]) serves every type.
    pub(crate) fn peer_addr(&self, peer: Nid, ctype: ConnType) -> Option<SocketAddr> {
        if let Some(a) = self.peer_addrs.read().get(&peer) {
            return Some(*a);
        }
        let control = ctype == ConnType::Control;
        // One of our own NIs (a node talking to itself, as Lustre's does
        // through its LND): where it listens, whatever the port.
        if let Some(n) = self.ni(peer) {
            let at = if control { None } else { n.bulk_listen };
            if let Some(a) = at.or(n.listen) {
                return Some(a);
            }
        }
        let port = match self.cfg.accept_port_bulk {
            Some(p) if !control && p != 0 => p,
            _ if self.cfg.accept_port == 0 => colibri_lnet::socklnd::acceptor::DEFAULT_ACCEPT_PORT,
            _ => self.cfg.accept_port,
        };
        Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(peer.addr()),
            port,
        )))
    }

    pub(crate) fn close_reasons(&self) -> Vec<String> {
        self.close_log.lock().iter().cloned().collect()
    }

    /// Logs why a connection (or a handshake) ended.
    pub(crate) fn log_close(&self, what: String) {
        tracing::info!(target: TARGET, "{what}");
        let mut l = self.close_log.lock();
        if l.len() == CLOSE_LOG {
            l.pop_front();
        }
        l.push_back(what);
    }

    /// `lnetctl net set --conns-per-peer`: the NI `nid`'s (every NI's with
    /// `None`) connections per peer, for peers met from now on (0: the
    /// runtime's default); how many NIs were set.
    /// The dead-socket timeout (`ksocknal_timeout`): `sock_timeout`, or
    /// LNet's `lnd_timeout` while it is 0. Read at each use, so a change
    /// counts from the next check on.
    pub(crate) fn sock_timeout(&self) -> Duration {
        match self.sock_timeout.load(Ordering::Relaxed) {
            0 => Duration::from_secs(self.lnd_timeout.load(Ordering::Relaxed)),
            s => Duration::from_secs(s.into()),
        }
    }

    /// `sock_timeout` as set (0: LNet's `lnd_timeout`).
    pub(crate) fn sock_timeout_setting(&self) -> u32 {
        self.sock_timeout.load(Ordering::Relaxed)
    }

    /// `lnetctl net set --net tcp --lnd-timeout S`.
    pub(crate) fn set_sock_timeout(&self, secs: u32) {
        self.sock_timeout.store(secs, Ordering::Relaxed);
    }

    /// LNet's `lnd_timeout` changed (a new transaction timeout or retry
    /// count).
    pub(crate) fn note_lnd_timeout(&self, t: Duration) {
        self.lnd_timeout
            .store(t.as_secs().max(1), Ordering::Relaxed);
    }

    pub(crate) fn set_conns_per_peer(&self, nid: Option<Nid>, value: u32) -> usize {
        let value = if value == 0 {
            self.cfg.conns_per_peer
        } else {
            value
        };
        let nis = self.nis.read();
        let mut n = 0;
        for ni in nis
            .values()
            .filter(|ni| nid.is_none_or(|x| x == ni.local.nid))
        {
            ni.conns_per_peer.store(value, Ordering::Relaxed);
            n += 1;
        }
        n
    }

    fn new_peer(&self, conns_per_peer: u32, nid: Nid, now: Time) -> Peer {
        Peer {
            conns: PeerConns::new(nid, conns_per_peer),
            refs: KeyedMap::default(),
            reconnect: Reconnect::new(self.cfg.tun.min_reconnect(), self.cfg.tun.max_reconnect()),
            keepalive: Keepalive::new(self.cfg.keepalive, now),
            pending: VecDeque::new(),
            connecting: false,
            active: false,
        }
    }

    pub(crate) fn new_conn_id(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn pick_sched(&self) -> usize {
        self.next_sched.fetch_add(1, Ordering::Relaxed) % self.scheds.len()
    }

    pub(crate) fn sched(&self, i: usize) -> &SchedHandle {
        &self.scheds[i % self.scheds.len()]
    }

    /// Puts a message on a connection; true if the queue was empty (its
    /// scheduler, or the caller, must start writing).
    fn post(conn: &Conn, item: TxItem, now: Time) -> bool {
        let len = item.wire_len();
        let was_empty = {
            let mut q = conn.txq.lock();
            let e = q.is_empty();
            q.push_back(item);
            e
        };
        conn.queued_bytes.fetch_add(len, Ordering::Relaxed);
        conn.last_post.store(now.as_nanos(), Ordering::Relaxed);
        if was_empty && !conn.tx_busy.load(Ordering::Acquire) {
            conn.last_tx.store(now.as_nanos(), Ordering::Relaxed);
        }
        was_empty
    }

    /// Has the connection's scheduler write what is queued.
    fn kick(&self, conn: &Conn) {
        self.sched(conn.sched).send(SchedCmd::Kick(conn.id));
    }

    /// Places `item` on the best connection of `p` and wakes its
    /// scheduler if the connection was idle, or gives the item back.
    #[allow(clippy::result_large_err)]
    fn place(&self, p: &Peer, item: TxItem, now: Time) -> Result<(), TxItem> {
        if let Some(c) = Self::place_idle(p, item, now, self.cfg.tun.min_bulk)? {
            self.kick(&c);
        }
        Ok(())
    }

    /// Places `item` on the best connection of `p`; the connection if it
    /// was idle (someone must start writing), or the item back.
    #[allow(clippy::result_large_err)]
    fn place_idle(
        p: &Peer,
        item: TxItem,
        now: Time,
        min_bulk: u32,
    ) -> Result<Option<Arc<Conn>>, TxItem> {
        let chosen = p.conns.choose(item.kind(), min_bulk, |id| {
            p.refs.get(&id).map(|c| c.load()).unwrap_or_default()
        });
        match chosen.and_then(|id| p.refs.get(&id)) {
            Some(c) if !c.closing.load(Ordering::Acquire) => {
                Ok(Self::post(c, item, now).then(|| Arc::clone(c)))
            }
            _ => Err(item),
        }
    }

    /// Writes what an idle connection has queued from the calling thread
    /// (an application's, or a scheduler answering on another
    /// connection), as far as the socket takes it, instead of waking the
    /// connection's scheduler for it: a message to an idle peer then
    /// costs no thread hand-off, as a write to a socket does not. Only
    /// when nobody else is writing (the writer lock is free and no
    /// message is half written); a message the socket could not take
    /// whole is handed to the scheduler, which finishes it first. Called
    /// without the peer table's lock. Completions go to `done`.
    fn write_inline(&self, s: &Shared, conn: &Arc<Conn>, done: &mut Vec<Input>, now: Time) {
        const MOST: usize = 8;
        let Some(mut w) = conn.writer.try_lock() else {
            // Someone writes: it looks at the queue again when it stops.
            return self.kick(conn);
        };
        let Some(stream) = w.as_mut() else {
            drop(w);
            return self.kick(conn);
        };
        if conn.tx_busy.swap(true, Ordering::AcqRel) {
            // The scheduler has a message half written.
            drop(w);
            return self.kick(conn);
        }
        let csum = self.cfg.tun.enable_csum;
        let mut left = MOST;
        loop {
            let item = if left == 0 {
                None
            } else {
                conn.txq.lock().pop_front()
            };
            let Some(item) = item else {
                if left > 0 {
                    conn.tx_busy.store(false, Ordering::Release);
                }
                break;
            };
            left -= 1;
            let Some(mut t) = sched::start_tx(s, csum, item, done, conn) else {
                continue;
            };
            match sched::write_tx(stream, &mut t, s, conn, now) {
                Ok(true) => sched::finish_tx(s, conn, &t, done),
                Ok(false) => {
                    *conn.handoff.lock() = Some(t);
                    drop(w);
                    return self.kick(conn);
                }
                Err(why) => {
                    *conn.handoff.lock() = Some(t);
                    drop(w);
                    self.sched(conn.sched)
                        .send(SchedCmd::CloseWrite(conn.id, why));
                    return;
                }
            }
        }
        drop(w);
        // More came while we wrote (its poster found us writing), or we
        // stopped at MOST: the scheduler carries on.
        if !conn.txq.lock().is_empty() {
            self.kick(conn);
        }
    }

    /// Moves waiting messages onto connections.
    fn flush_pending(&self, p: &mut Peer, now: Time) {
        let mut keep = VecDeque::new();
        while let Some(item) = p.pending.pop_front() {
            if let Err(item) = self.place(p, item, now) {
                keep.push_back(item);
            }
        }
        p.pending = keep;
    }

    /// Whether a message for `p` that no connection can carry now may wait
    /// for one (Lustre queues it on the peer only then): a connection is
    /// being made (or a retry after a lost race is scheduled), the peer
    /// is connecting to us, or an attempt may start at once (the reaper
    /// starts it if the connection daemons were busy).
    fn connection_coming(p: &Peer, now: Time) -> bool {
        p.connecting
            || !p.conns.may_connect()
            || p.reconnect.races_lost() > 0
            || p.reconnect.may_connect(now)
    }

    /// Queues an active connection job for `peer` unless one is running.
    fn start_connect(&self, ni: &Arc<SockNi>, peer_nid: Nid, p: &mut Peer, now: Time) {
        if p.connecting || !p.reconnect.may_connect(now) || !p.conns.may_connect() {
            return;
        }
        if p.conns.next_conn_type().is_none() {
            return;
        }
        p.connecting = true;
        p.active = true;
        p.conns.set_connecting(true);
        if self
            .connd_tx
            .try_send(ConndJob::Connect(ni.clone(), peer_nid))
            .is_err()
        {
            // Full or stopped: the reaper tries again.
            p.connecting = false;
            p.conns.set_connecting(false);
        }
    }

    /// A handshaken connection, as the connd saw it, is admitted or not.
    /// Returns the registered connection when it is kept.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit(
        &self,
        ni: &Arc<SockNi>,
        peer_nid: Nid,
        ctype: ConnType,
        incarnation: u64,
        active: bool,
        loopback: bool,
        now: Time,
    ) -> Result<Arc<Conn>, colibri_lnet::socklnd::Refusal> {
        use colibri_lnet::socklnd::{Admission, Candidate};
        let id = self.new_conn_id();
        let mut to_close = Vec::new();
        let r = {
            let mut peers = ni.peers.lock();
            let p = peers.entry(peer_nid).or_insert_with(|| {
                self.new_peer(ni.conns_per_peer.load(Ordering::Relaxed), peer_nid, now)
            });
            let adm = p.conns.admit(
                ni.nid,
                Candidate {
                    id,
                    conn_type: ctype,
                    incarnation,
                    active,
                    loopback,
                },
            );
            match adm {
                Admission::Accepted => {
                    let conn = Arc::new(Conn {
                        id,
                        ni: ni.nid,
                        peer: peer_nid,
                        ctype,
                        sched: self.pick_sched(),
                        txq: Mutex::new(VecDeque::new()),
                        queued_bytes: AtomicU64::new(0),
                        last_post: AtomicU64::new(0),
                        last_rx: AtomicU64::new(now.as_nanos()),
                        last_tx: AtomicU64::new(now.as_nanos()),
                        tx_busy: AtomicBool::new(false),
                        rx_busy: AtomicBool::new(false),
                        closing: AtomicBool::new(false),
                        writer: Mutex::new(None),
                        handoff: Mutex::new(None),
                    });
                    p.refs.insert(id, conn.clone());
                    p.keepalive.on_alive(now);
                    if active {
                        p.reconnect.on_success();
                    }
                    Ok(conn)
                }
                Admission::Refused { reason, close } => {
                    for c in close {
                        if let Some(conn) = p.refs.remove(&c) {
                            to_close.push(conn);
                        }
                    }
                    Err(reason)
                }
            }
        };
        for c in to_close {
            self.close_conn(&c, "peer rebooted (new incarnation)");
        }
        r
    }

    /// After a connection's reply went out: its scheduler takes it, and
    /// waiting messages move onto it.
    pub(crate) fn activate(
        &self,
        ni: &Arc<SockNi>,
        conn: &Arc<Conn>,
        stream: std::net::TcpStream,
        fr: FrameReceiver,
        now: Time,
    ) {
        if let Some(s) = self.shared.upgrade() {
            add(&s.counters.conns_established, 1);
        }
        self.sched(conn.sched)
            .send(SchedCmd::Add(conn.clone(), Box::new(stream), Box::new(fr)));
        let mut peers = ni.peers.lock();
        if let Some(p) = peers.get_mut(&conn.peer) {
            self.flush_pending(p, now);
        }
    }

    /// Asks the connection's scheduler to close it.
    pub(crate) fn close_conn(&self, c: &Conn, reason: &str) {
        if !c.closing.swap(true, Ordering::AcqRel) {
            self.sched(c.sched)
                .send(SchedCmd::Close(c.id, reason.to_owned()));
        }
    }

    /// A connection is gone: it leaves its peer. Returns what was still
    /// queued on it, and whether the peer is now without a connection and
    /// none is being made (`ksocknal_peer_failed`: LNet is told the peer
    /// NI is down).
    pub(crate) fn forget_conn(&self, c: &Conn) -> (VecDeque<TxItem>, bool) {
        let mut lost = false;
        if let Some(ni) = self.ni(c.ni) {
            let mut peers = ni.peers.lock();
            if let Some(p) = peers.get_mut(&c.peer) {
                p.conns.remove(c.id);
                p.refs.remove(&c.id);
                lost = p.refs.is_empty() && !p.connecting;
            }
        }
        let q = std::mem::take(&mut *c.txq.lock());
        c.queued_bytes.store(0, Ordering::Relaxed);
        (q, lost)
    }

    /// The end of an active connection job (success or failure).
    pub(crate) fn connect_done(
        &self,
        s: &Shared,
        ni: &Arc<SockNi>,
        peer_nid: Nid,
        failure: Option<(SocketError, bool)>,
        now: Time,
    ) -> Vec<Input> {
        let mut inputs = Vec::new();
        let mut peers = ni.peers.lock();
        let Some(p) = peers.get_mut(&peer_nid) else {
            return inputs;
        };
        p.connecting = false;
        p.conns.set_connecting(false);
        match failure {
            Some((err, lost_race)) => {
                if lost_race {
                    p.reconnect.on_lost_race(now);
                } else {
                    p.reconnect.on_failure(now);
                }
                if p.refs.is_empty() && !lost_race {
                    // Nothing can carry the waiting messages, and LNet
                    // hears that the peer NI is down (ksocknal_peer_failed).
                    inputs.push(Input::Notify {
                        ni: ni.nid,
                        peer: peer_nid,
                        alive: false,
                    });
                    let status = TxFailure::Queued(err).health_status();
                    for item in p.pending.drain(..) {
                        if let Some(id) = item.id {
                            inputs.push(Input::TxDone(id, health_error(status)));
                        }
                    }
                }
                if !p.pending.is_empty() || (p.active && !p.refs.is_empty()) {
                    // Try again when the back-off ends (the reaper's next
                    // look is then, not at its next tick).
                    s.tick_at(p.reconnect.next_attempt());
                }
            }
            None => self.flush_pending(p, now),
        }
        inputs
    }

    /// A peer whose job should continue opening its typed connections.
    pub(crate) fn next_type(&self, ni: &SockNi, peer_nid: Nid) -> Option<ConnType> {
        let peers = ni.peers.lock();
        let p = peers.get(&peer_nid)?;
        if !p.conns.may_connect() {
            return None;
        }
        p.conns.next_conn_type()
    }

    /// Notes a peer's incarnation from a refusal; returns connections to close.
    pub(crate) fn observe_incarnation(&self, ni: &SockNi, peer_nid: Nid, inc: u64) {
        let to_close: Vec<Arc<Conn>> = {
            let mut peers = ni.peers.lock();
            let Some(p) = peers.get_mut(&peer_nid) else {
                return;
            };
            match p.conns.observe_incarnation(inc) {
                Ok(()) => Vec::new(),
                Err(ids) => ids.iter().filter_map(|i| p.refs.remove(i)).collect(),
            }
        };
        for c in to_close {
            self.close_conn(&c, "peer rebooted (new incarnation)");
        }
    }

    fn all_nis(&self) -> Vec<Arc<SockNi>> {
        self.nis.read().values().cloned().collect()
    }

    /// The link watch (socklnd's netdev and inetaddr notifiers, from the
    /// kernel's link events and the interface table read on each tick;
    /// see [`link`]): an NI whose link went down or came back is reported
    /// to LNet (`lnet_set_link_fatal_state`).
    fn check_links(&self, s: &Shared) {
        let _order = self.link_watch.lock();
        let mut inputs = Vec::new();
        self.watch_links(&mut inputs);
        if !inputs.is_empty() {
            s.run(inputs, |_, _| ());
        }
    }

    fn watch_links(&self, inputs: &mut Vec<Input>) {
        let ifaces = match link::read_ifaddrs() {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(target: "colibri_lnet_rt::sock", error = %e, "cannot read the interface table");
                return;
            }
        };
        let forced = self.cfg.link_down_ips.lock().clone();
        for ni in self.all_nis() {
            let up = link::link_up(ni.link_ip, &ifaces) && !forced.contains(&ni.link_ip);
            if ni.link_up.swap(up, Ordering::AcqRel) != up {
                tracing::warn!(target: "colibri_lnet_rt::sock", nid = %ni.nid, ip = %ni.link_ip, up, "NI link state changed");
                inputs.push(Input::Link { ni: ni.nid, up });
            }
        }
    }

    pub(crate) fn send_noop(&self, ni: Nid, peer: Nid, h: KsockMsgHeader, now: Time) {
        let Some(ni) = self.ni(ni) else { return };
        let peers = ni.peers.lock();
        if let Some(p) = peers.get(&peer) {
            let _ = self.place(p, TxItem::noop(h, now), now);
        }
    }
}

impl Lnd for SockLnd {
    fn send(
        &self,
        s: &Shared,
        tx: Transmit,
        done: &mut Vec<Input>,
        now: Time,
    ) -> Result<(), HealthStatus> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(HealthStatus::LocalDropped);
        }
        let Some(ni) = self.ni(tx.from) else {
            tracing::debug!(target: TARGET, from = %tx.from, "transmit from an NI without a socket LND");
            return Err(HealthStatus::LocalDropped);
        };
        if tx.to.net() != tx.from.net() || tx.to.is_any() {
            return Err(TxFailure::NoConnection.health_status());
        }
        let peer_nid = tx.to;
        let item = TxItem::lnet(tx, now);
        let inline = item.wire_len() <= INLINE_MAX || !matches!(item.payload, Payload::Rx { .. });
        let idle = {
            let mut peers = ni.peers.lock();
            let p = peers.entry(peer_nid).or_insert_with(|| {
                self.new_peer(ni.conns_per_peer.load(Ordering::Relaxed), peer_nid, now)
            });
            match Self::place_idle(p, item, now, self.cfg.tun.min_bulk) {
                Ok(Some(c)) if !inline => {
                    self.kick(&c);
                    None
                }
                Ok(idle) => idle,
                Err(item) => {
                    self.start_connect(&ni, peer_nid, p, now);
                    if !Self::connection_coming(p, now) {
                        // `ksocknal_launch_packet`: no connection, none being
                        // made or accepted, and the last attempt failed too
                        // recently to try again: "No usable routes".
                        tracing::debug!(target: TARGET, peer = %peer_nid,
                            retry_at = %p.reconnect.next_attempt(),
                            "no usable connection (reconnection backing off)");
                        return Err(TxFailure::NoConnection.health_status());
                    }
                    p.pending.push_back(item);
                    None
                }
            }
        };
        if let Some(conn) = idle {
            self.write_inline(s, &conn, done, now);
        }
        Ok(())
    }

    fn withdraw(&self, w: Withdrawal) -> bool {
        let Some(ni) = self.ni(w.from) else {
            return false;
        };
        let mut peers = ni.peers.lock();
        let Some(p) = peers.get_mut(&w.to) else {
            return false;
        };
        if let Some(i) = p.pending.iter().position(|t| t.id == Some(w.id)) {
            p.pending.remove(i);
            return true;
        }
        // Queued on a connection behind others (the one being written has
        // left its queue).
        for c in p.refs.values() {
            let mut q = c.txq.lock();
            if let Some(i) = q.iter().position(|t| t.id == Some(w.id)) {
                if let Some(item) = q.remove(i) {
                    c.queued_bytes.fetch_sub(item.wire_len(), Ordering::Relaxed);
                }
                return true;
            }
        }
        false
    }

    fn resume(&self, _s: &Shared, rx: RxId, action: RxAction) -> bool {
        let Some((sched, conn)) = self.parked.lock().remove(&rx) else {
            return false;
        };
        self.sched(sched).send(SchedCmd::Resume(conn, rx, action));
        true
    }

    fn tick(&self, s: &Shared, now: Time) {
        let mut inputs = Vec::new();
        let timeout = self.sock_timeout();
        for ni in self.all_nis() {
            let mut close = Vec::new();
            {
                let mut peers = ni.peers.lock();
                for (peer_nid, p) in peers.iter_mut() {
                    // Keepalive: the latest news from any connection.
                    let last = p
                        .refs
                        .values()
                        .map(|c| c.last_rx.load(Ordering::Relaxed))
                        .max();
                    if let Some(last) = last {
                        p.keepalive.on_alive(Time::from_nanos(last));
                        if p.keepalive.poll(now) {
                            let item = TxItem::noop(KsockMsgHeader::keepalive(), now);
                            if self.place(p, item, now).is_ok() {
                                add(&s.counters.keepalives_sent, 1);
                            }
                        }
                    }
                    // Messages that waited too long for a connection.
                    let mut keep = VecDeque::new();
                    for item in p.pending.drain(..) {
                        if item.queued.saturating_add(timeout) <= now {
                            if let Some(id) = item.id {
                                inputs.push(Input::TxDone(
                                    id,
                                    health_error(TxFailure::Timeout.health_status()),
                                ));
                            }
                        } else {
                            keep.push_back(item);
                        }
                    }
                    p.pending = keep;
                    // Connections without progress.
                    for c in p.refs.values() {
                        let last_tx = Time::from_nanos(c.last_tx.load(Ordering::Relaxed));
                        let last_rx = Time::from_nanos(c.last_rx.load(Ordering::Relaxed));
                        let tx_stuck = (c.tx_busy.load(Ordering::Relaxed)
                            || c.queued_bytes.load(Ordering::Relaxed) > 0)
                            && last_tx.saturating_add(timeout) <= now;
                        let rx_stuck = c.rx_busy.load(Ordering::Relaxed)
                            && last_rx.saturating_add(timeout) <= now;
                        if tx_stuck || rx_stuck {
                            close.push((c.clone(), tx_stuck));
                        }
                    }
                    // (Re)connect for waiting messages, or complete the
                    // typed set we started.
                    let want = !p.pending.is_empty() || (p.active && !p.refs.is_empty());
                    if want {
                        self.start_connect(&ni, *peer_nid, p, now);
                    }
                }
                // Peers with nothing left (no connection, nothing waiting,
                // no back-off running) are forgotten, as Lustre frees an
                // idle peer_ni: a stream of handshakes from made-up NIDs
                // does not grow the table.
                peers.retain(|_, p| {
                    !(p.refs.is_empty()
                        && p.pending.is_empty()
                        && !p.connecting
                        && p.reconnect.may_connect(now))
                });
            }
            for (c, tx) in close {
                let what = if tx { "sending" } else { "receiving" };
                self.close_conn(&c, &format!("timed out {what} (sock_timeout {timeout:?})"));
            }
        }
        if !inputs.is_empty() {
            s.run(inputs, |_, _| ());
        }
        self.check_links(s);
    }

    fn shutdown(&self, s: &Shared) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        for w in self.poll_wakers.lock().iter() {
            let _ = w.wake();
        }
        for _ in 0..self.nconnds {
            let _ = self
                .connd_tx
                .send_timeout(ConndJob::Stop, Duration::from_secs(1));
        }
        for sc in &self.scheds {
            sc.send(SchedCmd::Stop);
        }
        let threads: Vec<JoinHandle<()>> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        // Messages still waiting for a connection.
        let mut inputs = Vec::new();
        for ni in self.all_nis() {
            for p in ni.peers.lock().values_mut() {
                for item in p.pending.drain(..) {
                    if let Some(id) = item.id {
                        inputs.push(Input::TxDone(id, health_error(HealthStatus::LocalDropped)));
                    }
                }
            }
        }
        if !inputs.is_empty() {
            s.run(inputs, |_, _| ());
        }
    }
}
