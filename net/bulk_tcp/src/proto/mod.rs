//! The protocol of one TCP connection, without sockets: framing, the
//! outgoing operation table, incoming passive transfers, the write queue
//! and the connection's timers. Bytes and events go in, frames and
//! completions come out; time is an argument.
//!
//! The I/O layer (`conn.rs`, `engine.rs`) owns the socket and asks this
//! module what to do with it:
//!
//! * **Writing.** [`Proto::to_write`] describes the unwritten part of each
//!   queued frame ([`Out`]): header and descriptor bytes, then data that is
//!   either owned bytes or a region of a registered buffer. The I/O layer
//!   locks those buffers and writes everything with one vectored write
//!   straight from registered memory, then reports how much went out with
//!   [`Proto::written`] (or [`Proto::write_blocked`] when the socket is
//!   full).
//! * **Reading.** [`Proto::recv_space`] says where the next read goes
//!   ([`RecvSpace`]): when a body with at least [`DIRECT_MIN`] bytes left is
//!   being read and nothing is buffered, first straight into the claimed
//!   registered buffer ([`Direct`]), then into the read buffer (so that the
//!   next header arrives in the same call); otherwise into the read buffer
//!   only, from which small bodies that arrived with their header are
//!   copied. [`Proto::received`] takes the byte count and processes the
//!   frames.
//! * **Operations.** [`Proto::start`] queues a message or an active bulk
//!   transfer, [`Proto::del_outgoing`] and [`Proto::abort_incoming`] end
//!   one early, [`Proto::fail_all`] ends everything when the connection
//!   breaks.
//! * **Time.** [`Proto::connect_expired`] and [`Proto::sweep`] judge the
//!   connect deadline, idleness and write stalls at the `now` they are
//!   given.
//!
//! What a request means to the core (claiming a receive or passive buffer,
//! posting a message, completing a buffer) is decided here and done
//! through the transfer machine's [`TmSink`]: those calls are not I/O.
//! The transfer machines are reached through two small seams, [`Machine`]
//! (a transfer machine: its sink and address) and [`Directory`] (which
//! transfer machine of this process an address names), so that the tests
//! run the protocol on real transfer machines of a fake transport.

use std::collections::{HashSet, VecDeque};

use colibri_net::fasthash::{FastMap, FastState};
use std::io::IoSlice;
use std::net::SocketAddrV4;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use colibri_net::xprt::{
    ClaimError, Delivery, PassiveClaim, PassiveError, QueuedBuf, RecvClaim, TmSink,
};
use colibri_net::{BufVec, NetBufDesc, NetError, QueueType, Result};
use tracing::{debug, trace};

use crate::addr::TcpAddr;
use crate::wire::{FLAG_ACKS, FLAG_LAST, HEADER_LEN, Header, Opcode, decode_status, encode_status};

#[cfg(test)]
mod tests;

/// Size of a connection's read buffer.
pub(crate) const RBUF: usize = 64 * 1024;
/// Bodies with at least this much left are read straight into the buffer.
pub(crate) const DIRECT_MIN: usize = 2048;
/// Most peer listening addresses learned on one connection: every
/// transfer machine behind a client's connection is answered over it
/// (a thousand client machines in one domain share one connection), and
/// the bound only stops a peer from growing our memory without limit by
/// naming ever new senders (past it, answers open their own connection).
const MAX_ROUTES: usize = 1 << 16;

/// A transfer machine, as the protocol sees it.
pub(crate) trait Machine {
    /// Its end of the core.
    fn sink(&self) -> &TmSink;

    /// Its own address, once started.
    fn own(&self) -> Option<TcpAddr>;

    /// Completes one of its buffers (every completion the protocol makes
    /// goes through here; the callbacks run on the calling thread).
    fn complete(&self, q: &QueuedBuf, status: Result<usize>) {
        self.sink().complete(q, status);
    }

    /// Completes one of its buffers, returning the callbacks to run later.
    fn complete_deferred(&self, q: &QueuedBuf, status: Result<usize>) -> Delivery {
        self.sink().complete_deferred(q, status)
    }
}

/// The transfer machines of this process, by address: where requests
/// arriving on a connection are delivered.
pub(crate) trait Directory<M> {
    /// The started transfer machine at `addr`, if any.
    fn machine(&self, addr: &TcpAddr) -> Option<Arc<M>>;

    /// A number that changes whenever [`Directory::machine`] may answer
    /// differently for some address (a machine started or stopped), or
    /// `None` when the directory cannot tell: a connection then looks
    /// every request's machine up again instead of reusing the last one.
    fn generation(&self) -> Option<u64> {
        None
    }
}

/// What the protocol needs from the transport's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProtoConfig {
    /// Bulk transfers move in chunks of this many bytes.
    pub(crate) chunk: usize,
    /// Largest body accepted (the largest buffer plus room for a
    /// descriptor).
    pub(crate) max_body: u32,
}

