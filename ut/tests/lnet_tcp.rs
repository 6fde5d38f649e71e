//! The conformance suite on the LNet transport over Lustre's socket LND:
//! two LNet nodes of this process on loopback addresses, the suite's
//! transfer machines alternately on one and the other, so that messages
//! and bulk cross real sockets. It runs twice: with the transport's
//! defaults, and in module `threads` with a delivery thread per transfer
//! machine (`LnetXprtConfig::thread_per_tm`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::Nid;
use colibri_lnet_rt::colibri_lnet::socklnd::frame::KSOCK_MSG_HDR_LEN;
use colibri_lnet_rt::colibri_lnet::socklnd::{
    AcceptPolicy, ConnReq, ConnType, Endian, Hello, KsockMsgHeader, KsockMsgType, LnetFrame,
};
use colibri_lnet_rt::colibri_lnet::wire::{Body, HEADER_LEN, Header, WireHandle};
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::addr::{
    CNT_ACTIVE, CNT_CTL, CNT_MSG, HDR_CTL, HDR_MSG, SEQ_MASK, hdr_data, match_bits,
};
use colibri_lnet_xprt::{LnetAddr, LnetTransport, LnetXprtConfig};
use colibri_net::{NetBufDesc, QueueType, Transport};
use colibri_ut::{Factory, Staller};

/// Two LNet nodes on `nids`, each knowing where the other listens, and a
/// transport over both, made on first use.
struct LnetTcp {
    nids: [&'static str; 2],
    /// Third octet of the loopback addresses the staller's peers use
    /// (`127.0.<octet>.n`), one per suite so that they never meet.
    stall_net: u8,
    thread_per_tm: bool,
    /// LNet peer discovery on the nodes (on by default).
    discovery: bool,
    xprt: OnceLock<LnetTransport>,
    next: AtomicU32,
}

impl LnetTcp {
    const fn new(nids: [&'static str; 2], stall_net: u8, thread_per_tm: bool) -> Self {
        Self {
            nids,
            stall_net,
            thread_per_tm,
            discovery: true,
            xprt: OnceLock::new(),
            next: AtomicU32::new(0),
        }
    }

    /// Raw peers of the nodes (the staller).
    fn raw_peers(&self) -> RawPeers {
        RawPeers {
            nodes: self.xprt().nodes().to_vec(),
            net: self.stall_net,
            deaf: Vec::new(),
            stalled: Vec::new(),
        }
    }

    /// The same without LNet peer discovery: a raw peer's requests are
    /// answered without pinging it first.
    const fn without_discovery(mut self) -> Self {
        self.discovery = false;
        self
    }

    fn xprt(&self) -> &LnetTransport {
        self.xprt.get_or_init(|| {
            let nodes: Vec<Lnet> = self
                .nids
                .iter()
                .map(|n| {
                    let mut cfg = LnetConfig::new(&[n.parse().unwrap()]);
                    cfg.accept_port = 0;
                    cfg.accept = AcceptPolicy::All;
                    cfg.node.transaction_timeout = Duration::from_secs(10);
                    cfg.node.retry_count = 1;
                    cfg.node.discovery = self.discovery;
                    Lnet::start(cfg).expect("LNet node")
                })
                .collect();
            Lnet::introduce(&nodes);
            let x = LnetXprtConfig::default().thread_per_tm(self.thread_per_tm);
            LnetTransport::new(nodes, x).expect("transport")
        })
    }
}

impl Factory for LnetTcp {
    fn name(&self) -> &'static str {
        "lnet"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.xprt().clone())
    }
    fn addr(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!(
            "{}:12345:{}:*",
            self.nids[(n % 2) as usize],
            20 + (n / 2) % 8
        )
    }
    fn unreachable_addr(&self) -> String {
        "10.255.255.1@tcp9:12345:30:1".into()
    }
    fn staller(&self) -> Option<Box<dyn Staller>> {
        Some(Box::new(self.raw_peers()))
    }
}

/// Peers made of raw sockets speaking the socket LND's protocol (the
/// acceptor's request, a V3 HELLO, `ksock_msg` frames), which stop
/// half-way and hold their sockets until dropped.
struct RawPeers {
    nodes: Vec<Lnet>,
    net: u8,
    /// Listeners that never accept: a node's connection attempt gets no
    /// HELLO back, so what it sends there waits in LNet.
    deaf: Vec<TcpListener>,
    /// Connections that sent half a message and hold still, and the NID
    /// they speak for.
    stalled: Vec<(TcpStream, Nid)>,
}

