//! A scheduler thread: owns its connections' sockets, writes each message
//! with one vectored write straight from where its payload is, and reads
//! headers, then the payload straight into the place the node names (on a
//! connection of small messages, one read takes a message and those after
//! it, and small payloads are copied from there).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use colibri_lnet::credits::PoolKind;
use colibri_lnet::fault::HealthError;
use colibri_lnet::nidmap::KeyedMap;
use colibri_lnet::node::{Payload, PayloadOutcome, RxAction, RxId};
use colibri_lnet::socklnd::frame::{KSOCK_MSG_HDR_LEN, LNET_FRAME_HDR_LEN};
use colibri_lnet::socklnd::{
    ConnId, ConnType, Crc32, Frame, FrameReceiver, KsockMsgHeader, SocketError, TxFailure, Want,
    payload_checksum,
};
use colibri_lnet::time::Time;
use colibri_wire::gather::Pieces;
use crossbeam_channel::Receiver;

use super::{Conn, SockLnd, TARGET, TxItem};
use crate::core::{Input, Shared, health_error};
use crate::mem::{Held, Resolved, RouterBuf};
use crate::splice::{Pipe, PooledPipe, SPLICE_MIN, send_more, socket_has_bytes};
use crate::stats::add;

/// The scheduler's waker token.
pub(super) const WAKER: mio::Token = mio::Token(usize::MAX);

/// Scratch space for discarded payload bytes and reads ahead.
const SCRATCH: usize = 64 * 1024;

/// Most bytes one read takes at a message boundary of a connection of
/// small messages (CONTROL or untyped): a small message (below `min_bulk`,
/// 1 KiB by default) and those after it arrive with one system call, and
/// their payloads are copied from there (`RuntimeStats::eager_copy_bytes`).
const READ_AHEAD: usize = 4096;

/// While a scheduler spins, it reads its hot connection on every turn and
/// asks epoll about the others every `SKIP_EPOLL + 1`th turn.
const SKIP_EPOLL: u32 = 3;

/// Reads with bytes on the hot connection, and none on another, since the
/// scheduler last blocked, before it leaves the epoll set
/// ([`Scheduler::detach_hot`]).
const DETACH_STREAK: u32 = 4;

/// Schedulers of every runtime of the process that are spinning now.
static SPINNERS: AtomicUsize = AtomicUsize::new(0);

/// A scheduler's place among [`SPINNERS`] while it spins. With no more
/// spinning schedulers than CPUs, three empty turns in four only pause
/// the CPU (a `sched_yield` costs a trip through the kernel's scheduler,
/// and the bytes that arrive meanwhile wait for it) and the fourth
/// yields; with more, every empty turn yields, so that a thread with work
/// (another node's scheduler in the same process, an application thread)
/// is not kept off a CPU by one that only looks. The count is the
/// process's: the periodic yield is for spinners it cannot see (another
/// process's schedulers on the same CPUs, such as a router beside its
/// client and server on a small machine).
struct Spinner {
    on: bool,
    cpus: usize,
    /// Empty turns so far.
    empty: u32,
}

impl Default for Spinner {
    fn default() -> Self {
        Self {
            on: false,
            empty: 0,
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        }
    }
}