impl ProtoConfig {
    /// The protocol's part of a transport configuration.
    pub(crate) fn new(cfg: &crate::TcpConfig) -> Self {
        Self {
            chunk: cfg.chunk,
            max_body: u32::try_from(cfg.limits.max_buffer_size + 65536).unwrap_or(u32::MAX),
        }
    }
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
    /// A MSG_ACK with status 0 for the peer's message `xid` (it may ride in
    /// the header of a message that follows it, [`FLAG_ACKS`]).
    Ack(u64),
    /// A request frame of outgoing transfer `xid`.
    Req(u64),
    /// A data chunk of incoming GET transfer `xid`.
    Chunk(u64, usize),
}

/// A frame in the write queue.
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

    /// The unwritten part.
    fn out(&self) -> Out<'_> {
        let mut skip = self.done;
        let desc: &[u8] = self.desc.as_deref().unwrap_or(&[]);
        let mut head: [&[u8]; 2] = [&[], &[]];
        for (slot, part) in head.iter_mut().zip([&self.hdr[..], desc]) {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                *slot = &part[skip..];
                skip = 0;
            }
        }
        let data = match &self.data {
            Data::None => OutData::None,
            Data::Buf { q, off, len } => OutData::Buf {
                buf: q,
                off: off + skip,
                len: len - skip,
            },
            Data::Owned(v, base) => OutData::Bytes(&v[skip - base..]),
        };
        Out {
            head,
            data,
            left: self.len - self.done,
        }
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

/// The unwritten part of one queued frame: what the I/O layer writes, in
/// this order.
#[derive(Debug)]
pub(crate) struct Out<'a> {
    /// Header bytes, then descriptor bytes, not yet written (either may be
    /// empty).
    pub(crate) head: [&'a [u8]; 2],
    /// Data not yet written.
    pub(crate) data: OutData<'a>,
    /// Bytes of the frame not yet written.
    pub(crate) left: usize,
}

/// The data part of an [`Out`].
#[derive(Debug)]
pub(crate) enum OutData<'a> {
    /// No data.
    None,
    /// Bytes the protocol owns (a status detail, a detached tail).
    Bytes(&'a [u8]),
    /// A region of a registered buffer, written straight from it.
    Buf {
        /// The buffer; lock it with [`QueuedBuf::data`] for the write.
        buf: &'a QueuedBuf,
        /// Offset of the region.
        off: usize,
        /// Length of the region.
        len: usize,
    },
}

impl<'a> Out<'a> {
    /// The registered buffer whose memory the write needs, if any.
    pub(crate) fn buf(&self) -> Option<&'a QueuedBuf> {
        match self.data {
            OutData::Buf { buf, .. } => Some(buf),
            _ => None,
        }
    }

    /// Appends the frame's unwritten slices to `iov`; `mem` is the locked
    /// memory of [`Out::buf`].
    ///
    /// # Errors
    /// `Cancelled` when the frame needs buffer memory and `mem` is `None`;
    /// a range error if the region is outside the buffer.
    pub(crate) fn slices<'b>(
        &self,
        mem: Option<&'b BufVec>,
        iov: &mut impl IovSink<'b>,
    ) -> Result<()>
    where
        'a: 'b,
    {
        for p in self.head {
            if !p.is_empty() {
                iov.push_slice(p);
            }
        }
        match self.data {
            OutData::None => {}
            OutData::Bytes(b) => {
                if !b.is_empty() {
                    iov.push_slice(b);
                }
            }
            OutData::Buf { off, len, .. } => {
                let bv = mem.ok_or(NetError::Cancelled)?;
                bv.each_slice(off, len, |s| iov.push_slice(s))?;
            }
        }
        Ok(())
    }
}

/// Where [`Out::slices`] appends the slices of a write: one push per
/// slice, no iterator adaptor on the per-message path.
pub(crate) trait IovSink<'b> {
    /// Appends one slice.
    fn push_slice(&mut self, s: &'b [u8]);
}

impl<'b, A: smallvec::Array<Item = IoSlice<'b>>> IovSink<'b> for smallvec::SmallVec<A> {
    #[inline]
    fn push_slice(&mut self, s: &'b [u8]) {
        self.push(IoSlice::new(s));
    }
}

impl<'b> IovSink<'b> for Vec<IoSlice<'b>> {
    #[inline]
    fn push_slice(&mut self, s: &'b [u8]) {
        self.push(IoSlice::new(s));
    }
}

/// Where the next read goes: first `direct` (if any), then `spare`.
#[derive(Debug)]
pub(crate) struct RecvSpace<'a> {
    /// A body region to read straight into registered memory.
    pub(crate) direct: Option<Direct>,
    /// Free space of the read buffer (for the next headers).
    pub(crate) spare: &'a mut [u8],
}

/// The region of a registered buffer the next body bytes go to.
#[derive(Debug)]
pub(crate) struct Direct {
    /// The buffer; lock it with [`QueuedBuf::data`] for the read.
    pub(crate) buf: QueuedBuf,
    /// Offset in the buffer.
    pub(crate) off: usize,
    /// Body bytes left (the region's length).
    pub(crate) len: usize,
}

/// Why a connection's timer gives it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Not established before the connect deadline.
    Connect,
    /// An outgoing connection with nothing in flight and no traffic for
    /// the idle timeout (reaped by the skulker).
    Idle,
    /// The socket stayed full with no write progress for the idle timeout
    /// (the peer stopped reading).
    Stalled,
}