/// Host numbers of the staller's peers, so that every peer is a new NID.
static NEXT_PEER: AtomicU32 = AtomicU32::new(1);

impl RawPeers {
    /// A loopback NID no node uses yet, and its IP address.
    fn fresh_nid(&self) -> (Nid, [u8; 4]) {
        let n = NEXT_PEER.fetch_add(1, Ordering::Relaxed);
        // Hosts 1 to 254 of 127.<net>.<n / 254>.
        let ip = [127, self.net, (n / 254) as u8, (n % 254 + 1) as u8];
        let nid = format!("{}.{}.{}.{}@tcp", ip[0], ip[1], ip[2], ip[3])
            .parse()
            .unwrap();
        (nid, ip)
    }

    /// Connects to the node serving `to` as peer `me`, with a connection
    /// of type `ctype` (from our side), and completes the handshake.
    fn connect(&self, to: Nid, (me, ip): (Nid, [u8; 4]), ctype: ConnType) -> TcpStream {
        let at = self
            .nodes
            .iter()
            .find_map(|n| n.listen_addr(to))
            .expect("a node serves the address");
        // From the peer's own address: a connection from an unprivileged
        // port names a userspace peer by its source address, so peers
        // sharing 127.0.0.1 would be one peer to the node.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::from((ip, 0)).into()).unwrap();
        sock.connect(&at.into()).expect("connect to the node");
        let mut s: TcpStream = sock.into();
        s.write_all(&ConnReq::new(to).encode()).unwrap();
        let hello = Hello {
            src_nid: me,
            dst_nid: to,
            src_pid: 12345,
            dst_pid: 0,
            src_incarnation: 1,
            dst_incarnation: 0,
            conn_type: Some(ctype),
        };
        s.write_all(&hello.encode()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = [0u8; 56];
        s.read_exact(&mut answer).expect("the node's HELLO");
        let answer = Hello::decode(&answer).expect("a HELLO").hello;
        assert!(answer.conn_type.is_some(), "connection refused: {answer:?}");
        s
    }

    /// Connects to the machine at `to` as a new peer and writes the
    /// header of a PUT of `len` bytes to its portal with `bits` and
    /// `hdr`, then `payload` (all of the payload or part of it).
    fn put_to(&mut self, to: &LnetAddr, bits: u64, hdr: u64, len: usize, payload: &[u8]) {
        let me = self.fresh_nid();
        // A bulk-sized message travels on our BULK_OUT connection.
        let ctype = if len >= 1024 {
            ConnType::BulkOut
        } else {
            ConnType::Control
        };
        let mut s = self.connect(to.nid, me, ctype);
        s.write_all(&put_head(to, me.0, bits, hdr, len)).unwrap();
        s.write_all(payload).unwrap();
        self.stalled.push((s, me.0));
    }
}

/// The `ksock_msg` header and LNet header of a PUT of `len` bytes from
/// `me` to the machine at `to`.
fn put_head(to: &LnetAddr, me: Nid, bits: u64, hdr: u64, len: usize) -> Vec<u8> {
    let header = Header {
        dest_nid: to.nid,
        src_nid: me,
        dest_pid: to.pid,
        src_pid: 12345,
        payload_length: len as u32,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: bits,
            hdr_data: hdr,
            ptl_index: to.portal,
            offset: 0,
        },
    };
    LnetFrame::new(header).encode().to_vec()
}

/// Our peers' address: portal 30, TMID 1 of their NID.
const PEER_PORTAL: u32 = 30;
const PEER_TMID: u16 = 1;

impl Staller for RawPeers {
    fn deaf_peer(&mut self) -> String {
        let (nid, ip) = self.fresh_nid();
        let l = TcpListener::bind(SocketAddr::from((ip, 0))).unwrap();
        let at = l.local_addr().unwrap();
        for n in &self.nodes {
            n.set_peer_addr(nid, at);
        }
        self.deaf.push(l);
        format!("{nid}:12345:30:1")
    }

