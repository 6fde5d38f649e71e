//! Heap held per idle server-side connection: connections that delivered
//! a message and went quiet keep no read buffer (it goes back to the I/O
//! thread's pool), so each costs a few hundred bytes of heap, not the
//! 64 KiB read buffer it borrowed for its read.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colibri_bulk_tcp::wire::{Header, Opcode};
use colibri_bulk_tcp::{TcpAddr, TcpConfig, TcpTransport};
use colibri_net::{BufVec, BufferCallbacks, Domain, RecvParams, TmState};

/// Counts the bytes allocated and not freed, process-wide.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const CONNS: usize = 400;

#[test]
fn idle_connections_hold_no_read_buffer() {
    let xprt = TcpTransport::new(TcpConfig::default());
    let dom = Domain::new(&xprt).unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    let cbs = Arc::new(BufferCallbacks::new().on_all(move |_tm, ev| {
        if ev.status().is_ok() {
            g.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let tm = dom.tm_init(colibri_net::ignore_tm_events()).unwrap();
    // One multi-message buffer takes every message (as many as fit).
    let rb = dom
        .register(BufVec::new(1, 64 * CONNS + 4096))
        .unwrap()
        .with_callbacks(cbs);
    tm.add_msg_recv(rb, RecvParams::multi(16, (CONNS + 8) as u32))
        .unwrap();
    tm.start("127.0.0.1:0:5").unwrap();
    tm.wait_for_state(TmState::Started, Duration::from_secs(10))
        .unwrap();
    let to = TcpAddr::parse(tm.ep().unwrap().addr()).unwrap();
    let me = TcpAddr::parse("127.0.0.1:9:77").unwrap();

    // Warm up the engine's tables with one connection first.
    let send = |xid: u64| {
        let mut s = TcpStream::connect(to.sock()).unwrap();
        let mut h = Header::new(Opcode::Msg, xid, me, to);
        h.total = 16;
        h.body_len = 16;
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(&[0x5a; 16]);
        s.write_all(&frame).unwrap();
        s
    };
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} messages",
                got.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let first = send(1);
    wait_for(1);
    std::thread::sleep(Duration::from_millis(50));
    let before = LIVE.load(Ordering::SeqCst);
    let mut socks = Vec::with_capacity(CONNS);
    for i in 0..CONNS {
        socks.push(send(2 + i as u64));
    }
    wait_for(CONNS + 1);
    std::thread::sleep(Duration::from_millis(100));
    let after = LIVE.load(Ordering::SeqCst);
    // The client sockets' Vec is ours, not the server's.
    let ours = (CONNS * size_of::<TcpStream>()) as isize;
    let per_conn = (after - before - ours) / CONNS as isize;
    println!("heap per idle server-side connection: {per_conn} bytes");
    assert!(
        per_conn < 16 * 1024,
        "{per_conn} bytes of heap per idle connection"
    );
    drop((socks, first));
    tm.stop(true).unwrap();
    tm.wait_stopped(Duration::from_secs(10)).unwrap();
}

#[test]
fn closed_listeners_are_forgotten() {
    // A transfer machine started at port 0 and stopped, 50 times, in a
    // domain kept alive by another: the I/O thread watches one listener
    // at the end, not 51 (a closed socket raises no event, so it used to
    // keep every one it had been given).
    let xprt = TcpTransport::new(TcpConfig::default());
    let dom = Domain::new(&xprt).unwrap();
    let keeper = dom.tm_init(colibri_net::ignore_tm_events()).unwrap();
    keeper.start("127.0.0.1:0:1").unwrap();
    keeper
        .wait_for_state(TmState::Started, Duration::from_secs(10))
        .unwrap();
    for _ in 0..50 {
        let tm = dom.tm_init(colibri_net::ignore_tm_events()).unwrap();
        tm.start("127.0.0.1:0:2").unwrap();
        tm.wait_for_state(TmState::Started, Duration::from_secs(10))
            .unwrap();
        tm.stop(true).unwrap();
        tm.wait_stopped(Duration::from_secs(10)).unwrap();
        tm.fini().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while xprt.stats().listeners != 1 {
        assert!(
            Instant::now() < deadline,
            "{} listeners watched",
            xprt.stats().listeners
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    keeper.stop(true).unwrap();
    keeper.wait_stopped(Duration::from_secs(10)).unwrap();
}