impl Expiry {
    /// The status of what was in flight when the connection was closed.
    pub(crate) fn error(self) -> NetError {
        match self {
            Self::Connect | Self::Stalled => NetError::TimedOut,
            Self::Idle => NetError::ConnectionReset("idle".into()),
        }
    }
}

/// Where an outgoing operation goes and what it carries: the result of
/// [`plan`].
#[derive(Debug)]
pub(crate) struct Plan {
    /// The destination transfer machine (the message's end point, or the
    /// descriptor's owner).
    pub(crate) dest: TcpAddr,
    /// For active bulk: the encoded descriptor and the passive length it
    /// names.
    pub(crate) bulk: Option<(Arc<[u8]>, u64)>,
}

/// Checks what an outgoing buffer needs before it is started: a message's
/// end point must be a TCP address; an active buffer's descriptor must
/// name a TCP owner and re-encode.
///
/// # Errors
/// The status the buffer completes with (`InvalidArgument`,
/// `InvalidDescriptor`).
pub(crate) fn plan(q: &QueuedBuf) -> Result<Plan> {
    match q.queue() {
        QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => {
            let f = q
                .desc()
                .ok_or_else(|| NetError::InvalidDescriptor("missing".into()))?;
            let dest = TcpAddr::parse(&f.owner)
                .map_err(|_| NetError::InvalidDescriptor("owner is not a TCP address".into()))?;
            let d = NetBufDesc::encode(f, usize::MAX)?;
            Ok(Plan {
                dest,
                bulk: Some((Arc::<[u8]>::from(d.into_bytes()), f.len)),
            })
        }
        _ => {
            let dest = q
                .end_point()
                .and_then(|ep| ep.downcast::<TcpAddr>().copied())
                .ok_or_else(|| NetError::InvalidArgument("send without a TCP end point".into()))?;
            Ok(Plan { dest, bulk: None })
        }
    }
}

/// An outgoing operation waiting for its response.
struct Op<M> {
    tm: Arc<M>,
    q: QueuedBuf,
    kind: OpKind,
    /// Destination, for errors and the ABORT of a bulk transfer.
    dest: TcpAddr,
    /// Some of its request bytes are on the wire.
    started: bool,
}

enum OpKind {
    Msg,
    Get { expected: u64, received: u64 },
    Put { total: u64 },
}

/// An incoming bulk transfer against one of our passive buffers.
struct Pxfer<M> {
    tm: Arc<M>,
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
enum Body<M> {
    /// A message going into a claimed receive buffer.
    Recv { claim: RecvClaim, tm: Arc<M> },
    /// PUT data for incoming transfer `xid`.
    Passive(u64),
    /// GET_DATA data for outgoing transfer `xid`.
    Active(u64),
    /// A status detail.
    Detail(Vec<u8>),
    /// Bytes to drop, then perhaps a failure to answer with.
    Discard(Option<NetError>),
}

/// The read state machine: header, then descriptor (GET, PUT), then body.
enum RState<M> {
    Header,
    Desc {
        h: Header,
        buf: Vec<u8>,
    },
    Body {
        h: Header,
        body: Body<M>,
        got: usize,
        len: usize,
    },
}

/// The protocol state of one connection.
///
/// A connection is *outgoing* (this domain connected to a peer's
/// listener) or *incoming* (accepted on one of our listeners). Requests
/// travel both ways on either kind: a peer answers over the connection we
/// opened, and we send requests back over a connection a peer opened (see
/// [`Proto::learned`]).
/// Senders whose printed addresses a connection keeps.
const SENDER_NAMES: usize = 4096;

pub(crate) struct Proto<M> {
    /// Connection id, for logs.
    id: usize,
    cfg: ProtoConfig,
    /// The listener address it was accepted on (incoming).
    local: Option<SocketAddrV4>,
    connected: bool,
    connect_deadline: Option<Instant>,
    last_use: Instant,
    /// Since when the socket has been full with no write progress.
    full_since: Option<Instant>,
    wq: VecDeque<Frame>,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
    /// Body bytes the last [`RecvSpace`] offered for a direct read.
    direct: usize,
    rstate: RState<M>,
    ops: FastMap<u64, Op<M>>,
    next_xid: u64,
    pas: FastMap<u64, Pxfer<M>>,
    /// Peers' listening addresses learned from requests on this incoming
    /// connection ([`Proto::learned`]).
    learned: HashSet<SocketAddrV4, FastState>,
    /// Learned since the engine last took them.
    fresh: Vec<SocketAddrV4>,
    /// The sender of the last request: a busy peer costs no hash lookup.
    last_learned: Option<SocketAddrV4>,
    /// The machine the last request was for, with the directory's
    /// generation at the lookup: the next request for the same address
    /// reuses it while the generation stands (held weakly: a connection
    /// never keeps a machine alive).
    last_tm: Option<(TcpAddr, u64, Weak<M>)>,
    /// Sender addresses seen and their printed forms: a peer's address
    /// is formatted once, not per message.
    sender_names: FastMap<TcpAddr, Arc<str>>,
    /// The last sender and its printed form (traffic comes in runs from
    /// one sender: no hash lookup for those).
    last_sender: Option<(TcpAddr, Arc<str>)>,
    /// Callbacks of sends completed by an acknowledgement, run after the
    /// answers the same read produced are written ([`Proto::run_later`]):
    /// a request and the acknowledgement of our previous answer arrive
    /// together, and the answer should not wait for that callback.
    later: Vec<Delivery>,
}

impl<M> std::fmt::Debug for Proto<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proto")
            .field("id", &self.id)
            .field("local", &self.local)
            .field("connected", &self.connected)
            .field("queued_frames", &self.wq.len())
            .field("ops", &self.ops.len())
            .field("passive", &self.pas.len())
            .finish_non_exhaustive()
    }
}

