//! Quick look at the RPC workloads against the raw ones (development aid:
//! `cargo run --release -p colibri-bench --example rpc_quick`).

use colibri_bench::{Bulk, BulkDir, PairConfig, RoundTrip, RpcBulk, RpcOneWay, RpcRoundTrip};
use colibri_bulk_mem::{MemConfig, MemTransport};

fn main() {
    let xprt = MemTransport::new(MemConfig::polling());
    let cfg = PairConfig::mem().pinned(1, 0);
    let n = 100_000;
    let mut raw = RoundTrip::new(&xprt, &cfg, 64).unwrap();
    let mut rpc = RpcRoundTrip::new(&xprt, &cfg, 1).unwrap();
    raw.run(n / 10).unwrap();
    rpc.run(n / 10).unwrap();
    for _ in 0..3 {
        let a = raw.run(n).unwrap().as_secs_f64() * 1e6 / n as f64;
        let b = rpc.run(n).unwrap().as_secs_f64() * 1e6 / n as f64;
        println!("raw rtt {a:.3} us, rpc rtt {b:.3} us, ratio {:.2}", b / a);
    }
    raw.finish();
    rpc.finish();
    let mut rate = RpcRoundTrip::new(&xprt, &cfg, 16).unwrap();
    let d = rate.run(n).unwrap();
    println!("rpc x16 {:.3} Mcall/s", n as f64 / d.as_secs_f64() / 1e6);
    rate.finish();
    let size = 1 << 20;
    let mut rb = Bulk::new(&xprt, &cfg, size, BulkDir::Read).unwrap();
    let mut pb = RpcBulk::new(&xprt, &cfg, size, BulkDir::Read).unwrap();
    for _ in 0..3 {
        let a = 200.0 * size as f64 / rb.run(200).unwrap().as_secs_f64() / 1e9;
        let b = 200.0 * size as f64 / pb.run(200).unwrap().as_secs_f64() / 1e9;
        println!(
            "raw bulk read {a:.2} GB/s, rpc {b:.2} GB/s, ratio {:.2}",
            b / a
        );
    }
    rb.finish();
    pb.finish();
    for batching in [true, false] {
        let mut ow = RpcOneWay::new(&xprt, &cfg, 64, batching).unwrap();
        let c = 500_000;
        let d = ow.run(c).unwrap();
        println!(
            "oneway batching={batching}: {:.3} Mitem/s, {:.1} items/msg",
            c as f64 / d.as_secs_f64() / 1e6,
            ow.items_per_msg()
        );
        ow.finish();
    }
}
