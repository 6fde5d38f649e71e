//! Multi-Rail below the transfer machines: client and server nodes with
//! an NI on `tcp` and one on `tcp1` each (one process, loopback
//! addresses). A stream of 1 and 3 MiB active bulk transfers (reads in one
//! test, writes in the other) runs while a drop rule makes every send to
//! the server's `tcp1` NI fail (as a refused connection would): LNet's
//! health and resend move the traffic to the other rail and no buffer
//! fails. A write's data is the REPLY to the server's GET, which LNet
//! does not send on another rail: the client's AGAIN has the server GET
//! it again.

use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::fault::{DropRuleSpec, FaultMatch, HealthError, Trigger};
use colibri_lnet_rt::colibri_lnet::ids::Nid;
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, QueueType, TmState, event_channel, ignore_tm_events};

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

fn nid(s: &str) -> Nid {
    s.parse().unwrap()
}

fn node(nids: [&str; 2]) -> Lnet {
    let mut cfg = LnetConfig::new(&[nid(nids[0]), nid(nids[1])]);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    cfg.node.transaction_timeout = Duration::from_secs(10);
    cfg.node.retry_count = 3;
    cfg.tick = Duration::from_millis(200);
    Lnet::start(cfg).unwrap()
}

#[test]
fn a_failing_rail_moves_bulk_to_the_other_without_a_failed_buffer() {
    failing_rail(false);
}

/// The same with the data going the other way: the client's active sends
/// into the server's passive receive buffers.
#[test]
fn a_failing_rail_moves_bulk_writes_to_the_other_without_a_failed_buffer() {
    failing_rail(true);
}

fn failing_rail(write: bool) {
    let cn = ["127.0.74.1@tcp", "127.0.75.1@tcp1"];
    let sn = ["127.0.74.2@tcp", "127.0.75.2@tcp1"];
    let client = node(cn);
    let server = node(sn);
    for (a, b, bn) in [(&client, &server, sn), (&server, &client, cn)] {
        for n in bn {
            a.set_peer_addr(nid(n), b.listen_addr(nid(n)).unwrap());
        }
    }
    let cfg = LnetXprtConfig::default();
    let cx = LnetTransport::new(vec![client.clone()], cfg.clone()).unwrap();
    let sx = LnetTransport::new(vec![server.clone()], cfg).unwrap();
    let (cd, sd) = (Domain::new(&cx).unwrap(), Domain::new(&sx).unwrap());
    let (ccb, cev) = event_channel(1024);
    let (scb, sev) = event_channel(1024);
    let ctm = cd.tm_init(ignore_tm_events()).unwrap();
    let stm = sd.tm_init(ignore_tm_events()).unwrap();
    ctm.start("127.0.74.1@tcp:12345:30:*").unwrap();
    stm.start("127.0.74.2@tcp:12345:30:*").unwrap();
    ctm.wait_for_state(TmState::Started, WAIT).unwrap();
    stm.wait_for_state(TmState::Started, WAIT).unwrap();

    let data: Vec<u8> = (0..3 * MIB).map(|i| (i * 7 + i / 4096) as u8).collect();
    let transfer = |i: usize| {
        // Every other transfer in three LNet messages (chunks).
        let n = if i % 2 == 1 { 3 * MIB } else { MIB };
        let data = &data[..n];
        let mut src = (if write { &cd } else { &sd })
            .register(BufVec::with_len(n, 200_000))
            .unwrap()
            .with_callbacks(if write { ccb.clone() } else { scb.clone() });
        src.bufvec_mut().copy_in(0, data).unwrap();
        let dst = (if write { &sd } else { &cd })
            .register(BufVec::with_len(n, 300_000))
            .unwrap()
            .with_callbacks(if write { scb.clone() } else { ccb.clone() });
        let (recv, send) = if write {
            let (_, d) = stm.add_passive_recv(dst, None).unwrap();
            ctm.add_active_send(src, &d, n).unwrap();
            (
                sev.recv_timeout(WAIT).unwrap(),
                cev.recv_timeout(WAIT).unwrap(),
            )
        } else {
            let (_, d) = stm.add_passive_send(src, n, None).unwrap();
            ctm.add_active_recv(dst, &d).unwrap();
            let a = cev.recv_timeout(WAIT).unwrap();
            (a, sev.recv_timeout(WAIT).unwrap())
        };
        let want = if write {
            QueueType::PassiveBulkRecv
        } else {
            QueueType::ActiveBulkRecv
        };
        assert_eq!(recv.queue(), want);
        assert!(recv.is_ok(), "transfer {i}: {recv:?}");
        assert!(recv.with_data(|b| b.to_vec(0, n).unwrap() == data).unwrap());
        assert!(send.is_ok(), "transfer {i}: {send:?}");
    };
    for i in 0..4 {
        transfer(i);
    }
    // The client now knows the server as one Multi-Rail peer.
    assert!(client.with_node(|n| {
        n.discovery()
            .peers()
            .peer_of(nid(sn[0]))
            .is_some_and(|p| p.is_multi_rail() && p.contains(nid(sn[1])))
    }));
    let resends = client.stats().resend_count;
    let rule = client
        .add_drop_rule(DropRuleSpec {
            matcher: FaultMatch::between(Nid::ANY, nid(sn[1])),
            trigger: Trigger::Rate(1),
            health_mask: HealthError::RemoteDropped.bit(),
        })
        .unwrap();
    for i in 4..16 {
        transfer(i);
    }
    let fired = client.fault_stats(rule).unwrap().fired;
    eprintln!(
        "drop rule fired {fired} times, resends {} -> {}",
        resends,
        client.stats().resend_count
    );
    assert!(
        fired > 0,
        "the rule never fired: traffic stayed on one rail"
    );
    assert!(client.stats().resend_count > resends);
    if write {
        // Writes deleted on the failing rail, at once or a little later
        // (some while a REPLY fails and its AGAIN is on its way), then
        // their passive buffers: every buffer gets exactly one final
        // event, and none waits for a timeout.
        for i in 0..12usize {
            let n = if i % 2 == 1 { 3 * MIB } else { MIB };
            let src = cd
                .register(BufVec::with_len(n, 400_000 + i))
                .unwrap()
                .with_callbacks(ccb.clone());
            let dst = sd
                .register(BufVec::with_len(n, 500_000 + i))
                .unwrap()
                .with_callbacks(scb.clone());
            let (ptok, d) = stm.add_passive_recv(dst, None).unwrap();
            let atok = ctm.add_active_send(src, &d, n).unwrap();
            std::thread::sleep(Duration::from_micros(20 * i as u64));
            let t0 = std::time::Instant::now();
            let _ = ctm.del(atok);
            let a = cev.recv_timeout(WAIT).unwrap();
            assert!(a.is_final(), "{a:?}");
            let _ = stm.del(ptok);
            let p = sev.recv_timeout(WAIT).unwrap();
            assert!(p.is_final(), "{p:?}");
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            assert!(
                a.is_ok() == p.is_ok(),
                "transfer {i}: one side succeeded alone: {a:?} {p:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(cev.try_recv().is_none(), "a second event");
        assert!(sev.try_recv().is_none(), "a second event");
    }
    drop((ccb, scb));
    for (tm, d) in [(ctm, cd), (stm, sd)] {
        tm.stop(false).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
        d.fini().map_err(|e| e.error).unwrap();
    }
    drop((cx, sx));
    client.shutdown();
    server.shutdown();
}
