//! `colibri lnet` as an administrator uses it: nodes run as processes from
//! YAML files on loopback addresses, configured and measured through their
//! control sockets. Every child is killed when its guard drops (and stops
//! when its standard input closes, should the test process die); every
//! command has a deadline.

mod common;

use common::*;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn three_nodes_routed_and_configured_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.13.2", "127.0.13.3", "127.0.14.3", "127.0.14.4"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    // The router routes; the client knows the router as a peer with a
    // second NID that does not exist (deleted below) and has no route yet.
    let router = Node::start(
        dir.path(),
        "router",
        &format!(
            "net:\n{}{}routing:\n    enable: 1\n{g}",
            ni("tcp", "127.0.13.3@tcp"),
            ni("tcp1", "127.0.14.3@tcp1")
        ),
    );
    let server = Node::start(
        dir.path(),
        "server",
        &format!(
            "net:\n{}route:\n    - net: tcp\n      gateway: 127.0.14.3@tcp1\n{g}",
            ni("tcp1", "127.0.14.4@tcp1")
        ),
    );
    let client = Node::start(
        dir.path(),
        "client",
        &format!(
            "net:\n{}peer:\n    - primary nid: 127.0.13.3@tcp\n      Multi-Rail: True\n      peer ni:\n        - nid: 127.0.13.3@tcp\n        - nid: 127.0.13.99@tcp\n{g}",
            ni("tcp", "127.0.13.2@tcp")
        ),
    );

    // The configured peer, then one of its NIs deleted at run time.
    let peers = client.json(&["peer", "show"]);
    peer_ni(&peers, "127.0.13.99@tcp");
    client.ok(&[
        "peer",
        "del",
        "--prim_nid",
        "127.0.13.3@tcp",
        "--nid",
        "127.0.13.99@tcp",
    ]);
    let peers = client.ok(&["peer", "show"]);
    assert!(!peers.contains("127.0.13.99@tcp"), "{peers}");
    assert!(peers.contains("- primary nid: 127.0.13.3@tcp"), "{peers}");

    // No route to tcp1 yet: the ping fails, clearly.
    let o = lnet(
        Some(&client.ctl),
        &["ping", "127.0.14.4@tcp1", "--timeout", "2"],
    );
    assert_fails(&o, "127.0.14.4@tcp1");

    // The route, added at run time.
    client.ok(&[
        "route",
        "add",
        "--net",
        "tcp1",
        "--gateway",
        "127.0.13.3@tcp",
        "--hop",
        "1",
    ]);
    let routes = client.ok(&["route", "show", "--verbose"]);
    assert!(
        routes.contains("net: tcp1")
            && routes.contains("gateway: 127.0.13.3@tcp")
            && routes.contains("hop: 1"),
        "{routes}"
    );
    // lnetctl's ping YAML, through the router.
    let deadline = Instant::now() + CMD_LIMIT;
    let ping = loop {
        let o = lnet(
            Some(&client.ctl),
            &["ping", "127.0.14.4@tcp1", "--timeout", "5"],
        );
        if o.code == Some(0) {
            break o.stdout;
        }
        assert!(
            Instant::now() < deadline,
            "ping never succeeded: {}",
            o.stderr
        );
    };
    assert_eq!(
        ping,
        "ping:\n    - primary nid: 127.0.14.4@tcp1\n      Multi-Rail: True\n      peer ni:\n        - nid: 127.0.14.4@tcp1\n"
    );

    // Traffic, counted: N PUTs of 64 KiB with their ACKs.
    for n in [&client, &router, &server] {
        n.ok(&["stats", "reset"]);
    }
    let st = client.json(&[
        "selftest",
        "brw",
        "--to",
        "127.0.14.4@tcp1",
        "--size",
        "64K",
        "--duration",
        "2",
        "--concurrency",
        "2",
        "--write",
        "--interval",
        "0",
    ]);
    let st = &st["selftest"];
    let puts = num(st, &["rpcs"]);
    assert!(puts > 0, "{st}");
    assert_eq!(num(st, &["errors"]), 0, "{st}");
    let bytes = puts * 65536;
    // Small LNet messages (router checker and discovery pings) may add
    // a few bytes; user payloads are exact.
    let slack = 64 * 1024;
    let cs = client.json(&["stats", "show"]);
    let sent = num(&cs, &["statistics", "send_length"]);
    assert!(
        sent >= bytes && sent < bytes + slack,
        "client sent {sent}, {bytes} expected"
    );
    assert!(num(&cs, &["statistics", "send_count"]) >= puts);
    assert!(num(&cs, &["statistics", "recv_count"]) >= puts, "{cs}");
    let ss = server.json(&["stats", "show"]);
    let recv = num(&ss, &["statistics", "recv_length"]);
    assert!(
        recv >= bytes && recv < bytes + slack,
        "server received {recv}, {bytes} expected"
    );
    let rs = router.json(&["stats", "show"]);
    assert!(
        num(&rs, &["statistics", "route_count"]) >= 2 * puts,
        "PUT and ACK forwarded: {rs}"
    );
    // Per peer NI: the client's next hop (the router) and the end peer
    // (the server, found by discovery through the router) count the
    // PUTs; the server counts them from the client.
    let cp = client.json(&["peer", "show", "--verbose"]);
    let gw = peer_ni(&cp, "127.0.13.3@tcp");
    let s = num(gw, &["statistics", "send_length"]);
    assert!(s >= bytes && s < bytes + slack, "{gw}");
    assert!(num(gw, &["statistics", "send_count"]) >= puts);
    assert!(num(gw, &["statistics", "recv_count"]) >= puts, "ACKs: {gw}");
    assert_eq!(num(gw, &["health stats", "health value"]), 1000);
    let end = peer_ni(&cp, "127.0.14.4@tcp1");
    let s = num(end, &["statistics", "send_length"]);
    assert!(s >= bytes && s < bytes + slack, "{end}");
    let sp = server.json(&["peer", "show", "--verbose"]);
    let from = peer_ni(&sp, "127.0.13.2@tcp");
    let r = num(from, &["statistics", "recv_length"]);
    assert!(r >= bytes && r < bytes + slack, "{from}");
    assert!(
        num(from, &["statistics", "send_count"]) >= puts,
        "ACKs: {from}"
    );
    let yaml = server.ok(&["peer", "show", "--verbose"]);
    for key in [
        "primary nid:",
        "Multi-Rail:",
        "peer ni:",
        "max_ni_tx_credits:",
        "available_tx_credits:",
        "min_tx_credits:",
        "tx_q_num_of_buf:",
        "health value:",
    ] {
        assert!(yaml.contains(key), "{key} in {yaml}");
    }

    // Discovery through the router, and the peer list.
    let disc = client.ok(&["discover", "127.0.14.4@tcp1"]);
    assert!(
        disc.starts_with("discover:\n    - primary nid: 127.0.14.4@tcp1\n      Multi-Rail: True\n"),
        "{disc}"
    );
    let list = client.ok(&["peer", "list"]);
    assert!(
        list.contains("peer list:\n") && list.contains("    - nid: 127.0.14.4@tcp1\n"),
        "{list}"
    );

    // A drop rule at the server eats the client's pings (GETs), is seen
    // matching in its statistics, and goes away.
    server.ok(&[
        "fault",
        "drop",
        "add",
        "--source",
        "127.0.13.2@tcp",
        "--dest",
        "*",
        "--rate",
        "1",
        "--message",
        "get",
    ]);
    let o = lnet(
        Some(&client.ctl),
        &["ping", "127.0.14.4@tcp1", "--timeout", "1"],
    );
    assert_fails(&o, "127.0.14.4@tcp1");
    let f = server.json(&["fault", "drop", "show"]);
    let rule = &f["fault"][0];
    assert_eq!(rule["source"], "127.0.13.2@tcp");
    assert!(num(rule, &["statistics", "dropped"]) >= 1, "{f}");
    assert!(num(rule, &["statistics", "get"]) >= 1, "{f}");
    server.ok(&["fault", "drop", "reset"]);
    let f = server.json(&["fault", "drop", "show"]);
    assert_eq!(num(&f["fault"][0], &["statistics", "matched"]), 0, "{f}");
    server.ok(&["fault", "drop", "del", "--all"]);
    assert!(server.ok(&["fault", "drop", "show"]).trim_end() == "fault:");
    client.ok(&["ping", "127.0.14.4@tcp1", "--timeout", "5"]);

    // Routing switched off at run time, gracefully (Lustre's
    // LNET_ROUTING_STOPPING: advertised at once, forwarding for
    // alive_router_check_interval + router_ping_timeout, here 1 + 1 s);
    // then nothing goes through any more.
    for n in [&client, &server, &router] {
        n.ok(&["set", "alive_router_check_interval", "1"]);
        n.ok(&["set", "router_ping_timeout", "1"]);
    }
    router.ok(&["set", "routing", "0"]);
    let routing = router.ok(&["routing", "show"]);
    assert!(routing.contains("    - enable: 2"), "stopping: {routing}");
    router.fails_errno(&["set", "routing", "1"], 16, "being stopped");
    let routing = wait_for(Duration::from_secs(10), "routing stopped", || {
        let r = router.ok(&["routing", "show"]);
        if r.contains("    - enable: 0") {
            Ok(r)
        } else {
            Err(r)
        }
    });
    assert!(
        routing.contains("    - cpt[0]:") && routing.contains("nbuffers:"),
        "{routing}"
    );
    let before = num(
        &router.json(&["stats", "show"]),
        &["statistics", "route_count"],
    );
    let o = lnet(
        Some(&client.ctl),
        &["ping", "127.0.14.4@tcp1", "--timeout", "2"],
    );
    assert_fails(&o, "127.0.14.4@tcp1");
    let after = num(
        &router.json(&["stats", "show"]),
        &["statistics", "route_count"],
    );
    assert_eq!(before, after, "nothing forwarded with routing off");

    for n in [client, server, router] {
        let line = n.stop();
        assert!(line.contains("send_count="), "{line}");
    }
}

