//! The conformance suite on the verbs RDMA transport, over loopback
//! addresses (TCP control on 127.0.0.1, RDMA on the device's own GID).
//!
//! Every case needs an RDMA device, so the cases are `#[ignore]`d: on a
//! machine without one they are listed as ignored; in the Soft-RoCE VM
//! (`.ci/run`, through `../shared/rdma-vm/run.sh --net lo`) they run with
//! `--include-ignored`. Four times: the default configuration (the engine
//! spins briefly, then arms the CQ and blocks; frames and small messages
//! travel as RDMA SENDs on the eager path), an engine that blocks at once
//! with queue pairs of 4 send slots and a 64-entry CQ, so that transfers
//! wait for send-queue room, completions must re-arm and wake it, and only
//! the first two connections of an engine get eager receive slots (the
//! others fall back to TCP), and the eager path turned off (every frame on
//! TCP, every message READ by its receiver), and every domain of the
//! binary on one shared engine thread (`RdmaEngine`). The second run also has
//! stalling peers (raw sockets speaking the control protocol), for the
//! cases that end operations in flight.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use colibri_bulk_rdma::wire::{BulkOp, Frame, QpInfo, Seg};
use colibri_bulk_rdma::{RdmaConfig, RdmaEngine, RdmaTransport};
use colibri_net::addr::InetAddr;
use colibri_net::{NetBufDesc, Transport};
use colibri_ut::{Factory, Staller};

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1);

struct Rdma(RdmaConfig);

/// `Rdma` with stalling peers.
struct Stalling(RdmaConfig);

impl Factory for Stalling {
    fn name(&self) -> &'static str {
        "rdma"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(RdmaTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        Rdma(self.0.clone()).addr()
    }
    fn unreachable_addr(&self) -> String {
        "127.0.0.1:1:1".to_string()
    }
    fn staller(&self) -> Option<Box<dyn Staller>> {
        Some(Box::<RawPeers>::default())
    }
}

/// Peers that stop half-way. A stalled transfer here is one whose RDMA
/// never gets an answer: the raw peer says HELLO with a queue pair number
/// that does not exist, so the transfer machine's READs of the "peer's"
/// memory are dropped by the device and retried (for 7 × 4.3 s with the
/// configuration's `qp_timeout` 20) until the transfer is deleted.
#[derive(Default)]
struct RawPeers {
    /// Listeners that never accept: the kernel completes the connection,
    /// and the HELLO never gets an answer.
    deaf: Vec<TcpListener>,
    /// Control connections that asked for a transfer and hold still.
    stalled: Vec<TcpStream>,
}

static XID: AtomicU64 = AtomicU64::new(1);

impl RawPeers {
    fn me() -> InetAddr {
        InetAddr::parse("127.0.0.1:9:77").unwrap()
    }

    /// Connects to the control listener of `to`, exchanges HELLOs (ours
    /// names a queue pair that does not exist), then sends `request`.
    fn request(&mut self, to: InetAddr, request: &Frame) {
        let mut s = TcpStream::connect(to.sock()).expect("connect to the transfer machine");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&to.ip.octets());
        let mut out = Vec::new();
        Frame::Hello(QpInfo {
            qpn: 0xff_ff00,
            psn: 0,
            gid,
            mtu: 5,
            rd_atom: 16,
            // No receive slots: the transfer machine sends everything on TCP.
            slots: 0,
        })
        .encode(&mut out);
        s.write_all(&out).expect("write HELLO");
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        loop {
            if let Some((Frame::Hello(_), _)) = Frame::decode(&got).expect("a valid answer") {
                break;
            }
            let n = s.read(&mut b).expect("read HELLO");
            assert!(n > 0, "no HELLO from the transfer machine");
            got.extend_from_slice(&b[..n]);
        }
        out.clear();
        request.encode(&mut out);
        s.write_all(&out).expect("write the request");
        self.stalled.push(s);
    }

    /// Segments of `len` bytes at addresses nobody will ever read.
    fn segs(len: usize) -> Vec<Seg> {
        vec![Seg {
            addr: 0x7000_0000,
            len: len as u32,
            rkey: 0x1234,
        }]
    }
}

impl Staller for RawPeers {
    fn deaf_peer(&mut self) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        self.deaf.push(l);
        format!("127.0.0.1:{port}:1")
    }

    fn stalled_message(&mut self, to: &str, len: usize) {
        let to = InetAddr::parse(to).unwrap();
        let f = Frame::Msg {
            xid: XID.fetch_add(1, Ordering::Relaxed),
            sender: Self::me(),
            receiver: to,
            len: len as u64,
            segs: Self::segs(len),
        };
        self.request(to, &f);
    }

    fn stalled_put(&mut self, desc: &NetBufDesc, len: usize) {
        let owner = InetAddr::parse(&desc.decode().unwrap().owner).unwrap();
        let f = Frame::Bulk {
            xid: XID.fetch_add(1, Ordering::Relaxed),
            op: BulkOp::Put,
            sender: Self::me(),
            receiver: owner,
            size: len as u64,
            desc: desc.as_bytes().to_vec(),
            segs: Self::segs(len),
        };
        self.request(owner, &f);
    }
}

impl Factory for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(RdmaTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        // Port 1 (tcpmux) has no listener: the control connection is
        // refused.
        "127.0.0.1:1:1".to_string()
    }
}

mod default_config {
    use super::*;
    colibri_ut::conformance_tests!(
        Rdma(RdmaConfig::default()),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}

mod blocking_small_queues_stalling_peers {
    use super::*;
    colibri_ut::conformance_tests!(
        Stalling(RdmaConfig {
            sq_depth: 4,
            cq_depth: 64,
            // A READ that gets no answer is retried for 7 x 4.3 s; a
            // deleted transfer gives its requests 5 s to retire before
            // the connection is fenced (which flushes them).
            qp_timeout: 20,
            abort_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(60),
            ..RdmaConfig::blocking()
        }),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}

mod eager_off {
    use super::*;
    colibri_ut::conformance_tests!(
        Rdma(RdmaConfig {
            eager_slots: 0,
            ..RdmaConfig::default()
        }),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}

/// One engine thread for every domain of the binary: both sides of each
/// case's pairs (and the cases running at the same time) are served by
/// the same thread, device context and completion queue.
fn engine() -> &'static RdmaEngine {
    static ENGINE: std::sync::OnceLock<RdmaEngine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| RdmaEngine::new(1, &RdmaConfig::default()).expect("an RDMA device"))
}

mod shared_engine {
    use super::*;
    colibri_ut::conformance_tests!(
        Rdma(RdmaConfig::shared(engine())),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}
