//! A message answered from its receive callback carries the
//! acknowledgement of the message it answers (no DELIVERED of its own):
//! one LNet message each way per exchange, counted on the nodes; an
//! acknowledgement still counts when the message carrying it finds no
//! receive buffer; and messages taken together are acknowledged
//! together (DELIVERED_MANY).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, EndPoint, NetError, QueueType, RecvParams,
    TmHandle, TmState, TransferMachine, ignore_tm_events,
};
use crossbeam_channel::{Sender, bounded};

#[path = "support/nodes.rs"]
mod nodes;
use nodes::socklnd_nodes;

const WAIT: Duration = Duration::from_secs(20);

/// Two LNet nodes on loopback (socket LND), each knowing where the other
/// listens, and a transport over both. No bulk handshake or answer is
/// expected to time out here: the timeout is long, so that an
/// acknowledgement lost would show as a missing completion.
fn transport(nids: [&str; 2]) -> LnetTransport {
    let nodes = socklnd_nodes(&nids);
    let cfg = LnetXprtConfig::default().handshake_timeout(Duration::from_secs(120));
    LnetTransport::new(nodes, cfg).unwrap()
}

fn started(dom: &Domain, addr: &str) -> TransferMachine {
    let tm = dom.tm_init(ignore_tm_events()).unwrap();
    tm.start(addr).unwrap();
    tm.wait_for_state(TmState::Started, WAIT).unwrap();
    tm
}

fn finish(dom: Domain, tms: Vec<TransferMachine>, x: &LnetTransport) {
    for tm in tms {
        tm.stop(true).unwrap();
        tm.wait_stopped(WAIT).unwrap();
        tm.fini().map_err(|e| e.error).unwrap();
    }
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
    for n in x.nodes() {
        n.shutdown();
    }
}

/// Sends the message `ev` delivered back to its sender, from the buffer
/// it landed in; a failure goes to `errs`.
fn answer(tm: &TmHandle, mut ev: BufferEvent, errs: &Sender<String>) {
    let (Some(buf), Some(from)) = (ev.take_buffer(), ev.take_sender()) else {
        let _ = errs.try_send(format!("a message without buffer or sender: {ev:?}"));
        return;
    };
    let len = ev.length();
    if let Err(e) = tm.add_msg_send(buf, &from, len) {
        let _ = errs.try_send(format!("answer refused: {:?}", e.error));
    }
}

/// Puts a buffer whose send completed back on the receive queue.
fn requeue(tm: &TmHandle, mut ev: BufferEvent, errs: &Sender<String>) {
    if !ev.is_ok() {
        let _ = errs.try_send(format!("send failed: {ev:?}"));
    }
    if let Some(buf) = ev.take_buffer()
        && let Err(e) = tm.add_msg_recv(buf, RecvParams::default())
        && !matches!(e.error, NetError::WrongState { .. })
    {
        let _ = errs.try_send(format!("receive buffer refused: {:?}", e.error));
    }
}

