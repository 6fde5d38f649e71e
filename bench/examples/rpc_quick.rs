//! Quick look at the RPC workloads against the raw ones (development aid:
//! `cargo run --release -p colibri-bench --example rpc_quick`).

use colibri_bench::{Bulk, BulkDir, PairConfig, RoundTrip, RpcBulk, RpcOneWay, RpcRoundTrip};
use colibri_bulk_mem::{MemConfig, MemTransport};

fn main() {
    let xprt = MemTransport::new(MemConfig::polling());
    let what: Vec<String> = std::env::args().skip(1).collect();
    let want = |w: &str| what.is_empty() || what.iter().any(|x| x == w);
    let cfg = PairConfig::mem().pinned(1, 0);
    let n = 100_000;
    if want("rtt") {
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
    }
    if want("bulk") {
        let size = 1 << 20;
        for (c, s) in [(1, 0), (0, 1)] {
            let cfg = PairConfig::mem().pinned(c, s);
            for dir in [BulkDir::Read, BulkDir::Write] {
                let mut rb = Bulk::new(&xprt, &cfg, size, dir).unwrap();
                let mut pb = RpcBulk::new(&xprt, &cfg, size, dir).unwrap();
                let mut p4 = RpcBulk::with_window(&xprt, &cfg, size, dir, 4).unwrap();
                for _ in 0..3 {
                    let a = 200.0 * size as f64 / rb.run(200).unwrap().as_secs_f64() / 1e9;
                    let b = 200.0 * size as f64 / pb.run(200).unwrap().as_secs_f64() / 1e9;
                    let x = 200.0 * size as f64 / p4.run(200).unwrap().as_secs_f64() / 1e9;
                    println!(
                        "client cpu {c} server cpu {s} {dir:?}: raw {a:.2} GB/s, rpc {b:.2} GB/s (x4 {x:.2}), ratio {:.2}",
                        b / a
                    );
                }
                rb.finish();
                pb.finish();
                p4.finish();
            }
        }
    }
    if want("oneway") {
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
}
