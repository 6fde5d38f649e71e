//! `colibri-tcp-peer`: a small peer process for the two-process tests and
//! for trying the TCP transport by hand.
//!
//! ```text
//! colibri-tcp-peer serve ADDR MAX_SECS
//!     Starts a transfer machine at ADDR, prints "READY <address>", and
//!     answers commands sent to it as messages (see below) until it gets
//!     "Q" or MAX_SECS pass. Then it stops, checks that every buffer it
//!     added got exactly one completion, prints
//!     "DONE adds=A completions=C failed=F", and exits 0 (1 if not).
//! colibri-tcp-peer put-loop SERVER MAX_SECS
//!     Starts a transfer machine, says "H" to SERVER, and writes a pattern
//!     with an active bulk send into every passive receive buffer SERVER
//!     names in "D" messages, until killed or MAX_SECS pass.
//! ```
//!
//! Commands (first byte of a message, little-endian numbers):
//! `E<bytes>` echo back as `e<bytes>`; `S<u32 len><u64 seed>` offer a
//! passive send buffer holding pattern(seed), answer `D<descriptor>`;
//! `R<u32 len>` offer a passive receive buffer, answer `D<descriptor>`,
//! then `C<u32 len><u32 crc>` (or `F<error>`) when it completes;
//! `P<u64 seed><u32 len><descriptor>` write pattern(seed) into the
//! sender's passive buffer, answer `K` (or `F<error>`); `G<u32
//! len><descriptor>` read the sender's passive buffer, answer
//! `C<u32 len><u32 crc>` (or `F<error>`); `Q` quit.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::checksum::crc32c;
use colibri_net::{
    BufToken, BufVec, BufferEvent, Domain, EndPoint, NetBufDesc, QueueType, RecvParams, TmState,
    TransferMachine, event_channel, ignore_tm_events,
};
use colibri_wire::{Reader, Short};

/// Byte `i` of pattern `seed` (splitmix64), as the tests compute it.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Peer {
    dom: Domain,
    tm: TransferMachine,
    events: colibri_net::EventReceiver,
    cbs: Arc<colibri_net::BufferCallbacks>,
    /// Add → number of final completions.
    ledger: HashMap<BufToken, u32>,
    /// Who to tell when a buffer completes.
    notify: HashMap<BufToken, EndPoint>,
}

impl Peer {
    fn start(addr: &str) -> Res<Self> {
        let xprt = TcpTransport::new(TcpConfig::default());
        let dom = Domain::new(&xprt)?;
        let tm = dom.tm_init(ignore_tm_events())?;
        let (cbs, events) = event_channel(4096);
        tm.start(addr)?;
        tm.wait_for_state(TmState::Started, Duration::from_secs(10))?;
        Ok(Self {
            dom,
            tm,
            events,
            cbs,
            ledger: HashMap::new(),
            notify: HashMap::new(),
        })
    }

    fn buf(&self, data: &[u8], size: usize) -> Res<colibri_net::NetBuffer> {
        let mut bv = BufVec::with_len(size.max(1), 1 << 20);
        bv.copy_in(0, data)?;
        Ok(self.dom.register(bv)?.with_callbacks(self.cbs.clone()))
    }

    fn record(&mut self, t: BufToken) {
        self.ledger.insert(t, 0);
    }

    fn send(&mut self, to: &EndPoint, msg: &[u8]) -> Res<()> {
        let b = self.buf(msg, msg.len())?;
        let t = self
            .tm
            .add_msg_send(b, to, msg.len())
            .map_err(|e| e.error)?;
        self.record(t);
        Ok(())
    }

    fn recv_buffers(&mut self, n: usize) -> Res<()> {
        for _ in 0..n {
            let b = self.buf(&[], 64 << 10)?;
            let t = self
                .tm
                .add_msg_recv(b, RecvParams::default())
                .map_err(|e| e.error)?;
            self.record(t);
        }
        Ok(())
    }

    /// Counts a final event; returns its buffer.
    fn settle(&mut self, ev: &mut BufferEvent) -> Option<colibri_net::NetBuffer> {
        if !ev.is_final() {
            return None;
        }
        if let Some(n) = self.ledger.get_mut(&ev.token()) {
            *n += 1;
        }
        ev.take_buffer()
    }

