//! The conformance suite on the TCP transport over loopback, once with the
//! default configuration (I/O threads spin briefly, then block) and once
//! with I/O threads that block at once and small bulk chunks, so that every
//! transfer of the suite crosses several chunks.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use colibri_bulk_tcp::wire::{FLAG_LAST, Header, Opcode};
use colibri_bulk_tcp::{TcpAddr, TcpConfig, TcpEngine, TcpTransport};
use colibri_net::{NetBufDesc, QueueType, Transport};
use colibri_ut::{Factory, Staller};

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1);

struct Tcp(TcpConfig);

impl Factory for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(TcpTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        // Port 1 (tcpmux) is privileged and has no listener here: the
        // connection is refused.
        "127.0.0.1:1:1".to_string()
    }
    fn staller(&self) -> Option<Box<dyn Staller>> {
        Some(Box::<RawPeers>::default())
    }
}

/// Raw sockets speaking the transport's wire format, stopping half-way.
#[derive(Default)]
struct RawPeers {
    /// Listeners that never accept: the kernel takes the connection and
    /// buffers what it can, and then the sender is stuck.
    deaf: Vec<TcpListener>,
    /// Connections that sent half a frame and hold still.
    stalled: Vec<TcpStream>,
}

static XID: AtomicU64 = AtomicU64::new(1);

impl RawPeers {
    /// Connects to the listener of `to` and writes `frame` (a header and
    /// the part of the body it announces that is sent).
    fn send_partial(&mut self, to: TcpAddr, frame: &[u8]) {
        let mut s = TcpStream::connect(to.sock()).expect("connect to the transfer machine");
        s.write_all(frame).expect("write the partial frame");
        self.stalled.push(s);
    }

    fn me() -> TcpAddr {
        TcpAddr::parse("127.0.0.1:9:77").unwrap()
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
        let to = TcpAddr::parse(to).unwrap();
        let mut h = Header::new(
            Opcode::Msg,
            XID.fetch_add(1, Ordering::Relaxed),
            Self::me(),
            to,
        );
        h.total = len as u64;
        h.body_len = len as u32;
        let mut frame = h.encode().to_vec();
        frame.resize(frame.len() + len / 2, 0x5a);
        self.send_partial(to, &frame);
    }

    fn stalled_put(&mut self, desc: &NetBufDesc, len: usize) {
        let fields = desc.decode().unwrap();
        let to = TcpAddr::parse(&fields.owner).unwrap();
        let d = desc.as_bytes();
        let mut h = Header::new(
            Opcode::Put,
            XID.fetch_add(1, Ordering::Relaxed),
            Self::me(),
            to,
        );
        h.queue = QueueType::ActiveBulkSend.code();
        h.total = len as u64;
        h.desc_len = d.len() as u16;
        h.body_len = (d.len() + len) as u32;
        h.flags = FLAG_LAST;
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(d);
        frame.resize(frame.len() + len / 2, 0xa5);
        self.send_partial(to, &frame);
    }
}

mod default_config {
    use super::*;
    colibri_ut::conformance_tests!(Tcp(TcpConfig::default()));
}

/// One engine of two I/O threads for every domain of every test of this
/// module (the tests run in parallel: its threads serve them all).
fn engine() -> &'static TcpEngine {
    static ENGINE: std::sync::OnceLock<TcpEngine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| TcpEngine::new(2, &TcpConfig::default()).expect("engine threads"))
}

mod shared_engine {
    use super::*;
    colibri_ut::conformance_tests!(Tcp(TcpConfig::shared(engine())));
}

mod blocking_small_chunks {
    use super::*;
    colibri_ut::conformance_tests!(Tcp(TcpConfig {
        chunk: 1000,
        ..TcpConfig::blocking()
    }));
}