impl<M: Machine> Proto<M> {
    fn new(id: usize, cfg: ProtoConfig, local: Option<SocketAddrV4>, now: Instant) -> Self {
        Self {
            id,
            cfg,
            local,
            connected: local.is_some(),
            connect_deadline: None,
            last_use: now,
            full_since: None,
            wq: VecDeque::new(),
            // Allocated on the first read: idle connections cost no buffer.
            rbuf: Vec::new(),
            rpos: 0,
            rlen: 0,
            direct: 0,
            rstate: RState::Header,
            ops: FastMap::default(),
            next_xid: 1,
            pas: FastMap::default(),
            learned: HashSet::default(),
            fresh: Vec::new(),
            last_learned: None,
            last_tm: None,
            sender_names: FastMap::default(),
            last_sender: None,
            later: Vec::new(),
        }
    }

    /// True when completions wait for [`Proto::run_later`].
    pub(crate) fn has_later(&self) -> bool {
        !self.later.is_empty()
    }

    /// Runs the callbacks of acknowledged sends (after the writes they
    /// were kept behind).
    pub(crate) fn run_later(&mut self) {
        for d in self.later.drain(..) {
            d.run();
        }
    }

    /// The printed form of `a`, cached for the connection's senders (a
    /// server's connection from a client domain carries the messages of
    /// all its transfer machines: formatting each sender's address anew
    /// cost more than the rest of the message's protocol work). At most
    /// [`SENDER_NAMES`] are kept; the cache starts over when full.
    fn sender_name(&mut self, a: TcpAddr) -> &str {
        if self.last_sender.as_ref().is_none_or(|(l, _)| *l != a) {
            if self.sender_names.len() >= SENDER_NAMES && !self.sender_names.contains_key(&a) {
                self.sender_names.clear();
            }
            let name = self
                .sender_names
                .entry(a)
                .or_insert_with(|| Arc::from(a.to_string()));
            self.last_sender = Some((a, Arc::clone(name)));
        }
        self.last_sender.as_ref().map_or("", |(_, n)| n)
    }

    /// A connection being opened at `now`, given up if not established by
    /// `deadline`.
    pub(crate) fn connecting(id: usize, cfg: ProtoConfig, now: Instant, deadline: Instant) -> Self {
        let mut p = Self::new(id, cfg, None, now);
        p.connect_deadline = Some(deadline);
        p
    }

    /// A connection accepted at `now` on our listener at `local`.
    pub(crate) fn accepted(id: usize, cfg: ProtoConfig, local: SocketAddrV4, now: Instant) -> Self {
        Self::new(id, cfg, Some(local), now)
    }

    /// True for a connection we opened.
    pub(crate) fn is_outgoing(&self) -> bool {
        self.local.is_none()
    }

    /// True once established (incoming connections always are).
    pub(crate) fn is_connected(&self) -> bool {
        self.connected
    }

    /// The connection is established: frames may be written.
    pub(crate) fn set_connected(&mut self) {
        self.connected = true;
        self.connect_deadline = None;
    }

    /// When an unestablished connection is given up.
    pub(crate) fn connect_deadline(&self) -> Option<Instant> {
        self.connect_deadline
    }

    /// The last time bytes were read, or everything queued was written.
    pub(crate) fn last_use(&self) -> Instant {
        self.last_use
    }

    /// True when nothing is in flight: the skulker may close it.
    pub(crate) fn is_idle(&self) -> bool {
        self.ops.is_empty()
            && self.pas.is_empty()
            && self.wq.is_empty()
            && matches!(self.rstate, RState::Header)
            && self.rpos == self.rlen
    }

    /// True when frames wait to be written.
    pub(crate) fn has_output(&self) -> bool {
        !self.wq.is_empty()
    }

    /// Listening addresses of the peer's transfer machines that sent
    /// requests on this (accepted) connection: our requests to them may
    /// travel over it too, so that a request and the answer to the peer's
    /// share a segment.
    pub(crate) fn learned(&self) -> impl Iterator<Item = &SocketAddrV4> {
        self.learned.iter()
    }

