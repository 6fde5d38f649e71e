//! criterion benches of the in-memory transport, each next to its baseline
//! measured in the same run:
//!
//! * `rtt/{64B,4KiB}`: message round trip vs a crossbeam channel ping-pong
//!   (polling workers, client on CPU 1, server on CPU 0);
//! * `oneway/64B`: one-way message stream vs a crossbeam channel stream;
//! * `bulk_read/{64KiB,1MiB,16MiB}`: active bulk receive vs memcpy.
//!
//! After criterion's own report, the ratio ours/baseline of the mean times
//! per iteration is printed for each pair. Run with
//! `cargo bench -p colibri-bulk-mem`.

use std::time::Duration;

use colibri_bench::{BulkDir, PairConfig, baseline, fmt_size, ratios};
use colibri_bulk_mem::{MemConfig, MemTransport};
use criterion::{BenchmarkId, Criterion, Throughput};

const CPUS: Option<(usize, usize)> = Some((1, 0));

fn cfg() -> PairConfig {
    PairConfig::mem().pinned(1, 0)
}

fn rtt(c: &mut Criterion, xprt: &MemTransport) {
    let mut g = c.benchmark_group("rtt");
    g.measurement_time(Duration::from_secs(3));
    for size in [64usize, 4096] {
        let label = fmt_size(size);
        let mut w = colibri_bench::RoundTrip::new(xprt, &cfg(), size).expect("pair");
        let group = format!("rtt/{label}");
        g.bench_function(BenchmarkId::new("colibri-mem", &label), |b| {
            b.iter_custom(|n| {
                let t = w.run(n).expect("run");
                ratios::record(&group, "ours", t, n);
                t
            })
        });
        w.finish();
        g.bench_function(BenchmarkId::new("crossbeam", &label), |b| {
            b.iter_custom(|n| {
                let t = baseline::channel_round_trip(size, n, true, CPUS);
                ratios::record(&group, "baseline", t, n);
                t
            })
        });
    }
    g.finish();
}

fn oneway(c: &mut Criterion, xprt: &MemTransport) {
    let mut g = c.benchmark_group("oneway");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    let mut w = colibri_bench::OneWay::new(xprt, &cfg(), 64, 256).expect("pair");
    g.bench_function("colibri-mem/64B", |b| {
        b.iter_custom(|n| {
            let t = w.run(n).expect("run");
            ratios::record("oneway/64B", "ours", t, n);
            t
        })
    });
    w.finish();
    g.bench_function("crossbeam/64B", |b| {
        b.iter_custom(|n| {
            let t = baseline::channel_one_way(n, true, CPUS);
            ratios::record("oneway/64B", "baseline", t, n);
            t
        })
    });
    g.finish();
}

fn bulk(c: &mut Criterion, xprt: &MemTransport) {
    let mut g = c.benchmark_group("bulk_read");
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(20);
    for size in [64usize << 10, 1 << 20, 16 << 20] {
        let label = fmt_size(size);
        g.throughput(Throughput::Bytes(size as u64));
        let mut w = colibri_bench::Bulk::new(xprt, &cfg(), size, BulkDir::Read).expect("pair");
        let group = format!("bulk_read/{label}");
        g.bench_function(BenchmarkId::new("colibri-mem", &label), |b| {
            b.iter_custom(|n| {
                let t = w.run(n).expect("run");
                ratios::record(&group, "ours", t, n);
                t
            })
        });
        w.finish();
        g.bench_function(BenchmarkId::new("memcpy", &label), |b| {
            b.iter_custom(|n| {
                let t = baseline::memcpy(size, n);
                ratios::record(&group, "baseline", t, n);
                t
            })
        });
    }
    g.finish();
}

fn main() {
    let xprt = MemTransport::new(MemConfig::polling());
    let mut c = Criterion::default().configure_from_args();
    rtt(&mut c, &xprt);
    oneway(&mut c, &xprt);
    bulk(&mut c, &xprt);
    c.final_summary();
    ratios::print("polling workers, client CPU 1, server CPU 0");
}
