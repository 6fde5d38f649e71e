//! A transfer machine's delivery thread (`thread_per_tm`) leaves once the
//! machine is finalised: a transport that makes and finalises machines
//! does not collect threads. (A test binary of its own: it counts the
//! process's threads by name.)

use std::time::{Duration, Instant};

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::{Domain, TmState, ignore_tm_events};

const WAIT: Duration = Duration::from_secs(60);

/// Threads of this process whose name starts as the delivery threads'
/// (`colibri-lnet-tm-N`, cut to 15 bytes by the kernel).
fn lanes() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("colibri-lnet-tm"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn delivery_threads_leave_when_their_machines_are_finalised() {
    if !std::path::Path::new("/proc/self/task").exists() {
        return;
    }
    let mut c = LnetConfig::new(&["127.0.78.1@tcp".parse().unwrap()]);
    c.accept_port = 0;
    let x = LnetTransport::new(
        vec![Lnet::start(c).unwrap()],
        LnetXprtConfig::default().thread_per_tm(true),
    )
    .unwrap();
    let dom = Domain::new(&x).unwrap();
    assert_eq!(lanes(), 0);
    for round in 0..3 {
        let tms: Vec<_> = (0..4)
            .map(|_| {
                let tm = dom.tm_init(ignore_tm_events()).unwrap();
                tm.start("0@lo:12345:30:*").unwrap();
                tm.wait_for_state(TmState::Started, WAIT).unwrap();
                tm
            })
            .collect();
        assert_eq!(lanes(), 4, "round {round}");
        for tm in tms {
            tm.stop(true).unwrap();
            tm.wait_stopped(WAIT).unwrap();
            tm.fini().map_err(|e| e.error).unwrap();
        }
        // Each thread runs what was queued (the STOPPED event) and leaves.
        let deadline = Instant::now() + WAIT;
        while lanes() > 0 {
            assert!(Instant::now() < deadline, "{} threads stayed", lanes());
            std::thread::yield_now();
        }
    }
    dom.fini().map_err(|e| e.error).unwrap();
    x.shutdown();
}
