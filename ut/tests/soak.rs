//! The soak runner, short: a few seconds per transport with faults on
//! (`colibri soak` runs it for as long as asked).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use colibri_bulk_mem::MemTransport;
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_ut::soak::{SoakConfig, soak};

fn short(seed: u64) -> SoakConfig {
    SoakConfig {
        seed,
        max_ops: 30_000,
        max_time: Duration::from_secs(4),
        faults: true,
        epoch_ops: 3_000,
        sample_every: Duration::from_secs(1),
    }
}

#[test]
fn soak_mem() {
    static SVC: AtomicU32 = AtomicU32::new(1);
    let addr = || format!("127.0.0.1:0:{}", 7000 + SVC.fetch_add(1, Ordering::Relaxed));
    let rep = soak(
        Arc::new(MemTransport::default()),
        &addr,
        &short(11),
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!("{rep:?}");
    assert!(rep.epochs >= 2 && rep.adds > 1000, "{rep:?}");
    assert_eq!(rep.finals, rep.adds);
    assert!(rep.payloads_checked > 0 && rep.faults.lost > 0 && rep.faults.delayed > 0);
}

#[test]
fn soak_tcp() {
    let addr = || "127.0.0.1:0:1".to_string();
    let rep = soak(
        Arc::new(TcpTransport::new(TcpConfig::default())),
        &addr,
        &short(12),
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!("{rep:?}");
    assert!(rep.epochs >= 2 && rep.adds > 1000, "{rep:?}");
    assert_eq!(rep.finals, rep.adds);
    assert!(rep.payloads_checked > 0 && rep.faults.lost > 0 && rep.faults.delayed > 0);
}
