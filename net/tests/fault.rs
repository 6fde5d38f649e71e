//! The fault-injecting wrapper (`colibri_net::fault`) on the in-memory
//! transport: rules by interval, killed and revived peers, delayed
//! operations that `del` and `stop` still reach.

use std::sync::Arc;
use std::time::Duration;

use colibri_bulk_mem::MemTransport;
use colibri_net::fault::{FaultAction, FaultPlan, FaultRule, FaultTransport, Pick};
use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, EventReceiver, NetError, QueueType, RecvParams,
    TmState, TransferMachine, event_channel, ignore_tm_events,
};

const WAIT: Duration = Duration::from_secs(10);

struct Two {
    ft: FaultTransport,
    doms: Vec<Domain>,
    tms: Vec<TransferMachine>,
    events: EventReceiver,
    cbs: Arc<BufferCallbacks>,
    /// Events of another queue met while waiting for one (a receive can
    /// be reported before its send).
    stash: std::sync::Mutex<Vec<BufferEvent>>,
}

fn two(plan: FaultPlan) -> Two {
    let ft = FaultTransport::new(Arc::new(MemTransport::default()), plan);
    let (cbs, events) = event_channel(64);
    let mut doms = Vec::new();
    let mut tms = Vec::new();
    for i in 0..2 {
        let d = Domain::new(&ft).unwrap();
        let tm = d.tm_init(ignore_tm_events()).unwrap();
        tm.start(&format!("127.0.0.1:0:{}", 9100 + i)).unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        doms.push(d);
        tms.push(tm);
    }
    Two {
        ft,
        doms,
        tms,
        events,
        cbs,
        stash: std::sync::Mutex::default(),
    }
}

impl Two {
    fn send(&self, data: &[u8]) -> BufferEvent {
        let to = self.tms[1].ep().unwrap().addr().to_string();
        let ep = self.tms[0].ep_create(&to).unwrap();
        let mut b = self.doms[0]
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(self.cbs.clone());
        b.bufvec_mut().copy_in(0, data).unwrap();
        self.tms[0].add_msg_send(b, &ep, data.len()).unwrap();
        self.next(QueueType::MsgSend)
    }

    fn next(&self, q: QueueType) -> BufferEvent {
        {
            let mut st = self.stash.lock().unwrap();
            if let Some(i) = st.iter().position(|e| e.queue() == q) {
                return st.remove(i);
            }
        }
        loop {
            let ev = self.events.recv_timeout(WAIT).unwrap();
            if ev.queue() == q {
                return ev;
            }
            let mut st = self.stash.lock().unwrap();
            assert!(st.len() < 8, "unexpected {ev:?}");
            st.push(ev);
        }
    }

    fn finish(self) {
        for tm in &self.tms {
            let _ = tm.stop(true);
            tm.wait_stopped(WAIT).unwrap();
        }
        while let Ok(ev) = self.events.recv_timeout(Duration::from_millis(20)) {
            assert!(ev.is_final());
        }
    }
}

#[test]
fn every_nth_fails_and_killed_peers_are_unreachable() {
    let t = two(FaultPlan::new(1).rule(FaultRule::new(
        FaultAction::Fail(NetError::ConnectionReset("x".into())),
        Pick::Every(2),
    )));
    let rb = t.doms[1]
        .register(BufVec::new(1, 4096))
        .unwrap()
        .with_callbacks(t.cbs.clone());
    t.tms[1]
        .add_msg_recv(rb, RecvParams::multi(64, 16))
        .unwrap();
    for i in 0..4u8 {
        let s = t.send(&[i; 8]);
        if i % 2 == 1 {
            assert!(
                matches!(s.status(), Err(NetError::ConnectionReset(_))),
                "{s:?}"
            );
        } else {
            assert!(s.is_ok(), "{s:?}");
            let r = t.next(QueueType::MsgRecv);
            assert_eq!(r.message().unwrap(), [i; 8]);
        }
    }
    let dest = t.tms[1].ep().unwrap().addr().to_string();
    t.ft.kill(&dest);
    let s = t.send(b"dead");
    assert!(matches!(s.status(), Err(NetError::Unreachable(_))), "{s:?}");
    t.ft.revive(&dest);
    // The rule's fifth operation: it passes.
    assert!(t.send(b"alive").is_ok());
    assert_eq!(t.next(QueueType::MsgRecv).message().unwrap(), b"alive");
    let st = t.ft.stats();
    assert_eq!((st.failed, st.lost), (3, 0), "{st:?}");
    t.finish();
}

#[test]
fn a_delayed_send_is_cancelled_by_del_and_by_stop() {
    let t = two(FaultPlan::new(2).rule(FaultRule::new(
        FaultAction::Delay {
            min: Duration::from_secs(30),
            max: Duration::from_secs(30),
        },
        Pick::Rate(1.0),
    )));
    let to = t.tms[1].ep().unwrap().addr().to_string();
    let ep = t.tms[0].ep_create(&to).unwrap();
    let b = t.doms[0]
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(t.cbs.clone());
    let tok = t.tms[0].add_msg_send(b, &ep, 8).unwrap();
    assert!(t.events.recv_timeout(Duration::from_millis(50)).is_err());
    assert!(t.tms[0].del(tok).unwrap());
    let ev = t.next(QueueType::MsgSend);
    assert!(matches!(ev.status(), Err(NetError::Cancelled)), "{ev:?}");
    let b = t.doms[0]
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(t.cbs.clone());
    t.tms[0].add_msg_send(b, &ep, 8).unwrap();
    drop(ep);
    assert_eq!(t.ft.stats().delayed, 2);
    // The stop cancels the one still held.
    t.tms[0].stop(true).unwrap();
    let ev = t.next(QueueType::MsgSend);
    assert!(matches!(ev.status(), Err(NetError::Cancelled)), "{ev:?}");
    t.finish();
}
