//! Live heap during a soak over TCP, measured with a counting allocator
//! (resident memory also counts what the allocator keeps): with idle
//! connections reaped after 1 s, the live heap's floor after the first
//! seconds stays flat, epoch after epoch.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_ut::soak::{SoakConfig, soak};

#[path = "support/counting.rs"]
mod counting;
use counting::LIVE;

#[test]
fn tcp_soak_heap_stays_flat() {
    let xprt = Arc::new(TcpTransport::new(TcpConfig {
        idle_timeout: Duration::from_secs(1),
        ..TcpConfig::default()
    }));
    let addr = || "127.0.0.1:0:1".to_string();
    let cfg = SoakConfig {
        seed: 31,
        max_ops: u64::MAX,
        max_time: Duration::from_secs(12),
        faults: true,
        epoch_ops: 2_000,
        sample_every: Duration::from_secs(60),
    };
    let mut samples: Vec<(Duration, isize)> = Vec::new();
    let rep = soak(xprt, &addr, &cfg, &mut |r| {
        samples.push((r.elapsed, LIVE.load(Ordering::Relaxed)));
    })
    .unwrap_or_else(|e| panic!("{e}"));
    println!("{rep:?}");
    for (t, b) in &samples {
        println!(
            "{:>5.1}s live heap {:.2} MiB",
            t.as_secs_f64(),
            *b as f64 / 1048576.0
        );
    }
    // Samples fall anywhere in an epoch, so they vary with what is in
    // flight; the floor does not: the last third's lowest sample is not
    // above the middle third's lowest by more than half plus 512 KiB. (A
    // guard against gross leaks: a few hundred bytes per epoch would pass.)
    let third = samples.len() / 3;
    assert!(third >= 2, "{samples:?}");
    let min = |s: &[(Duration, isize)]| s.iter().map(|x| x.1).min().unwrap_or(0);
    let (mid, last) = (min(&samples[third..2 * third]), min(&samples[2 * third..]));
    assert!(
        last as f64 <= mid as f64 * 1.5 + 512.0 * 1024.0,
        "live heap floor grew from {mid} to {last} bytes"
    );
}