#[test]
fn selftest_between_two_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.15.1", "127.0.15.2"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    let a = Node::start(
        dir.path(),
        "a",
        &format!("net:\n{}{g}", ni("tcp", "127.0.15.1@tcp")),
    );
    let b = Node::start(
        dir.path(),
        "b",
        &format!("net:\n{}{g}", ni("tcp", "127.0.15.2@tcp")),
    );

    // brw write, 1 MiB, intervals as JSON lines then the summary.
    let out = a.ok(&[
        "--json",
        "selftest",
        "brw",
        "--to",
        "127.0.15.2@tcp",
        "--size",
        "1M",
        "--duration",
        "2",
        "--concurrency",
        "2",
        "--write",
    ]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 2, "{out}");
    assert!(lines[0]["interval"]["rate"].is_number(), "{out}");
    let s = &lines.last().unwrap()["selftest"];
    assert_eq!(s["mode"], "write");
    assert_eq!(num(s, &["size"]), 1 << 20);
    assert!(num(s, &["rpcs"]) > 0 && num(s, &["errors"]) == 0, "{s}");
    assert_eq!(s["nodes"][0]["nid"], "127.0.15.2@tcp");
    let bs = b.json(&["stats", "show"]);
    assert!(num(&bs, &["statistics", "recv_length"]) >= num(s, &["rpcs"]) << 20);

    // brw read with the data checked, YAML.
    let out = a.ok(&[
        "selftest",
        "brw",
        "--to",
        "127.0.15.2@tcp",
        "--size",
        "64K",
        "--duration",
        "1",
        "--read",
        "--check",
        "--interval",
        "0",
    ]);
    assert!(
        out.contains("selftest:\n    test: brw\n    mode: read\n"),
        "{out}"
    );
    assert!(
        out.contains("          brw errors: 0\n          check errors: 0\n"),
        "{out}"
    );
    assert!(!out.contains("rpcs: 0\n"), "{out}");

    // ping, both ways round.
    let p = a.json(&[
        "selftest",
        "ping",
        "--to",
        "127.0.15.2@tcp",
        "--duration",
        "1",
        "--interval",
        "0",
    ]);
    assert!(
        num(&p, &["selftest", "rpcs"]) > 0 && num(&p, &["selftest", "errors"]) == 0,
        "{p}"
    );
    // Errors per node: a target nobody serves.
    let p = b.json(&[
        "selftest",
        "ping",
        "--to",
        "127.0.15.1@tcp,127.0.15.77@tcp",
        "--duration",
        "1",
        "--interval",
        "0",
    ]);
    let nodes = p["selftest"]["nodes"].as_array().unwrap();
    assert!(num(&nodes[0], &["rpcs"]) > 0);
    assert!(num(&nodes[1], &["ping errors"]) > 0, "{p}");

    // From a group of nodes to a group of nodes.
    let from = format!("{},{}", a.ctl.display(), b.ctl.display());
    let o = lnet(
        None,
        &[
            "--json",
            "selftest",
            "brw",
            "--from",
            &from,
            "--to",
            "127.0.15.1@tcp,127.0.15.2@tcp",
            "--size",
            "4K",
            "--duration",
            "1",
            "--concurrency",
            "2",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let docs: Vec<serde_json::Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sums: Vec<&serde_json::Value> = docs.iter().filter_map(|d| d.get("selftest")).collect();
    assert_eq!(sums.len(), 2, "{}", o.stdout);
    assert!(sums.iter().any(|s| s["from"] == a.ctl.to_str().unwrap()));
    assert!(
        docs.iter()
            .any(|d| d.get("interval").is_some_and(|i| i["from"].is_string()))
    );
    let total = &docs.last().unwrap()["total"];
    assert_eq!(num(total, &["sources"]), 2);
    assert!(
        num(total, &["rpcs"]) > 0 && num(total, &["errors"]) == 0,
        "{total}"
    );

    // Bad selftest arguments.
    a.fails(
        &[
            "selftest",
            "brw",
            "--to",
            "127.0.15.2@tcp",
            "--size",
            "2M",
            "--duration",
            "1",
        ],
        "--size",
    );
    a.fails(
        &["selftest", "ping", "--to", "nonsense", "--duration", "1"],
        "not a NID",
    );
    a.stop();
    b.stop();
}

#[test]
fn export_import_round_trip_and_an_lnetctl_file() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.16.1", "127.0.16.2"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let yaml = format!(
        "net:
    - net type: tcp
      local NI(s):
        - nid: 127.0.16.1@tcp
          tunables:
              peer_credits: 16
              credits: 512
          lnd tunables:
              conns_per_peer: 2
peer:
    - primary nid: 127.0.16.50@tcp
      Multi-Rail: False
      peer ni:
        - nid: 127.0.16.50@tcp
route:
    - net: tcp5
      gateway: 127.0.16.60@tcp
      hop: 3
      priority: 1
routing:
    enable: 1
buffers:
    tiny: 100
    small: 200
    large: 30
global:
    discovery: 0
    retry_count: 1
    transaction_timeout: 40
    health_sensitivity: 50
    drop_asym_route: 1
    accept_port: {port}
    accept: all
"
    );
    let a = Node::start(dir.path(), "a", &yaml);
    let exported = dir.path().join("exported.yaml");
    a.ok(&["export", exported.to_str().unwrap()]);
    let text = std::fs::read_to_string(&exported).unwrap();
    assert_eq!(text, a.ok(&["export"]));
    for want in [
        "net type: tcp",
        "peer_credits: 16",
        "credits: 512",
        "conns_per_peer: 2",
        "Multi-Rail: False",
        "hop: 3",
        "priority: 1",
        "tiny: 100",
        "discovery: 0",
        "transaction_timeout: 40",
        "drop_asym_route: 1",
        &format!("accept_port: {port}"),
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
    a.stop();

    // A fresh node started from the export exports the same.
    let b = Node::start(dir.path(), "b", &text);
    assert_eq!(b.ok(&["export"]), text);
    b.stop();

    // A fresh node with only its NI and the acceptor, the rest imported.
    let c = Node::start(
        dir.path(),
        "c",
        &format!(
            "net:\n{}global:\n    accept_port: {port}\n    accept: all\n",
            ni("tcp", "127.0.16.1@tcp")
        ),
    );
    let o = lnet(Some(&c.ctl), &["import", exported.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let back = c.ok(&["export"]);
    // The NI's tunables and conns_per_peer are fixed when a node starts.
    let same = |s: &str| -> String {
        s.lines()
            .filter(|l| !l.contains("credits:") && !l.contains("conns_per_peer"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(same(&back), same(&text));

    // What a real lnetctl exports for a tcp node (written by hand from
    // lnetctl's shapes): accepted, with warnings for what has no meaning
    // here.
    let lnetctl = "net:
    - net type: lo
      local NI(s):
        - nid: 0@lo
          status: up
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          tunables:
              peer_timeout: 0
              peer_credits: 0
              peer_buffer_credits: 0
              credits: 0
          lnd tunables:
          dev cpt: 0
          CPT: \"[0]\"
    - net type: tcp
      local NI(s):
        - nid: 127.0.16.2@tcp
          status: up
          interfaces:
              0: eth0
          statistics:
              send_count: 0
              recv_count: 0
              drop_count: 0
          tunables:
              peer_timeout: 180
              peer_credits: 8
              peer_buffer_credits: 0
              credits: 256
          lnd tunables:
              conns_per_peer: 1
          dev cpt: -1
          CPT: \"[0,1]\"
route:
    - net: tcp9
      gateway: 127.0.16.70@tcp
      hop: -1
      priority: 0
      health_sensitivity: 1
routing:
    - cpt[0]:
          tiny:
              npages: 0
              nbuffers: 2048
              credits: 2048
              mincredits: 2048
    - enable: 1
buffers:
    tiny: 2048
    small: 16384
    large: 1024
";
    let f = dir.path().join("lnetctl.yaml");
    std::fs::write(&f, lnetctl).unwrap();
    let o = lnet(Some(&c.ctl), &["import", f.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("warning:") && o.stderr.contains("eth0"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("CPT"), "{}", o.stderr);
    let nets = c.ok(&["net", "show"]);
    assert!(nets.contains("nid: 127.0.16.2@tcp"), "{nets}");
    assert!(c.ok(&["route", "show"]).contains("net: tcp9"));
    c.stop();
}

#[test]
fn bad_input_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let run = |yaml: &str| {
        let f = dir.path().join("bad.yaml");
        std::fs::write(&f, yaml).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.args(["lnet", "run", "--config"])
            .arg(&f)
            .arg("--ctl")
            .arg(dir.path().join("bad.sock"));
        run_bounded(&mut cmd)
    };
    let tcp = |extra: &str| format!("net:\n{}{extra}", ni("tcp", "127.0.17.1@tcp"));
    assert_fails(&run("net: [\n  - net type: tcp\n"), "malformed YAML");
    assert_fails(&run(&tcp("colour: blue\n")), "invalid key 'colour'");
    assert_fails(
        &run(&format!("net:\n{}", ni("tcp", "127.0.17@tcp"))),
        "is not a NID",
    );
    assert_fails(
        &run(&tcp(
            "route:\n    - net: tcp\n      gateway: 127.0.17.2@tcp\n",
        )),
        "is a local net",
    );
    assert_fails(&run("global:\n    discovery: 1\n"), "no tcp NI");
    let missing = {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.args(["lnet", "run", "--config"])
            .arg(dir.path().join("nope.yaml"));
        run_bounded(&mut cmd)
    };
    assert_fails(&missing, "cannot read");

    // No control socket there.
    let o = lnet(Some(&dir.path().join("absent.sock")), &["net", "show"]);
    assert_fails(&o, "no control socket");
    // A node that is not running (its socket file left behind).
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert_fails(&lnet(Some(&stale), &["stats", "show"]), "node not running");
    // A node that does not answer: the client's deadline.
    let silent = dir.path().join("silent.sock");
    let l = UnixListener::bind(&silent).unwrap();
    let t0 = Instant::now();
    assert_fails(
        &lnet(Some(&silent), &["--ctl-timeout", "1", "global", "show"]),
        "in time",
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
    drop(l);

    // Bad arguments to a running node.
    let ips = ["127.0.17.1", "127.0.17.2"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let n = Node::start(dir.path(), "n", &tcp(&global(port)));
    n.fails(
        &[
            "route",
            "add",
            "--net",
            "tcp",
            "--gateway",
            "127.0.17.5@tcp",
        ],
        "local net",
    );
    n.fails(
        &["route", "add", "--net", "tcp2", "--gateway", "bogus"],
        "not a NID",
    );
    n.fails(&["peer", "add", "--prim_nid", "300.1.1.1@tcp"], "not a NID");
    n.fails(&["set", "routing", "yes"], "not a number");
    n.fails(&["set", "transaction_timeout", "0"], "transaction_timeout");
    let f = dir.path().join("bad-import.yaml");
    std::fs::write(
        &f,
        "peer:\n    - primary nid: 1.2.3.4@tcp\n      colour: red\n",
    )
    .unwrap();
    n.fails(&["import", f.to_str().unwrap()], "invalid key 'colour'");
    // --json errors are JSON on stderr.
    let o = lnet(Some(&n.ctl), &["--json", "ping", "junk"]);
    assert_ne!(o.code, Some(0));
    let v: serde_json::Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(v["manage"][0]["ping"]["errno"], -22);
    // A peer added and deleted at run time.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "127.0.17.40@tcp",
        "--nid",
        "127.0.17.41@tcp",
    ]);
    n.ok(&["peer", "add", "--prim_nid", "127.0.17.50@tcp", "--non_mr"]);
    let p = n.ok(&["peer", "show", "--nid", "127.0.17.50@tcp"]);
    assert!(p.contains("Multi-Rail: False"), "{p}");
    let p = n.ok(&["peer", "show", "--nid", "127.0.17.41@tcp"]);
    assert!(
        p.starts_with(
            "peer:\n    - primary nid: 127.0.17.40@tcp\n      Multi-Rail: True\n      peer ni:\n"
        ) && p.contains("        - nid: 127.0.17.41@tcp\n"),
        "{p}"
    );
    n.fails(
        &["peer", "del", "--prim_nid", "127.0.17.41@tcp"],
        "not the primary NID",
    );
    n.ok(&["peer", "del", "--prim_nid", "127.0.17.40@tcp"]);
    n.fails(
        &["peer", "show", "--nid", "127.0.17.41@tcp"],
        "no peer has NID",
    );

    // An NI added and deleted at run time (it listens on its own IP).
    n.ok(&["net", "add", "--nid", "127.0.17.2@tcp3"]);
    let nets = n.ok(&["net", "show", "--net", "tcp3", "--verbose"]);
    assert!(
        nets.contains("- net type: tcp3") && nets.contains("- nid: 127.0.17.2@tcp3"),
        "{nets}"
    );
    assert!(
        nets.contains("tunables:") && nets.contains("health value: 1000"),
        "{nets}"
    );
    n.fails(
        &["net", "add", "--nid", "127.0.17.2@tcp3"],
        "127.0.17.2@tcp3",
    );
    n.ok(&["net", "del", "--net", "tcp3"]);
    n.fails(&["net", "show", "--net", "tcp3"], "no local NI");
    // The node is unharmed.
    n.ok(&["global", "show"]);
    n.stop();
}

/// The files of `examples/lnet` and the README walk-through ("LNet in
/// three terminals"), on a free port instead of 7988.
#[test]
fn the_routed_example_works() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.3.2", "127.0.3.3", "127.0.4.3", "127.0.4.4"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let example = |name: &str| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/lnet")
            .join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("accept_port: 7988"), "{name}");
        text.replace("accept_port: 7988", &format!("accept_port: {port}"))
    };
    let router = Node::start(dir.path(), "router", &example("router"));
    let server = Node::start(dir.path(), "server", &example("server"));
    let client = Node::start(dir.path(), "client", &example("client"));
    for n in [&router, &server, &client] {
        assert!(!n.stderr.lock().unwrap().contains("WARN"), "no warnings");
    }
    let ping = client.ok(&["ping", "127.0.4.4@tcp1"]);
    assert!(
        ping.starts_with("ping:\n    - primary nid: 127.0.4.4@tcp1\n"),
        "{ping}"
    );
    let st = client.ok(&[
        "selftest",
        "brw",
        "--to",
        "127.0.4.4@tcp1",
        "--size",
        "1M",
        "--duration",
        "2",
        "--concurrency",
        "4",
        "--write",
    ]);
    assert!(
        st.contains("interval:") && st.contains("    errors: 0\n"),
        "{st}"
    );
    client.ok(&["peer", "show", "--verbose"]);
    let rs = router.json(&["stats", "show"]);
    assert!(num(&rs, &["statistics", "route_count"]) > 0);
    assert!(
        router
            .ok(&["routing", "show"])
            .contains("    - enable: 1\n")
    );
    // Off and on again, gracefully (1 + 1 s each way here): pings stop
    // going through, then come back.
    for n in [&router, &server, &client] {
        n.ok(&["set", "alive_router_check_interval", "1"]);
        n.ok(&["set", "router_ping_timeout", "1"]);
    }
    router.ok(&["set", "routing", "0"]);
    wait_for(Duration::from_secs(10), "routing stopped", || {
        let r = router.ok(&["routing", "show"]);
        if r.contains("    - enable: 0") {
            Ok(())
        } else {
            Err(r)
        }
    });
    client.fails(
        &["ping", "127.0.4.4@tcp1", "--timeout", "2"],
        "127.0.4.4@tcp1",
    );
    router.ok(&["set", "routing", "1"]);
    // The client learns that the router routes again (its router checker
    // or the router's push): pings go through again.
    let deadline = Instant::now() + CMD_LIMIT;
    loop {
        let o = lnet(
            Some(&client.ctl),
            &["ping", "127.0.4.4@tcp1", "--timeout", "2"],
        );
        if o.code == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "routing never came back: {}",
            o.stderr
        );
    }
    let f = dir.path().join("client-export.yaml");
    client.ok(&["export", f.to_str().unwrap()]);
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.contains("gateway: 127.0.3.3@tcp"), "{text}");
    for n in [client, server, router] {
        n.stop();
    }
}

/// Without --ctl: the node's socket is named after its primary NID in the
/// default directory, and a client without --ctl finds it while it is the
/// only one there.
#[test]
fn default_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socks = dir.path().join("run");
    std::fs::create_dir(&socks).unwrap();
    let ips = ["127.0.18.1", "127.0.18.2"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    let a = Node::start_with(
        dir.path(),
        "a",
        &format!("net:\n{}{g}", ni("tcp", "127.0.18.1@tcp")),
        Some(&socks),
    );
    assert_eq!(a.ctl, socks.join("colibri-lnet-127.0.18.1@tcp.sock"));
    let client = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.env("COLIBRI_LNET_CTL_DIR", &socks)
            .env_remove("COLIBRI_LNET_CTL")
            .arg("lnet")
            .args(args);
        run_bounded(&mut cmd)
    };
    let o = client(&["net", "show"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("nid: 127.0.18.1@tcp"), "{}", o.stdout);
    let b = Node::start_with(
        dir.path(),
        "b",
        &format!("net:\n{}{g}", ni("tcp", "127.0.18.2@tcp")),
        Some(&socks),
    );
    assert_fails(&client(&["net", "show"]), "choose one with --ctl");
    b.stop();
    a.stop();
    assert_fails(&client(&["net", "show"]), "no control socket in");
}

