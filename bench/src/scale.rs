//! The scale workload behind `colibri bench --scale`: one server transfer
//! machine echoing 64-byte messages to N client transfer machines, with a
//! fixed number of messages in flight across all of them, so the work per
//! message is the same whatever N is and any growth of its cost is the
//! library's.
//!
//! Each echo carries its send time in its first bytes, so the latency of
//! every message is measured without a table. After each echo comes back,
//! the next message leaves from the next client in turn (round robin over
//! all N), so every client and every connection stays in use.
//!
//! ```
//! use colibri_bench::scale::{EchoScale, ScaleConfig};
//! use colibri_bulk_mem::MemTransport;
//!
//! let xprt = MemTransport::default();
//! let cfg = ScaleConfig { clients: 4, messages: 2_000, ..ScaleConfig::default() };
//! let p = EchoScale::run(&xprt, &cfg).unwrap();
//! assert_eq!(p.clients, 4);
//! assert!(p.rate > 0.0 && p.p50_us <= p.p99_us);
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use colibri_net::{
    BufVec, BufferCallbacks, Domain, EndPoint, NetBuffer, QueueType, RecvParams, TmHandle, TmState,
    TransferMachine, Transport, ignore_tm_events,
};

use crate::{BenchError, BenchResult};

const WAIT: Duration = Duration::from_secs(60);
const SIZE: usize = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Client transfer machines.
    pub clients: usize,
    /// All clients in one domain (`true`) or each in its own.
    pub shared_domain: bool,
    /// Messages in flight across all clients.
    pub in_flight: usize,
    /// Echoes measured (after as many again to warm up, at most 1,000).
    pub messages: u64,
    /// Address of the server (`ip:0:service` picks a port).
    pub server_addr: String,
    /// The clients' addresses are `ip:0:service`, one service each from
    /// this one up.
    pub client_ip: String,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        Self {
            clients: 1,
            shared_domain: true,
            in_flight: 64,
            messages: 100_000,
            server_addr: "127.0.0.1:0:1".into(),
            client_ip: "127.0.0.1".into(),
        }
    }
}

/// One point of a curve.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ScalePoint {
    /// Client transfer machines.
    pub clients: usize,
    /// Whether they shared one domain.
    pub shared_domain: bool,
    /// Echoes per second.
    pub rate: f64,
    /// Median round trip, µs.
    pub p50_us: f64,
    /// 99th percentile round trip, µs.
    pub p99_us: f64,
    /// Resident memory the clients, their connections and the server's
    /// side of them added, per client, in bytes (0 if unknown).
    pub rss_per_client: f64,
    /// Seconds spent setting the clients up.
    pub setup_s: f64,
}

struct Client {
    tm: TransferMachine,
    server: Option<EndPoint>,
    free: Vec<NetBuffer>,
}

struct State {
    clients: Vec<Client>,
    handles: Vec<TmHandle>,
    next: usize,
    /// Echoes to wait for before measuring; then measured ones.
    warmup: u64,
    target: u64,
    done: u64,
    start: Option<Instant>,
    end: Option<Instant>,
    lat_ns: Vec<u64>,
    closing: bool,
    error: Option<String>,
    epoch: Instant,
    /// Sends owed because no client had a free send buffer (their send
    /// completions had not come back yet): made as they do.
    owed: usize,
}

impl State {
    /// Sends the next message from the next client (in turn) with a free
    /// send buffer.
    fn send_next(&mut self) {
        let n = self.clients.len();
        for _ in 0..n {
            let i = self.next % n;
            self.next = self.next.wrapping_add(1);
            let c = &mut self.clients[i];
            let Some(mut b) = c.free.pop() else { continue };
            let Some(ep) = c.server.as_ref() else { return };
            let t = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
            if let Err(e) = b.bufvec_mut().copy_in(0, &t.to_le_bytes()) {
                self.error = Some(e.to_string());
                return;
            }
            if let Err(e) = self.handles[i].add_msg_send(b, ep, SIZE) {
                self.error = Some(e.error.to_string());
            }
            return;
        }
        self.owed += 1;
    }
}

