//! Forwarded payloads held in kernel pipes, so that a router moves their
//! bytes from one socket to another with `splice(2)` and never copies them
//! through user space (`lnet_xprt/rt/DESIGN.md`, "Forwarding through
//! pipes").
//!
//! A router reads a large forwarded payload from its socket into a pipe
//! from the [`PipePool`] ([`Pipe::splice_in`]: the socket's pages are
//! linked into the pipe, not copied). To send it, the pipe's contents are
//! duplicated into a second pipe ([`Pipe::tee_into`], page references
//! again) and that one is spliced into the outgoing socket
//! ([`Pipe::splice_out`]): the held payload stays whole, so a forward that
//! fails half-way can be sent again, as a router buffer in memory can.
//! A pipe that goes back to the pool is emptied by splicing what is left
//! into `/dev/null` (page references dropped, no copy).
//!
//! Every pipe is non-blocking and every call here returns
//! [`io::ErrorKind::WouldBlock`] instead of waiting.

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// What one pipe holds: LNet's largest payload (`LNET_MTU`, 1 MiB). The
/// default `/proc/sys/fs/pipe-max-size`, so any user may ask for it.
pub const PIPE_BYTES: usize = 1 << 20;

/// Forwarded payloads shorter than this are read into memory: for them a
/// copy costs less than the extra system calls of a pipe.
pub(crate) const SPLICE_MIN: usize = 32 * 1024;

/// Pipes a pool hands out to send from, beyond its limit for held
/// payloads: a send without one takes the held payload itself.
const SEND_SPARE: usize = 16;

fn cvt(rc: isize) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        // Non-negative: fits.
        Ok(rc.unsigned_abs())
    }
}

/// A non-blocking pipe (of [`PIPE_BYTES`] unless a test asks for less).
#[derive(Debug)]
pub(crate) struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
}

