//! Helpers shared by the `colibri lnet` process tests: a node child
//! killed when its guard drops (and stopping when its standard input
//! closes, should the test process die), bounded commands, free ports.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::{Duration, Instant};

/// The most any one command may take.
pub(crate) const CMD_LIMIT: Duration = Duration::from_secs(60);
/// The most a node may take to start.
pub(crate) const START_LIMIT: Duration = Duration::from_secs(30);

/// A `colibri lnet run` child, killed when dropped.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) lines: Receiver<String>,
    pub(crate) ctl: PathBuf,
    pub(crate) stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts a node from `yaml` (written to `dir/name.yaml`) and waits for
    /// its READY line.
    pub(crate) fn start(dir: &Path, name: &str, yaml: &str) -> Self {
        Self::start_with(dir, name, yaml, None)
    }

    /// Starts a node whose log (stderr) is filtered by `filter` (a
    /// `RUST_LOG` value) instead of the default, for a test that reads
    /// the node's debug lines.
    pub(crate) fn start_logged(dir: &Path, name: &str, yaml: &str, filter: &str) -> Self {
        Self::spawn(dir, name, yaml, None, Some(filter), &[])
    }

    /// Starts a node with more arguments to `colibri lnet run`.
    pub(crate) fn start_args(dir: &Path, name: &str, yaml: &str, args: &[&str]) -> Self {
        Self::spawn(dir, name, yaml, None, None, args)
    }

    /// With `default_dir`, the node picks its socket's path itself in that
    /// directory (`COLIBRI_LNET_CTL_DIR`).
    pub(crate) fn start_with(
        dir: &Path,
        name: &str,
        yaml: &str,
        default_dir: Option<&Path>,
    ) -> Self {
        Self::spawn(dir, name, yaml, default_dir, None, &[])
    }

    fn spawn(
        dir: &Path,
        name: &str,
        yaml: &str,
        default_dir: Option<&Path>,
        log: Option<&str>,
        args: &[&str],
    ) -> Self {
        let cfg = dir.join(format!("{name}.yaml"));
        std::fs::write(&cfg, yaml).unwrap();
        let mut ctl = dir.join(format!("{name}.sock"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
        cmd.args(["lnet", "run", "--exit-on-eof"])
            .args(args)
            .arg("--config")
            .arg(&cfg);
        if let Some(f) = log {
            cmd.env("RUST_LOG", f);
        }
        match default_dir {
            Some(d) => {
                cmd.env("COLIBRI_LNET_CTL_DIR", d);
            }
            None => {
                cmd.arg("--ctl").arg(&ctl);
            }
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn colibri lnet run");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = sync_channel(1024);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err = child.stderr.take().unwrap();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let e2 = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = e2.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut n = Self {
            name: name.to_owned(),
            child,
            lines,
            ctl: ctl.clone(),
            stderr,
        };
        let ready = n.expect("READY", START_LIMIT);
        if default_dir.is_some() {
            ctl = ready
                .split(' ')
                .find_map(|w| w.strip_prefix("ctl="))
                .map(PathBuf::from)
                .expect("ctl= in READY");
            n.ctl = ctl;
        }
        n
    }

    pub(crate) fn expect(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(_) => panic!(
                    "{}: no {prefix:?} line in time (status {:?}); stderr:\n{}",
                    self.name,
                    self.child.try_wait(),
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// `colibri lnet --ctl <its socket> args…`: must succeed.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let o = lnet(Some(&self.ctl), args);
        assert!(
            o.code == Some(0),
            "{}: {args:?} failed ({:?}): {}{}",
            self.name,
            o.code,
            o.stdout,
            o.stderr
        );
        o.stdout
    }

    /// `colibri lnet --ctl <its socket> args…`: must fail with one
    /// `descr` line holding `want` ([`assert_fails`]).
    pub(crate) fn fails(&self, args: &[&str], want: &str) {
        assert_fails(&lnet(Some(&self.ctl), args), want);
    }

    /// As [`Node::fails`], with Lustre's errno (positive) too.
    pub(crate) fn fails_errno(&self, args: &[&str], errno: i32, want: &str) {
        let o = lnet(Some(&self.ctl), args);
        assert_fails(&o, want);
        assert!(
            o.stderr.contains(&format!("errno: -{errno}\n")),
            "{args:?}: want errno -{errno}: {}",
            o.stderr
        );
    }

    /// `colibri lnet --ctl <its socket> --json args…` parsed.
    pub(crate) fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.ok(&a);
        let last = out.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// How much it has written to its log (stderr) so far: a mark for
    /// [`Node::log_since`].
    pub(crate) fn log_mark(&self) -> usize {
        self.stderr.lock().unwrap().len()
    }

    /// The log lines written after `mark` (from [`Node::log_mark`]) that
    /// contain every one of `words`.
    pub(crate) fn log_since(&self, mark: usize, words: &[&str]) -> Vec<String> {
        let log = self.stderr.lock().unwrap();
        log.get(mark..)
            .unwrap_or("")
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_owned)
            .collect()
    }

    /// Kills it with SIGKILL (no goodbye to its peers) and reaps it.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `stats show --json`'s counter `key`.
    pub(crate) fn stat(&self, key: &str) -> u64 {
        num(&self.json(&["stats", "show"]), &["statistics", key])
    }

    /// Stops it with SIGTERM: it must print its statistics and exit 0.
    pub(crate) fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(st.success());
        let line = self.expect("STOPPED", START_LIMIT);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "{}: exit {s:?}", self.name);
                break;
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!self.ctl.exists(), "control socket removed at exit");
        line
    }
}

