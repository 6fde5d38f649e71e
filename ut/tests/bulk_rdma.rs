//! The conformance suite on the verbs RDMA transport, over loopback
//! addresses (TCP control on 127.0.0.1, RDMA on the device's own GID).
//!
//! Every case needs an RDMA device, so the cases are `#[ignore]`d: on a
//! machine without one they are listed as ignored; in the Soft-RoCE VM
//! (`.ci/run`, through `../shared/rdma-vm/run.sh --net lo`) they run with
//! `--include-ignored`. Twice: the default configuration (the engine spins
//! briefly, then arms the CQ and blocks), and an engine that blocks at once
//! with queue pairs of 4 send slots, so that transfers wait for send-queue
//! room and completions must re-arm and wake it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
use colibri_net::Transport;
use colibri_ut::Factory;

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1);

struct Rdma(RdmaConfig);

impl Factory for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(RdmaTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        // Port 1 (tcpmux) has no listener: the control connection is
        // refused.
        "127.0.0.1:1:1".to_string()
    }
}

mod default_config {
    use super::*;
    colibri_ut::conformance_tests!(
        Rdma(RdmaConfig::default()),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}

mod blocking_small_queues {
    use super::*;
    colibri_ut::conformance_tests!(
        Rdma(RdmaConfig {
            sq_depth: 4,
            cq_depth: 64,
            ..RdmaConfig::blocking()
        }),
        ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"
    );
}
