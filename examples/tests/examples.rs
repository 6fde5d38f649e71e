//! Runs every example's code, so that none of them rots.

use colibri_bulk_mem::MemTransport;
use colibri_examples::{bulk_file, echo, ping};

#[test]
fn ping_runs() {
    let r = ping::run_local(&MemTransport::default(), 20, 100).unwrap();
    assert_eq!((r.sent, r.received), (20, 20));
    assert!(r.min_us > 0.0 && r.min_us <= r.avg_us && r.avg_us <= r.max_us);
}

#[test]
fn bulk_ping_moves_and_checks_its_bytes_both_ways() {
    use colibri_rpc::{RpcConfig, RpcMachine};
    use std::time::Duration;
    let x = MemTransport::default();
    let server = RpcMachine::start_on(&x, "127.0.0.1:0:1", RpcConfig::default()).unwrap();
    ping::install_bulk_server(&server).unwrap();
    let client = RpcMachine::start_on(&x, "127.0.0.1:0:2", RpcConfig::default()).unwrap();
    let session = client.session(server.addr()).unwrap();
    let t = Duration::from_secs(10);
    for size in [1, 4096, (1 << 20) + 3] {
        let mut seen = 0;
        let r = ping::bulk_ping(&client, &session, 3, size, Duration::ZERO, t, |p| {
            assert!(p.error.is_none(), "{p:?}");
            seen += 1;
        })
        .unwrap();
        assert_eq!((r.sent, r.received, seen), (3, 3, 3), "{size} bytes");
    }
    // Sizes out of range are refused before anything is sent.
    for size in [0, ping::MAX_BULK_PING + 1] {
        assert!(ping::bulk_ping(&client, &session, 1, size, Duration::ZERO, t, |_| {}).is_err());
    }
    // Malformed requests are refused with an error: no bulk buffers, a
    // sink alone, a sink smaller than the source.
    let reg = |n: usize| client.alloc(n).unwrap();
    for bulk in [
        vec![],
        vec![colibri_rpc::BulkArg::Sink { buf: reg(64) }],
        vec![
            colibri_rpc::BulkArg::Source {
                buf: reg(64),
                len: 64,
            },
            colibri_rpc::BulkArg::Sink { buf: reg(32) },
        ],
    ] {
        let out = session.call_bulk(ping::OP_BULK_PING, &[], bulk);
        assert!(out.result.is_err(), "{:?}", out.result);
    }
    // A server without the service answers each ping with an error.
    let plain = ping::serve(&x, "127.0.0.1:0:3").unwrap();
    let other = client.session(plain.addr()).unwrap();
    let r = ping::bulk_ping(&client, &other, 2, 100, Duration::ZERO, t, |p| {
        assert!(p.error.is_some(), "{p:?}");
    })
    .unwrap();
    assert_eq!((r.sent, r.received), (2, 0));
    drop((session, other));
    client.shutdown().unwrap();
    server.shutdown().unwrap();
    plain.shutdown().unwrap();
}

#[test]
fn rpc_echo_runs() {
    let r = echo::run_local(&MemTransport::default(), &["a", "Bc"]).unwrap();
    assert_eq!(r[0].text, "A A");
    assert_eq!(r[1].text, "BC BC");
    assert_eq!(r[1].served, 2);
}

#[test]
fn bulk_file_copies_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    // Not a multiple of the chunk size: the last chunk is short.
    let r = bulk_file::run_local(&MemTransport::default(), dir.path(), (5 << 20) + 777).unwrap();
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, (5 << 20) + 777);
}

#[test]
fn bulk_file_refuses_bad_names() {
    use colibri_rpc::{RpcConfig, RpcMachine};
    let dir = tempfile::tempdir().unwrap();
    let xprt = MemTransport::default();
    let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:71", RpcConfig::default()).unwrap();
    let files = bulk_file::FileServer::start(&server, dir.path()).unwrap();
    let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:72", RpcConfig::default()).unwrap();
    let fc = bulk_file::FileClient::new(
        client.handle(),
        client.session(server.addr()).unwrap(),
        4096,
    );
    for bad in ["../etc/passwd", "", "a/b", ".."] {
        assert!(fc.stat(bad).is_err(), "{bad:?}");
    }
    assert!(fc.stat("missing").unwrap_err().to_string().contains("-2"));
    drop(fc);
    let d = client.shutdown().unwrap();
    assert_eq!(d.buffer_count(), 0);
    let d = server.shutdown().unwrap();
    assert_eq!(d.buffer_count(), 0);
    files.stop();
}

#[test]
fn examples_build_and_run_as_programs() {
    // The example binaries are built by `cargo test` (examples are
    // compiled for tests); run the cheap ones to check their exit codes.
    let dir = examples_dir();
    for (name, args) in [
        ("ping", vec!["3", "8"]),
        ("rpc_echo", vec!["x"]),
        ("bulk_file", vec![]),
    ] {
        let bin = dir.join(name);
        if !bin.exists() {
            // Built only when cargo builds the examples (cargo test does).
            continue;
        }
        let out = std::process::Command::new(&bin)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The directory of the example binaries (`cargo test` builds them).
fn examples_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples")
}

/// Waits for `child` at most `limit`; kills it and fails the test past
/// that.
fn wait_bounded(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> std::process::Output {
    let end = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The ping example between two processes over TCP on loopback: a server
/// on a free port, a client given the address it printed.
#[test]
fn ping_between_two_processes_over_tcp() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    let bin = examples_dir().join("ping");
    if !bin.exists() {
        // Built only when cargo builds the examples (cargo test does).
        return;
    }
    // The server stops by itself after a minute, whatever happens here.
    let mut server = Command::new(&bin)
        .args(["--serve", "127.0.0.1:0:1", "--for", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().expect("the server's address").unwrap();
    let addr = first
        .strip_prefix("ping server listening at ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    assert!(!addr.contains(":0:"), "a real port: {addr}");
    let client = Command::new(&bin)
        .args(["--connect", &addr, "20", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(client, Duration::from_secs(60));
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("20 sent, 20 received"), "{text}");
    assert_eq!(text.matches("1000 bytes: seq=").count(), 20, "{text}");
    // A client with no server there fails, and says so.
    let out = wait_bounded(
        Command::new(&bin)
            .args(["--connect", &addr, "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 sent, 0 received"));
}
