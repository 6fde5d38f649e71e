//! `colibri soak --two-process`: the peer transfer machine in a child
//! process, over TCP and LNet on loopback (free ports), short runs. Each test uses
//! its own seed, by which it finds its child processes in /proc.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn colibri() -> Command {
    Command::new(env!("CARGO_BIN_EXE_colibri"))
}

/// Process ids of the `colibri soak-peer` processes started with `seed`.
fn peers_with_seed(seed: u64) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        let seed_s = seed.to_string();
        if args.contains(&b"soak-peer".as_slice())
            && args
                .windows(2)
                .any(|w| w[0] == b"--seed" && w[1] == seed_s.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

/// Waits up to 30 s for `cond`.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `colibri soak --two-process --xprt XPRT` with these bounds and
/// returns its JSON summary (the run must succeed).
fn two_process_soak(
    xprt: &str,
    ops: u64,
    duration_s: u64,
    epoch_ops: u64,
    kill_every: u64,
    seed: u64,
) -> serde_json::Value {
    let out = colibri()
        .args(["soak", "--xprt", xprt, "--two-process", "--ops"])
        .arg(ops.to_string())
        .arg("--duration")
        .arg(duration_s.to_string())
        .arg("--epoch-ops")
        .arg(epoch_ops.to_string())
        .arg("--kill-every")
        .arg(kill_every.to_string())
        .arg("--seed")
        .arg(seed.to_string())
        .args(["--json", "-q"])
        .output()
        .expect("run colibri");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Kills the parent if the test fails half-way.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_process_soak_checks_both_sides_and_leaves_no_child() {
    let seed = 914_001;
    let v = two_process_soak("tcp", 30_000, 60, 3000, 3, seed);
    assert_eq!(v["two_process"], true, "{v}");
    assert_eq!(v["adds"], v["finals"], "{v}");
    assert!(v["ops"].as_u64().unwrap() >= 30_000, "{v}");
    assert!(v["epochs"].as_u64().unwrap() >= 9, "{v}");
    // The peer processes worked and checked their side; some were killed
    // with traffic in flight.
    assert!(v["peer_adds"].as_u64().unwrap() > 1000, "{v}");
    assert!(v["peer_payloads_checked"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peer_kills"].as_u64().unwrap() >= 3, "{v}");
    assert!(v["payloads_checked"].as_u64().unwrap() > 0, "{v}");
    for f in [
        "lost",
        "failed",
        "delayed",
        "duplicated",
        "truncated",
        "reset",
    ] {
        assert!(v[f].as_u64().unwrap() > 0, "{f}: {v}");
    }
    // Every child is gone (killed, or ended when told to quit).
    assert!(peers_with_seed(seed).is_empty(), "children left behind");
}

#[test]
fn two_process_soak_over_lnet_checks_both_sides_and_leaves_no_child() {
    // Each process has its own LNet node (127.0.65.1 and .2, free ports
    // given to both by the parent); every child killed leaves our node
    // with a dead peer, whose successor listens on the same port.
    let seed = 914_004;
    let v = two_process_soak("lnet", 20_000, 90, 4000, 2, seed);
    assert_eq!(v["transport"], "lnet", "{v}");
    assert_eq!(v["two_process"], true, "{v}");
    assert_eq!(v["adds"], v["finals"], "{v}");
    assert!(v["ops"].as_u64().unwrap() >= 20_000, "{v}");
    assert!(v["peer_adds"].as_u64().unwrap() > 1000, "{v}");
    assert!(v["peer_payloads_checked"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peer_kills"].as_u64().unwrap() >= 2, "{v}");
    assert!(v["payloads_checked"].as_u64().unwrap() > 0, "{v}");
    assert!(peers_with_seed(seed).is_empty(), "children left behind");
}

#[test]
fn the_child_leaves_when_its_parent_is_killed() {
    let seed = 914_002;
    let parent = colibri()
        .args([
            "soak",
            "--xprt",
            "tcp",
            "--two-process",
            "--ops",
            "1000000000",
            "--duration",
            "120",
            "--seed",
            &seed.to_string(),
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run colibri");
    let mut parent = Reaper(parent);
    wait_for("the child process", || !peers_with_seed(seed).is_empty());
    // SIGKILL: the parent runs no cleanup; the child sees its input end.
    parent.0.kill().unwrap();
    parent.0.wait().unwrap();
    wait_for("the child to leave", || peers_with_seed(seed).is_empty());
}

#[test]
fn the_peer_refuses_bad_commands_and_two_process_needs_a_network() {
    // A command it does not know: exit status 1, no hang.
    let mut peer = colibri()
        .args(["soak-peer", "--xprt", "tcp", "--seed", "914003"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut i = peer.stdin.take().unwrap();
        writeln!(i, "start").unwrap();
        writeln!(i, "frobnicate 3").unwrap();
    }
    let out = peer.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("addr 127.0.0.1:"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected command"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // bulk_mem cannot cross processes.
    let out = colibri()
        .args(["soak", "--xprt", "mem", "--two-process"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--two-process runs over tcp, rdma or lnet")
    );
}
