//! A passive buffer claimed for one requester answers that requester's
//! GET only: a third process that learnt the buffer's match bits (they
//! are in the descriptor) and GETs while the requester's own GET is on
//! its way gets nothing, and the requester still gets the data.

use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::fault::{DelayRuleSpec, FaultMatch, MsgMask, Trigger};
use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{
    EventKind, MdOptions, MdSpec, MemRef, Threshold, Unlink,
};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::colibri_lnet::wire::MsgType;
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::desc::NetBufDesc;
use colibri_net::{BufVec, Domain, QueueType, TmState, event_channel, ignore_tm_events};

const WAIT: Duration = Duration::from_secs(20);
const LEN: usize = 4096;

fn node(nid: &str) -> Lnet {
    let mut cfg = LnetConfig::new(&[nid.parse().unwrap()]);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    cfg.node.transaction_timeout = Duration::from_secs(3);
    cfg.node.retry_count = 1;
    Lnet::start(cfg).unwrap()
}

#[test]
fn a_claimed_passive_buffer_answers_its_requester_only() {
    let (a, s, c) = (
        node("127.0.79.1@tcp"),
        node("127.0.79.2@tcp"),
        node("127.0.79.3@tcp"),
    );
    Lnet::introduce(&[a.clone(), s.clone(), c.clone()]);
    let x = LnetTransport::new(vec![a.clone(), s.clone()], LnetXprtConfig::default()).unwrap();
    let dom = Domain::new(&x).unwrap();
    let (cbs, events) = event_channel(16);
    let start = |addr: &str| {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start(addr).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        tm
    };
    let server = start("127.0.79.2@tcp:12345:30:*");
    let client = start("127.0.79.1@tcp:12345:30:*");
    // The requester's GETs reach the server a second late.
    s.add_delay_rule(DelayRuleSpec {
        matcher: FaultMatch {
            src: a.nids()[0],
            msg_mask: MsgMask::of(MsgType::Get),
            portal_mask: 1 << 30,
            ..FaultMatch::ANY
        },
        trigger: Trigger::Rate(1),
        latency: Duration::from_secs(1),
    })
    .unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    let mut b = dom
        .register(BufVec::new(1, LEN))
        .unwrap()
        .with_callbacks(cbs.clone());
    b.bufvec_mut().copy_in(0, &data).unwrap();
    let (_, desc) = server.add_passive_send(b, LEN, None).unwrap();
    // The passive buffer's match bits, from the descriptor's LNet bytes
    // (offset 24 of the transport's 40: lnet_xprt/xprt/DESIGN.md).
    let fields = NetBufDesc::from_bytes(desc.as_bytes().to_vec())
        .decode()
        .unwrap();
    let bits = u64::from_le_bytes(fields.extra[24..32].try_into().unwrap());
    client
        .add_active_recv(
            dom.register(BufVec::new(1, LEN))
                .unwrap()
                .with_callbacks(cbs),
            &desc,
        )
        .unwrap();
    // The request was accepted and the requester's GET is held: a third
    // process GETs with the same bits meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    let c_events = c.event_queue().unwrap();
    let key = c.register(&MemRegion::zeroed(LEN));
    let md = c
        .md_bind(
            MdSpec::new(MemRef::new(key, 0, LEN as u32), MdOptions::empty())
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink),
        )
        .unwrap();
    c.get(md, ProcessId::lustre(s.nids()[0]), 30, bits, 0)
        .unwrap();
    // The requester gets the data, the server's buffer completes once.
    let mut done = Vec::new();
    while done.len() < 2 {
        let ev = events.recv_timeout(WAIT).expect("both buffers complete");
        assert!(ev.is_ok(), "{ev:?}");
        if ev.queue() == QueueType::ActiveBulkRecv {
            assert_eq!(ev.with_data(|d| d.to_vec(0, LEN)).unwrap().unwrap(), data);
        }
        done.push(ev.queue());
    }
    assert!(
        done.contains(&QueueType::PassiveBulkSend) && done.contains(&QueueType::ActiveBulkRecv),
        "{done:?}"
    );
    // The third process got no data: its GET found no ME it may use but
    // the portal's vacancy, whose REPLY has no bytes.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while let Ok(ev) = c_events.recv_deadline(deadline) {
        assert!(
            !(ev.kind() == EventKind::Reply && ev.info.status.is_ok() && ev.info.mlength > 0),
            "a third process got the claimed buffer's data: {ev:?}"
        );
    }
    client.stop(true).unwrap();
    server.stop(true).unwrap();
    client.wait_stopped(WAIT).unwrap();
    server.wait_stopped(WAIT).unwrap();
    client.fini().map_err(|e| e.error).unwrap();
    server.fini().map_err(|e| e.error).unwrap();
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
    for n in [a, s, c] {
        n.shutdown();
    }
}
