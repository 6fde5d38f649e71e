//! One TCP connection: its write queue of frames, its read state machine,
//! and the protocol on both ends.
//!
//! A connection is *outgoing* (this domain connected to a peer's listener:
//! it sends requests and reads responses) or *incoming* (accepted on one of
//! our listeners: it reads requests and sends responses). Everything here
//! runs on the I/O thread that owns the connection, without any transport
//! lock: the sink calls below take the transfer machine's lock themselves.
//!
//! Payload never goes through an intermediate buffer on the way out: a
//! frame's data is written with `writev` straight from the registered
//! buffer. On the way in, a body is read with `readv` straight into the
//! registered buffer, with the read buffer appended as the last slice so
//! that the next headers arrive in the same call; only body bytes that came
//! in the same read as their header are copied from the read buffer.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Instant;

use colibri_net::xprt::{ClaimError, PassiveClaim, PassiveError, QueuedBuf, RecvClaim};
use colibri_net::{BufVec, NetBufDesc, NetError, QueueType, Result};
use mio::net::TcpStream;
use parking_lot::MappedMutexGuard;
use tracing::{debug, trace};

use crate::addr::TcpAddr;
use crate::engine::{Listener, Stats};
use crate::tm::TmShared;
use crate::wire::{FLAG_LAST, HEADER_LEN, Header, Opcode, decode_status, encode_status};

/// Size of a connection's read buffer.
const RBUF: usize = 64 * 1024;
/// Bodies with at least this much left are read straight into the buffer.
const DIRECT_MIN: usize = 2048;
/// Most peer listening addresses learned on one connection.
const MAX_ROUTES: usize = 64;
/// Most frames gathered into one `writev`.
const MAX_BATCH: usize = 64;
/// Most bytes gathered into one `writev`.
const MAX_BATCH_BYTES: usize = 8 << 20;

/// Context a connection needs from its I/O thread.
#[derive(Debug)]
pub(crate) struct Cx<'a> {
    /// Largest body accepted.
    pub(crate) max_body: u32,
    /// Counters.
    pub(crate) stats: &'a Stats,
}

/// Where a frame's data comes from.
enum Data {
    None,
    /// Straight from a registered buffer.
    Buf {
        q: QueuedBuf,
        off: usize,
        len: usize,
    },
    /// Owned bytes: a status detail, or the unwritten tail of a chunk whose
    /// buffer was completed while the chunk was on the wire. Byte 0 is data
    /// offset `base`.
    Owned(Vec<u8>, usize),
}

/// What a fully written frame means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Plain,
    /// A request frame of outgoing transfer `xid`.
    Req(u64),
    /// A data chunk of incoming GET transfer `xid`.
    Chunk(u64, usize),
}

struct Frame {
    hdr: [u8; HEADER_LEN],
    desc: Option<Arc<[u8]>>,
    data: Data,
    len: usize,
    done: usize,
    tag: Tag,
}

impl Frame {
    fn new(h: &Header, desc: Option<Arc<[u8]>>, data: Data, tag: Tag) -> Self {
        let desc_len = desc.as_ref().map_or(0, |d| d.len());
        let data_len = match &data {
            Data::None => 0,
            Data::Buf { len, .. } => *len,
            Data::Owned(v, base) => v.len() + base,
        };
        Self {
            hdr: h.encode(),
            desc,
            data,
            len: HEADER_LEN + desc_len + data_len,
            done: 0,
            tag,
        }
    }

    fn data_start(&self) -> usize {
        HEADER_LEN + self.desc.as_ref().map_or(0, |d| d.len())
    }

    /// Pushes the unwritten parts of the frame.
    fn slices<'a>(&'a self, data: Option<&'a BufVec>, iov: &mut Vec<IoSlice<'a>>) -> Result<()> {
        let mut skip = self.done;
        let desc: &[u8] = self.desc.as_deref().unwrap_or(&[]);
        for part in [&self.hdr[..], desc] {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                iov.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
        }
        match &self.data {
            Data::None => {}
            Data::Buf { off, len, .. } => {
                let bv = data.ok_or(NetError::Cancelled)?;
                iov.extend(bv.io_slices(off + skip, len - skip)?);
            }
            Data::Owned(v, base) => iov.push(IoSlice::new(&v[skip - base..])),
        }
        Ok(())
    }

    /// Makes the frame independent of its buffer: the unwritten part of
    /// its data is copied (at most one chunk or message).
    fn detach(&mut self) -> Result<()> {
        let Data::Buf { q, off, len } = &self.data else {
            return Ok(());
        };
        let written = self.done.saturating_sub(self.data_start()).min(*len);
        let bv = q.data().ok_or(NetError::Cancelled)?;
        let tail = bv.to_vec(off + written, len - written)?;
        drop(bv);
        self.data = Data::Owned(tail, written);
        Ok(())
    }
}

