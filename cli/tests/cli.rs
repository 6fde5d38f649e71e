//! The `colibri` program's RPC commands, run as a user would.

use std::process::Command;

fn colibri(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args(args)
        .output()
        .expect("run colibri")
}

/// Runs `colibri ping ARGS`, which must succeed with all `n` pings back;
/// returns what it printed.
fn ping_ok(args: &[&str], n: u64) -> String {
    let out = colibri(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("{n} sent, {n} received, 0% lost")),
        "{text}"
    );
    text
}

#[test]
fn ping_an_in_process_server() {
    ping_ok(&["ping", "-c", "5", "-i", "0", "-s", "1K"], 5);
    ping_ok(&["ping", "--bulk", "-c", "3", "-i", "0", "-s", "1M"], 3);
}

/// `ping --xprt lnet` with its own server: two LNet nodes of the process
/// (127.0.0.2@tcp and 127.0.0.3@tcp) over the socket LND.
#[test]
fn ping_an_in_process_server_over_lnet() {
    let text = ping_ok(
        &["ping", "--xprt", "lnet", "-c", "5", "-i", "0", "-s", "1K"],
        5,
    );
    assert!(text.contains("127.0.0.3@tcp:12345:30:1"), "{text}");
    // Bulk pings of 3 MiB: three LNet messages each way per ping.
    ping_ok(
        &[
            "ping", "--xprt", "lnet", "--bulk", "-c", "3", "-i", "0", "-s", "3M",
        ],
        3,
    );
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
    serve_and_ping_between_processes("tcp", "127.0.0.1:0:1", 1);
}

/// The same over LNet (each process an LNet node on port 7988), with the
/// client process started three times in a row: each start is a new
/// incarnation of the same NID, which the server's node admits at once
/// (it was refused as a reboot, and the first call timed out, until the
/// socket LND forgot a peer's incarnation with its last connection, as
/// Lustre does).
#[test]
fn serve_and_ping_between_two_processes_over_lnet() {
    serve_and_ping_between_processes("lnet", "127.0.0.7@tcp:12345:30:1", 3);
}

/// A `colibri serve` process at `listen`, its address and banner. It stops
/// by itself after a minute, whatever happens in the test, and is killed
/// when the test ends (a failed assertion included).
fn serve_process(xprt: &str, listen: &str) -> (KillOnDrop, String, String) {
    use std::process::Stdio;

    let server = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "serve",
            "--xprt",
            xprt,
            "--listen",
            listen,
            "--duration",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = KillOnDrop(server);
    let (addr, first) = banner(&mut server.0);
    (server, addr, first)
}

