//! Only the machine a message or bulk request went to can end it:
//! DELIVERED, NAK, ABORT and GONE name the operation by its sequence
//! number or id, and those are per sender, so the same number from anyone
//! else (here: forged, for every number the operation could have, from
//! another TMID of the same process) is ignored. Likewise a GONE hands a
//! passive claim back only from the requesting machine's own address.

use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, NetError, QueueType, TmState, event_channel, ignore_tm_events};

#[path = "support/raw.rs"]
mod raw;
use raw::{ctl, hdr, raw_put, raw_put_to, request};

const WAIT: Duration = Duration::from_secs(30);

/// Two nodes of this process, each with a started machine at TMID 5
/// (on the first) and 6 (on the second) of `portal`, and one event
/// channel for all buffers.
struct Pair {
    nodes: Vec<Lnet>,
    x: LnetTransport,
    dom: Domain,
    tms: [colibri_net::TransferMachine; 2],
    cbs: std::sync::Arc<colibri_net::BufferCallbacks>,
    ev: colibri_net::EventReceiver,
}

fn pair(nids: [&str; 2], portal: u32, handshake: Duration) -> Pair {
    let nodes: Vec<Lnet> = nids
        .iter()
        .map(|n| {
            let mut cfg = LnetConfig::new(&[n.parse().unwrap()]);
            cfg.accept_port = 0;
            Lnet::start(cfg).unwrap()
        })
        .collect();
    Lnet::introduce(&nodes);
    let mut xc = LnetXprtConfig::default();
    xc.handshake_timeout = handshake;
    // Small operation ids, so that the forged answers below cover every
    // id and sequence number an operation of these tests can have.
    xc.first_op_id = Some(1);
    let x = LnetTransport::new(nodes.clone(), xc).unwrap();
    let dom = Domain::new(&x).unwrap();
    let (cbs, ev) = event_channel(64);
    let tms = [(nids[0], 5), (nids[1], 6)].map(|(nid, tmid)| {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start(&format!("{nid}:12345:{portal}:{tmid}")).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tm
    });
    Pair {
        nodes,
        x,
        dom,
        tms,
        cbs,
        ev,
    }
}

impl Pair {
    /// Stops (what a test did not stop) and finalises everything.
    fn finish(self) {
        for tm in &self.tms {
            if tm.state() != TmState::Stopped {
                tm.stop(false).unwrap();
                tm.wait_stopped(WAIT).unwrap();
            }
        }
        drop(self.ev);
        drop(self.cbs);
        for tm in self.tms {
            tm.fini().map_err(|e| e.error).unwrap();
        }
        self.dom.fini().map_err(|e| e.error).unwrap();
        drop(self.x);
        for n in &self.nodes {
            n.shutdown();
        }
    }
}

#[test]
fn answers_from_another_machine_end_no_send() {
    let f = pair(
        ["127.0.78.1@tcp", "127.0.78.6@tcp"],
        42,
        Duration::from_secs(2),
    );
    let (l, tm) = (&f.nodes[0], &f.tms[0]);
    // A send to TMID 7 of portal 43, where no machine of ours ever was
    // (LNet drops it, nobody answers; on portal 42 the portal's vacancy
    // would NAK it at once): it waits for its answer until the handshake
    // timeout.
    let nobody = tm.ep_create("127.0.78.1@tcp:12345:43:7").unwrap();
    let mut b = f
        .dom
        .register(BufVec::new(1, 16))
        .unwrap()
        .with_callbacks(f.cbs.clone());
    b.bufvec_mut().copy_in(0, b"sixteen bytes..!").unwrap();
    tm.add_msg_send(b, &nobody, 16).unwrap();
    // Every sequence number the send can have, DELIVERED (16 bytes) and
    // NAK, from TMID 7 of portal 42 and from TMID 9 of portal 43 of the
    // same process: not where the send went (the machine is TMID 5).
    let ctl_bits = (5 << 52) | (1 << 50);
    for (portal, tmid) in [(42, 7), (43, 9)] {
        for seq in 1..512u64 {
            let h = hdr(4, portal, tmid, seq);
            raw_put(l, 42, ctl_bits, h, ctl(5, seq, 16u64.to_le_bytes()));
            raw_put(l, 42, ctl_bits, h, ctl(4, seq, [11, 0, 0, 0, 0, 0, 0, 0]));
        }
    }
    let e = f.ev.recv_timeout(WAIT).unwrap();
    assert_eq!(e.queue(), QueueType::MsgSend);
    assert!(
        matches!(e.error(), Some(NetError::TimedOut)),
        "the send ended otherwise than by its timeout: {e:?}"
    );
    drop(e);
    drop(nobody);
    f.finish();
}