    /// An LNet message (1 MiB at most) sent as a transfer machine sends
    /// one, of which half the payload is written.
    fn stalled_message(&mut self, to: &str, len: usize) {
        let to = LnetAddr::parse(to).unwrap();
        let bits = match_bits(to.tmid.unwrap(), CNT_MSG);
        let hdr = hdr_data(HDR_MSG, PEER_PORTAL, PEER_TMID, 1);
        self.put_to(&to, bits, hdr, len, &vec![0x5a; len / 2]);
    }

    /// LNet reports a message when all of it arrived: the buffer does
    /// not show in use meanwhile (module `stalls` tests the deletion).
    fn shows_stalled_receives(&self) -> bool {
        false
    }

    fn stall_msg(&self) -> usize {
        colibri_lnet_rt::colibri_lnet::wire::LNET_MTU as usize
    }

    /// An active send stopped after its first step: the request for the
    /// passive buffer (control message REQUEST, which the passive machine
    /// accepts: its buffer is claimed and its GET of our MEs sent) and
    /// never the REPLY with the data, nor any answer.
    fn stalled_put(&mut self, desc: &NetBufDesc, len: usize) {
        self.request(desc, len);
    }
}

impl RawPeers {
    /// Sends the bulk handshake's REQUEST for the passive buffer of
    /// `desc`, as the active side of an active send of `len` bytes does,
    /// from a new peer; returns its xid.
    fn request(&mut self, desc: &NetBufDesc, len: usize) -> u64 {
        static XID: AtomicU32 = AtomicU32::new(1);
        let owner = LnetAddr::parse(&desc.decode().unwrap().owner).unwrap();
        let xid = u64::from(XID.fetch_add(1, Ordering::Relaxed));
        // REQUEST (src/ctl.rs, version 3): head, then queue, size, the
        // match bits of our (never attached) MEs and the descriptor.
        let d = desc.as_bytes();
        let mut ctl = b"CLNC".to_vec();
        ctl.extend_from_slice(&[3, 1, 0, 0]);
        ctl.extend_from_slice(&xid.to_le_bytes());
        ctl.extend_from_slice(&[QueueType::ActiveBulkSend.code(), 0, 0, 0, 0, 0, 0, 0]);
        ctl.extend_from_slice(&(len as u64).to_le_bytes());
        let mine = match_bits(PEER_TMID, CNT_ACTIVE | (xid << 8));
        ctl.extend_from_slice(&mine.to_le_bytes());
        ctl.extend_from_slice(&(d.len() as u16).to_le_bytes());
        ctl.extend_from_slice(d);
        let bits = match_bits(owner.tmid.unwrap(), CNT_CTL);
        let hdr = hdr_data(HDR_CTL, PEER_PORTAL, PEER_TMID, xid as u32 & SEQ_MASK);
        let n = ctl.len();
        self.put_to(&owner, bits, hdr, n, &ctl);
        xid
    }

    /// Reads what the node sends on the last connection until a control
    /// message of `kind` for `xid` comes; returns its bytes. The node must
    /// answer without pinging us first (no discovery).
    fn read_ctl(&mut self, kind: u8, xid: u64) -> Vec<u8> {
        loop {
            let (header, payload) = self.read_lnet();
            if matches!(header.body, Body::Put { .. })
                && payload.len() >= 16
                && &payload[..4] == b"CLNC"
                && payload[5] == kind
                && payload[8..16] == xid.to_le_bytes()
            {
                return payload;
            }
        }
    }

    /// The next LNet message the node sends on the last connection (not
    /// a keepalive): its header and payload.
    fn read_lnet(&mut self) -> (Header, Vec<u8>) {
        let (s, _) = self.stalled.last_mut().unwrap();
        loop {
            let mut k = [0u8; KSOCK_MSG_HDR_LEN];
            s.read_exact(&mut k).expect("a frame from the node");
            let ksock = KsockMsgHeader::decode(&k, Endian::Little).unwrap();
            if ksock.msg_type == KsockMsgType::Noop {
                continue;
            }
            let mut h = [0u8; HEADER_LEN];
            s.read_exact(&mut h).unwrap();
            let header = Header::decode(&h).unwrap();
            let mut payload = vec![0u8; header.payload_length as usize];
            s.read_exact(&mut payload).unwrap();
            return (header, payload);
        }
    }