impl Pipe {
    /// A new pipe, sized to hold `bytes` (an error if the system refuses:
    /// `pipe-max-size` lowered, or the user's pipe pages spent). Twice
    /// that where the system allows it (a privileged process, or a raised
    /// `pipe-max-size`): a pipe has a slot per page, and a payload whose
    /// pages came in pieces smaller than a page needs more slots than its
    /// bytes fill.
    pub(crate) fn new(bytes: usize) -> io::Result<Self> {
        let mut fds: [libc::c_int; 2] = [0; 2];
        // SAFETY: `fds` is an array of two ints for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by
        // nothing else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = libc::c_int::try_from(bytes).map_err(io::Error::other)?;
        let set = |n: libc::c_int| {
            // SAFETY: F_SETPIPE_SZ on an open pipe descriptor, with an int.
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, n) }
        };
        let mut got = set(want.saturating_mul(2));
        if got < 0 {
            got = set(want);
        }
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if got < want {
            return Err(io::Error::other("pipe smaller than asked for"));
        }
        Ok(Self { r, w })
    }

    /// Moves up to `len` bytes from socket `fd` into the pipe (page
    /// references, not copies). `WouldBlock` when the socket is empty or
    /// the pipe full ([`socket_has_bytes`] tells which); `Ok(0)` at the
    /// socket's end.
    pub(crate) fn splice_in(&self, fd: RawFd, len: usize) -> io::Result<usize> {
        // SAFETY: both descriptors are open; null offsets (sockets and
        // pipes have none).
        let rc = unsafe {
            libc::splice(
                fd,
                std::ptr::null_mut(),
                self.w.as_raw_fd(),
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        cvt(rc)
    }

    /// Writes `bytes` into the pipe (a copy: bytes a read took ahead).
    pub(crate) fn write_in(&self, bytes: &[u8]) -> io::Result<usize> {
        // SAFETY: `bytes` is valid for reads of its length; the descriptor
        // is open.
        let rc = unsafe { libc::write(self.w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        cvt(rc)
    }

    /// Moves up to `len` bytes from the pipe into socket `fd` (page
    /// references). `WouldBlock` when the socket is full.
    pub(crate) fn splice_out(&self, fd: RawFd, len: usize) -> io::Result<usize> {
        // SAFETY: both descriptors are open; null offsets.
        let rc = unsafe {
            libc::splice(
                self.r.as_raw_fd(),
                std::ptr::null_mut(),
                fd,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        cvt(rc)
    }

    /// Duplicates the first `len` bytes this pipe holds into `other`,
    /// leaving them here: how many were duplicated.
    pub(crate) fn tee_into(&self, other: &Pipe, len: usize) -> io::Result<usize> {
        // SAFETY: both descriptors are open pipe ends.
        let rc = unsafe {
            libc::tee(
                self.r.as_raw_fd(),
                other.w.as_raw_fd(),
                len,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        cvt(rc)
    }

    /// Reads what the pipe holds into `buf` (a copy).
    pub(crate) fn read_out(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length; the descriptor
        // is open.
        let rc = unsafe { libc::read(self.r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        cvt(rc)
    }

    /// Bytes the pipe holds.
    pub(crate) fn held(&self) -> io::Result<usize> {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on an open pipe descriptor writes one int.
        let rc = unsafe { libc::ioctl(self.r.as_raw_fd(), libc::FIONREAD, &mut n) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Copies the first `len` bytes the pipe holds into a vector, leaving
    /// them in the pipe (through a spare pipe from `pool`).
    pub(crate) fn copy_out(&self, pool: &Arc<PipePool>, len: usize) -> Option<Vec<u8>> {
        let spare = pool.take_for_send()?;
        if self.tee_into(&spare, len).ok()? != len {
            return None;
        }
        let mut v = vec![0; len];
        let mut done = 0;
        while done < len {
            match spare.read_out(&mut v[done..]) {
                Ok(0) | Err(_) => return None,
                Ok(k) => done += k,
            }
        }
        Some(v)
    }
}

/// Whether socket `fd` has bytes to read (a one-byte peek): after a
/// splice into a pipe would block, says whether the pipe is full.
pub(crate) fn socket_has_bytes(fd: RawFd) -> bool {
    let mut b = 0u8;
    // SAFETY: one byte of valid memory; the descriptor is open.
    let rc = unsafe {
        libc::recv(
            fd,
            (&raw mut b).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    rc > 0
}

/// Sends `bytes` to socket `fd` telling the kernel that more follows
/// (`MSG_MORE`: a header goes out with the payload spliced after it).
pub(crate) fn send_more(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is valid for reads of its length; the descriptor is
    // open.
    let rc = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_MORE | libc::MSG_NOSIGNAL,
        )
    };
    cvt(rc)
}

/// The runtime's pipes: at most `limit` hold payloads at once (each is two
/// descriptors and, while full, 1 MiB of pages), a few more are lent to
/// sends; free ones are kept for reuse.
#[derive(Debug)]
pub(crate) struct PipePool {
    free: Mutex<Vec<Pipe>>,
    /// Pipes handed out and not back.
    out: AtomicUsize,
    limit: usize,
    /// Size of each pipe.
    bytes: usize,
    /// `/dev/null`, where a pipe going back is emptied.
    null: Option<File>,
}

impl PipePool {
    /// A pool lending at most `limit` pipes of `bytes` for payloads (0:
    /// none, the runtime forwards through memory).
    pub(crate) fn new(limit: usize, bytes: usize) -> Arc<Self> {
        let null = if limit > 0 {
            File::options().write(true).open("/dev/null").ok()
        } else {
            None
        };
        Arc::new(Self {
            free: Mutex::new(Vec::new()),
            out: AtomicUsize::new(0),
            // Without /dev/null a pipe cannot be emptied cheaply: no pipes.
            limit: if null.is_some() { limit } else { 0 },
            bytes,
            null,
        })
    }

    /// Whether payloads may be held in pipes at all.
    pub(crate) fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// A pipe to hold a payload, unless `limit` are out or one cannot be
    /// made.
    pub(crate) fn take(self: &Arc<Self>) -> Option<PooledPipe> {
        self.take_below(self.limit)
    }

    /// A pipe to send a held payload from (a few beyond the limit).
    pub(crate) fn take_for_send(self: &Arc<Self>) -> Option<PooledPipe> {
        if !self.enabled() {
            return None;
        }
        self.take_below(self.limit + SEND_SPARE)
    }

    fn take_below(self: &Arc<Self>, most: usize) -> Option<PooledPipe> {
        let before = self.out.fetch_add(1, Ordering::AcqRel);
        if before >= most {
            self.out.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let pipe = self
            .free
            .lock()
            .pop()
            .map_or_else(|| Pipe::new(self.bytes), Ok);
        match pipe {
            Ok(p) => Some(PooledPipe {
                pipe: Some(p),
                pool: Arc::clone(self),
            }),
            Err(e) => {
                self.out.fetch_sub(1, Ordering::AcqRel);
                tracing::debug!(target: "colibri_lnet_rt::socklnd", error = %e,
                    "no pipe for a forwarded payload; it goes through memory");
                None
            }
        }
    }

    /// Takes a pipe back, emptied; one that cannot be emptied is closed.
    fn put(&self, p: Pipe) {
        self.out.fetch_sub(1, Ordering::AcqRel);
        let Some(null) = &self.null else { return };
        loop {
            match p.held() {
                Ok(0) => break,
                Ok(n) => {
                    if !matches!(p.splice_out(null.as_raw_fd(), n), Ok(k) if k > 0) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        let mut free = self.free.lock();
        if free.len() < self.limit {
            free.push(p);
        }
    }

    /// Pipes handed out and not back (tests).
    #[cfg(test)]
    pub(crate) fn out(&self) -> usize {
        self.out.load(Ordering::Acquire)
    }
}

/// A pipe lent by a [`PipePool`], which takes it back (emptied) when it is
/// dropped.
#[derive(Debug)]
pub(crate) struct PooledPipe {
    pipe: Option<Pipe>,
    pool: Arc<PipePool>,
}

impl Deref for PooledPipe {
    type Target = Pipe;

    fn deref(&self) -> &Pipe {
        // Only `drop` takes it out.
        self.pipe.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        if let Some(p) = self.pipe.take() {
            self.pool.put(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_payload_goes_socket_to_pipe_to_socket_and_stays_held_for_another_send() {
        let pool = PipePool::new(2, PIPE_BYTES);
        let (mut tx, rx) = pair();
        let (out_a, mut out_b) = pair();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        tx.write_all(&data).unwrap();
        rx.set_nonblocking(true).unwrap();
        let held = pool.take().unwrap();
        let mut got = 0;
        while got < data.len() {
            match held.splice_in(rx.as_raw_fd(), data.len() - got) {
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(held.held().unwrap(), data.len());
        assert!(!socket_has_bytes(rx.as_raw_fd()));
        // Twice: each send goes from a duplicate, the held payload stays.
        for _ in 0..2 {
            let send = pool.take_for_send().unwrap();
            assert_eq!(held.tee_into(&send, data.len()).unwrap(), data.len());
            let reader = {
                let mut b = out_b.try_clone().unwrap();
                let n = data.len();
                std::thread::spawn(move || {
                    let mut v = vec![0; n];
                    b.read_exact(&mut v).unwrap();
                    v
                })
            };
            let mut sent = 0;
            while sent < data.len() {
                sent += send
                    .splice_out(out_a.as_raw_fd(), data.len() - sent)
                    .unwrap();
            }
            assert_eq!(reader.join().unwrap(), data);
            assert_eq!(held.held().unwrap(), data.len());
        }
        assert_eq!(held.copy_out(&pool, 1000).unwrap(), data[..1000]);
        assert_eq!(pool.out(), 1);
        // Back to the pool emptied, and lent again.
        drop(held);
        assert_eq!(pool.out(), 0);
        let again = pool.take().unwrap();
        assert_eq!(again.held().unwrap(), 0);
        out_b.set_nonblocking(true).unwrap();
        assert!(out_b.read(&mut [0; 1]).is_err(), "nothing more was sent");
    }

    #[test]
    fn the_pool_lends_at_most_its_limit_for_payloads_and_a_few_more_for_sends() {
        let pool = PipePool::new(2, PIPE_BYTES);
        let a = pool.take().unwrap();
        let _b = pool.take().unwrap();
        assert!(pool.take().is_none());
        let sends: Vec<_> = (0..SEND_SPARE)
            .map(|_| pool.take_for_send().unwrap())
            .collect();
        assert!(pool.take_for_send().is_none());
        drop(sends);
        drop(a);
        assert!(pool.take().is_some());
        let off = PipePool::new(0, PIPE_BYTES);
        assert!(!off.enabled());
        assert!(off.take().is_none() && off.take_for_send().is_none());
    }

    #[test]
    fn bytes_written_in_and_read_out() {
        let pool = PipePool::new(1, PIPE_BYTES);
        let p = pool.take().unwrap();
        assert_eq!(p.write_in(b"hello").unwrap(), 5);
        let mut b = [0; 8];
        assert_eq!(p.read_out(&mut b).unwrap(), 5);
        assert_eq!(&b[..5], b"hello");
        assert_eq!(
            p.read_out(&mut b).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }
}
