//! The conformance suite on the in-memory transport: with the default
//! configuration, with several worker threads per transfer machine in
//! blocking mode, with every transfer machine of every test served by one
//! shared engine of two threads, and behind a fault injector.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use colibri_bulk_mem::{MemConfig, MemEngine, MemTransport};
use colibri_net::Transport;
use colibri_ut::Factory;

static NEXT_SERVICE: AtomicU32 = AtomicU32::new(1);

struct Mem(MemConfig);

impl Factory for Mem {
    fn name(&self) -> &'static str {
        "mem"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(MemTransport::new(self.0.clone()))
    }
    fn addr(&self) -> String {
        format!(
            "127.0.0.1:0:{}",
            NEXT_SERVICE.fetch_add(1, Ordering::Relaxed)
        )
    }
    fn unreachable_addr(&self) -> String {
        // Dynamic ports start at 32768 and no test asks for port 1.
        "127.0.0.1:1:1".to_string()
    }
}

mod default_config {
    use super::*;
    colibri_ut::conformance_tests!(Mem(MemConfig::default()));
}

mod pool_blocking {
    use super::*;
    colibri_ut::conformance_tests!(Mem(MemConfig {
        workers: 3,
        ..MemConfig::blocking()
    }));
}

/// One engine of two threads for every transfer machine of every test of
/// this module (the tests run in parallel: the engine serves them all).
fn engine() -> &'static MemEngine {
    static ENGINE: std::sync::OnceLock<MemEngine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| {
        MemEngine::new(2, std::time::Duration::from_micros(50)).expect("engine threads")
    })
}

mod shared_engine {
    use super::*;
    colibri_ut::conformance_tests!(Mem(MemConfig::shared(engine())));
}

/// The in-memory transport behind a fault injector with a plan that
/// delays every fourth operation by up to 2 ms and injects nothing else:
/// the whole suite passes through the wrapper (delays reorder operations,
/// which no case may depend on, and the wrapper's set-aside buffers must
/// be cancellable, time out and stop like any other).
struct Delayed;

impl Factory for Delayed {
    fn name(&self) -> &'static str {
        "mem+delays"
    }
    fn transport(&self) -> Arc<dyn Transport> {
        use colibri_net::fault::{FaultAction, FaultPlan, FaultRule, FaultTransport, Pick};
        let plan = FaultPlan::new(7).rule(FaultRule::new(
            FaultAction::Delay {
                min: std::time::Duration::ZERO,
                max: std::time::Duration::from_millis(2),
            },
            Pick::Every(4),
        ));
        Arc::new(FaultTransport::new(
            Arc::new(MemTransport::new(MemConfig::default())),
            plan,
        ))
    }
    fn addr(&self) -> String {
        Mem(MemConfig::default()).addr()
    }
    fn unreachable_addr(&self) -> String {
        Mem(MemConfig::default()).unreachable_addr()
    }
}

mod through_a_fault_injector {
    use super::*;
    colibri_ut::conformance_tests!(Delayed);
}
