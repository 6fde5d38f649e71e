//! Issue 10's multi-process LNet fabrics on loopback, each node a
//! `colibri lnet run` process with NIDs on its own 127.x addresses,
//! driven and observed through its control socket: two routers with one
//! killed mid-stream, Multi-Rail with a failing NI, an NI added at run
//! time, a node restarted, and a routed fabric short of credits and
//! router buffers. Every child is killed when its guard drops; every wait
//! polls a condition with a generous deadline.

mod common;

use common::*;
use std::time::Duration;

/// How long a condition may take to become true on a loaded machine.
const SETTLE: Duration = Duration::from_secs(60);
/// How long an NI's or a gateway's recovery may take: recovery pings
/// back off (1, 2, 4, … s) while they fail, each success gives back only
/// `health_sensitivity` points, and a route the router checker found down
/// waits for its next check (60 s).
const RECOVER: Duration = Duration::from_secs(180);

fn ips(list: &[&str]) -> Vec<std::net::Ipv4Addr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// `selftest brw` from `from` to `to`: `(rpcs, errors)` of its summary.
fn brw(from: &Node, to: &str, size: &str, secs: &str, conc: &str) -> (u64, u64) {
    let v = from.json(&[
        "selftest",
        "brw",
        "--to",
        to,
        "--size",
        size,
        "--duration",
        secs,
        "--concurrency",
        conc,
        "--write",
        "--interval",
        "0",
    ]);
    let st = &v["selftest"];
    (num(st, &["rpcs"]), num(st, &["errors"]))
}

fn router_yaml(a: &str, b: &str, g: &str) -> String {
    format!(
        "net:\n{}{}routing:\n    enable: 1\n{g}",
        ni("tcp", a),
        ni("tcp1", b)
    )
}

fn routes(net: &str, gws: &[&str]) -> String {
    let mut s = "route:\n".to_owned();
    for gw in gws {
        s.push_str(&format!("    - net: {net}\n      gateway: {gw}\n"));
    }
    s
}