#[test]
fn answers_carry_the_acknowledgement() {
    const N: usize = 200;
    let x = transport(["127.0.78.1@tcp", "127.0.78.2@tcp"]);
    let (client_node, server_node) = (x.nodes()[0].clone(), x.nodes()[1].clone());
    let dom = Domain::new(&x).unwrap();
    let server = started(&dom, "127.0.78.2@tcp:12345:30:*");
    let client = started(&dom, "127.0.78.1@tcp:12345:30:*");
    let (errs, err_rx) = bounded::<String>(64);
    let (done, done_rx) = bounded::<()>(1);
    // The server echoes every message from its receive callback.
    let e1 = errs.clone();
    let server_cbs = Arc::new(
        BufferCallbacks::new().on_all(move |tm, ev| match ev.queue() {
            QueueType::MsgRecv if ev.is_ok() => answer(tm, ev, &e1),
            QueueType::MsgSend => requeue(tm, ev, &e1),
            _ => {
                let _ = e1.try_send(format!("server: {ev:?}"));
            }
        }),
    );
    // The client sends the next request from the callback of each echo,
    // N in all.
    let echoes = Arc::new(AtomicUsize::new(0));
    let (e2, n2) = (errs.clone(), Arc::clone(&echoes));
    let client_cbs = Arc::new(
        BufferCallbacks::new().on_all(move |tm, ev| match ev.queue() {
            QueueType::MsgRecv if ev.is_ok() => {
                if n2.fetch_add(1, Ordering::SeqCst) + 1 < N {
                    answer(tm, ev, &e2);
                } else {
                    let _ = done.try_send(());
                }
            }
            QueueType::MsgSend => requeue(tm, ev, &e2),
            _ => {
                let _ = e2.try_send(format!("client: {ev:?}"));
            }
        }),
    );
    // Two receive buffers each: a send completes when its answer comes,
    // and only then is its buffer a receive buffer again.
    for (tm, cbs) in [(&server, &server_cbs), (&client, &client_cbs)] {
        for _ in 0..2 {
            let b = dom
                .register(BufVec::new(1, 64))
                .unwrap()
                .with_callbacks(Arc::clone(cbs));
            tm.add_msg_recv(b, RecvParams::default()).unwrap();
        }
    }
    let server_ep: EndPoint = client.ep_create(server.ep().unwrap().addr()).unwrap();
    let before = (
        client_node.stats().send_count,
        server_node.stats().send_count,
    );
    let mut first = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(Arc::clone(&client_cbs));
    first.bufvec_mut().copy_in(0, b"ping").unwrap();
    client.add_msg_send(first, &server_ep, 4).unwrap();
    done_rx.recv_timeout(WAIT).expect("the exchanges finished");
    assert_eq!(echoes.load(Ordering::SeqCst), N);
    // The last echo's acknowledgement goes as a DELIVERED (the client
    // sends nothing more): wait for it, then count.
    std::thread::sleep(Duration::from_millis(200));
    let after = (
        client_node.stats().send_count,
        server_node.stats().send_count,
    );
    let sent = (after.0 - before.0, after.1 - before.1);
    assert!(
        err_rx.try_recv().is_err(),
        "{:?}",
        err_rx.try_iter().collect::<Vec<_>>()
    );
    // N requests and one DELIVERED from the client, N echoes from the
    // server, and the nodes' discovery of each other (a few pings and
    // pushes); a DELIVERED per message would double both.
    let most = N as u64 + 5;
    assert!(
        sent.0 <= most && sent.1 <= most,
        "LNet messages sent (client, server) for {N} exchanges: {sent:?}"
    );
    drop((server_ep, client_cbs, server_cbs));
    finish(dom, vec![client, server], &x);
}

#[test]
fn an_acknowledgement_counts_when_its_carrier_finds_no_buffer() {
    let x = transport(["127.0.78.3@tcp", "127.0.78.4@tcp"]);
    let dom = Domain::new(&x).unwrap();
    let server = started(&dom, "127.0.78.4@tcp:12345:31:*");
    let client = started(&dom, "127.0.78.3@tcp:12345:31:*");
    let (events, ev_rx) = bounded::<(&'static str, QueueType, Result<(), NetError>)>(64);
    // The server answers its one message from the buffer it landed in and
    // has no receive buffer left.
    let ev_s = events.clone();
    let server_cbs = Arc::new(BufferCallbacks::new().on_all(move |tm, ev| {
        let _ = ev_s.try_send(("server", ev.queue(), ev.status().clone()));
        if ev.queue() == QueueType::MsgRecv && ev.is_ok() {
            let (errs, _) = bounded(1);
            answer(tm, ev, &errs);
        }
    }));
    // The client sends its second message from the callback of the
    // answer: the message carries the answer's acknowledgement and finds
    // no buffer at the server.
    let ev_c = events.clone();
    let client_cbs = Arc::new(BufferCallbacks::new().on_all(move |tm, ev| {
        let _ = ev_c.try_send(("client", ev.queue(), ev.status().clone()));
        if ev.queue() == QueueType::MsgRecv && ev.is_ok() {
            let (errs, _) = bounded(1);
            answer(tm, ev, &errs);
        }
    }));
    for (tm, cbs) in [(&server, &server_cbs), (&client, &client_cbs)] {
        let b = dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(Arc::clone(cbs));
        tm.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    let server_ep = client.ep_create(server.ep().unwrap().addr()).unwrap();
    let first = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(Arc::clone(&client_cbs));
    client.add_msg_send(first, &server_ep, 8).unwrap();
    // Everything completes promptly: the server's answer by the
    // acknowledgement its dropped carrier brought (a lost one would leave
    // it waiting for the two-minute answer timeout).
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let e = ev_rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("only {seen:?}"));
        seen.push(e);
    }
    let status = |who: &str, q: QueueType| -> Vec<Result<(), NetError>> {
        seen.iter()
            .filter(|(w, qq, _)| *w == who && *qq == q)
            .map(|(_, _, s)| s.clone())
            .collect()
    };
    assert_eq!(
        status("server", QueueType::MsgRecv),
        vec![Ok(())],
        "{seen:?}"
    );
    assert_eq!(
        status("server", QueueType::MsgSend),
        vec![Ok(())],
        "{seen:?}"
    );
    assert_eq!(
        status("client", QueueType::MsgRecv),
        vec![Ok(())],
        "{seen:?}"
    );
    let sends = status("client", QueueType::MsgSend);
    assert_eq!(sends.len(), 2, "{seen:?}");
    assert!(sends.contains(&Ok(())), "{seen:?}");
    assert!(sends.contains(&Err(NetError::NoBuffers)), "{seen:?}");
    assert_eq!(server.no_buffer_drops(), 1);
    drop((server_ep, client_cbs, server_cbs));
    finish(dom, vec![client, server], &x);
}

