//! The TCP transport's connection reader, end to end: each input becomes a
//! sequence of frames (headers with a correct checksum but arbitrary
//! fields, real or garbage descriptors, arbitrary bodies) written to a live
//! transfer machine over a loopback socket, which is then half-closed. The
//! transfer machine must close or finish the connection without panicking
//! (a panic on its I/O thread aborts the fuzzer) and keep serving: every
//! 64 inputs a real message must still get through.
#![no_main]

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use colibri_bulk_tcp::wire::{HEADER_LEN, MAGIC, VERSION};
use colibri_bulk_tcp::{TcpAddr, TcpConfig, TcpTransport};
use colibri_net::checksum::crc32c;
use colibri_net::{
    BufVec, BufferCallbacks, Domain, QueueType, RecvParams, TmState, TransferMachine,
    ignore_tm_events,
};
use libfuzzer_sys::fuzz_target;

struct Target {
    _dom: Domain,
    tm: TransferMachine,
    addr: TcpAddr,
    /// Current descriptors of a passive receive and a passive send buffer.
    descs: Arc<Mutex<[Vec<u8>; 2]>>,
    received: Arc<AtomicU64>,
    probe: Mutex<(Domain, TransferMachine)>,
}

static T: LazyLock<Target> = LazyLock::new(|| {
    let xprt = TcpTransport::new(TcpConfig {
        chunk: 4096,
        ..TcpConfig::default()
    });
    let dom = Domain::new(&xprt).unwrap();
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start("127.0.0.1:0:1").unwrap();
    tm.wait_for_state(TmState::Started, Duration::from_secs(10)).unwrap();
    let addr = TcpAddr::parse(tm.ep().unwrap().addr()).unwrap();
    let descs: Arc<Mutex<[Vec<u8>; 2]>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let (d2, r2) = (descs.clone(), received.clone());
    // Every buffer goes back on its queue when it completes.
    let cbs = Arc::new(BufferCallbacks::new().on_all(move |tm, mut ev| {
        if ev.queue() == QueueType::MsgRecv && ev.is_ok() {
            r2.fetch_add(1, Ordering::SeqCst);
        }
        let Some(b) = ev.take_buffer() else { return };
        match ev.queue() {
            QueueType::MsgRecv => {
                let _ = tm.add_msg_recv(b, RecvParams::multi(64, 4));
            }
            QueueType::PassiveBulkRecv => {
                if let Ok((_, d)) = tm.add_passive_recv(b, None) {
                    d2.lock().unwrap()[0] = d.into_bytes();
                }
            }
            QueueType::PassiveBulkSend => {
                if let Ok((_, d)) = tm.add_passive_send(b, 10_000, None) {
                    d2.lock().unwrap()[1] = d.into_bytes();
                }
            }
            _ => {}
        }
    }));
    for _ in 0..8 {
        let b = dom.register(BufVec::new(2, 4096)).unwrap().with_callbacks(cbs.clone());
        tm.add_msg_recv(b, RecvParams::multi(64, 4)).unwrap();
    }
    let b = dom.register(BufVec::new(3, 5000)).unwrap().with_callbacks(cbs.clone());
    descs.lock().unwrap()[0] = tm.add_passive_recv(b, None).unwrap().1.into_bytes();
    let b = dom.register(BufVec::new(3, 5000)).unwrap().with_callbacks(cbs.clone());
    descs.lock().unwrap()[1] = tm.add_passive_send(b, 10_000, None).unwrap().1.into_bytes();
    let pdom = Domain::new(&xprt).unwrap();
    let ptm = pdom.tm_init(ignore_tm_events()).unwrap();
    ptm.start("127.0.0.1:0:2").unwrap();
    ptm.wait_for_state(TmState::Started, Duration::from_secs(10)).unwrap();
    Target {
        _dom: dom,
        tm,
        addr,
        descs,
        received,
        probe: Mutex::new((pdom, ptm)),
    }
});

static RUNS: AtomicU64 = AtomicU64::new(0);

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn byte(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn u32(&mut self) -> u32 {
        let b = self.take(4);
        let mut a = [0u8; 4];
        a[..b.len()].copy_from_slice(b);
        u32::from_le_bytes(a)
    }
}