/// Scenario 2: two routers to `tcp1`, one killed with SIGKILL in the
/// middle of a stream of 1 MiB PUTs. What was in flight through it fails
/// with lnet.md 1.5's statuses (counted in the client's `stats show`),
/// the rest is resent through the other router, the stream ends on time,
/// and the restarted router forwards again.
#[test]
fn two_routers_one_killed_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&ips(&[
        "127.0.23.2",
        "127.0.23.3",
        "127.0.23.4",
        "127.0.24.3",
        "127.0.24.4",
        "127.0.24.5",
    ]));
    let g = global(port);
    let ra_yaml = router_yaml("127.0.23.3@tcp", "127.0.24.3@tcp1", &g);
    let mut ra = Node::start(dir.path(), "ra", &ra_yaml);
    let rb = Node::start(
        dir.path(),
        "rb",
        &router_yaml("127.0.23.4@tcp", "127.0.24.4@tcp1", &g),
    );
    let server = Node::start(
        dir.path(),
        "server",
        &format!(
            "net:\n{}{}{g}",
            ni("tcp1", "127.0.24.5@tcp1"),
            routes("tcp", &["127.0.24.3@tcp1", "127.0.24.4@tcp1"])
        ),
    );
    // The client's failed sends are logged (debug), for the failure
    // messages below.
    let client = Node::start_logged(
        dir.path(),
        "client",
        &format!(
            "net:\n{}{}{g}",
            ni("tcp", "127.0.23.2@tcp"),
            routes("tcp1", &["127.0.23.3@tcp", "127.0.23.4@tcp"])
        ),
        "info,colibri_lnet::node=debug",
    );
    let srv = "127.0.24.5@tcp1";
    wait_for(SETTLE, "first ping through a router", || {
        let o = lnet(Some(&client.ctl), &["ping", srv, "--timeout", "5"]);
        if o.code == Some(0) {
            Ok(())
        } else {
            Err(o.stderr)
        }
    });

    // Both routers carry the traffic.
    let (rpcs, errors) = brw(&client, srv, "1M", "2", "4");
    assert!(rpcs > 0 && errors == 0, "rpcs {rpcs} errors {errors}");
    let (a0, b0) = (ra.stat("route_count"), rb.stat("route_count"));
    assert!(a0 > 0 && b0 > 0, "both routers forward: {a0} {b0}");

    // A stream; router A dies in its middle.
    client.ok(&["stats", "reset"]);
    let stream = Bg::start(
        &client.ctl,
        &[
            "--json",
            "selftest",
            "brw",
            "--to",
            srv,
            "--size",
            "1M",
            "--duration",
            "8",
            "--concurrency",
            "8",
            "--write",
            "--interval",
            "0",
        ],
    );
    wait_for(SETTLE, "the stream going through router A", || {
        let n = ra.stat("route_count");
        if n >= a0 + 16 { Ok(()) } else { Err(n) }
    });
    ra.kill9();
    let killed_at = std::time::Instant::now();
    let out = stream.join();
    // Nothing hangs: the stream ends within its duration plus one
    // transaction timeout (10 s) for a PUT whose ACK went with the router.
    assert!(
        killed_at.elapsed() < Duration::from_secs(40),
        "stream took {:?} after the kill",
        killed_at.elapsed()
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let summary: serde_json::Value =
        serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    let st = &summary["selftest"];
    let (rpcs, errors) = (num(st, &["rpcs"]), num(st, &["errors"]));
    let cs = client.json(&["stats", "show"]);
    let c = |k: &str| num(&cs, &["statistics", k]);
    eprintln!("stream: rpcs {rpcs} errors {errors}; client {cs}");
    assert!(rpcs > errors, "the stream went on: {st}");
    // What was in flight through the dead router failed as lnet.md 1.5
    // says: queued on a reset connection or refused reconnecting:
    // REMOTE_DROPPED (resent), the message being written: LOCAL_ERROR; a
    // PUT or ACK gone with the router: the PUT's response timeout; one
    // sent to A while its reconnection backed off: REMOTE_ERROR at once
    // (the socket LND's "No usable routes", not resent).
    let failed = c("remote_dropped_count")
        + c("local_error_count")
        + c("response_timeout_count")
        + c("remote_error_count");
    assert!(failed > 0, "something was in flight through A: {cs}");
    assert!(errors <= failed, "every failed PUT is one of those: {cs}");
    for k in [
        "local_interrupt_count",
        "local_dropped_count",
        "local_aborted_count",
        "local_no_route_count",
        "local_timeout_count",
    ] {
        assert_eq!(c(k), 0, "{k}: {cs}");
    }
    // Only what was in flight is lost: each of the 8 workers loses at
    // most its one message; what they send afterwards gets through
    // (resent through B when it tried A).
    assert!(errors <= 8, "more lost than was in flight: {st}");
    let b_now = rb.stat("route_count");
    let (rpcs, errors) = brw(&client, srv, "1M", "2", "4");
    assert!(rpcs > 0 && errors == 0, "after the kill: {rpcs} {errors}");
    assert!(rb.stat("route_count") > b_now, "B forwards");

    // Router A back (a new incarnation): routing returns to both.
    drop(ra);
    let ra = Node::start(dir.path(), "ra", &ra_yaml);
    wait_for(RECOVER, "routing through A again", || {
        let (rpcs, errors) = brw(&client, srv, "256K", "1", "4");
        let a = ra.stat("route_count");
        if a > 0 && errors == 0 {
            Ok(())
        } else {
            Err((rpcs, errors, a))
        }
    });
    let b1 = rb.stat("route_count");
    let (_, errors) = brw(&client, srv, "256K", "2", "4");
    assert_eq!(errors, 0);
    assert!(rb.stat("route_count") > b1, "B still used");

    // Resends, step by step: B killed while idle (the server's route
    // through B deleted first, so that only the client has to find out).
    // The client's PUTs that pick B are refused (REMOTE_DROPPED) and
    // resent through A: none is lost.
    server.ok(&[
        "route",
        "del",
        "--net",
        "tcp",
        "--gateway",
        "127.0.24.4@tcp1",
    ]);
    let mut rb = rb;
    // Only what the client logs after the kill counts: lines from before
    // (a connection race at start-up, say) say nothing about the
    // connections the client holds now.
    let mark = client.log_mark();
    rb.kill9();
    wait_for(SETTLE, "the client saw B's connections close", || {
        let closed = |t: &str| {
            !client
                .log_since(mark, &["closed connection", "127.0.23.4@tcp", t])
                .is_empty()
        };
        if closed("(CONTROL)") && closed("(BULK_OUT)") {
            Ok(())
        } else {
            Err(())
        }
    });
    client.ok(&["stats", "reset"]);
    let reset = client.log_mark();
    let a1 = ra.stat("route_count");
    let (rpcs, errors) = brw(&client, srv, "1M", "2", "2");
    assert!(rpcs > 0 && errors == 0, "nothing lost: {rpcs} {errors}");
    assert!(ra.stat("route_count") >= a1 + 2 * rpcs, "all through A");
    let cs = client.json(&["stats", "show"]);
    let c = |k: &str| num(&cs, &["statistics", k]);
    let routes = client.ok(&["route", "show", "--verbose"]);
    eprintln!(
        "B killed idle: rpcs {rpcs}; client {cs}; {:#?}",
        client.log_since(reset, &["send failed"])
    );
    if c("resend_count") == 0 {
        // Only if the router checker found B dead first (it pings every
        // 60 s): then no PUT tried B.
        assert!(
            routes.contains("gateway: 127.0.23.4@tcp") && routes.contains("state: down"),
            "no resend although B's route is up: {cs} {routes}"
        );
    } else {
        assert!(c("remote_dropped_count") >= c("resend_count"), "{cs}");
        assert_eq!(
            c("local_error_count") + c("response_timeout_count"),
            0,
            "{cs}"
        );
    }
    for n in [client, server, ra] {
        n.stop();
    }
}

