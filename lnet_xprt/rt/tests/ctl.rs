//! The control socket in one process: permissions, versioning, malformed
//! requests, timeouts, missing and stale sockets, and commands against a
//! node.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_lnet_rt::conf::NodeConf;
use colibri_lnet_rt::ctl::{self, Command, CtlServer, Daemon, Reply, errno};
use colibri_lnet_rt::yaml::Doc;

const T: Duration = Duration::from_secs(20);

fn node(ip: &str) -> Arc<Daemon> {
    let yaml = format!(
        "net:\n    - net type: tcp\n      local NI(s):\n        - nid: {ip}@tcp\nglobal:\n    accept_port: 0\n    accept: all\n"
    );
    let (c, warn) = NodeConf::from_yaml(&yaml).unwrap();
    assert!(warn.is_empty(), "{warn:?}");
    Daemon::start(&c).unwrap()
}

fn call(p: &Path, cmd: Command) -> Result<Doc, ctl::Failure> {
    ctl::call(p, &cmd, T, |_| {})
}

fn raw(p: &Path, body: &[u8]) -> Reply {
    let mut s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&u32::try_from(body.len()).unwrap().to_be_bytes())
        .unwrap();
    s.write_all(body).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut b = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut b).unwrap();
    serde_json::from_slice(&b).unwrap()
}

