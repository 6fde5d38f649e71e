//! Profiling aid: null RPC round trips in a loop (`perf record` it).
use colibri_bench::{PairConfig, RpcRoundTrip};
use colibri_bulk_mem::{MemConfig, MemTransport};
fn main() {
    let xprt = MemTransport::new(MemConfig::polling());
    let cfg = PairConfig::mem().pinned(1, 0);
    let mut rpc = RpcRoundTrip::new(&xprt, &cfg, 1).unwrap();
    for _ in 0..5 {
        let n = 200_000;
        let b = rpc.run(n).unwrap().as_secs_f64() * 1e6 / n as f64;
        println!("rpc rtt {b:.3} us");
    }
    rpc.finish();
}