    /// The addresses learned since the last call.
    pub(crate) fn take_new_routes(&mut self) -> std::vec::Drain<'_, SocketAddrV4> {
        self.fresh.drain(..)
    }

    // ----- time --------------------------------------------------------------

    /// True when the connection is still not established at `now`, past
    /// its deadline.
    pub(crate) fn connect_expired(&self, now: Instant) -> bool {
        self.connect_deadline.is_some_and(|d| d <= now)
    }

    /// The skulker's verdict at `now`: an outgoing connection idle for
    /// `idle` is reaped, a connection whose socket stayed full without
    /// progress for `idle` is given up.
    pub(crate) fn sweep(&self, now: Instant, idle: Duration) -> Option<Expiry> {
        if self.is_outgoing()
            && self.connected
            && self.is_idle()
            && now.saturating_duration_since(self.last_use) >= idle
        {
            return Some(Expiry::Idle);
        }
        if self
            .full_since
            .is_some_and(|t| now.saturating_duration_since(t) >= idle)
        {
            return Some(Expiry::Stalled);
        }
        None
    }

    // ----- outgoing operations -------------------------------------------

    /// Queues the operation of buffer `q` (in use by the transport) of
    /// transfer machine `tm`, whose address is `own`: a MSG frame for a
    /// message; GET requests for an active receive, PUT chunks for an
    /// active send.
    pub(crate) fn start(&mut self, tm: Arc<M>, q: QueuedBuf, own: TcpAddr, plan: Plan) {
        let Plan { dest, bulk } = plan;
        match bulk {
            Some((desc, passive_len)) => self.start_bulk(tm, q, own, dest, desc, passive_len),
            None => self.start_msg(tm, q, own, dest),
        }
    }

    fn start_msg(&mut self, tm: Arc<M>, q: QueuedBuf, own: TcpAddr, dest: TcpAddr) {
        let xid = self.alloc_xid();
        let len = q.length();
        let mut h = Header::new(Opcode::Msg, xid, own, dest);
        h.total = len as u64;
        h.body_len = len as u32;
        // A successful MSG_ACK queued last and not yet started rides in
        // this header instead of going as a frame of its own.
        if let Some(Frame {
            tag: Tag::Ack(acked),
            done: 0,
            ..
        }) = self.wq.back()
        {
            h.flags |= FLAG_ACKS;
            h.offset = *acked;
            self.wq.pop_back();
        }
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
                dest,
                started: false,
            },
        );
    }

    fn start_bulk(
        &mut self,
        tm: Arc<M>,
        q: QueuedBuf,
        own: TcpAddr,
        dest: TcpAddr,
        desc: Arc<[u8]>,
        passive_len: u64,
    ) {
        let xid = self.alloc_xid();
        let chunk = self.cfg.chunk.max(1) as u64;
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
                dest,
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
        // In place: the queue keeps its allocation (an acknowledged
        // message usually has no frame left at all).
        if self.wq.is_empty() {
            return Ok(());
        }
        let mut res = Ok(());
        self.wq.retain_mut(|f| {
            if !tag(f.tag) {
                return true;
            }
            if f.done == 0 {
                // A message that carries an acknowledgement ([`FLAG_ACKS`])
                // leaves it behind, as a frame of its own.
                return match Header::decode(&f.hdr, u32::MAX) {
                    Ok(h) => match h.acks() {
                        Some(acked) => {
                            let ack = Header::new(Opcode::MsgAck, acked, h.sender, h.receiver);
                            *f = Frame::new(&ack, None, Data::None, Tag::Ack(acked));
                            true
                        }
                        None => false,
                    },
                    Err(e) => {
                        res = Err(e);
                        false
                    }
                };
            }
            if let Err(e) = f.detach() {
                res = Err(e);
            }
            f.tag = Tag::Plain;
            true
        });
        res
    }

    /// Claims receive space, first running deferred completions if that
    /// is what frees a buffer (a server echoing from its receive buffers
    /// gets them back before the next request needs one).
    fn claim_recv(&mut self, tm: &M, len: usize) -> std::result::Result<RecvClaim, ClaimError> {
        if !self.later.is_empty() {
            if let Some(c) = tm.sink().try_claim_recv(len) {
                return Ok(c);
            }
            self.run_later();
        }
        tm.sink().claim_recv(len)
    }

    /// Finishes outgoing transfer `xid` by its answer: its callbacks wait
    /// in `later`.
    fn finish_op_later(&mut self, xid: u64, status: Result<usize>) -> Result<()> {
        let detached = self.detach(|t| t == Tag::Req(xid));
        if let Some(op) = self.ops.remove(&xid) {
            let d = op.tm.complete_deferred(&op.q, status);
            if d.is_pending() {
                self.later.push(d);
            }
        }
        detached
    }

    /// Finishes outgoing transfer `xid` with `status`.
    fn finish_op(&mut self, xid: u64, status: Result<usize>) -> Result<()> {
        let detached = self.detach(|t| t == Tag::Req(xid));
        if let Some(op) = self.ops.remove(&xid) {
            op.tm.complete(&op.q, status);
        }
        detached
    }

    /// A deletion (cancel, timeout, stop with abort) of outgoing buffer
    /// `q` in use: its transfer, if it is on this connection, ends now and
    /// the buffer completes `Cancelled` (the core reports `TimedOut` after
    /// a timeout). Frames not yet started are withdrawn; a frame partly on
    /// the wire is finished from a copy of its unwritten part (a frame
    /// cannot be cut short without closing the connection), so a message
    /// already partly sent still arrives whole. A bulk transfer's peer is
    /// told with an ABORT carrying `wire`, the status its passive buffer
    /// completes with.
    ///
    /// A plain cancel (`cancel`) of a message whose bytes are all written
    /// changes nothing: it cannot be taken back, so it completes with the
    /// receiver's acknowledgement (a cancelled message is never one that
    /// arrived). A timeout or a stop with abort ends it all the same.
    ///
    /// Returns whether the transfer was on this connection.
    ///
    /// # Errors
    /// The partly written frame could not be copied: the connection must
    /// be closed (its stream cannot be finished).
    pub(crate) fn del_outgoing(
        &mut self,
        q: &QueuedBuf,
        wire: &NetError,
        cancel: bool,
    ) -> Result<bool> {
        let t = q.token();
        let Some((&xid, op)) = self.ops.iter().find(|(_, o)| o.q.token() == t) else {
            return Ok(false);
        };
        if !op.started {
            self.finish_op(xid, Err(NetError::Cancelled))?;
            return Ok(true);
        }
        let bulk = !matches!(op.kind, OpKind::Msg);
        if cancel && !bulk && !self.wq.iter().any(|f| f.tag == Tag::Req(xid)) {
            trace!(
                conn = self.id,
                xid, "cancel of a message already written: it completes when acknowledged"
            );
            return Ok(true);
        }
        let (own, dest) = (op.tm.own(), op.dest);
        let res = self.finish_op(xid, Err(NetError::Cancelled));
        if let (true, Some(own)) = (bulk, own) {
            self.push_status(Opcode::Abort, xid, own, dest, wire);
        }
        res.map(|()| true)
    }

    /// Fails every operation and transfer of the connection (it broke):
    /// each buffer is completed once, with `err` (`Unreachable` for the
    /// operations of a connection never established), a half-read
    /// message's claim is released, and the write queue is dropped.
    pub(crate) fn fail_all(&mut self, err: &NetError) {
        // Sends already acknowledged complete as they were.
        self.run_later();
        self.wq.clear();
        let unreachable = !self.connected;
        for (_, op) in self.ops.drain() {
            let e = if unreachable {
                NetError::Unreachable(op.dest.to_string())
            } else {
                err.clone()
            };
            op.tm.complete(&op.q, Err(e));
        }
        for (_, p) in self.pas.drain() {
            p.tm.complete(&p.q, Err(err.clone()));
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

    /// The unwritten part of each queued frame, in order. Nothing is
    /// written before the connection is established.
    pub(crate) fn to_write(&self) -> impl Iterator<Item = Out<'_>> {
        let n = if self.connected { self.wq.len() } else { 0 };
        self.wq.iter().take(n).map(Frame::out)
    }

    /// `n` bytes of the frames [`Proto::to_write`] described went out at
    /// `now`. Frames fully written take effect: a request marks its
    /// operation started, the last GET_DATA chunk of an incoming transfer
    /// completes the passive buffer.
    pub(crate) fn written(&mut self, mut n: usize, now: Instant) {
        self.full_since = None;
        while n > 0 {
            let Some(f) = self.wq.front_mut() else {
                break;
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
            let tag = f.tag;
            // Dropped where it is (not moved out first).
            self.wq.pop_front();
            if let Tag::Chunk(x, len) = tag {
                self.chunk_written(x, len as u64);
            }
        }
        if self.wq.is_empty() {
            self.last_use = now;
            self.trim();
        }
    }

    /// Gives back the memory a burst left in the connection's queues and
    /// tables once they are empty: a connection that once queued thousands
    /// of frames keeps a few hundred bytes, not their capacity, while it
    /// lingers until it is reaped.
    fn trim(&mut self) {
        const KEEP: usize = 16;
        if self.wq.is_empty() && self.wq.capacity() > 4 * KEEP {
            self.wq.shrink_to(KEEP);
        }
        if self.ops.is_empty() && self.ops.capacity() > 4 * KEEP {
            self.ops.shrink_to(KEEP);
        }
        if self.pas.is_empty() && self.pas.capacity() > 4 * KEEP {
            self.pas.shrink_to(KEEP);
        }
        if self.later.is_empty() && self.later.capacity() > 4 * KEEP {
            self.later.shrink_to(KEEP);
        }
    }

    /// The socket took nothing at `now` (full): the stall timer runs from
    /// the first such time until the next progress.
    pub(crate) fn write_blocked(&mut self, now: Instant) {
        self.full_since.get_or_insert(now);
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
            p.tm.complete(&p.q, Ok(p.len as usize));
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
                let tag = if op == Opcode::MsgAck {
                    Tag::Ack(req.xid)
                } else {
                    Tag::Plain
                };
                self.wq.push_back(Frame::new(&h, None, Data::None, tag));
            }
            Some(e) => self.push_status(op, req.xid, req.receiver, req.sender, e),
        }
    }

    // ----- reading ---------------------------------------------------------

    /// True when the connection has no read buffer (it gave it back with
    /// [`Proto::take_idle_rbuf`], or never read): give it one from a pool
    /// with [`Proto::give_rbuf`] before the next read, else
    /// [`Proto::recv_space`] allocates one.
    pub(crate) fn needs_rbuf(&self) -> bool {
        self.rbuf.is_empty()
    }

    /// Gives the connection a read buffer of [`RBUF`] bytes (its content
    /// does not matter).
    pub(crate) fn give_rbuf(&mut self, buf: Vec<u8>) {
        debug_assert_eq!(buf.len(), RBUF);
        if self.rbuf.is_empty() && buf.len() == RBUF {
            self.rbuf = buf;
        }
    }

    /// The read buffer, when it holds no unprocessed byte: a connection
    /// between reads then keeps no read buffer, and an idle one costs a
    /// few hundred bytes instead of [`RBUF`].
    pub(crate) fn take_idle_rbuf(&mut self) -> Option<Vec<u8>> {
        if self.rpos != self.rlen || self.rbuf.is_empty() {
            return None;
        }
        self.rpos = 0;
        self.rlen = 0;
        self.trim();
        Some(std::mem::take(&mut self.rbuf))
    }

    /// Where the next read goes. Follow it with [`Proto::received`] (with
    /// the bytes the read returned), or with nothing if it returned none.
    pub(crate) fn recv_space(&mut self) -> RecvSpace<'_> {
        let direct = match &self.rstate {
            RState::Body { h, body, got, len }
                if self.rpos == self.rlen && len - got >= DIRECT_MIN =>
            {
                self.body_target(h, body, *got).map(|(buf, off)| Direct {
                    buf,
                    off,
                    len: len - got,
                })
            }
            _ => None,
        };
        if let Some(d) = direct {
            self.direct = d.len;
            self.rpos = 0;
            self.rlen = 0;
            return RecvSpace {
                direct: Some(d),
                spare: &mut self.rbuf[..],
            };
        }
        self.direct = 0;
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
        RecvSpace {
            direct: None,
            spare: &mut self.rbuf[self.rlen..],
        }
    }

    /// The read into the last [`RecvSpace`] returned `n` bytes (at least
    /// one) at `now`: account for them and process every complete frame
    /// part, delivering requests to the transfer machines of `dir`.
    ///
    /// # Errors
    /// A protocol violation (the connection must be closed, failing what
    /// is on it with the error), or a failure to copy into a buffer.
    pub(crate) fn received(
        &mut self,
        n: usize,
        now: Instant,
        dir: &impl Directory<M>,
    ) -> Result<()> {
        let in_body = n.min(std::mem::take(&mut self.direct));
        if in_body > 0
            && let RState::Body { got, .. } = &mut self.rstate
        {
            *got += in_body;
        }
        self.rlen += n - in_body;
        self.last_use = now;
        self.process(dir)
    }

    /// Feeds `bytes` as if read from the socket: each piece goes where
    /// [`Proto::recv_space`] says (registered memory first, then the read
    /// buffer), exactly as a vectored read would place it.
    ///
    /// # Errors
    /// As [`Proto::received`].
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn feed(
        &mut self,
        mut bytes: &[u8],
        now: Instant,
        dir: &impl Directory<M>,
    ) -> Result<()> {
        while !bytes.is_empty() {
            let space = self.recv_space();
            let mut n = 0;
            if let Some(d) = &space.direct {
                n = d.len.min(bytes.len());
                let mut bv = d.buf.data().ok_or(NetError::Cancelled)?;
                bv.copy_in(d.off, &bytes[..n])?;
            }
            if space.direct.as_ref().is_none_or(|d| n == d.len) {
                let k = space.spare.len().min(bytes.len() - n);
                space.spare[..k].copy_from_slice(&bytes[n..n + k]);
                n += k;
            }
            if n == 0 {
                return Err(NetError::Protocol("no room to read into".into()));
            }
            bytes = &bytes[n..];
            self.received(n, now, dir)?;
        }
        // As the I/O layer does once the answers are written.
        self.run_later();
        Ok(())
    }

    /// The buffer and offset a body at `got` goes to, if any.
    fn body_target(&self, h: &Header, body: &Body<M>, got: usize) -> Option<(QueuedBuf, usize)> {
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

    /// Processes what the read buffer holds.
    fn process(&mut self, dir: &impl Directory<M>) -> Result<()> {
        loop {
            let avail = self.rlen - self.rpos;
            // A header is read in place: the state is only taken out of
            // the connection (a move of the whole state) for a descriptor
            // or a body.
            let state = if matches!(self.rstate, RState::Header) {
                RState::Header
            } else {
                std::mem::replace(&mut self.rstate, RState::Header)
            };
            match state {
                RState::Header => {
                    if avail < HEADER_LEN {
                        if self.rpos > 0 && self.rbuf.len() - self.rpos < HEADER_LEN {
                            self.rbuf.copy_within(self.rpos..self.rlen, 0);
                            self.rlen = avail;
                            self.rpos = 0;
                        }
                        return Ok(());
                    }
                    let h = Header::decode(&self.rbuf[self.rpos..self.rlen], self.cfg.max_body)?;
                    self.rpos += HEADER_LEN;
                    trace!(conn = self.id, op = ?h.opcode, xid = h.xid, len = h.body_len, "frame");
                    self.start_frame(h, dir)?;
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
                    self.desc_done(h, &buf, dir)?;
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

    fn expect_body(&mut self, h: Header, body: Body<M>, len: usize) -> Result<()> {
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
    /// [`Proto::learned`]) any listener of this process. Learns the
    /// requester's listening address as a route back to it.
    fn target_tm(&mut self, h: &Header, dir: &impl Directory<M>) -> Result<Option<Arc<M>>> {
        if let Some(local) = self.local {
            if h.receiver.sock() != local {
                return Err(NetError::Protocol(format!(
                    "frame for {} on a connection to {local}",
                    h.receiver
                )));
            }
            let a = h.sender.sock();
            if self.last_learned != Some(a) {
                self.last_learned = Some(a);
                if self.learned.len() < MAX_ROUTES && self.learned.insert(a) {
                    self.fresh.push(a);
                }
            }
        }
        let generation = dir.generation();
        if let (Some(g), Some((a, cached_g, w))) = (generation, &self.last_tm)
            && *a == h.receiver
            && *cached_g == g
            && let Some(tm) = w.upgrade()
        {
            return Ok(Some(tm));
        }
        let tm = dir.machine(&h.receiver);
        self.last_tm = match (generation, &tm) {
            (Some(g), Some(tm)) => Some((h.receiver, g, Arc::downgrade(tm))),
            _ => None,
        };
        Ok(tm)
    }

    fn start_frame(&mut self, h: Header, dir: &impl Directory<M>) -> Result<()> {
        let body_len = h.body_len as usize;
        match h.opcode {
            Opcode::Msg => {
                if let Some(acked) = h.acks() {
                    // As if the MSG_ACK had come first, as its own frame.
                    let ack = Header::new(Opcode::MsgAck, acked, h.receiver, h.sender);
                    self.on_status(&ack, Ok(()))?;
                }
                let body = match self.target_tm(&h, dir)? {
                    None => Body::Discard(Some(NetError::Unreachable(h.receiver.to_string()))),
                    Some(tm) => match self.claim_recv(&tm, body_len) {
                        Ok(claim) => Body::Recv { claim, tm },
                        // This thread is the receiving machine's own.
                        Err(e) => Body::Discard(Some(e.settle(tm.sink(), body_len, &h.receiver))),
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

    fn desc_done(&mut self, h: Header, desc: &[u8], dir: &impl Directory<M>) -> Result<()> {
        let data_len = h.data_len() as usize;
        let verdict = self.bulk_request(&h, desc, dir);
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
        dir: &impl Directory<M>,
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
                p.tm.complete(&p.q, Err(e.clone()));
                return Err(Some(e));
            }
            p.next += len;
        } else {
            if h.offset != 0 {
                // The rest of a transfer that failed (and was answered).
                return Err(None);
            }
            let tm = self
                .target_tm(h, dir)
                .map_err(Some)?
                .ok_or_else(|| Some(NetError::Unreachable(h.receiver.to_string())))?;
            let sink = tm.sink();
            let claimed = sink.claim_passive(
                &fields,
                self.sender_name(h.sender),
                active,
                h.total as usize,
            );
            match claimed {
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
                    // This thread is the passive machine's own.
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

    fn body_done(&mut self, h: Header, body: Body<M>) -> Result<()> {
        match body {
            Body::Recv { claim, tm } => {
                self.respond(Opcode::MsgAck, &h, None);
                let sender = self.sender_name(h.sender);
                tm.sink().post_msg(claim, h.body_len as usize, sender);
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
                    p.tm.complete(&p.q, Ok(p.len as usize));
                } else {
                    let e = NetError::Protocol("last PUT chunk before the end".into());
                    self.respond(Opcode::PutAck, &h, Some(&e));
                    p.tm.complete(&p.q, Err(e));
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
                    debug!(conn = self.id, xid = h.xid, %e, "peer aborted a bulk transfer");
                    let _ = self.detach(|t| matches!(t, Tag::Chunk(x, _) if x == h.xid));
                    p.tm.complete(&p.q, Err(e));
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
                self.finish_op_later(h.xid, st)
            }
        }
    }

    // ----- deletions of incoming-side buffers --------------------------------

    /// Aborts whatever this connection does with receive or passive buffer
    /// `q` (timeout, stop with abort): a message being read into it is
    /// dropped (its claim released, the sender answered `wire` once the
    /// body is consumed); a bulk transfer against it completes the buffer
    /// `Cancelled` at once (the core reports `TimedOut` after a timeout)
    /// and answers the requester with `wire`. Returns true if it found
    /// something.
    pub(crate) fn abort_incoming(&mut self, q: &QueuedBuf, wire: &NetError) -> bool {
        let t = q.token();
        let mut found = false;
        if let RState::Body { body, h, .. } = &mut self.rstate
            && matches!(body, Body::Recv { claim, .. } if claim.buf.token() == t)
        {
            if let Body::Recv { claim, tm } =
                std::mem::replace(body, Body::Discard(Some(wire.clone())))
            {
                trace!(conn = self.id, xid = h.xid, "message read aborted");
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
            p.tm.complete(&p.q, Err(NetError::Cancelled));
            found = true;
        }
        found
    }
}