impl Spinner {
    fn set(&mut self, on: bool) {
        if on != self.on {
            self.on = on;
            if on {
                SPINNERS.fetch_add(1, Ordering::Relaxed);
            } else {
                SPINNERS.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// An empty turn while spinning.
    fn pause(&mut self) {
        self.empty = self.empty.wrapping_add(1);
        if SPINNERS.load(Ordering::Relaxed) > self.cpus || self.empty.is_multiple_of(4) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Bytes read from a socket ahead of their use: `lo..hi` of the
/// scheduler's scratch buffer.
#[derive(Clone, Copy, Debug, Default)]
struct Ahead {
    lo: usize,
    hi: usize,
}

impl Ahead {
    fn len(self) -> usize {
        self.hi - self.lo
    }

    fn is_empty(self) -> bool {
        self.lo == self.hi
    }
}

/// Commands to a scheduler.
pub(crate) enum SchedCmd {
    /// A new connection, handshaken.
    Add(Arc<Conn>, Box<std::net::TcpStream>, Box<FrameReceiver>),
    /// Messages were queued on an idle connection.
    Kick(ConnId),
    /// A parked message's payload may now be read.
    Resume(ConnId, RxId, RxAction),
    /// Close with this reason.
    Close(ConnId, String),
    /// A write by another thread failed: close (what was being written
    /// is in the connection's hand-off).
    CloseWrite(ConnId, CloseWhy),
    /// Close everything and stop.
    Stop,
}

/// Where the payload being read goes.
enum Dest {
    /// Caller memory (a range of a registered region).
    Mem(Resolved),
    /// A router buffer being filled: its first `usize` bytes (the buffer
    /// may be longer).
    Router(Vec<u8>, PoolKind, usize),
    /// A forwarded payload spliced into a pipe: its first `usize` bytes
    /// (`crate::splice`).
    Pipe(PooledPipe, PoolKind, usize),
    /// LNet's own bytes.
    Inline(Vec<u8>),
    /// Nowhere (discarded).
    None,
}

impl Dest {
    fn len(&self) -> usize {
        match self {
            Self::Mem(r) => r.len,
            Self::Router(_, _, len) | Self::Pipe(_, _, len) => *len,
            Self::Inline(v) => v.len(),
            Self::None => 0,
        }
    }
}

/// A payload being read.
struct PayloadRx {
    rx: Option<RxId>,
    dest: Dest,
    /// Bytes of `dest` filled.
    done: usize,
    /// Bytes of the payload read (into `dest` or discarded).
    read: usize,
    /// Payload length on the wire.
    total: usize,
    /// The payload carries a checksum and is kept whole (so it is checked).
    whole: bool,
    /// The destination's memory went away half-way (the application took
    /// its buffer back): the rest is read and dropped, the message fails.
    lost: bool,
}

enum RxStage {
    /// Reading headers.
    Header,
    /// Reading a payload.
    Payload(PayloadRx),
    /// The node parked the message: read nothing.
    Parked(RxId),
}

/// A message being written.
pub(crate) struct TxProgress {
    item: TxItem,
    src: Src,
    written: usize,
}

/// Where an outgoing payload is.
enum Src {
    None,
    Mem(Resolved),
    Router(RouterBuf, usize),
    /// A router buffer held in a pipe (`Held::Pipe`), `usize` bytes, sent
    /// from a duplicate of it (`None`: from the held pipe itself, which
    /// the send empties).
    Pipe(RouterBuf, usize, Option<PooledPipe>),
    /// The message's own inline bytes.
    Inline,
}

struct SchedConn {
    conn: Arc<Conn>,
    stream: mio::net::TcpStream,
    fr: FrameReceiver,
    hdr: [u8; 96],
    hdr_have: usize,
    /// Bytes read ahead that belong after a parked message (empty unless
    /// the connection is parked, or just resumed).
    stash: Vec<u8>,
    /// The message being read carries a payload checksum.
    csum: bool,
    /// Large forwarded payloads from this connection put into pipes, and
    /// those of them that did not fit half-way (their pages came in more
    /// pieces than a pipe has slots) and were moved to memory: splicing
    /// stops when more than a quarter spill ([`SchedConn::may_splice`]).
    splice_tries: u32,
    splice_spills: u32,
    rx: RxStage,
    tx: Option<TxProgress>,
}

impl SchedConn {
    /// Whether a large forwarded payload from this connection may go into
    /// a pipe: unless more than a quarter of those tried spilled (the
    /// first few may all spill). A spill costs the splice and then the
    /// copy it meant to save.
    fn may_splice(&self) -> bool {
        self.splice_spills.saturating_mul(4) <= self.splice_tries.saturating_add(4)
    }
}

/// Why a connection ends.
pub(crate) struct CloseWhy {
    reason: String,
    err: SocketError,
    /// A write failed (rather than the connection as a whole).
    on_write: bool,
}

impl CloseWhy {
    fn io(e: &io::Error, what: &str) -> Self {
        Self {
            reason: format!("{what}: {e}"),
            err: SocketError::from_io_error(e),
            on_write: what.starts_with("writ"),
        }
    }

    fn proto(reason: String) -> Self {
        Self {
            reason,
            err: SocketError::Protocol,
            on_write: false,
        }
    }
}

pub(super) struct Scheduler {
    idx: usize,
    poll: mio::Poll,
    cmds: Receiver<SchedCmd>,
    s: Arc<Shared>,
    lnd: Arc<SockLnd>,
    /// Boxed: a connection is taken out of the map while it is served.
    conns: KeyedMap<ConnId, Box<SchedConn>>,
    inputs: Vec<Input>,
    scratch: Vec<u8>,
    /// The connection whose read last found bytes: the one a spinning
    /// scheduler takes out of its epoll set ([`Scheduler::read_reported`]).
    hot: Option<ConnId>,
    /// Reads that returned bytes, for [`Scheduler::poll_hot`] and
    /// [`Scheduler::read_reported`] to tell whether a read found any.
    reads: std::cell::Cell<u64>,
    /// The hot connection while it is out of the epoll set
    /// ([`Scheduler::detach_hot`]).
    detached: Option<ConnId>,
    /// Reads of the hot connection that found bytes since the scheduler
    /// last blocked or the hot connection changed.
    streak: u32,
    /// The time of this turn of the loop, read once when the turn starts
    /// (again after `epoll_wait` slept): what the turn reads, writes and
    /// hands to the node is stamped with it (microseconds apart; a clock
    /// read costs tens of nanoseconds, several times per message before).
    /// The events hook runs at the end of the turn, so the application's
    /// calls read their own time.
    turn: Time,
}

fn token(id: ConnId) -> mio::Token {
    mio::Token(usize::try_from(id.0).unwrap_or(usize::MAX - 1))
}

impl Scheduler {
    pub(super) fn new(
        idx: usize,
        poll: mio::Poll,
        cmds: Receiver<SchedCmd>,
        s: Arc<Shared>,
        lnd: Arc<SockLnd>,
    ) -> Self {
        Self {
            idx,
            poll,
            cmds,
            s,
            lnd,
            conns: KeyedMap::default(),
            inputs: Vec::new(),
            scratch: vec![0; SCRATCH],
            hot: None,
            reads: std::cell::Cell::new(0),
            detached: None,
            streak: 0,
            turn: Time::ZERO,
        }
    }

    pub(super) fn run(mut self) {
        crate::core::mark_scheduler_thread();
        let mut events = mio::Events::with_capacity(256);
        let mut stop = false;
        // Until `spin` after the last event, look without blocking
        // (`LnetConfig::spin`).
        let spin = self.lnd.cfg.spin;
        let mut busy_at = self.s.now();
        // Turns since the last `epoll_wait` (see `SKIP_EPOLL`).
        let mut skipped = 0;
        let mut spinner = Spinner::default();
        while !stop {
            self.turn = self.s.now();
            let looking = !spin.is_zero() && self.turn.saturating_duration_since(busy_at) < spin;
            spinner.set(looking);
            let mut got = false;
            if looking && self.detached.is_some() && skipped < SKIP_EPOLL {
                // The hot connection is out of the epoll set: it is read
                // directly, as a raw socket is busy-polled; the others
                // (and writability) every `SKIP_EPOLL + 1`th turn.
                skipped += 1;
                events.clear();
                got = self.poll_hot();
            } else {
                skipped = 0;
                if looking {
                    got = self.poll_hot();
                } else {
                    // Only epoll tells of bytes while the scheduler
                    // blocks: the hot connection goes back into its set.
                    self.attach_hot();
                }
                let timeout = looking.then_some(Duration::ZERO);
                if let Err(e) = self.poll.poll(&mut events, timeout) {
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    tracing::error!(target: TARGET, error = %e, "scheduler poll failed");
                    break;
                }
                if !looking {
                    // It may have slept.
                    self.turn = self.s.now();
                }
            }
            if got || !events.is_empty() {
                busy_at = self.turn;
            } else if looking {
                spinner.pause();
            }
            for ev in &events {
                if ev.token() == WAKER {
                    continue;
                }
                let id = ConnId(ev.token().0 as u64);
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.read_reported(id, looking);
                }
                if ev.is_writable() || ev.is_error() {
                    self.on_writable(id);
                }
            }
            while let Ok(cmd) = self.cmds.try_recv() {
                match cmd {
                    SchedCmd::Add(conn, stream, fr) => self.add(conn, *stream, *fr),
                    SchedCmd::Kick(id) => self.on_writable(id),
                    SchedCmd::Resume(id, rx, action) => self.resume(id, rx, action),
                    SchedCmd::Close(id, reason) => {
                        self.close(
                            id,
                            CloseWhy {
                                reason,
                                err: SocketError::ConnReset,
                                on_write: false,
                            },
                        );
                    }
                    SchedCmd::CloseWrite(id, why) => self.close(id, why),
                    SchedCmd::Stop => stop = true,
                }
            }
            self.flush();
            // Events this turn queued go to the events hook here, where
            // the scheduler holds nothing (`HookCall::Scheduler`).
            self.s.scheduler_safe_point();
        }
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(
                id,
                CloseWhy {
                    reason: "LNet shutting down".into(),
                    err: SocketError::NetDown,
                    on_write: false,
                },
            );
        }
        self.flush();
        tracing::debug!(target: TARGET, sched = self.idx, "scheduler stopped");
    }

    /// Hands the batched completions to the node.
    fn flush(&mut self) {
        if !self.inputs.is_empty() {
            self.s.run_at(&mut self.inputs, Some(self.turn), |_, _| ());
        }
    }

    fn add(&mut self, conn: Arc<Conn>, stream: std::net::TcpStream, fr: FrameReceiver) {
        let id = conn.id;
        if let Err(e) = stream.set_nonblocking(true) {
            self.lnd
                .log_close(format!("closed connection to {}: {e}", conn.peer));
            self.fail_conn(&conn, None, &CloseWhy::io(&e, "setting non-blocking"));
            return;
        }
        // A second handle on the socket for threads that write to an idle
        // connection themselves (`SockLnd::write_inline`).
        match stream.try_clone() {
            Ok(w) => *conn.writer.lock() = Some(w),
            Err(e) => {
                tracing::debug!(target: TARGET, error = %e, "no second handle: the scheduler writes alone");
            }
        }
        let mut stream = mio::net::TcpStream::from_std(stream);
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            token(id),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        ) {
            self.lnd
                .log_close(format!("closed connection to {}: {e}", conn.peer));
            self.fail_conn(&conn, None, &CloseWhy::io(&e, "registering"));
            return;
        }
        let closing = conn.closing.load(Ordering::Acquire);
        self.conns.insert(
            id,
            Box::new(SchedConn {
                conn,
                stream,
                fr,
                hdr: [0; 96],
                hdr_have: 0,
                stash: Vec::new(),
                csum: false,
                splice_tries: 0,
                splice_spills: 0,
                rx: RxStage::Header,
                tx: None,
            }),
        );
        if closing {
            self.close(id, CloseWhy::proto("closed while being set up".into()));
            return;
        }
        // Edge-triggered: bytes may be there already.
        self.on_readable(id);
        self.on_writable(id);
    }

    /// The time of this turn.
    fn now(&self) -> Time {
        self.turn
    }

    // ------------------------------------------------------------------
    // Writing

    fn on_writable(&mut self, id: ConnId) {
        let Some(mut sc) = self.conns.remove(&id) else {
            return;
        };
        match self.write(&mut sc) {
            Ok(()) => {
                self.conns.insert(id, sc);
            }
            Err(why) => {
                self.conns.insert(id, sc);
                self.close(id, why);
            }
        }
    }

    fn write(&mut self, sc: &mut SchedConn) -> Result<(), CloseWhy> {
        let conn = sc.conn.clone();
        // Another thread writing to the idle connection: it looks at the
        // queue again when it is done.
        let Some(_writer) = conn.writer.try_lock() else {
            return Ok(());
        };
        if sc.tx.is_none() {
            sc.tx = conn.handoff.lock().take();
        }
        let csum = self.lnd.cfg.tun.enable_csum;
        loop {
            if sc.tx.is_none() {
                let Some(item) = conn.txq.lock().pop_front() else {
                    conn.tx_busy.store(false, Ordering::Release);
                    return Ok(());
                };
                conn.tx_busy.store(true, Ordering::Release);
                sc.tx = start_tx(&self.s, csum, item, &mut self.inputs, &conn);
                continue;
            }
            let Some(t) = sc.tx.as_mut() else { continue };
            if !write_tx(&mut sc.stream, t, &self.s, &conn, self.turn)? {
                return Ok(());
            }
            if let Some(done) = sc.tx.take() {
                finish_tx(&self.s, &conn, &done, &mut self.inputs);
            }
        }
    }

    // ------------------------------------------------------------------
    // Reading

    /// Reads a connection epoll reported readable. The connection that
    /// had bytes becomes the hot one; after `DETACH_STREAK` reads with
    /// bytes in a row while the scheduler spins, it leaves the epoll set
    /// ([`Scheduler::detach_hot`]).
    fn read_reported(&mut self, id: ConnId, looking: bool) {
        let before = self.reads.get();
        self.on_readable(id);
        if self.reads.get() == before || !self.conns.contains_key(&id) {
            return;
        }
        if self.hot != Some(id) {
            self.attach_hot();
            self.hot = Some(id);
        }
        self.streak = self.streak.saturating_add(1);
        if looking && self.streak >= DETACH_STREAK && self.detached.is_none() {
            self.detach_hot(id);
        }
    }

    /// Reads the hot connection once while it is out of the epoll set
    /// (nothing to do otherwise: epoll reports it), and retries its write
    /// if one waits for room (out of the set, it hears of no writability
    /// either). A request-response exchange sees its answer without an
    /// `epoll_wait`. Returns whether the read found bytes.
    fn poll_hot(&mut self) -> bool {
        let Some(id) = self.detached else {
            return false;
        };
        let before = self.reads.get();
        self.on_readable(id);
        if self.conns.get(&id).is_some_and(|sc| sc.tx.is_some()) {
            self.on_writable(id);
        }
        self.reads.get() != before
    }

    /// Takes the hot connection out of the epoll set while the scheduler
    /// spins on it: a socket in an epoll set costs its sender's system
    /// call the work of waking the set (and `epoll_wait` the work of
    /// reporting it), which a busy-polled raw socket does not pay.
    /// [`Scheduler::poll_hot`] reads it (and retries its waiting write)
    /// on every turn while it is out; it goes back before the scheduler
    /// blocks and when another connection has bytes. A socket added back
    /// with bytes waiting is reported at once (epoll checks readiness
    /// when an entry is added), so nothing is missed. Only after
    /// `DETACH_STREAK` reads with bytes on it and none on another since
    /// the scheduler last blocked, so that traffic that comes and goes,
    /// or moves between connections (a router's), never pays two
    /// `epoll_ctl` calls a message.
    fn detach_hot(&mut self, id: ConnId) {
        let Some(sc) = self.conns.get_mut(&id) else {
            return;
        };
        match self.poll.registry().deregister(&mut sc.stream) {
            Ok(()) => {
                self.detached = Some(id);
                add(&self.s.counters.hot_detaches, 1);
            }
            Err(e) => {
                tracing::debug!(target: TARGET, error = %e, "could not take the hot connection out of epoll");
            }
        }
    }

    /// Puts the detached connection (if any) back into the epoll set.
    fn attach_hot(&mut self) {
        self.streak = 0;
        let Some(id) = self.detached.take() else {
            return;
        };
        let Some(sc) = self.conns.get_mut(&id) else {
            return;
        };
        if let Err(e) = self.poll.registry().register(
            &mut sc.stream,
            token(id),
            mio::Interest::READABLE | mio::Interest::WRITABLE,
        ) {
            // Out of epoll it would be read only while the scheduler
            // spins: close it rather than leave it deaf.
            self.close(id, CloseWhy::io(&e, "registering"));
        }
    }

    fn on_readable(&mut self, id: ConnId) {
        let Some(mut sc) = self.conns.remove(&id) else {
            return;
        };
        let r = self.read(&mut sc);
        self.conns.insert(id, sc);
        if let Err(why) = r {
            self.close(id, why);
        }
    }

    fn resume(&mut self, id: ConnId, rx: RxId, action: RxAction) {
        let Some(mut sc) = self.conns.remove(&id) else {
            return;
        };
        let r = match sc.rx {
            RxStage::Parked(p) if p == rx => {
                let total = match sc.fr.want() {
                    Want::Payload(n) => n as usize,
                    _ => 0,
                };
                self.start_payload(&mut sc, action, total);
                self.read(&mut sc)
            }
            _ => {
                tracing::warn!(target: TARGET, ?rx, "resume for a message this connection does not hold");
                Ok(())
            }
        };
        self.conns.insert(id, sc);
        if let Err(why) = r {
            self.close(id, why);
        }
    }

    /// Reads until the socket has nothing more, the connection parks, or
    /// it fails. Bytes read ahead and not yet used when the connection
    /// parks wait in `sc.stash` for its resumption.
    fn read(&mut self, sc: &mut SchedConn) -> Result<(), CloseWhy> {
        if matches!(sc.rx, RxStage::Parked(_)) {
            return Ok(());
        }
        let mut buf = std::mem::take(&mut self.scratch);
        let mut ahead = Ahead::default();
        if !sc.stash.is_empty() {
            let n = sc.stash.len();
            buf[..n].copy_from_slice(&sc.stash);
            sc.stash = Vec::new();
            ahead.hi = n;
        }
        let r = self.read_from(sc, &mut buf, &mut ahead);
        if r.is_ok() && ahead.lo < ahead.hi {
            // Only a parked message leaves bytes behind.
            sc.stash.extend_from_slice(&buf[ahead.lo..ahead.hi]);
        }
        self.scratch = buf;
        r
    }

    /// [`Scheduler::read`] with `buf[ahead.lo..ahead.hi]` the bytes read
    /// from the socket and not used yet (they come first).
    fn read_from(
        &mut self,
        sc: &mut SchedConn,
        buf: &mut [u8],
        ahead: &mut Ahead,
    ) -> Result<(), CloseWhy> {
        // Small messages travel on CONTROL (or untyped) connections: a read
        // there at a message boundary takes up to READ_AHEAD bytes, so a
        // small message and what follows it come in with one system call.
        // A bulk connection's read at a boundary takes exactly the 96 bytes
        // of the headers (never payload bytes: a NOOP is 24 header bytes),
        // and its payloads are read straight into place.
        let eager = !matches!(sc.conn.ctype, ConnType::BulkIn | ConnType::BulkOut);
        // The last header read returned less than it asked for: the socket
        // was empty then, and edge-triggered polling tells of newer bytes.
        let mut drained = false;
        loop {
            match &mut sc.rx {
                RxStage::Parked(_) => return Ok(()),
                RxStage::Header => {
                    let n = match sc.fr.want() {
                        Want::Header(n) => n,
                        Want::Payload(_) | Want::Done => {
                            return Err(CloseWhy::proto("receiver out of step".into()));
                        }
                    };
                    if ahead.is_empty() {
                        if drained {
                            return Ok(());
                        }
                        let ask = if eager {
                            READ_AHEAD
                        } else if sc.hdr_have == 0 && n == KSOCK_MSG_HDR_LEN {
                            LNET_FRAME_HDR_LEN
                        } else {
                            n - sc.hdr_have
                        };
                        match sc.stream.read(&mut buf[..ask]) {
                            Ok(0) => return Err(eof(sc)),
                            Ok(k) => {
                                *ahead = Ahead { lo: 0, hi: k };
                                drained = k < ask;
                                self.alive(sc);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(CloseWhy::io(&e, "reading")),
                        }
                    }
                    let k = (n - sc.hdr_have).min(ahead.len());
                    sc.hdr[sc.hdr_have..sc.hdr_have + k]
                        .copy_from_slice(&buf[ahead.lo..ahead.lo + k]);
                    ahead.lo += k;
                    sc.hdr_have += k;
                    if sc.hdr_have < n {
                        continue;
                    }
                    sc.hdr_have = 0;
                    self.header(sc, n)?;
                }
                RxStage::Payload(p) => {
                    if p.read == p.total {
                        self.payload_done(sc)?;
                        continue;
                    }
                    let from_ahead = !ahead.is_empty();
                    if !from_ahead && drained {
                        return Ok(());
                    }
                    let r = if let Dest::Pipe(pipe, ..) = &p.dest
                        && p.done < p.dest.len()
                    {
                        let want = p.dest.len() - p.done;
                        let fd = sc.stream.as_raw_fd();
                        let blocked = |r: &io::Result<usize>| matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
                        let mut r = if from_ahead {
                            pipe.write_in(&buf[ahead.lo..ahead.lo + ahead.len().min(want)])
                        } else {
                            pipe.splice_in(fd, want)
                        };
                        // Would block: the socket is empty, or the pipe is
                        // full (the payload's pages came in pieces too
                        // small for its slots). Bytes seen in the socket
                        // stay there (this thread alone reads it), so a
                        // splice that would block again means a full
                        // pipe: what it holds moves to memory and the
                        // rest is read there.
                        let full = if from_ahead {
                            blocked(&r)
                        } else {
                            blocked(&r) && socket_has_bytes(fd) && {
                                r = pipe.splice_in(fd, want);
                                blocked(&r)
                            }
                        };
                        if full {
                            sc.splice_spills += 1;
                            self.spill(p);
                            continue;
                        }
                        r
                    } else if p.done < p.dest.len() {
                        let got = if from_ahead {
                            let take = ahead.len().min(p.total - p.read);
                            let mut src = &buf[ahead.lo..ahead.lo + take];
                            read_into(&mut src, &mut p.dest, p.done)
                        } else {
                            read_into(&mut sc.stream, &mut p.dest, p.done)
                        };
                        let Some(r) = got else {
                            // The memory went away (a deleted buffer): the
                            // rest of the payload is read and dropped, so
                            // the connection stays in step and lives on;
                            // the message fails.
                            tracing::debug!(target: TARGET, peer = %sc.conn.peer,
                                "payload memory gone while receiving; rest discarded");
                            p.dest = Dest::None;
                            p.lost = true;
                            p.whole = false;
                            continue;
                        };
                        r
                    } else if from_ahead {
                        Ok(ahead.len().min(p.total - p.read))
                    } else {
                        let k = (p.total - p.read).min(buf.len());
                        sc.stream.read(&mut buf[..k])
                    };
                    match r {
                        Ok(0) => return Err(eof(sc)),
                        Ok(k) => {
                            let c = &self.s.counters;
                            if p.done < p.dest.len() {
                                p.done += k;
                                add(&c.socket_read_bytes, k as u64);
                                if matches!(p.dest, Dest::Inline(_)) {
                                    add(&c.inline_read_bytes, k as u64);
                                } else if from_ahead {
                                    add(&c.eager_copy_bytes, k as u64);
                                } else if matches!(p.dest, Dest::Pipe(..)) {
                                    add(&c.splice_read_bytes, k as u64);
                                }
                            } else {
                                add(&c.discarded_bytes, k as u64);
                            }
                            p.read += k;
                            if from_ahead {
                                ahead.lo += k;
                            } else {
                                self.reads.set(self.reads.get().wrapping_add(1));
                                sc.conn
                                    .last_rx
                                    .store(self.now().as_nanos(), Ordering::Relaxed);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(CloseWhy::io(&e, "reading")),
                    }
                }
            }
        }
    }

    fn alive(&self, sc: &SchedConn) {
        self.reads.set(self.reads.get().wrapping_add(1));
        sc.conn
            .last_rx
            .store(self.now().as_nanos(), Ordering::Relaxed);
        sc.conn.rx_busy.store(true, Ordering::Relaxed);
    }

    /// A complete header of `n` bytes is in `sc.hdr`.
    fn header(&mut self, sc: &mut SchedConn, n: usize) -> Result<(), CloseWhy> {
        let frame = sc
            .fr
            .handle_header(&sc.hdr[..n])
            .map_err(|e| CloseWhy::proto(format!("protocol error: {e}")))?;
        match frame {
            None => Ok(()),
            Some(Frame::Noop(noop)) => {
                add(&self.s.counters.frames_received, 1);
                sc.conn.rx_busy.store(false, Ordering::Relaxed);
                if noop.zc_ack.is_some() {
                    // We never ask for zero-copy ACKs.
                    return Err(CloseWhy::proto(
                        "protocol error: zero-copy ACK for a request we never made".into(),
                    ));
                }
                Ok(())
            }
            Some(Frame::Lnet(f)) => {
                add(&self.s.counters.frames_received, 1);
                let header = f.header.encode();
                sc.csum = f.ksock.checksum().is_some();
                let total = f.header.payload_length as usize;
                let (ni, from) = (sc.conn.ni, sc.conn.peer);
                let (sched, conn_id) = (self.idx, sc.conn.id);
                let parked = &self.lnd.parked;
                let action = self
                    .s
                    .run_at(&mut self.inputs, Some(self.turn), |core, now| {
                        let a = core.node.handle_header(now, ni, from, &header);
                        if let Ok(RxAction::Wait { rx }) = a {
                            // Before anyone can see the action for it.
                            parked.lock().insert(rx, (sched, conn_id));
                        }
                        a
                    });
                let action = action
                    .map_err(|e| CloseWhy::proto(format!("message from {from} refused: {e}")))?;
                if let RxAction::Wait { rx } = action {
                    sc.rx = RxStage::Parked(rx);
                } else {
                    self.start_payload(sc, action, total);
                }
                Ok(())
            }
        }
    }

    /// Sets up reading a payload of `total` bytes as `action` says.
    fn start_payload(&mut self, sc: &mut SchedConn, action: RxAction, total: usize) {
        let (rx, dest) = match action {
            RxAction::None | RxAction::Discard { .. } | RxAction::Wait { .. } => (None, Dest::None),
            RxAction::Deliver { rx, mem, .. } => match self.s.mem.resolve(mem) {
                Some(r) if r.len <= total => (Some(rx), Dest::Mem(r)),
                _ => {
                    tracing::warn!(target: TARGET, ?mem, "delivery memory gone or too small; payload discarded");
                    self.inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
                    (None, Dest::None)
                }
            },
            RxAction::Forward { rx, pool, len } => {
                let len = (len as usize).min(total);
                // Into a pipe when large, unchecked on both sides (a
                // checksum needs the bytes) and a pipe is to be had.
                let pipe = (len >= SPLICE_MIN
                    && sc.may_splice()
                    && !sc.csum
                    && !self.lnd.cfg.tun.enable_csum)
                    .then(|| self.s.rbufs.pipes.take())
                    .flatten();
                let dest = match pipe {
                    Some(p) => {
                        sc.splice_tries = sc.splice_tries.saturating_add(1);
                        Dest::Pipe(p, pool, len)
                    }
                    None => Dest::Router(self.s.rbufs.take(pool, len), pool, len),
                };
                (Some(rx), dest)
            }
            RxAction::Inline { rx, len, .. } => {
                let len = (len as usize).min(total);
                (Some(rx), Dest::Inline(vec![0; len]))
            }
        };
        let whole = sc.csum && rx.is_some() && dest.len() == total;
        sc.rx = RxStage::Payload(PayloadRx {
            rx,
            dest,
            done: 0,
            read: 0,
            total,
            whole,
            lost: false,
        });
    }

    /// Moves the part of a payload a pipe holds into a router buffer in
    /// memory, where the rest is read; the message fails if the pipe
    /// cannot give it back.
    fn spill(&mut self, p: &mut PayloadRx) {
        let Dest::Pipe(pipe, pool, len) = std::mem::replace(&mut p.dest, Dest::None) else {
            return;
        };
        tracing::debug!(target: TARGET, held = p.done, len,
            "forwarded payload does not fit a pipe; read into memory");
        add(&self.s.counters.splice_spills, 1);
        let mut v = self.s.rbufs.take(pool, len);
        let mut have = 0;
        while have < p.done {
            match pipe.read_out(&mut v[have..p.done]) {
                Ok(k) if k > 0 => have += k,
                _ => break,
            }
        }
        if have == p.done {
            p.dest = Dest::Router(v, pool, len);
        } else {
            self.s.rbufs.give_back(pool, v);
            p.lost = true;
            p.whole = false;
        }
    }

    /// The whole payload is read.
    fn payload_done(&mut self, sc: &mut SchedConn) -> Result<(), CloseWhy> {
        let RxStage::Payload(p) = std::mem::replace(&mut sc.rx, RxStage::Header) else {
            return Ok(());
        };
        sc.conn.rx_busy.store(false, Ordering::Relaxed);
        let csum = if p.whole {
            Some(match &p.dest {
                Dest::Mem(r) => r.read(pieces_checksum).unwrap_or(0),
                Dest::Router(v, _, len) => payload_checksum(&v[..*len]),
                Dest::Inline(v) => payload_checksum(v),
                // Never: a payload that carries a checksum is not spliced.
                Dest::Pipe(..) | Dest::None => payload_checksum(&[]),
            })
        } else {
            None
        };
        // Computed only when the header carries a checksum and the whole
        // payload was kept (a read pass, not a copy).
        let r = sc.fr.payload_received(csum);
        let outcome = match r {
            Ok(done) => {
                if let Some(cookie) = done.zc_request {
                    self.lnd.send_noop(
                        sc.conn.ni,
                        sc.conn.peer,
                        KsockMsgHeader::zc_ack(cookie),
                        self.now(),
                    );
                }
                Ok(())
            }
            Err(e) => Err(format!("protocol error: {e}")),
        };
        if let Some(rx) = p.rx {
            let o = match (&outcome, p.dest) {
                _ if p.lost => PayloadOutcome::Failed,
                (Err(_), Dest::Router(v, pool, _)) => {
                    self.s.rbufs.give_back(pool, v);
                    PayloadOutcome::Failed
                }
                (Err(_), _) => PayloadOutcome::Failed,
                (Ok(()), Dest::Router(v, _, _)) => {
                    self.s.rbufs.insert(rx, v);
                    PayloadOutcome::Received
                }
                (Ok(()), Dest::Pipe(pipe, _, _)) => {
                    self.s.rbufs.insert_pipe(rx, pipe);
                    PayloadOutcome::Received
                }
                (Ok(()), Dest::Inline(v)) => PayloadOutcome::Inline(v),
                (Ok(()), _) => PayloadOutcome::Received,
            };
            self.inputs.push(Input::Payload(rx, o));
        }
        outcome.map_err(CloseWhy::proto)
    }

    // ------------------------------------------------------------------
    // Closing

    fn close(&mut self, id: ConnId, why: CloseWhy) {
        let Some(mut sc) = self.conns.remove(&id) else {
            return;
        };
        if self.detached == Some(id) {
            self.detached = None;
        } else {
            let _ = self.poll.registry().deregister(&mut sc.stream);
        }
        if self.hot == Some(id) {
            self.hot = None;
        }
        let _ = sc.stream.shutdown(std::net::Shutdown::Both);
        // After a writer in another thread is done; none starts again.
        *sc.conn.writer.lock() = None;
        if sc.tx.is_none() {
            sc.tx = sc.conn.handoff.lock().take();
        }
        self.lnd.log_close(format!(
            "closed connection {} to {} ({}) on {}: {}",
            id.0, sc.conn.peer, sc.conn.ctype, sc.conn.ni, why.reason
        ));
        // The message being read, or parked, is lost.
        match std::mem::replace(&mut sc.rx, RxStage::Header) {
            RxStage::Payload(p) => {
                if let Dest::Router(v, pool, _) = p.dest {
                    self.s.rbufs.give_back(pool, v);
                }
                if let Some(rx) = p.rx {
                    self.inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
                }
            }
            RxStage::Parked(rx) => {
                self.lnd.parked.lock().remove(&rx);
                self.inputs.push(Input::Payload(rx, PayloadOutcome::Failed));
            }
            RxStage::Header => {}
        }
        let conn = sc.conn.clone();
        self.fail_conn(&conn, sc.tx.take(), &why);
    }

    /// Fails what the connection was sending and had queued, and takes it
    /// out of its peer.
    fn fail_conn(&mut self, conn: &Arc<Conn>, in_progress: Option<TxProgress>, why: &CloseWhy) {
        conn.closing.store(true, Ordering::Release);
        add(&self.s.counters.conns_closed, 1);
        if let Some(t) = in_progress
            && let Some(id) = t.item.id
        {
            let f = if why.on_write {
                TxFailure::Send(why.err)
            } else if t.written > 0 {
                TxFailure::Incomplete
            } else {
                TxFailure::Queued(why.err)
            };
            self.inputs
                .push(Input::TxDone(id, health_error(f.health_status())));
        }
        let (queued, lost) = self.lnd.forget_conn(conn);
        if lost {
            self.inputs.push(Input::Notify {
                ni: conn.ni,
                peer: conn.peer,
                alive: false,
            });
        }
        let status = TxFailure::Queued(why.err).health_status();
        for item in queued {
            if let Some(id) = item.id {
                self.inputs.push(Input::TxDone(id, health_error(status)));
            }
        }
        conn.tx_busy.store(false, Ordering::Release);
        conn.rx_busy.store(false, Ordering::Release);
    }
}

/// Starts writing `item`: resolves its payload (and puts its checksum in
/// its header); `None` if the payload's memory is gone (the message fails,
/// through `inputs`).
pub(super) fn start_tx(
    s: &Shared,
    csum: bool,
    item: TxItem,
    inputs: &mut Vec<Input>,
    conn: &Conn,
) -> Option<TxProgress> {
    let src = match &item.payload {
        Payload::None => Some(Src::None),
        // Foreign memory that went away fails here, as deregistered
        // memory does, rather than in the middle of the frame.
        Payload::Mem(r) => s
            .mem
            .resolve(*r)
            .filter(|m| m.read(|_| ()).is_some())
            .map(Src::Mem),
        Payload::Rx { rx, len } => s.rbufs.get(*rx).and_then(|b| {
            let len = *len as usize;
            match &*b {
                Held::Mem(v) => (v.len() >= len).then(|| Src::Router(b, len)),
                Held::Pipe { pipe, consumed } => {
                    // Sent from a duplicate, so that the held payload stays
                    // whole for a resend; without a spare pipe, from the
                    // held one, once.
                    let copy = s
                        .rbufs
                        .pipes
                        .take_for_send()
                        .filter(|c| matches!(pipe.tee_into(c, len), Ok(n) if n == len));
                    (copy.is_some() || !consumed.swap(true, Ordering::AcqRel))
                        .then(|| Src::Pipe(b.clone(), len, copy))
                }
            }
        }),
        Payload::Inline(_) => Some(Src::Inline),
    };
    let Some(src) = src else {
        // The application took its memory back while the message waited
        // (what cancelling a queued send does): the message fails with
        // LOCAL_ERROR and is counted; nothing is wrong with the node.
        tracing::debug!(target: TARGET, payload = ?item.payload,
            "payload memory gone; message not sent");
        conn.queued_bytes
            .fetch_sub(item.wire_len(), Ordering::Relaxed);
        if let Some(id) = item.id {
            inputs.push(Input::TxDone(id, Err(HealthError::LocalError)));
        }
        return None;
    };
    let mut item = item;
    // A payload in a pipe goes without a checksum (0: none), as one
    // received without a checksum; it is only spliced when this node
    // does not checksum.
    if csum && item.id.is_some() && !matches!(src, Src::Pipe(..)) {
        let c = with_src(&src, &item.payload, pieces_checksum).unwrap_or(0);
        item.head[4..8].copy_from_slice(&c.to_le_bytes());
    }
    Some(TxProgress {
        item,
        src,
        written: 0,
    })
}

/// Writes as much of `t` as the socket takes, header and payload with one
/// write each time (copied into one piece when small, else vectored):
/// `Ok(true)` once it is all written, `Ok(false)` when the socket is full.
/// `now` is the time of the writing thread's turn (the connection's last
/// write time for its keepalive and timeout).
pub(super) fn write_tx<W: Write + AsRawFd>(
    stream: &mut W,
    t: &mut TxProgress,
    s: &Shared,
    conn: &Conn,
    now: Time,
) -> Result<bool, CloseWhy> {
    let head_len = t.item.head_len;
    if let Src::Pipe(held, len, copy) = &t.src {
        // From the duplicate, else from the held pipe itself.
        let Some(from) = copy.as_deref().or_else(|| held.pipe()) else {
            return Err(CloseWhy {
                reason: "writing: the payload's pipe went away".into(),
                err: SocketError::Other(None),
                on_write: true,
            });
        };
        let head = &t.item.head[..head_len];
        return write_spliced(
            stream.as_raw_fd(),
            head,
            from,
            *len,
            &mut t.written,
            s,
            conn,
            now,
        );
    }
    loop {
        let r = {
            let head = &t.item.head[..head_len];
            let w = t.written;
            with_src(&t.src, &t.item.payload, |payload| {
                let plen: usize = payload.iter().map(|p| p.len()).sum();
                let total = head_len + plen;
                let mut bufs: smallvec::SmallVec<[IoSlice<'_>; 4]> = smallvec::SmallVec::new();
                if w < head_len {
                    bufs.push(IoSlice::new(&head[w..]));
                }
                let mut skip = w.saturating_sub(head_len);
                for p in payload {
                    if skip >= p.len() {
                        skip -= p.len();
                        continue;
                    }
                    if bufs.len() == MAX_IOV {
                        break;
                    }
                    bufs.push(IoSlice::new(&p[skip..]));
                    skip = 0;
                }
                // Small pieces go as one (see colibri_wire::gather).
                colibri_wire::gather::gathered(&bufs, |p| match p {
                    Pieces::One(b) => stream.write(b),
                    Pieces::Many(v) => stream.write_vectored(v),
                })
                .map(|n| (n, total))
            })
        };
        let Some(r) = r else {
            return Err(CloseWhy {
                reason: "writing: the payload's memory went away".into(),
                err: SocketError::Other(None),
                on_write: true,
            });
        };
        // (`total` only counts once bytes were written.)
        let (r, total) = match r {
            Ok((n, total)) => (Ok(n), total),
            Err(e) => (Err(e), 0),
        };
        if let Some(done) = wrote(r, total, &mut t.written, now, conn)? {
            return Ok(done);
        }
    }
}

/// Accounts for one write of a message (`written` bytes of it so far):
/// `Some(true)` once all `total` bytes are written, `Some(false)` when
/// the socket is full, `None` to write again.
fn wrote(
    r: io::Result<usize>,
    total: usize,
    written: &mut usize,
    now: Time,
    conn: &Conn,
) -> Result<Option<bool>, CloseWhy> {
    match r {
        Ok(0) => Err(CloseWhy {
            reason: "writing: the socket took no bytes".into(),
            err: SocketError::ConnReset,
            on_write: true,
        }),
        Ok(n) => {
            *written += n;
            conn.last_tx.store(now.as_nanos(), Ordering::Relaxed);
            Ok((*written >= total).then_some(true))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(false)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(CloseWhy::io(&e, "writing")),
    }
}

/// [`write_tx`] for a payload of `len` bytes in pipe `from`: the headers
/// with one `send` (`MSG_MORE`), then the payload spliced from the pipe.
// The message's pieces come borrowed apart (its pipe and its count of
// bytes written are fields of one `TxProgress`).
#[allow(clippy::too_many_arguments)]
fn write_spliced(
    fd: RawFd,
    head: &[u8],
    from: &Pipe,
    len: usize,
    written: &mut usize,
    s: &Shared,
    conn: &Conn,
    now: Time,
) -> Result<bool, CloseWhy> {
    let total = head.len() + len;
    loop {
        let r = if *written < head.len() {
            send_more(fd, &head[*written..])
        } else {
            from.splice_out(fd, total - *written)
        };
        if let (Ok(n), true) = (&r, *written >= head.len()) {
            add(&s.counters.splice_write_bytes, *n as u64);
        }
        if let Some(done) = wrote(r, total, written, now, conn)? {
            return Ok(done);
        }
    }
}

/// A message is all written: counted, and its completion goes to
/// `inputs`.
pub(super) fn finish_tx(s: &Shared, conn: &Conn, done: &TxProgress, inputs: &mut Vec<Input>) {
    let c = &s.counters;
    let plen = u64::from(done.item.payload.len());
    conn.queued_bytes
        .fetch_sub(done.item.wire_len(), Ordering::Relaxed);
    add(&c.frames_sent, 1);
    add(&c.socket_write_bytes, plen);
    if matches!(done.item.payload, Payload::Inline(_)) {
        add(&c.inline_write_bytes, plen);
    }
    if let Some(id) = done.item.id {
        inputs.push(Input::TxDone(id, Ok(())));
    }
}

fn eof(sc: &SchedConn) -> CloseWhy {
    let mid = !matches!(sc.rx, RxStage::Header) || sc.hdr_have > 0;
    CloseWhy {
        reason: if mid {
            "peer closed the connection in the middle of a message".into()
        } else {
            "peer closed the connection".into()
        },
        err: SocketError::ConnReset,
        on_write: false,
    }
}

/// Most slices given to one vectored read or write (`IOV_MAX`).
const MAX_IOV: usize = 1024;

/// Lustre's payload checksum over pieces.
fn pieces_checksum(pieces: &[&[u8]]) -> u32 {
    if let [one] = pieces {
        return payload_checksum(one);
    }
    let mut c = Crc32::new();
    for p in pieces {
        c.update(p);
    }
    c.value()
}

/// Runs `f` on an outgoing payload's bytes, in pieces; `None` if its
/// memory went away.
fn with_src<R>(src: &Src, p: &Payload, f: impl FnOnce(&[&[u8]]) -> R) -> Option<R> {
    match (src, p) {
        (Src::Mem(r), _) => r.read(f),
        (Src::Router(b, len), _) => b.bytes(*len).map(|b| f(&[b])),
        (Src::Inline, Payload::Inline(v)) => Some(f(&[v])),
        _ => Some(f(&[])),
    }
}

/// One read from `stream` (the socket, or bytes read ahead) straight into
/// the destination, at `done`;
/// `None` if the destination's memory went away.
fn read_into<R: Read>(stream: &mut R, dest: &mut Dest, done: usize) -> Option<io::Result<usize>> {
    match dest {
        Dest::Mem(r) => r.write(|pieces| {
            let mut bufs: smallvec::SmallVec<[IoSliceMut<'_>; 4]> = smallvec::SmallVec::new();
            let mut skip = done;
            for p in pieces.iter_mut() {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                if bufs.len() == MAX_IOV {
                    break;
                }
                bufs.push(IoSliceMut::new(&mut p[skip..]));
                skip = 0;
            }
            stream.read_vectored(&mut bufs)
        }),
        Dest::Router(v, _, len) => Some(stream.read(&mut v[done..*len])),
        Dest::Inline(v) => Some(stream.read(&mut v[done..])),
        // Filled by `Scheduler::read_from` itself.
        Dest::Pipe(..) | Dest::None => Some(Ok(0)),
    }
}