/// `(send_count, health value)` of each local NI in `nids`.
fn ni_counts(n: &Node, nids: &[&str]) -> Vec<(u64, u64)> {
    let v = n.json(&["net", "show", "--verbose"]);
    nids.iter()
        .map(|nid| {
            let x = local_ni(&v, nid);
            (
                num(x, &["statistics", "send_count"]),
                num(x, &["health stats", "health value"]),
            )
        })
        .collect()
}

/// The NIDs of peer `prim` in `peer show --json`.
fn peer_nids(n: &Node, prim: &str) -> Vec<String> {
    let v = n.json(&["peer", "show", "--nid", prim]);
    v["peer"][0]["peer ni"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["nid"].as_str().unwrap().to_owned())
        .collect()
}

fn two_nis(a: &str, b: &str) -> String {
    format!("    - net type: tcp\n      local NI(s):\n        - nid: {a}\n        - nid: {b}\n")
}

/// Scenario 3: Multi-Rail. Client and server each have two NIs on `tcp`;
/// discovery finds both of the server's; traffic uses both local NIs and
/// both peer NIs; a drop rule failing every send from one NI lowers its
/// health and the traffic moves to the other (with no error seen by the
/// application: resends); once the rule is gone, recovery pings bring
/// the NI back to full health and it carries traffic again.
#[test]
fn multi_rail_spreads_and_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&ips(&[
        "127.0.25.2",
        "127.0.26.2",
        "127.0.25.5",
        "127.0.26.5",
    ]));
    let g = global(port);
    let (c1, c2) = ("127.0.25.2@tcp", "127.0.26.2@tcp");
    let (s1, s2) = ("127.0.25.5@tcp", "127.0.26.5@tcp");
    let server = Node::start(
        dir.path(),
        "server",
        &format!("net:\n{}{g}", two_nis(s1, s2)),
    );
    let client = Node::start(
        dir.path(),
        "client",
        &format!("net:\n{}{g}", two_nis(c1, c2)),
    );

    // Discovery finds both of the server's NIs.
    let disc = client.ok(&["discover", s1]);
    assert!(disc.contains(s2), "{disc}");
    let nids = peer_nids(&client, s1);
    assert_eq!(nids, [s1, s2], "peer NIs of the server");
    let peer = client.ok(&["peer", "show", "--nid", s1]);
    assert!(peer.contains("Multi-Rail: True"), "{peer}");

    // Traffic spreads over both NIs on both sides.
    let before = ni_counts(&client, &[c1, c2]);
    let (rpcs, errors) = brw(&client, s1, "64K", "2", "8");
    assert!(rpcs > 0 && errors == 0, "{rpcs} {errors}");
    let after = ni_counts(&client, &[c1, c2]);
    let d1 = after[0].0 - before[0].0;
    let d2 = after[1].0 - before[1].0;
    eprintln!("spread: {d1} {d2} of {rpcs}");
    assert!(
        d1 >= rpcs / 8 && d2 >= rpcs / 8,
        "both local NIs used: {d1} {d2} of {rpcs}"
    );
    let pv = client.json(&["peer", "show", "--verbose"]);
    for nid in [s1, s2] {
        let sent = num(peer_ni(&pv, nid), &["statistics", "send_count"]);
        assert!(
            sent >= rpcs / 8,
            "both peer NIs used: {nid} {sent} of {rpcs}: {pv}"
        );
    }
    let sv = server.json(&["net", "show", "--verbose"]);
    for nid in [s1, s2] {
        let r = num(local_ni(&sv, nid), &["statistics", "recv_count"]);
        assert!(r >= rpcs / 8, "server NI {nid} received {r} of {rpcs}");
    }

    // Every send from c2 fails as a local drop: its health goes down,
    // the messages are resent from c1, the application sees no error.
    client.ok(&[
        "fault",
        "drop",
        "add",
        "--source",
        c2,
        "--dest",
        "*",
        "--rate",
        "1",
        "--health_error",
        "local_dropped",
    ]);
    let (rpcs, errors) = brw(&client, s1, "64K", "2", "8");
    assert!(
        rpcs > 0 && errors == 0,
        "resent from the healthy NI: {rpcs} {errors}"
    );
    let hurt = ni_counts(&client, &[c1, c2]);
    assert!(hurt[1].1 < 1000, "c2's health went down: {hurt:?}");
    assert_eq!(hurt[0].1, 1000, "c1 healthy: {hurt:?}");
    // `net show -v` counts the failures on the NI they happened on, as
    // Lustre's `health stats: dropped` (every drop of the rule failed a
    // send from c2 with LOCAL_DROPPED; none on c1). The rule's count is
    // read after the NI's: c2 keeps trying (its recovery ping's REPLY
    // leaves from it), so a count read first could be passed.
    let v = client.json(&["net", "show", "--verbose"]);
    let on_c2 = num(local_ni(&v, c2), &["health stats", "dropped"]);
    let f = client.json(&["fault", "drop", "show"]);
    let ruled = num(&f["fault"][0], &["statistics", "dropped"]);
    assert!(ruled > 0, "{f}");
    assert!(on_c2 > 0 && on_c2 <= ruled, "{on_c2} of {ruled}: {v}");
    assert_eq!(num(local_ni(&v, c1), &["health stats", "dropped"]), 0);
    let stats = client.json(&["stats", "show"]);
    assert!(num(&stats, &["statistics", "resend_count"]) > 0, "{stats}");
    // With c2 down, the next stream goes out of c1: the rule sees no
    // more than c2's recovery pings.
    let dropped0 = num(
        &client.json(&["fault", "drop", "show"])["fault"][0],
        &["statistics", "dropped"],
    );
    let (rpcs, errors) = brw(&client, s1, "64K", "2", "8");
    assert!(rpcs > 0 && errors == 0);
    let moved = ni_counts(&client, &[c1, c2]);
    let dropped1 = num(
        &client.json(&["fault", "drop", "show"])["fault"][0],
        &["statistics", "dropped"],
    );
    let d1 = moved[0].0 - hurt[0].0;
    eprintln!(
        "moved: c1 +{d1}, c2 tries +{} of {rpcs}",
        dropped1 - dropped0
    );
    assert!(d1 >= rpcs, "c1 carries the stream: {d1} of {rpcs}");
    assert!(
        dropped1 - dropped0 < rpcs / 4,
        "c2 mostly avoided: {} tries for {rpcs} PUTs",
        dropped1 - dropped0
    );

    // The rule removed: recovery pings bring c2 back, traffic spreads.
    client.ok(&["fault", "drop", "del", "--all"]);
    let t0 = std::time::Instant::now();
    wait_for(RECOVER, "c2 recovered", || {
        let h = ni_counts(&client, &[c2])[0].1;
        if h == 1000 { Ok(()) } else { Err(h) }
    });
    eprintln!("recovered in {:?}", t0.elapsed());
    let before = ni_counts(&client, &[c1, c2]);
    let (rpcs, errors) = brw(&client, s1, "64K", "2", "8");
    assert!(rpcs > 0 && errors == 0);
    let after = ni_counts(&client, &[c1, c2]);
    let d2 = after[1].0 - before[1].0;
    assert!(d2 >= rpcs / 8, "c2 used again: {d2} of {rpcs}");
    client.stop();
    server.stop();
}