#[test]
fn aborts_and_gones_from_another_machine_end_no_bulk_request() {
    use colibri_lnet_rt::colibri_lnet::fault::{DropRuleSpec, FaultMatch, Trigger};
    let f = pair(
        ["127.0.78.2@tcp", "127.0.78.3@tcp"],
        43,
        Duration::from_secs(2),
    );
    let (a, p) = (&f.nodes[0], &f.nodes[1]);
    let [active, passive] = &f.tms;
    let mut pb = f
        .dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(f.cbs.clone());
    pb.bufvec_mut().copy_in(0, &[7; 64]).unwrap();
    let (_, desc) = passive.add_passive_send(pb, 64, None).unwrap();
    // Everything from the active node to the passive one is dropped: the
    // request never arrives, and no verdict comes.
    p.add_drop_rule(DropRuleSpec {
        matcher: FaultMatch::between(a.nids()[0], p.nids()[0]),
        trigger: Trigger::Rate(1),
        health_mask: 0,
    })
    .unwrap();
    let ab = f
        .dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(f.cbs.clone());
    let t0 = std::time::Instant::now();
    active.add_active_recv(ab, &desc).unwrap();
    // ABORT (Cancelled) and GONE for every operation id it can have, from
    // TMID 7 of the active node: not the machine the request went to.
    let ctl_bits = (5 << 52) | (1 << 50);
    for xid in 1..1024u64 {
        let h = hdr(4, 43, 7, xid & 0xff_ffff);
        raw_put(a, 43, ctl_bits, h, ctl(3, xid, [1, 0, 0, 0, 0, 0, 0, 0]));
        raw_put(a, 43, ctl_bits, h, ctl(6, xid, [0; 8]));
    }
    // And requester's ABORTs naming the machine the request went to
    // (process 12345, portal 43, TMID 6; from the active node, since the
    // passive one cannot reach it past the rule, and any NID of a process
    // may answer): about requests of its own, which ids of ours can
    // equal, not about ours.
    for xid in 1..1024u64 {
        let h = hdr(4, 43, 6, xid & 0xff_ffff);
        raw_put(a, 43, ctl_bits, h, ctl(3, xid, [1, 0, 0, 0, 1, 0, 0, 0]));
    }
    let e = f.ev.recv_timeout(WAIT).unwrap();
    assert_eq!(e.queue(), QueueType::ActiveBulkRecv, "{e:?}");
    assert!(
        matches!(e.error(), Some(NetError::Unreachable(_)))
            && t0.elapsed() >= Duration::from_millis(1900),
        "the request ended otherwise than by its handshake timeout: {e:?} after {:?}",
        t0.elapsed()
    );
    drop(e);
    for tm in &f.tms {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
    }
    // The passive buffer, never asked for, ends with the stop.
    let e = f.ev.recv_timeout(WAIT).unwrap();
    assert_eq!(e.queue(), QueueType::PassiveBulkSend, "{e:?}");
    assert!(matches!(e.error(), Some(NetError::Cancelled)), "{e:?}");
    drop(e);
    assert!(f.ev.try_recv().is_none(), "one final event per buffer");
    drop(desc);
    f.finish();
}

#[test]
fn gones_from_another_machine_of_the_requester_leave_its_claim() {
    use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
    const LEN: usize = 4096;
    const XID: u64 = 0x12_3456;
    let f = pair(
        ["127.0.78.4@tcp", "127.0.78.5@tcp"],
        44,
        Duration::from_secs(20),
    );
    // The requester is a node of its own with no machine of ours (a
    // process of another program): nothing there answers the server's GET
    // of its MEs (in a process of ours, the portal's vacancy would).
    let mut cfg = LnetConfig::new(&["127.0.78.3@tcp".parse().unwrap()]);
    cfg.accept_port = 0;
    let a = &Lnet::start(cfg).unwrap();
    let s = &f.nodes[1];
    Lnet::introduce(&[f.nodes[0].clone(), s.clone(), a.clone()]);
    let [client, server] = &f.tms;
    let (dom, cbs, ev) = (&f.dom, &f.cbs, &f.ev);
    let pb = dom
        .register(BufVec::new(1, LEN))
        .unwrap()
        .with_callbacks(cbs.clone());
    let (_, desc) = server.add_passive_recv(pb, None).unwrap();
    let to_server = |hdr: u64, bytes: Vec<u8>| {
        raw_put_to(
            a,
            ProcessId::lustre(s.nids()[0]),
            44,
            (6u64 << 52) | (1 << 50),
            hdr,
            bytes,
        );
    };
    // A request from that node's TMID 9: the server claims its buffer for
    // it and waits (its GET of the requester's MEs goes nowhere).
    let req = request(
        XID,
        QueueType::ActiveBulkSend.code(),
        LEN as u64,
        (9u64 << 52) | (1 << 47) | (1 << 8),
        desc.as_bytes(),
    );
    to_server(hdr(2, 44, 9, XID), req);
    // While it is claimed, the real client's request is refused.
    let send = |data: u8| {
        let mut b = dom
            .register(BufVec::new(1, LEN))
            .unwrap()
            .with_callbacks(cbs.clone());
        b.bufvec_mut().copy_in(0, &[data; LEN]).unwrap();
        client.add_active_send(b, &desc, LEN).unwrap();
    };
    let active_result = || {
        let e = ev.recv_timeout(WAIT).unwrap();
        assert_eq!(e.queue(), QueueType::ActiveBulkSend, "{e:?}");
        e.error().cloned()
    };
    std::thread::sleep(Duration::from_millis(200));
    send(1);
    assert!(matches!(active_result(), Some(NetError::Busy(_))));
    // GONEs for that request id from TMID 7 of that node (another
    // machine of the requester's process, as a stopped one's tomb would
    // send): not about this claim, which stays.
    to_server(hdr(4, 44, 7, XID), ctl(6, XID, [0; 8]));
    // Nor is a requester's ABORT (Cancelled) for it from there.
    to_server(hdr(4, 44, 7, XID), ctl(3, XID, [1, 0, 0, 0, 1, 0, 0, 0]));
    std::thread::sleep(Duration::from_millis(200));
    send(2);
    assert!(
        matches!(active_result(), Some(NetError::Busy(_))),
        "a GONE or ABORT from another machine handed the claim back"
    );
    // The same GONE from the requester's own address (its tomb): the
    // claim goes back, and the client's request gets the buffer.
    to_server(hdr(4, 44, 9, XID), ctl(6, XID, [0; 8]));
    std::thread::sleep(Duration::from_millis(200));
    send(3);
    let mut done = Vec::new();
    while done.len() < 2 {
        let e = ev.recv_timeout(WAIT).expect("both buffers complete");
        assert!(e.is_ok(), "{e:?}");
        if e.queue() == QueueType::PassiveBulkRecv {
            assert_eq!(
                e.with_data(|d| d.to_vec(0, LEN)).unwrap().unwrap(),
                vec![3; LEN]
            );
        }
        done.push(e.queue());
    }
    assert!(
        done.contains(&QueueType::PassiveBulkRecv) && done.contains(&QueueType::ActiveBulkSend),
        "{done:?}"
    );
    drop(desc);
    f.finish();
    a.shutdown();
}