/// An outgoing operation waiting for its response.
pub(crate) struct Op {
    pub(crate) tm: Arc<TmShared>,
    pub(crate) q: QueuedBuf,
    kind: OpKind,
    /// Destination, for error messages.
    dest: String,
    /// Some of its request bytes are on the wire.
    started: bool,
}

enum OpKind {
    Msg,
    Get { expected: u64, received: u64 },
    Put { total: u64 },
}

/// An incoming bulk transfer against one of our passive buffers.
struct Pxfer {
    tm: Arc<TmShared>,
    q: QueuedBuf,
    len: u64,
    /// Next offset expected (requested for GET, received for PUT).
    next: u64,
    /// Bytes fully written (GET).
    written: u64,
    sender: TcpAddr,
    token: u64,
    cookie: u64,
    get: bool,
}

/// What the body being read is for.
enum Body {
    /// A message going into a claimed receive buffer.
    Recv { claim: RecvClaim, tm: Arc<TmShared> },
    /// PUT data for incoming transfer `xid`.
    Passive(u64),
    /// GET_DATA data for outgoing transfer `xid`.
    Active(u64),
    /// A status detail.
    Detail(Vec<u8>),
    /// Bytes to drop, then perhaps a failure to answer with.
    Discard(Option<NetError>),
}

enum RState {
    Header,
    Desc {
        h: Header,
        buf: Vec<u8>,
    },
    Body {
        h: Header,
        body: Body,
        got: usize,
        len: usize,
    },
}

/// Outcome of reading a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    Open,
    Eof,
}

/// A connection.
pub(crate) struct Conn {
    pub(crate) token: usize,
    pub(crate) sock: TcpStream,
    pub(crate) peer: SocketAddrV4,
    /// We connected (outgoing).
    pub(crate) out: bool,
    /// The listener it was accepted on (incoming).
    pub(crate) listener: Option<Arc<Listener>>,
    pub(crate) connected: bool,
    pub(crate) connect_deadline: Option<Instant>,
    pub(crate) last_use: Instant,
    /// Since when the socket has been full with no write progress.
    pub(crate) full_since: Option<Instant>,
    wq: VecDeque<Frame>,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    rstate: RState,
    ops: HashMap<u64, Op>,
    next_xid: u64,
    pas: HashMap<u64, Pxfer>,
    /// Listening addresses of the peer's transfer machines that sent
    /// requests on this (accepted) connection: our engine sends its own
    /// requests to them over it too, so that a request and the answer to
    /// the peer's travel in one segment.
    pub(crate) learned: Vec<SocketAddrV4>,
    /// `learned` grew since the engine last looked.
    pub(crate) new_routes: bool,
}

fn reset(e: &io::Error) -> NetError {
    NetError::ConnectionReset(e.to_string())
}

/// Completes a buffer through its transfer machine's sink (callbacks run
/// here, on the I/O thread).
pub(crate) fn complete(tm: &TmShared, q: &QueuedBuf, status: Result<usize>) {
    tm.sink().complete(q, status);
}

impl Conn {
    pub(crate) fn new(
        token: usize,
        sock: TcpStream,
        peer: SocketAddrV4,
        listener: Option<Arc<Listener>>,
    ) -> Self {
        let out = listener.is_none();
        Self {
            token,
            sock,
            peer,
            out,
            listener,
            connected: !out,
            connect_deadline: None,
            last_use: Instant::now(),
            full_since: None,
            wq: VecDeque::new(),
            // Allocated on the first read: idle connections cost no buffer.
            rbuf: Vec::new(),
            rpos: 0,
            rlen: 0,
            rstate: RState::Header,
            ops: HashMap::new(),
            next_xid: 1,
            pas: HashMap::new(),
            learned: Vec::new(),
            new_routes: false,
        }
    }

    /// True when nothing is in flight: the skulker may close it.
    pub(crate) fn is_idle(&self) -> bool {
        self.ops.is_empty()
            && self.pas.is_empty()
            && self.wq.is_empty()
            && matches!(self.rstate, RState::Header)
            && self.rpos == self.rlen
    }

    pub(crate) fn has_output(&self) -> bool {
        !self.wq.is_empty()
    }

    // ----- outgoing operations -------------------------------------------

