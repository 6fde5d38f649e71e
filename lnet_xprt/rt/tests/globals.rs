//! `lnetctl set` globals and `net add` tunables on running nodes (real
//! sockets on loopback, in one process), driven through the control
//! commands: each is shown, exported and has its effect.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{EventKind, OpError};
use colibri_lnet_rt::colibri_lnet::node::ResponseTracking;
use colibri_lnet_rt::colibri_lnet::socklnd::ConnType;
use colibri_lnet_rt::conf::NodeConf;
use colibri_lnet_rt::ctl::{Command, Daemon, Failure, errno};
use colibri_lnet_rt::yaml::Doc;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use common::*;

fn daemon(nids: &[&str], extra: &str) -> Arc<Daemon> {
    init_tracing();
    let mut y = String::from("net:\n");
    for n in nids {
        let net = n.split('@').nth(1).unwrap();
        y.push_str(&format!(
            "    - net type: {net}\n      local NI(s):\n        - nid: {n}\n"
        ));
    }
    y.push_str(&format!(
        "global:\n    accept_port: 0\n    accept: all\n    transaction_timeout: 10\n{extra}"
    ));
    let (c, warn) = NodeConf::from_yaml(&y).unwrap();
    assert!(warn.is_empty(), "{warn:?}");
    Daemon::start(&c).unwrap()
}

fn run(d: &Daemon, cmd: Command) -> Result<Doc, Failure> {
    d.handle(cmd, &mut |_| true)
}

fn set(d: &Daemon, name: &str, v: &str) -> Result<Doc, Failure> {
    run(
        d,
        Command::Set {
            name: name.into(),
            value: v.into(),
        },
    )
}

fn global(d: &Daemon, name: &str) -> Option<i64> {
    run(d, Command::GlobalShow)
        .unwrap()
        .get("global")
        .and_then(|g| g.get(name))
        .and_then(Doc::as_i64)
}