    /// An active send of `len` bytes into the passive buffer of `desc`,
    /// as far as half of its data: the REQUEST, the node's GET of our
    /// MEs, then the REPLY's header and half its data, on the same
    /// connection. Returns the request's xid.
    fn half_bulk_reply(&mut self, desc: &NetBufDesc, len: usize) -> u64 {
        let owner = LnetAddr::parse(&desc.decode().unwrap().owner).unwrap();
        let xid = self.request(desc, len);
        let return_wmd = loop {
            let (header, payload) = self.read_lnet();
            assert!(
                payload.get(..4) != Some(b"CLNC".as_slice()),
                "request refused: {payload:?}"
            );
            if let Body::Get { return_wmd, .. } = header.body {
                break return_wmd;
            }
        };
        let (s, me) = self.stalled.last_mut().unwrap();
        let header = Header {
            dest_nid: owner.nid,
            src_nid: *me,
            dest_pid: owner.pid,
            src_pid: 12345,
            payload_length: len as u32,
            body: Body::Reply {
                dst_wmd: return_wmd,
            },
        };
        s.write_all(&LnetFrame::new(header).encode()).unwrap();
        s.write_all(&vec![0xa5; len / 2]).unwrap();
        xid
    }
}

static DEFAULT: LnetTcp = LnetTcp::new(["127.0.42.1@tcp", "127.0.42.2@tcp"], 43, false);

colibri_ut::conformance_tests!(DEFAULT);

/// The same suite with a delivery thread per transfer machine.
mod threads {
    static THREADS: super::LnetTcp =
        super::LnetTcp::new(["127.0.42.3@tcp", "127.0.42.4@tcp"], 44, true);

    colibri_ut::conformance_tests!(THREADS);
}

/// A receive whose sender stalls half-way through its message, which the
/// suite's case `del_ends_a_stalled_receive` cannot reach over LNet: LNet
/// reports a message only once all of it arrived, so the buffer never
/// shows in use while the bytes come. `del` (and a stop with abort)
/// unlinks the MD, finds it busy and completes the buffer at once,
/// `Cancelled`, without waiting for the socket LND to give the stalled
/// connection up (`sock_timeout`, 50 s); the LND drops the rest of that
/// payload, and the connection goes on.
mod stalls {
    use std::io::Write;
    use std::thread;
    use std::time::{Duration, Instant};

    use colibri_lnet_xprt::LnetAddr;
    use colibri_lnet_xprt::addr::{CNT_MSG, HDR_MSG, hdr_data, match_bits};
    use colibri_net::{NetError, QueueType, RecvParams};
    use colibri_ut::{Node, Staller};

    use super::{PEER_PORTAL, PEER_TMID, put_head};

    static STALLS: super::LnetTcp =
        super::LnetTcp::new(["127.0.42.5@tcp", "127.0.42.6@tcp"], 45, false);

    const LEN: usize = 1 << 20;

    /// Posts a receive buffer on `a`, has a raw peer stall half-way
    /// through a message into it, and returns the buffer's token once the
    /// payload had time to start arriving.
    fn stalled(a: &Node, st: &mut dyn Staller) -> colibri_net::BufToken {
        let t =
            a.tm.add_msg_recv(a.buf(LEN), RecvParams::default())
                .unwrap();
        st.stalled_message(&a.addr, LEN);
        thread::sleep(Duration::from_millis(300));
        t
    }