#[test]
fn socket_is_private_and_speaks_one_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.sock");
    let d = node("127.0.21.1");
    let mut srv = CtlServer::start(d.clone(), &path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // A second server on the same live socket is refused.
    let e = CtlServer::start(d.clone(), &path).unwrap_err();
    assert_eq!(e.errno, errno::EEXIST, "{e}");

    // Another protocol version: EPROTO naming ours.
    let r = raw(
        &path,
        br#"{"version": 99, "cmd": {"cmd": "net_show", "net": null, "verbose": false}}"#,
    );
    let f = r.result.unwrap_err();
    assert_eq!(f.errno, errno::EPROTO);
    assert!(
        f.descr.contains("99") && f.descr.contains('1'),
        "{}",
        f.descr
    );
    // No version, garbage, unknown command.
    assert_eq!(raw(&path, b"{}").result.unwrap_err().errno, errno::EPROTO);
    assert_eq!(
        raw(&path, b"\xff\x00garbage").result.unwrap_err().errno,
        errno::EPROTO
    );
    let f = raw(&path, br#"{"version": 1, "cmd": {"cmd": "explode"}}"#)
        .result
        .unwrap_err();
    assert_eq!(f.errno, errno::EINVAL, "{}", f.descr);
    // An oversized frame is refused without reading it.
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();

    // The node still serves.
    let doc = call(&path, Command::GlobalShow).unwrap();
    assert_eq!(
        doc.get("global").and_then(|g| g.get("discovery")),
        Some(&Doc::Int(1))
    );

    srv.stop();
    assert!(!path.exists(), "socket file removed at stop");
    let e = call(&path, Command::GlobalShow).unwrap_err();
    assert_eq!(e.errno, errno::ENOENT);
    assert!(e.descr.contains("is the node running"), "{}", e.descr);
    d.shutdown();
}

#[test]
fn stale_socket_and_silent_node() {
    let dir = tempfile::tempdir().unwrap();
    // A socket file nobody listens on: "node not running".
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let e = call(&stale, Command::StatsShow).unwrap_err();
    assert_eq!(e.errno, errno::ECONNREFUSED);
    assert!(e.descr.contains("node not running"), "{}", e.descr);
    // A server replaces it.
    let d = node("127.0.21.2");
    let srv = CtlServer::start(d.clone(), &stale).unwrap();
    call(&stale, Command::StatsShow).unwrap();
    drop(srv);

    // Something that accepts and never answers: the client gives up on
    // time.
    let silent = dir.path().join("silent.sock");
    let l = UnixListener::bind(&silent).unwrap();
    let t0 = Instant::now();
    let e = ctl::call(
        &silent,
        &Command::StatsShow,
        Duration::from_millis(500),
        |_| {},
    )
    .unwrap_err();
    assert_eq!(e.errno, errno::ETIMEDOUT, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(l);
    d.shutdown();
}

#[test]
fn commands_against_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.sock");
    let d = node("127.0.21.3");
    let _srv = CtlServer::start(d.clone(), &path).unwrap();

    // Bad NIDs and nets: EINVAL, nothing changes.
    for cmd in [
        Command::RouteAdd {
            net: "tcp1".into(),
            gateway: "1.2.3@tcp".into(),
            hop: None,
            priority: None,
        },
        Command::RouteAdd {
            net: "nonet".into(),
            gateway: "127.0.21.9@tcp".into(),
            hop: None,
            priority: None,
        },
        Command::Set {
            name: "retry_count".into(),
            value: "many".into(),
        },
        Command::Set {
            name: "colour".into(),
            value: "1".into(),
        },
    ] {
        let e = call(&path, cmd).unwrap_err();
        assert_eq!(e.errno, errno::EINVAL, "{e}");
    }
    // A route to a local net.
    let e = call(
        &path,
        Command::RouteAdd {
            net: "tcp".into(),
            gateway: "127.0.21.9@tcp".into(),
            hop: None,
            priority: None,
        },
    )
    .unwrap_err();
    assert!(e.descr.contains("tcp"), "{e}");
    // A route, shown back.
    call(
        &path,
        Command::RouteAdd {
            net: "tcp7".into(),
            gateway: "127.0.21.9@tcp".into(),
            hop: Some(2),
            priority: Some(3),
        },
    )
    .unwrap();
    let doc = call(
        &path,
        Command::RouteShow {
            net: None,
            gateway: None,
            verbose: true,
        },
    )
    .unwrap();
    let r = &doc.get("route").unwrap().items()[0];
    assert_eq!(r.get("net"), Some(&Doc::from("tcp7")));
    assert_eq!(r.get("hop"), Some(&Doc::Int(2)));
    assert_eq!(r.get("priority"), Some(&Doc::Int(3)));

    // Settings read back through global show and routing show.
    for (name, v) in [
        ("retry_count", "1"),
        ("transaction_timeout", "30"),
        ("health_sensitivity", "50"),
        ("discovery", "0"),
        ("drop_asym_route", "1"),
        ("recovery_interval", "2"),
    ] {
        call(
            &path,
            Command::Set {
                name: name.into(),
                value: v.into(),
            },
        )
        .unwrap();
        let g = call(&path, Command::GlobalShow).unwrap();
        assert_eq!(
            g.get("global")
                .and_then(|g| g.get(name))
                .and_then(Doc::as_i64),
            v.parse().ok(),
            "{name}"
        );
    }
    call(
        &path,
        Command::Set {
            name: "small_buffers".into(),
            value: "100".into(),
        },
    )
    .unwrap();
    call(
        &path,
        Command::Set {
            name: "routing".into(),
            value: "1".into(),
        },
    )
    .unwrap();
    let r = call(&path, Command::RoutingShow).unwrap();
    assert_eq!(
        r.get("buffers").and_then(|b| b.get("small")),
        Some(&Doc::Int(100))
    );
    // Starting (Lustre's LNET_ROUTING_STARTING, 3): forwarding, advertised
    // after alive_router_check_interval + router_ping_timeout.
    assert_eq!(
        r.get("routing").unwrap().items()[1].get("enable"),
        Some(&Doc::Int(3))
    );

    // Fault rules: add, show, delete.
    call(
        &path,
        Command::FaultAdd {
            kind: ctl::FaultKind::Drop,
            rule: ctl::FaultArgs {
                source: Some("*".into()),
                dest: Some("127.0.21.9@tcp".into()),
                rate: Some(2),
                messages: vec!["put".into()],
                ..Default::default()
            },
        },
    )
    .unwrap();
    let e = call(
        &path,
        Command::FaultAdd {
            kind: ctl::FaultKind::Delay,
            rule: ctl::FaultArgs {
                rate: Some(1),
                ..Default::default()
            },
        },
    )
    .unwrap_err();
    assert!(e.descr.contains("latency"), "{e}");
    let f = call(&path, Command::FaultShow { kind: None }).unwrap();
    assert_eq!(f.get("fault").unwrap().items().len(), 1);
    call(
        &path,
        Command::FaultDel {
            kind: ctl::FaultKind::Drop,
            source: None,
            dest: None,
            all: true,
        },
    )
    .unwrap();
    let f = call(&path, Command::FaultShow { kind: None }).unwrap();
    assert!(f.get("fault").unwrap().items().is_empty());

    // Ping of ourselves, lnetctl's keys.
    let p = call(
        &path,
        Command::Ping {
            nids: vec!["127.0.21.3@tcp".into()],
            timeout_ms: 5000,
            source: None,
        },
    )
    .unwrap();
    let y = p.to_yaml();
    assert!(
        y.contains("primary nid: 127.0.21.3@tcp")
            && y.contains("Multi-Rail: True")
            && y.contains("peer ni:"),
        "{y}"
    );
    d.shutdown();
}

/// A socket path taken over by someone else while the node runs: stopping
/// neither hangs nor removes the other's file.
#[test]
fn stop_when_the_path_is_no_longer_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("n.sock");
    let d = node("127.0.21.4");
    let mut srv = CtlServer::start(d.clone(), &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let other = UnixListener::bind(&path).unwrap();
    let t0 = Instant::now();
    srv.stop();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(path.exists(), "the other's socket stays");
    drop(other);
    d.shutdown();
}