/// Every NI of `a` knows where every NI of `b` listens, and back.
fn introduce(ds: &[&Daemon]) {
    for a in ds {
        for b in ds {
            for n in b.lnet().nids() {
                if let Some(addr) = b.lnet().listen_addr(n) {
                    a.lnet().set_peer_addr(n, addr);
                }
            }
        }
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_global_is_set_shown_exported_and_given_to_the_node() {
    let d = daemon(&["127.0.40.1@tcp"], "");
    for (name, v) in [
        ("drop_asym_route", 1),
        ("response_tracking", 1),
        ("recovery_limit", 30),
        ("max_recovery_ping_interval", 64),
        ("alive_router_check_interval", 5),
        ("router_ping_timeout", 7),
        ("avoid_asym_router_failure", 0),
        ("check_routers_before_use", 1),
        ("max_interfaces", 32),
    ] {
        let r = set(&d, name, &v.to_string()).unwrap();
        assert_eq!(r, Doc::Null, "{name}: no warning for a global with effect");
        assert_eq!(global(&d, name), Some(v), "{name}");
        let exported = d.export().to_yaml();
        assert!(
            exported.contains(&format!("    {name}: {v}\n")),
            "{exported}"
        );
    }
    let c = d.lnet().with_node(|n| n.config().clone());
    assert!(c.drop_asym_route);
    assert_eq!(c.response_tracking, ResponseTracking::Get);
    assert_eq!(c.recovery_limit, Some(Duration::from_secs(30)));
    assert_eq!(c.max_recovery_ping_interval, Duration::from_secs(64));
    assert_eq!(c.router_check_interval, Duration::from_secs(5));
    assert_eq!(c.router_ping_timeout, Duration::from_secs(7));
    assert!(!c.avoid_asym_router_failure);
    assert!(c.check_routers_before_use);
    let rc = d.lnet().with_node(|n| *n.routes().config());
    assert_eq!(rc.router_ping_timeout, Duration::from_secs(7));
    assert!(!rc.avoid_asym_router_failure && rc.check_routers_before_use);
    assert_eq!(c.max_interfaces, 32);
    let h = d.lnet().with_node(|n| *n.health().config());
    assert_eq!(h.max_recovery_ping_interval, Duration::from_secs(64));
    assert_eq!(h.recovery_limit, Some(Duration::from_secs(30)));
    set(&d, "recovery_limit", "0").unwrap();
    assert_eq!(d.lnet().with_node(|n| n.config().recovery_limit), None);

    // Globals without meaning here: recorded and shown, with a warning
    // saying why.
    for (name, v) in [
        ("numa_range", 10),
        ("recovery_interval", 5),
        ("router_sensitivity", 50),
    ] {
        let r = set(&d, name, &v.to_string()).unwrap();
        let w = r.get("warnings").unwrap().items()[0]
            .as_text()
            .unwrap_or_default();
        assert!(w.contains("no effect") && w.contains(name), "{w}");
        assert_eq!(global(&d, name), Some(v));
    }

    // Out of range: EINVAL, nothing changes.
    for (name, v) in [
        ("drop_asym_route", "2"),
        ("response_tracking", "4"),
        ("max_recovery_ping_interval", "0"),
        ("max_interfaces", "15"),
        ("alive_router_check_interval", "-1"),
        ("router_ping_timeout", "0"),
        ("avoid_asym_router_failure", "2"),
        ("check_routers_before_use", "-1"),
        ("lnd_timeout", "3"),
    ] {
        let e = set(&d, name, v).unwrap_err();
        assert_eq!(e.errno, errno::EINVAL, "{name}={v}: {e}");
    }
    assert_eq!(global(&d, "max_interfaces"), Some(32));

    // A node started from the export has the same globals.
    let text = d.export().to_yaml();
    d.shutdown();
    let (c2, _) = NodeConf::from_yaml(&text).unwrap();
    let d2 = Daemon::start(&c2).unwrap();
    assert_eq!(d2.export().to_yaml(), text);
    let c = d2.lnet().with_node(|n| n.config().clone());
    assert!(c.drop_asym_route);
    assert_eq!(c.router_check_interval, Duration::from_secs(5));
    d2.shutdown();
}

/// client (tcp) → r1 → server (tcp1), and the server's only route back is
/// through r2: with `drop_asym_route` the server drops what came through
/// r1, counted for r1's peer NI.
#[test]
fn drop_asym_route_between_running_nodes() {
    let client = daemon(&["127.0.41.1@tcp"], "");
    let r1 = daemon(
        &["127.0.41.2@tcp", "127.0.42.2@tcp1"],
        "routing:\n    enable: 1\n",
    );
    let r2 = daemon(
        &["127.0.41.3@tcp", "127.0.42.3@tcp1"],
        "routing:\n    enable: 1\n",
    );
    let server = daemon(&["127.0.42.4@tcp1"], "");
    introduce(&[&client, &r1, &r2, &server]);
    let route = |d: &Daemon, net: &str, gw: &str| {
        run(
            d,
            Command::RouteAdd {
                net: net.into(),
                gateway: gw.into(),
                hop: Some(1),
                priority: None,
            },
        )
        .unwrap();
    };
    route(&client, "tcp1", "127.0.41.2@tcp");
    route(&server, "tcp", "127.0.42.3@tcp1");
    let srv = nid("127.0.42.4@tcp1");
    let ping = || client.lnet().ping(srv, Duration::from_secs(3));

    // Off: the ping goes through r1 and comes back through r2.
    ping().unwrap();
    // The server is a peer of the client now, on a net the client has no
    // NI on: no credits (Lustre gives such peer NIs none).
    let p = run(
        &client,
        Command::PeerShow {
            nid: Some("127.0.42.4@tcp1".into()),
            verbose: true,
            detail: 0,
        },
    )
    .unwrap()
    .to_yaml();
    assert!(
        p.contains("max_ni_tx_credits: 0") && p.contains("available_rtr_credits: 0"),
        "{p}"
    );
    let before = server.lnet().stats().drop_count;

    set(&server, "drop_asym_route", "1").unwrap();
    assert!(ping().is_err(), "dropped at the server");
    let s = server.lnet().stats();
    assert!(s.drop_count > before, "{s:?}");
    let peer = run(
        &server,
        Command::PeerShow {
            nid: Some("127.0.42.2@tcp1".into()),
            verbose: true,
            detail: 2,
        },
    )
    .unwrap()
    .to_yaml();
    assert!(peer.contains("drop_count: 1"), "{peer}");
    assert!(peer.contains("dropped_stats:"), "{peer}");
    // (r1 is in the server's peer list only as the hop the dropped
    // message came from.)

    // A route back through r1: symmetric again.
    route(&server, "tcp", "127.0.42.2@tcp1");
    ping().unwrap();
    for d in [client, r1, r2, server] {
        d.shutdown();
    }
}

#[test]
fn alive_router_check_interval_paces_router_pings() {
    let client = daemon(&["127.0.43.1@tcp"], "");
    let router = daemon(
        &["127.0.43.2@tcp", "127.0.44.2@tcp1"],
        "routing:\n    enable: 1\n",
    );
    introduce(&[&client, &router]);
    run(
        &client,
        Command::RouteAdd {
            net: "tcp1".into(),
            gateway: "127.0.43.2@tcp".into(),
            hop: None,
            priority: None,
        },
    )
    .unwrap();
    let c = nid("127.0.43.1@tcp");
    let gets = || {
        router
            .lnet()
            .with_node(|n| n.peer_ni_stats(c).map_or(0, |s| s.received.get))
    };
    wait_for("the first router ping", || gets() >= 1);
    // The default period is 60 s: one ping in the next 2 s at most.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(gets(), 1);
    set(&client, "alive_router_check_interval", "1").unwrap();
    wait_for("router pings every second", || gets() >= 4);
    set(&client, "alive_router_check_interval", "0").unwrap();
    let n = gets();
    std::thread::sleep(Duration::from_secs(3));
    assert!(gets() <= n + 1, "the checker stopped ({n} then {})", gets());
    // The client's peer show lists the gateway known only from the route.
    let y = run(
        &client,
        Command::PeerShow {
            nid: None,
            verbose: true,
            detail: 0,
        },
    )
    .unwrap()
    .to_yaml();
    assert!(y.contains("primary nid: 127.0.43.2@tcp"), "{y}");
    client.shutdown();
    router.shutdown();
}

#[test]
fn response_tracking_on_a_running_node() {
    init_tracing();
    let mut cfg = LnetConfig::new(&[nid("127.0.45.1@tcp"), nid("127.0.45.2@tcp")]);
    cfg.accept_port = 0;
    cfg.node.transaction_timeout = Duration::from_secs(2);
    cfg.node.retry_count = 0;
    let lnet = Lnet::start(cfg).unwrap();
    // To 0@lo (the loopback LND: no health, no recovery pings); nobody
    // serves portal 30: PUTs are dropped, the ACK never comes.
    let other = ProcessId::lustre(nid("0@lo"));
    let put = |lnet: &Lnet| {
        let region = MemRegion::from_vec(vec![7; 100]);
        let md = bind(lnet, &region);
        lnet.put(md, true, other, 30, 0, 0, 0).unwrap();
        (md, region)
    };
    let (md, _r) = put(&lnet);
    let evs = until_final(&lnet, md);
    let last = evs.iter().rfind(|e| e.md == md).unwrap();
    assert_eq!(
        (last.kind(), last.status()),
        (EventKind::Ack, Err(OpError::TimedOut))
    );
    assert_eq!(lnet.stats().response_timeout_count, 1);

    // Tracked, unlinked while waiting for its ACK: ends at once, the
    // tracker goes with it.
    let (md, _r) = put(&lnet);
    let evs = events_until(&lnet, |e| e.iter().any(|e| e.md == md));
    assert_eq!(kinds(&evs, md), vec![EventKind::Send]);
    assert_eq!(lnet.stats().rst_alloc, 1);
    lnet.md_unlink(md).unwrap();
    assert_eq!(lnet.stats().rst_alloc, 0);
    let evs = until_final(&lnet, md);
    assert!(evs.iter().any(|e| e.md == md && e.unlinked));
    assert_eq!(lnet.stats().response_timeout_count, 1);

    // GETs only: the PUT is not tracked; it waits until it is unlinked,
    // which ends it at once.
    lnet.set_response_tracking(ResponseTracking::Get).unwrap();
    let (md, _r) = put(&lnet);
    let evs = events_until(&lnet, |e| e.iter().any(|e| e.md == md));
    assert_eq!(kinds(&evs, md), vec![EventKind::Send]);
    assert!(
        lnet.next_event(Duration::from_secs(4)).is_err(),
        "no timeout"
    );
    assert_eq!(lnet.stats().rst_alloc, 0);
    assert_eq!(lnet.stats().response_timeout_count, 1);
    let t0 = Instant::now();
    lnet.md_unlink(md).unwrap();
    let evs = until_final(&lnet, md);
    assert!(evs.iter().any(|e| e.md == md && e.unlinked));
    assert!(t0.elapsed() < Duration::from_secs(1));

    // A ping whose caller gives up ends then (lnet_ping unlinks its MD):
    // no tracker left, no response timeout counted later.
    use colibri_lnet_rt::colibri_lnet::fault::{DropRuleSpec, FaultMatch, MsgMask, Trigger};
    use colibri_lnet_rt::colibri_lnet::wire::MsgType;
    lnet.add_drop_rule(DropRuleSpec {
        matcher: FaultMatch::ANY.types(MsgMask::of(MsgType::Get)),
        trigger: Trigger::Rate(1),
        health_mask: 0,
    })
    .unwrap();
    let timeouts = lnet.stats().response_timeout_count;
    let e = lnet
        .ping(nid("127.0.45.2@tcp"), Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(e.errno(), 110, "{e}");
    assert_eq!(lnet.stats().rst_alloc, 0);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lnet.stats().response_timeout_count, timeouts);
    lnet.shutdown();
}

#[test]
fn net_add_with_tunables_makes_them_effective() {
    let a = daemon(&["127.0.46.1@tcp"], "routing:\n    enable: 1\n");
    let b = daemon(&["127.0.46.2@tcp"], "");
    // Both ends say 2 (the passive side, as Lustre's, admits up to its
    // own conns_per_peer connections of each type).
    run(
        &b,
        Command::NetAdd {
            nid: Some("127.0.47.2@tcp1".into()),
            net: None,
            interfaces: None,
            ip2net: None,
            credits: None,
            peer_credits: None,
            peer_buffer_credits: None,
            conns_per_peer: Some(2),
            tos: None,
            peer_timeout: None,
        },
    )
    .unwrap();
    run(
        &a,
        Command::NetAdd {
            nid: Some("127.0.47.1@tcp1".into()),
            net: None,
            interfaces: None,
            ip2net: None,
            credits: Some(64),
            peer_credits: Some(4),
            peer_buffer_credits: Some(3),
            conns_per_peer: Some(2),
            tos: None,
            peer_timeout: Some(60),
        },
    )
    .unwrap();
    let e = run(
        &a,
        Command::NetAdd {
            nid: Some("127.0.48.1@tcp2".into()),
            net: None,
            interfaces: None,
            ip2net: None,
            credits: None,
            peer_credits: None,
            peer_buffer_credits: None,
            conns_per_peer: Some(0),
            tos: None,
            peer_timeout: None,
        },
    )
    .unwrap_err();
    assert_eq!(e.errno, errno::EINVAL);
    introduce(&[&a, &b]);
    let y = run(
        &a,
        Command::NetShow {
            net: Some("tcp1".into()),
            verbose: true,
            detail: 2,
        },
    )
    .unwrap()
    .to_yaml();
    for want in [
        "peer_credits: 4",
        "peer_buffer_credits: 3",
        "credits: 64",
        "peer_timeout: 60",
        "conns_per_peer: 2",
        "sent_stats:",
        // The NI's credit queue has its 64 credits.
        "available: 64",
    ] {
        assert!(y.contains(want), "{want} in {y}");
    }
    // The tcp NI keeps the defaults.
    let y0 = net_show_v(&a, "tcp");
    assert!(
        y0.contains("conns_per_peer: 1")
            && y0.contains("credits: 256")
            && y0.contains("peer_timeout: 180"),
        "{y0}"
    );

    // Traffic on tcp1: the peer NI gets 4 tx credits, 3 router credits,
    // and the socket LND opens CONTROL plus two BULK_IN/BULK_OUT pairs.
    let peer = nid("127.0.47.2@tcp1");
    a.lnet().ping(peer, Duration::from_secs(5)).unwrap();
    let p = run(
        &a,
        Command::PeerShow {
            nid: Some("127.0.47.2@tcp1".into()),
            verbose: true,
            detail: 0,
        },
    )
    .unwrap()
    .to_yaml();
    assert!(p.contains("max_ni_tx_credits: 4"), "{p}");
    assert!(p.contains("available_rtr_credits: 3"), "{p}");
    let local = nid("127.0.47.1@tcp1");
    wait_for("five typed connections", || {
        let c = a.lnet().peer_conns(local, peer);
        c.len() == 5
            && c.iter().filter(|t| **t == ConnType::BulkIn).count() == 2
            && c.iter().filter(|t| **t == ConnType::BulkOut).count() == 2
    });
    // On tcp (conns_per_peer 1): three.
    a.lnet()
        .ping(nid("127.0.46.2@tcp"), Duration::from_secs(5))
        .unwrap();
    wait_for("three typed connections", || {
        a.lnet()
            .peer_conns(nid("127.0.46.1@tcp"), nid("127.0.46.2@tcp"))
            .len()
            == 3
    });
    // The export keeps the NI's tunables.
    let x = a.export().to_yaml();
    assert!(
        x.contains("peer_buffer_credits: 3") && x.contains("conns_per_peer: 2"),
        "{x}"
    );
    a.shutdown();
    b.shutdown();
}

#[test]
fn stats_show_counts_messages_alive_and_drops() {
    let d = daemon(&["127.0.40.5@tcp"], "");
    let s = run(&d, Command::StatsShow).unwrap();
    let st = s.get("statistics").unwrap();
    for k in [
        "msgs_alloc",
        "msgs_max",
        "rst_alloc",
        "errors",
        "drop_count",
        "route_length",
        "drop_length",
    ] {
        assert!(st.get(k).is_some(), "{k} in {}", s.to_yaml());
    }
    d.lnet()
        .ping(nid("127.0.40.5@tcp"), Duration::from_secs(5))
        .unwrap();
    let st = run(&d, Command::StatsShow).unwrap();
    let max = st
        .get("statistics")
        .and_then(|s| s.get("msgs_max"))
        .and_then(Doc::as_i64)
        .unwrap();
    assert!(max >= 1, "a ping is at least one message: {max}");
    d.shutdown();
}

/// Sanity-lnet 303 ("Check peer NI health after link down"), with the
/// link cut by `LnetConfig::link_down_ips` where the test cannot take an
/// interface down: within a tick of the socket LND's link watch the NI is
/// fatal and down (`net show -v`: `fatal_error: 1`, `status: down`), the
/// peer hears it by a push; the node's traffic to the peer leaves from its
/// other NI; the link back brings it up again.
#[test]
fn an_ni_whose_link_goes_down_is_fatal_and_pushed_down() {
    use colibri_lnet_rt::colibri_lnet::wire::NiStatus;

    init_tracing();
    let cut: Arc<parking_lot::Mutex<std::collections::HashSet<std::net::Ipv4Addr>>> =
        Arc::default();
    let y = "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.94.1@tcp\n        - nid: 127.0.94.2@tcp\nglobal:\n    accept_port: 0\n    accept: all\n    transaction_timeout: 10\n";
    let (c, _) = NodeConf::from_yaml(y).unwrap();
    let c2 = cut.clone();
    let a = Daemon::start_with(&c, move |l| l.link_down_ips = c2).unwrap();
    let b = daemon(&["127.0.94.3@tcp"], "");
    introduce(&[&a, &b]);
    let (a1, a2, b1) = (
        nid("127.0.94.1@tcp"),
        nid("127.0.94.2@tcp"),
        nid("127.0.94.3@tcp"),
    );
    // Each discovers the other (a pushes to the peers it knows).
    b.lnet().discover(a1, false).unwrap();
    a.lnet().discover(b1, false).unwrap();
    let seen_by_b = || {
        b.lnet()
            .with_node(|n| n.discovery().peers().ni(a2).map(|p| p.status()))
    };
    wait_for("b to know a's second NI", || {
        seen_by_b() == Some(NiStatus::Up)
    });
    let fatal = || link_shown(&a, "127.0.94.2@tcp");
    assert_eq!(fatal(), (true, false));
    cut.lock().insert("127.0.94.2".parse().unwrap());
    wait_for("the link watch to see the cut", || fatal() == (false, true));
    wait_for("b to hear a2 is down", || {
        seen_by_b() == Some(NiStatus::Down)
    });
    // (b lowered a2's health too, but its recovery pings reach a2 here,
    // where only the link watch was told of a cut, and a2 answers them:
    // only what a starts itself, PUTs and GETs, must avoid a2. The
    // health part of test 303 is `scenario_multirail.rs`'s, where the
    // wire goes too, and `cli/tests/lnet.rs`'s on a veth pair.)
    let sent_from_a2 = || {
        a.lnet().with_node(|n| {
            let s = n.ni_info(a2).unwrap().sent;
            s.put + s.get
        })
    };
    let before = sent_from_a2();
    for _ in 0..5 {
        a.lnet().ping(b1, Duration::from_secs(3)).unwrap();
    }
    assert_eq!(sent_from_a2(), before, "a sent from its cut NI");
    cut.lock().clear();
    wait_for("the link back", || fatal() == (true, false));
    wait_for("b to hear a2 is up", || seen_by_b() == Some(NiStatus::Up));
}

/// `net show --net NET -v` as YAML.
fn net_show_v(d: &Daemon, net: &str) -> String {
    run(
        d,
        Command::NetShow {
            net: Some(net.into()),
            verbose: true,
            detail: 0,
        },
    )
    .unwrap()
    .to_yaml()
}

/// `(status: up, fatal_error: 1)` of one NI of net tcp, as `net show -v`
/// prints them.
fn link_shown(d: &Daemon, nid: &str) -> (bool, bool) {
    let mine = net_show_v(d, "tcp")
        .split(&format!("nid: {nid}"))
        .nth(1)
        .unwrap_or("")
        .split("- nid:")
        .next()
        .unwrap_or("")
        .to_owned();
    (mine.contains("status: up"), mine.contains("fatal_error: 1"))
}

use colibri_lnet_rt::testing::Veth;

#[test]
fn an_ni_on_an_interface_that_goes_down_is_down_at_once() {
    // sanity-lnet 214 and 303 check `net show` right after `ip link set
    // dev ... down` returns, as socklnd's notifiers act before it does:
    // the kernel's link events must do it here, not the next tick (set to
    // a minute, so that only an event can explain a change in time).
    init_tracing();
    let Some(veth) = Veth::new("127.0.97.1".parse().unwrap()) else {
        return;
    };
    let y = "net:\n    - net type: tcp\n      local NI(s):\n        - nid: 127.0.97.1@tcp\n        - nid: 127.0.97.2@tcp\nglobal:\n    accept_port: 0\n    accept: all\n";
    let (c, _) = NodeConf::from_yaml(y).unwrap();
    let a = Daemon::start_with(&c, |l| l.tick = Duration::from_secs(60)).unwrap();
    let shown = |nid: &str| link_shown(&a, nid);
    let within = |what: &str, limit: Duration, f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let soon = Duration::from_secs(2);
    assert_eq!(shown("127.0.97.1@tcp"), (true, false));
    veth.set(&veth.a, false);
    within("127.0.97.1 down after its interface", soon, &|| {
        shown("127.0.97.1@tcp") == (false, true)
    });
    // The NI on no interface of its own follows lo, which stays up.
    assert_eq!(shown("127.0.97.2@tcp"), (true, false));
    veth.set(&veth.a, true);
    within("127.0.97.1 up with its interface", soon, &|| {
        shown("127.0.97.1@tcp") == (true, false)
    });
    // Carrier lost: the far end of the pair goes down, this end stays
    // administratively up but is no longer running.
    veth.set(&veth.b, false);
    within("127.0.97.1 down without carrier", soon, &|| {
        shown("127.0.97.1@tcp") == (false, true)
    });
    veth.set(&veth.b, true);
    within("127.0.97.1 up with carrier", soon, &|| {
        shown("127.0.97.1@tcp") == (true, false)
    });
}
