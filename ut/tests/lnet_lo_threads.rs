//! The conformance suite on the LNet transport over `0@lo` with a delivery
//! thread per transfer machine (`LnetXprtConfig::thread_per_tm`): every
//! callback runs on its machine's own thread, the node's engine thread only
//! hands them over. Otherwise as `lnet_lo.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::Transport;
use colibri_ut::Factory;

static XPRT: OnceLock<LnetTransport> = OnceLock::new();
static NEXT_PORTAL: AtomicU32 = AtomicU32::new(0);

fn xprt() -> &'static LnetTransport {
    XPRT.get_or_init(|| {
        let mut cfg = LnetConfig::new(&["127.0.41.3@tcp".parse().unwrap()]);
        cfg.accept_port = 0;
        cfg.node.transaction_timeout = Duration::from_secs(10);
        cfg.node.retry_count = 1;
        let l = Lnet::start(cfg).expect("LNet node");
        LnetTransport::new(vec![l], LnetXprtConfig::default().thread_per_tm(true))
            .expect("transport")
    })
}

struct LnetLoThreads;

impl Factory for LnetLoThreads {
    fn name(&self) -> &'static str {
        "lnet"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(xprt().clone())
    }
    fn addr(&self) -> String {
        // Spread the suite's transfer machines over a few portals.
        let p = 20 + NEXT_PORTAL.fetch_add(1, Ordering::Relaxed) % 8;
        format!("0@lo:12345:{p}:*")
    }
    fn unreachable_addr(&self) -> String {
        // A net with no route.
        "10.255.255.1@tcp9:12345:30:1".into()
    }
}

colibri_ut::conformance_tests!(LnetLoThreads);
