//! Baselines, measured in the same process and placement as the workloads.
//!
//! * [`channel_round_trip`]: two threads ping-pong a message through a pair
//!   of crossbeam channels, each copying the message's bytes once per hop
//!   (as a transport does). Polling mode spins on `try_recv`; blocking mode
//!   uses rendezvous channels (`bounded(0)`), whose hand-off parks the
//!   receiving thread.
//! * [`channel_one_way`]: one thread streams 64-byte messages to another
//!   through a `bounded(1024)` crossbeam channel.
//! * [`memcpy`]: single-thread copy of `size` bytes between two buffers.

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded};

/// Pins the calling thread to `cpu` (ignored when `None` or impossible).
pub fn pin(cpu: Option<usize>) {
    if let Some(id) = cpu {
        let _ = core_affinity::set_for_current(core_affinity::CoreId { id });
    }
}

fn recv_spin<T>(rx: &Receiver<T>) -> Option<T> {
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
            Err(TryRecvError::Disconnected) => return None,
        }
    }
}

fn recv<T>(rx: &Receiver<T>, polling: bool) -> Option<T> {
    if polling {
        recv_spin(rx)
    } else {
        rx.recv().ok()
    }
}

/// `iters` round trips of a `size`-byte message between two threads on
/// `cpus` (client, server); returns the total time.
pub fn channel_round_trip(
    size: usize,
    iters: u64,
    polling: bool,
    cpus: Option<(usize, usize)>,
) -> Duration {
    let cap = usize::from(polling);
    let (to_srv, srv_rx): (Sender<Vec<u8>>, Receiver<Vec<u8>>) = bounded(cap);
    let (to_cli, cli_rx): (Sender<Vec<u8>>, Receiver<Vec<u8>>) = bounded(cap);
    let server = thread::spawn(move || {
        pin(cpus.map(|c| c.1));
        let mut mine = vec![0u8; size];
        while let Some(msg) = recv(&srv_rx, polling) {
            mine.copy_from_slice(&msg);
            black_box(&mine);
            if to_cli.send(msg).is_err() {
                break;
            }
        }
    });
    let client = thread::spawn(move || {
        pin(cpus.map(|c| c.0));
        let src = vec![0x5au8; size];
        let mut msg = vec![0u8; size];
        let start = Instant::now();
        for _ in 0..iters {
            msg.copy_from_slice(&src);
            if to_srv.send(msg).is_err() {
                break;
            }
            match recv(&cli_rx, polling) {
                Some(m) => msg = m,
                None => break,
            }
        }
        start.elapsed()
    });
    let t = client.join().unwrap_or_default();
    let _ = server.join();
    t
}

/// `count` 64-byte messages streamed from one thread to another on `cpus`
/// (producer, consumer); returns the time until the consumer got the last.
pub fn channel_one_way(count: u64, polling: bool, cpus: Option<(usize, usize)>) -> Duration {
    let (tx, rx): (Sender<[u8; 64]>, Receiver<[u8; 64]>) = bounded(1024);
    let consumer = thread::spawn(move || {
        pin(cpus.map(|c| c.1));
        let mut n = 0u64;
        let mut sum = 0u64;
        while n < count {
            match recv(&rx, polling) {
                Some(m) => {
                    sum = sum.wrapping_add(u64::from(m[0]));
                    n += 1;
                }
                None => break,
            }
        }
        black_box(sum);
        Instant::now()
    });
    let producer = thread::spawn(move || {
        pin(cpus.map(|c| c.0));
        let start = Instant::now();
        let mut m = [0u8; 64];
        for i in 0..count {
            m[0] = i as u8;
            if tx.send(m).is_err() {
                break;
            }
        }
        start
    });
    let start = producer.join().unwrap_or_else(|_| Instant::now());
    let end = consumer.join().unwrap_or_else(|_| Instant::now());
    end.saturating_duration_since(start)
}

/// `iters` copies of `size` bytes; returns the total time.
pub fn memcpy(size: usize, iters: u64) -> Duration {
    let src = vec![0xa5u8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    start.elapsed()
}
