//! The `colibri` program's RPC commands, run as a user would.

use std::process::Command;

fn colibri(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args(args)
        .output()
        .expect("run colibri")
}

#[test]
fn ping_an_in_process_server() {
    let out = colibri(&["ping", "-c", "5", "-i", "0", "-s", "1K"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("5 sent, 5 received, 0% lost"), "{text}");
}

#[test]
fn ping_json_and_an_unreachable_server() {
    let out = colibri(&["ping", "--json", "-q", "-c", "2", "-i", "0"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["received"], 2);
    assert!(v["replies"][0]["rtt_us"].as_f64().unwrap() > 0.0);
    // Nobody serves there in this process: every ping fails, exit status 1.
    let out = colibri(&[
        "ping",
        "127.0.0.1:4999:9",
        "-c",
        "2",
        "-i",
        "0",
        "--timeout",
        "500",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 sent, 0 received"));
}

#[test]
fn serve_for_a_while() {
    let out = colibri(&[
        "serve",
        "--listen",
        "127.0.0.1:4998:3",
        "--duration",
        "0.1",
        "--json",
        "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["addr"], "127.0.0.1:4998:3");
    // A bad address is refused with a clear message and status 1.
    let out = colibri(&["serve", "--listen", "not-an-address", "--duration", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot serve at not-an-address"));
}

#[test]
fn bench_rpc_smoke() {
    let out = colibri(&[
        "bench", "--smoke", "--tests", "rpc", "--mode", "polling", "--json", "--no-pin", "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["sections"][0]["rows"].as_array().unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(
        tests,
        [
            "rpc-rtt",
            "rpc-rate",
            "rpc-bulk-read",
            "rpc-bulk-write",
            "rpc-oneway"
        ]
    );
    for r in rows {
        assert!(r["ours"]["median"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["baseline"]["median"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// `colibri serve --xprt tcp` in one process, `colibri ping --xprt tcp`
/// from another, by the address the server printed.
#[test]
fn serve_and_ping_between_two_processes_over_tcp() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    // The server stops by itself after a minute, whatever happens here.
    let mut server = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "serve",
            "--xprt",
            "tcp",
            "--listen",
            "127.0.0.1:0:1",
            "--duration",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let first = lines.next().expect("the server's banner").unwrap();
    // "serving ping and echo at 127.0.0.1:PORT:1 (transport tcp); ..."
    let addr = first
        .split_once(" at ")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(a, _)| a.to_string())
        .unwrap_or_else(|| panic!("unexpected banner {first:?}"));
    assert!(first.contains("transport tcp"), "{first}");
    let mut client = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "ping", "--xprt", "tcp", &addr, "-c", "10", "-i", "0", "-s", "4K", "--json", "-q",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while client.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = client.kill();
            let _ = server.kill();
            panic!("ping still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = client.wait_with_output().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["local_server"], false);
    assert_eq!(v["summary"]["sent"], 10);
    assert_eq!(v["summary"]["received"], 10);
    assert_eq!(v["summary"]["peer"], addr.as_str());
}
