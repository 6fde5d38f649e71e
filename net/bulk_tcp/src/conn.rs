//! One TCP connection: its socket and its protocol state. This file only
//! moves bytes: it writes what the protocol ([`Proto`]) describes with one
//! vectored write straight from the registered buffers, and reads with one
//! vectored read straight into the buffer the protocol names (then into
//! the read buffer, so that the next headers arrive in the same call).
//! Everything runs on the I/O thread that owns the connection, without any
//! transport lock.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::SocketAddrV4;
use std::time::Instant;

use colibri_net::{BufToken, BufVec, NetError, Result};
use colibri_wire::gather::Pieces;
use mio::net::TcpStream;
use parking_lot::MappedMutexGuard;
use smallvec::SmallVec;

use crate::engine::Stats;
use crate::proto::{Directory, Proto};
use crate::tm::TmShared;

/// Most frames gathered into one `writev`.
const MAX_BATCH: usize = 64;
/// Most bytes gathered into one `writev`.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Most slices in one `writev` (beyond it the call is cut short).
const MAX_IOV: usize = 512;
/// Writes `iov` to `sock`, as one piece when it is several small ones
/// ([`colibri_wire::gather`]). MSG_NOSIGNAL: a peer that reset the
/// connection must not kill a process that did not ignore SIGPIPE.
fn send_iov(sock: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    let sr = socket2::SockRef::from(sock);
    colibri_wire::gather::gathered(iov, |p| match p {
        Pieces::One(b) => sr.send_with_flags(b, libc::MSG_NOSIGNAL),
        Pieces::Many(v) => sr.send_vectored_with_flags(v, libc::MSG_NOSIGNAL),
    })
}

/// Outcome of reading a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Open,
    Eof,
}

/// A connection: a socket and the protocol spoken on it.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) sock: TcpStream,
    pub(crate) peer: SocketAddrV4,
    pub(crate) proto: Proto<TmShared>,
}

fn reset(e: &io::Error) -> NetError {
    NetError::ConnectionReset(e.to_string())
}

impl Conn {
    pub(crate) fn new(sock: TcpStream, peer: SocketAddrV4, proto: Proto<TmShared>) -> Self {
        Self { sock, peer, proto }
    }