pub(crate) struct Out {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `colibri lnet [--ctl PATH] args…`, killed past [`CMD_LIMIT`].
pub(crate) fn lnet(ctl: Option<&Path>, args: &[&str]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
    cmd.arg("lnet");
    if let Some(p) = ctl {
        cmd.arg("--ctl").arg(p);
    }
    run_bounded(cmd.args(args))
}

/// `colibri lnet [--ctl PATH] args…` with `input` on its standard input.
pub(crate) fn lnet_stdin(ctl: Option<&Path>, args: &[&str], input: &str) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
    cmd.arg("lnet");
    if let Some(p) = ctl {
        cmd.arg("--ctl").arg(p);
    }
    run_bounded_with(cmd.args(args), Some(input))
}

pub(crate) fn run_bounded(cmd: &mut Command) -> Out {
    run_bounded_with(cmd, None)
}

/// Runs `cmd`, killed past [`CMD_LIMIT`], with `input` written to its
/// standard input (nothing, closed, without).
pub(crate) fn run_bounded_with(cmd: &mut Command, input: Option<&str>) -> Out {
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn colibri");
    if let (Some(text), Some(mut w)) = (input, child.stdin.take()) {
        let text = text.to_owned();
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut w, text.as_bytes());
        });
    }
    let (mut o, mut e) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = o.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CMD_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command {cmd:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        code: status.code(),
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

/// A port free on every one of `ips` (every node of a fabric listens on
/// the same `accept_port`, Lustre's model).
pub(crate) fn common_free_port(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind(SocketAddrV4::new(ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..]
            .iter()
            .all(|ip| TcpListener::bind(SocketAddrV4::new(*ip, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no common free port");
}

/// The IPv4 address of a `tcp` NID (`127.0.85.1@tcp1` → 127.0.85.1).
pub(crate) fn ip_of(nid: &str) -> Ipv4Addr {
    nid.split('@')
        .next()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("{nid} is not an IPv4 NID"))
}

pub(crate) fn global(port: u16) -> String {
    format!("global:\n    accept_port: {port}\n    accept: all\n    transaction_timeout: 10\n")
}

pub(crate) fn ni(net: &str, nid: &str) -> String {
    format!("    - net type: {net}\n      local NI(s):\n        - nid: {nid}\n")
}

/// One clear failure: non-zero exit, an lnetctl error block on stderr with
/// one `descr` line containing `want`, no panic.
pub(crate) fn assert_fails(o: &Out, want: &str) {
    assert_ne!(o.code, Some(0), "should fail: {}", o.stdout);
    assert!(o.code.is_some(), "killed by a signal: {}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    assert!(o.stderr.contains("errno: -"), "{}", o.stderr);
    let descr: Vec<&str> = o.stderr.lines().filter(|l| l.contains("descr:")).collect();
    assert_eq!(descr.len(), 1, "{}", o.stderr);
    assert!(descr[0].contains(want), "want {want:?} in {}", o.stderr);
}

pub(crate) fn num(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} not a number in {v}"))
}

/// The local NI `nid` of `net show --verbose --json`.
pub(crate) fn local_ni<'a>(v: &'a serde_json::Value, nid: &str) -> &'a serde_json::Value {
    v["net"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["local NI(s)"].as_array().unwrap().iter())
        .find(|n| n["nid"] == nid)
        .unwrap_or_else(|| panic!("no local NI {nid} in {v}"))
}

/// The peer NI entry `nid` of `peer show --verbose --json`.
pub(crate) fn peer_ni<'a>(v: &'a serde_json::Value, nid: &str) -> &'a serde_json::Value {
    v["peer"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["peer ni"].as_array().unwrap().iter())
        .find(|n| n["nid"] == nid)
        .unwrap_or_else(|| panic!("no peer NI {nid} in {v}"))
}