/// `net set` and `peer set --health` (and `net set --conns-per-peer`), as
/// `lnetctl`'s: a local NI set to 0
/// goes down and a value of 1000 or more brings it back up; a peer NI set
/// below the maximum shows that value (it enters recovery, pinged back up
/// over seconds); `--all` sets every interface of the side; a NID that is
/// not an interface, a negative value, and `--nid` with `--all` are
/// refused. (What selection does with the values: the simulator's
/// `health_set_by_hand_moves_traffic_and_recovery_brings_it_back`.) And
/// the failures `health stats` counts per interface.
#[test]
fn health_values_set_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.19.1", "127.0.19.2", "127.0.19.3"].map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    let a = Node::start(
        dir.path(),
        "a",
        &format!(
            "net:\n{}{}{g}",
            ni("tcp", "127.0.19.1@tcp"),
            ni("tcp", "127.0.19.2@tcp")
        ),
    );
    let _b = Node::start(
        dir.path(),
        "b",
        &format!("net:\n{}{g}", ni("tcp", "127.0.19.3@tcp")),
    );
    a.ok(&["ping", "127.0.19.3@tcp"]);
    let local = |nid: &str| local_ni(&a.json(&["net", "show", "--verbose"]), nid).clone();
    let health = |ni: &serde_json::Value| num(ni, &["health stats", "health value"]);

    a.ok(&["net", "set", "--nid", "127.0.19.2@tcp", "--health", "0"]);
    let n = local("127.0.19.2@tcp");
    assert_eq!(n["status"], "down", "{n}");
    assert!(health(&n) < 1000, "{n}");
    // lnetctl debug recovery: the NI waits in the local recovery queue.
    let q = a.json(&["debug", "recovery", "--local"]);
    assert_eq!(q["Local NI recovery"]["nid-0"], "127.0.19.2@tcp", "{q}");
    assert!(q["Local NI recovery"].get("nid-1").is_none(), "{q}");
    assert_eq!(local("127.0.19.1@tcp")["status"], "up");
    a.ok(&["net", "set", "--nid", "127.0.19.2@tcp", "--health", "5000"]);
    let n = local("127.0.19.2@tcp");
    assert_eq!(
        (n["status"].as_str(), health(&n)),
        (Some("up"), 1000),
        "{n}"
    );
    a.ok(&["net", "set", "--all", "--health", "0"]);
    for nid in ["127.0.19.1@tcp", "127.0.19.2@tcp"] {
        assert_eq!(local(nid)["status"], "down", "{nid}");
    }
    a.ok(&["net", "set", "--all", "--health", "1000"]);
    a.fails(&["debug", "recovery", "--local"], "No NIDs in recovery");
    // `--conns-per-peer`: the NI's socket LND connections per peer met
    // from now on; above 127 is refused; one of the two options is needed.
    a.ok(&[
        "net",
        "set",
        "--nid",
        "127.0.19.1@tcp",
        "--conns-per-peer",
        "3",
    ]);
    let cpp = |nid: &str| num(&local(nid), &["lnd tunables", "conns_per_peer"]);
    assert_eq!((cpp("127.0.19.1@tcp"), cpp("127.0.19.2@tcp")), (3, 1));
    let exported = a.ok(&["export"]);
    assert!(
        exported.contains("- nid: 127.0.19.1@tcp\n") && exported.contains("conns_per_peer: 3\n"),
        "{exported}"
    );
    a.fails(
        &["net", "set", "--all", "--conns-per-peer", "200"],
        "outside 0..=127",
    );
    let neither = lnet(Some(&a.ctl), &["net", "set", "--nid", "127.0.19.1@tcp"]);
    assert_eq!(neither.code, Some(2), "{}", neither.stderr);

    // `--net tcp --lnd-timeout S`: the socket LND's timeout, shown as
    // its `timeout` tunable; 0 follows LNet's lnd_timeout (global show),
    // which follows the transaction timeout and retry count.
    let timeout = |nid: &str| num(&local(nid), &["lnd tunables", "timeout"]);
    assert_eq!(timeout("127.0.19.1@tcp"), 50, "socklnd's default");
    let tos = local("127.0.19.1@tcp")["lnd tunables"]["tos"].as_i64();
    assert_eq!(tos, Some(-1), "socklnd's default: the system's");
    a.ok(&["net", "set", "--net", "tcp", "--lnd-timeout", "7"]);
    assert_eq!(
        (timeout("127.0.19.1@tcp"), timeout("127.0.19.2@tcp")),
        (7, 7)
    );
    a.ok(&["net", "set", "--net", "tcp", "--lnd-timeout", "0"]);
    let lnd_timeout = || num(&a.json(&["global", "show"]), &["global", "lnd_timeout"]);
    assert_eq!(timeout("127.0.19.1@tcp"), lnd_timeout());
    a.ok(&["set", "transaction_timeout", "40"]);
    assert_eq!(timeout("127.0.19.1@tcp"), lnd_timeout());
    assert_eq!(lnd_timeout(), 13, "(40 - 1) / (2 + 1)");
    a.fails(
        &["net", "set", "--net", "lo", "--lnd-timeout", "5"],
        "does not accept an LND timeout",
    );
    a.fails(
        &["net", "set", "--net", "tcp", "--lnd-timeout", "-1"],
        "invalid LND timeout",
    );
    let alone = lnet(Some(&a.ctl), &["net", "set", "--lnd-timeout", "5"]);
    assert_eq!(alone.code, Some(2), "{}", alone.stderr);

    a.ok(&["peer", "set", "--nid", "127.0.19.3@tcp", "--health", "100"]);
    let v = a.json(&["peer", "show", "--verbose"]);
    let p = peer_ni(&v, "127.0.19.3@tcp");
    assert!(num(p, &["health stats", "health value"]) < 1000, "{p}");
    let q = a.json(&["debug", "recovery", "--peer"]);
    assert_eq!(q["Peer NI recovery"]["nid-0"], "127.0.19.3@tcp", "{q}");

    a.fails(
        &["peer", "set", "--nid", "127.0.19.9@tcp", "--health", "0"],
        "not a known peer NI",
    );
    a.fails(
        &["net", "set", "--nid", "127.0.19.3@tcp", "--health", "0"],
        "not a local NI",
    );
    a.fails(&["net", "set", "--all", "--health", "-1"], "negative");
    let both = lnet(
        Some(&a.ctl),
        &[
            "net",
            "set",
            "--all",
            "--nid",
            "127.0.19.1@tcp",
            "--health",
            "0",
        ],
    );
    assert_eq!(both.code, Some(2), "{}", both.stderr);

    // The failures counted on the peer NI they happened on (`health
    // stats` of `peer show -v`, as Lustre's): pings that the peer
    // "refuses" (a drop rule simulating REMOTE_DROPPED).
    a.ok(&[
        "fault",
        "drop",
        "add",
        "--source",
        "*",
        "--dest",
        "127.0.19.3@tcp",
        "--rate",
        "1",
        "--health_error",
        "remote_dropped",
    ]);
    let failed = lnet(Some(&a.ctl), &["ping", "127.0.19.3@tcp", "--timeout", "2"]);
    assert_ne!(failed.code, Some(0), "{}", failed.stdout);
    let v = a.json(&["peer", "show", "--verbose"]);
    let p = peer_ni(&v, "127.0.19.3@tcp");
    assert!(num(p, &["health stats", "dropped"]) > 0, "{p}");
    assert_eq!(num(p, &["health stats", "timeout"]), 0, "{p}");
    // `stats reset` zeroes them (the health value stays), and the peer,
    // known from its traffic only (a ping does not discover it), stays a peer in
    // `peer show` and `peer list` (it vanished from both before).
    a.ok(&["stats", "reset"]);
    let v = a.json(&["peer", "show", "--verbose"]);
    assert_eq!(
        num(peer_ni(&v, "127.0.19.3@tcp"), &["health stats", "dropped"]),
        0
    );
    // (The node's own NIDs are listed too once it talked to itself, as
    // Lustre lists them.)
    let list = a.json(&["peer", "list"]);
    assert!(
        list["peer list"]
            .as_array()
            .is_some_and(|l| l.iter().any(|p| p["nid"] == "127.0.19.3@tcp")),
        "{list}"
    );
}

/// A Multi-Rail client killed and started again with one of its NIs at
/// another address: the server learns the new NIs and forgets the old one.
/// The first incarnation changed its NIs twice (`net add`, `net del`), so
/// the second one's ping buffer is numbered lower than the last the server
/// saw: its push is ignored (the discovery design's rule) and the server
/// pings it instead, as Lustre would take it ("peer rebooted?").
#[test]
fn a_restarted_multi_rail_client_is_known_by_its_new_nis() {
    let dir = tempfile::tempdir().unwrap();
    let ips = [
        "127.0.20.1",
        "127.0.20.2",
        "127.0.20.3",
        "127.0.20.4",
        "127.0.20.5",
        "127.0.20.6",
    ]
    .map(|s| s.parse().unwrap());
    let port = common_free_port(&ips);
    let g = global(port);
    let two = |a: &str, b: &str| format!("net:\n{}{}{g}", ni("tcp", a), ni("tcp", b));
    let s = Node::start(dir.path(), "s", &two("127.0.20.1@tcp", "127.0.20.2@tcp"));
    let mut c = Node::start(dir.path(), "c", &two("127.0.20.3@tcp", "127.0.20.4@tcp"));
    c.ok(&["net", "add", "--nid", "127.0.20.6@tcp"]);
    c.ok(&["net", "del", "--nid", "127.0.20.6@tcp"]);
    c.ok(&["discover", "127.0.20.1@tcp"]);
    // Lustre's lp_state bits: MULTI_RAIL | DISCOVERED | NIDS_UPTODATE.
    let v = c.json(&["peer", "show", "--verbose"]);
    let server = v["peer"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["primary nid"] == "127.0.20.1@tcp")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(server["peer state"], 273, "{server}");
    assert_eq!(
        server["discovery state"], "LNET_PEER_STATE_ACTIVE",
        "{server}"
    );
    // The server's view of the client's NIs, once it holds `want`.
    let nis_of_client = |want: &[&str]| {
        wait_for(
            Duration::from_secs(10),
            "the server's entry of the client",
            || {
                let v = s.json(&["peer", "show"]);
                let nids: Vec<String> = v["peer"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["peer ni"].as_array())
                    .find(|n| n.iter().any(|n| n["nid"] == "127.0.20.3@tcp"))
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n["nid"].as_str().map(str::to_owned))
                    .collect();
                if nids == want { Ok(()) } else { Err(nids) }
            },
        )
    };
    nis_of_client(&["127.0.20.3@tcp", "127.0.20.4@tcp"]);

    c.kill9();
    let c2 = Node::start(dir.path(), "c2", &two("127.0.20.3@tcp", "127.0.20.5@tcp"));
    c2.ok(&["discover", "127.0.20.1@tcp"]);
    nis_of_client(&["127.0.20.3@tcp", "127.0.20.5@tcp"]);
    // And the server reaches the new NI.
    s.ok(&["ping", "127.0.20.5@tcp"]);
}

/// What Lustre's `sanity-lnet.sh` does with peers (its tests 4 to 18a, on
/// one node): NID ranges in `peer add` and `peer del` (`4.4.4.[1-3]@tcp`,
/// `[6-12/4]@gni`, lists whose items hold commas), abbreviated long
/// options (`--prim`), `import` from standard input and `import --del`,
/// and `export --backup`, compared with the NIDs its expected files list.
#[test]
fn peers_as_sanity_lnet_configures_them() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.80.1".parse().unwrap()];
    let port = common_free_port(&ips);
    let g = global(port);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{g}", ni("tcp", "127.0.80.1@tcp")),
    );
    let base = n.ok(&["export", "--backup"]);
    assert_eq!(base, n.ok(&["export"]), "export is always the backup form");
    // The NIDs of peer `primary` in `export -b`, in order.
    let nids_of = |primary: &str| -> Vec<String> {
        let v = n.json(&["export", "-b"]);
        v["peer"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["primary nid"] == primary)
            .and_then(|p| p["peer ni"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|x| x["nid"].as_str().map(str::to_owned))
            .collect()
    };
    let ip_nids = |prefix: &str, last: &[u32], net: &str| -> Vec<String> {
        last.iter().map(|l| format!("{prefix}.{l}@{net}")).collect()
    };
    // Test 4: a range, then one overlapping the primary (no change).
    n.ok(&[
        "peer",
        "add",
        "--prim",
        "4.4.4.4@tcp",
        "--nid",
        "4.4.4.[1-3]@tcp",
    ]);
    n.ok(&[
        "peer",
        "add",
        "--prim",
        "4.4.4.4@tcp",
        "--nid",
        "4.4.4.[1-4]@tcp",
    ]);
    assert_eq!(
        nids_of("4.4.4.4@tcp"),
        ip_nids("4.4.4", &[4, 1, 2, 3], "tcp")
    );
    // Test 5: commas inside the brackets.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "5.5.5.5@o2ib",
        "--nid",
        "5.5.5.[1,2,3-4]@o2ib",
    ]);
    assert_eq!(
        nids_of("5.5.5.5@o2ib"),
        ip_nids("5.5.5", &[5, 1, 2, 3, 4], "o2ib")
    );
    // Test 6: several ranges, steps, numeric nets.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "6.6.6.6@tcp",
        "--nid",
        "6.6.[6-7].[0-4/2]@tcp,6.6.[1-4/2].[0-6/3]@o2ib,[6-12/4]@gni,[6-12/4]@kfi",
    ]);
    let mut want = vec!["6.6.6.6@tcp".to_owned()];
    want.extend(ip_nids("6.6.6", &[0, 2, 4], "tcp"));
    want.extend(ip_nids("6.6.7", &[0, 2, 4], "tcp"));
    want.extend(ip_nids("6.6.1", &[0, 3, 6], "o2ib"));
    want.extend(ip_nids("6.6.3", &[0, 3, 6], "o2ib"));
    want.extend(["6@gni", "10@gni", "6@kfi", "10@kfi"].map(str::to_owned));
    assert_eq!(nids_of("6.6.6.6@tcp"), want);
    // Tests 8 and 12: one secondary NID deleted; two from a ranged add.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "8.8.8.8@tcp",
        "--nid",
        "8.8.8.[10-15]@tcp",
    ]);
    n.ok(&[
        "peer",
        "del",
        "--prim_nid",
        "8.8.8.8@tcp",
        "--nid",
        "8.8.8.13@tcp",
    ]);
    assert_eq!(
        nids_of("8.8.8.8@tcp"),
        ip_nids("8.8.8", &[8, 10, 11, 12, 14, 15], "tcp")
    );
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "12.12.12.12@o2ib",
        "--nid",
        "[13-14/1].[13-15/2].13.13@o2ib,[15-16/3].[17-19/4].[1].[5-20/5]@tcp",
    ]);
    n.ok(&[
        "peer",
        "del",
        "--prim_nid",
        "12.12.12.12@o2ib",
        "--nid",
        "13.15.13.13@o2ib,15.17.1.15@tcp",
    ]);
    assert_eq!(
        nids_of("12.12.12.12@o2ib"),
        [
            "12.12.12.12@o2ib",
            "13.13.13.13@o2ib",
            "14.13.13.13@o2ib",
            "14.15.13.13@o2ib",
            "15.17.1.5@tcp",
            "15.17.1.10@tcp",
            "15.17.1.20@tcp"
        ]
    );
    n.ok(&["peer", "del", "--prim_nid", "12.12.12.12@o2ib"]);
    // Test 13: every secondary by the expression that added them.
    let expr = "[14-15].[1-2/1].[1].[100-254/10]@tcp,14.14.[254].14@o2ib";
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "13.13.13.13@o2ib",
        "--nid",
        expr,
    ]);
    assert_eq!(nids_of("13.13.13.13@o2ib").len(), 1 + 2 * 2 * 16 + 1);
    n.ok(&[
        "peer",
        "del",
        "--prim_nid",
        "13.13.13.13@o2ib",
        "--nid",
        expr,
    ]);
    assert_eq!(nids_of("13.13.13.13@o2ib"), ["13.13.13.13@o2ib"]);
    // Test 7: a list naming the primary deletes the whole peer.
    n.ok(&[
        "peer",
        "del",
        "--prim_nid",
        "8.8.8.8@tcp",
        "--nid",
        "8.8.8.8@tcp,8.8.8.10@tcp",
    ]);
    assert!(nids_of("8.8.8.8@tcp").is_empty());
    // Bad ranges, and more than 128 NIDs, are refused and change nothing.
    for (expr, want) in [
        ("9.9.9.[3-1]@tcp", "the end is below the start"),
        ("9.9.[0-255].[0-255]@tcp", "more than the 128 NIDs"),
        ("9.9.9.*@tcp", "asterisk"),
        ("9.9.9.[1-3@tcp", "unbalanced brackets"),
    ] {
        n.fails(
            &["peer", "add", "--prim_nid", "9.9.9.9@tcp", "--nid", expr],
            want,
        );
    }
    assert!(nids_of("9.9.9.9@tcp").is_empty());
    for p in [
        "4.4.4.4@tcp",
        "5.5.5.5@o2ib",
        "6.6.6.6@tcp",
        "13.13.13.13@o2ib",
    ] {
        n.ok(&["peer", "del", "--prim_nid", p]);
    }
    assert_eq!(n.ok(&["export", "-b"]), base);
    // A gateway range: a route through each, deleted the same way.
    n.ok(&[
        "route",
        "add",
        "--net",
        "tcp7",
        "--gateway",
        "127.0.80.[2-3]@tcp",
    ]);
    let gws = |n: &Node| -> Vec<String> {
        let v = n.json(&["route", "show"]);
        v["route"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["gateway"].as_str().map(str::to_owned))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    assert_eq!(gws(&n), ["127.0.80.2@tcp", "127.0.80.3@tcp"]);
    n.ok(&[
        "route",
        "del",
        "--net",
        "tcp7",
        "--gateway",
        "127.0.80.[2,3]@tcp",
    ]);
    assert!(gws(&n).is_empty());
    assert_eq!(n.ok(&["export", "-b"]), base);

    // Test 26: a locked primary NID (LNET_PEER_LOCK_PRIMARY, bit 20 of
    // `peer state`) survives `peer del`; `--force` deletes the peer.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "26.26.26.26@tcp",
        "--nid",
        "26.26.26.27@tcp",
        "--lock_prim",
    ]);
    let v = n.json(&["peer", "show", "-v", "--nid", "26.26.26.26@tcp"]);
    let state = v["peer"][0]["peer state"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        state,
        1 | (1 << 3) | (1 << 20),
        "MULTI_RAIL | CONFIGURED | LOCK_PRIMARY"
    );
    n.ok(&["peer", "del", "--prim_nid", "26.26.26.26@tcp"]);
    assert_eq!(nids_of("26.26.26.26@tcp"), ["26.26.26.26@tcp"]);
    n.ok(&["peer", "del", "--prim_nid", "26.26.26.26@tcp", "--force"]);
    assert!(nids_of("26.26.26.26@tcp").is_empty());
    assert_eq!(n.ok(&["export", "-b"]), base);

    // Tests 14 to 18a: import from standard input, then `import --del` of
    // the same file (whole peers), then of a subset (those NIDs only).
    let two = "peer:\n    - primary nid: 1.1.1.1@tcp\n      Multi-Rail: True\n      peer ni:\n        - nid: 1.1.1.1@tcp\n        - nid: 2.2.2.2@tcp\n        - nid: 4.4.4.4@tcp\n        - nid: 3.3.3.3@o2ib\n        - nid: 5@gni\n    - primary nid: 6.6.6.6@o2ib\n      Multi-Rail: True\n      peer ni:\n        - nid: 6.6.6.6@o2ib\n";
    let ok_stdin = |args: &[&str], input: &str| {
        let o = lnet_stdin(Some(&n.ctl), args, input);
        assert_eq!(o.code, Some(0), "{args:?}: {}{}", o.stdout, o.stderr);
    };
    ok_stdin(&["import"], two);
    assert_eq!(nids_of("1.1.1.1@tcp").len(), 5);
    assert_eq!(nids_of("6.6.6.6@o2ib"), ["6.6.6.6@o2ib"]);
    ok_stdin(&["import", "--del"], two);
    assert_eq!(n.ok(&["export", "-b"]), base);
    ok_stdin(&["import", "-"], two);
    let subset = "peer:\n    - primary nid: 1.1.1.1@tcp\n      Multi-Rail: True\n      peer ni:\n        - nid: 2.2.2.2@tcp\n        - nid: 3.3.3.3@o2ib\n        - nid: 5@gni\n";
    ok_stdin(&["import", "-d"], subset);
    assert_eq!(nids_of("1.1.1.1@tcp"), ["1.1.1.1@tcp", "4.4.4.4@tcp"]);
    assert_eq!(nids_of("6.6.6.6@o2ib"), ["6.6.6.6@o2ib"]);
}

