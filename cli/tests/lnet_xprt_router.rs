//! Transfer machines through a router that is a process of its own: the
//! router is `colibri lnet run` (two NIs, `tcp` and `tcp1`, routing on);
//! the client (on `tcp`) and the server (on `tcp1`) are LNet nodes of this
//! process with a transfer machine each, over the socket LND on loopback
//! addresses. Messages both ways and 1 MiB and 16 MiB active bulk in both
//! directions, byte for byte; then the router killed with SIGKILL in the
//! middle of transfers: every buffer in flight completes exactly once, with
//! a clear status, and nothing hangs.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::{Net, Nid};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, EventReceiver, NetBuffer, NetError, QueueType,
    RecvParams, TmState, TransferMachine, event_channel, ignore_tm_events,
};
use common::{Node, common_free_port, global, lnet_serve, ni};

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(90);

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An LNet node of this process on `nid`, listening on `port` (the
/// fabric's common `accept_port`), reaching `remote` through `gateway`.
fn node(nid: &str, port: u16, remote: &str, gateway: &str) -> Lnet {
    let mut cfg = LnetConfig::new(&[nid.parse::<Nid>().unwrap()]);
    cfg.accept_port = port;
    cfg.accept = AcceptPolicy::All;
    cfg.node.transaction_timeout = Duration::from_secs(4);
    cfg.node.retry_count = 1;
    cfg.tick = Duration::from_millis(200);
    let l = Lnet::start(cfg).unwrap();
    let net: Net = remote.parse().unwrap();
    l.add_route(net, gateway.parse().unwrap(), Some(1), 0)
        .unwrap();
    l
}

struct End {
    dom: Domain,
    tm: TransferMachine,
    events: EventReceiver,
    cbs: Arc<BufferCallbacks>,
    addr: String,
    _xprt: LnetTransport,
}

fn end(l: &Lnet, at: &str) -> End {
    let cfg = LnetXprtConfig::default().handshake_timeout(Duration::from_secs(4));
    let xprt = LnetTransport::new(vec![l.clone()], cfg).unwrap();
    let dom = Domain::new(&xprt).unwrap();
    let (cbs, events) = event_channel(4096);
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start(at).unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    let addr = tm.ep().unwrap().addr().to_string();
    End {
        dom,
        tm,
        events,
        cbs,
        addr,
        _xprt: xprt,
    }
}

impl End {
    fn buf(&self, data: &[u8]) -> NetBuffer {
        let mut b = self
            .dom
            .register(BufVec::with_len(data.len(), 300_000))
            .unwrap()
            .with_callbacks(self.cbs.clone());
        b.bufvec_mut().copy_in(0, data).unwrap();
        b
    }

    fn empty(&self, len: usize) -> NetBuffer {
        self.dom
            .register(BufVec::with_len(len, 300_000))
            .unwrap()
            .with_callbacks(self.cbs.clone())
    }

    /// The next event, which must be from `q`.
    fn next(&self, q: QueueType) -> BufferEvent {
        let ev = self
            .events
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("no {q} event within {WAIT:?}: {e}"));
        assert_eq!(ev.queue(), q, "{ev:?}");
        ev
    }

    fn finish(self) {
        self.tm.stop(true).unwrap();
        self.tm.wait_stopped(WAIT).unwrap();
        self.tm.fini().map_err(|e| e.error).unwrap();
        self.dom.fini().map_err(|e| e.error).unwrap();
    }
}

/// The router process and the two nodes of this process.
struct Fabric {
    router: Node,
    client: Lnet,
    server: Lnet,
    c_nid: String,
    s_nid: String,
    _dir: tempfile::TempDir,
}

