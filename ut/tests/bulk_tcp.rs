//! The conformance suite on the TCP transport over loopback, once with the
//! default configuration (I/O threads spin briefly, then block) and once
//! with I/O threads that block at once and small bulk chunks, so that every
//! transfer of the suite crosses several chunks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::Transport;
use colibri_ut::Factory;

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1);

struct Tcp(TcpConfig);

impl Factory for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(TcpTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        // Port 1 (tcpmux) is privileged and has no listener here: the
        // connection is refused.
        "127.0.0.1:1:1".to_string()
    }
}

mod default_config {
    use super::*;
    colibri_ut::conformance_tests!(Tcp(TcpConfig::default()));
}

mod blocking_small_chunks {
    use super::*;
    colibri_ut::conformance_tests!(Tcp(TcpConfig {
        chunk: 1000,
        ..TcpConfig::blocking()
    }));
}