#[test]
fn a_burst_of_messages_is_acknowledged_in_one_control_message() {
    const N: usize = 40;
    let x = transport(["127.0.78.5@tcp", "127.0.78.6@tcp"]);
    let server_node = x.nodes()[1].clone();
    let dom = Domain::new(&x).unwrap();
    let server = started(&dom, "127.0.78.6@tcp:12345:32:*");
    let client = started(&dom, "127.0.78.5@tcp:12345:32:*");
    // The server's first receive callback holds its thread until all the
    // other messages were sent: they wait, and are then taken together.
    let (got, got_rx) = bounded::<()>(N);
    let (go, go_rx) = bounded::<()>(1);
    let held = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&held);
    let server_cbs = Arc::new(BufferCallbacks::new().on_all(move |_tm, ev| {
        assert!(ev.is_ok(), "{ev:?}");
        if h.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = go_rx.recv_timeout(WAIT);
        }
        let _ = got.try_send(());
    }));
    for _ in 0..N {
        let b = dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(Arc::clone(&server_cbs));
        server.add_msg_recv(b, RecvParams::default()).unwrap();
    }
    let (sent, sent_rx) = bounded::<Result<(), NetError>>(N);
    let client_cbs = Arc::new(BufferCallbacks::new().on_all(move |_tm, ev| {
        let _ = sent.try_send(ev.status().clone());
    }));
    let server_ep: EndPoint = client.ep_create(server.ep().unwrap().addr()).unwrap();
    // The first message (after discovery, whose pings and pushes are not
    // counted) holds the server's callback.
    let mut b = dom
        .register(BufVec::new(1, 64))
        .unwrap()
        .with_callbacks(Arc::clone(&client_cbs));
    b.bufvec_mut().copy_in(0, b"first").unwrap();
    client.add_msg_send(b, &server_ep, 5).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while held.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "first message lost");
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = server_node.stats().send_count;
    for i in 1..N {
        let mut b = dom
            .register(BufVec::new(1, 64))
            .unwrap()
            .with_callbacks(Arc::clone(&client_cbs));
        b.bufvec_mut().copy_in(0, &[i as u8; 8]).unwrap();
        client.add_msg_send(b, &server_ep, 8).unwrap();
    }
    // Time for them to reach the server's socket; then it goes on.
    std::thread::sleep(Duration::from_millis(200));
    go.send(()).unwrap();
    // Every send completes once, successfully; every message arrives.
    for _ in 0..N {
        sent_rx
            .recv_timeout(WAIT)
            .expect("a send completes")
            .unwrap();
        got_rx.recv_timeout(WAIT).expect("a message arrives");
    }
    assert!(sent_rx.recv_timeout(Duration::from_millis(100)).is_err());
    // The server answered the messages it took together with a few
    // control messages, not one DELIVERED each.
    let acks = server_node.stats().send_count - before;
    assert!(
        acks < (N as u64) / 4,
        "{acks} LNet messages from the server for {N} messages"
    );
    drop((server_ep, client_cbs, server_cbs));
    finish(dom, vec![client, server], &x);
}
