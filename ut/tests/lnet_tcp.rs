//! The conformance suite on the LNet transport over Lustre's socket LND:
//! two LNet nodes of this process on loopback addresses, the suite's
//! transfer machines alternately on one and the other, so that messages
//! and bulk cross real sockets. It runs twice: with the transport's
//! defaults, and in module `threads` with a delivery thread per transfer
//! machine (`LnetXprtConfig::thread_per_tm`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::Transport;
use colibri_ut::Factory;

/// Two LNet nodes on `nids`, each knowing where the other listens, and a
/// transport over both, made on first use.
struct LnetTcp {
    nids: [&'static str; 2],
    thread_per_tm: bool,
    xprt: OnceLock<LnetTransport>,
    next: AtomicU32,
}

impl LnetTcp {
    const fn new(nids: [&'static str; 2], thread_per_tm: bool) -> Self {
        Self {
            nids,
            thread_per_tm,
            xprt: OnceLock::new(),
            next: AtomicU32::new(0),
        }
    }

    fn xprt(&self) -> &LnetTransport {
        self.xprt.get_or_init(|| {
            let nodes: Vec<Lnet> = self
                .nids
                .iter()
                .map(|n| {
                    let mut cfg = LnetConfig::new(&[n.parse().unwrap()]);
                    cfg.accept_port = 0;
                    cfg.accept = AcceptPolicy::All;
                    cfg.node.transaction_timeout = Duration::from_secs(10);
                    cfg.node.retry_count = 1;
                    Lnet::start(cfg).expect("LNet node")
                })
                .collect();
            Lnet::introduce(&nodes);
            let x = LnetXprtConfig::default().thread_per_tm(self.thread_per_tm);
            LnetTransport::new(nodes, x).expect("transport")
        })
    }
}

impl Factory for LnetTcp {
    fn name(&self) -> &'static str {
        "lnet"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(self.xprt().clone())
    }
    fn addr(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!(
            "{}:12345:{}:*",
            self.nids[(n % 2) as usize],
            20 + (n / 2) % 8
        )
    }
    fn unreachable_addr(&self) -> String {
        "10.255.255.1@tcp9:12345:30:1".into()
    }
}

static DEFAULT: LnetTcp = LnetTcp::new(["127.0.42.1@tcp", "127.0.42.2@tcp"], false);

colibri_ut::conformance_tests!(DEFAULT);

/// The same suite with a delivery thread per transfer machine.
mod threads {
    static THREADS: super::LnetTcp =
        super::LnetTcp::new(["127.0.42.3@tcp", "127.0.42.4@tcp"], true);

    colibri_ut::conformance_tests!(THREADS);
}
