//! Multi-Rail between processes: the server is `colibri serve --xprt lnet
//! --lnet-config` (a process whose LNet node has two NIs, `tcp` and
//! `tcp1`, serving ping over a transfer machine); the client is an LNet
//! node of this process with two NIs too, and an RPC machine (a transfer
//! machine) pinging the server with 16,000-byte messages. In the middle of the
//! stream a drop rule on the client's node fails every send to the
//! server's `tcp1` NI (REMOTE_DROPPED, as a refused connection): LNet's
//! health and resend move the traffic to the `tcp` rail, and no ping
//! fails; then bulk pings of 1 MiB under the same rule (the server process
//! pulls the client's source and pushes the bytes back: the client's
//! node PUTs and GETs through the rule) all come back intact. Loopback
//! addresses only, a free common port, the server killed whatever
//! happens and bounded by `--duration`.

mod common;

use std::time::Duration;

use colibri_examples::ping;
use colibri_lnet_rt::colibri_lnet::fault::{DropRuleSpec, FaultMatch, HealthError, Trigger};
use colibri_lnet_rt::colibri_lnet::ids::Nid;
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_rpc::{RpcConfig, RpcMachine};
use common::{common_free_port, global, lnet_serve, ni};

fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

/// Every local NI's send count.
fn sends(l: &Lnet, n: Nid) -> u64 {
    l.with_node(|node| node.ni_info(n).map_or(0, |i| i.send_count))
}

#[test]
fn a_failing_rail_moves_messages_to_the_other_between_processes() {
    let (c0, c1) = ("127.0.91.2@tcp", "127.0.92.2@tcp1");
    let (s0, s1) = ("127.0.91.4@tcp", "127.0.92.4@tcp1");
    let ips: Vec<std::net::Ipv4Addr> = ["127.0.91.2", "127.0.92.2", "127.0.91.4", "127.0.92.4"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let port = common_free_port(&ips);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("server.yaml");
    std::fs::write(
        &cfg,
        format!("net:\n{}{}{}", ni("tcp", s0), ni("tcp1", s1), global(port)),
    )
    .unwrap();
    let server_addr = format!("{s0}:12345:30:5");
    let server = lnet_serve(&cfg, &server_addr);

    // This process's node: two NIs, the server known as one Multi-Rail
    // peer with both of its NIs.
    let mut lc = LnetConfig::new(&[nid(c0), nid(c1)]);
    lc.accept_port = port;
    lc.accept = AcceptPolicy::All;
    lc.node.transaction_timeout = Duration::from_secs(10);
    lc.node.retry_count = 3;
    lc.tick = Duration::from_millis(200);
    let client = Lnet::start(lc).unwrap();
    client.add_peer(nid(s0), &[nid(s1)], true).unwrap();
    let xprt = LnetTransport::new(vec![client.clone()], LnetXprtConfig::default()).unwrap();
    let m = RpcMachine::start_on(&xprt, &format!("{c0}:12345:30:*"), RpcConfig::default()).unwrap();
    let session = m.session(&server_addr).unwrap();
    // In batches of ten, each checked: a failing stream ends the test
    // within ten call timeouts.
    let stream = |n: u64| {
        for _ in 0..n / 10 {
            let mut failed = Vec::new();
            let rep = ping::ping(
                &session,
                10,
                16_000,
                Duration::ZERO,
                Duration::from_secs(10),
                |r| {
                    if let Some(e) = &r.error {
                        failed.push(format!("ping {}: {e}", r.seq));
                    }
                },
            )
            .unwrap();
            assert!(failed.is_empty(), "{failed:?}");
            assert_eq!(rep.received, 10);
        }
    };

    stream(40);
    let (t0, t1) = (sends(&client, nid(c0)), sends(&client, nid(c1)));
    assert!(t1 > 0, "the tcp1 rail carried nothing before the rule");
    let resends = client.stats().resend_count;
    let rule = client
        .add_drop_rule(DropRuleSpec {
            matcher: FaultMatch::between(Nid::ANY, nid(s1)),
            trigger: Trigger::Rate(1),
            health_mask: HealthError::RemoteDropped.bit(),
        })
        .unwrap();
    stream(80);
    // Bulk through the rule: 1 MiB each way per ping, checked byte for
    // byte; none may fail.
    let before_bulk = client.fault_stats(rule).unwrap().fired;
    let mut failed = Vec::new();
    let rep = ping::bulk_ping(
        &m,
        &session,
        8,
        1 << 20,
        Duration::ZERO,
        Duration::from_secs(20),
        |r| {
            if let Some(e) = &r.error {
                failed.push(format!("bulk ping {}: {e}", r.seq));
            }
        },
    )
    .unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(rep.received, 8);
    let fired = client.fault_stats(rule).unwrap().fired;
    eprintln!(
        "the rule fired {} times during the bulk pings",
        fired - before_bulk
    );
    let (d0, d1) = (sends(&client, nid(c0)) - t0, sends(&client, nid(c1)) - t1);
    eprintln!(
        "drop rule fired {fired} times; resends {resends} -> {}; sends during the rule: tcp {d0}, tcp1 {d1}",
        client.stats().resend_count
    );
    assert!(
        fired > 0,
        "the rule never fired: traffic stayed on one rail"
    );
    assert!(client.stats().resend_count > resends);
    // Every request (80 at least) went out on the tcp rail: the only one
    // that reaches the server now.
    assert!(d0 >= 80, "tcp rail sends during the rule: {d0}");

    drop(session);
    m.shutdown().unwrap();
    drop(xprt);
    client.shutdown();
    drop(server);
}