/// Scenario 4: an NI added to a running node (`net add`) is pushed to its
/// peers, which then send to it.
#[test]
fn ni_added_at_run_time_is_pushed_and_used() {
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&ips(&["127.0.27.2", "127.0.27.5", "127.0.28.5"]));
    let g = global(port);
    let (c, s1, s2) = ("127.0.27.2@tcp", "127.0.27.5@tcp", "127.0.28.5@tcp");
    let server = Node::start(dir.path(), "server", &format!("net:\n{}{g}", ni("tcp", s1)));
    let client = Node::start(dir.path(), "client", &format!("net:\n{}{g}", ni("tcp", c)));
    client.ok(&["discover", s1]);
    assert_eq!(peer_nids(&client, s1), [s1]);
    // The server learns of the client (traffic), then gets a second NI.
    let (rpcs, errors) = brw(&client, s1, "64K", "1", "2");
    assert!(rpcs > 0 && errors == 0);
    server.ok(&["net", "add", "--nid", s2]);
    // The push reaches the client: the server's peer has both NIs, with
    // no discovery asked for on the client.
    wait_for(SETTLE, "the push of the new NI", || {
        let nids = peer_nids(&client, s1);
        if nids.iter().any(|n| n == s2) {
            Ok(())
        } else {
            Err(nids)
        }
    });
    // And the client uses it.
    let (rpcs, errors) = brw(&client, s1, "64K", "2", "8");
    assert!(rpcs > 0 && errors == 0, "{rpcs} {errors}");
    let pv = client.json(&["peer", "show", "--verbose"]);
    let sent = num(peer_ni(&pv, s2), &["statistics", "send_count"]);
    assert!(sent >= rpcs / 8, "new NI used: {sent} of {rpcs}: {pv}");
    let sv = server.json(&["net", "show", "--verbose"]);
    let r = num(local_ni(&sv, s2), &["statistics", "recv_count"]);
    assert!(r >= rpcs / 8, "{r} of {rpcs}");
    client.stop();
    server.stop();
}