/// Client `127.0.a.2@tcp`, router `127.0.a.3@tcp` + `127.0.b.3@tcp1`
/// (a process), server `127.0.b.4@tcp1`, with `b = a + 1`.
/// The fabric on `127.0.a.*` and `127.0.(a+1).*`; the router runs with
/// `args` (`--splice-pipes N`).
fn fabric(a: u8, args: &[&str]) -> Fabric {
    let b = a + 1;
    let ips: Vec<std::net::Ipv4Addr> = [
        format!("127.0.{a}.2"),
        format!("127.0.{a}.3"),
        format!("127.0.{b}.3"),
        format!("127.0.{b}.4"),
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let port = common_free_port(&ips);
    let dir = tempfile::tempdir().unwrap();
    let (r0, r1) = (format!("127.0.{a}.3@tcp"), format!("127.0.{b}.3@tcp1"));
    let router = Node::start_args(
        dir.path(),
        "router",
        &format!(
            "net:\n{}{}routing:\n    enable: 1\n{}",
            ni("tcp", &r0),
            ni("tcp1", &r1),
            global(port)
        ),
        args,
    );
    let c_nid = format!("127.0.{a}.2@tcp");
    let s_nid = format!("127.0.{b}.4@tcp1");
    let client = node(&c_nid, port, "tcp1", &r0);
    let server = node(&s_nid, port, "tcp", &r1);
    Fabric {
        router,
        client,
        server,
        c_nid,
        s_nid,
        _dir: dir,
    }
}

#[test]
fn transfer_machines_talk_through_a_router_process() {
    // The router splices the bulk through kernel pipes.
    let f = fabric(61, &["--splice-pipes", "32"]);
    let c = end(&f.client, &format!("{}:12345:30:*", f.c_nid));
    let s = end(&f.server, &format!("{}:12345:31:7", f.s_nid));
    let to_s = c.tm.ep_create(&s.addr).unwrap();
    let to_c = s.tm.ep_create(&c.addr).unwrap();

    // Messages both ways (the first ones also find the route up).
    for i in 0..10u64 {
        s.tm.add_msg_recv(s.empty(4096), RecvParams::default())
            .unwrap();
        let data = pattern(100 + i as usize * 300, i);
        c.tm.add_msg_send(c.buf(&data), &to_s, data.len()).unwrap();
        let sent = c.next(QueueType::MsgSend);
        assert!(sent.is_ok(), "{sent:?}");
        let r = s.next(QueueType::MsgRecv);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(r.message().unwrap(), data);
        assert_eq!(r.sender().unwrap().addr(), c.addr);
        c.tm.add_msg_recv(c.empty(4096), RecvParams::default())
            .unwrap();
        s.tm.add_msg_send(s.buf(&data[..50]), &to_c, 50).unwrap();
        assert!(s.next(QueueType::MsgSend).is_ok());
        let r = c.next(QueueType::MsgRecv);
        assert_eq!(r.message().unwrap(), &data[..50]);
    }

    // 1 MiB and 16 MiB active bulk, both directions, each side active in
    // turn.
    for size in [MIB, 16 * MIB] {
        for (act, pas, seed) in [(&c, &s, 1), (&s, &c, 2)] {
            let src = pattern(size, seed);
            let (_, d) = pas.tm.add_passive_send(pas.buf(&src), size, None).unwrap();
            act.tm.add_active_recv(act.empty(size), &d).unwrap();
            let a = act.next(QueueType::ActiveBulkRecv);
            assert!(a.is_ok(), "{a:?}");
            assert_eq!(a.length(), size);
            assert!(a.with_data(|b| b.to_vec(0, size).unwrap() == src).unwrap());
            assert!(pas.next(QueueType::PassiveBulkSend).is_ok());

            let up = pattern(size, seed + 10);
            let (_, d) = pas.tm.add_passive_recv(pas.empty(size), None).unwrap();
            act.tm.add_active_send(act.buf(&up), &d, size).unwrap();
            assert!(act.next(QueueType::ActiveBulkSend).is_ok());
            let p = pas.next(QueueType::PassiveBulkRecv);
            assert!(p.is_ok(), "{p:?}");
            assert_eq!(p.length(), size);
            assert!(p.with_data(|b| b.to_vec(0, size).unwrap() == up).unwrap());
        }
    }
    // The router forwarded it all, the bulk (most of it: a payload that
    // does not fit its pipe goes on in memory) through its pipes.
    assert!(f.router.stat("route_count") > 0);
    drop((to_s, to_c));
    c.finish();
    s.finish();
    f.client.shutdown();
    f.server.shutdown();
    let stopped = f.router.stop();
    let spliced: u64 = stopped
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("splice_bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no splice_bytes in {stopped:?}"));
    assert!(spliced >= 16 * MIB as u64, "{stopped}");
}

