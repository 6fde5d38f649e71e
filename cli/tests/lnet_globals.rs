//! `colibri lnet set` globals and `net add` tunables between running node
//! processes: each has its effect where an administrator can see it.

mod common;

use common::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// client (tcp) → r1 → server (tcp1); the server's only route back goes
/// through r2. With `drop_asym_route` the server drops what came through
/// r1; the router checker period is settable; a new NI takes its tunables.
#[test]
fn globals_take_effect_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let ips = [
        "127.0.50.1",
        "127.0.50.2",
        "127.0.50.3",
        "127.0.51.2",
        "127.0.51.3",
        "127.0.51.4",
        "127.0.52.1",
    ]
    .map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    let router = |name: &str, a: &str, b: &str| {
        Node::start(
            dir.path(),
            name,
            &format!(
                "net:\n{}{}routing:\n    enable: 1\n{g}",
                ni("tcp", a),
                ni("tcp1", b)
            ),
        )
    };
    let r1 = router("r1", "127.0.50.2@tcp", "127.0.51.2@tcp1");
    let r2 = router("r2", "127.0.50.3@tcp", "127.0.51.3@tcp1");
    let server = Node::start(
        dir.path(),
        "server",
        &format!(
            "net:\n{}route:\n    - net: tcp\n      gateway: 127.0.51.3@tcp1\n      hop: 1\n{g}",
            ni("tcp1", "127.0.51.4@tcp1")
        ),
    );
    let client = Node::start(
        dir.path(),
        "client",
        &format!(
            "net:\n{}route:\n    - net: tcp1\n      gateway: 127.0.50.2@tcp\n      hop: 1\n{g}",
            ni("tcp", "127.0.50.1@tcp")
        ),
    );
    let gs = server.ok(&["global", "show"]);
    for want in [
        "drop_asym_route: 0",
        "response_tracking: 3",
        "alive_router_check_interval: 60",
    ] {
        assert!(gs.contains(want), "{want} in {gs}");
    }
    let ping = || {
        lnet(
            Some(&client.ctl),
            &["ping", "127.0.51.4@tcp1", "--timeout", "3"],
        )
    };
    // Asymmetric but allowed: out through r1, back through r2.
    wait_for(WAIT, "a ping through r1 and back through r2", || {
        let o = ping();
        if o.code == Some(0) {
            Ok(())
        } else {
            Err(o.stderr)
        }
    });
    let drops = server.stat("drop_count");

    // drop_asym_route: the server drops the ping that came through r1.
    server.ok(&["set", "drop_asym_route", "1"]);
    assert_fails(&ping(), "127.0.51.4@tcp1");
    assert!(server.stat("drop_count") > drops);
    let p = server.json(&["peer", "show", "--nid", "127.0.51.2@tcp1", "--verbose", "2"]);
    let r1_ni = peer_ni(&p, "127.0.51.2@tcp1");
    assert!(num(r1_ni, &["statistics", "drop_count"]) >= 1, "{p}");
    assert!(num(r1_ni, &["dropped_stats", "get"]) >= 1, "{p}");
    assert!(server.ok(&["export"]).contains("    drop_asym_route: 1\n"));
    // A route back through r1 makes it symmetric again.
    server.ok(&[
        "route",
        "add",
        "--net",
        "tcp",
        "--gateway",
        "127.0.51.2@tcp1",
        "--hop",
        "1",
    ]);
    wait_for(WAIT, "a ping with a symmetric route", || {
        let o = ping();
        if o.code == Some(0) {
            Ok(())
        } else {
            Err(o.stderr)
        }
    });

    // response_tracking: the server drops the selftest's PUTs (portal
    // 52), so each waits for an ACK that never comes until the selftest
    // gives up (6 s) and unlinks it. Tracked (3, the default): a response
    // tracker exists meanwhile; GETs only (1): none. (The router checker
    // is stopped meanwhile: its pings are tracked too.)
    client.ok(&["set", "alive_router_check_interval", "0"]);
    server.ok(&[
        "fault",
        "drop",
        "add",
        "--source",
        "*",
        "--dest",
        "*",
        "--rate",
        "1",
        "--message",
        "put",
        "--portal",
        "52",
    ]);
    let brw = [
        "selftest",
        "brw",
        "--to",
        "127.0.51.4@tcp1",
        "--size",
        "4K",
        "--duration",
        "1",
        "--concurrency",
        "1",
        "--write",
        "--interval",
        "0",
    ];
    let rst = || client.stat("rst_alloc");
    let bg = Bg::start(&client.ctl, &brw);
    wait_for(WAIT, "a tracker for the PUT waiting for its ACK", || {
        let n = rst();
        if n >= 1 { Ok(()) } else { Err(n) }
    });
    let o = bg.join();
    assert!(o.stdout.contains("brw errors: 1"), "{}", o.stdout);
    assert_eq!(rst(), 0, "unlinked with its MD");
    client.ok(&["set", "response_tracking", "1"]);
    let bg = Bg::start(&client.ctl, &brw);
    let mut polls = 0;
    while !bg.finished() {
        assert_eq!(rst(), 0, "PUTs are not tracked");
        polls += 1;
    }
    assert!(polls > 0);
    let o = bg.join();
    assert!(o.stdout.contains("brw errors: 1"), "{}", o.stdout);
    assert_eq!(client.stat("response_timeout_count"), 0);
    client.ok(&["set", "response_tracking", "3"]);
    server.ok(&["fault", "drop", "reset"]);

    // A global without meaning here: accepted, with a warning saying why.
    let o = lnet(Some(&client.ctl), &["set", "numa_range", "5"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("warning:") && o.stderr.contains("no effect"),
        "{}",
        o.stderr
    );
    assert!(client.ok(&["global", "show"]).contains("numa_range: 5"));
    assert_fails(
        &lnet(Some(&client.ctl), &["set", "max_interfaces", "8"]),
        "max_interfaces",
    );

    // The router checker: one ping a minute by default, one a second when
    // set so (the router counts the GETs it receives from the client).
    let gets = || {
        let p = r1.json(&["peer", "show", "--nid", "127.0.50.1@tcp", "--verbose", "2"]);
        num(peer_ni(&p, "127.0.50.1@tcp"), &["received_stats", "get"])
    };
    let before = gets();
    client.ok(&["set", "alive_router_check_interval", "1"]);
    wait_for(WAIT, "router pings every second", || {
        let n = gets();
        if n >= before + 3 { Ok(()) } else { Err(n) }
    });
    assert!(
        client
            .ok(&["export"])
            .contains("    alive_router_check_interval: 1\n")
    );

    // net add with tunables.
    client.ok(&[
        "net",
        "add",
        "--nid",
        "127.0.52.1@tcp2",
        "--credits",
        "64",
        "--peer-credits",
        "4",
        "--peer-buffer-credits",
        "3",
        "--conns-per-peer",
        "2",
    ]);
    let n = client.ok(&["net", "show", "--net", "tcp2", "--verbose"]);
    for want in [
        "credits: 64",
        "peer_credits: 4",
        "peer_buffer_credits: 3",
        "conns_per_peer: 2",
    ] {
        assert!(n.contains(want), "{want} in {n}");
    }
    // Counters lnetctl prints.
    let v2 = client.ok(&["net", "show", "--verbose", "2"]);
    assert!(
        v2.contains("sent_stats:") && v2.contains("dropped_stats:"),
        "{v2}"
    );
    let st = client.json(&["stats", "show"]);
    assert!(num(&st, &["statistics", "msgs_max"]) >= 1, "{st}");
    assert!(num(&st["statistics"], &["rst_alloc"]) <= 1, "{st}");
    // The client's peer list has the gateway it only knows from its route.
    let peers = client.ok(&["peer", "show"]);
    assert!(peers.contains("primary nid: 127.0.50.2@tcp"), "{peers}");

    for n in [client, server, r1, r2] {
        n.stop();
    }
}