    /// Queues a message send.
    pub(crate) fn start_msg(
        &mut self,
        tm: Arc<TmShared>,
        q: QueuedBuf,
        own: TcpAddr,
        dest: TcpAddr,
    ) {
        let xid = self.alloc_xid();
        let len = q.length();
        let mut h = Header::new(Opcode::Msg, xid, own, dest);
        h.total = len as u64;
        h.body_len = len as u32;
        let data = Data::Buf {
            q: q.clone(),
            off: 0,
            len,
        };
        self.wq.push_back(Frame::new(&h, None, data, Tag::Req(xid)));
        self.ops.insert(
            xid,
            Op {
                tm,
                q,
                kind: OpKind::Msg,
                dest: dest.to_string(),
                started: false,
            },
        );
    }

    /// Queues an active bulk transfer: GET requests for an active receive,
    /// PUT chunks for an active send.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_bulk(
        &mut self,
        chunk: usize,
        tm: Arc<TmShared>,
        q: QueuedBuf,
        own: TcpAddr,
        dest: TcpAddr,
        desc: Arc<[u8]>,
        passive_len: u64,
    ) {
        let xid = self.alloc_xid();
        let chunk = chunk.max(1) as u64;
        let desc_len = desc.len() as u16;
        let kind = if q.queue() == QueueType::ActiveBulkRecv {
            let size = q.size() as u64;
            // A descriptor naming more than fits is refused by the passive
            // side (which fails its buffer too): ask for one chunk only.
            let (end, first_only) = if passive_len <= size {
                (passive_len, false)
            } else {
                (chunk.min(size), true)
            };
            let mut off = 0;
            while off < end {
                let n = chunk.min(end - off);
                let mut h = Header::new(Opcode::Get, xid, own, dest);
                h.queue = QueueType::ActiveBulkRecv.code();
                h.offset = off;
                h.total = size;
                h.chunk = n as u32;
                h.desc_len = desc_len;
                h.body_len = desc_len.into();
                if off + n == end || first_only {
                    h.flags = FLAG_LAST;
                }
                self.wq.push_back(Frame::new(
                    &h,
                    Some(desc.clone()),
                    Data::None,
                    Tag::Req(xid),
                ));
                off += n;
            }
            OpKind::Get {
                expected: passive_len,
                received: 0,
            }
        } else {
            let total = q.length() as u64;
            let mut off = 0;
            while off < total {
                let n = chunk.min(total - off);
                let mut h = Header::new(Opcode::Put, xid, own, dest);
                h.queue = QueueType::ActiveBulkSend.code();
                h.offset = off;
                h.total = total;
                h.desc_len = desc_len;
                h.body_len = u32::from(desc_len) + n as u32;
                if off + n == total {
                    h.flags = FLAG_LAST;
                }
                let data = Data::Buf {
                    q: q.clone(),
                    off: off as usize,
                    len: n as usize,
                };
                self.wq
                    .push_back(Frame::new(&h, Some(desc.clone()), data, Tag::Req(xid)));
                off += n;
            }
            OpKind::Put { total }
        };
        self.ops.insert(
            xid,
            Op {
                tm,
                q,
                kind,
                dest: dest.to_string(),
                started: false,
            },
        );
    }

    fn alloc_xid(&mut self) -> u64 {
        let x = self.next_xid;
        self.next_xid += 1;
        x
    }

    /// Removes the frames of transfer `tag` not yet started and detaches
    /// the one on the wire, so that its buffer can be handed back.
    fn detach(&mut self, tag: impl Fn(Tag) -> bool) -> Result<()> {
        let mut keep = VecDeque::with_capacity(self.wq.len());
        let mut res = Ok(());
        for mut f in self.wq.drain(..) {
            if !tag(f.tag) {
                keep.push_back(f);
            } else if f.done > 0 {
                if let Err(e) = f.detach() {
                    res = Err(e);
                }
                f.tag = Tag::Plain;
                keep.push_back(f);
            }
        }
        self.wq = keep;
        res
    }

    /// Finishes outgoing transfer `xid` with `status`.
    fn finish_op(&mut self, xid: u64, status: Result<usize>) -> Result<()> {
        let detached = self.detach(|t| t == Tag::Req(xid));
        if let Some(op) = self.ops.remove(&xid) {
            complete(&op.tm, &op.q, status);
        }
        detached
    }

    /// The outgoing transfer using buffer `q`, if any.
    pub(crate) fn find_op(&self, q: &QueuedBuf) -> Option<u64> {
        let t = q.token();
        self.ops
            .iter()
            .find(|(_, o)| o.q.token() == t)
            .map(|(x, _)| *x)
    }

    /// A deletion (cancel, timeout, stop with abort) of an outgoing buffer
    /// in use: the transfer ends now and the buffer completes `Cancelled`
    /// (the core reports `TimedOut` after a timeout). Frames not yet
    /// started are withdrawn; a frame partly on the wire is finished from a
    /// copy of its unwritten part (a frame cannot be cut short without
    /// closing the connection), so a message already partly sent still
    /// arrives whole. A bulk transfer's peer is told with an ABORT carrying
    /// `wire`, the status its passive buffer completes with.
    pub(crate) fn del_op(&mut self, xid: u64, wire: &NetError) -> Result<()> {
        let Some(op) = self.ops.get(&xid) else {
            return Ok(());
        };
        if !op.started {
            return self.finish_op(xid, Err(NetError::Cancelled));
        }
        let bulk = !matches!(op.kind, OpKind::Msg);
        let (own, dest) = (op.tm.own(), TcpAddr::parse(&op.dest).ok());
        let res = self.finish_op(xid, Err(NetError::Cancelled));
        if let (true, Some(own), Some(dest)) = (bulk, own, dest) {
            self.push_status(Opcode::Abort, xid, own, dest, wire);
        }
        res
    }

    /// Fails every operation and transfer of the connection (it broke).
    pub(crate) fn fail_all(&mut self, err: &NetError) {
        self.wq.clear();
        let unreachable = !self.connected;
        for (_, op) in self.ops.drain() {
            let e = if unreachable {
                NetError::Unreachable(op.dest.clone())
            } else {
                err.clone()
            };
            complete(&op.tm, &op.q, Err(e));
        }
        for (_, p) in self.pas.drain() {
            complete(&p.tm, &p.q, Err(err.clone()));
        }
        if let RState::Body {
            body: Body::Recv { claim, tm },
            ..
        } = std::mem::replace(&mut self.rstate, RState::Header)
        {
            tm.sink().release_recv(claim);
        }
    }

    // ----- writing ---------------------------------------------------------

    /// Writes queued frames until done or the socket is full.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if !self.connected {
            return Ok(());
        }
        while !self.wq.is_empty() {
            let r = {
                let mut guards: Vec<Option<MappedMutexGuard<'_, BufVec>>> = Vec::new();
                let mut locked = Vec::new();
                let mut bytes = 0;
                for f in self.wq.iter().take(MAX_BATCH) {
                    if let Data::Buf { q, .. } = &f.data {
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
                    bytes += f.len - f.done;
                    if bytes >= MAX_BATCH_BYTES {
                        break;
                    }
                }
                let mut iov = Vec::with_capacity(guards.len() * 3);
                for (f, g) in self.wq.iter().zip(guards.iter()) {
                    f.slices(g.as_deref(), &mut iov)?;
                    if iov.len() >= 512 {
                        break;
                    }
                }
                // MSG_NOSIGNAL: a peer that reset the connection must not
                // kill a process that did not ignore SIGPIPE.
                socket2::SockRef::from(&self.sock)
                    .send_vectored_with_flags(&iov, libc::MSG_NOSIGNAL)
            };
            match r {
                Ok(0) => return Err(NetError::ConnectionReset("write returned 0".into())),
                Ok(n) => {
                    self.full_since = None;
                    self.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.full_since.get_or_insert_with(Instant::now);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset(&e)),
            }
        }
        self.last_use = Instant::now();
        Ok(())
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(f) = self.wq.front_mut() else {
                return;
            };
            if let Tag::Req(x) = f.tag
                && let Some(op) = self.ops.get_mut(&x)
            {
                op.started = true;
            }
            let rem = f.len - f.done;
            if n < rem {
                f.done += n;
                return;
            }
            n -= rem;
            let f = self.wq.pop_front().expect("front exists");
            if let Tag::Chunk(x, len) = f.tag {
                self.chunk_written(x, len as u64);
            }
        }
    }

    /// A GET_DATA chunk is on the wire; the passive buffer completes with
    /// the last one.
    fn chunk_written(&mut self, xid: u64, n: u64) {
        let Some(p) = self.pas.get_mut(&xid) else {
            return;
        };
        p.written += n;
        if p.written >= p.len {
            let p = self.pas.remove(&xid).expect("present");
            complete(&p.tm, &p.q, Ok(p.len as usize));
        }
    }

    fn push_status(&mut self, op: Opcode, xid: u64, from: TcpAddr, to: TcpAddr, e: &NetError) {
        let (code, detail) = encode_status(e);
        let mut h = Header::new(op, xid, from, to);
        h.status = code;
        h.body_len = detail.len() as u32;
        let data = if detail.is_empty() {
            Data::None
        } else {
            Data::Owned(detail, 0)
        };
        self.wq.push_back(Frame::new(&h, None, data, Tag::Plain));
    }

    /// Answers request `req`: success (no body) or a failure.
    fn respond(&mut self, op: Opcode, req: &Header, status: Option<&NetError>) {
        match status {
            None => {
                let h = Header::new(op, req.xid, req.receiver, req.sender);
                self.wq
                    .push_back(Frame::new(&h, None, Data::None, Tag::Plain));
            }
            Some(e) => self.push_status(op, req.xid, req.receiver, req.sender, e),
        }
    }

    // ----- reading ---------------------------------------------------------

    /// Reads and processes everything available.
    ///
    /// A read that returns less than it asked for drained the socket: the
    /// next arrival raises a new edge, so no second `read` is spent on
    /// `EAGAIN`. With `closed` (the event reported the peer's FIN or an
    /// error, which raises no further edge) it reads on until end of file.
    pub(crate) fn on_readable(&mut self, cx: &Cx<'_>, closed: bool) -> Result<Flow> {
        loop {
            self.process(cx)?;
            match self.read_some(cx) {
                Ok((0, _)) => return Ok(Flow::Eof),
                Ok((_, full)) => {
                    self.last_use = Instant::now();
                    if !full && !closed {
                        self.process(cx)?;
                        return Ok(Flow::Open);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset(&e)),
            }
        }
    }

    /// The buffer and offset a body at `got` goes to, if any.
    fn body_target(&self, h: &Header, body: &Body, got: usize) -> Option<(QueuedBuf, usize)> {
        match body {
            Body::Recv { claim, .. } => Some((claim.buf.clone(), claim.offset + got)),
            Body::Passive(x) => self
                .pas
                .get(x)
                .map(|p| (p.q.clone(), h.offset as usize + got)),
            Body::Active(x) => self
                .ops
                .get(x)
                .map(|o| (o.q.clone(), h.offset as usize + got)),
            Body::Detail(_) | Body::Discard(_) => None,
        }
    }

    /// Reads once; returns the bytes read and whether the read filled all
    /// the space it was given.
    fn read_some(&mut self, cx: &Cx<'_>) -> io::Result<(usize, bool)> {
        let direct = match &self.rstate {
            RState::Body { h, body, got, len }
                if self.rpos == self.rlen && len - got >= DIRECT_MIN =>
            {
                self.body_target(h, body, *got).map(|t| (t, len - got))
            }
            _ => None,
        };
        if let Some(((q, off), left)) = direct {
            let Some(mut bv) = q.data() else {
                return Err(io::Error::other("buffer handed back while being read into"));
            };
            let mut iov: Vec<IoSliceMut<'_>> = bv
                .io_slices_mut(off, left)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let asked = left + self.rbuf.len();
            iov.push(IoSliceMut::new(&mut self.rbuf[..]));
            let n = self.sock.read_vectored(&mut iov)?;
            drop(iov);
            drop(bv);
            let in_body = n.min(left);
            self.rpos = 0;
            self.rlen = n - in_body;
            if let RState::Body { got, .. } = &mut self.rstate {
                *got += in_body;
            }
            cx.stats.add_rx(n);
            return Ok((n, n == asked));
        }
        if self.rbuf.is_empty() {
            self.rbuf = vec![0u8; RBUF];
        }
        if self.rpos == self.rlen {
            self.rpos = 0;
            self.rlen = 0;
        } else if self.rpos > 0 && self.rbuf.len() - self.rpos < HEADER_LEN {
            self.rbuf.copy_within(self.rpos..self.rlen, 0);
            self.rlen -= self.rpos;
            self.rpos = 0;
        }
        let asked = self.rbuf.len() - self.rlen;
        let n = self.sock.read(&mut self.rbuf[self.rlen..])?;
        self.rlen += n;
        cx.stats.add_rx(n);
        Ok((n, n == asked))
    }

    /// Processes what the read buffer holds.
    fn process(&mut self, cx: &Cx<'_>) -> Result<()> {
        loop {
            let avail = self.rlen - self.rpos;
            match std::mem::replace(&mut self.rstate, RState::Header) {
                RState::Header => {
                    if avail < HEADER_LEN {
                        if self.rpos > 0 && self.rbuf.len() - self.rpos < HEADER_LEN {
                            self.rbuf.copy_within(self.rpos..self.rlen, 0);
                            self.rlen = avail;
                            self.rpos = 0;
                        }
                        return Ok(());
                    }
                    let h = Header::decode(&self.rbuf[self.rpos..self.rlen], cx.max_body)?;
                    self.rpos += HEADER_LEN;
                    trace!(conn = self.token, op = ?h.opcode, xid = h.xid, len = h.body_len, "frame");
                    self.start_frame(h)?;
                }
                RState::Desc { h, mut buf } => {
                    let need = usize::from(h.desc_len) - buf.len();
                    let n = need.min(avail);
                    buf.extend_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
                    self.rpos += n;
                    if buf.len() < usize::from(h.desc_len) {
                        self.rstate = RState::Desc { h, buf };
                        return Ok(());
                    }
                    self.desc_done(h, &buf)?;
                }
                RState::Body {
                    h,
                    mut body,
                    got,
                    len,
                } => {
                    let n = (len - got).min(avail);
                    if n > 0 {
                        let src = &self.rbuf[self.rpos..self.rpos + n];
                        if let Body::Detail(v) = &mut body {
                            v.extend_from_slice(src);
                        } else if let Some((q, off)) = self.body_target(&h, &body, got)
                            && let Some(mut bv) = q.data()
                        {
                            bv.copy_in(off, src)?;
                        }
                        self.rpos += n;
                    }
                    if got + n < len {
                        self.rstate = RState::Body {
                            h,
                            body,
                            got: got + n,
                            len,
                        };
                        return Ok(());
                    }
                    self.body_done(h, body)?;
                }
            }
        }
    }

    fn expect_body(&mut self, h: Header, body: Body, len: usize) -> Result<()> {
        if len == 0 {
            return self.body_done(h, body);
        }
        self.rstate = RState::Body {
            h,
            body,
            got: 0,
            len,
        };
        Ok(())
    }

    /// The transfer machine a request is for. On an accepted connection
    /// the receiver must be the listener it was accepted on; on an
    /// outgoing one (a peer answering over the connection we opened, see
    /// [`Conn::learned`]) any listener of this process. Learns the
    /// requester's listening address as a route back to it.
    fn target_tm(&mut self, h: &Header) -> Result<Option<Arc<TmShared>>> {
        let l = match &self.listener {
            Some(l) => {
                if h.receiver.sock() != l.addr {
                    return Err(NetError::Protocol(format!(
                        "frame for {} on a connection to {}",
                        h.receiver, l.addr
                    )));
                }
                let a = h.sender.sock();
                if !self.learned.contains(&a) && self.learned.len() < MAX_ROUTES {
                    self.learned.push(a);
                    self.new_routes = true;
                }
                Arc::clone(l)
            }
            None => match crate::engine::listener_at(h.receiver.sock()) {
                Some(l) => l,
                None => return Ok(None),
            },
        };
        Ok(l.service(h.receiver.service))
    }

    fn start_frame(&mut self, h: Header) -> Result<()> {
        let body_len = h.body_len as usize;
        match h.opcode {
            Opcode::Msg => {
                let body = match self.target_tm(&h)? {
                    None => Body::Discard(Some(NetError::Unreachable(h.receiver.to_string()))),
                    Some(tm) => match tm.sink().claim_recv(body_len) {
                        Ok(claim) => Body::Recv { claim, tm },
                        Err(ClaimError::NoBuffers { notice }) => {
                            // This I/O thread is the receiving machine's own.
                            notice.run();
                            Body::Discard(Some(NetError::NoBuffers))
                        }
                        Err(ClaimError::TooLarge { victim, space }) => {
                            let e = NetError::MessageTooLarge {
                                len: body_len,
                                space,
                            };
                            complete(&tm, &victim, Err(e.clone()));
                            Body::Discard(Some(e))
                        }
                        _ => Body::Discard(Some(NetError::Unreachable(h.receiver.to_string()))),
                    },
                };
                self.expect_body(h, body, body_len)
            }
            Opcode::Get | Opcode::Put => {
                self.rstate = RState::Desc {
                    buf: Vec::with_capacity(h.desc_len.into()),
                    h,
                };
                Ok(())
            }
            Opcode::Abort | Opcode::MsgAck | Opcode::PutAck => {
                self.expect_body(h, Body::Detail(Vec::new()), body_len)
            }
            Opcode::GetData if h.status != 0 => {
                self.expect_body(h, Body::Detail(Vec::new()), body_len)
            }
            Opcode::GetData => {
                let body = match self.ops.get(&h.xid) {
                    Some(Op {
                        kind: OpKind::Get { expected, received },
                        q,
                        ..
                    }) => {
                        let end = h.offset + u64::from(h.chunk);
                        if h.offset != *received || h.total != *expected || end > q.size() as u64 {
                            return Err(NetError::Protocol(format!(
                                "GET_DATA {}+{} of {} does not follow {received} of {expected}",
                                h.offset, h.chunk, h.total
                            )));
                        }
                        Body::Active(h.xid)
                    }
                    Some(_) => {
                        return Err(NetError::Protocol("GET_DATA for a non-GET transfer".into()));
                    }
                    // Given up (aborted or failed): drop the data.
                    None => Body::Discard(None),
                };
                self.expect_body(h, body, body_len)
            }
        }
    }

    fn desc_done(&mut self, h: Header, desc: &[u8]) -> Result<()> {
        let data_len = h.data_len() as usize;
        let verdict = self.bulk_request(&h, desc);
        match (h.opcode, verdict) {
            (Opcode::Get, Ok(())) => Ok(()),
            (Opcode::Get, Err(Some(e))) => {
                self.respond(Opcode::GetData, &h, Some(&e));
                Ok(())
            }
            (Opcode::Put, Ok(())) => self.expect_body(h, Body::Passive(h.xid), data_len),
            (Opcode::Put, Err(e)) => self.expect_body(h, Body::Discard(e), data_len),
            (_, Err(_)) => Ok(()),
            _ => Err(NetError::Protocol(
                "descriptor on a frame without one".into(),
            )),
        }
    }

    /// Checks a GET or PUT request against its transfer (claiming the
    /// passive buffer on the first chunk) and, for a GET, queues the data.
    /// `Err(Some(e))`: answer with `e`; `Err(None)`: drop it silently (a
    /// transfer already failed and answered).
    fn bulk_request(
        &mut self,
        h: &Header,
        desc: &[u8],
    ) -> std::result::Result<(), Option<NetError>> {
        let get = h.opcode == Opcode::Get;
        let active = if get {
            QueueType::ActiveBulkRecv
        } else {
            QueueType::ActiveBulkSend
        };
        let len = if get {
            u64::from(h.chunk)
        } else {
            u64::from(h.data_len())
        };
        let fields = NetBufDesc::from_bytes(desc.to_vec())
            .decode()
            .map_err(Some)?;
        if fields.transport_id != crate::TCP_TRANSPORT_ID {
            return Err(Some(NetError::InvalidDescriptor(
                "made by another transport".into(),
            )));
        }
        if let Some(p) = self.pas.get_mut(&h.xid) {
            let fits = h.offset == p.next && h.offset + len <= p.len;
            if p.get != get
                || p.sender != h.sender
                || p.token != fields.token
                || p.cookie != fields.cookie
                || !fits
            {
                let e = NetError::Protocol(format!(
                    "chunk {}+{len} of transfer {} does not follow {} of {}",
                    h.offset, h.xid, p.next, p.len
                ));
                let p = self.pas.remove(&h.xid).expect("present");
                let _ = self.detach(|t| matches!(t, Tag::Chunk(x, _) if x == h.xid));
                complete(&p.tm, &p.q, Err(e.clone()));
                return Err(Some(e));
            }
            p.next += len;
        } else {
            if h.offset != 0 {
                // The rest of a transfer that failed (and was answered).
                return Err(None);
            }
            let tm = self
                .target_tm(h)
                .map_err(Some)?
                .ok_or_else(|| Some(NetError::Unreachable(h.receiver.to_string())))?;
            let sink = tm.sink();
            let requester = h.sender.to_string();
            match sink.claim_passive(&fields, &requester, active, h.total as usize) {
                Ok(PassiveClaim { buf, len: xlen }) => {
                    let xlen = xlen as u64;
                    if len > xlen || (!get && h.total != xlen) {
                        // A malformed request: refused, and the passive
                        // buffer stays queued for a genuine one.
                        sink.release_claim(&buf);
                        let e = NetError::Protocol("first chunk outside the transfer".into());
                        return Err(Some(e));
                    }
                    self.pas.insert(
                        h.xid,
                        Pxfer {
                            tm,
                            q: buf,
                            len: xlen,
                            next: len,
                            written: 0,
                            sender: h.sender,
                            token: fields.token,
                            cookie: fields.cookie,
                            get,
                        },
                    );
                }
                Err(PassiveError { error, notice }) => {
                    // This I/O thread is the passive machine's own.
                    notice.run();
                    return Err(Some(error));
                }
            }
        }
        if get {
            let p = &self.pas[&h.xid];
            let mut r = Header::new(Opcode::GetData, h.xid, h.receiver, h.sender);
            r.offset = h.offset;
            r.total = p.len;
            r.chunk = len as u32;
            r.body_len = len as u32;
            let data = Data::Buf {
                q: p.q.clone(),
                off: h.offset as usize,
                len: len as usize,
            };
            self.wq
                .push_back(Frame::new(&r, None, data, Tag::Chunk(h.xid, len as usize)));
        }
        Ok(())
    }

    fn body_done(&mut self, h: Header, body: Body) -> Result<()> {
        match body {
            Body::Recv { claim, tm } => {
                self.respond(Opcode::MsgAck, &h, None);
                tm.sink()
                    .post_msg(claim, h.body_len as usize, &h.sender.to_string());
            }
            Body::Discard(reply) => {
                if let Some(e) = reply {
                    let op = match h.opcode {
                        Opcode::Msg => Opcode::MsgAck,
                        _ => Opcode::PutAck,
                    };
                    self.respond(op, &h, Some(&e));
                }
            }
            Body::Passive(x) => {
                if !h.is_last() {
                    return Ok(());
                }
                let Some(p) = self.pas.remove(&x) else {
                    return Ok(());
                };
                if p.next == p.len {
                    self.respond(Opcode::PutAck, &h, None);
                    complete(&p.tm, &p.q, Ok(p.len as usize));
                } else {
                    let e = NetError::Protocol("last PUT chunk before the end".into());
                    self.respond(Opcode::PutAck, &h, Some(&e));
                    complete(&p.tm, &p.q, Err(e));
                }
            }
            Body::Active(x) => {
                let done = match self.ops.get_mut(&x) {
                    Some(Op {
                        kind: OpKind::Get { expected, received },
                        ..
                    }) => {
                        *received += u64::from(h.chunk);
                        (*received == *expected).then_some(*expected as usize)
                    }
                    _ => None,
                };
                if let Some(n) = done {
                    self.finish_op(x, Ok(n))?;
                }
            }
            Body::Detail(d) => {
                let status = if h.status == 0 {
                    Ok(())
                } else {
                    Err(decode_status(h.status, &d)?)
                };
                self.on_status(&h, status)?;
            }
        }
        Ok(())
    }

    fn on_status(&mut self, h: &Header, status: std::result::Result<(), NetError>) -> Result<()> {
        match h.opcode {
            Opcode::Abort => {
                let e = status.err().unwrap_or(NetError::Cancelled);
                if let Some(p) = self.pas.remove(&h.xid) {
                    debug!(conn = self.token, xid = h.xid, %e, "peer aborted a bulk transfer");
                    let _ = self.detach(|t| matches!(t, Tag::Chunk(x, _) if x == h.xid));
                    complete(&p.tm, &p.q, Err(e));
                }
                Ok(())
            }
            _ => {
                let Some(op) = self.ops.get(&h.xid) else {
                    return Ok(());
                };
                let kind_ok = matches!(
                    (&op.kind, h.opcode),
                    (OpKind::Msg, Opcode::MsgAck)
                        | (OpKind::Put { .. }, Opcode::PutAck)
                        | (OpKind::Get { .. }, Opcode::GetData)
                );
                if !kind_ok {
                    return Err(NetError::Protocol(format!(
                        "{:?} for another kind of transfer",
                        h.opcode
                    )));
                }
                let st = match (status, &op.kind) {
                    (Err(e), _) => Err(e),
                    (Ok(()), OpKind::Msg) => Ok(op.q.length()),
                    (Ok(()), OpKind::Put { total }) => Ok(*total as usize),
                    (Ok(()), OpKind::Get { .. }) => {
                        return Err(NetError::Protocol("GET_DATA without data".into()));
                    }
                };
                self.finish_op(h.xid, st)
            }
        }
    }

    // ----- deletions of incoming-side buffers --------------------------------

    /// Aborts whatever this connection does with receive or passive buffer
    /// `q` (timeout, stop with abort). Returns true if it found something.
    pub(crate) fn abort_incoming(&mut self, q: &QueuedBuf, wire: &NetError) -> bool {
        let t = q.token();
        let mut found = false;
        if let RState::Body { body, h, .. } = &mut self.rstate
            && matches!(body, Body::Recv { claim, .. } if claim.buf.token() == t)
        {
            if let Body::Recv { claim, tm } =
                std::mem::replace(body, Body::Discard(Some(wire.clone())))
            {
                trace!(conn = self.token, xid = h.xid, "message read aborted");
                tm.sink().release_recv(claim);
            }
            found = true;
        }
        let xids: Vec<u64> = self
            .pas
            .iter()
            .filter(|(_, p)| p.q.token() == t)
            .map(|(x, _)| *x)
            .collect();
        for x in xids {
            let p = self.pas.remove(&x).expect("present");
            let _ = self.detach(|tg| matches!(tg, Tag::Chunk(y, _) if y == x));
            let op = if p.get {
                Opcode::GetData
            } else {
                Opcode::PutAck
            };
            if let Some(own) = p.tm.own() {
                self.push_status(op, x, own, p.sender, wire);
            }
            complete(&p.tm, &p.q, Err(NetError::Cancelled));
            found = true;
        }
        found
    }
}