/// More of Lustre's `sanity-lnet.sh`, run by hand against one node with
/// two NIs: test 28 (`peer list`, `--ni` for `--nid`), 105 and 106 (a
/// router's peer is neither re-created nor deleted), 302 (`debug peer`)
/// and 304 (a locked primary survives consolidation, `peer set --state`),
/// with Lustre's errnos; 230 and 232 (`conns-per-peer` and `tos` checks).
#[test]
fn routers_locked_primaries_and_debug_as_sanity_lnet_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let ips = [
        "127.0.81.1".parse().unwrap(),
        "127.0.81.2".parse().unwrap(),
        "127.0.81.3".parse().unwrap(),
    ];
    let port = common_free_port(&ips);
    let (nid1, nid2) = ("127.0.81.1@tcp", "127.0.81.2@tcp");
    let n = Node::start(
        dir.path(),
        "n",
        &format!(
            "net:\n    - net type: tcp\n      local NI(s):\n        - nid: {nid1}\n        - nid: {nid2}\n{}",
            global(port)
        ),
    );
    let state = |nid: &str| -> u64 {
        let v = n.json(&["peer", "show", "-v", "4", "--nid", nid]);
        v["peer"][0]["peer state"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    // Test 28.
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "1.1.1.1@tcp",
        "--ni",
        "7.7.7.7@tcp",
    ]);
    n.ok(&[
        "peer",
        "add",
        "--prim_nid",
        "1.1.1.2@tcp",
        "--nid",
        "7.7.7.8@tcp",
    ]);
    let list = n.ok(&["peer", "list"]);
    assert_eq!(
        list.lines()
            .filter(|l| l.trim_start().starts_with("- nid:"))
            .count(),
        2,
        "{list}"
    );
    // Lustre's errnos for DLC's refusals.
    n.fails_errno(
        &[
            "peer",
            "add",
            "--prim_nid",
            "1.1.1.3@tcp",
            "--nid",
            "7.7.7.8@tcp",
        ],
        17,
        "already belongs",
    );
    n.fails_errno(
        &["peer", "add", "--prim_nid", "1.1.1.1@tcp", "--non_mr"],
        1,
        "Multi-Rail",
    );
    n.fails_errno(
        &["peer", "set", "--nid", "1.1.1.9@tcp", "--state", "1"],
        2,
        "no peer",
    );
    for p in ["1.1.1.1@tcp", "1.1.1.2@tcp"] {
        n.ok(&["peer", "del", "--prim_nid", p]);
    }

    // Test 241 reads `global show -v` (lnetctl ignores `-v` there).
    assert_eq!(n.ok(&["global", "show", "-v"]), n.ok(&["global", "show"]));
    assert_eq!(n.ok(&["routing", "show", "-v"]), n.ok(&["routing", "show"]));
    // Test 230: a negative conns-per-peer is ignored, 128 refused.
    n.ok(&["net", "set", "--all", "--conns-per-peer", "-1"]);
    n.fails_errno(
        &["net", "set", "--all", "--conns-per-peer", "128"],
        22,
        "127",
    );
    // Test 232: an NI's type of service, -1 to 255, in `net show -v` and
    // in the export.
    let tos_of = |net: &str| -> i64 {
        let v = n.json(&["net", "show", "--net", net, "-v", "1"]);
        v["net"][0]["local NI(s)"][0]["lnd tunables"]["tos"]
            .as_i64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    let ni3 = "127.0.81.3@tcp232";
    n.ok(&["net", "add", "--nid", ni3]);
    assert_eq!(tos_of("tcp232"), -1, "the LND's default");
    n.ok(&["net", "del", "--nid", ni3]);
    for t in ["-1", "104", "106"] {
        n.ok(&["net", "add", "--nid", ni3, "--tos", t]);
        assert_eq!(tos_of("tcp232").to_string(), t);
        assert_eq!(
            n.ok(&["export"]).contains("tos: 104"),
            t == "104",
            "export keeps a set ToS"
        );
        n.ok(&["net", "del", "--nid", ni3]);
    }
    n.fails_errno(&["net", "add", "--nid", ni3, "--tos", "300"], 22, "ToS");

    // Tests 105 and 106: EBUSY for a gateway's peer, until its route goes.
    let gw = "127.0.81.77@tcp";
    n.ok(&["route", "add", "--net", "tcp9", "--gateway", gw]);
    n.fails_errno(&["peer", "add", "--prim", gw], 16, "is a router");
    n.fails_errno(&["peer", "del", "--prim", gw], 16, "is a router");
    n.ok(&["route", "del", "--net", "tcp9", "--gateway", gw]);
    n.ok(&["peer", "add", "--prim", gw]);
    n.ok(&["peer", "del", "--prim", gw]);

    // Test 302: the node pings itself, then dumps the peer NI.
    n.ok(&["ping", nid1]);
    let v = n.json(&["debug", "peer", "--nid", nid1]);
    let d = &v["peer debug"][0];
    assert_eq!(d["nid"], nid1, "{v}");
    assert!(d["tx_credits"].as_i64().is_some(), "{v}");
    n.fails_errno(&["debug", "peer", "--nid", "nonsense"], 22, "not a NID");

    // Test 304: nid2 is added with its primary locked (MULTI_RAIL |
    // CONFIGURED | LOCK_PRIMARY), made unconfigured by hand, then
    // discovery of nid1 finds both NIDs on one node: one peer, nid2
    // still its primary, now discovered (| DISCOVERED | NIDS_UPTODATE).
    n.ok(&["peer", "add", "--prim_nid", nid2, "--lock_prim"]);
    assert_eq!(state(nid2), 1_048_585);
    n.ok(&["peer", "set", "--nid", nid2, "--state", "1048577"]);
    assert_eq!(state(nid2), 1_048_577);
    n.ok(&["discover", nid1]);
    let v = n.json(&["peer", "show"]);
    let peers: Vec<&serde_json::Value> = v["peer"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["peer ni"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["nid"] == nid1 || x["nid"] == nid2)
        })
        .collect();
    assert_eq!(peers.len(), 1, "consolidated: {v}");
    assert_eq!(peers[0]["primary nid"], nid2, "{v}");
    assert_eq!(peers[0]["peer ni"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(state(nid2), 1_048_849);
    // `--state` takes one peer, and a Multi-Rail peer with two NIDs on
    // one net stays Multi-Rail.
    n.fails_errno(&["peer", "set", "--all", "--state", "1"], 22, "one peer");
    n.fails_errno(
        &["peer", "set", "--nid", nid2, "--state", "0"],
        22,
        "must stay Multi-Rail",
    );
    // The locked primary outlives `peer del` until `--force`.
    n.ok(&["peer", "del", "--prim_nid", nid2]);
    assert_eq!(state(nid2) & (1 << 20), 1 << 20);
    n.ok(&["peer", "del", "--prim_nid", nid2, "--force"]);
}

/// A node with an NI on `tcp` and one on `second` at the same `ip` (two
/// nets on one interface): the node, both NIDs and its port.
fn two_net_node(dir: &Path, ip: &str, second: &str) -> (Node, String, String, u16) {
    let port = common_free_port(&[ip.parse().unwrap()]);
    let (nid1, nid2) = (format!("{ip}@tcp"), format!("{ip}@{second}"));
    let n = Node::start(
        dir,
        "n",
        &format!(
            "net:\n{}{}{}",
            ni("tcp", &nid1),
            ni(second, &nid2),
            global(port)
        ),
    );
    (n, nid1, nid2, port)
}

/// Lustre's sanity-lnet test 219 ("Consolidate peer entries"): nets `tcp`
/// and `tcp1` on one interface share its address and port; the node
/// pings both NIDs, discovers the second, and knows them as one peer;
/// then test 350, `import --exec` of a ping and a discovery.
#[test]
fn two_nets_on_one_interface_are_one_peer() {
    let dir = tempfile::tempdir().unwrap();
    let (n, nid1, nid2, _) = two_net_node(dir.path(), "127.0.82.1", "tcp1");
    n.ok(&["ping", &nid1]);
    n.ok(&["ping", &nid2]);
    n.ok(&["discover", &nid2]);
    let show = n.ok(&["peer", "show", "--nid", &nid1]);
    assert!(show.contains(&nid2), "{show}");
    // Test 350: the same through `import --exec`.
    for (what, block) in [("ping", &nid1), ("discover", &nid2)] {
        let o = lnet_stdin(
            Some(&n.ctl),
            &["import", "-e"],
            &format!("{what}:\n  nids:\n    0: {block}\n"),
        );
        assert_eq!(o.code, Some(0), "{what}: {}{}", o.stdout, o.stderr);
        assert!(o.stdout.starts_with(&format!("{what}:\n")), "{}", o.stdout);
        assert!(o.stdout.contains(&nid2), "{}", o.stdout);
    }
    let o = lnet_stdin(
        Some(&n.ctl),
        &["import", "--exec"],
        "peer:\n    - primary nid: 1.2.3.4@tcp\n",
    );
    assert_fails(&o, "invalid key 'peer'");
}

/// Lustre's sanity-lnet test 525 ("keep reachable peer on local net
/// delete"): a node discovers its own NID on `tcp` and knows it as one
/// peer with `tcp2`; deleting the net `tcp` keeps that peer, its primary
/// NID moved to `tcp2`, and, once its push says `tcp` is gone, no peer
/// lists `tcp`, as `lnet_peer_tables_cleanup` and discovery leave it in
/// Lustre. A route through a gateway on the deleted net goes with it; a
/// deleted peer is no longer shown.
#[test]
fn a_deleted_net_keeps_its_reachable_peer_as_sanity_lnet_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let (n, nid1, nid2, _) = two_net_node(dir.path(), "127.0.82.2", "tcp2");
    n.ok(&["discover", &nid1]);
    let show = n.ok(&["peer", "show", "--nid", &nid1]);
    assert!(show.contains(&nid2), "{show}");
    n.ok(&[
        "route",
        "add",
        "--net",
        "tcp9",
        "--gateway",
        "127.0.82.9@tcp",
    ]);
    n.ok(&["net", "del", "--net", "tcp"]);
    let want = format!(
        "peer:\n    - primary nid: {nid2}\n      Multi-Rail: True\n      peer ni:\n        - nid: {nid2}\n          state: up\n"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let show = n.ok(&["peer", "show"]);
        if show == want {
            break;
        }
        assert!(Instant::now() < deadline, "{show}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!n.ok(&["route", "show"]).contains("tcp9"));
    // `peer del` of a peer we exchanged messages with: it is gone, not
    // shown again as a peer known from its traffic.
    n.ok(&["peer", "del", "--prim_nid", &nid2]);
    assert!(!n.ok(&["peer", "show"]).contains(&nid2));
    // Traffic with it makes it known again, as Lustre creates a new peer.
    n.ok(&["ping", &nid2]);
    assert!(n.ok(&["peer", "show"]).contains(&nid2));
    n.stop();
}

/// Selection policies as Lustre's sanity-lnet tests 400 to 404 use them
/// (`udsp add|del|show`, `udsp info` in `net show -v 4` and `peer show -v
/// 4`, export and import), and a node started from a file with rules.
#[test]
fn selection_policies_as_sanity_lnet_sets_them() {
    let dir = tempfile::tempdir().unwrap();
    let ip = "127.0.83.1";
    let (n, nid1, nid2, port) = two_net_node(dir.path(), ip, "tcp2");
    // `nid: (net priority, nid priority)` of `net show` or `peer show`.
    let prios = |what: &str| -> Vec<(String, i64, i64)> {
        let v = n.json(&[what, "show", "-v", "5"]);
        let mut out = Vec::new();
        let mut walk = |ni: &serde_json::Value| {
            if let (Some(nid), Some(u)) = (ni["nid"].as_str(), ni.get("udsp info")) {
                out.push((
                    nid.to_owned(),
                    u["net priority"].as_i64().unwrap(),
                    u["nid priority"].as_i64().unwrap(),
                ));
            }
        };
        for x in v[what].as_array().unwrap() {
            let list = if what == "net" {
                "local NI(s)"
            } else {
                "peer ni"
            };
            x[list].as_array().unwrap().iter().for_each(&mut walk);
        }
        out
    };
    // Test 400.
    n.ok(&["udsp", "add", "--src", "tcp", "--priority", "0"]);
    n.ok(&["udsp", "del", "--idx", "0"]);
    // Test 403: each role, a net and a NID; shown, deleted, nothing shown.
    for role in ["--src", "--dst"] {
        for arg in ["tcp", "1.1.1.1@tcp"] {
            n.ok(&["udsp", "add", role, arg, "--prio", "1"]);
            let v = n.json(&["udsp", "show"]);
            let r = &v["udsp"][0];
            assert_eq!(r["idx"], 0, "{v}");
            assert_eq!(r[&role[2..]], arg, "{v}");
            assert_eq!(r["action"]["priority"], 1, "{v}");
            n.ok(&["udsp", "del", "--idx", "0"]);
            assert_eq!(n.ok(&["udsp", "show"]), "", "no rule, no output");
        }
    }
    // Test 401: a peer net rule, seen on the discovered peer's NIs.
    n.ok(&["udsp", "add", "--dst", "tcp", "--prio", "1"]);
    n.ok(&["discover", &nid1]);
    let peer = prios("peer");
    assert!(peer.contains(&(nid1.clone(), 1, -1)), "{peer:?}");
    assert!(peer.contains(&(nid2.clone(), -1, -1)), "{peer:?}");
    n.ok(&["udsp", "del", "--all"]);
    // Test 404: source rules on a net and on a NID, through an export and
    // an import.
    n.ok(&["udsp", "add", "--src", "tcp2", "--prio", "1"]);
    n.ok(&["udsp", "add", "--src", &nid1, "--prio", "3"]);
    let local = prios("net");
    assert!(local.contains(&(nid1.clone(), -1, 3)), "{local:?}");
    assert!(local.contains(&(nid2.clone(), 1, -1)), "{local:?}");
    let export = n.ok(&["export", "-b"]);
    assert!(export.contains("udsp:"), "{export}");
    n.ok(&["udsp", "del", "--all"]);
    assert_eq!(prios("net")[0].1, -1);
    let o = lnet_stdin(Some(&n.ctl), &["import"], &export);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert_eq!(n.ok(&["export", "-b"]), export);
    assert_eq!(prios("net"), local);
    // Refusals, with lnetctl's errnos.
    n.fails_errno(
        &["udsp", "add", "--src", "tcp2", "--prio", "1"],
        114,
        "there already",
    );
    n.fails_errno(&["udsp", "del", "--idx", "9"], 2, "no rule at index 9");
    n.fails_errno(
        &[
            "udsp", "add", "--src", "tcp", "--dst", "tcp2", "--prio", "1",
        ],
        22,
        "no --priority",
    );
    n.fails_errno(&["udsp", "add", "--src", "foo"], 22, "invalid");
    // A node started from that file has the rules from the start.
    let ip2 = "127.0.83.2";
    let port2 = common_free_port(&[ip2.parse().unwrap()]);
    let text = export.replace(ip, ip2).replace(
        &format!("accept_port: {port}"),
        &format!("accept_port: {port2}"),
    );
    let m = Node::start(dir.path(), "m", &text);
    let v = m.json(&["udsp", "show"]);
    assert_eq!(v["udsp"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["udsp"][1]["src"], format!("{ip2}@tcp"), "{v}");
}

/// `lnet unconfigure` (LNet down: other commands refused until `lnet
/// configure`) and `lnet configure [--all]`, as sanity-lnet's
/// `reinit_dlc` uses them, then its test 0 (export the empty
/// configuration, import it, compare).
#[test]
fn lnet_unconfigure_and_configure_as_reinit_dlc_does() {
    let dir = tempfile::tempdir().unwrap();
    let ips = ["127.0.84.1".parse().unwrap(), "127.0.84.2".parse().unwrap()];
    let port = common_free_port(&ips);
    let nid1 = "127.0.84.1@tcp";
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid1), global(port)),
    );
    let startup = n.ok(&["export", "-b"]);
    n.ok(&["peer", "add", "--prim_nid", "1.1.1.1@tcp", "--lock_prim"]);
    n.ok(&[
        "route",
        "add",
        "--net",
        "tcp9",
        "--gateway",
        "127.0.84.9@tcp",
    ]);
    n.ok(&["udsp", "add", "--src", "tcp", "--prio", "1"]);
    n.ok(&["net", "add", "--nid", "127.0.84.2@tcp"]);
    n.ok(&["set", "retry_count", "1"]);
    n.ok(&["ping", "127.0.84.2@tcp"]);
    n.ok(&["lnet", "unconfigure"]);
    // LNet is down: everything but (un)configuring is refused, as
    // Lustre's `LNetNIInit(LNET_PID_ANY)` and netlink handlers refuse it.
    for args in [
        &["net", "show"][..],
        &["export", "-b"],
        &["peer", "list"],
        &["net", "add", "--nid", "127.0.84.2@tcp"],
        &["set", "retry_count", "2"],
        &["ping", nid1],
        &["global", "show"],
    ] {
        n.fails_errno(args, 100, "LNet stack down");
    }
    n.ok(&["lnet", "unconfigure"]);
    n.ok(&["lnet", "configure"]);
    let empty = n.ok(&["export", "-b"]);
    for gone in ["net:", "peer:", "route:", "udsp:"] {
        assert!(
            !empty.lines().any(|l| l.trim_end() == gone),
            "{gone} left: {empty}"
        );
    }
    // Globals stay, as Lustre's module parameters do.
    assert!(empty.contains("retry_count: 1"), "{empty}");
    assert_eq!(n.ok(&["peer", "list"]).trim(), "peer list:");
    let v = n.json(&["net", "show"]);
    assert_eq!(v["net"].as_array().map(Vec::len), Some(1), "only lo: {v}");
    // Test 0.
    let o = lnet_stdin(Some(&n.ctl), &["import"], &empty);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert_eq!(n.ok(&["export", "-b"]), empty);
    // `--all`: the startup configuration again, and it works.
    n.ok(&["set", "retry_count", "2"]);
    n.ok(&["lnet", "configure", "--all"]);
    assert_eq!(n.ok(&["export", "-b"]), startup);
    n.ok(&["ping", nid1]);
}