    fn cancelled_within(ev: &colibri_net::BufferEvent, t0: Instant) {
        assert!(
            ev.error().is_some_and(|e| *e == NetError::Cancelled),
            "{ev:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    /// Deletes `t` of `queue` on `a`: its one event comes within 2 s,
    /// `Cancelled`, and nothing follows.
    fn del_cancels_at_once(a: &Node, t: colibri_net::BufToken, queue: QueueType) {
        let t0 = Instant::now();
        assert!(a.tm.del(t).unwrap());
        let ev = a.next_event_on(queue);
        cancelled_within(&ev, t0);
        drop(ev);
        a.expect_quiet();
    }

    #[test]
    fn del_ends_a_receive_whose_sender_stalled() {
        let mut st = STALLS.raw_peers();
        let a = Node::start(&STALLS);
        let b = Node::start(&STALLS);
        let t = stalled(&a, &mut st);
        del_cancels_at_once(&a, t, QueueType::MsgRecv);
        // The machine still receives.
        a.tm.add_msg_recv(a.buf(4096), RecvParams::default())
            .unwrap();
        let ep = b.ep(&a.addr);
        b.tm.add_msg_send(b.buf_with(&[7; 100], 0), &ep, 100)
            .unwrap();
        assert!(b.next_event_on(QueueType::MsgSend).error().is_none());
        let got = a.next_event_on(QueueType::MsgRecv);
        assert_eq!(got.message().unwrap(), vec![7; 100]);
        drop((got, ep));
        // The stalled sender goes on: the rest of the message whose buffer
        // went away (dropped), then a new message on the same connection,
        // which arrives.
        a.tm.add_msg_recv(a.buf(4096), RecvParams::default())
            .unwrap();
        let to = LnetAddr::parse(&a.addr).unwrap();
        let (s, me) = st.stalled.last_mut().unwrap();
        s.write_all(&vec![0x5a; LEN - LEN / 2]).unwrap();
        let bits = match_bits(to.tmid.unwrap(), CNT_MSG);
        let hdr = hdr_data(HDR_MSG, PEER_PORTAL, PEER_TMID, 2);
        s.write_all(&put_head(&to, *me, bits, hdr, 1000)).unwrap();
        s.write_all(&[9; 1000]).unwrap();
        let got = a.next_event_on(QueueType::MsgRecv);
        assert_eq!(got.message().unwrap(), vec![9; 1000]);
        drop(got);
        a.shutdown();
        b.shutdown();
    }

    /// Sends to a deaf peer (a listener that never answers the
    /// handshake) from a node of `factory`, and cancels the send: it ends
    /// `Cancelled` at once, not at `handshake_timeout` (10 s).
    fn cancel_of_a_send_to_a_deaf_peer_ends_at_once(factory: &'static super::LnetTcp) {
        let mut st = factory.raw_peers();
        let a = Node::start(factory);
        let ep = a.ep(&st.deaf_peer());
        let t =
            a.tm.add_msg_send(a.buf_with(&[3; 4096], 0), &ep, 4096)
                .unwrap();
        thread::sleep(Duration::from_millis(200));
        assert!(a.tm.buffer_state(t).is_some_and(|s| s.in_use));
        del_cancels_at_once(&a, t, QueueType::MsgSend);
        drop(ep);
        a.shutdown();
    }

    /// The send waits in LNet for the peer's discovery: a cancel takes it
    /// back (it was never sent).
    #[test]
    fn cancel_ends_a_send_waiting_for_its_peer_at_once() {
        cancel_of_a_send_to_a_deaf_peer_ends_at_once(&STALLS);
    }

    /// Nodes without discovery, so that a raw peer's bulk request is
    /// answered at once.
    static NO_DISCOVERY: super::LnetTcp =
        super::LnetTcp::new(["127.0.42.7@tcp", "127.0.42.8@tcp"], 46, false).without_discovery();

    /// Without discovery the same send waits in the socket LND for its
    /// connection: a cancel takes it back from there, at once too.
    #[test]
    fn cancel_ends_a_send_waiting_for_its_connection_at_once() {
        cancel_of_a_send_to_a_deaf_peer_ends_at_once(&NO_DISCOVERY);
    }

    /// A passive buffer whose requester stopped half-way through the
    /// REPLY to its GET: `del` ends it at once, `Cancelled`, and the
    /// requester is told (an ABORT for its request).
    #[test]
    fn del_ends_a_passive_transfer_whose_data_stalled() {
        let mut st = NO_DISCOVERY.raw_peers();
        let a = Node::start(&NO_DISCOVERY);
        let (t, d) = a.tm.add_passive_recv(a.buf(LEN), None).unwrap();
        let xid = st.half_bulk_reply(&d, LEN);
        thread::sleep(Duration::from_millis(300));
        assert!(a.tm.buffer_state(t).is_some_and(|s| s.in_use));
        del_cancels_at_once(&a, t, QueueType::PassiveBulkRecv);
        st.read_ctl(3, xid);
        a.shutdown();
    }

    #[test]
    fn stop_with_abort_ends_a_receive_whose_sender_stalled() {
        let mut st = STALLS.raw_peers();
        let a = Node::start(&STALLS);
        stalled(&a, &mut st);
        let t0 = Instant::now();
        let evs = a.stop(true);
        assert_eq!(evs.len(), 1, "exactly one completion: {evs:?}");
        cancelled_within(&evs[0], t0);
        drop(evs);
        a.shutdown();
    }
}
