//! The conformance suite on the LNet transport over Lustre's socket LND
//! with a delivery thread per transfer machine
//! (`LnetXprtConfig::thread_per_tm`); otherwise as `lnet_tcp.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{Lnet, LnetConfig};
use colibri_lnet_xprt::{LnetTransport, LnetXprtConfig};
use colibri_net::Transport;
use colibri_ut::Factory;

const NIDS: [&str; 2] = ["127.0.42.3@tcp", "127.0.42.4@tcp"];

static XPRT: OnceLock<LnetTransport> = OnceLock::new();
static NEXT: AtomicU32 = AtomicU32::new(0);

fn xprt() -> &'static LnetTransport {
    XPRT.get_or_init(|| {
        let nodes: Vec<Lnet> = NIDS
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
        for a in &nodes {
            for b in &nodes {
                let nb = b.nids()[0];
                if a.nids()[0] != nb {
                    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
                }
            }
        }
        LnetTransport::new(nodes, LnetXprtConfig::default().thread_per_tm(true)).expect("transport")
    })
}

struct LnetTcpThreads;

impl Factory for LnetTcpThreads {
    fn name(&self) -> &'static str {
        "lnet"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(xprt().clone())
    }
    fn addr(&self) -> String {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("{}:12345:{}:*", NIDS[(n % 2) as usize], 20 + (n / 2) % 8)
    }
    fn unreachable_addr(&self) -> String {
        "10.255.255.1@tcp9:12345:30:1".into()
    }
}

colibri_ut::conformance_tests!(LnetTcpThreads);