fn frames(data: &[u8]) -> Vec<u8> {
    let t = &*T;
    let mut inp = Input(data);
    let mut out = Vec::new();
    while !inp.0.is_empty() && out.len() < 1 << 20 {
        let op = inp.byte();
        let mode = inp.byte();
        let desc = match mode % 4 {
            1 => t.descs.lock().unwrap()[0].clone(),
            2 => t.descs.lock().unwrap()[1].clone(),
            3 => inp.take(usize::from(inp.0.first().copied().unwrap_or(0))).to_vec(),
            _ => Vec::new(),
        };
        let data_len = (inp.u32() % 20_000) as usize;
        let body: Vec<u8> = inp.take(data_len).to_vec();
        let (offset, total, chunk) = (inp.u32() % 12_000, inp.u32() % 12_000, inp.u32() % 12_000);
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = VERSION;
        h[5] = op % 8;
        h[6] = if mode & 0x10 != 0 { inp.byte() } else { [0, 0, 0, 4, 0, 5, 0, 0][usize::from(op % 8)] };
        h[7] = mode >> 6;
        h[8..16].copy_from_slice(&u64::from(inp.byte() % 4).to_le_bytes());
        h[16..24].copy_from_slice(&u64::from(offset).to_le_bytes());
        h[24..32].copy_from_slice(&u64::from(total).to_le_bytes());
        h[32..36].copy_from_slice(&chunk.to_le_bytes());
        h[36..40].copy_from_slice(&((desc.len() + body.len()) as u32).to_le_bytes());
        h[40..42].copy_from_slice(&(desc.len() as u16).to_le_bytes());
        h[42..44].copy_from_slice(&u16::from(inp.byte() % 16).to_le_bytes());
        h[44..48].copy_from_slice(&[127, 0, 0, 1]);
        h[48..52].copy_from_slice(&9u32.to_le_bytes());
        h[52..54].copy_from_slice(&9u16.to_le_bytes());
        let to = if mode & 0x20 != 0 { TcpAddr { service: 7, ..t.addr } } else { t.addr };
        h[54..56].copy_from_slice(&to.port.to_le_bytes());
        h[56..60].copy_from_slice(&to.ip.octets());
        h[60..64].copy_from_slice(&to.service.to_le_bytes());
        let crc = crc32c(&h[..64]);
        h[64..68].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(&desc);
        out.extend_from_slice(&body);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let t = &*T;
    let bytes = frames(data);
    let mut s = TcpStream::connect(t.addr.sock()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // MSG_NOSIGNAL: the machine may close the connection before reading
    // everything, and the fuzzer's main does not ignore SIGPIPE.
    let sr = socket2::SockRef::from(&s);
    let mut at = 0;
    while at < bytes.len() {
        match sr.send_with_flags(&bytes[at..], libc::MSG_NOSIGNAL) {
            Ok(n) if n > 0 => at += n,
            _ => break,
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 65536];
    loop {
        match s.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                panic!("the transfer machine neither finished nor closed the connection")
            }
            Err(_) => break,
        }
    }
    if RUNS.fetch_add(1, Ordering::Relaxed) % 64 == 0 {
        // The machine still serves a well-formed peer.
        let before = t.received.load(Ordering::SeqCst);
        let p = t.probe.lock().unwrap();
        let ep = p.1.ep_create(&t.addr.to_string()).unwrap();
        let (cbs, ev) = colibri_net::event_channel(4);
        let mut b = p.0.register(BufVec::new(1, 8)).unwrap().with_callbacks(cbs);
        b.bufvec_mut().copy_in(0, b"probe!!!").unwrap();
        p.1.add_msg_send(b, &ep, 8).unwrap();
        let e = ev.recv_timeout(Duration::from_secs(10)).expect("probe send completes");
        assert!(e.is_ok(), "probe failed: {e:?}");
        assert!(t.received.load(Ordering::SeqCst) > before || t.tm.state() == TmState::Started);
    }
});