/// Lustre's sanity-lnet test 305 ("Resolve hostname before lnetctl
/// ping"): `ping HOST@tcp` pings the host's IPv4 address on that net.
#[test]
fn ping_resolves_a_host_name() {
    use std::net::ToSocketAddrs;
    let resolves = ("localhost", 0)
        .to_socket_addrs()
        .is_ok_and(|mut a| a.any(|a| a.ip() == std::net::Ipv4Addr::LOCALHOST));
    if !resolves {
        eprintln!("localhost does not resolve to 127.0.0.1 here: nothing to check");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&["127.0.0.1".parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", "127.0.0.1@tcp"), global(port)),
    );
    let v = n.json(&["ping", "localhost@tcp"]);
    assert_eq!(v["ping"][0]["primary nid"], "127.0.0.1@tcp", "{v}");
    // A range is not a host name: refused as it was.
    n.fails(&["ping", "local[1-2]host@tcp"], "");
}

/// Sanity-lnet's router test fabric as processes (`setup_router_test`):
/// a client on `tcp`, a router on `tcp` and `tcp1` (routing on), a far
/// peer on `tcp1`; `nids` are the client's, the router's two and the
/// peer's; `globals` lines join every node's `global:`; with `routes`, the
/// client and the peer route through the router (`config_routes`).
/// Returns the client, the router and the peer.
fn sanity_router_fabric(dir: &Path, nids: [&str; 4], globals: &str, routes: bool) -> [Node; 3] {
    let ips = nids.map(ip_of);
    let g = format!("{}{globals}", global(common_free_port(&ips)));
    let [client, client_gw, rpeer_gw, rpeer] = nids;
    let route = |net: &str, gw: &str| {
        if routes {
            format!("route:\n    - net: {net}\n      gateway: {gw}\n")
        } else {
            String::new()
        }
    };
    let router = Node::start(
        dir,
        "router",
        &format!(
            "net:\n{}{}routing:\n    enable: 1\n{g}",
            ni("tcp", client_gw),
            ni("tcp1", rpeer_gw)
        ),
    );
    let client = Node::start(
        dir,
        "client",
        &format!("net:\n{}{}{g}", ni("tcp", client), route("tcp1", client_gw)),
    );
    let rpeer = Node::start(
        dir,
        "rpeer",
        &format!("net:\n{}{}{g}", ni("tcp1", rpeer), route("tcp", rpeer_gw)),
    );
    [client, router, rpeer]
}

/// Lustre's sanity-lnet test 222 (`do_aarf_enabled_test`), with its module
/// parameters scaled down (`alive_router_check_interval` and
/// `router_ping_timeout` 1 s): a router's NIs are down while nobody pings
/// them, each comes up with the pings of the node whose route names it,
/// and a route is up only while the router's NIs on both of its nets are;
/// when the client goes (`lnet unconfigure`), the router's NI on its net
/// goes down and the far peer's route with it. Then the far peer stops
/// avoiding asymmetric failures (`set avoid_asym_router_failure 0`) and its
/// route is up again (test 224's last step).
#[test]
fn router_nis_and_routes_live_on_pings_as_sanity_lnet_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let (client_gw, rpeer_gw) = ("127.0.85.2@tcp", "127.0.86.2@tcp1");
    let [client, router, rpeer] = sanity_router_fabric(
        dir.path(),
        ["127.0.85.1@tcp", client_gw, rpeer_gw, "127.0.86.3@tcp1"],
        "    alive_router_check_interval: 1\n    router_ping_timeout: 1\n",
        false,
    );
    let limit = Duration::from_secs(20);
    let statuses = || {
        ["tcp", "tcp1"].map(|net| {
            let v = router.json(&["net", "show", "--net", net]);
            v["net"][0]["local NI(s)"][0]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
    };
    let router_nis = |want: [&str; 2]| {
        wait_for(limit, &format!("router NIs {want:?}"), || {
            let s = statuses();
            if s == want { Ok(()) } else { Err(s) }
        });
    };
    let route_state = |node: &Node| -> String {
        let v = node.json(&["route", "show", "-v"]);
        v["route"][0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let route = |node: &Node, want: &str| {
        wait_for(limit, &format!("{} route {want}", node.name), || {
            let s = route_state(node);
            if s == want { Ok(()) } else { Err(s) }
        });
    };
    let pings = |node: &Node, nid: &str| {
        lnet(Some(&node.ctl), &["ping", nid, "--timeout", "2"]).code == Some(0)
    };
    router_nis(["down", "down"]);
    assert!(!pings(&client, "127.0.86.3@tcp1"));
    // The client's route wakes the router's NI on its net only.
    client.ok(&["route", "add", "--net", "tcp1", "--gateway", client_gw]);
    router_nis(["up", "down"]);
    route(&client, "down");
    assert!(!pings(&client, "127.0.86.3@tcp1"));
    // The symmetric route: both NIs up, both routes up, pings pass.
    rpeer.ok(&["route", "add", "--net", "tcp", "--gateway", rpeer_gw]);
    router_nis(["up", "up"]);
    route(&client, "up");
    route(&rpeer, "up");
    assert!(pings(&client, "127.0.86.3@tcp1"));
    assert!(pings(&rpeer, "127.0.85.1@tcp"));
    // Stop LNet on the client.
    client.ok(&["lnet", "unconfigure"]);
    router_nis(["down", "up"]);
    route(&rpeer, "down");
    assert!(!pings(&rpeer, "127.0.85.1@tcp"));
    rpeer.ok(&["set", "avoid_asym_router_failure", "0"]);
    route(&rpeer, "up");
}

/// Lustre's sanity-lnet test 227 ("Check router peer health w/DD
/// disabled"): discovery off, health sensitivity 0; the far peer stops
/// LNet, and the router, told by its socket LND that the peer's NI is gone,
/// drops the client's pings instead of forwarding them (`peer show -v 2`
/// counts them in `dropped_stats`), as long as the net's `peer_timeout` is
/// above 0; the peer's NI shows `state: down` there.
#[test]
fn a_router_drops_pings_for_a_dead_peer_as_sanity_lnet_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let (client_gw, rpeer_gw, rpeer_nid) = ("127.0.87.2@tcp", "127.0.88.2@tcp1", "127.0.88.3@tcp1");
    let [client, router, rpeer] = sanity_router_fabric(
        dir.path(),
        ["127.0.87.1@tcp", client_gw, rpeer_gw, rpeer_nid],
        "    discovery: 0\n    health_sensitivity: 0\n",
        true,
    );
    let pings = |node: &Node, nid: &str| {
        lnet(Some(&node.ctl), &["ping", nid, "--timeout", "2"]).code == Some(0)
    };
    assert!(pings(&client, rpeer_nid));
    assert!(pings(&rpeer, "127.0.87.1@tcp"));
    let export = router.ok(&["export", "-b"]);
    assert!(export.contains("peer_timeout: 180"), "{export}");
    rpeer.ok(&["lnet", "unconfigure"]);
    let dropped_gets = || {
        let v = router.json(&["peer", "show", "-v", "2", "--nid", rpeer_nid]);
        let ni = peer_ni(&v, rpeer_nid).clone();
        (num(&ni, &["dropped_stats", "get"]), ni["state"].clone())
    };
    wait_for(
        Duration::from_secs(10),
        "the router to hear the peer is gone",
        || {
            let (_, state) = dropped_gets();
            if state == "down" { Ok(()) } else { Err(state) }
        },
    );
    assert!(!pings(&client, rpeer_nid));
    assert!(!pings(&client, rpeer_nid));
    let (dropped, _) = dropped_gets();
    assert!(dropped > 0, "dropped GETs {dropped}");
}

/// Lustre's `lnet_notify` on a gateway with discovery off: when a router
/// process dies, the client's socket LND loses its last connection to it
/// and says so, and the client's route through it goes down at once (not
/// at the router checker's next ping, a minute away); pings go by the
/// other router.
#[test]
fn a_dead_routers_route_goes_down_at_its_lnds_notice_with_discovery_off() {
    let dir = tempfile::tempdir().unwrap();
    let nids = [
        "127.0.89.1@tcp",
        "127.0.89.2@tcp",
        "127.0.90.2@tcp1",
        "127.0.89.3@tcp",
        "127.0.90.3@tcp1",
        "127.0.90.1@tcp1",
    ];
    let ips = nids.map(ip_of);
    let g = format!("{}    discovery: 0\n", global(common_free_port(&ips)));
    let route = |net: &str, gws: [&str; 2]| {
        let mut s = String::from("route:\n");
        for gw in gws {
            s.push_str(&format!("    - net: {net}\n      gateway: {gw}\n"));
        }
        s
    };
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
    let mut r0 = router("r0", nids[1], nids[2]);
    let _r1 = router("r1", nids[3], nids[4]);
    let client = Node::start(
        dir.path(),
        "client",
        &format!(
            "net:\n{}{}{g}",
            ni("tcp", nids[0]),
            route("tcp1", [nids[1], nids[3]])
        ),
    );
    let _rpeer = Node::start(
        dir.path(),
        "rpeer",
        &format!(
            "net:\n{}{}{g}",
            ni("tcp1", nids[5]),
            route("tcp", [nids[2], nids[4]])
        ),
    );
    let state = |gw: &str| -> String {
        let v = client.json(&["route", "show", "-v"]);
        v["route"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["gateway"] == gw)
            .map(|r| r["state"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    let limit = Duration::from_secs(20);
    for gw in [nids[1], nids[3]] {
        wait_for(limit, &format!("route via {gw} up"), || {
            let s = state(gw);
            if s == "up" { Ok(()) } else { Err(s) }
        });
    }
    client.ok(&["ping", nids[5]]);
    r0.kill9();
    // The router checker would notice in a minute; the LND's notice is
    // here in a few seconds.
    wait_for(Duration::from_secs(10), "route via r0 down", || {
        let s = state(nids[1]);
        if s == "down" { Ok(()) } else { Err(s) }
    });
    assert_eq!(state(nids[3]), "up");
    for _ in 0..3 {
        client.ok(&["ping", nids[5], "--timeout", "5"]);
    }
}

/// Lustre's sanity-lnet test 475 ("per-operation latency stats populate and
/// reset"): pings of the node's own NID (a GET round trip through its own
/// NI, as Lustre's) give `get_rtt` samples on the local NI (`net show -v
/// 4`) and on the peer NI of the node itself (`peer show -v 4`); `stats
/// reset` zeroes them.
#[test]
fn latency_stats_populate_and_reset_as_sanity_lnet_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let nid = "127.0.89.21@tcp";
    let port = common_free_port(&["127.0.89.21".parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid), global(port)),
    );
    n.ok(&["stats", "reset"]);
    for _ in 0..10 {
        n.ok(&["ping", nid]);
    }
    let peer_stat = |key: &str| {
        let v = n.json(&["peer", "show", "-v", "4", "--nid", nid]);
        num(peer_ni(&v, nid), &["statistics", key])
    };
    let ni_stat = |key: &str| {
        let v = n.json(&["net", "show", "-v", "4", "--net", "tcp"]);
        num(&v["net"][0]["local NI(s)"][0], &["statistics", key])
    };
    assert!(peer_stat("get_rtt_samples") > 0);
    assert!(peer_stat("get_rtt_max_nsec") > 0);
    assert!(peer_stat("get_rtt_min_nsec") <= peer_stat("get_rtt_max_nsec"));
    assert!(ni_stat("get_rtt_samples") > 0);
    n.ok(&["stats", "reset"]);
    assert_eq!(peer_stat("get_rtt_samples"), 0);
    assert_eq!(ni_stat("get_rtt_samples"), 0);
    assert_eq!(ni_stat("get_rtt_max_nsec"), 0);
}

/// Lustre's sanity-lnet test 215 ("Test lnetctl ping --source option"): a
/// node with `tcp1` and `tcp2` on one interface, configured as a peer of
/// itself (`peer add --prim NID1 --nid NID2`). Pings of its own NIDs take
/// its NIs, as Lustre's do: without a source they spread over both (each
/// NI's send and receive counts move), with `--source` equal to the
/// destination only that NI's move; a ping from one net's NID to the
/// other's fails (no route between them).
#[test]
fn pings_of_our_own_nids_use_our_nis_as_sanity_lnet_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let (nid1, nid2) = ("127.0.89.31@tcp1", "127.0.89.31@tcp2");
    let port = common_free_port(&["127.0.89.31".parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!(
            "net:\n{}{}{}",
            ni("tcp1", nid1),
            ni("tcp2", nid2),
            global(port)
        ),
    );
    n.ok(&["peer", "add", "--prim", nid1, "--nid", nid2]);
    let counts = || {
        let v = n.json(&["net", "show", "-v"]);
        [nid1, nid2].map(|want| {
            let nis = v["net"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|net| net["local NI(s)"].as_array().into_iter().flatten());
            let ni = nis
                .clone()
                .find(|ni| ni["nid"] == want)
                .unwrap_or_else(|| panic!("{want} in {v}"));
            (
                num(ni, &["statistics", "send_count"]),
                num(ni, &["statistics", "recv_count"]),
            )
        })
    };
    for dst in [nid1, nid2] {
        let before = counts();
        for _ in 0..25 {
            n.ok(&["ping", dst]);
        }
        let after = counts();
        for i in 0..2 {
            assert!(
                after[i].0 > before[i].0,
                "{dst}: send_count of NI {i}: {before:?} {after:?}"
            );
            assert!(
                after[i].1 > before[i].1,
                "{dst}: recv_count of NI {i}: {before:?} {after:?}"
            );
        }
        let before = counts();
        for _ in 0..25 {
            n.ok(&["ping", "--source", dst, dst]);
        }
        let after = counts();
        let me = usize::from(dst == nid2);
        assert!(after[me].0 > before[me].0, "{dst}: {before:?} {after:?}");
        assert_eq!(after[1 - me], before[1 - me], "{dst}: the other NI moved");
    }
    n.fails(&["ping", "--source", nid1, nid2, "--timeout", "2"], "");
    n.fails(&["ping", "--source", nid2, nid1, "--timeout", "2"], "");
}

/// sanity-lnet 214 and 500 with a real interface: an NI added by its
/// interface's name (`net add --net tcp --if IFACE`, the NID the
/// interface's address), pinged from, taken down with its link (at once:
/// the kernel's link events, not the next tick) while delay and drop
/// rules hold every PUT, and back up with it, the node answering all
/// along (500 checks for a deadlock on the ping target update the link
/// change pushes).
#[test]
fn an_ni_on_an_interface_follows_its_link_as_sanity_lnet_checks_it() {
    let (nid1, nid2) = ("127.0.97.20@tcp", "127.0.97.21@tcp");
    let Some(veth) = Veth::new(ip_of(nid2)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[ip_of(nid1), ip_of(nid2)]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid1), global(port)),
    );
    // lnetctl's CPT binding is taken and ignored, with a warning.
    let o = lnet(
        Some(&n.ctl),
        &[
            "net", "add", "--net", "tcp", "--if", &veth.a, "--cpt", "[0]",
        ],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stderr.contains("--cpt [0]"), "{}", o.stderr);
    // (status, first interface) of each NI `net show` lists.
    let shown = |nid: &str| {
        let v = n.json(&["net", "show"]);
        let ni = v["net"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|net| net["local NI(s)"].as_array().into_iter().flatten())
            .find(|ni| ni["nid"] == nid)
            .unwrap_or_else(|| panic!("{nid} in {v}"))
            .clone();
        (
            ni["status"].as_str().unwrap_or_default().to_owned(),
            ni["interfaces"]["0"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    assert_eq!(shown(nid2), ("up".to_owned(), veth.a.clone()));
    assert_eq!(shown(nid1).0, "up");
    assert_eq!(shown("0@lo").0, "up");
    assert!(n.ok(&["export"]).contains(&format!("0: {}", veth.a)));
    n.ok(&["ping", "--source", nid2, nid1]);

    // Test 500's rules: every PUT delayed a second, and failed on send.
    n.ok(&["discover", nid1]);
    let rule = |kind: &str, extra: &[&str]| {
        let mut a = vec!["fault", kind, "add", "-s", "*@tcp", "-r", "1", "-m", "put"];
        a.extend_from_slice(extra);
        n.ok(&a);
    };
    rule("delay", &["-d", "*@tcp", "-l", "1"]);
    rule("drop", &["-d", nid1, "-e", "local_timeout"]);
    rule("drop", &["-d", nid2, "-e", "local_timeout"]);
    let within = |what: &str, f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(3), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let v = n.json(&["fault", "delay", "show"]);
    assert_eq!(v["fault"][0]["source"], "255.255.255.255@tcp", "{v}");
    veth.set(&veth.a, false);
    within("the NI down with its interface", &|| {
        shown(nid2).0 == "down"
    });
    assert_eq!(shown(nid1).0, "up");
    assert_eq!(shown("0@lo").0, "up");
    veth.set(&veth.a, true);
    within("the NI up with its interface", &|| shown(nid2).0 == "up");
    n.ok(&["fault", "drop", "del", "--all"]);
    n.ok(&["fault", "delay", "del", "--all"]);
    n.ok(&["ping", "--source", nid2, nid1]);

    // Bad names: a clear error each, nothing added.
    n.fails_errno(
        &["net", "add", "--net", "tcp", "--if", "nosuch0"],
        19,
        "no interface nosuch0",
    );
    n.fails_errno(
        &[
            "net",
            "add",
            "--net",
            "tcp",
            "--if",
            &format!("{},{}", veth.a, veth.a),
        ],
        17,
        "named twice",
    );
    let o = lnet(Some(&n.ctl), &["net", "add", "--if", &veth.a]);
    assert_ne!(o.code, Some(0), "--if without --net: {}", o.stdout);
    n.fails_errno(
        &["net", "del", "--net", "tcp", "--if", "nosuch0"],
        2,
        "no local NI of net tcp on nosuch0",
    );
    n.ok(&["net", "del", "--net", "tcp", "--if", &veth.a]);
    let v = n.json(&["net", "show"]);
    assert!(!v.to_string().contains(nid2), "{v}");
    assert!(v.to_string().contains(nid1), "{v}");
}

/// sanity-lnet 303: an NI added on an interface is pushed to a peer that
/// discovered the node, with the node's first NID its primary; when the
/// interface goes down the node marks the NI down and pushes that too,
/// and the peer lowers the NI's health.
#[test]
fn a_peer_lowers_the_health_of_an_ni_whose_link_went_down_as_sanity_lnet_checks_it() {
    let (prim, fake, remote) = ("127.0.97.30@tcp", "127.0.97.31@tcp", "127.0.97.32@tcp");
    let Some(veth) = Veth::new(ip_of(fake)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[ip_of(prim), ip_of(fake), ip_of(remote)]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", prim), global(port)),
    );
    let r = Node::start(
        dir.path(),
        "r",
        &format!("net:\n{}{}", ni("tcp", remote), global(port)),
    );
    r.ok(&["discover", prim]);
    n.ok(&["net", "add", "--net", "tcp", "--if", &veth.a]);
    // "Our updated config should be pushed to RNODE".
    let found = wait_for(Duration::from_secs(5), "the new NI pushed", || {
        let v = r.json(&["peer", "show", "--nid", fake]);
        (v["peer"][0]["primary nid"] == prim)
            .then_some(v.clone())
            .ok_or(v)
    });
    assert!(found.to_string().contains(fake), "{found}");
    let health = || {
        let v = r.json(&["peer", "show", "--nid", fake, "-v", "2"]);
        num(peer_ni(&v, fake), &["health stats", "health value"])
    };
    assert_eq!(health(), 1000);
    // A down interface's address is unreachable; here the kernel still
    // delivers it through lo (127/8), so n drops what comes for it, or
    // r's recovery pings would be answered and heal it.
    n.ok(&["fault", "drop", "add", "-s", "*@tcp", "-d", fake, "-r", "1"]);
    veth.set(&veth.a, false);
    wait_for(Duration::from_secs(3), "the NI down here", || {
        let v = n.json(&["net", "show"]);
        let down = v
            .to_string()
            .contains(&format!("\"nid\":\"{fake}\",\"status\":\"down\""));
        down.then_some(()).ok_or(v)
    });
    wait_for(Duration::from_secs(3), "its health lowered there", || {
        let h = health();
        (h < 1000).then_some(()).ok_or(h)
    });
}

/// sanity-lnet 150, 151, 155 and 157 on a veth pair: `import` of
/// `ip2nets:` rules adds an NI on each interface a rule chooses (the
/// first rule of a net wins, later ones are skipped), `net show` and
/// `export` name the interface, and a file whose rules match nothing, or
/// a rule without its net, fails with nothing added.
#[test]
fn ip2nets_rules_add_nis_on_the_interfaces_they_match() {
    let (nid0, on_veth) = ("127.0.97.50@tcp", "127.0.97.51");
    let Some(veth) = Veth::new(on_veth.parse().unwrap()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[ip_of(nid0), on_veth.parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid0), global(port)),
    );
    let file = |name: &str, y: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, y).unwrap();
        f.to_str().unwrap().to_owned()
    };
    let rules = format!(
        "ip2nets:\n  - net-spec: tcp1\n    interfaces:\n        0: {a}\n    ip-range:\n        0: 127.0.97.[50-59/1]\n  - net-spec: tcp1\n    interfaces:\n        0: {a}\n",
        a = veth.a
    );
    let o = lnet(Some(&n.ctl), &["import", &file("rules.yaml", &rules)]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(
        o.stderr.contains("configured by an earlier rule"),
        "{}",
        o.stderr
    );
    let v = n.json(&["net", "show", "--net", "tcp1"]);
    let ni = &v["net"][0]["local NI(s)"][0];
    assert_eq!(ni["nid"], format!("{on_veth}@tcp1"), "{v}");
    assert_eq!(ni["interfaces"]["0"], veth.a.as_str(), "{v}");
    assert!(n.ok(&["export"]).contains(&format!("0: {}", veth.a)));
    n.ok(&[
        "ping",
        "--source",
        &format!("{on_veth}@tcp1"),
        &format!("{on_veth}@tcp1"),
    ]);
    let before = n.json(&["net", "show"]).to_string();
    let none = format!(
        "ip2nets:\n  - net-spec: tcp2\n    interfaces:\n        0: {}\n    ip-range:\n        0: 10.20.30.40\n",
        veth.a
    );
    n.fails(&["import", &file("none.yaml", &none)], "no rule matches");
    n.fails(
        &[
            "import",
            &file("bad.yaml", "ip2nets:\n  - interfaces:\n        0: lo\n"),
        ],
        "missing 'net-spec'",
    );
    assert_eq!(n.json(&["net", "show"]).to_string(), before);

    // `net add --ip2net`, the module parameter's form (sanity-lnet 199:
    // the same NI again fails).
    let rule = format!("tcp3({}) 127.0.97.*", veth.a);
    n.ok(&["net", "add", "--ip2net", &rule]);
    let v = n.json(&["net", "show", "--net", "tcp3"]);
    assert_eq!(
        v["net"][0]["local NI(s)"][0]["nid"],
        format!("{on_veth}@tcp3"),
        "{v}"
    );
    n.fails_errno(&["net", "add", "--ip2net", &rule], 17, "configured already");
    n.fails(
        &["net", "add", "--ip2net", "tcp4 10.20.30.40"],
        "no rule matches",
    );
}

/// sanity-lnet 109 and 112 on a veth pair: an address alias (`ip addr
/// add ... label IF:0`) is an interface of its own for `net add --if` and
/// `net del --if`, whichever is added first, and NIs added by interface
/// and by NID each show their LND tunables.
#[test]
fn interface_aliases_are_interfaces_of_their_own_as_sanity_lnet_checks_them() {
    let (nid0, main_ip, alias_ip) = ("127.0.97.60@tcp", "127.0.97.61", "127.0.97.62");
    let Some(veth) = Veth::new(main_ip.parse().unwrap()) else {
        return;
    };
    let alias = format!("{}:0", veth.a);
    let o = Command::new("ip")
        .args([
            "addr",
            "add",
            &format!("{alias_ip}/32"),
            "dev",
            &veth.a,
            "label",
            &alias,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[
        ip_of(nid0),
        main_ip.parse().unwrap(),
        alias_ip.parse().unwrap(),
    ]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid0), global(port)),
    );
    let tcp_nis = || {
        let v = n.json(&["net", "show", "--net", "tcp"]);
        let mut nis: Vec<(String, String)> = v["net"][0]["local NI(s)"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|ni| {
                (
                    ni["nid"].as_str().unwrap_or_default().to_owned(),
                    ni["interfaces"]["0"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect();
        nis.sort();
        nis
    };
    let want = |names: &[(&str, &str)]| {
        let mut v: Vec<(String, String)> = names
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        v.push((nid0.to_owned(), ip_of(nid0).to_string()));
        v.sort();
        v
    };
    let (on_alias, on_main) = (format!("{alias_ip}@tcp"), format!("{main_ip}@tcp"));
    for order in [
        [alias.as_str(), veth.a.as_str()],
        [veth.a.as_str(), alias.as_str()],
    ] {
        for name in order {
            n.ok(&["net", "add", "--net", "tcp", "--if", name]);
        }
        assert_eq!(tcp_nis(), want(&[(&on_alias, &alias), (&on_main, &veth.a)]));
        n.ok(&["net", "del", "--net", "tcp", "--if", &veth.a]);
        assert_eq!(tcp_nis(), want(&[(&on_alias, &alias)]));
        n.ok(&["net", "del", "--net", "tcp", "--if", &alias]);
        assert_eq!(tcp_nis(), want(&[]));
    }
    // 112: one NI by interface, one by NID, each with its LND tunables.
    n.ok(&["net", "add", "--net", "tcp1", "--if", &veth.a]);
    n.ok(&["net", "add", "--nid", &format!("{alias_ip}@tcp2")]);
    let shown = n.ok(&["net", "show", "-v", "3"]);
    let count = shown.matches("lnd tunables:").count();
    assert_eq!(count, 3, "tcp, tcp1 and tcp2 each have one: {shown}");
}

/// LNet's module parameters as `colibri lnet run` options (sanity-lnet
/// 201 loads LNet with `networks=`): `--networks` puts an NI on the named
/// interface, `--routes` adds routes from its string form, `lnet
/// configure --all` brings both back, and a parameter naming a missing
/// interface or giving networks and ip2nets at once stops the start with
/// a clear error.
#[test]
fn module_parameters_configure_a_node() {
    let on_veth = "127.0.97.71";
    let Some(veth) = Veth::new(on_veth.parse().unwrap()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[on_veth.parse().unwrap()]);
    let networks = format!("tcp5({})", veth.a);
    let routes = "tcp9 2 127.0.97.[78-79]@tcp5:3";
    let n = Node::start_args(
        dir.path(),
        "n",
        &global(port),
        &["--networks", &networks, "--routes", routes],
    );
    let shown = || {
        let v = n.json(&["net", "show", "--net", "tcp5"]);
        let ni = v["net"][0]["local NI(s)"][0].clone();
        (
            ni["nid"].as_str().unwrap_or_default().to_owned(),
            ni["interfaces"]["0"].clone(),
        )
    };
    assert_eq!(
        shown(),
        (format!("{on_veth}@tcp5"), serde_json::json!(veth.a))
    );
    let routes_shown = || {
        let v = n.json(&["route", "show", "-v"]);
        let mut r: Vec<String> = v["route"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r["net"], r["gateway"], r["hop"], r["priority"]
                )
            })
            .collect();
        r.sort();
        r
    };
    let want = [
        "\"tcp9\" \"127.0.97.78@tcp5\" 2 3".to_owned(),
        "\"tcp9\" \"127.0.97.79@tcp5\" 2 3".to_owned(),
    ];
    assert_eq!(routes_shown(), want);
    n.ok(&["lnet", "unconfigure"]);
    n.ok(&["lnet", "configure", "--all"]);
    assert_eq!(shown().0, format!("{on_veth}@tcp5"));
    assert_eq!(routes_shown(), want);
    drop(n);

    let cfg = dir.path().join("g.yaml");
    std::fs::write(&cfg, global(port)).unwrap();
    let start = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.args(["lnet", "run", "--config"])
            .arg(&cfg)
            .arg("--ctl")
            .arg(dir.path().join("bad.sock"))
            .args(args);
        run_bounded(&mut cmd)
    };
    assert_fails(
        &start(&["--networks", "tcp(nosuch0)"]),
        "no interface nosuch0",
    );
    assert_fails(
        &start(&["--networks", &networks, "--routes", "tcp5 127.0.97.9@tcp5"]),
        "is a local net",
    );
    let both = start(&["--networks", &networks, "--ip2nets", "tcp 127.*.*.*"]);
    assert_ne!(both.code, Some(0), "{}", both.stderr);
}

/// sanity-lnet 216: a failed send to a peer NI that is one of the node's
/// own NIs (two nets on one address, the node a peer of itself) puts the
/// local NI in recovery, never the "peer" NI.
#[test]
fn a_failed_send_to_our_own_nid_is_local_recovery_as_sanity_lnet_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let nids = ["127.0.89.41@tcp", "127.0.89.41@tcp1"];
    let port = common_free_port(&[ip_of(nids[0])]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!(
            "net:\n{}{}{}",
            ni("tcp", nids[0]),
            ni("tcp1", nids[1]),
            global(port)
        ),
    );
    n.ok(&["discover", nids[0]]);
    for nid in nids {
        n.ok(&["ping", "--source", nid, nid]);
    }
    for src in nids {
        for dst in nids {
            n.ok(&[
                "fault",
                "drop",
                "add",
                "-r",
                "1",
                "-s",
                src,
                "-d",
                dst,
                "-e",
                "network_timeout",
            ]);
        }
    }
    let o = lnet(Some(&n.ctl), &["ping", nids[0], "--timeout", "2"]);
    assert_ne!(o.code, Some(0), "the ping should fail: {}", o.stdout);
    n.ok(&["fault", "drop", "del", "--all"]);
    let recovery = |side: &str| lnet(Some(&n.ctl), &["--json", "debug", "recovery", side]).stdout;
    assert!(
        !recovery("--peer").contains(nids[0]),
        "{}",
        recovery("--peer")
    );
    assert!(
        recovery("--local").contains(nids[0]),
        "{}",
        recovery("--local")
    );
}

/// sanity-lnet 450: one `local NI(s)` entry naming two interfaces makes
/// an NI on each, and `import --del` of the same file takes both away.
#[test]
fn one_entry_with_two_interfaces_is_two_nis_as_sanity_lnet_checks_it() {
    let (nid0, ip_a, ip_b) = ("127.0.97.90@tcp", "127.0.97.91", "127.0.97.92");
    let Some(veth) = Veth::new(ip_a.parse().unwrap()) else {
        return;
    };
    let o = Command::new("ip")
        .args(["addr", "add", &format!("{ip_b}/32"), "dev", &veth.b])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[ip_of(nid0), ip_a.parse().unwrap(), ip_b.parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid0), global(port)),
    );
    let f = dir.path().join("two.yaml");
    std::fs::write(
        &f,
        format!(
            "net:\n    - net type: tcp1\n      local NI(s):\n        - interfaces:\n              0: {}\n              1: {}\n",
            veth.a, veth.b
        ),
    )
    .unwrap();
    let f = f.to_str().unwrap();
    n.ok(&["import", f]);
    let tcp1 = || {
        let v = n.json(&["net", "show", "--net", "tcp1"]);
        v["net"][0]["local NI(s)"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|ni| format!("{} {}", ni["nid"], ni["interfaces"]["0"]))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        tcp1(),
        [
            format!("\"{ip_a}@tcp1\" \"{}\"", veth.a),
            format!("\"{ip_b}@tcp1\" \"{}\"", veth.b)
        ]
    );
    n.ok(&["import", "--del", f]);
    n.fails(&["net", "show", "--net", "tcp1"], "no local NI on net tcp1");
    assert!(n.ok(&["net", "show"]).contains(nid0));
}

