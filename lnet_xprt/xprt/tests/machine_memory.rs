//! A transfer machine's state goes when the machine does: machines
//! started, made to end their sends without an answer (stop with abort,
//! buffer timeouts) and finalised, again and again, leave the transport
//! holding no more of them than the tomb at their address. Before the fix,
//! every send completed that way stayed in its machine's table of sends,
//! and since an operation refers to its machine, the two kept each other
//! alive forever (the LNet soak's memory growth, RELIABILITY.md).

use std::time::{Duration, Instant};

use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{BufVec, Domain, QueueType, TmState, event_channel, ignore_tm_events};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn finalised_machines_whose_sends_got_no_answer_are_not_held() {
    let mut cfg = LnetConfig::new(&["127.0.77.1@tcp".parse().unwrap()]);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    cfg.node.transaction_timeout = Duration::from_secs(3);
    cfg.node.retry_count = 0;
    let node = Lnet::start(cfg).unwrap();
    // A peer node that is not there: nothing listens at its port.
    let gone = "127.0.77.2@tcp".parse().unwrap();
    let closed = std::net::TcpListener::bind("127.0.77.2:0").unwrap();
    node.set_peer_addr(gone, closed.local_addr().unwrap());
    drop(closed);
    // Long enough that no send ends by the handshake timeout here.
    let xcfg = LnetXprtConfig::default().handshake_timeout(Duration::from_secs(120));
    let xprt = LnetTransport::new(vec![node], xcfg).unwrap();
    let dom = Domain::new(&xprt).unwrap();
    let (cbs, events) = event_channel(256);
    const EPOCHS: usize = 6;
    const SENDS: usize = 8;
    for epoch in 0..EPOCHS {
        let tm = dom.tm_init(ignore_tm_events()).unwrap();
        tm.start("127.0.77.1@tcp:12345:31:9").unwrap();
        tm.wait_for_state(TmState::Started, WAIT).unwrap();
        // Nothing listens on portal 32, where no machine of ours ever was
        // (on portal 31 the portal's vacancy would NAK them at once): LNet
        // drops the PUTs, no answer comes.
        let nobody = tm.ep_create("127.0.77.1@tcp:12345:32:7").unwrap();
        for i in 0..SENDS {
            let mut b = dom
                .register(BufVec::new(1, 64))
                .unwrap()
                .with_callbacks(cbs.clone());
            b.bufvec_mut().copy_in(0, b"anyone?").unwrap();
            if i % 2 == 1 {
                // Ends by its own timeout (a deletion while in LNet).
                b.set_timeout(Some(Instant::now() + Duration::from_millis(30)));
            }
            tm.add_msg_send(b, &nobody, 7).unwrap();
        }
        drop(nobody);
        // Sends LNet fails (the connection is refused): their SEND events
        // end them, with the MD's last event.
        let away = tm.ep_create("127.0.77.2@tcp:12345:31:7").unwrap();
        for _ in 0..2 {
            let mut b = dom
                .register(BufVec::new(1, 64))
                .unwrap()
                .with_callbacks(cbs.clone());
            b.bufvec_mut().copy_in(0, b"anyone?").unwrap();
            tm.add_msg_send(b, &away, 7).unwrap();
        }
        drop(away);
        let t0 = Instant::now();
        // Half end by their timeouts, the rest at the stop.
        let mut finals = 0;
        let deadline = Instant::now() + WAIT;
        while finals < SENDS / 2 + 2 {
            let ev = events
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("timeout events");
            assert_eq!(ev.queue(), QueueType::MsgSend);
            assert!(ev.status().is_err(), "epoch {epoch}: {ev:?}");
            finals += 1;
        }
        tm.stop(true).unwrap();
        println!("epoch {epoch}: timeouts and refusals in {:?}", t0.elapsed());
        while finals < SENDS + 2 {
            let ev = events
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("stop events");
            assert!(ev.status().is_err(), "epoch {epoch}: {ev:?}");
            finals += 1;
        }
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
        assert!(
            events.try_recv().is_none(),
            "a second final event for a buffer"
        );
        assert_eq!(dom.buffer_count(), 0);
    }
    // What LNet still had of them ends with its events: then only the
    // last machine's tomb holds a state (before the fix: every machine).
    let deadline = Instant::now() + WAIT;
    while xprt.held_machines() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        xprt.held_machines() <= 1,
        "{} transfer machine states held after {EPOCHS} finalised machines",
        xprt.held_machines()
    );
    dom.fini().map_err(|e| e.error).unwrap();
}
