//! criterion benches of the TCP transport over loopback, each next to its
//! baseline measured in the same run on a raw loopback TCP socket pair
//! (`TCP_NODELAY`), with the client on CPU 1 and the server on CPU 0:
//!
//! * `rtt_{polling,blocking}/64B`: message round trip (the server's receive
//!   callback sends the message back) vs a raw TCP ping-pong in the same
//!   mode (busy-poll reads on a non-blocking socket, or blocking reads).
//!   Polling: the I/O threads spin 1 ms in `epoll_wait(0)` before blocking;
//!   blocking: they block at once.
//! * `oneway/64B`: a one-way stream of 64-byte messages (256 sends in
//!   flight, multi-message receive buffers) vs a raw TCP stream with one
//!   `write` per 64-byte message (busy-poll reads).
//! * `bulk_{read,write}/{1MiB,16MiB}`: active bulk receive (GET) and send
//!   (PUT) of passive buffers, two transfers in flight, polling I/O threads,
//!   vs a raw TCP stream of the same bytes (busy-poll writes and reads of
//!   whole buffers, cycling through as many buffers as the workload: see
//!   `colibri_bench::baseline::tcp_stream`).
//!
//! After criterion's own report, the ratio ours/baseline of the mean times
//! per iteration is printed for each pair. Run with
//! `cargo bench -p colibri-bulk-tcp`.

use std::time::Duration;

use colibri_bench::{BulkDir, PairConfig, baseline, fmt_size, ratios};
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use criterion::{BenchmarkId, Criterion, Throughput};

const CPUS: Option<(usize, usize)> = Some((1, 0));

fn cfg() -> PairConfig {
    PairConfig::mem().pinned(1, 0)
}

fn xprt(polling: bool) -> TcpTransport {
    TcpTransport::new(TcpConfig {
        spin: if polling {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        },
        ..TcpConfig::default()
    })
}

fn rtt(c: &mut Criterion) {
    for polling in [true, false] {
        let mode = if polling { "polling" } else { "blocking" };
        let mut g = c.benchmark_group(format!("rtt_{mode}"));
        g.measurement_time(Duration::from_secs(3));
        let x = xprt(polling);
        let size = 64;
        let label = fmt_size(size);
        let group = format!("rtt_{mode}/{label}");
        let mut w = colibri_bench::RoundTrip::new(&x, &cfg(), size).expect("pair");
        g.bench_function(BenchmarkId::new("colibri-tcp", &label), |b| {
            b.iter_custom(|n| {
                let t = w.run(n).expect("run");
                ratios::record(&group, "ours", t, n);
                t
            })
        });
        w.finish();
        g.bench_function(BenchmarkId::new("raw-tcp", &label), |b| {
            b.iter_custom(|n| {
                let t = baseline::tcp_round_trip(size, n, polling, CPUS);
                ratios::record(&group, "baseline", t, n);
                t
            })
        });
        g.finish();
    }
}

fn oneway(c: &mut Criterion) {
    let mut g = c.benchmark_group("oneway");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(1));
    let x = xprt(true);
    let mut w = colibri_bench::OneWay::new(&x, &cfg(), 64, 256).expect("pair");
    g.bench_function("colibri-tcp/64B", |b| {
        b.iter_custom(|n| {
            let t = w.run(n).expect("run");
            ratios::record("oneway/64B", "ours", t, n);
            t
        })
    });
    w.finish();
    g.bench_function("raw-tcp/64B", |b| {
        b.iter_custom(|n| {
            let t = baseline::tcp_one_way(64, n, true, CPUS);
            ratios::record("oneway/64B", "baseline", t, n);
            t
        })
    });
    g.finish();
}

fn bulk(c: &mut Criterion) {
    let x = xprt(true);
    for dir in [BulkDir::Read, BulkDir::Write] {
        let name = if dir == BulkDir::Read {
            "bulk_read"
        } else {
            "bulk_write"
        };
        let mut g = c.benchmark_group(name);
        g.measurement_time(Duration::from_secs(3));
        g.sample_size(10);
        for size in [1usize << 20, 16 << 20] {
            let label = fmt_size(size);
            g.throughput(Throughput::Bytes(size as u64));
            let mut w = colibri_bench::Bulk::new(&x, &cfg(), size, dir).expect("pair");
            let group = format!("{name}/{label}");
            g.bench_function(BenchmarkId::new("colibri-tcp", &label), |b| {
                b.iter_custom(|n| {
                    let t = w.run(n).expect("run");
                    ratios::record(&group, "ours", t, n);
                    t
                })
            });
            w.finish();
            g.bench_function(BenchmarkId::new("raw-tcp-stream", &label), |b| {
                b.iter_custom(|n| {
                    let t = baseline::tcp_stream(size, n, true, CPUS);
                    ratios::record(&group, "baseline", t, n);
                    t
                })
            });
        }
        g.finish();
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    rtt(&mut c);
    oneway(&mut c);
    bulk(&mut c);
    c.final_summary();
    ratios::print("client CPU 1, server CPU 0");
}