#[test]
fn requests_naming_mes_the_requester_lacks_leave_the_passive_buffer_queued() {
    use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
    const LEN: usize = 4096;
    const XID: u64 = 0x12_3456;
    // A long handshake: a claim left behind would keep the buffer busy
    // for the whole test.
    let f = pair(
        ["127.0.78.6@tcp", "127.0.78.7@tcp"],
        45,
        Duration::from_secs(60),
    );
    let (a, s) = (&f.nodes[0], &f.nodes[1]);
    let [client, server] = &f.tms;
    let (dom, cbs, ev) = (&f.dom, &f.cbs, &f.ev);
    // Requests from the client's own address (TMID 5, a live machine)
    // naming MEs it never attached: the server claims its buffer, and its
    // GET (a write) or PUT (a read) finds nothing there.
    let forge = |active: QueueType, xid: u64, desc: &colibri_net::NetBufDesc| {
        let req = request(
            xid,
            active.code(),
            LEN as u64,
            (5u64 << 52) | (1 << 47) | (0x77 << 8),
            desc.as_bytes(),
        );
        raw_put_to(
            a,
            ProcessId::lustre(s.nids()[0]),
            45,
            (6u64 << 52) | (1 << 50),
            hdr(2, 45, 5, xid),
            req,
        );
    };
    let reg = |data: u8| {
        let mut b = dom
            .register(BufVec::new(1, LEN))
            .unwrap()
            .with_callbacks(cbs.clone());
        b.bufvec_mut().copy_in(0, &[data; LEN]).unwrap();
        b
    };
    // Both final events of a transfer, in either order: the data each
    // receiving buffer got.
    let both = |passive: QueueType, active: QueueType| {
        let mut got = Vec::new();
        for _ in 0..2 {
            let e = ev.recv_timeout(WAIT).expect("both buffers complete");
            assert!(e.is_ok(), "{e:?}");
            assert!(e.queue() == passive || e.queue() == active, "{e:?}");
            got.push((
                e.queue(),
                e.with_data(|d| d.to_vec(0, LEN)).unwrap().unwrap(),
            ));
        }
        got
    };

    // An active write's data: the passive receive buffer is handed back
    // (the GET got no bytes) and takes the client's real write.
    let (_, desc) = server.add_passive_recv(reg(0), None).unwrap();
    forge(QueueType::ActiveBulkSend, XID, &desc);
    std::thread::sleep(Duration::from_millis(300));
    client.add_active_send(reg(3), &desc, LEN).unwrap();
    let got = both(QueueType::PassiveBulkRecv, QueueType::ActiveBulkSend);
    assert!(got.contains(&(QueueType::PassiveBulkRecv, vec![3; LEN])));

    // An active read's data: the client's machine answers the PUT that
    // found no ME with an ABORT, and the passive send buffer goes back.
    let (_, desc) = server.add_passive_send(reg(9), LEN, None).unwrap();
    forge(QueueType::ActiveBulkRecv, XID + 1, &desc);
    std::thread::sleep(Duration::from_millis(300));
    client.add_active_recv(reg(0), &desc).unwrap();
    let got = both(QueueType::PassiveBulkSend, QueueType::ActiveBulkRecv);
    assert!(got.contains(&(QueueType::ActiveBulkRecv, vec![9; LEN])));
    assert!(f.ev.try_recv().is_none(), "one final event per buffer");
    drop(desc);
    f.finish();
}