/// Scenario 5: a node killed and started again (a new incarnation) while
/// a peer streams to it: the peer closes the old connections (logged with
/// their reason), the stream ends on time, and traffic works both ways
/// with the new incarnation.
#[test]
fn restarted_node_is_reconnected() {
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&ips(&["127.0.29.2", "127.0.29.5"]));
    let g = global(port);
    let (c, s) = ("127.0.29.2@tcp", "127.0.29.5@tcp");
    let s_yaml = format!("net:\n{}{g}", ni("tcp", s));
    let mut server = Node::start(dir.path(), "server", &s_yaml);
    let client = Node::start(dir.path(), "client", &format!("net:\n{}{g}", ni("tcp", c)));
    let (rpcs, errors) = brw(&client, s, "1M", "1", "4");
    assert!(rpcs > 0 && errors == 0);
    server.ok(&["ping", c]);
    let stream = Bg::start(
        &client.ctl,
        &[
            "--json",
            "selftest",
            "brw",
            "--to",
            s,
            "--size",
            "64K",
            "--duration",
            "10",
            "--concurrency",
            "2",
            "--write",
            "--interval",
            "0",
        ],
    );
    wait_for(SETTLE, "the stream running", || {
        let n = server.stat("recv_count");
        if n > 20 { Ok(()) } else { Err(n) }
    });
    let mark = client.log_mark();
    server.kill9();
    drop(server);
    let server = Node::start(dir.path(), "server", &s_yaml);
    // The client closed the old incarnation's connections: at its EOF
    // (the kernel closed the killed process's sockets), at a reset (the
    // kernel resets a socket closed with bytes unread: the killed
    // process had not read all the client sent), or, when it reconnects
    // before its peer entry is forgotten, on seeing the new incarnation
    // in the HELLO ("peer rebooted").
    wait_for(SETTLE, "the old connections closed", || {
        let closed = client.log_since(mark, &["closed connection", s]);
        let control = closed.iter().any(|l| {
            l.contains("(CONTROL)")
                && (l.contains("peer closed the connection")
                    || l.contains("Connection reset by peer")
                    || l.contains("peer rebooted"))
        });
        if control {
            Ok(())
        } else {
            Err(format!("{closed:?}"))
        }
    });
    let out = stream.join();
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    // Traffic flows again, both ways.
    wait_for(SETTLE, "traffic to the restarted node", || {
        let (rpcs, errors) = brw(&client, s, "1M", "1", "4");
        if rpcs > 0 && errors == 0 {
            Ok(())
        } else {
            Err((rpcs, errors))
        }
    });
    assert!(server.stat("recv_count") > 0);
    server.ok(&["ping", c, "--timeout", "5"]);
    let (rpcs, errors) = brw(&server, c, "64K", "1", "2");
    assert!(rpcs > 0 && errors == 0);
    client.stop();
    server.stop();
}