#[test]
fn router_process_killed_mid_transfer_fails_each_buffer_once() {
    let mut f = fabric(63, &[]);
    let c = end(&f.client, &format!("{}:12345:30:*", f.c_nid));
    let s = end(&f.server, &format!("{}:12345:30:*", f.s_nid));
    // One exchange first: the route is up and connections are made.
    let to_s = c.tm.ep_create(&s.addr).unwrap();
    s.tm.add_msg_recv(s.empty(64), RecvParams::default())
        .unwrap();
    c.tm.add_msg_send(c.buf(b"hello"), &to_s, 5).unwrap();
    assert!(c.next(QueueType::MsgSend).is_ok());
    assert!(s.next(QueueType::MsgRecv).is_ok());
    drop(to_s);

    let (n, size) = (8, 4 * MIB);
    let base = f.client.stats().recv_length;
    let mut descs = Vec::new();
    for i in 0..n {
        let (_, d) =
            s.tm.add_passive_send(s.buf(&pattern(size, i as u64)), size, None)
                .unwrap();
        descs.push(d);
    }
    let tokens: Vec<_> = descs
        .iter()
        .map(|d| c.tm.add_active_recv(c.empty(size), d).unwrap())
        .collect();
    // Let transfers start (the first of the 32 data PUTs is arriving),
    // then the router dies without a word. Waiting for a whole transfer instead
    // let the kill come too late: the eight share the route, so the first
    // to end ends close to the last.
    let started = Instant::now();
    while f.client.stats().recv_length < base + MIB as u64 {
        assert!(started.elapsed() < WAIT, "no data came through the router");
        std::thread::sleep(Duration::from_micros(200));
    }
    f.router.child.kill().unwrap();
    f.router.child.wait().unwrap();
    let mut seen: HashMap<_, usize> = HashMap::new();
    let mut ok = 0;
    let started = Instant::now();
    while seen.len() < n {
        let ev = c.next(QueueType::ActiveBulkRecv);
        assert!(ev.is_final());
        match ev.status() {
            Ok(()) => ok += 1,
            Err(e) => assert!(
                matches!(
                    e,
                    NetError::TimedOut | NetError::Unreachable(_) | NetError::ConnectionReset(_)
                ),
                "unclear status {e:?}"
            ),
        }
        *seen.entry(ev.token()).or_default() += 1;
    }
    assert!(started.elapsed() < WAIT);
    assert!(seen.values().all(|&k| k == 1), "{seen:?}");
    assert!(tokens.iter().all(|t| seen.contains_key(t)));
    assert!(ok < n, "the router died before any transfer failed");
    assert!(c.events.recv_timeout(Duration::from_millis(300)).is_err());
    // The server's buffers end once each too (served, or cancelled by
    // the stop).
    s.tm.stop(true).unwrap();
    for _ in 0..n {
        assert!(s.next(QueueType::PassiveBulkSend).is_final());
    }
    assert!(s.events.recv_timeout(Duration::from_millis(300)).is_err());
    s.tm.wait_stopped(WAIT).unwrap();
    s.tm.fini().map_err(|e| e.error).unwrap();
    s.dom.fini().map_err(|e| e.error).unwrap();
    c.finish();
    f.client.shutdown();
    f.server.shutdown();
}

/// `serve_and_ping_through_a_router_process`: what `colibri ping` prints
/// with `--json`, its summary's replies received out of those sent.
fn ping_summary(out: &common::Out) -> (u64, u64) {
    assert_eq!(
        out.code,
        Some(0),
        "ping failed: {}{}",
        out.stdout,
        out.stderr
    );
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let n = |k: &str| {
        v["summary"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}: {v}"))
    };
    (n("received"), n("sent"))
}

/// The README's three nodes, each a process, with the ping programs at the
/// ends: `colibri serve --xprt lnet --lnet-config` on `tcp1` and `colibri
/// ping --xprt lnet --lnet-config` on `tcp`, each with a route to the
/// other's net through the router process. Messages and 1 MiB bulk pings
/// (the server pulls and pushes through the router) all come back.
#[test]
fn serve_and_ping_through_a_router_process() {
    let (c, r0, r1, s) = (
        "127.0.71.2@tcp",
        "127.0.71.3@tcp",
        "127.0.72.3@tcp1",
        "127.0.72.4@tcp1",
    );
    let ips: Vec<std::net::Ipv4Addr> = ["127.0.71.2", "127.0.71.3", "127.0.72.3", "127.0.72.4"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let port = common_free_port(&ips);
    let dir = tempfile::tempdir().unwrap();
    let router = Node::start(
        dir.path(),
        "router",
        &format!(
            "net:\n{}{}routing:\n    enable: 1\n{}",
            ni("tcp", r0),
            ni("tcp1", r1),
            global(port)
        ),
    );
    let route = |net: &str, gw: &str| format!("route:\n    - net: {net}\n      gateway: {gw}\n");
    let (scfg, ccfg) = (
        dir.path().join("server.yaml"),
        dir.path().join("client.yaml"),
    );
    std::fs::write(
        &scfg,
        format!(
            "net:\n{}{}{}",
            ni("tcp1", s),
            route("tcp", r1),
            global(port)
        ),
    )
    .unwrap();
    std::fs::write(
        &ccfg,
        format!(
            "net:\n{}{}{}",
            ni("tcp", c),
            route("tcp1", r0),
            global(port)
        ),
    )
    .unwrap();
    let addr = format!("{s}:12345:30:1");
    let _server = lnet_serve(&scfg, &addr);
    let ping = |more: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.args(["ping", "--xprt", "lnet", "--lnet-config"])
            .arg(&ccfg)
            .arg(&addr)
            .args(["-i", "10", "--json", "-q"])
            .args(more);
        ping_summary(&common::run_bounded(&mut cmd))
    };
    assert_eq!(ping(&["-c", "10"]), (10, 10));
    assert_eq!(ping(&["-c", "3", "--bulk", "-s", "1M"]), (3, 3));
    assert!(router.stat("route_count") > 0);
    router.stop();
}