/// Polls `f` until it gives `Some`, for at most `limit`; panics with
/// `what` and the last value seen otherwise. Every call of `f` is itself
/// bounded (commands have [`CMD_LIMIT`]).
pub(crate) fn wait_for<T, D: std::fmt::Debug>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<T, D>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: not in {limit:?}; last: {last:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// A `colibri lnet --ctl PATH args…` running on its own thread (a
/// selftest stream while the test does something else); bounded by
/// [`CMD_LIMIT`] like every command.
pub(crate) struct Bg(Option<std::thread::JoinHandle<Out>>);

impl Bg {
    pub(crate) fn start(ctl: &Path, args: &[&str]) -> Self {
        let ctl = ctl.to_owned();
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        Self(Some(std::thread::spawn(move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            lnet(Some(&ctl), &a)
        })))
    }

    pub(crate) fn finished(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(std::thread::JoinHandle::is_finished)
    }

    pub(crate) fn join(mut self) -> Out {
        self.0.take().unwrap().join().expect("command thread")
    }
}

/// A child process killed and reaped when dropped.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `colibri serve --xprt lnet --lnet-config CONFIG --listen LISTEN`, started
/// (its "serving ping" line seen); it stops by itself after five minutes
/// and is killed when the guard drops.
pub(crate) fn lnet_serve(config: &Path, listen: &str) -> Guard {
    let mut child = Command::new(env!("CARGO_BIN_EXE_colibri"))
        .args(["serve", "--xprt", "lnet", "--duration", "300"])
        .arg("--lnet-config")
        .arg(config)
        .args(["--listen", listen])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn colibri serve");
    let err = child.stderr.take().unwrap();
    let server = Guard(child);
    let (tx, lines) = sync_channel(256);
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    loop {
        match lines.recv_timeout(START_LIMIT) {
            Ok(l) if l.starts_with("serving ping") => return server,
            Ok(l) => {
                seen.push_str(&l);
                seen.push('\n');
            }
            Err(e) => panic!("the server did not start ({e}): {seen}"),
        }
    }
}

/// Not every test binary that includes this module makes veth pairs.
#[allow(unused_imports)]
pub(crate) use colibri_lnet_rt::testing::Veth;
