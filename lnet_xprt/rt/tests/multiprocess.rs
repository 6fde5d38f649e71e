//! Three `colibri-lnet-node` processes: a client on `tcp`, a router on
//! `tcp` and `tcp1`, a server on `tcp1`. The client PUTs 1 MiB to the
//! server through the router; the server reports the checksum of what it
//! received. Children are killed on every path (a kill-on-drop guard, and
//! their standard input closes with the test).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

const LIMIT: Duration = Duration::from_secs(60);

/// A child process killed when dropped.
struct Node {
    name: &'static str,
    child: Child,
    lines: Receiver<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn spawn(name: &'static str, args: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_colibri-lnet-node"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn colibri-lnet-node");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = crossbeam_channel::bounded(64);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { name, child, lines }
    }

    /// The first line starting with `prefix`, within the deadline.
    fn expect(&mut self, prefix: &str, deadline: Instant) -> String {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(l) => eprintln!("{}: {l}", self.name),
                Err(_) => {
                    let status = self.child.try_wait();
                    panic!(
                        "{}: no {prefix:?} line in time (status {status:?})",
                        self.name
                    )
                }
            }
        }
    }
}

/// A port free on every one of `ips`.
fn common_free_port(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind(SocketAddrV4::new(ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        let others: Vec<_> = ips[1..]
            .iter()
            .map(|ip| TcpListener::bind(SocketAddrV4::new(*ip, port)))
            .collect();
        if others.iter().all(Result::is_ok) {
            return port;
        }
    }
    panic!("no common free port");
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn routed_put_of_1mib_across_three_processes() {
    let deadline = Instant::now() + LIMIT;
    let ips = [
        Ipv4Addr::new(127, 0, 3, 2),
        Ipv4Addr::new(127, 0, 3, 3),
        Ipv4Addr::new(127, 0, 4, 3),
        Ipv4Addr::new(127, 0, 4, 4),
    ];
    let port = common_free_port(&ips);
    let mut server = Node::spawn(
        "server",
        &args(&format!(
            "--nid 127.0.4.4@tcp1 --accept-port {port} --accept all --route tcp:127.0.4.3@tcp1 \
             --sink 12:0x77:1048576"
        )),
    );
    let ready = server.expect("READY", deadline);
    assert!(ready.contains(&format!("127.0.4.4:{port}")), "{ready}");
    let mut router = Node::spawn(
        "router",
        &args(&format!(
            "--nid 127.0.3.3@tcp --nid 127.0.4.3@tcp1 --accept-port {port} --accept all --routing"
        )),
    );
    router.expect("READY", deadline);
    let mut client = Node::spawn(
        "client",
        &args(&format!(
            "--nid 127.0.3.2@tcp --accept-port {port} --accept all --route tcp1:127.0.3.3@tcp \
             --put 127.0.4.4@tcp1:12:0x77:1048576 --seed 5 --timeout 40"
        )),
    );
    client.expect("READY", deadline);
    let put = client.expect("PUT", deadline);
    assert!(put.starts_with("PUT ok"), "{put}");
    let sent_crc = field(&put, "crc").to_owned();
    let got = server.expect("RECEIVED", deadline);
    assert_eq!(field(&got, "mlength"), "1048576", "{got}");
    assert_eq!(field(&got, "status"), "ok", "{got}");
    assert_eq!(field(&got, "from"), "127.0.3.2@tcp", "{got}");
    assert_eq!(field(&got, "crc"), sent_crc, "{got}");
    let status = client.child.wait().unwrap();
    assert!(status.success());
    drop((client, router, server));
}