/// Three `colibri ping --xprt lnet` processes at once against one server:
/// each LNet node needs its own NID (they all listen on port 7988), so a
/// client whose default NID is taken picks the next free loopback one
/// instead of failing with "Address already in use".
#[test]
fn lnet_pings_at_once_each_take_their_own_nid() {
    use std::process::Stdio;

    let (server, addr, _) = serve_process("lnet", "127.0.0.11@tcp:12345:30:1");
    let pings: Vec<KillOnDrop> = (0..3)
        .map(|_| {
            KillOnDrop(
                Command::new(env!("CARGO_BIN_EXE_colibri"))
                    .args(["ping", "--xprt", "lnet", &addr, "-c", "20", "-i", "20"])
                    .args(["--json", "-q"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    for mut p in pings {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while p.0.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < end,
                "a ping still running after a minute"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        p.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        p.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(p.0.wait().unwrap().success(), "{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["summary"]["received"], 20, "{v}");
    }
    drop(server);
}

/// A `colibri serve` process and `rounds` `colibri ping` processes one
/// after the other, each with message and bulk pings that must all come
/// back.
fn serve_and_ping_between_processes(xprt: &str, listen: &str, rounds: usize) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let (server, addr, first) = serve_process(xprt, listen);
    assert!(first.contains(&format!("transport {xprt}")), "{first}");
    let ping = |extra: &[&str]| {
        let mut client = Command::new(env!("CARGO_BIN_EXE_colibri"))
            .args(["ping", "--xprt", xprt, &addr, "-i", "0", "--json", "-q"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        while client.try_wait().unwrap().is_none() {
            if Instant::now() > end {
                let _ = client.kill();
                panic!("ping still running after a minute");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = client.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    for round in 0..rounds {
        let v = ping(&["-c", "10", "-s", "4K"]);
        assert_eq!(v["transport"], xprt);
        assert_eq!(v["local_server"], false);
        assert_eq!(v["summary"]["sent"], 10);
        assert_eq!(v["summary"]["received"], 10, "round {round}: {v}");
        assert_eq!(v["summary"]["peer"], addr.as_str());
        // No connection was refused and tried again a second later.
        let max = v["summary"]["max_us"].as_f64().unwrap();
        assert!(max < 900_000.0, "round {round}: a ping took {max} µs: {v}");
        // Bulk pings: the server process pulls 1 MiB and pushes it back.
        let v = ping(&["--bulk", "-c", "4", "-s", "1M"]);
        assert_eq!(v["summary"]["received"], 4, "round {round}: {v}");
        assert_eq!(v["replies"][0]["bytes"], 1 << 20, "{v}");
    }
    drop(server);
}

/// What a new user tripped over: each of these printed something
/// misleading before.
#[test]
fn addresses_without_a_service_and_oversize_pings_are_refused_up_front() {
    let out = colibri(&["ping", "--xprt", "tcp", "127.0.0.1:4041", "-c", "3"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no service id") && err.contains("127.0.0.1:4041:1"),
        "{err}"
    );
    assert!(!err.contains("PING"), "nothing was sent: {err}");
    let out = colibri(&["serve", "--listen", "127.0.0.1:4041", "--duration", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no service id"));
    // Too large a ping: one clear line before anything else.
    let out = colibri(&["ping", "-s", "17K", "-c", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("16280"), "{err}");
    let help = colibri(&["ping", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("16280"));
    // A bulk ping has its own bounds.
    for size in ["0", "17M"] {
        let out = colibri(&["ping", "--bulk", "-s", size, "-c", "1"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("bulk ping moves 1 to 16777216"), "{err}");
    }
}

#[test]
fn no_reply_is_said_and_fails() {
    let out = colibri(&["ping", "127.0.0.1:4997:9", "-c", "1", "--timeout", "200"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no reply came back"), "{text}");
    assert!(!text.contains("rtt"), "{text}");
}

#[test]
fn a_busy_address_is_one_line_and_logs_have_no_colours() {
    let first = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "serve",
            "--xprt",
            "tcp",
            "--listen",
            "127.0.0.1:0:1",
            "--duration",
            "30",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = KillOnDrop(first);
    let addr = banner_addr(&mut first.0);
    let out = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "serve",
            "--xprt",
            "tcp",
            "--listen",
            &addr,
            "--duration",
            "0",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escapes when not a terminal: {err:?}"
    );
    assert!(!err.contains("WARN"), "{err}");
    assert!(err.contains("already in use"), "{err}");
}

#[test]
fn serve_prints_its_statistics_on_sigterm() {
    let child = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args([
            "serve",
            "--xprt",
            "tcp",
            "--listen",
            "127.0.0.1:0:1",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let addr = banner_addr(&mut child.0);
    let ping = colibri(&["ping", "--xprt", "tcp", &addr, "-c", "3", "-i", "0", "-q"]);
    assert!(ping.status.success());
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.0.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < end, "serve ignored SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(child.0.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stats"]["requests"], 3, "{v}");
}

#[test]
fn bench_shows_progress_with_a_total_and_rounds_its_numbers() {
    let out = colibri(&[
        "bench",
        "--smoke",
        "--tests",
        "rtt,oneway",
        "--sizes",
        "64",
        "--mode",
        "polling",
        "--no-pin",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let steps: Vec<&str> = err.lines().filter(|l| l.contains("/2 ")).collect();
    assert_eq!(steps.len(), 2, "one line per step, with the total: {err}");
    let text = String::from_utf8_lossy(&out.stdout);
    let total = text
        .lines()
        .next()
        .and_then(|l| l.split(", ").last())
        .unwrap_or_default();
    assert!(total.ends_with(" s total") && total.contains('.'), "{text}");
    let out = colibri(&[
        "bench", "--smoke", "--tests", "rtt", "--mode", "polling", "--no-pin", "--json", "-q",
    ]);
    let json = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["seconds"].as_f64().unwrap() > 0.0);
    for num in json
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .filter(|t| t.contains('.'))
    {
        let digits = num
            .split('e')
            .next()
            .unwrap_or("")
            .chars()
            .filter(char::is_ascii_digit)
            .collect::<String>();
        let significant = digits.trim_start_matches('0').len();
        assert!(significant <= 6, "unrounded number {num} in {json}");
    }
}

/// A child process killed (SIGKILL) if the test ends without reaping it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The address a `colibri serve` child printed in its banner.
fn banner_addr(child: &mut std::process::Child) -> String {
    banner(child).0
}

/// The address a `colibri serve` child printed in its banner, and the
/// banner.
fn banner(child: &mut std::process::Child) -> (String, String) {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("the server's banner").unwrap();
    // Keep reading (and dropping) the rest, so that the child never blocks
    // on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    // "serving ping, bulk ping and echo at 127.0.0.1:PORT:1 (transport tcp); ..."
    let addr = first
        .split_once(" at ")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(a, _)| a.to_string())
        .unwrap_or_else(|| panic!("unexpected banner {first:?}"));
    (addr, first)
}

#[test]
fn soak_checks_every_add_on_every_transport() {
    for xprt in ["mem", "tcp", "lnet"] {
        let out = colibri(&[
            "soak",
            "--xprt",
            xprt,
            "--ops",
            "20000",
            "--duration",
            "20",
            "--epoch-ops",
            "5000",
            "--json",
            "-q",
        ]);
        assert!(
            out.status.success(),
            "{xprt}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["adds"], v["finals"], "{v}");
        assert!(v["ops"].as_u64().unwrap() >= 20_000, "{v}");
        assert!(v["epochs"].as_u64().unwrap() >= 4, "{v}");
        assert!(v["lost"].as_u64().unwrap() > 0, "{v}");
    }
    // Arguments are checked.
    let out = colibri(&["soak", "--duration=-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
}

#[test]
fn bench_lnet_smoke() {
    let out = colibri(&[
        "bench", "--tests", "lnet", "--smoke", "--runs", "1", "--json", "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["transport"], "lnet");
    let rows = v["sections"][0]["rows"].as_array().unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(
        tests,
        [
            "lnet-rtt",
            "lnet-put",
            "lnet-routed-put",
            "lnet-routed-relay"
        ]
    );
    for r in rows {
        assert!(r["ours"]["median"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["baseline"]["median"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// `--routed`: the LNet transport's workloads through a router node, with
/// the routed target (1 MiB bulk at least 0.7x a raw stream); refused
/// for other transports.
#[test]
fn bench_lnet_routed_smoke() {
    let out = colibri(&[
        "bench", "--xprt", "lnet", "--routed", "--smoke", "--mode", "blocking", "--tests",
        "rtt,bulk", "--json", "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["sections"][0];
    assert_eq!(s["routed"], true, "{s}");
    let rows = s["rows"].as_array().unwrap();
    let mib = rows
        .iter()
        .find(|r| r["test"] == "bulk-read" && r["size"] == 1 << 20)
        .expect("a 1 MiB bulk row");
    assert_eq!(mib["target"]["RatioAtLeast"], 0.7, "{mib}");
    assert!(mib["ours"]["median"].as_f64().unwrap() > 0.0);
    // The same figures against a raw user-space relay, without a target.
    for name in ["bulk-read-relay", "bulk-write-relay"] {
        let relay = rows
            .iter()
            .find(|r| r["test"] == name && r["size"] == 1 << 20)
            .unwrap_or_else(|| panic!("a 1 MiB {name} row"));
        assert!(relay["target"].is_null(), "{relay}");
        assert!(relay["baseline"]["median"].as_f64().unwrap() > 0.0);
        assert!(relay["baseline_name"].as_str().unwrap().contains("relay"));
    }
    let rtt = rows
        .iter()
        .find(|r| r["test"] == "rtt")
        .expect("an rtt row");
    assert!(
        rtt["target"].is_null(),
        "no round-trip target through a router"
    );
    let out = colibri(&["bench", "--xprt", "tcp", "--routed", "--smoke", "-q"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--routed"));
}

#[test]
fn bench_scale_smoke() {
    for xprt in ["mem", "tcp"] {
        let out = colibri(&[
            "bench", "--scale", "--smoke", "--xprt", xprt, "--json", "-q",
        ]);
        assert!(
            out.status.success(),
            "{xprt}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["transport"], xprt);
        let shared = v["shared_domain"].as_array().unwrap();
        let clients: Vec<u64> = shared
            .iter()
            .map(|p| p["clients"].as_u64().unwrap())
            .collect();
        assert_eq!(clients, [1, 10], "{v}");
        for p in shared.iter().chain(v["own_domains"].as_array().unwrap()) {
            assert!(p["rate"].as_f64().unwrap() > 0.0, "{p}");
            assert!(
                p["p50_us"].as_f64().unwrap() <= p["p99_us"].as_f64().unwrap(),
                "{p}"
            );
        }
        let engine = v["shared_engine"].as_array().unwrap();
        assert_eq!(engine.len(), 2, "{v}");
        let sim = v["lnet_sim"].as_array().unwrap();
        assert_eq!(sim.len(), 2, "{v}");
        assert!(sim[1]["messages"].as_u64().unwrap() > sim[0]["messages"].as_u64().unwrap());
    }
}

/// `--tm-threads both`: the LNet transport measured with callbacks on the
/// engine threads and with a delivery thread per transfer machine, one
/// section each, back to back; the machines are pinned only in the second
/// (`confined`).
#[test]
fn bench_lnet_tm_threads_smoke() {
    let out = colibri(&[
        "bench",
        "--xprt",
        "lnet",
        "--tm-threads",
        "both",
        "--mode",
        "blocking",
        "--tests",
        "rtt",
        "--sizes",
        "64",
        "--smoke",
        "--runs",
        "1",
        "--json",
        "-q",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sections = v["sections"].as_array().unwrap();
    let threads: Vec<bool> = sections
        .iter()
        .map(|s| s["tm_threads"].as_bool().unwrap())
        .collect();
    assert_eq!(threads, [false, true]);
    for s in sections {
        // Only a machine with its own thread can be confined: without one,
        // the pinning is the baselines' alone, and the report says so.
        let confinable = s["tm_threads"].as_bool().unwrap();
        assert_eq!(
            s["confined"].as_bool(),
            Some(confinable && !s["pinned"].is_null()),
            "{s}"
        );
        let rows = s["rows"].as_array().unwrap();
        assert_eq!(rows[0]["test"], "rtt");
        assert!(rows[0]["ours"]["median"].as_f64().unwrap() > 0.0, "{s}");
    }
}

/// `serve --lnet-config`: refused with another transport, or a file that
/// cannot be read or has no NI, each in one clear line.
#[test]
fn serve_lnet_config_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let no_ni = dir.path().join("no-ni.yaml");
    std::fs::write(&no_ni, "global:\n    accept_port: 7990\n").unwrap();
    for (args, want) in [
        (
            vec!["--xprt", "tcp", "--lnet-config", no_ni.to_str().unwrap()],
            "only with --xprt lnet",
        ),
        (
            vec!["--xprt", "lnet", "--lnet-config", missing.to_str().unwrap()],
            "cannot read",
        ),
        (
            vec!["--xprt", "lnet", "--lnet-config", no_ni.to_str().unwrap()],
            "no local NI",
        ),
    ] {
        let mut a = vec![
            "serve",
            "--duration",
            "1",
            "--listen",
            "127.0.0.1@tcp:12345:30:1",
        ];
        a.extend(args);
        let out = colibri(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?}: {err}");
        assert!(err.contains(want), "{a:?}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
