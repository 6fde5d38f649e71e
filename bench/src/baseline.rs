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
//! * [`tcp_round_trip`], [`tcp_one_way`], [`tcp_stream`]: the same over a
//!   raw TCP socket pair on loopback (`TCP_NODELAY`), the baselines of the
//!   TCP transport. Polling mode reads a non-blocking socket in a spin
//!   loop (busy-poll); blocking mode blocks in `read`.

use std::hint::black_box;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
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

/// A connected pair of loopback TCP sockets with `TCP_NODELAY`, non-blocking
/// when `polling`.
fn tcp_pair(polling: bool) -> io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
        s.set_nonblocking(polling)?;
    }
    Ok((a, b))
}

/// Reads exactly `buf.len()` bytes, spinning on `WouldBlock`.
fn tcp_read_full(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf`, spinning on `WouldBlock`.
fn tcp_write_full(s: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn tcp_failed(e: &io::Error) -> ! {
    panic!("TCP baseline over loopback failed: {e}")
}

/// `iters` round trips of a `size`-byte message over a raw loopback TCP
/// socket pair, client and server threads on `cpus`; returns the total time.
pub fn tcp_round_trip(
    size: usize,
    iters: u64,
    polling: bool,
    cpus: Option<(usize, usize)>,
) -> Duration {
    let (mut c, mut s) = tcp_pair(polling).unwrap_or_else(|e| tcp_failed(&e));
    let server = thread::spawn(move || {
        pin(cpus.map(|c| c.1));
        let mut buf = vec![0u8; size];
        for _ in 0..iters {
            if tcp_read_full(&mut s, &mut buf).is_err() || tcp_write_full(&mut s, &buf).is_err() {
                break;
            }
        }
    });
    let client = thread::spawn(move || {
        pin(cpus.map(|c| c.0));
        let mut buf = vec![0x5au8; size];
        let start = Instant::now();
        for _ in 0..iters {
            tcp_write_full(&mut c, &buf).unwrap_or_else(|e| tcp_failed(&e));
            tcp_read_full(&mut c, &mut buf).unwrap_or_else(|e| tcp_failed(&e));
        }
        start.elapsed()
    });
    let t = client.join().unwrap_or_default();
    let _ = server.join();
    t
}

/// `count` messages of `size` bytes streamed over a raw loopback TCP socket,
/// one `write` per message, producer and consumer on `cpus`; returns the
/// time until the consumer read the last byte.
pub fn tcp_one_way(
    size: usize,
    count: u64,
    polling: bool,
    cpus: Option<(usize, usize)>,
) -> Duration {
    let (mut tx, mut rx) = tcp_pair(polling).unwrap_or_else(|e| tcp_failed(&e));
    let total = size as u64 * count;
    let consumer = thread::spawn(move || {
        pin(cpus.map(|c| c.1));
        let mut buf = vec![0u8; 64 << 10];
        let mut left = total;
        while left > 0 {
            let n = (buf.len() as u64).min(left) as usize;
            match rx.read(&mut buf[..n]) {
                Ok(0) => break,
                Ok(k) => left -= k as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => tcp_failed(&e),
            }
        }
        black_box(&buf);
        Instant::now()
    });
    let producer = thread::spawn(move || {
        pin(cpus.map(|c| c.0));
        let mut m = vec![0u8; size];
        let start = Instant::now();
        for i in 0..count {
            m[0] = i as u8;
            tcp_write_full(&mut tx, &m).unwrap_or_else(|e| tcp_failed(&e));
        }
        start
    });
    let start = producer.join().unwrap_or_else(|_| Instant::now());
    let end = consumer.join().unwrap_or_else(|_| Instant::now());
    end.saturating_duration_since(start)
}

/// `iters` transfers of `size` bytes streamed over a raw loopback TCP
/// socket (the whole buffer offered to `write` per transfer, `read`s
/// straight into a buffer of that size; busy-poll or blocking), writer and
/// reader on `cpus`; returns the time until the reader got the last byte.
///
/// The writer cycles through [`STREAM_SRC_BUFS`] buffers and the reader
/// through [`STREAM_DST_BUFS`], the numbers of buffers the
/// [`Bulk`](crate::Bulk) workload moves data between, so that both touch
/// the same amount of memory (with a single buffer on each side, 1 MiB
/// transfers stay in a 1 MiB L2 cache and stream up to twice as fast).
pub fn tcp_stream(
    size: usize,
    iters: u64,
    polling: bool,
    cpus: Option<(usize, usize)>,
) -> Duration {
    tcp_stream_bufs(size, iters, polling, cpus, STREAM_SRC_BUFS, STREAM_DST_BUFS)
}

/// Buffers the writer of [`tcp_stream`] cycles through (the server's
/// passive buffers of the [`Bulk`](crate::Bulk) workload).
pub const STREAM_SRC_BUFS: usize = 3;
/// Buffers the reader of [`tcp_stream`] cycles through (the client's
/// buffers of the [`Bulk`](crate::Bulk) workload).
pub const STREAM_DST_BUFS: usize = 2;

/// [`tcp_stream`] with a chosen number of source and destination buffers.
pub fn tcp_stream_bufs(
    size: usize,
    iters: u64,
    polling: bool,
    cpus: Option<(usize, usize)>,
    src_bufs: usize,
    dst_bufs: usize,
) -> Duration {
    let (mut tx, mut rx) = tcp_pair(polling).unwrap_or_else(|e| tcp_failed(&e));
    let reader = thread::spawn(move || {
        pin(cpus.map(|c| c.1));
        let mut bufs: Vec<Vec<u8>> = (0..dst_bufs.max(1)).map(|_| vec![0u8; size]).collect();
        let n = bufs.len();
        for i in 0..iters {
            let buf = &mut bufs[i as usize % n];
            tcp_read_full(&mut rx, buf).unwrap_or_else(|e| tcp_failed(&e));
        }
        black_box(&bufs);
        Instant::now()
    });
    let writer = thread::spawn(move || {
        pin(cpus.map(|c| c.0));
        let bufs: Vec<Vec<u8>> = (0..src_bufs.max(1)).map(|_| vec![0xa5u8; size]).collect();
        let start = Instant::now();
        for i in 0..iters {
            let buf = &bufs[i as usize % bufs.len()];
            tcp_write_full(&mut tx, buf).unwrap_or_else(|e| tcp_failed(&e));
        }
        start
    });
    let start = writer.join().unwrap_or_else(|_| Instant::now());
    let end = reader.join().unwrap_or_else(|_| Instant::now());
    end.saturating_duration_since(start)
}

/// How many `size`-byte buffers the relay of [`tcp_relay_stream`] cycles
/// through (a message can be read while up to this many minus one wait to
/// be written, as a router's buffers let it).
pub const RELAY_BUFS: usize = 4;

/// A raw user-space TCP relay: `iters` writes of `size` bytes from a
/// writer to a relay, which reads each message whole into one of its
/// [`RELAY_BUFS`] buffers and writes it on to a reader (a reader thread
/// and a writer thread, so reading one message overlaps writing the
/// previous one); the time from the first write to the last byte read.
/// Every byte crosses the loopback twice and is copied four times (the
/// [`tcp_stream`] baseline: twice): what a router that moves bytes
/// through user space can reach on this machine. No thread is pinned.
pub fn tcp_relay_stream(size: usize, iters: u64) -> Duration {
    let (mut tx, mut relay_in) = tcp_pair(false).unwrap_or_else(|e| tcp_failed(&e));
    let (mut relay_out, mut rx) = tcp_pair(false).unwrap_or_else(|e| tcp_failed(&e));
    let (full_tx, full_rx) = bounded::<Vec<u8>>(RELAY_BUFS);
    let (free_tx, free_rx) = bounded::<Vec<u8>>(RELAY_BUFS);
    for _ in 0..RELAY_BUFS {
        let _ = free_tx.send(vec![0u8; size]);
    }
    let relay_reader = thread::spawn(move || {
        for _ in 0..iters {
            let Ok(mut buf) = free_rx.recv() else { return };
            tcp_read_full(&mut relay_in, &mut buf).unwrap_or_else(|e| tcp_failed(&e));
            if full_tx.send(buf).is_err() {
                return;
            }
        }
    });
    let relay_writer = thread::spawn(move || {
        for _ in 0..iters {
            let Ok(buf) = full_rx.recv() else { return };
            tcp_write_full(&mut relay_out, &buf).unwrap_or_else(|e| tcp_failed(&e));
            let _ = free_tx.send(buf);
        }
    });
    let reader = thread::spawn(move || {
        let mut bufs: Vec<Vec<u8>> = (0..STREAM_DST_BUFS).map(|_| vec![0u8; size]).collect();
        for i in 0..iters {
            let buf = &mut bufs[i as usize % STREAM_DST_BUFS];
            tcp_read_full(&mut rx, buf).unwrap_or_else(|e| tcp_failed(&e));
        }
        black_box(&bufs);
        Instant::now()
    });
    let bufs: Vec<Vec<u8>> = (0..STREAM_SRC_BUFS).map(|_| vec![0xa5u8; size]).collect();
    let start = Instant::now();
    for i in 0..iters {
        let buf = &bufs[i as usize % STREAM_SRC_BUFS];
        tcp_write_full(&mut tx, buf).unwrap_or_else(|e| tcp_failed(&e));
    }
    let end = reader.join().unwrap_or_else(|_| Instant::now());
    let _ = relay_reader.join();
    let _ = relay_writer.join();
    end.saturating_duration_since(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_baselines_move_the_bytes() {
        for polling in [false, true] {
            assert!(tcp_round_trip(64, 50, polling, None) > Duration::ZERO);
            assert!(tcp_one_way(64, 500, polling, None) > Duration::ZERO);
        }
        assert!(tcp_stream(1 << 20, 4, false, None) > Duration::ZERO);
        assert!(tcp_stream(1 << 20, 4, true, None) > Duration::ZERO);
        assert!(tcp_relay_stream(1 << 20, 8) > Duration::ZERO);
    }
}