/// The workload. See the [module docs](self).
#[derive(Debug)]
pub struct EchoScale;

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
}

fn rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0)
}

fn start_tm(dom: &Domain, addr: &str) -> BenchResult<TransferMachine> {
    let tm = dom.tm_init(ignore_tm_events())?;
    tm.start(addr)?;
    tm.wait_for_state(TmState::Started, WAIT)?;
    Ok(tm)
}

fn buffer(dom: &Domain, cbs: &Arc<BufferCallbacks>) -> BenchResult<NetBuffer> {
    let mut b = dom.register(BufVec::new(1, SIZE))?;
    b.bufvec_mut().fill(0xa5);
    b.set_callbacks(Arc::clone(cbs));
    Ok(b)
}

/// The callbacks of client `i`'s buffers.
fn client_callbacks(sh: &Arc<Shared>, i: usize) -> Arc<BufferCallbacks> {
    let (c1, c2) = (Arc::clone(sh), Arc::clone(sh));
    Arc::new(
        BufferCallbacks::new()
            .on(QueueType::MsgRecv, move |tm, mut ev| {
                let mut sent = [0u8; 8];
                let read = ev.with_data(|d| d.copy_out(ev.offset(), &mut sent));
                let ok = ev.is_ok();
                let mut st = c1.st.lock();
                if st.closing {
                    return;
                }
                if !ok {
                    st.error = Some(format!("echo failed: {:?}", ev.status()));
                    c1.cv.notify_all();
                    return;
                }
                if let Some(b) = ev.take_buffer()
                    && let Err(e) = tm.add_msg_recv(b, RecvParams::default())
                {
                    st.error = Some(e.error.to_string());
                }
                let now = Instant::now();
                if st.done == st.warmup {
                    st.start = Some(now);
                }
                if st.done >= st.warmup
                    && let Ok(Ok(())) = read
                {
                    let t = u64::try_from(st.epoch.elapsed().as_nanos()).unwrap_or(0);
                    let lat = t.saturating_sub(u64::from_le_bytes(sent));
                    st.lat_ns.push(lat);
                }
                st.done += 1;
                if st.done >= st.warmup + st.target {
                    if st.end.is_none() {
                        st.end = Some(now);
                        c1.cv.notify_all();
                    }
                    return;
                }
                st.send_next();
            })
            .on(QueueType::MsgSend, move |_tm, mut ev| {
                let mut st = c2.st.lock();
                if st.closing {
                    return;
                }
                if !ev.is_ok() {
                    st.error = Some(format!("send failed: {:?}", ev.status()));
                    c2.cv.notify_all();
                    return;
                }
                if let Some(b) = ev.take_buffer() {
                    st.clients[i].free.push(b);
                }
                if st.owed > 0 && st.end.is_none() {
                    st.owed -= 1;
                    st.send_next();
                }
            }),
    )
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

impl EchoScale {
    /// Sets up the server and `cfg.clients` clients, runs the echoes and
    /// tears everything down.
    ///
    /// # Errors
    /// A failure to start, a failed or stuck run (no echo for 60 s).
    pub fn run(xprt: &dyn Transport, cfg: &ScaleConfig) -> BenchResult<ScalePoint> {
        let n = cfg.clients.max(1);
        let in_flight = cfg.in_flight.max(1);
        let per_client = in_flight.div_ceil(n) + 1;
        let sdom = Domain::new(xprt)?;
        let server = start_tm(&sdom, &cfg.server_addr)?;
        let server_addr = server
            .ep()
            .map(|e| e.addr().to_string())
            .ok_or_else(|| BenchError("server has no address".into()))?;
        let scbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::MsgRecv, |tm, mut ev| {
                    let len = ev.length();
                    if let (true, Some(s), Some(b)) =
                        (ev.is_ok(), ev.take_sender(), ev.take_buffer())
                    {
                        let _ = tm.add_msg_send(b, &s, len);
                    }
                })
                .on(QueueType::MsgSend, |tm, mut ev| {
                    if let (true, Some(b)) = (ev.is_ok(), ev.take_buffer()) {
                        let _ = tm.add_msg_recv(b, RecvParams::default());
                    }
                }),
        );
        for _ in 0..(2 * in_flight + 8) {
            server.add_msg_recv(buffer(&sdom, &scbs)?, RecvParams::default())?;
        }
        let sh = Arc::new(Shared {
            st: Mutex::new(State {
                clients: Vec::with_capacity(n),
                handles: Vec::with_capacity(n),
                next: 0,
                warmup: (cfg.messages / 10).clamp(1, 1_000),
                target: cfg.messages.max(1),
                done: 0,
                start: None,
                end: None,
                lat_ns: Vec::with_capacity(usize::try_from(cfg.messages).unwrap_or(0)),
                closing: false,
                error: None,
                epoch: Instant::now(),
                owed: 0,
            }),
            cv: Condvar::new(),
        });
        let rss0 = rss_bytes();
        let setup = Instant::now();
        let mut own_domains = Vec::new();
        let shared_dom = if cfg.shared_domain {
            Some(Domain::new(xprt)?)
        } else {
            None
        };
        for i in 0..n {
            let dom = match &shared_dom {
                Some(d) => d,
                None => {
                    own_domains.push(Domain::new(xprt)?);
                    own_domains.last().expect("just pushed")
                }
            };
            let tm = start_tm(dom, &format!("{}:0:{}", cfg.client_ip, i + 2))?;
            let ccbs = client_callbacks(&sh, i);
            for _ in 0..(per_client + 1) {
                tm.add_msg_recv(buffer(dom, &ccbs)?, RecvParams::default())?;
            }
            let free = (0..per_client)
                .map(|_| buffer(dom, &ccbs))
                .collect::<BenchResult<Vec<_>>>()?;
            let server_ep = tm.ep_create(&server_addr)?;
            let mut st = sh.st.lock();
            st.handles.push(tm.handle());
            st.clients.push(Client {
                tm,
                server: Some(server_ep),
                free,
            });
        }
        let setup_s = setup.elapsed().as_secs_f64();
        let result = {
            let mut st = sh.st.lock();
            st.epoch = Instant::now();
            for _ in 0..in_flight {
                st.send_next();
            }
            loop {
                if st.error.is_some() || st.end.is_some() {
                    break;
                }
                let before = st.done;
                if sh.cv.wait_for(&mut st, WAIT).timed_out() && st.done == before {
                    st.error = Some(format!(
                        "stuck: {} echoes of {} after {WAIT:?}",
                        st.done,
                        st.warmup + st.target
                    ));
                }
            }
            st.closing = true;
            match (&st.error, st.start, st.end) {
                (None, Some(s), Some(e)) => {
                    let mut lat = std::mem::take(&mut st.lat_ns);
                    lat.sort_unstable();
                    let el = e.duration_since(s).as_secs_f64().max(1e-9);
                    Ok(ScalePoint {
                        clients: n,
                        shared_domain: cfg.shared_domain,
                        rate: st.target as f64 / el,
                        p50_us: percentile(&lat, 0.5),
                        p99_us: percentile(&lat, 0.99),
                        rss_per_client: ((rss_bytes() - rss0) / n as f64).max(0.0),
                        setup_s,
                    })
                }
                (Some(e), _, _) => Err(BenchError(e.clone())),
                _ => Err(BenchError("run ended without a measurement".into())),
            }
        };
        // Tear down: stop everything with abort, wait, finalise.
        let clients = {
            let mut st = sh.st.lock();
            st.handles.clear();
            std::mem::take(&mut st.clients)
        };
        let mut tms = Vec::with_capacity(clients.len());
        for mut c in clients {
            drop(c.server.take());
            drop(std::mem::take(&mut c.free));
            if c.tm.state() == TmState::Started {
                let _ = c.tm.stop(true);
            }
            tms.push(c.tm);
        }
        if server.state() == TmState::Started {
            let _ = server.stop(true);
        }
        for tm in tms {
            let _ = tm.wait_stopped(WAIT);
            let _ = tm.fini();
        }
        let _ = server.wait_stopped(WAIT);
        let _ = server.fini();
        drop(own_domains);
        drop(shared_dom);
        drop(sdom);
        result
    }
}