    fn finish(self) -> ExitCode {
        let Self {
            dom,
            tm,
            events,
            mut ledger,
            ..
        } = self;
        let _ = tm.stop(true);
        let _ = tm.wait_stopped(Duration::from_secs(20));
        let mut failed = 0;
        while let Some(ev) = events.try_recv() {
            if ev.is_final() {
                if let Some(n) = ledger.get_mut(&ev.token()) {
                    *n += 1;
                }
                if ev.status().is_err() {
                    failed += 1;
                }
            }
        }
        let completions: u32 = ledger.values().sum();
        let exact = ledger.values().all(|&n| n == 1);
        println!(
            "DONE adds={} completions={completions} failed={failed}",
            ledger.len()
        );
        drop(events);
        let _ = tm.fini();
        let _ = dom.fini();
        if exact {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

fn serve(addr: &str, max: Duration) -> Res<ExitCode> {
    let mut p = Peer::start(addr)?;
    p.recv_buffers(16)?;
    println!("READY {}", p.tm.ep().expect("started").addr());
    std::io::stdout().flush()?;
    let until = Instant::now() + max;
    while Instant::now() < until {
        let Ok(mut ev) = p.events.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        let queue = ev.queue();
        let token = ev.token();
        let ok = ev.status().is_ok();
        let err = ev.error().map(|e| e.to_string());
        let msg = if ok
            && matches!(
                queue,
                QueueType::MsgRecv | QueueType::ActiveBulkRecv | QueueType::PassiveBulkRecv
            ) {
            Some(ev.message()?)
        } else {
            None
        };
        let sender = ev.take_sender();
        let buf = p.settle(&mut ev);
        drop(ev);
        match queue {
            QueueType::MsgRecv => {
                if let Some(b) = buf {
                    let t =
                        p.tm.add_msg_recv(b, RecvParams::default())
                            .map_err(|e| e.error)?;
                    p.record(t);
                }
                let (Some(m), Some(from)) = (msg, sender) else {
                    continue;
                };
                if m.first() == Some(&b'Q') {
                    break;
                }
                command(&mut p, &m, &from)?;
            }
            QueueType::PassiveBulkRecv | QueueType::ActiveBulkRecv => {
                if let Some(to) = p.notify.remove(&token) {
                    let reply = match msg {
                        Some(m) => {
                            let mut r = vec![b'C'];
                            r.extend_from_slice(&(m.len() as u32).to_le_bytes());
                            r.extend_from_slice(&crc32c(&m).to_le_bytes());
                            r
                        }
                        None => [b"F".as_slice(), err.unwrap_or_default().as_bytes()].concat(),
                    };
                    p.send(&to, &reply)?;
                }
            }
            QueueType::ActiveBulkSend => {
                if let Some(to) = p.notify.remove(&token) {
                    let reply = match err {
                        None => b"K".to_vec(),
                        Some(e) => [b"F".as_slice(), e.as_bytes()].concat(),
                    };
                    p.send(&to, &reply)?;
                }
            }
            _ => {}
        }
    }
    Ok(p.finish())
}

fn command(p: &mut Peer, m: &[u8], from: &EndPoint) -> Res<()> {
    let bad = || -> Box<dyn std::error::Error> { "malformed command".into() };
    let short = |_: Short| bad();
    let (&cmd, rest) = m.split_first().ok_or_else(bad)?;
    let mut args = Reader::new(rest);
    match cmd {
        b'E' => {
            let mut r = vec![b'e'];
            r.extend_from_slice(rest);
            p.send(from, &r)?;
        }
        b'S' => {
            let len = args.u32().map_err(short)? as usize;
            let seed = args.u64().map_err(short)?;
            let b = p.buf(&pattern(seed, len), len)?;
            let (t, d) = p.tm.add_passive_send(b, len, None).map_err(|e| e.error)?;
            p.record(t);
            p.send(from, &[b"D".as_slice(), d.as_bytes()].concat())?;
        }
        b'R' => {
            let len = args.u32().map_err(short)? as usize;
            let b = p.buf(&[], len)?;
            let (t, d) = p.tm.add_passive_recv(b, None).map_err(|e| e.error)?;
            p.record(t);
            p.notify.insert(t, from.clone());
            p.send(from, &[b"D".as_slice(), d.as_bytes()].concat())?;
        }
        b'P' => {
            let seed = args.u64().map_err(short)?;
            let len = args.u32().map_err(short)? as usize;
            let desc = NetBufDesc::from_bytes(args.rest().to_vec());
            let b = p.buf(&pattern(seed, len), len)?;
            let t = p.tm.add_active_send(b, &desc, len).map_err(|e| e.error)?;
            p.record(t);
            p.notify.insert(t, from.clone());
        }
        b'G' => {
            let len = args.u32().map_err(short)? as usize;
            let desc = NetBufDesc::from_bytes(args.rest().to_vec());
            let b = p.buf(&[], len)?;
            let t = p.tm.add_active_recv(b, &desc).map_err(|e| e.error)?;
            p.record(t);
            p.notify.insert(t, from.clone());
        }
        _ => return Err(bad()),
    }
    Ok(())
}

fn put_loop(server: &str, max: Duration) -> Res<ExitCode> {
    let mut p = Peer::start("127.0.0.1:0:1")?;
    p.recv_buffers(16)?;
    let to = p.tm.ep_create(server)?;
    p.send(&to, b"H")?;
    let until = Instant::now() + max;
    let mut data: Vec<u8> = Vec::new();
    while Instant::now() < until {
        let Ok(mut ev) = p.events.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        let queue = ev.queue();
        let msg = if ev.is_ok() && queue == QueueType::MsgRecv {
            Some(ev.message()?)
        } else {
            None
        };
        let buf = p.settle(&mut ev);
        drop(ev);
        if queue != QueueType::MsgRecv {
            continue;
        }
        if let Some(b) = buf {
            let t =
                p.tm.add_msg_recv(b, RecvParams::default())
                    .map_err(|e| e.error)?;
            p.record(t);
        }
        if let Some(m) = msg.filter(|m| m.first() == Some(&b'D')) {
            let desc = NetBufDesc::from_bytes(m[1..].to_vec());
            let len = desc.decode()?.len as usize;
            if data.len() != len {
                data = pattern(1, len);
            }
            let b = p.buf(&data, len)?;
            let t = p.tm.add_active_send(b, &desc, len).map_err(|e| e.error)?;
            p.record(t);
        }
    }
    drop(to);
    Ok(p.finish())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let max =
        |i: usize| Duration::from_secs(args.get(i).and_then(|s| s.parse().ok()).unwrap_or(60));
    let r = match args.get(1).map(String::as_str) {
        Some("serve") if args.len() >= 3 => serve(&args[2], max(3)),
        Some("put-loop") if args.len() >= 3 => put_loop(&args[2], max(3)),
        _ => {
            eprintln!("usage: colibri-tcp-peer serve ADDR [MAX_SECS] | put-loop SERVER [MAX_SECS]");
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("colibri-tcp-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
