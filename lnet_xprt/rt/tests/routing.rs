//! A router in one process with its two end nodes: PUT+ACK and GET+REPLY
//! of 1 MiB across it, the router moving each forwarded byte once in and
//! once out of its own buffers (kernel pipes, or memory), which all go
//! back.

mod common;

use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::ids::{Net, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{EventKind, MdOptions};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion, RuntimeStats};
use common::*;

const MIB: usize = 1 << 20;

fn node(nids: &[&str], routing: bool, tweak: &dyn Fn(&mut LnetConfig)) -> Lnet {
    init_tracing();
    let nids: Vec<_> = nids.iter().map(|s| nid(s)).collect();
    let mut cfg = LnetConfig::new(&nids);
    cfg.accept_port = 0;
    // Any source port (tests pass without privilege; see tcp.rs).
    cfg.accept = AcceptPolicy::All;
    cfg.node.routing = routing;
    cfg.tick = Duration::from_millis(200);
    tweak(&mut cfg);
    Lnet::start(cfg).unwrap()
}

/// A PUT and a GET of 1 MiB each through a router configured by
/// `tweak`, on the `x`th pair of nets (tests run side by side); the
/// router's counters once its buffers are all back.
fn put_and_get_through(x: u8, tweak: &dyn Fn(&mut LnetConfig)) -> RuntimeStats {
    let (a, b) = (4 + 2 * x, 5 + 2 * x);
    let (cs, r0s, r1s, ss) = (
        format!("127.0.{a}.2@tcp"),
        format!("127.0.{a}.3@tcp"),
        format!("127.0.{b}.3@tcp1"),
        format!("127.0.{b}.4@tcp1"),
    );
    let (c_nid, r0, r1, s_nid) = (nid(&cs), nid(&r0s), nid(&r1s), nid(&ss));
    let client = node(&[&cs], false, &|_| {});
    let router = node(&[&r0s, &r1s], true, tweak);
    let server = node(&[&ss], false, &|_| {});
    client.set_peer_addr(r0, router.listen_addr(r0).unwrap());
    router.set_peer_addr(c_nid, client.listen_addr(c_nid).unwrap());
    router.set_peer_addr(s_nid, server.listen_addr(s_nid).unwrap());
    server.set_peer_addr(r1, router.listen_addr(r1).unwrap());
    let tcp1: Net = "tcp1".parse().unwrap();
    let tcp: Net = "tcp".parse().unwrap();
    client.add_route(tcp1, r0, Some(1), 0).unwrap();
    server.add_route(tcp, r1, Some(1), 0).unwrap();

    // PUT with ACK.
    let inbox = MemRegion::zeroed(MIB);
    let target = post(&server, &inbox, 20, 9, MdOptions::OP_PUT);
    let data = pattern(MIB, 11);
    let src = MemRegion::from_vec(data.clone());
    let md = bind(&client, &src);
    client
        .put(md, true, ProcessId::lustre(s_nid), 20, 9, 0, 0)
        .unwrap();
    let evs = until_final(&client, md);
    assert!(kinds(&evs, md).contains(&EventKind::Ack), "{evs:#?}");
    assert!(
        evs.iter()
            .filter(|e| e.md == md)
            .all(|e| e.status().is_ok())
    );
    let sev = events_until(&server, |e| e.iter().any(|e| e.md == target));
    let put = sev.iter().find(|e| e.md == target).unwrap();
    assert_eq!(put.info.initiator.nid, c_nid);
    assert!(inbox.to_vec() == data);

    // GET with REPLY.
    let served = pattern(MIB, 12);
    post(
        &server,
        &MemRegion::from_vec(served.clone()),
        21,
        1,
        MdOptions::OP_GET,
    );
    let sink = MemRegion::zeroed(MIB);
    let md = bind(&client, &sink);
    client.get(md, ProcessId::lustre(s_nid), 21, 1, 0).unwrap();
    let evs = until_final(&client, md);
    assert!(kinds(&evs, md).contains(&EventKind::Reply), "{evs:#?}");
    assert!(sink.to_vec() == served);

    // The router forwarded both payloads: every byte read into its buffers
    // went out again, nothing else was copied, and its buffers came back.
    // (The router counts a write when it ends, which may be after the end
    // node saw the message: wait for the counters to settle.)
    let t0 = Instant::now();
    let rs = loop {
        let rs = router.runtime_stats();
        if rs.socket_read_bytes - rs.inline_read_bytes
            == rs.socket_write_bytes - rs.inline_write_bytes
        {
            break rs;
        }
        assert!(t0.elapsed() < LIMIT, "router bytes in != out: {rs:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        rs.socket_read_bytes - rs.inline_read_bytes >= 2 * MIB as u64,
        "{rs:?}"
    );
    assert_eq!(rs.user_copy_bytes + rs.loopback_copy_bytes, 0);
    assert!(router.stats().route_count >= 4, "{:?}", router.stats());
    let t0 = Instant::now();
    while router.router_buffers_in_use() != 0 {
        assert!(t0.elapsed() < LIMIT, "router buffers not released");
        std::thread::sleep(Duration::from_millis(10));
    }
    for end in [&client, &server] {
        assert_eq!(end.runtime_stats().user_copy_bytes, 0);
    }
    client.shutdown();
    router.shutdown();
    server.shutdown();
    rs
}

#[test]
fn put_and_get_through_a_router() {
    // By default through memory: nothing spliced.
    let rs = put_and_get_through(0, &|_| {});
    assert_eq!(rs.splice_read_bytes + rs.splice_write_bytes, 0, "{rs:?}");
}

#[test]
fn a_router_with_pipes_splices_large_payloads() {
    // Both payloads are spliced into pipes and out of them (a payload
    // whose pages come in more pieces than a pipe has slots goes on in
    // memory: counted as a spill).
    let rs = put_and_get_through(1, &|cfg| cfg.splice_pipes = 32);
    assert!(rs.splice_spills <= 2, "{rs:?}");
    assert_eq!(
        rs.splice_write_bytes,
        (2 - rs.splice_spills) * MIB as u64,
        "{rs:?}"
    );
}

#[test]
fn a_router_that_checksums_forwards_through_memory() {
    // A checksum needs the payload's bytes: nothing is spliced, and what
    // the router sends carries a checksum the server checks.
    let rs = put_and_get_through(2, &|cfg| {
        cfg.splice_pipes = 32;
        cfg.tcp.enable_csum = true;
    });
    assert_eq!(rs.splice_read_bytes + rs.splice_write_bytes, 0, "{rs:?}");
}

#[test]
fn payloads_too_large_for_their_pipes_spill_to_memory_half_way() {
    // Pipes of 64 KiB: each 1 MiB payload fills one, moves to memory and
    // is read on there (one per connection: the PUT's and the REPLY's).
    let rs = put_and_get_through(3, &|cfg| {
        cfg.splice_pipes = 32;
        cfg.splice_pipe_bytes = 64 << 10;
    });
    assert_eq!(rs.splice_spills, 2, "{rs:?}");
    assert!(rs.splice_read_bytes >= 2 * (64 << 10), "{rs:?}");
    assert_eq!(rs.splice_write_bytes, 0, "{rs:?}");
}
