//! The conformance suite on the LNet transport over `0@lo`: every transfer
//! machine of the suite on one LNet node of this process, messages and
//! bulk through the loopback LND (one move from MD memory to MD memory).
//! It runs twice: with the transport's defaults (every machine's callbacks
//! on its node's engine thread), and in module `threads` with a delivery
//! thread per transfer machine (`LnetXprtConfig::thread_per_tm`: every
//! callback runs on its machine's own thread, the engine only hands them
//! over).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::Transport;
use colibri_ut::Factory;

/// One LNet node on `nid` and a transport over it, made on first use.
struct LnetLo {
    nid: &'static str,
    thread_per_tm: bool,
    xprt: OnceLock<LnetTransport>,
    next_portal: AtomicU32,
}

impl LnetLo {
    const fn new(nid: &'static str, thread_per_tm: bool) -> Self {
        Self {
            nid,
            thread_per_tm,
            xprt: OnceLock::new(),
            next_portal: AtomicU32::new(0),
        }
    }

    fn xprt(&self) -> &LnetTransport {
        self.xprt.get_or_init(|| {
            let mut cfg = LnetConfig::new(&[self.nid.parse().unwrap()]);
            cfg.accept_port = 0;
            cfg.node.transaction_timeout = Duration::from_secs(10);
            cfg.node.retry_count = 1;
            let l = Lnet::start(cfg).expect("LNet node");
            let x = LnetXprtConfig::default().thread_per_tm(self.thread_per_tm);
            LnetTransport::new(vec![l], x).expect("transport")
        })
    }
}

impl Factory for LnetLo {
    fn name(&self) -> &'static str {
        "lnet"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.xprt().clone())
    }
    fn addr(&self) -> String {
        // Spread the suite's transfer machines over a few portals.
        let p = 20 + self.next_portal.fetch_add(1, Ordering::Relaxed) % 8;
        format!("0@lo:12345:{p}:*")
    }
    fn unreachable_addr(&self) -> String {
        // A net with no route.
        "10.255.255.1@tcp9:12345:30:1".into()
    }
}

static DEFAULT: LnetLo = LnetLo::new("127.0.41.1@tcp", false);

colibri_ut::conformance_tests!(DEFAULT);

/// The same suite with a delivery thread per transfer machine.
mod threads {
    static THREADS: super::LnetLo = super::LnetLo::new("127.0.41.3@tcp", true);

    colibri_ut::conformance_tests!(THREADS);
}
