//! Profiling aid: null RPC calls with 1 to 16 in flight (`perf record` it).

use colibri_bench::{PairConfig, RpcRoundTrip};
use colibri_bulk_mem::{MemConfig, MemTransport};

fn main() {
    let xprt = MemTransport::new(MemConfig::polling());
    let cfg = PairConfig::mem().pinned(1, 0);
    let windows: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let windows = if windows.is_empty() {
        vec![1, 2, 4, 16]
    } else {
        windows
    };
    for w in windows {
        let mut rpc = RpcRoundTrip::new(&xprt, &cfg, w).unwrap();
        for _ in 0..3 {
            let n = 200_000;
            let d = rpc.run(n).unwrap().as_secs_f64();
            println!(
                "window {w}: {:.3} us per call, {:.3} Mcall/s",
                d * 1e6 / n as f64,
                n as f64 / d / 1e6
            );
        }
        rpc.finish();
    }
}