    /// Writes queued frames until done or the socket is full; `now` is the
    /// I/O thread's time for this turn of its loop.
    pub(crate) fn flush(&mut self, now: Instant) -> Result<()> {
        while self.proto.has_output() && self.proto.is_connected() {
            let r = {
                // Lock the memory of the frames of this batch: each buffer
                // once (the batch stops at a repeat).
                // Inline vectors: a request and its answer (the usual
                // batch) need no allocation.
                let mut guards: SmallVec<[Option<MappedMutexGuard<'_, BufVec>>; 4]> =
                    SmallVec::new();
                let mut locked: SmallVec<[BufToken; 4]> = SmallVec::new();
                let mut bytes = 0;
                for out in self.proto.to_write().take(MAX_BATCH) {
                    if let Some(q) = out.buf() {
                        let t = q.token();
                        if locked.contains(&t) {
                            break;
                        }
                        locked.push(t);
                        guards.push(Some(q.data().ok_or_else(|| {
                            NetError::Protocol("buffer handed back while being sent".into())
                        })?));
                    } else {
                        guards.push(None);
                    }
                    bytes += out.left;
                    if bytes >= MAX_BATCH_BYTES {
                        break;
                    }
                }
                let mut iov: SmallVec<[IoSlice<'_>; 12]> = SmallVec::new();
                for (out, g) in self.proto.to_write().zip(guards.iter()) {
                    out.slices(g.as_deref(), &mut iov)?;
                    if iov.len() >= MAX_IOV {
                        break;
                    }
                }
                send_iov(&self.sock, &iov)
            };
            match r {
                Ok(0) => return Err(NetError::ConnectionReset("write returned 0".into())),
                Ok(n) => self.proto.written(n, now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.proto.write_blocked(now);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset(&e)),
            }
        }
        Ok(())
    }

    /// Reads and processes everything available, delivering requests to
    /// the transfer machines of `dir`.
    ///
    /// A read that returns less than it asked for drained the socket: the
    /// next arrival raises a new edge, so no second `read` is spent on
    /// `EAGAIN`. With `closed` (the event reported the peer's FIN or an
    /// error, which raises no further edge) it reads on until end of file.
    ///
    /// The read buffer comes from `rbufs` and goes back to it once
    /// everything read is processed, so that connections between reads
    /// (idle ones above all) hold none. `now` is the I/O thread's time for
    /// this turn of its loop.
    pub(crate) fn on_readable(
        &mut self,
        stats: &Stats,
        dir: &impl Directory<TmShared>,
        closed: bool,
        rbufs: &mut RbufPool,
        now: Instant,
    ) -> Result<Flow> {
        if self.proto.needs_rbuf()
            && let Some(b) = rbufs.free.pop()
        {
            self.proto.give_rbuf(b);
        }
        let flow = self.read_all(stats, dir, closed, now);
        if let Some(b) = self.proto.take_idle_rbuf()
            && rbufs.free.len() < RbufPool::KEEP
        {
            rbufs.free.push(b);
        }
        flow
    }

    fn read_all(
        &mut self,
        stats: &Stats,
        dir: &impl Directory<TmShared>,
        closed: bool,
        now: Instant,
    ) -> Result<Flow> {
        loop {
            match self.read_some() {
                Ok((0, _)) => return Ok(Flow::Eof),
                Ok((n, full)) => {
                    stats.add_rx(n);
                    self.proto.received(n, now, dir)?;
                    if !full && !closed {
                        return Ok(Flow::Open);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset(&e)),
            }
        }
    }

    /// Reads once where the protocol says; returns the bytes read and
    /// whether the read filled all the space it was given.
    fn read_some(&mut self) -> io::Result<(usize, bool)> {
        let space = self.proto.recv_space();
        let Some(d) = space.direct else {
            let asked = space.spare.len();
            let n = self.sock.read(space.spare)?;
            return Ok((n, n == asked));
        };
        let Some(mut bv) = d.buf.data() else {
            return Err(io::Error::other("buffer handed back while being read into"));
        };
        let mut iov: Vec<IoSliceMut<'_>> = bv
            .io_slices_mut(d.off, d.len)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let asked = d.len + space.spare.len();
        iov.push(IoSliceMut::new(space.spare));
        let n = self.sock.read_vectored(&mut iov)?;
        Ok((n, n == asked))
    }
}

/// Read buffers not lent to a connection (one per I/O thread): a
/// connection borrows one for a read and gives it back once it has
/// processed everything it read.
#[derive(Debug, Default)]
pub(crate) struct RbufPool {
    free: Vec<Vec<u8>>,
}

impl RbufPool {
    /// Buffers kept (more are freed): enough for the connections one
    /// step reads from at once.
    const KEEP: usize = 16;
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read};

    use colibri_wire::gather::GATHER_MAX;

    use super::send_iov;

    /// Writes of several small pieces (copied into one) and of large ones
    /// (vectored) into a socket that nobody reads fill it, are cut short,
    /// and what each reported written arrives in order.
    #[test]
    fn writes_cut_short_report_what_went() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let sr = socket2::SockRef::from(&tx);
        sr.set_send_buffer_size(4096).unwrap();
        tx.set_nonblocking(true).unwrap();
        let tx = mio::net::TcpStream::from_std(tx);
        let pieces: Vec<Vec<u8>> = (0..3u8)
            .map(|k| {
                (0..(100 + 50 * usize::from(k)))
                    .map(|i| (i as u8) ^ k)
                    .collect()
            })
            .collect();
        let big: Vec<u8> = (0..GATHER_MAX + 1).map(|i| (i % 251) as u8).collect();
        let (mut sent, mut wrote) = (Vec::new(), 0);
        for round in 0..10_000 {
            let iov: Vec<IoSlice<'_>> = if round % 7 == 6 {
                vec![IoSlice::new(&big[..10]), IoSlice::new(&big[10..])]
            } else {
                pieces.iter().map(|p| IoSlice::new(p)).collect()
            };
            let total: usize = iov.iter().map(|s| s.len()).sum();
            let all: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
            match send_iov(&tx, &iov) {
                Ok(n) => {
                    sent.extend_from_slice(&all[..n]);
                    wrote += 1;
                    if n < total {
                        // Cut short: the socket is full.
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(wrote > 1, "nothing written");
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes out of order or damaged");
    }
}