/// A `peer:` section naming DLC-configured peers (shown by `peer
/// show` with its credits; gateways found only through routes are not).
fn peers(nids: &[&str]) -> String {
    let mut s = "peer:\n".to_owned();
    for nid in nids {
        s.push_str(&format!(
            "    - primary nid: {nid}\n      peer ni:\n        - nid: {nid}\n"
        ));
    }
    s
}

/// Scenario 1 (the part `lnet_xprt/rt/tests/multiprocess.rs` does not
/// do): a routed fabric under sixteen 1 MiB PUTs at a time, where the
/// client gives the router eight credits, the router has four large
/// buffers for the client's eight messages and gives the server two
/// credits.
/// Messages wait for credits and router buffers (the minimum credits go
/// below zero) and are all delivered when they come back (every queue
/// drained, every credit returned); 1 MiB GETs through the same router
/// bring back exactly the target's bytes.
#[test]
fn routed_with_credits_and_router_buffers_running_out() {
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&ips(&[
        "127.0.30.2",
        "127.0.30.3",
        "127.0.31.3",
        "127.0.31.4",
    ]));
    let g = global(port);
    let tight = |net: &str, nid: &str, peer: u32| {
        format!(
            "    - net type: {net}\n      local NI(s):\n        - nid: {nid}\n          tunables:\n              peer_credits: {peer}\n              credits: {}\n",
            2 * peer
        )
    };
    let router = Node::start(
        dir.path(),
        "router",
        &format!(
            "net:\n{}{}{}routing:\n    enable: 1\nbuffers:\n    tiny: 4\n    small: 4\n    large: 4\n{g}",
            tight("tcp", "127.0.30.3@tcp", 8),
            tight("tcp1", "127.0.31.3@tcp1", 2),
            peers(&["127.0.30.2@tcp", "127.0.31.4@tcp1"])
        ),
    );
    let server = Node::start(
        dir.path(),
        "server",
        &format!(
            "net:\n{}{}{g}",
            tight("tcp1", "127.0.31.4@tcp1", 2),
            routes("tcp", &["127.0.31.3@tcp1"])
        ),
    );
    let client = Node::start(
        dir.path(),
        "client",
        &format!(
            "net:\n{}{}{}{g}",
            tight("tcp", "127.0.30.2@tcp", 8),
            peers(&["127.0.30.3@tcp"]),
            routes("tcp1", &["127.0.30.3@tcp"])
        ),
    );
    let srv = "127.0.31.4@tcp1";
    wait_for(SETTLE, "first ping through the router", || {
        let o = lnet(Some(&client.ctl), &["ping", srv, "--timeout", "5"]);
        if o.code == Some(0) {
            Ok(())
        } else {
            Err(o.stderr)
        }
    });
    // The router's large pool, the client's credits towards the router
    // and the router's towards the server run out (minimums are kept, so
    // a few rounds of traffic may be needed on a slow machine)...
    let large = |n: &Node| {
        let v = n.json(&["routing", "show"]);
        v["routing"][0]["cpt[0]"]["large"].clone()
    };
    let credits = |n: &Node, nid: &str| {
        let v = n.json(&["peer", "show", "--verbose"]);
        let p = peer_ni(&v, nid).clone();
        let max = p["max_ni_tx_credits"].as_i64().unwrap();
        let min = p["min_tx_credits"].as_i64().unwrap();
        let avail = p["available_tx_credits"].as_i64().unwrap();
        let queued = p["tx_q_num_of_buf"].as_i64().unwrap();
        (max, min, avail, queued, p)
    };
    let (to_router, to_server) = ("127.0.30.3@tcp", "127.0.31.4@tcp1");
    let mut total = 0;
    let l = wait_for(SETTLE, "messages waiting for buffers and credits", || {
        let (rpcs, errors) = brw(&client, srv, "1M", "2", "16");
        assert!(rpcs > 0 && errors == 0, "{rpcs} {errors}");
        total += rpcs;
        let l = large(&router);
        let c = credits(&client, to_router).1;
        let r = credits(&router, to_server).1;
        if l["mincredits"].as_i64().unwrap() < 0 && c < 0 && r < 0 {
            Ok(l)
        } else {
            Err((l, c, r))
        }
    });
    eprintln!("large pool {l} after {total} PUTs");
    assert_eq!(num(&l, &["nbuffers"]), 4, "{l}");
    // ...and everything comes back: every buffer and credit, no queue.
    wait_for(SETTLE, "router buffers returned", || {
        let l = large(&router);
        if l["credits"] == l["nbuffers"] {
            Ok(())
        } else {
            Err(l)
        }
    });
    for (n, nid, max_credits) in [(&client, to_router, 8), (&router, to_server, 2)] {
        assert_eq!(credits(n, nid).0, max_credits);
        wait_for(SETTLE, "peer credits returned", || {
            let (max, _, avail, queued, p) = credits(n, nid);
            if avail == max && queued == 0 {
                Ok(())
            } else {
                Err(p)
            }
        });
    }
    // GET+REPLY through the same router: the 1 MiB replies are the
    // target's pattern byte for byte.
    let v = client.json(&[
        "selftest",
        "brw",
        "--to",
        srv,
        "--size",
        "1M",
        "--duration",
        "2",
        "--concurrency",
        "4",
        "--read",
        "--check",
        "--interval",
        "0",
    ]);
    let st = &v["selftest"];
    assert!(num(st, &["rpcs"]) > 0 && num(st, &["errors"]) == 0, "{v}");
    assert_eq!(num(&st["nodes"][0], &["check errors"]), 0, "{v}");
    for n in [client, server, router] {
        n.stop();
    }
}