/// sanity-lnet 217 and 218: `discover 0@lo` answers the loopback peer;
/// an NI whose sends to itself fail recovers through the other NI of its
/// net, which its recovery pings may take.
#[test]
fn local_recovery_pings_take_any_path_as_sanity_lnet_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let (nid1, nid2) = ("127.0.89.51@tcp", "127.0.89.52@tcp");
    let port = common_free_port(&[ip_of(nid1), ip_of(nid2)]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp", nid1), global(port)),
    );
    let lo = n.json(&["discover", "0@lo"]);
    assert_eq!(lo["discover"][0]["primary nid"], "0@lo", "{lo}");
    n.ok(&["ping", nid1]);
    n.ok(&["net", "add", "--nid", nid2]);
    n.ok(&["ping", nid2]);
    n.ok(&[
        "fault",
        "drop",
        "add",
        "-s",
        nid1,
        "-d",
        nid1,
        "-e",
        "local_error",
        "-r",
        "1",
    ]);
    let o = lnet(
        Some(&n.ctl),
        &["ping", "--source", nid1, nid1, "--timeout", "2"],
    );
    assert_ne!(o.code, Some(0), "the ping should fail: {}", o.stdout);
    let healthy = || {
        let v = n.json(&["net", "show", "-v", "2"]);
        v.to_string().matches("\"health value\":1000").count()
    };
    wait_for(Duration::from_secs(5), "both NIs healthy again", || {
        let h = healthy();
        (h == 2).then_some(()).ok_or(h)
    });
    n.ok(&["fault", "drop", "del", "--all"]);
}

/// sanity-lnet 600-629: `legacy2yaml` converts LNet's legacy module
/// parameters as Lustre's `lnet_legacy2yaml` does, from inline strings,
/// files, modprobe files and standard input, with its exit codes (2: a
/// parse error, 1: nothing to convert). The expected documents are the
/// tests' own, which are in lnetctl's layout.
#[test]
fn legacy2yaml_converts_module_parameters_as_sanity_lnet_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        f.to_str().unwrap().to_owned()
    };
    let conv = |args: &[&str]| {
        let mut all = vec!["legacy2yaml"];
        all.extend_from_slice(args);
        lnet(None, &all)
    };
    let same = |args: &[&str], want: &str| {
        let o = conv(args);
        assert_eq!(o.code, Some(0), "{args:?}: {}", o.stderr);
        assert_eq!(o.stdout, want, "{args:?}");
    };
    let fails = |args: &[&str], code: i32, want: &str| {
        let o = conv(args);
        assert_eq!(o.code, Some(code), "{args:?}: {}{}", o.stdout, o.stderr);
        assert!(o.stdout.is_empty(), "{args:?}: {}", o.stdout);
        assert!(
            o.stderr.to_lowercase().contains(&want.to_lowercase()),
            "{args:?}: {}",
            o.stderr
        );
    };
    let route1 = "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 1\n";
    // 600, 605, 613, 614.
    same(
        &["tcp0(eth0,eth1) 10.0.0.*; o2ib0 192.168.[1-2].*"],
        "ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n          1: eth1\n      ip-range:\n          0: 10.0.0.*\n    - net-spec: o2ib0\n      ip-range:\n          0: 192.168.[1-2].*\n",
    );
    same(
        &["tcp *.*.*.*"],
        "ip2nets:\n    - net-spec: tcp\n      ip-range:\n          0: \"*.*.*.*\"\n",
    );
    same(
        &["tcp0(eth0,eth1) 10.0.0.* 10.0.1.*"],
        "ip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n          1: eth1\n      ip-range:\n          0: 10.0.0.*\n          1: 10.0.1.*\n",
    );
    // 601-604: hops, priorities, --default-hop with and without a value.
    same(&["routes='tcp0 1 10.0.0.1@o2ib0'"], route1);
    same(
        &["routes='tcp0 2 10.0.0.1@o2ib0:7'"],
        "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 2\n      priority: 7\n",
    );
    same(&["routes='tcp0 10.0.0.1@o2ib0'", "--default-hop"], route1);
    same(
        &["--default-hop", "3", "routes='tcp0 10.0.0.1@o2ib0'"],
        "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 3\n",
    );
    same(
        &["routes='tcp0 10.0.0.1@o2ib0'"],
        "route:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n",
    );
    // 606, 610: files, several of a kind, inline last.
    let ip1 = file("ip1.rules", "tcp0 10.0.0.*\n");
    let ip2 = file("ip2.rules", "o2ib0 192.168.0.*\n");
    let r1 = file("r1.rules", "tcp0 1 10.0.0.1@o2ib0\n");
    same(
        &[
            "-i",
            &ip1,
            "-i",
            &ip2,
            "-r",
            &r1,
            "routes='o2ib0 1 192.168.0.1@tcp0'",
        ],
        "ip2nets:\n    - net-spec: tcp0\n      ip-range:\n          0: 10.0.0.*\n    - net-spec: o2ib0\n      ip-range:\n          0: 192.168.0.*\nroute:\n    - net: tcp0\n      gateway: 10.0.0.1@o2ib0\n      hop: 1\n    - net: o2ib0\n      gateway: 192.168.0.1@tcp0\n      hop: 1\n",
    );
    // 607: one options line with both.
    same(
        &[r#"options lnet 'ip2nets="tcp0 10.0.0.*" routes="tcp0 1 10.0.0.2@o2ib0"'"#],
        "ip2nets:\n    - net-spec: tcp0\n      ip-range:\n          0: 10.0.0.*\nroute:\n    - net: tcp0\n      gateway: 10.0.0.2@o2ib0\n      hop: 1\n",
    );
    // 615, 616, 626: modprobe files (comments, continuations), first.
    let modprobe = file(
        "lnet.conf",
        "# Modprobe configuration file for LNet\noptions lnet ip2nets=\"tcp0(eth0) 10.1.0.*\"\n\n# Routes\noptions lnet routes=\"tcp0 1 10.1.0.1@o2ib0:9\"\n\n# Line continuation\noptions lnet \\\n  ip2nets=\"o2ib0 192.168.1.*\"\noptions lnet networks=tcp3(eth0),o2ib(ib0)\n",
    );
    let ip3 = file("ip3.rules", "tcp5 172.16.0.*\n");
    same(
        &["-i", &ip3, "-m", &modprobe],
        "net:\n    - net type: tcp3\n      local NI(s):\n        - interfaces:\n              0: eth0\n    - net type: o2ib\n      local NI(s):\n        - interfaces:\n              0: ib0\nip2nets:\n    - net-spec: tcp0\n      interfaces:\n          0: eth0\n      ip-range:\n          0: 10.1.0.*\n    - net-spec: o2ib0\n      ip-range:\n          0: 192.168.1.*\n    - net-spec: tcp5\n      ip-range:\n          0: 172.16.0.*\nroute:\n    - net: tcp0\n      gateway: 10.1.0.1@o2ib0\n      hop: 1\n      priority: 9\n",
    );
    // 618-620, 622: the alternative route form, mixed with the legacy one.
    let routes = file(
        "routes.conf",
        "# Mixed route formats\ntcp1: { gateway: 10.1.1.2@tcp0, priority: 3 }  # High priority route\ntcp0 1 10.2.2.3@tcp1\ntcp5: { gateway: 10.5.5.5@tcp0 }\ntcp7: { gateway: 10.3.3.[6-12]@tcp, priority: 20, hop: 8 }\ntcp2 2 10.4.4.5@tcp0:7\n",
    );
    same(
        &["-r", &routes, "--default-hop", "3"],
        "route:\n    - net: tcp1\n      gateway: 10.1.1.2@tcp0\n      hop: 3\n      priority: 3\n    - net: tcp0\n      gateway: 10.2.2.3@tcp1\n      hop: 1\n    - net: tcp5\n      gateway: 10.5.5.5@tcp0\n      hop: 3\n    - net: tcp7\n      gateway: 10.3.3.[6-12]@tcp\n      hop: 8\n      priority: 20\n    - net: tcp2\n      gateway: 10.4.4.5@tcp0\n      hop: 2\n      priority: 7\n",
    );
    // 623-625: networks.
    same(
        &["options lnet networks=tcp"],
        "net:\n    - net type: tcp\n",
    );
    same(
        &["options lnet networks=tcp0(eth0),o2ib(ib0)"],
        "net:\n    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: eth0\n    - net type: o2ib\n      local NI(s):\n        - interfaces:\n              0: ib0\n",
    );
    let nets = file("networks", "tcp0(eth0,eth1)\no2ib\n");
    same(
        &["-n", &nets],
        "net:\n    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: eth0\n              1: eth1\n    - net type: o2ib\n",
    );
    // Standard input, and --output.
    let o = lnet_stdin(
        None,
        &["legacy2yaml"],
        "tcp(eth0) 192.168.0.[2,4]; tcp 192.168.0.*\n",
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("0: 192.168.0.[2,4]\n"), "{}", o.stdout);
    let out = dir.path().join("out.yaml");
    same(&["-r", &r1, "-o", out.to_str().unwrap()], "");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), route1);
    // 608, 611, 612, 621, 627-629: parse errors, exit code 2.
    fails(&["tcp0"], 2, "error");
    fails(&["routes='tcp0 0 10.0.0.1@o2ib0'"], 2, "hopcount");
    fails(&["tcp0 10.0.0"], 2, "invalid IP pattern");
    let bad_hop = file("bad-hop", "tcp0: { gateway: 10.0.0.1@o2ib0, hop: 0 }\n");
    fails(&["-r", &bad_hop], 2, "hopcount 0 out of range");
    fails(
        &["options lnet networks=tcp0(eth0"],
        2,
        "invalid network specification",
    );
    fails(
        &["tcp0(eth0) 10.0.0.* tcp1(eth1) 192.168.1.*"],
        2,
        "multiple network rules must be separated",
    );
    fails(
        &[r#"options lnet routes="tcp0 1 10.0.0.1@o2ib0 10.0.0.2@o2ib0""#],
        2,
        "multiple gateway specifications found",
    );
    fails(
        &["--default-hop", "256", "routes='tcp0 10.0.0.1@o2ib0'"],
        2,
        "out of range",
    );
    fails(&["-i", "/nonexistent/ip2nets"], 2, "cannot read");
    fails(&["-m", &bad_hop, "-r", &bad_hop], 2, "routes file");
    // 609: nothing to convert, exit code 1.
    let o = lnet_stdin(None, &["legacy2yaml"], "");
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("no ip2nets, routes, or networks data"),
        "{}",
        o.stderr
    );
    fails(&[], 1, "no ip2nets, routes, or networks data");
}

/// sanity-lnet 617 on a veth pair: a node's NI made by `net add --net
/// --if`, written as a modprobe `ip2nets=` line, converted by
/// `legacy2yaml` and imported into the node reinitialised gives the same
/// export; `networks=` with and without an interface imports too.
#[test]
fn legacy2yaml_output_imports_back_as_sanity_lnet_checks_it() {
    let ip = "127.0.97.110";
    let Some(veth) = Veth::new(ip.parse().unwrap()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nid0 = "127.0.97.111@tcp9";
    let port = common_free_port(&[ip_of(nid0), ip.parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp9", nid0), global(port)),
    );
    n.ok(&["lnet", "unconfigure"]);
    n.ok(&["lnet", "configure"]);
    n.ok(&["net", "add", "--net", "tcp", "--if", &veth.a]);
    let expected = n.ok(&["export", "--backup"]);
    assert!(expected.contains(&format!("{ip}@tcp")), "{expected}");

    let modprobe = dir.path().join("lnet.conf");
    std::fs::write(
        &modprobe,
        format!("options lnet ip2nets=\"tcp({}) 127.0.97.*\"\n", veth.a),
    )
    .unwrap();
    let o = lnet(None, &["legacy2yaml", "-m", modprobe.to_str().unwrap()]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    n.ok(&["lnet", "unconfigure"]);
    n.ok(&["lnet", "configure"]);
    let o = lnet_stdin(Some(&n.ctl), &["import"], &o.stdout);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert_eq!(n.ok(&["export", "--backup"]), expected);

    // networks=tcp1(IF): an NI on the interface.
    let o = lnet(
        None,
        &["legacy2yaml", &format!("networks=tcp1({})", veth.a)],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let o = lnet_stdin(Some(&n.ctl), &["import"], &o.stdout);
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    let v = n.json(&["net", "show", "--net", "tcp1"]);
    assert_eq!(
        v["net"][0]["local NI(s)"][0]["nid"],
        format!("{ip}@tcp1"),
        "{v}"
    );
    // networks=tcp2 alone: the first interface that is up and not a
    // loopback, as the module parameter (and `net add --net tcp2`) takes.
    let o = lnet(None, &["legacy2yaml", "networks=tcp2"]);
    assert_eq!(o.stdout, "net:\n    - net type: tcp2\n");
    let o = lnet_stdin(Some(&n.ctl), &["import"], &o.stdout);
    let v = n.json(&["net", "show"]);
    let first_up = v["net"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|net| net["net type"] == "tcp2")
        .count();
    if o.code == Some(0) {
        assert_eq!(first_up, 1, "{v}");
    } else {
        // No interface but lo is up on this machine.
        assert!(o.stderr.contains("no interface is up"), "{}", o.stderr);
        assert_eq!(first_up, 0, "{v}");
    }
}

/// sanity-lnet 158-162 on a veth pair whose end holds an IPv6 address
/// too (a unique-local one, `nodad`: nothing is sent to it): an `ip2nets`
/// rule whose range is that address, with or without a prefix length,
/// imports the same NI as `net add --if` (its NID the interface's IPv4
/// address); a second rule for the same net changes nothing, one for
/// another net applies; a range no address is in fails the import.
#[test]
fn ipv6_ip2nets_ranges_as_sanity_lnet_checks_them() {
    let ip = "127.0.97.120";
    let Some(veth) = Veth::new(ip.parse().unwrap()) else {
        return;
    };
    let v6 = "fd00:97:120::5";
    let added = Command::new("ip")
        .args([
            "-6",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            &veth.a,
            "nodad",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !added {
        eprintln!("skipped: this machine cannot give a veth an IPv6 address");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nid0 = "127.0.97.121@tcp9";
    let port = common_free_port(&[ip_of(nid0), ip.parse().unwrap()]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp9", nid0), global(port)),
    );
    let reinit = || {
        n.ok(&["lnet", "unconfigure"]);
        n.ok(&["lnet", "configure"]);
    };
    let import = |rules: &str| {
        reinit();
        let o = lnet_stdin(Some(&n.ctl), &["import"], &format!("ip2nets:\n{rules}"));
        assert_eq!(o.code, Some(0), "{rules}: {}{}", o.stdout, o.stderr);
        n.ok(&["export", "--backup"])
    };
    let rule = |net: &str, range: &str| {
        format!(
            "  - net-spec: {net}\n    interfaces:\n        0: {}\n    ip-range:\n        0: {range}\n",
            veth.a
        )
    };
    reinit();
    n.ok(&["net", "add", "--net", "tcp", "--if", &veth.a]);
    let expected = n.ok(&["export", "--backup"]);
    assert!(expected.contains(&format!("{ip}@tcp")), "{expected}");
    // 158, 159, 161.
    for range in [
        v6.to_owned(),
        format!("{v6}/128"),
        format!("{v6}/64"),
        format!("{v6}/32"),
        format!("{v6}/16"),
        format!("{v6}/8"),
    ] {
        assert_eq!(import(&rule("tcp", &range)), expected, "{range}");
    }
    // 160: later rules for the same net change nothing; one for another
    // net applies.
    let more = format!(
        "{}  - net-spec: tcp\n    interfaces:\n        0: {}\n",
        rule("tcp", v6),
        veth.a
    );
    assert_eq!(import(&more), expected);
    reinit();
    n.ok(&["net", "add", "--net", "tcp", "--if", &veth.a]);
    n.ok(&["net", "add", "--net", "tcp2", "--if", &veth.a]);
    let expected2 = n.ok(&["export", "--backup"]);
    assert_eq!(import(&format!("{more}{}", rule("tcp2", v6))), expected2);
    // 162: no address in the range.
    reinit();
    let o = lnet_stdin(
        Some(&n.ctl),
        &["import"],
        &format!("ip2nets:\n{}", rule("tcp", "2001:db8:dead:beef::1")),
    );
    assert_ne!(o.code, Some(0), "{}", o.stdout);
    assert!(o.stderr.contains("no rule matches"), "{}", o.stderr);
}

/// sanity-lnet 208 on two veth pairs: the `ip2nets` module parameter
/// (`colibri lnet run --ip2nets`) as the kernel reads it: one rule, two
/// rules on two nets, two rules on one net (both NIs, where lnetctl's
/// `ip2nets:` takes the first rule of a net only), one rule naming both
/// interfaces with bracketed ranges; naming an interface that is gone
/// stops the start.
#[test]
fn kernel_ip2nets_configurations_as_sanity_lnet_checks_them() {
    let (ip0, ip1) = ("127.0.97.130", "127.0.97.131");
    let Some(if0) = Veth::new(ip0.parse().unwrap()) else {
        return;
    };
    let Some(if1) = Veth::new(ip1.parse().unwrap()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = common_free_port(&[ip0.parse().unwrap(), ip1.parse().unwrap()]);
    let nids = |ip2nets: &str| {
        let n = Node::start_args(dir.path(), "n", &global(port), &["--ip2nets", ip2nets]);
        let v = n.json(&["net", "show"]);
        let mut got: Vec<String> = v["net"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|net| net["local NI(s)"].as_array().cloned().unwrap_or_default())
            .filter_map(|ni| ni["nid"].as_str().map(str::to_owned))
            .filter(|nid| nid != "0@lo")
            .collect();
        got.sort();
        got
    };
    let (a, b) = (&if0.a, &if1.a);
    assert_eq!(nids(&format!("tcp({a}) {ip0}")), [format!("{ip0}@tcp")]);
    assert_eq!(
        nids(&format!("tcp({a}) {ip0}; tcp1({b}) {ip1}")),
        [format!("{ip0}@tcp"), format!("{ip1}@tcp1")]
    );
    assert_eq!(
        nids(&format!("tcp({a}) {ip0}; tcp({b}) {ip1}")),
        [format!("{ip0}@tcp"), format!("{ip1}@tcp")]
    );
    let both = format!("tcp({a},{b}) [127,127].[0,0].[97,97].[130,131]");
    assert_eq!(nids(&both), [format!("{ip0}@tcp"), format!("{ip1}@tcp")]);
    drop(if1);
    let cfg = dir.path().join("g.yaml");
    std::fs::write(&cfg, global(port)).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
    cmd.args(["lnet", "run", "--config"])
        .arg(&cfg)
        .arg("--ctl")
        .arg(dir.path().join("gone.sock"))
        .args(["--ip2nets", &both]);
    assert_fails(&run_bounded(&mut cmd), "no interface");
}

/// The TCP sockets (`/proc/net/tcp`) in `state` (`01` established, `0A`
/// listening) whose local end is `ip:port`.
fn sockets_at(ip: std::net::Ipv4Addr, port: u16, state: &str) -> usize {
    let want = format!("{:08X}:{port:04X}", u32::from(ip).swap_bytes());
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == state
        })
        .count()
}

/// sanity-lnet 291: with `accept_port_bulk` (Lustre 2.17's module
/// parameter, here `global: accept_port_bulk:`) a node listens on both
/// ports and its BULK_IN and BULK_OUT connections go to the bulk port,
/// CONTROL ones to `accept_port`; a node pinging itself and another
/// node both work, `global show` and `export` show the port.
#[test]
fn bulk_connections_use_accept_port_bulk_as_sanity_lnet_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let (nid1, nid2) = ("127.0.86.1@tcp", "127.0.86.2@tcp");
    let (ip1, ip2) = (ip_of(nid1), ip_of(nid2));
    let port = common_free_port(&[ip1, ip2]);
    let bulk = common_free_port(&[ip1, ip2]);
    assert_ne!(port, bulk);
    let yaml = |nid: &str| {
        format!(
            "net:\n{}{}    accept_port_bulk: {bulk}\n",
            ni("tcp", nid),
            global(port)
        )
    };
    let a = Node::start(dir.path(), "a", &yaml(nid1));
    let b = Node::start(dir.path(), "b", &yaml(nid2));
    assert!(
        a.ok(&["global", "show"])
            .contains(&format!("accept_port_bulk: {bulk}\n")),
        "{}",
        a.ok(&["global", "show"])
    );
    assert!(
        a.ok(&["export"])
            .contains(&format!("accept_port_bulk: {bulk}\n"))
    );
    for ip in [ip1, ip2] {
        assert_eq!(sockets_at(ip, port, "0A"), 1, "listening at {ip}:{port}");
        assert_eq!(sockets_at(ip, bulk, "0A"), 1, "listening at {ip}:{bulk}");
    }
    // Itself: a CONTROL connection at its port and one bulk connection at
    // its bulk port, whose two ends are its BULK_IN and its BULK_OUT (as
    // Lustre's `conn_list` shows a node pinging itself: one entry on the
    // bulk port). Then the other node: a CONTROL connection at its port,
    // a BULK_IN and a BULK_OUT at its bulk port.
    let settled = |ip, p, n| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while sockets_at(ip, p, "01") < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        sockets_at(ip, p, "01")
    };
    a.ok(&["ping", nid1]);
    assert_eq!(
        settled(ip1, port, 1),
        1,
        "control connection at {ip1}:{port}"
    );
    assert_eq!(settled(ip1, bulk, 1), 1, "bulk connection at {ip1}:{bulk}");
    a.ok(&["ping", nid2]);
    assert_eq!(settled(ip2, bulk, 2), 2, "bulk connections at {ip2}:{bulk}");
    assert_eq!(
        sockets_at(ip2, port, "01"),
        1,
        "control connection at {ip2}:{port}"
    );
    // Data moves over them: 1 MiB selftest writes.
    let o = a.ok(&[
        "--json",
        "selftest",
        "brw",
        "--to",
        nid2,
        "--size",
        "1M",
        "--duration",
        "1",
        "--write",
    ]);
    let last: serde_json::Value =
        serde_json::from_str(o.lines().last().unwrap_or_default()).unwrap();
    let s = &last["selftest"];
    assert!(s["rpcs"].as_u64().unwrap_or(0) > 0, "{o}");
    assert_eq!(s["errors"].as_u64(), Some(0), "{o}");
    b.ok(&["ping", nid1]);
}

/// sanity-lnet 170 on lo and a veth: the LND tunables of a file are each
/// NI's own, the LNet tunables (`tunables:`) are the net's, taken from
/// its first NI (a later NI bringing others gets the net's, with
/// Lustre's warning), and `tunables:`/`lnd tunables:` beside `local
/// NI(s)` serve every NI that gives none. `import --old-api` is taken.
#[test]
fn tunables_of_a_net_as_sanity_lnet_checks_them() {
    let ip = "127.0.97.140";
    let Some(veth) = Veth::new(ip.parse().unwrap()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nid0 = "127.0.97.141@tcp9";
    let port = common_free_port(&[
        ip_of(nid0),
        ip.parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ]);
    let n = Node::start(
        dir.path(),
        "n",
        &format!("net:\n{}{}", ni("tcp9", nid0), global(port)),
    );
    let import = |yaml: &str| {
        n.ok(&["lnet", "unconfigure"]);
        n.ok(&["lnet", "configure"]);
        let o = lnet_stdin(Some(&n.ctl), &["import", "--old-api"], yaml);
        assert_eq!(o.code, Some(0), "{yaml}: {}{}", o.stdout, o.stderr);
        (n.ok(&["export", "--backup"]), o.stderr)
    };
    let count = |text: &str, what: &str| text.matches(what).count();
    let ni2 = |a: &str, b: &str| {
        format!(
            "net:\n-     net type: tcp\n      local NI(s):\n        - interfaces:\n                0: lo\n{a}        - interfaces:\n                0: {}\n{b}",
            veth.a
        )
    };
    let lnd = |c: u32| {
        format!(
            "          lnd tunables:\n                conns_per_peer: {c}\n                tos: -1\n"
        )
    };
    let tun = |t: u32| {
        format!(
            "          tunables:\n                peer_timeout: {t}\n                peer_credits: 8\n                peer_buffer_credits: 0\n                credits: 256\n"
        )
    };
    // LND tunables per NI.
    let (e, _) = import(&ni2(&lnd(5), &lnd(3)));
    assert_eq!(
        (
            count(&e, "conns_per_peer: 5"),
            count(&e, "conns_per_peer: 3")
        ),
        (1, 1),
        "{e}"
    );
    // The first NI gives none: the net's are the defaults; the second's
    // LND tunables are its own, its LNet tunables the net's, with a
    // warning.
    let (e, warn) = import(&ni2("", &format!("{}{}", tun(181), lnd(3))));
    assert_eq!(count(&e, "peer_timeout: 181"), 0, "{e}");
    assert_eq!(count(&e, "peer_timeout: 180"), 2, "{e}");
    assert_eq!(count(&e, "conns_per_peer: 3"), 1, "{e}");
    assert!(
        warn.contains("all tunables of NIs of a net should be the same"),
        "{warn}"
    );
    // Given beside the NIs: both take them.
    let net_level = format!(
        "{}{}",
        ni2("", ""),
        "      tunables:\n            peer_timeout: 182\n            peer_credits: 8\n            peer_buffer_credits: 0\n            credits: 256\n      lnd tunables:\n            conns_per_peer: 3\n            tos: -1\n"
    );
    let (e, _) = import(&net_level);
    assert_eq!(count(&e, "peer_timeout: 182"), 2, "{e}");
    assert_eq!(count(&e, "conns_per_peer: 3"), 2, "{e}");
    // Different LNet tunables on the two: the first's, and the warning.
    let (e, warn) = import(&ni2(&tun(182), &tun(183)));
    assert_eq!(count(&e, "peer_timeout: 182"), 2, "{e}");
    assert!(warn.contains("should be the same"), "{warn}");
    // `net add` to a net that exists: the net's tunables too.
    n.ok(&[
        "net",
        "add",
        "--net",
        "tcp2",
        "--if",
        "lo",
        "--peer-timeout",
        "190",
    ]);
    n.ok(&[
        "net",
        "add",
        "--net",
        "tcp2",
        "--if",
        &veth.a,
        "--peer-timeout",
        "191",
    ]);
    let e = n.ok(&["export", "--backup"]);
    assert_eq!(
        (
            count(&e, "peer_timeout: 190"),
            count(&e, "peer_timeout: 191")
        ),
        (2, 0),
        "{e}"
    );
}
