//! A transfer machine over LNet: its MEs and MDs, the operations of its
//! queued buffers, and what each LNet event means for them.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet_rt::colibri_lnet::matching::{
    Event, EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeHandle, MemKey, MemRef, OpError,
    Threshold, Unlink,
};
use colibri_lnet_rt::colibri_lnet::nidmap::KeyedMap;
use colibri_lnet_rt::{ForeignMemory, Start};
use colibri_net::desc::NetBufDesc;
use colibri_net::xprt::{
    DelReason, Delivery, EpAddr, PassiveClaim, PassiveError, QueuedBuf, TmSink, XprtTm,
};
use colibri_net::{NetError, QueueType, Result, TmId};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tracing::{debug, trace, warn};

use crate::XprtInner;
use crate::addr::{
    CNT_ACTIVE, CNT_CTL, CNT_MSG, CNT_PASSIVE, COUNTER_BITS, HDR_BULK, HDR_BULK_LAST, HDR_MSG,
    LnetAddr, PASSIVE_SPARE, RECV_IGNORE, SEQ_MASK, carried_ack, hdr_data, match_bits, msg_counter,
    parse_hdr,
};
use crate::ctl::{CTL_MAX, Ctl};
use crate::desc::BulkTarget;
use crate::engine::{Engine, OwedDelivered, Work, lnet_err};
use crate::lane::Lane;

/// Control MDs kept attached per transfer machine.
const CTL_MDS: usize = 3;
/// Bytes of one control MD (the most an MD may have: one LNet message):
/// room for thousands of control messages (a burst of cancellations sends
/// one each), so that the engine replaces an exhausted MD long before its
/// siblings run out too (an LNet PUT that finds no MD is dropped: with
/// 96 KiB MDs the fault-injected stress case lost aborts that way).
/// Zeroed memory: pages are only touched as messages land.
const CTL_MD_BYTES: usize = 1 << 20;

/// AGAINs an active send asks for one chunk (each after its REPLY to the
/// passive side's GET failed to go); its GET MEs take one GET more than
/// that.
const AGAIN_MAX: u32 = 3;

/// A queued buffer's memory as MD memory: the runtime reads and writes
/// its segments in place, under the buffer's data lock, until the buffer
/// completes.
struct BufMem {
    q: QueuedBuf,
    len: usize,
}

impl ForeignMemory for BufMem {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, f: &mut dyn FnMut(&[&[u8]])) -> bool {
        let Some(g) = self.q.data() else {
            return false;
        };
        let segs: SmallVec<[&[u8]; 4]> = g.segments().collect();
        f(&segs);
        true
    }

    fn write(&self, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool {
        let Some(mut g) = self.q.data() else {
            return false;
        };
        let mut segs: SmallVec<[&mut [u8]; 4]> = g.segments_mut().collect();
        f(&mut segs);
        true
    }
}

/// What an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Recv,
    Send,
    Passive,
    Active,
    /// A control MD of the transfer machine.
    Ctl,
    /// The catch-all MD that sees messages no receive buffer took.
    Catch,
    /// The MD behind every active buffer's MEs: a passive side's GET or
    /// PUT naming MEs the machine does not have (a request given up, or
    /// a bogus one) gets no bytes, and the passive side its claim back.
    Stray,
    /// What is left where the machine stopped (answers `Unreachable`).
    Tomb,
    /// One MD of a bulk transfer larger than one LNet message (1 MiB).
    Chunk,
}

/// Where an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Stage {
    /// Nothing in LNet (a receive buffer before start, an unclaimed passive
    /// buffer).
    #[default]
    Idle,
    /// An MD is live (an active operation's from its add: its MEs wait
    /// for the passive side's transfer).
    Live,
    /// Completed (or being completed).
    Done,
}

/// The other side of a bulk transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Peer {
    proc_: ProcessId,
    portal: u32,
    tmid: u16,
    /// Sequence number of the message it came with.
    seq: u32,
}

impl Peer {
    /// The sending machine of `ev`, from its initiator and our header
    /// data (none without it).
    fn of(ev: &Event) -> Option<Self> {
        let (_, portal, tmid, seq) = parse_hdr(ev.info.hdr_data)?;
        Some(Self {
            proc_: ev.info.initiator,
            portal,
            tmid,
            seq,
        })
    }
}

/// The DELIVERED a received message's answer owes its sender, while the
/// message's callback runs on this thread: a message that callback sends
/// from the receiving machine back to the sender carries the
/// acknowledgement in its match bits ([`msg_counter`]), and the DELIVERED
/// is not sent (one LNet message each way per exchange instead of two, as
/// TCP's acknowledgements ride on its answers). What no send took is owed
/// to the engine once the callback returned, which sends it with the
/// other DELIVEREDs of the burst (`Engine::owe_delivered`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct OwedAck {
    /// The engine (node) that received the message.
    node: usize,
    /// The DELIVERED it stands for: to the message's sender, from the
    /// receiving machine, with the message's sequence number and length.
    d: OwedDelivered,
}

thread_local! {
    static OWED: Cell<Option<OwedAck>> = const { Cell::new(None) };
}

/// Takes the acknowledgement owed on this thread if a send from `from` on
/// `e` to `dest` can carry it.
fn take_owed(e: &Engine, dest: &LnetAddr, from: (u32, u16)) -> Option<(u32, u64)> {
    OWED.with(|c| {
        let o = c.get()?;
        let fits = o.node == std::ptr::from_ref(e) as usize
            && o.d.to == dest.process()
            && o.d.portal == dest.portal
            && Some(o.d.tmid) == dest.tmid
            && o.d.from == from;
        fits.then(|| {
            c.set(None);
            (o.d.seq, o.d.len)
        })
    })
}

#[derive(Default)]
struct OpSt {
    stage: Stage,
    md: Option<MdHandle>,
    key: Option<MemKey>,
    /// A deletion was asked.
    del: bool,
    /// The status to complete with at the MD's final event, when it ends
    /// without success.
    fail: Option<NetError>,
    /// A passive claim handed back (the requester gave up): release the
    /// claim instead of completing.
    release: bool,
    /// Bulk: the other side and the active operation's id.
    peer: Option<Peer>,
    xid: u64,
    /// Bulk: what the descriptor names.
    target: Option<BulkTarget>,
    /// Bytes of the operation.
    len: usize,
    /// Its entry in the engine's deadlines (an answer it waits for).
    deadline: Option<Instant>,
    /// A message send that carries the acknowledgement of a message its
    /// receiver sent us: (that message's sequence number, its length). If
    /// the send fails before it left, the acknowledgement goes as a
    /// DELIVERED of its own.
    carried: Option<(u32, u64)>,
    /// A transfer in chunks: their operations, how many have not ended,
    /// bytes moved.
    children: Vec<Arc<Op>>,
    left: usize,
    moved: usize,
    /// An active receive in chunks: how many the passive side PUTs (from
    /// its header data) and how many landed; the passive side's chunks:
    /// how many a tomb answered (taking nothing).
    expect: Option<usize>,
    landed: usize,
    /// A passive receive: the requester's match bits (its REQUEST's).
    bits: u64,
    /// An active send's chunk (or the transfer in one): AGAINs sent for
    /// it, each after its REPLY to the passive side's GET failed.
    again: u32,
    /// A passive receive's GET (or chunk's) given up for a new one on an
    /// AGAIN: its MD's last events are not the transfer's.
    superseded: Vec<MdHandle>,
}

/// One queued buffer's operation (or a transfer machine's own MD).
pub(crate) struct Op {
    pub(crate) id: u64,
    pub(crate) tm: Arc<TmShared>,
    kind: Kind,
    buf: Option<QueuedBuf>,
    /// For a chunk of a bulk transfer larger than one LNet message: the
    /// transfer.
    parent: Option<Arc<Op>>,
    st: Mutex<OpSt>,
}

#[derive(Default)]
struct TmSt {
    engine: Option<Arc<Engine>>,
    addr: Option<LnetAddr>,
    own: Arc<str>,
    started: bool,
    stopping: bool,
    abort: bool,
    /// Receive buffers added before start.
    pending: Vec<Arc<Op>>,
    /// Operations by buffer token.
    ops: KeyedMap<u64, Arc<Op>>,
    /// Claimed passive operations by (requester, xid).
    claims: KeyedMap<(ProcessId, u64), Arc<Op>>,
    /// Control and catch-all MDs.
    infra: Vec<Arc<Op>>,
    /// The catch-all's ME: receive buffers' MEs go ahead of it, so that
    /// it stays the last of the machine's MEs that take messages.
    catch_me: Option<MeHandle>,
    /// Control MD memory, by operation id.
    ctl_mem: KeyedMap<u64, colibri_lnet_rt::MemRegion>,
    /// Messages being sent, by sequence number.
    sends: KeyedMap<u32, Arc<Op>>,
    /// The last remote sender's address, printed (a machine usually hears
    /// from the same peer many times in a row; printing one costs more
    /// than the rest of a message's handling here).
    last_sender: Option<((ProcessId, u32, u16), Arc<str>)>,
}

/// State shared by a transfer machine's transport object and the engine.
pub(crate) struct TmShared {
    id: TmId,
    sink: TmSink,
    /// The transport (weakly: operations the engine keeps, tombs
    /// included, must not keep the transport alive).
    x: std::sync::Weak<XprtInner>,
    /// The first node's engine: deliveries before start.
    home: Arc<Engine>,
    /// The machine's own delivery thread, if it has one (the transport's
    /// `thread_per_tm`, or `confine`): every callback of the machine runs
    /// there, and the engine only hands them over.
    lane: OnceLock<Lane>,
    st: Mutex<TmSt>,
    /// Counted in the transport's held machines while it exists.
    _held: crate::Held,
}

impl std::fmt::Debug for TmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TmShared")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn op_err(e: OpError, dest: &str) -> NetError {
    match e {
        OpError::TimedOut => NetError::TimedOut,
        OpError::Canceled => NetError::Cancelled,
        OpError::Unreachable => NetError::Unreachable(dest.to_string()),
        OpError::NetworkError => NetError::ConnectionReset(format!("LNet network error to {dest}")),
        OpError::Protocol => NetError::Protocol(format!("LNet protocol error with {dest}")),
        other => NetError::Protocol(format!("LNet: {other} ({dest})")),
    }
}

impl Op {
    /// Whether `peer` is the machine this message send or bulk request
    /// went to (its process, portal and TMID; any NID of the process, as
    /// Multi-Rail may answer from another): only that machine's answer
    /// (DELIVERED, NAK, GONE, a carried acknowledgement) ends it. Sequence
    /// numbers are per sender, so a stray or forged answer from anyone
    /// else that happens to name one must not.
    fn went_to(&self, peer: &Peer) -> bool {
        let (pid, portal, tmid) = match self.kind {
            Kind::Send => match self
                .buf
                .as_ref()
                .and_then(QueuedBuf::end_point)
                .and_then(|ep| ep.downcast::<LnetAddr>().copied())
            {
                Some(d) => (d.pid, d.portal, d.tmid.unwrap_or(0)),
                None => return false,
            },
            Kind::Active => match &self.st.lock().target {
                Some(t) => (t.proc_.pid, t.portal, t.tmid),
                None => return false,
            },
            _ => return false,
        };
        // The header data keeps six bits of the portal and twelve of the
        // TMID (addr.rs).
        pid == peer.proc_.pid && portal & 0x3f == peer.portal && tmid & 0xfff == peer.tmid
    }

    /// Whether this passive claim is for `peer`'s machine (its portal and
    /// TMID; claims are filed by the requester's process and request id).
    fn claimed_by(&self, peer: &Peer) -> bool {
        self.st
            .lock()
            .peer
            .is_some_and(|q| q.portal == peer.portal && q.tmid == peer.tmid)
    }

    /// Whether `md` is a GET this operation gave up for a new one (AGAIN):
    /// its events, its last included, are not the operation's.
    pub(crate) fn superseded(&self, md: MdHandle) -> bool {
        self.st.lock().superseded.contains(&md)
    }

    /// The MDs LNet may still hold for this operation (its own, or its
    /// chunks').
    fn live_mds(&self) -> Vec<MdHandle> {
        let s = self.st.lock();
        let mut v: Vec<MdHandle> = s.md.into_iter().collect();
        v.extend(s.children.iter().filter_map(|c| c.st.lock().md));
        v
    }

    /// Gives back what LNet holds for this operation when the transport
    /// goes away before its last event came (a request cancelled while its
    /// verdict was on the way, an operation LNet had not finished): its
    /// MDs are unlinked and its memory key forgotten, since the LNet nodes
    /// outlive the transport. Their machines are gone by then.
    pub(crate) fn release(&self, e: &Engine) {
        for md in self.live_mds() {
            let _ = e.lnet.md_unlink(md);
        }
        if let Some(k) = self.st.lock().key.take() {
            e.lnet.deregister(k);
        }
    }

    /// A send whose MD LNet is done with but whose receiver has not
    /// answered yet, or a passive buffer's PUT waiting for the requester's
    /// LANDED: kept in the engine's table for its deadline.
    pub(crate) fn awaits_answer(&self) -> bool {
        let s = self.st.lock();
        s.stage == Stage::Live
            && match self.kind {
                Kind::Send | Kind::Passive => self.kind == Kind::Send || self.sends_data(),
                // Once the passive side's GET took its data.
                Kind::Active => self.sends_data() && s.landed > 0,
                _ => false,
            }
    }

    /// Whether LNet is done with every MD of the operation.
    fn lnet_done(&self) -> bool {
        let s = self.st.lock();
        s.md.is_none() && s.left == 0
    }

    /// A bulk buffer whose data goes to the other side (a passive send
    /// buffer's PUT, an active send buffer's MEs the passive side GETs
    /// from): once LNet is done with it, it waits for the other side's
    /// LANDED, so that its completion says the data arrived.
    fn sends_data(&self) -> bool {
        let q = self.buf.as_ref().map(QueuedBuf::queue);
        matches!(
            (self.kind, q),
            (Kind::Passive, Some(QueueType::PassiveBulkSend))
                | (Kind::Active, Some(QueueType::ActiveBulkSend))
        )
    }

    /// A bulk buffer the other side's data comes into: once all of it
    /// arrived, it answers LANDED.
    fn receives_data(&self) -> bool {
        let q = self.buf.as_ref().map(QueuedBuf::queue);
        matches!(
            (self.kind, q),
            (Kind::Passive, Some(QueueType::PassiveBulkRecv))
                | (Kind::Active, Some(QueueType::ActiveBulkRecv))
        )
    }

    /// Whether the data of this operation started to go out: a message,
    /// a passive buffer's PUT (from its claim), an active send buffer
    /// once the passive side's GET took some of it.
    fn data_out(&self) -> bool {
        self.kind == Kind::Send
            || (self.sends_data() && (self.kind == Kind::Passive || self.st.lock().landed > 0))
    }
}

impl TmShared {
    pub(crate) fn sink(&self) -> &TmSink {
        &self.sink
    }

    fn engine(&self) -> Arc<Engine> {
        self.st
            .lock()
            .engine
            .clone()
            .unwrap_or_else(|| Arc::clone(&self.home))
    }

    fn new_op(self: &Arc<Self>, e: &Engine, kind: Kind, buf: Option<QueuedBuf>) -> Arc<Op> {
        Arc::new(Op {
            id: e.new_id(),
            tm: Arc::clone(self),
            kind,
            buf,
            parent: None,
            st: Mutex::new(OpSt::default()),
        })
    }

    fn new_chunk(self: &Arc<Self>, e: &Engine, parent: &Arc<Op>) -> Arc<Op> {
        Arc::new(Op {
            id: e.new_id(),
            tm: Arc::clone(self),
            kind: Kind::Chunk,
            buf: None,
            parent: Some(Arc::clone(parent)),
            st: Mutex::new(OpSt::default()),
        })
    }

    /// Hands `w` to the machine's own thread, or to the engine's.
    fn push(&self, e: &Engine, w: Work) {
        match self.lane.get() {
            Some(l) => l.push(w),
            None => e.push(w),
        }
    }

    /// Runs callbacks of this machine: on its own thread if it has one,
    /// else here (the engine's thread).
    fn run_cb(&self, d: Delivery) {
        match self.lane.get() {
            Some(l) => l.deliver(d),
            None => d.run(),
        }
    }

    /// Runs a loss event of this machine: on its own thread if it has one,
    /// else on the engine's notice thread.
    fn notice(&self, e: &Engine, d: Delivery) {
        match self.lane.get() {
            Some(l) => l.deliver(d),
            None => e.notice(d),
        }
    }

    /// Completes `op`'s buffer from the engine's thread or the machine's
    /// own (never inline).
    fn complete_later(&self, e: &Engine, op: &Op, r: Result<usize>) {
        // Its answer (DELIVERED, NAK, GONE) finds nothing from now on.
        self.forget_send(op);
        if (op.kind == Kind::Send || op.sends_data()) && op.lnet_done() {
            // LNet is done with it (sent, waiting for the answer): nothing
            // else would take it out of the engine's table (its deadline
            // finds it done and leaves it).
            disarm_deadline(e, op);
            e.remove_op(op.id);
        }
        if let Some(q) = &op.buf {
            self.push(e, Work::Complete(self.sink.clone(), q.clone(), r));
        }
    }

    /// Forgets a finished operation and completes its buffer.
    fn finish(&self, op: &Op, r: Result<usize>) {
        disarm_deadline(&self.engine(), op);
        // A second completion is ignored by the core.
        let sent = {
            let mut s = op.st.lock();
            s.stage = Stage::Done;
            s.md.is_none()
        };
        if matches!(op.kind, Kind::Send | Kind::Passive | Kind::Active) && sent && op.lnet_done() {
            // LNet is done with it: forget it (otherwise its last event
            // does).
            self.engine().remove_op(op.id);
        }
        if let Some(q) = &op.buf {
            self.forget_send(op);
            let d = self.sink.complete_deferred(q, r);
            // Out of the table only once the completion is decided: a
            // `del` that finds no operation completes the buffer
            // `Cancelled` (on the machine's own thread, if it has one),
            // which must not overtake this one (the conformance case
            // cancel_races_completion, with a thread per machine).
            {
                let mut st = self.st.lock();
                if st.ops.get(&q.token().raw()).is_some_and(|o| o.id == op.id) {
                    st.ops.remove(&q.token().raw());
                }
            }
            self.run_cb(d);
        }
    }

    /// Takes a message send or an active bulk operation out of the
    /// machine's table of sends (by sequence number), once it completes
    /// whichever way. An entry left there would stay for the machine's
    /// life and beyond: the operation refers to the machine, so the two
    /// would keep each other (and the operation its buffer's slot) alive
    /// after `fini` (the LNet soak's memory growth, RELIABILITY.md).
    fn forget_send(&self, op: &Op) {
        if matches!(op.kind, Kind::Send | Kind::Active) {
            let seq = seq_of(op.id);
            let mut st = self.st.lock();
            if st.sends.get(&seq).is_some_and(|o| o.id == op.id) {
                st.sends.remove(&seq);
            }
        }
    }

    /// Forgets every operation the machine's tables hold (they refer to
    /// the machine: an entry left would keep both alive). Every buffer
    /// has completed by then (stopped, finalised, dropped).
    fn forget_all(&self) {
        let mut st = self.st.lock();
        st.ops.clear();
        st.claims.clear();
        st.pending.clear();
        st.sends.clear();
    }

    /// The canonical address of the sender of `ev`.
    fn sender(&self, e: &Engine, ev: &Event) -> (Option<Peer>, Arc<str>) {
        let Some((_, portal, tmid, seq)) = parse_hdr(ev.info.hdr_data) else {
            return (
                None,
                format!("{}:{}:0:0", ev.info.initiator.nid, ev.info.initiator.pid).into(),
            );
        };
        let peer = Peer {
            proc_: ev.info.initiator,
            portal,
            tmid,
            seq,
        };
        if e.has(ev.info.initiator.nid)
            && let Some(t) = e.local_tm(portal, tmid)
        {
            let own = t.st.lock().own.clone();
            if !own.is_empty() {
                return (Some(peer), own);
            }
        }
        let key = (ev.info.initiator, portal, tmid);
        if let Some((k, name)) = &self.st.lock().last_sender
            && *k == key
        {
            return (Some(peer), name.clone());
        }
        let a: Arc<str> = LnetAddr {
            nid: ev.info.initiator.nid,
            pid: ev.info.initiator.pid,
            portal,
            tmid: Some(tmid),
        }
        .to_string()
        .into();
        self.st.lock().last_sender = Some((key, Arc::clone(&a)));
        (Some(peer), a)
    }

    // ------------------------------------------------------------------
    // Attaching

    fn register(&self, e: &Engine, op: &Op, len: usize) -> Option<MemKey> {
        let q = op.buf.clone()?;
        let key = e.lnet.register_foreign(Arc::new(BufMem { q, len }));
        op.st.lock().key = Some(key);
        Some(key)
    }

    fn unregister(e: &Engine, op: &Op) {
        if let Some(k) = op.st.lock().key.take() {
            e.lnet.deregister(k);
        }
    }

    /// Attaches a receive buffer's ME and MD.
    fn attach_recv(&self, e: &Engine, addr: LnetAddr, op: &Arc<Op>) -> Result<()> {
        let q = op.buf.as_ref().ok_or(NetError::Cancelled)?;
        // One MD: messages land in the first MiB of a larger buffer.
        let size = q.size().min(MTU);
        let p = q.recv_params();
        if p.min_receive_size > size {
            return Err(NetError::InvalidArgument(format!(
                "minimum receive size {} beyond the {size} bytes LNet can fill",
                p.min_receive_size
            )));
        }
        let key = self.register(e, op, size).ok_or(NetError::Cancelled)?;
        e.add_op(op);
        let tmid = addr.tmid.unwrap_or(0);
        // No LNet ACK: the receiver answers once it posted the message
        // (DELIVERED), or NAKs it.
        let mut spec = MdSpec::new(
            MemRef::new(key, 0, size as u32),
            MdOptions::OP_PUT
                .with(MdOptions::TRUNCATE)
                .with(MdOptions::ACK_DISABLE),
        )
        .threshold(Threshold::Count(p.max_receive_msgs))
        .unlink(Unlink::Unlink)
        .user_ptr(op.id);
        if p.max_receive_msgs > 1 {
            spec = spec.max_size(p.min_receive_size as u32);
        }
        let pos = self
            .st
            .lock()
            .catch_me
            .map_or(InsertPos::After, InsertPos::Ahead);
        let r = e.attach_at(
            addr.portal,
            match_bits(tmid, CNT_MSG),
            RECV_IGNORE,
            Unlink::Unlink,
            spec,
            pos,
        );
        match r {
            Ok((_, md)) => {
                let mut s = op.st.lock();
                s.md = Some(md);
                s.stage = Stage::Live;
                Ok(())
            }
            Err(err) => {
                e.remove_op(op.id);
                Self::unregister(e, op);
                Err(lnet_err(&err, "receive buffer"))
            }
        }
    }

    /// Attaches a control MD (or the catch-all).
    fn attach_infra(self: &Arc<Self>, e: &Engine, addr: LnetAddr, kind: Kind) -> Result<Arc<Op>> {
        let op = self.new_op(e, kind, None);
        let tmid = addr.tmid.unwrap_or(0);
        let (bits, ignore, mem, opts, thr, unlink) = if kind == Kind::Stray {
            (
                match_bits(tmid, CNT_ACTIVE),
                CNT_ACTIVE - 1,
                MemRef::new(e.empty, 0, 0),
                // Empty: a GET gets a REPLY of no bytes (as from a tomb),
                // a PUT is taken whole and dropped, and answered below.
                MdOptions::OP_PUT
                    .with(MdOptions::OP_GET)
                    .with(MdOptions::TRUNCATE)
                    .with(MdOptions::ACK_DISABLE),
                Threshold::Infinite,
                Unlink::Retain,
            )
        } else if kind == Kind::Ctl {
            let region = colibri_lnet_rt::MemRegion::zeroed(CTL_MD_BYTES);
            let key = e.lnet.register(&region);
            self.st.lock().ctl_mem.insert(op.id, region);
            op.st.lock().key = Some(key);
            (
                match_bits(tmid, CNT_CTL),
                // On the ignore list, ahead of the portal's vacancy.
                PASSIVE_SPARE,
                MemRef::new(key, 0, CTL_MD_BYTES as u32),
                MdOptions::OP_PUT.with(MdOptions::ACK_DISABLE),
                Threshold::Infinite,
                Unlink::Unlink,
            )
        } else {
            (
                match_bits(tmid, CNT_MSG),
                RECV_IGNORE,
                MemRef::new(e.empty, 0, 0),
                // No ACK: the receiver answers with a NAK once it counted
                // the loss, so the sender never learns of it first.
                MdOptions::OP_PUT
                    .with(MdOptions::TRUNCATE)
                    .with(MdOptions::ACK_DISABLE),
                Threshold::Infinite,
                Unlink::Retain,
            )
        };
        e.add_op(&op);
        let mut spec = MdSpec::new(mem, opts)
            .threshold(thr)
            .unlink(unlink)
            .user_ptr(op.id);
        if kind == Kind::Ctl {
            spec = spec.max_size(CTL_MAX as u32);
        }
        // The ME goes with its MD, which is unlinked when the machine
        // stops (a retained catch-all ME stayed in the portal's match
        // list for good, one per start).
        let r = e.attach_at(
            addr.portal,
            bits,
            ignore,
            Unlink::Unlink,
            spec,
            InsertPos::After,
        );
        match r {
            Ok((me, md)) => {
                if kind == Kind::Catch {
                    self.st.lock().catch_me = Some(me);
                }
                let mut s = op.st.lock();
                s.md = Some(md);
                s.stage = Stage::Live;
                drop(s);
                Ok(op)
            }
            Err(err) => {
                e.remove_op(op.id);
                if let Some(k) = op.st.lock().key.take() {
                    e.lnet.deregister(k);
                }
                self.st.lock().ctl_mem.remove(&op.id);
                Err(lnet_err(&err, "control MD"))
            }
        }
    }

    // ------------------------------------------------------------------
    // Events

    pub(crate) fn on_event(self: &Arc<Self>, op: &Arc<Op>, ev: &Event) {
        let e = self.engine();
        {
            let mut s = op.st.lock();
            if let Some(i) = s.superseded.iter().position(|&m| m == ev.md) {
                // A GET given up for a new one: only its end is noted.
                if ev.unlinked {
                    s.superseded.swap_remove(i);
                }
                return;
            }
        }
        match op.kind {
            Kind::Recv => self.ev_recv(&e, op, ev),
            Kind::Send => self.ev_send(op, ev),
            Kind::Passive => self.ev_passive(&e, op, ev),
            Kind::Active => self.ev_active(&e, op, ev),
            Kind::Ctl => self.ev_ctl(&e, op, ev),
            Kind::Chunk => self.ev_chunk(&e, op, ev),
            Kind::Tomb => e.answer_absent(ev, self.from()),
            Kind::Stray => {
                if ev.kind() == EventKind::Put
                    && ev.info.status.is_ok()
                    && let (Some(p), _) = self.sender(&e, ev)
                    && matches!(
                        parse_hdr(ev.info.hdr_data).map(|h| h.0),
                        Some(HDR_BULK | HDR_BULK_LAST)
                    )
                    && !self
                        .st
                        .lock()
                        .sends
                        .get(&p.seq)
                        .is_some_and(|o| o.kind == Kind::Active && o.went_to(&p))
                {
                    // A passive side's bulk PUT for a request of ours that
                    // ended (or never was): it gets its claim back. (One
                    // for a request still going, a chunk LNet sent twice,
                    // is dropped: the request's own end answers.)
                    self.send_abort(
                        &e,
                        (p.proc_, p.portal, p.tmid),
                        u64::from(p.seq),
                        &NetError::Cancelled,
                        true,
                    );
                }
            }
            Kind::Catch => {
                if ev.kind() == EventKind::Put && ev.info.status.is_ok() {
                    self.ack_carried(ev);
                    self.notice(&e, self.sink.count_no_buffers(ev.info.rlength as usize));
                    if let (Some(p), _) = self.sender(&e, ev) {
                        let from = self.from();
                        let nak = Ctl::Nak {
                            xid: u64::from(p.seq),
                            status: NetError::NoBuffers,
                        };
                        let _ = e.send_ctl(p.proc_, p.portal, p.tmid, from, &nak, 0);
                    }
                }
            }
        }
        if ev.unlinked {
            Self::unregister(&e, op);
        }
    }

    fn ev_recv(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        let Some(q) = &op.buf else { return };
        match (ev.kind(), ev.info.status) {
            (EventKind::Put, Ok(())) => {
                self.ack_carried(ev);
                let (rl, ml) = (ev.info.rlength as usize, ev.info.mlength as usize);
                let (peer, sender) = self.sender(e, ev);
                let answer = |m: Ctl| {
                    if let Some(p) = peer {
                        let _ = e.send_ctl(p.proc_, p.portal, p.tmid, self.from(), &m, 0);
                    }
                };
                let seq = peer.map_or(0, |p| u64::from(p.seq));
                if ml < rl {
                    // Truncated: the message did not fit. The buffer fails,
                    // and the sender is told.
                    let err = NetError::MessageTooLarge { len: rl, space: ml };
                    answer(Ctl::Nak {
                        xid: seq,
                        status: err.clone(),
                    });
                    if ev.unlinked {
                        self.finish(op, Err(err));
                    } else {
                        let md = {
                            let mut s = op.st.lock();
                            s.fail = Some(err);
                            s.md
                        };
                        if let Some(md) = md {
                            let _ = e.lnet.md_unlink(md);
                        }
                    }
                    return;
                }
                match self
                    .sink
                    .claim_recv_placed(q, ev.info.offset as usize, ml, ev.unlinked)
                {
                    Some(claim) => {
                        // Posted (queued for delivery) before the sender is
                        // told. The callback runs first: an answer it sends
                        // back carries the acknowledgement (`OwedAck`);
                        // otherwise the DELIVERED leaves after it, off the
                        // round trip's path.
                        let d = self.sink.post_msg_deferred(claim, ml, &sender);
                        let owed = peer.map(|p| OwedAck {
                            node: std::ptr::from_ref(e) as usize,
                            d: OwedDelivered {
                                to: p.proc_,
                                portal: p.portal,
                                tmid: p.tmid,
                                from: self.from(),
                                seq: p.seq,
                                len: ml as u64,
                            },
                        });
                        let outer = OWED.replace(owed);
                        self.run_cb(d);
                        if let Some(o) = OWED.replace(outer) {
                            e.owe_delivered(o.d);
                        }
                        if ev.unlinked {
                            let mut s = op.st.lock();
                            s.stage = Stage::Done;
                            drop(s);
                            let mut st = self.st.lock();
                            if st.ops.get(&q.token().raw()).is_some_and(|o| o.id == op.id) {
                                st.ops.remove(&q.token().raw());
                            }
                        }
                    }
                    None => {
                        // Its buffer was deleted while the message's last
                        // bytes were being read (it completed at once, see
                        // `buf_del`): the sender is told, as for a drop.
                        debug!(tm = %self.id, "message for a receive buffer no longer queued");
                        answer(Ctl::Nak {
                            xid: seq,
                            status: NetError::NoBuffers,
                        });
                    }
                }
            }
            (EventKind::Put, Err(err)) => {
                debug!(tm = %self.id, %err, "message lost while being received");
                if ev.unlinked {
                    // A buffer deleted while a message was coming in (the
                    // unlink waited for LNet to give the message up) ends
                    // `Cancelled`: the failure is the sender's.
                    let r = {
                        let mut s = op.st.lock();
                        let del = s.del;
                        s.fail.take().unwrap_or_else(|| {
                            if del {
                                NetError::Cancelled
                            } else {
                                op_err(err, "sender")
                            }
                        })
                    };
                    self.finish(op, Err(r));
                }
            }
            _ => {
                if ev.unlinked {
                    let r = op.st.lock().fail.take().unwrap_or(NetError::Cancelled);
                    self.finish(op, Err(r));
                }
            }
        }
    }

    fn ev_send(&self, op: &Arc<Op>, ev: &Event) {
        // The receiver's DELIVERED or NAK completes a send; LNet only
        // reports failures to send.
        if ev.info.status.is_err() || ev.kind() == EventKind::Unlink {
            self.pay_carried(op);
        }
        if let Err(err) = ev.info.status {
            let del = op.st.lock().del;
            let r = if del {
                NetError::Cancelled
            } else {
                let dest = op
                    .buf
                    .as_ref()
                    .and_then(QueuedBuf::end_point)
                    .map(|ep| ep.addr().to_string())
                    .unwrap_or_default();
                op_err(err, &dest)
            };
            self.finish(op, Err(r));
        } else if ev.kind() == EventKind::Unlink {
            // Unlinked before it was sent (a timeout or a stop with abort).
            self.finish(op, Err(NetError::Cancelled));
        }
        if ev.unlinked {
            let done = {
                let mut s = op.st.lock();
                s.md = None;
                s.stage == Stage::Done
            };
            if done {
                // Completed (here, or meanwhile by a deletion, a timeout or
                // an answer that found the MD still there) and LNet is
                // done with it: the last one to know forgets it. The
                // engine kept it when the event came (it waited for an
                // answer then), and whoever completed it saw the MD.
                self.engine().remove_op(op.id);
            }
        }
    }

    /// An event of a claimed passive buffer's transfer (the passive side
    /// moves the data, against the requester's MEs). A GET ends with its
    /// REPLY: every byte, or none (the requester's machine is gone: its
    /// tomb answered, and the claim goes back). A PUT, once sent, waits
    /// for the requester's LANDED (or its deadline). A failure ends it and
    /// tells the requester.
    fn ev_passive(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        if op.st.lock().stage == Stage::Done {
            // Completed already (by the requester's LANDED, or a
            // deletion): LNet is letting go of the MD.
            if ev.unlinked {
                op.st.lock().md = None;
            }
            return;
        }
        match (ev.kind(), ev.info.status) {
            (EventKind::Reply, Ok(())) => {
                let len = op.st.lock().len;
                let took = ev.info.mlength as usize;
                if took == len {
                    self.send_landed(e, op, len);
                    self.forget_claim(op);
                    self.finish(op, Ok(len));
                } else if took == 0 {
                    op.st.lock().release = true;
                } else {
                    let mut s = op.st.lock();
                    if s.fail.is_none() {
                        s.fail = Some(NetError::Protocol(format!(
                            "the bulk requester gave {took} of {len} bytes"
                        )));
                    }
                }
            }
            (_, Err(err)) => {
                let md = {
                    let mut s = op.st.lock();
                    if s.fail.is_none() {
                        s.fail = Some(if s.del {
                            NetError::Cancelled
                        } else {
                            op_err(err, "bulk requester")
                        });
                    }
                    s.md
                };
                if !ev.unlinked
                    && let Some(md) = md
                {
                    // The REPLY will not come.
                    let _ = e.lnet.md_unlink(md);
                }
            }
            _ => {}
        }
        if ev.unlinked {
            let (done, waits) = {
                let mut s = op.st.lock();
                s.md = None;
                (
                    s.stage == Stage::Done,
                    s.fail.is_none() && !s.release && op.sends_data(),
                )
            };
            if done {
                self.forget_claim(op);
            } else if !waits {
                self.passive_ended(e, op, Err(NetError::Cancelled));
            }
        }
    }

    /// Sends an ABORT for operation `xid` to the machine `(process,
    /// portal, TMID)`: a passive buffer's requester (the buffer is gone)
    /// or, `by_requester`, an active request's passive side (the request
    /// is given up). Its side of the transfer ends with `status`.
    fn send_abort(
        &self,
        e: &Engine,
        to: (ProcessId, u32, u16),
        xid: u64,
        status: &NetError,
        by_requester: bool,
    ) {
        let _ = e.send_ctl(
            to.0,
            to.1,
            to.2,
            self.from(),
            &Ctl::Abort {
                xid,
                status: status.clone(),
                by_requester,
            },
            0,
        );
    }

    /// [`TmShared::send_abort`] to a passive buffer's requester, if any.
    fn abort_requester(&self, e: &Engine, peer: Option<Peer>, xid: u64, status: &NetError) {
        if let Some(p) = peer {
            self.send_abort(e, (p.proc_, p.portal, p.tmid), xid, status, false);
        }
    }

    /// [`TmShared::send_abort`] to an active request's passive side.
    fn abort_target(&self, e: &Engine, op: &Op, status: &NetError) {
        let t = op.st.lock().target.clone();
        if let Some(t) = t {
            self.send_abort(e, (t.proc_, t.portal, t.tmid), op.id, status, true);
        }
    }

    /// Tells the other side of a transfer that its data landed here
    /// (`len` bytes): its buffer completes. An active receive tells the
    /// passive side (its request's id); a passive receive, the requester.
    fn send_landed(&self, e: &Engine, op: &Op, len: usize) {
        let to = {
            let s = op.st.lock();
            match (op.kind, &s.target, s.peer) {
                (Kind::Active, Some(t), _) => Some((t.proc_, t.portal, t.tmid, op.id)),
                (Kind::Passive, _, Some(p)) => Some((p.proc_, p.portal, p.tmid, s.xid)),
                _ => None,
            }
        };
        if let Some((proc_, portal, tmid, xid)) = to {
            let _ = e.send_ctl(
                proc_,
                portal,
                tmid,
                self.from(),
                &Ctl::Landed {
                    xid,
                    len: len as u64,
                },
                0,
            );
        }
    }

    /// An event of one chunk of a transfer larger than one LNet message:
    /// the transfer ends when every chunk's MD did. The passive side's
    /// chunks are its GETs or PUTs; the active side's are its MEs, of
    /// which a PUT uses as many as it has chunks (its last chunk says
    /// which it is: the passive buffer may hold less than the active one
    /// offered room for), the rest being unlinked then.
    fn ev_chunk(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        let Some(parent) = op.parent.clone() else {
            return;
        };
        let initiator = parent.kind == Kind::Passive;
        match (ev.kind(), ev.info.status) {
            (EventKind::Get, Err(err))
                if !initiator && masked_reply(ev, err, parent.st.lock().del) =>
            {
                // As in `ev_active`: the passive side says.
                {
                    let mut s = parent.st.lock();
                    s.moved += ev.info.mlength as usize;
                    s.landed += 1;
                }
                arm_deadline(e, &parent);
            }
            (EventKind::Get, Err(err)) if !initiator => {
                // Our REPLY to the passive side's GET of this chunk failed
                // to go.
                let k = parent
                    .st
                    .lock()
                    .children
                    .iter()
                    .position(|c| Arc::ptr_eq(c, op));
                let again =
                    !ev.unlinked && k.is_some_and(|k| self.ask_again(e, &parent, op, k as u64));
                if !again {
                    self.reply_lost(e, &parent, err);
                }
            }
            (EventKind::Put, Ok(())) => {
                let last = parse_hdr(ev.info.hdr_data).map(|h| h.0) == Some(HDR_BULK_LAST);
                let rest: Vec<MdHandle> = {
                    let mut s = parent.st.lock();
                    s.moved += ev.info.mlength as usize;
                    s.landed += 1;
                    if last && let Some(k) = s.children.iter().position(|c| Arc::ptr_eq(c, op)) {
                        s.expect = Some(k + 1);
                    }
                    if s.expect.is_some_and(|n| s.landed >= n) {
                        // Every chunk the passive side sends landed: the
                        // MEs left over end here.
                        s.children
                            .iter()
                            .filter(|c| !Arc::ptr_eq(c, op))
                            .filter_map(|c| c.st.lock().md)
                            .collect()
                    } else {
                        Vec::new()
                    }
                };
                for md in rest {
                    let _ = e.lnet.md_unlink(md);
                }
                arm_deadline(e, &parent);
            }
            (EventKind::Get, Ok(())) => {
                {
                    let mut s = parent.st.lock();
                    s.moved += ev.info.mlength as usize;
                    s.landed += 1;
                }
                arm_deadline(e, &parent);
            }
            (EventKind::Reply, Ok(())) => {
                let want = op.st.lock().len;
                let took = ev.info.mlength as usize;
                let mut s = parent.st.lock();
                s.moved += took;
                if took == 0 {
                    // A tomb's answer: the requester is gone.
                    s.landed += 1;
                } else if took != want && s.fail.is_none() {
                    s.fail = Some(NetError::Protocol(format!(
                        "the bulk requester gave {took} of {want} bytes"
                    )));
                }
            }
            (EventKind::Send | EventKind::Ack, Ok(())) => {}
            (_, Err(err)) => {
                let mut s = parent.st.lock();
                if s.fail.is_none() {
                    s.fail = Some(if s.del {
                        NetError::Cancelled
                    } else {
                        op_err(err, "bulk peer")
                    });
                }
                drop(s);
                if initiator
                    && !ev.unlinked
                    && let Some(md) = op.st.lock().md
                {
                    // The REPLY will not come.
                    let _ = e.lnet.md_unlink(md);
                }
            }
            (EventKind::Unlink, _) => {
                let mut s = parent.st.lock();
                let spare = s.expect.is_some_and(|n| s.landed >= n);
                if s.fail.is_none() && !spare {
                    s.fail = Some(NetError::Cancelled);
                }
            }
        }
        if !ev.unlinked {
            return;
        }
        op.st.lock().md = None;
        let done = {
            let mut s = parent.st.lock();
            s.left = s.left.saturating_sub(1);
            s.left == 0
        };
        if !done {
            return;
        }
        let (moved, fail, len, gone, chunks, finished, release) = {
            let mut s = parent.st.lock();
            let chunks = s.children.len();
            s.children.clear();
            (
                s.moved,
                s.fail.take(),
                s.len,
                s.landed,
                chunks,
                s.stage == Stage::Done,
                s.release,
            )
        };
        Self::unregister(e, &parent);
        if finished {
            // Completed meanwhile (the requester's LANDED, a deletion).
            e.remove_op(parent.id);
            if initiator {
                self.forget_claim(&parent);
            }
            return;
        }
        if fail.is_none() && !release && parent.sends_data() {
            // Its data went: the other side's LANDED (or the deadline)
            // ends it.
            return;
        }
        if initiator {
            e.remove_op(parent.id);
            let r = match fail {
                Some(err) => Err(err),
                None if release => Err(NetError::Cancelled),
                None if moved == len => {
                    self.send_landed(e, &parent, len);
                    Ok(len)
                }
                None if moved == 0 && gone == chunks => {
                    parent.st.lock().release = true;
                    Err(NetError::Cancelled)
                }
                // Some chunks came, and the requester no longer had the
                // MEs of others (it gave the request up half-way).
                None if gone > 0 => Err(NetError::Cancelled),
                None => Err(NetError::Protocol(format!(
                    "the bulk requester gave {moved} of {len} bytes"
                ))),
            };
            self.passive_ended(e, &parent, r);
        } else {
            e.remove_op(parent.id);
            let r = fail.map_or(Ok(moved), Err);
            if r.is_ok() && parent.receives_data() {
                self.send_landed(e, &parent, moved);
            }
            self.finish(&parent, r);
        }
    }

    /// A claimed passive buffer's transfer ended: with the bytes moved, or
    /// not (a requester that gave up, or whose machine is gone, hands the
    /// claim back; otherwise the requester is told and the buffer
    /// completes).
    fn passive_ended(&self, e: &Engine, op: &Arc<Op>, r: Result<usize>) {
        let (release, peer, xid) = {
            let mut s = op.st.lock();
            s.md = None;
            (std::mem::take(&mut s.release), s.peer, s.xid)
        };
        self.forget_claim(op);
        if r.is_ok() {
            self.finish(op, r);
            return;
        }
        if release {
            disarm_deadline(e, op);
            e.remove_op(op.id);
            {
                let mut s = op.st.lock();
                s.stage = Stage::Idle;
                s.peer = None;
                s.fail = None;
                s.del = false;
                s.moved = 0;
                s.landed = 0;
                s.expect = None;
            }
            if let Some(q) = &op.buf {
                self.sink.release_claim(q);
            }
            return;
        }
        let r = r.map_err(|e0| op.st.lock().fail.take().unwrap_or(e0));
        if let Err(err) = &r {
            self.abort_requester(e, peer, xid, err);
        }
        self.finish(op, r);
    }

    /// An event of an active buffer's ME: the passive side's PUT landed
    /// (read: the passive side is told, LANDED) or its GET took the data
    /// (written); an unlink without either ends it with what stopped it.
    fn ev_active(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        if op.st.lock().stage == Stage::Done {
            // Completed already (refused, aborted, deleted while data
            // came in): LNet is letting go of the MD.
            if ev.unlinked {
                op.st.lock().md = None;
            }
            return;
        }
        let (del, fail, owner) = {
            let s = op.st.lock();
            (
                s.del,
                s.fail.clone(),
                s.target
                    .as_ref()
                    .map(|t| t.owner.clone())
                    .unwrap_or_default(),
            )
        };
        match (ev.kind(), ev.info.status) {
            (EventKind::Put, Ok(())) => {
                let n = ev.info.mlength as usize;
                self.send_landed(e, op, n);
                self.finish(op, Ok(n));
            }
            (EventKind::Get, Err(err)) if masked_reply(ev, err, del) => {
                // Deleted while our REPLY was going out: whether it went
                // is the passive side's to say (LANDED, or an ABORT).
                {
                    let mut s = op.st.lock();
                    s.moved = ev.info.mlength as usize;
                    s.landed = 1;
                }
                e.add_op(op);
                arm_deadline(e, op);
            }
            (EventKind::Get, Err(err)) => {
                // Our REPLY to the passive side's GET failed to go.
                if ev.unlinked || !self.ask_again(e, op, op, 0) {
                    self.reply_lost(e, op, err);
                }
            }
            (EventKind::Get, Ok(())) => {
                // The passive side took the data: its LANDED ends it.
                {
                    let mut s = op.st.lock();
                    s.moved = ev.info.mlength as usize;
                    s.landed = 1;
                }
                // Kept for the LANDED (the engine lets an operation go at
                // its MD's last event unless it waits for an answer).
                e.add_op(op);
                arm_deadline(e, op);
            }
            (_, Err(err)) => {
                let r = fail.unwrap_or(if del {
                    NetError::Cancelled
                } else {
                    op_err(err, &owner)
                });
                self.finish(op, Err(r));
                if !ev.unlinked
                    && let Some(md) = op.st.lock().md
                {
                    let _ = e.lnet.md_unlink(md);
                }
            }
            _ => {
                if ev.unlinked && op.st.lock().landed == 0 {
                    self.finish(op, Err(fail.unwrap_or(NetError::Cancelled)));
                }
            }
        }
        if ev.unlinked {
            op.st.lock().md = None;
        }
    }

    fn ev_ctl(self: &Arc<Self>, e: &Engine, op: &Arc<Op>, ev: &Event) {
        if ev.kind() == EventKind::Put && ev.info.status.is_ok() {
            let bytes = {
                let st = self.st.lock();
                st.ctl_mem.get(&op.id).map(|r| {
                    let (o, n) = (ev.info.offset as usize, ev.info.mlength as usize);
                    r.read(|b| b.get(o..o + n).map(<[u8]>::to_vec))
                })
            };
            match bytes.flatten().map(|b| Ctl::decode(&b)) {
                Some(Ok(c)) if ev.info.mlength == ev.info.rlength => self.on_ctl(e, ev, c),
                Some(Ok(_)) => warn!(tm = %self.id, "truncated control message dropped"),
                Some(Err(err)) => warn!(tm = %self.id, %err, "bad control message dropped"),
                None => {}
            }
        }
        if ev.unlinked {
            // Exhausted: put a fresh one at the end.
            let mut st = self.st.lock();
            st.ctl_mem.remove(&op.id);
            st.infra.retain(|o| o.id != op.id);
            // Still needed while stopping: answers to what is in flight.
            let (started, addr) = (st.started, st.addr);
            drop(st);
            if started && let Some(a) = addr {
                match self.attach_infra(e, a, Kind::Ctl) {
                    Ok(n) => self.st.lock().infra.push(n),
                    Err(err) => warn!(tm = %self.id, %err, "control MD not replaced"),
                }
            }
        }
    }

    fn from(&self) -> (u32, u16) {
        let st = self.st.lock();
        st.addr.map_or((0, 0), |a| (a.portal, a.tmid.unwrap_or(0)))
    }

    /// The receiver of our send `seq` posted it: a DELIVERED (with the
    /// length it got) or an acknowledgement its answer carried (the whole
    /// message: a truncated one is NAKed).
    fn delivered(&self, peer: &Peer, seq: u32, len: Option<u64>) {
        let op = self
            .st
            .lock()
            .sends
            .get(&seq)
            .cloned()
            .filter(|o| o.kind == Kind::Send && o.went_to(peer));
        if let Some(op) = op {
            let want = op.st.lock().len;
            let r = match len {
                Some(len) if len != want as u64 => Err(NetError::Protocol(format!(
                    "receiver reports {len} bytes of a {want}-byte message"
                ))),
                _ => Ok(want),
            };
            self.finish(&op, r);
        }
    }

    /// The acknowledgement a message that reached us carries (whether a
    /// buffer took it or not: it arrived).
    fn ack_carried(&self, ev: &Event) {
        if let Some(seq) = carried_ack(ev.info.match_bits)
            && let Some(peer) = Peer::of(ev)
        {
            self.delivered(&peer, seq, None);
        }
    }

    /// A send carrying an acknowledgement did not leave: the
    /// acknowledgement goes as a DELIVERED of its own (a second one, if
    /// the carrier arrived after all, finds nothing to complete).
    fn pay_carried(&self, op: &Op) {
        let Some((seq, len)) = op.st.lock().carried.take() else {
            return;
        };
        let Some(dest) = op
            .buf
            .as_ref()
            .and_then(QueuedBuf::end_point)
            .and_then(|ep| ep.downcast::<LnetAddr>().copied())
        else {
            return;
        };
        let e = self.engine();
        let _ = e.send_ctl(
            dest.process(),
            dest.portal,
            dest.tmid.unwrap_or(0),
            self.from(),
            &Ctl::Delivered {
                xid: u64::from(seq),
                len,
            },
            0,
        );
    }

    /// The passive buffer `peer`'s machine claimed for its request `xid`.
    /// A claim is filed under the NID its request came from; a Multi-Rail
    /// requester may send what follows (LANDED, AGAIN, ABORT) from another
    /// of its NIDs, one this node may have learned belongs to the same
    /// peer only after the request came (discovery's push): that claim
    /// is found too once the node knows both NIDs as one peer
    /// (`tests/multirail.rs` lost a LANDED so, one run in eight).
    /// `seq_only`: `xid` is only the request's 24-bit sequence number (what
    /// a bulk PUT's header data names).
    fn claim(&self, e: &Engine, peer: &Peer, xid: u64, seq_only: bool) -> Option<Arc<Op>> {
        let others: Vec<(Nid, Arc<Op>)> = {
            let st = self.st.lock();
            if !seq_only && let Some(o) = st.claims.get(&(peer.proc_, xid)) {
                return o.claimed_by(peer).then(|| Arc::clone(o));
            }
            let same = |x: u64| {
                if seq_only {
                    x & u64::from(SEQ_MASK) == xid
                } else {
                    x == xid
                }
            };
            st.claims
                .iter()
                .filter(|((p, x), o)| {
                    same(*x)
                        && p.pid == peer.proc_.pid
                        && (seq_only || p.nid != peer.proc_.nid)
                        && o.claimed_by(peer)
                })
                .map(|((p, _), o)| (p.nid, Arc::clone(o)))
                .collect()
        };
        if let Some((_, o)) = others.iter().find(|(nid, _)| *nid == peer.proc_.nid) {
            return Some(Arc::clone(o));
        }
        if others.is_empty() {
            return None;
        }
        let from = peer.proc_.nid;
        e.lnet.with_node(|n| {
            let peers = n.discovery().peers();
            others
                .into_iter()
                .find(|(nid, _)| peers.peer_of(from).is_some_and(|q| q.contains(*nid)))
                .map(|(_, o)| o)
        })
    }

    fn forget_claim(&self, op: &Op) {
        let (peer, xid) = {
            let s = op.st.lock();
            (s.peer, s.xid)
        };
        if let Some(p) = peer {
            self.st.lock().claims.remove(&(p.proc_, xid));
        }
    }

    // ------------------------------------------------------------------
    // Bulk: the request, then the passive side's GET or PUT

    fn on_ctl(self: &Arc<Self>, e: &Engine, ev: &Event, c: Ctl) {
        let (peer, requester) = self.sender(e, ev);
        let Some(peer) = peer else {
            warn!(tm = %self.id, "control message without a sender");
            return;
        };
        let from = self.from();
        trace!(tm = %self.id, ?c, %requester, "control message");
        match c {
            Ctl::Request {
                xid,
                active,
                size,
                bits,
                desc,
            } => {
                let refuse = |error| {
                    let _ = e.send_ctl(
                        peer.proc_,
                        peer.portal,
                        peer.tmid,
                        from,
                        &Ctl::Verdict {
                            xid,
                            result: Err(error),
                        },
                        0,
                    );
                };
                let fields = match NetBufDesc::from_bytes(desc).decode() {
                    Ok(f) => f,
                    Err(err) => return refuse(err),
                };
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                match self.sink.claim_passive(&fields, &requester, active, size) {
                    Err(PassiveError { error, notice }) => {
                        self.notice(e, notice);
                        refuse(error);
                    }
                    Ok(PassiveClaim { buf, len }) => {
                        if let Err(err) = self.start_passive(e, &buf, len, peer, xid, bits) {
                            self.sink.release_claim(&buf);
                            refuse(err);
                        }
                    }
                }
            }
            Ctl::Verdict { xid, result } => {
                // A refusal of our request.
                let Some(op) = e.op(xid).filter(|o| {
                    Arc::ptr_eq(&o.tm, self) && o.kind == Kind::Active && o.went_to(&peer)
                }) else {
                    return;
                };
                match result {
                    Err(err) => self.end_active(e, &op, err),
                    Ok(_) => {
                        warn!(tm = %self.id, "an acceptance verdict (an older version of this transport?) ignored")
                    }
                }
            }
            Ctl::Delivered { xid, len } => {
                if let Ok(seq) = u32::try_from(xid) {
                    self.delivered(&peer, seq, Some(len));
                }
            }
            Ctl::DeliveredMany { acks } => {
                for (seq, len) in acks {
                    self.delivered(&peer, seq, Some(len));
                }
            }
            Ctl::Landed { xid, len } => {
                // Our data for that request landed: the buffer completes
                // (LNet may still be reporting the transfer's end: its
                // event then finds it done). An active send buffer of
                // ours, or a passive send buffer claimed for the request.
                let op = e
                    .op(xid)
                    .filter(|o| Arc::ptr_eq(&o.tm, self) && o.kind == Kind::Active)
                    .filter(|o| o.went_to(&peer))
                    .or_else(|| self.claim(e, &peer, xid, false))
                    .filter(|o| o.sends_data() && o.st.lock().stage == Stage::Live);
                if let Some(op) = op {
                    let want = op.st.lock().len;
                    let r = if usize::try_from(len) == Ok(want) {
                        Ok(want)
                    } else {
                        Err(NetError::Protocol(format!(
                            "the other side took {len} of {want} bytes"
                        )))
                    };
                    if op.kind == Kind::Passive {
                        self.forget_claim(&op);
                    }
                    self.finish(&op, r);
                    if op.kind == Kind::Active {
                        // Its GET MEs take AGAINs' GETs: unlinked now.
                        for md in op.live_mds() {
                            let _ = e.lnet.md_unlink(md);
                        }
                    }
                }
            }
            Ctl::Again { xid, chunk } => {
                let op = self
                    .claim(e, &peer, xid, false)
                    .filter(|o| o.receives_data() && o.st.lock().stage == Stage::Live);
                if let Some(op) = op {
                    self.get_again(e, &op, chunk);
                }
            }
            Ctl::Nak { xid, status } => {
                let op = u32::try_from(xid)
                    .ok()
                    .and_then(|seq| self.st.lock().sends.get(&seq).cloned())
                    .filter(|o| o.kind == Kind::Send && o.went_to(&peer));
                if let Some(op) = op {
                    let len = op.st.lock().len;
                    let status = match status {
                        NetError::MessageTooLarge { .. } => {
                            NetError::MessageTooLarge { len, space: 0 }
                        }
                        NetError::Unreachable(_) => NetError::Unreachable(
                            op.buf
                                .as_ref()
                                .and_then(QueuedBuf::end_point)
                                .map(|ep| ep.addr().to_string())
                                .unwrap_or_default(),
                        ),
                        other => other,
                    };
                    self.finish(&op, Err(status));
                }
            }
            Ctl::Gone { xid } => {
                // A request of ours reached a stopped machine...
                let op = u32::try_from(xid)
                    .ok()
                    .and_then(|seq| self.st.lock().sends.get(&seq).cloned())
                    .filter(|o| o.kind == Kind::Active && o.went_to(&peer));
                if let Some(op) = op {
                    let owner = op
                        .st
                        .lock()
                        .target
                        .as_ref()
                        .map(|t| t.owner.clone())
                        .unwrap_or_default();
                    self.end_active(e, &op, NetError::Unreachable(owner));
                }
                // ...or the requester of a claim of ours says its machine
                // is gone: the claim goes back.
                let claimed: Vec<Arc<Op>> = self
                    .st
                    .lock()
                    .claims
                    .iter()
                    .filter(|((p, x), o)| {
                        // The requesting machine's tomb: its process,
                        // portal and TMID (another machine of that process
                        // can have a request with the same low bits).
                        *p == peer.proc_ && (*x & u64::from(SEQ_MASK)) == xid && o.claimed_by(&peer)
                    })
                    .map(|(_, o)| Arc::clone(o))
                    .collect();
                for op in claimed {
                    self.hand_back(e, &op);
                }
            }
            Ctl::Abort {
                xid,
                status,
                by_requester,
            } => {
                if by_requester {
                    // The requester gave up (or, naming only a sequence
                    // number, found our bulk PUT had nowhere to land): hand
                    // the claim back.
                    let seq_only = xid <= u64::from(SEQ_MASK);
                    if let Some(op) = self
                        .claim(e, &peer, xid, false)
                        .or_else(|| seq_only.then(|| self.claim(e, &peer, xid, true)).flatten())
                    {
                        self.hand_back(e, &op);
                    }
                } else if let Some(op) = e.op(xid).filter(|o| {
                    Arc::ptr_eq(&o.tm, self) && o.kind == Kind::Active && o.went_to(&peer)
                }) {
                    // From the passive side: our active operation ends.
                    self.end_active(e, &op, status);
                }
            }
        }
    }

    /// A claimed passive buffer's requester gave up or is gone: its
    /// transfer is unlinked and, once LNet let go of it, the claim goes
    /// back (the buffer stays queued). A PUT already sent, waiting for its
    /// LANDED, goes back at once.
    fn hand_back(&self, e: &Engine, op: &Arc<Op>) {
        if op.st.lock().stage != Stage::Live {
            return;
        }
        op.st.lock().release = true;
        let mds = op.live_mds();
        if mds.is_empty() {
            self.passive_ended(e, op, Err(NetError::Cancelled));
            return;
        }
        for md in mds {
            let _ = e.lnet.md_unlink(md);
        }
    }

    /// An active send's REPLY to the passive side's GET of `chunk` (`unit`:
    /// that chunk's operation, or `op` itself for a transfer in one) failed
    /// to go. A REPLY is a response: LNet sends it back the way the GET
    /// came, never on another rail. The ME still offers the data, so the
    /// passive side is asked to GET it again (AGAIN, a PUT LNet resends
    /// elsewhere), at most [`AGAIN_MAX`] times per chunk. False when it is
    /// not asked (deleted, failed, done, or asked enough): the failure
    /// then ends the transfer.
    fn ask_again(&self, e: &Engine, op: &Arc<Op>, unit: &Arc<Op>, chunk: u64) -> bool {
        let to = {
            let s = op.st.lock();
            if s.del || s.fail.is_some() || s.stage != Stage::Live || !op.sends_data() {
                return false;
            }
            match &s.target {
                Some(t) => (t.proc_, t.portal, t.tmid),
                None => return false,
            }
        };
        {
            let mut u = unit.st.lock();
            if u.again >= AGAIN_MAX {
                return false;
            }
            u.again += 1;
        }
        debug!(tm = %self.id, xid = op.id, chunk, "REPLY not sent: AGAIN");
        let again = Ctl::Again { xid: op.id, chunk };
        if e.send_ctl(to.0, to.1, to.2, self.from(), &again, 0)
            .is_err()
        {
            return false;
        }
        arm_deadline(e, op);
        true
    }

    /// An active send's REPLY failed to go and no AGAIN follows (deleted,
    /// asked enough, or the AGAIN could not go): the transfer cannot
    /// complete, so the passive side is told (ABORT: it stops its GET
    /// rather than wait for LNet's transaction timeout) and the buffer
    /// completes now.
    fn reply_lost(&self, e: &Engine, op: &Arc<Op>, err: OpError) {
        let status = {
            let s = op.st.lock();
            if s.stage == Stage::Done {
                return;
            }
            s.fail.clone().unwrap_or_else(|| {
                if s.del {
                    NetError::Cancelled
                } else {
                    let owner = s
                        .target
                        .as_ref()
                        .map(|t| t.owner.clone())
                        .unwrap_or_default();
                    op_err(err, &owner)
                }
            })
        };
        self.abort_target(e, op, &status);
        self.end_active(e, op, status);
    }

    /// The requester's REPLY to our GET of `chunk` failed to go (its
    /// AGAIN): that GET is given up (its MD unlinked, its events ignored)
    /// and a new one asks for the same bytes, on a path LNet chooses
    /// anew. If the new GET cannot start, the old one stays and ends the
    /// transfer as it would have.
    fn get_again(self: &Arc<Self>, e: &Engine, op: &Arc<Op>, chunk: u64) {
        let (len, key, bits, peer, xid, children) = {
            let s = op.st.lock();
            (s.len, s.key, s.bits, s.peer, s.xid, s.children.clone())
        };
        let (Some(key), Some(peer), Ok(k)) = (key, peer, usize::try_from(chunk)) else {
            return;
        };
        let parts = chunks(len);
        if k >= parts.len() {
            return;
        }
        let unit = if children.is_empty() {
            Arc::clone(op)
        } else {
            match children.get(k) {
                Some(c) => Arc::clone(c),
                None => return,
            }
        };
        let old = {
            let mut s = unit.st.lock();
            // As many as the requester's ME takes: a requester asking
            // more is not followed.
            let Some(old) = s.md.filter(|_| s.again < AGAIN_MAX) else {
                return;
            };
            s.again += 1;
            s.superseded.push(old);
            old
        };
        let r = self.start_chunk(
            e,
            &unit,
            false,
            (peer.proc_, peer.portal),
            (key, &parts, k),
            bits,
            xid,
        );
        match r {
            Ok(()) => {
                debug!(tm = %self.id, xid, chunk, "AGAIN: GET again");
                let _ = e.lnet.md_unlink(old);
                arm_deadline(e, op);
            }
            Err(err) => {
                debug!(tm = %self.id, xid, chunk, %err, "AGAIN: no new GET");
                unit.st.lock().superseded.retain(|&m| m != old);
            }
        }
    }

    /// Ends an active operation whose passive side refused it, gave it up
    /// or is gone (so it needs no ABORT): its MEs are unlinked (LNet may
    /// still hold one whose data is coming in: the memory then reports
    /// itself gone) and the buffer completes with `status` now.
    fn end_active(&self, e: &Engine, op: &Arc<Op>, status: NetError) {
        if op.st.lock().stage == Stage::Done {
            return;
        }
        op.st.lock().fail = Some(status.clone());
        for md in op.live_mds() {
            let _ = e.lnet.md_unlink(md);
        }
        self.finish(op, Err(status));
    }

    /// Starts the transfer of a passive buffer claimed for `peer`'s
    /// request: a PUT of its data into the requester's MEs (`bits`) with
    /// an ACK, or a GET of the requester's data into it, one per MiB. An
    /// error means nothing is in LNet: the claim is to be handed back and
    /// the request refused.
    fn start_passive(
        self: &Arc<Self>,
        e: &Engine,
        q: &QueuedBuf,
        len: usize,
        peer: Peer,
        xid: u64,
        bits: u64,
    ) -> Result<()> {
        let op = self
            .st
            .lock()
            .ops
            .get(&q.token().raw())
            .cloned()
            .ok_or(NetError::NoEntry)?;
        let parts = chunks(len);
        if parts.len() > 1 << CHUNK_BITS {
            return Err(NetError::TooBig(format!("{len} bytes in one transfer")));
        }
        let key = self.register(e, &op, len).ok_or(NetError::NoEntry)?;
        let put = q.queue() == QueueType::PassiveBulkSend;
        {
            let mut s = op.st.lock();
            s.peer = Some(peer);
            s.xid = xid;
            s.len = len;
            s.moved = 0;
            s.landed = 0;
            s.fail = None;
            s.bits = bits;
            s.again = 0;
            s.superseded.clear();
        }
        e.add_op(&op);
        self.st
            .lock()
            .claims
            .insert((peer.proc_, xid), Arc::clone(&op));
        let to = (peer.proc_, peer.portal);
        let r = if parts.len() > 1 {
            self.start_chunks(e, &op, to, key, &parts, bits, xid, put)
        } else {
            let (start, threshold) = transfer_start(put, to, bits, self.from(), xid, true);
            bind_and_start(
                e,
                &op,
                MemRef::new(key, 0, len as u32),
                threshold,
                start,
                |s, md| {
                    s.md = Some(md);
                    s.stage = Stage::Live;
                },
            )
        };
        match r {
            Ok(()) => {
                if put {
                    // Bounds the wait for the requester's LANDED.
                    arm_deadline(e, &op);
                }
                Ok(())
            }
            Err(err) => {
                self.st.lock().claims.remove(&(peer.proc_, xid));
                e.remove_op(op.id);
                Self::unregister(e, &op);
                op.st.lock().peer = None;
                Err(lnet_err(&err, "bulk requester"))
            }
        }
    }

    /// The passive side's GETs or PUTs of a transfer larger than one LNet
    /// message, one per MiB, against the requester's consecutive match
    /// bits. An error means none started; a chunk that could not start
    /// after others did fails the transfer through their ends (`Ok`).
    #[allow(clippy::too_many_arguments)]
    fn start_chunks(
        self: &Arc<Self>,
        e: &Engine,
        op: &Arc<Op>,
        to: (ProcessId, u32),
        key: MemKey,
        parts: &[(usize, usize)],
        bits: u64,
        xid: u64,
        put: bool,
    ) -> std::result::Result<(), colibri_lnet_rt::LnetError> {
        {
            let mut s = op.st.lock();
            s.stage = Stage::Live;
            s.left = parts.len();
        }
        for (k, &(_, len)) in parts.iter().enumerate() {
            let c = self.new_chunk(e, op);
            c.st.lock().len = len;
            e.add_op(&c);
            op.st.lock().children.push(Arc::clone(&c));
            let r = self.start_chunk(e, &c, put, to, (key, parts, k), bits, xid);
            if let Err(err) = r {
                e.remove_op(c.id);
                if k == 0 {
                    let mut s = op.st.lock();
                    s.children.clear();
                    s.left = 0;
                    s.stage = Stage::Idle;
                    return Err(err);
                }
                // Chunks already started end by themselves (unlinked
                // now); the rest never will.
                {
                    let mut s = op.st.lock();
                    s.children.pop();
                    s.left -= parts.len() - k;
                    if s.fail.is_none() {
                        s.fail = Some(lnet_err(&err, "bulk requester"));
                    }
                }
                for md in op.live_mds() {
                    let _ = e.lnet.md_unlink(md);
                }
                return Ok(());
            }
        }
        Ok(())
    }

    /// Binds chunk `k` of a transfer (the bytes `parts[k]` names of memory
    /// `key`) to `unit` and starts its PUT or GET against the requester's
    /// match bits `bits + k` at `to`: the passive side's transfers
    /// (`start_chunks`) and their GETs again (`get_again`).
    #[allow(clippy::too_many_arguments)]
    fn start_chunk(
        &self,
        e: &Engine,
        unit: &Arc<Op>,
        put: bool,
        to: (ProcessId, u32),
        (key, parts, k): (MemKey, &[(usize, usize)], usize),
        bits: u64,
        xid: u64,
    ) -> std::result::Result<(), colibri_lnet_rt::LnetError> {
        let (off, len) = parts[k];
        let last = k + 1 == parts.len();
        let (start, threshold) = transfer_start(put, to, bits + k as u64, self.from(), xid, last);
        bind_and_start(
            e,
            unit,
            MemRef::new(key, off as u64, len as u32),
            threshold,
            start,
            |s, md| s.md = Some(md),
        )
    }

    /// Attaches an active buffer's MEs and MDs (one per MiB, consecutive
    /// match bits from `bits`), each for the passive side's process only,
    /// for its PUT (`recv`) or GET.
    #[allow(clippy::too_many_arguments)]
    fn attach_active(
        self: &Arc<Self>,
        e: &Engine,
        op: &Arc<Op>,
        portal: u32,
        bits: u64,
        target: ProcessId,
        key: MemKey,
        len: usize,
        recv: bool,
    ) -> std::result::Result<(), colibri_lnet_rt::LnetError> {
        // A GET ME takes the GETs of AGAINs too, each from the offset the
        // GET names (0), not from where the last one ended.
        let spec = |mem, user| {
            if recv {
                one_shot(mem, MdOptions::OP_PUT, user)
            } else {
                one_shot(mem, MdOptions::OP_GET | MdOptions::MANAGE_REMOTE, user)
                    .threshold(Threshold::Count(1 + AGAIN_MAX))
            }
        };
        let parts = chunks(len);
        if parts.len() == 1 {
            let md = e.attach_for(
                portal,
                bits,
                target,
                spec(MemRef::new(key, 0, len as u32), op.id),
            )?;
            let mut s = op.st.lock();
            s.md = Some(md);
            s.stage = Stage::Live;
            return Ok(());
        }
        let mut children = Vec::with_capacity(parts.len());
        for (k, &(off, n)) in parts.iter().enumerate() {
            let c = self.new_chunk(e, op);
            c.st.lock().len = n;
            e.add_op(&c);
            let r = e.attach_for(
                portal,
                bits + k as u64,
                target,
                spec(MemRef::new(key, off as u64, n as u32), c.id),
            );
            match r {
                Ok(md) => {
                    c.st.lock().md = Some(md);
                    children.push(c);
                }
                Err(err) => {
                    e.remove_op(c.id);
                    for c in &children {
                        if let Some(md) = c.st.lock().md.take() {
                            let _ = e.lnet.md_unlink(md);
                        }
                        e.remove_op(c.id);
                    }
                    return Err(err);
                }
            }
        }
        let mut s = op.st.lock();
        s.left = children.len();
        s.moved = 0;
        s.children = children;
        s.stage = Stage::Live;
        Ok(())
    }

    /// A bulk request could not be sent: its MEs go, and the buffer
    /// completes with the failure.
    pub(crate) fn fail_request(&self, op: &Arc<Op>, err: OpError) {
        let e = self.engine();
        let owner = op
            .st
            .lock()
            .target
            .as_ref()
            .map(|t| t.owner.clone())
            .unwrap_or_default();
        self.end_active(&e, op, op_err(err, &owner));
    }

    /// No answer in time: a message send waiting for its receiver's, or
    /// an active request for which nothing came from the passive side
    /// (since the request, or the last chunk) within `handshake_timeout`.
    pub(crate) fn expire_request(&self, op: &Arc<Op>) {
        let e = self.engine();
        if op.kind == Kind::Send {
            if op.st.lock().stage == Stage::Live {
                let dest = op
                    .buf
                    .as_ref()
                    .and_then(QueuedBuf::end_point)
                    .map(|ep| ep.addr().to_string())
                    .unwrap_or_default();
                debug!(tm = %self.id, %dest, "no answer to a message");
                self.finish(op, Err(NetError::TimedOut));
            } else if op.st.lock().md.is_none() {
                // Completed otherwise, and LNet is done with it.
                e.remove_op(op.id);
            }
            return;
        }
        if op.st.lock().stage != Stage::Live {
            if op.sends_data() && op.lnet_done() {
                // Completed otherwise, and LNet is done with it.
                e.remove_op(op.id);
            }
            return;
        }
        let moving = !op.live_mds().is_empty();
        if op.kind == Kind::Passive {
            if moving {
                // Its PUT still going out (a slow transfer, credits): LNet
                // bounds it.
                arm_deadline(&e, op);
                return;
            }
            // Sent, and no LANDED: whether it arrived is not known.
            debug!(tm = %self.id, "no LANDED for a passive transfer");
            let (peer, xid) = {
                let s = op.st.lock();
                (s.peer, s.xid)
            };
            self.forget_claim(op);
            self.abort_requester(&e, peer, xid, &NetError::TimedOut);
            self.finish(op, Err(NetError::TimedOut));
            return;
        }
        if op.kind != Kind::Active {
            return;
        }
        let (owner, started) = {
            let s = op.st.lock();
            (
                s.target
                    .as_ref()
                    .map(|t| t.owner.clone())
                    .unwrap_or_default(),
                s.landed > 0,
            )
        };
        // Whatever the passive side still does for it ends (its claim
        // goes back).
        self.abort_target(&e, op, &NetError::Cancelled);
        let status = if !started {
            // Nothing came: the passive side never started (refused it
            // without our hearing, is gone, or a rail lost the request).
            debug!(tm = %self.id, %owner, "no answer to a bulk request");
            NetError::Unreachable(format!("{owner}: no answer to the bulk request"))
        } else {
            // Data stopped coming, or (a send) the LANDED did not come:
            // whether the rest arrived is not known.
            debug!(tm = %self.id, %owner, moving, "bulk transfer stopped");
            NetError::TimedOut
        };
        self.end_active(&e, op, status);
    }
}

/// The match bits of a passive buffer: unique among the transfer
/// machine's queued buffers (from its slot index), the low 8 bits left for
/// the chunk index of a transfer larger than one LNet message.
fn passive_bits(tmid: u16, q: &QueuedBuf) -> u64 {
    let slot = q.token().raw() & 0xffff_ffff;
    match_bits(tmid, CNT_PASSIVE | ((slot + 1) << CHUNK_BITS))
}

/// Bits of a passive buffer's match bits that number its chunks.
const CHUNK_BITS: u32 = 8;
/// Most bytes one LNet message (so one MD) carries.
const MTU: usize = colibri_lnet_rt::colibri_lnet::wire::LNET_MTU as usize;

/// The chunks of a transfer of `len` bytes: (offset, length).
fn chunks(len: usize) -> Vec<(usize, usize)> {
    (0..len.div_ceil(MTU).max(1))
        .map(|k| (k * MTU, (len - k * MTU).min(MTU)))
        .collect()
}

/// The transport object of one transfer machine.
#[derive(Debug)]
pub(crate) struct LnetTm {
    sh: Arc<TmShared>,
}

impl LnetTm {
    /// What `buf_add` starts for `op` (already in the machine's table of
    /// operations): an error refuses the buffer.
    fn start_op(
        &self,
        e: &Arc<Engine>,
        q: &QueuedBuf,
        op: &Arc<Op>,
        addr: Option<LnetAddr>,
        started: bool,
    ) -> Result<()> {
        let sh = &self.sh;
        match op.kind {
            Kind::Recv => {
                if let (true, Some(a)) = (started, addr) {
                    sh.attach_recv(e, a, op)?;
                } else {
                    sh.st.lock().pending.push(Arc::clone(op));
                }
            }
            Kind::Send => {
                let dest = q
                    .end_point()
                    .and_then(|ep| ep.downcast::<LnetAddr>().copied())
                    .ok_or_else(|| {
                        NetError::InvalidArgument("send without an LNet end point".into())
                    })?;
                let a = addr.ok_or(NetError::WrongState {
                    op: "send",
                    state: colibri_net::TmState::Initialized,
                })?;
                let len = q.length();
                if len > MTU {
                    // LNet's limit (LNET_MTU, as Motr's LNet transport):
                    // refused at add, the buffer back in the caller's hands.
                    return Err(NetError::MessageTooLarge { len, space: MTU });
                }
                op.st.lock().len = len;
                sh.st.lock().sends.insert(seq_of(op.id), Arc::clone(op));
                let key = sh.register(e, op, len).ok_or(NetError::Cancelled)?;
                e.add_op(op);
                let from = (a.portal, a.tmid.unwrap_or(0));
                let ack = take_owed(e, &dest, from);
                op.st.lock().carried = ack;
                // Before the PUT: its answer may come at once.
                arm_deadline(e, op);
                let r = bind_and_start(
                    e,
                    op,
                    MemRef::new(key, 0, len as u32),
                    1,
                    Start::Put {
                        ack: false,
                        target: dest.process(),
                        portal: dest.portal,
                        match_bits: match_bits(
                            dest.tmid.unwrap_or(0),
                            msg_counter(ack.map(|(seq, _)| seq)),
                        ),
                        offset: 0,
                        hdr_data: hdr_data(HDR_MSG, from.0, from.1, seq_of(op.id)),
                    },
                    |s, md| {
                        s.md = Some(md);
                        s.stage = Stage::Live;
                    },
                );
                if r.is_ok() {
                    q.mark_taken_by_network();
                }
                if let Err(err) = r {
                    // Reported as the send's completion, as a failure on
                    // the wire would be.
                    sh.pay_carried(op);
                    if op.st.lock().md.is_none() {
                        e.remove_op(op.id);
                        TmShared::unregister(e, op);
                        sh.complete_later(e, op, Err(lnet_err(&err, &dest.to_string())));
                    } else {
                        op.st.lock().fail = Some(lnet_err(&err, &dest.to_string()));
                    }
                }
            }
            Kind::Passive => {}
            Kind::Active => {
                let fields = q
                    .desc()
                    .ok_or_else(|| NetError::InvalidDescriptor("missing".into()))?;
                let mut t = BulkTarget::decode(&fields.extra)?;
                t.owner.clone_from(&fields.owner);
                let owner = LnetAddr::parse(&fields.owner).map_err(|_| {
                    NetError::InvalidDescriptor("owner is not an LNet address".into())
                })?;
                if owner.process() != t.proc_
                    || owner.portal != t.portal
                    || owner.tmid != Some(t.tmid)
                {
                    return Err(NetError::InvalidDescriptor(
                        "the descriptor's LNet target does not match its owner".into(),
                    ));
                }
                let a = addr.ok_or(NetError::WrongState {
                    op: "active bulk",
                    state: colibri_net::TmState::Initialized,
                })?;
                let recv = q.queue() == QueueType::ActiveBulkRecv;
                let mem_len = if recv { q.size() } else { q.length() };
                if chunks(mem_len).len() > 1 << CHUNK_BITS {
                    return Err(NetError::TooBig(format!("{mem_len} bytes in one transfer")));
                }
                let desc = NetBufDesc::encode(fields, 4096)?;
                let key = sh.register(e, op, mem_len).ok_or(NetError::Cancelled)?;
                let tmid = a.tmid.unwrap_or(0);
                let bits = active_bits(tmid, op.id);
                {
                    let mut s = op.st.lock();
                    s.target = Some(t.clone());
                    s.len = mem_len;
                }
                e.add_op(op);
                // Before the request: the passive side's transfer may
                // come at once.
                if let Err(err) =
                    sh.attach_active(e, op, a.portal, bits, t.proc_, key, mem_len, recv)
                {
                    e.remove_op(op.id);
                    TmShared::unregister(e, op);
                    return Err(lnet_err(&err, &t.owner));
                }
                sh.st.lock().sends.insert(seq_of(op.id), Arc::clone(op));
                let req = Ctl::Request {
                    xid: op.id,
                    active: q.queue(),
                    size: mem_len as u64,
                    bits,
                    desc: desc.as_bytes().to_vec(),
                };
                arm_deadline(e, op);
                match e.send_ctl(t.proc_, t.portal, t.tmid, (a.portal, tmid), &req, op.id) {
                    Ok(()) => q.mark_taken_by_network(),
                    Err(err) => {
                        // Completed from the engine's thread (never inside
                        // `buf_add`); the MEs' unlink events find it done.
                        op.st.lock().stage = Stage::Done;
                        for md in op.live_mds() {
                            let _ = e.lnet.md_unlink(md);
                        }
                        disarm_deadline(e, op);
                        sh.complete_later(e, op, Err(lnet_err(&err, &t.owner)));
                    }
                }
            }
            Kind::Ctl | Kind::Catch | Kind::Stray | Kind::Tomb | Kind::Chunk => {}
        }
        Ok(())
    }

    pub(crate) fn new(id: TmId, sink: TmSink, x: &Arc<XprtInner>) -> Result<Self> {
        let lane = OnceLock::new();
        if x.thread_per_tm {
            let _ = lane.set(Lane::start(format!("colibri-lnet-tm-{id}"))?);
        }
        Ok(Self {
            sh: Arc::new(TmShared {
                id,
                sink,
                x: Arc::downgrade(x),
                home: Arc::clone(&x.engines[0]),
                lane,
                st: Mutex::new(TmSt::default()),
                _held: crate::Held::new(&x.held),
            }),
        })
    }

    fn release_address(&self) {
        let (engine, addr, infra, was) = {
            let mut st = self.sh.st.lock();
            let was = std::mem::take(&mut st.started);
            (
                st.engine.clone(),
                st.addr,
                std::mem::take(&mut st.infra),
                was,
            )
        };
        if let (Some(e), Some(a)) = (engine, addr) {
            for op in infra {
                if let Some(md) = op.st.lock().md {
                    let _ = e.lnet.md_unlink(md);
                }
            }
            let tmid = a.tmid.unwrap_or(0);
            e.release(a.portal, tmid, &self.sh);
            if was {
                self.leave_tomb(&e, a.portal, tmid);
            }
        }
    }

    /// Attaches the MD that answers `Unreachable` for a stopped machine
    /// (messages and bulk requests still on their way to it), unless
    /// another machine took the address meanwhile.
    fn leave_tomb(&self, e: &Engine, portal: u32, tmid: u16) {
        if e.local_tm(portal, tmid).is_some() {
            return;
        }
        let op = self.sh.new_op(e, Kind::Tomb, None);
        e.add_op(&op);
        let r = e.attach(
            portal,
            match_bits(tmid, 0),
            (1 << COUNTER_BITS) - 1,
            Unlink::Unlink,
            // Empty: a passive side's GET gets a REPLY of no bytes, which
            // tells it the requester is gone (its PUT gets a GONE).
            MdSpec::new(
                MemRef::new(e.empty, 0, 0),
                MdOptions::OP_PUT
                    .with(MdOptions::OP_GET)
                    .with(MdOptions::TRUNCATE)
                    .with(MdOptions::ACK_DISABLE),
            )
            .threshold(Threshold::Infinite)
            .unlink(Unlink::Unlink)
            .user_ptr(op.id),
        );
        match r {
            Ok(md) => {
                if let Some(old) = e.tombs.lock().insert((portal, tmid), md) {
                    let _ = e.lnet.md_unlink(old);
                }
            }
            Err(err) => {
                e.remove_op(op.id);
                debug!(tm = %self.sh.id, %err, "no tomb left");
            }
        }
    }
}

impl Drop for LnetTm {
    /// Whatever path the machine took to its end, its tables let go of
    /// their operations, which refer back to it.
    fn drop(&mut self) {
        self.sh.forget_all();
        self.sh.st.lock().infra.clear();
        // Finalised: the machine's own thread, if it has one, runs what is
        // queued and leaves.
        if let Some(l) = self.sh.lane.get() {
            l.close();
        }
    }
}

impl XprtTm for LnetTm {
    fn start(&self, addr: &str) -> Result<()> {
        let want = LnetAddr::parse(addr)?;
        let sh = &self.sh;
        let e =
            sh.x.upgrade()
                .and_then(|x| x.engine_for(want.nid))
                .ok_or_else(|| NetError::InvalidAddress {
                    addr: addr.to_string(),
                    reason: format!("no LNet node of this transport has NID {}", want.nid),
                })?;
        if want.pid != e.pid {
            return Err(NetError::InvalidAddress {
                addr: addr.to_string(),
                reason: format!("the LNet node's PID is {}", e.pid),
            });
        }
        let tmid = e.claim(want.portal, want.tmid, sh)?;
        let a = want.with_tmid(tmid);
        {
            let mut st = sh.st.lock();
            st.engine = Some(Arc::clone(&e));
            st.addr = Some(a);
            st.own = a.to_string().into();
        }
        let mut infra = Vec::new();
        for kind in std::iter::repeat_n(Kind::Ctl, CTL_MDS).chain([Kind::Catch, Kind::Stray]) {
            match sh.attach_infra(&e, a, kind) {
                Ok(op) => infra.push(op),
                Err(err) => {
                    for op in infra {
                        if let Some(md) = op.st.lock().md {
                            let _ = e.lnet.md_unlink(md);
                        }
                    }
                    e.release(a.portal, tmid, sh);
                    return Err(err);
                }
            }
        }
        let pending = {
            let mut st = sh.st.lock();
            st.infra = infra;
            st.started = true;
            std::mem::take(&mut st.pending)
        };
        for op in pending {
            if op.st.lock().del {
                sh.complete_later(&e, &op, Err(NetError::Cancelled));
                continue;
            }
            if let Err(err) = sh.attach_recv(&e, a, &op) {
                sh.complete_later(&e, &op, Err(err));
            }
        }
        sh.push(&e, Work::Started(Arc::clone(sh), a.to_string()));
        Ok(())
    }

    fn stop(&self, abort: bool) -> Result<()> {
        let mut st = self.sh.st.lock();
        st.stopping = true;
        st.abort = abort;
        debug!(tm = %self.sh.id, abort, "stop requested");
        Ok(())
    }

    fn stopped(&self) {
        self.release_address();
        self.sh.forget_all();
        debug!(tm = %self.sh.id, "stopped");
    }

    fn fini(&self) {
        self.release_address();
        self.sh.forget_all();
        self.sh.st.lock().ctl_mem.clear();
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        let a = LnetAddr::parse(addr)?;
        if a.tmid.is_none() {
            return Err(NetError::InvalidAddress {
                addr: addr.to_string(),
                reason: "an end point needs a TMID (not *)".into(),
            });
        }
        Ok(EpAddr {
            addr: a.to_string(),
            data: Arc::new(a),
        })
    }

    fn desc_extra(&self, buf: &QueuedBuf) -> Result<Vec<u8>> {
        let st = self.sh.st.lock();
        let (Some(e), Some(a)) = (&st.engine, st.addr) else {
            return Err(NetError::WrongState {
                op: "passive add",
                state: colibri_net::TmState::Initialized,
            });
        };
        let len = if buf.queue() == QueueType::PassiveBulkSend {
            buf.length()
        } else {
            buf.size()
        };
        let t = BulkTarget {
            proc_: ProcessId::new(a.nid, e.pid),
            portal: a.portal,
            tmid: a.tmid.unwrap_or(0),
            bits: passive_bits(a.tmid.unwrap_or(0), buf),
            len: len as u64,
            owner: String::new(),
        };
        Ok(t.encode())
    }

    fn buf_add(&self, q: &QueuedBuf) -> Result<()> {
        let sh = &self.sh;
        let (engine, addr, started) = {
            let st = sh.st.lock();
            (st.engine.clone(), st.addr, st.started)
        };
        let e = engine.unwrap_or_else(|| Arc::clone(&sh.home));
        let op = sh.new_op(&e, kind_of(q.queue()), Some(q.clone()));
        // In the table before anything starts: an answer may complete the
        // operation (and take it out again) before this call returns.
        let token = q.token().raw();
        sh.st.lock().ops.insert(token, Arc::clone(&op));
        let r = self.start_op(&e, q, &op, addr, started);
        if r.is_err() {
            // Refused: the buffer goes back to the caller, nothing queued.
            let mut st = sh.st.lock();
            if st.ops.get(&token).is_some_and(|o| o.id == op.id) {
                st.ops.remove(&token);
            }
            if st.sends.get(&seq_of(op.id)).is_some_and(|o| o.id == op.id) {
                st.sends.remove(&seq_of(op.id));
            }
        }
        r
    }

    fn buf_del(&self, q: &QueuedBuf, reason: DelReason) {
        let sh = &self.sh;
        let (op, abort, e) = {
            let st = sh.st.lock();
            (
                st.ops.get(&q.token().raw()).cloned(),
                st.abort,
                st.engine.clone().unwrap_or_else(|| Arc::clone(&sh.home)),
            )
        };
        let Some(op) = op else {
            // Not ours (a fault wrapper above us holds it) or already
            // completed: an operation leaves the table only once its
            // completion was decided, so this one is then ignored.
            sh.push(
                &e,
                Work::Complete(sh.sink.clone(), q.clone(), Err(NetError::Cancelled)),
            );
            return;
        };
        // Whether the operation's data comes in: a receive, a passive
        // buffer's GET (its REPLY), an active receive (the passive side's
        // PUT into its MEs). The rest send theirs.
        let incoming = match op.kind {
            Kind::Recv => true,
            Kind::Passive => q.queue() == QueueType::PassiveBulkRecv,
            Kind::Active => q.queue() == QueueType::ActiveBulkRecv,
            _ => false,
        };
        // Operations whose data started to go out.
        let puts = op.data_out();
        if puts
            && op.st.lock().stage == Stage::Live
            && (reason == DelReason::Cancel || (reason == DelReason::Stop && !abort))
        {
            // A message or bulk data LNet already has cannot be taken back
            // without losing what it tells: whether it arrived. A plain
            // cancel (and a stop without abort) lets it end with its
            // answer (DELIVERED or NAK, bounded by `handshake_timeout`;
            // ACK, bounded by LNet's transaction timeout) or its failure;
            // a timeout or a stop with abort ends it at once.
            op.st.lock().del = true;
            if reason == DelReason::Cancel {
                // A PUT no peer has seen (waiting for its peer's
                // discovery, for credits, or in the socket LND for a
                // connection or behind other messages) was never sent:
                // LNet gives it back, failed `Canceled`, and its SEND
                // event completes the buffer `Cancelled` at once.
                for md in op.live_mds() {
                    let _ = e.lnet.withdraw(md);
                }
            }
            return;
        }
        let stage = {
            let mut s = op.st.lock();
            s.del = true;
            s.stage
        };
        let mds = op.live_mds();
        trace!(tm = %sh.id, ?reason, ?stage, kind = ?op.kind, "del");
        let idle = mds.is_empty();
        match stage {
            Stage::Live => {
                // Whether an operation still holds an MD, unlinked now or
                // already unlinking (a receive MD is exhausted, and unlinks
                // itself, when the message that fills it is matched).
                let mut busy = false;
                let mut all_busy = !mds.is_empty();
                for md in mds {
                    let b = match e.lnet.md_unlink(md) {
                        Ok(b) => b,
                        Err(_) => {
                            trace!(tm = %sh.id, "MD already unlinking");
                            e.lnet.md_busy(md)
                        }
                    };
                    busy |= b;
                    all_busy &= b;
                }
                if op.kind == Kind::Active && !(all_busy && op.sends_data()) {
                    // The passive side stops what it does for the request
                    // (its claim goes back). An active send whose every
                    // ME is answering a GET is not aborted: its data is
                    // going out, and the passive side says whether it
                    // arrived (`masked_reply`).
                    sh.abort_target(&e, &op, &NetError::Cancelled);
                }
                // Data coming in may have stalled, and LNet would hold the
                // MD until the socket LND gives the connection up: the
                // buffer completes now; the LND finds its memory gone,
                // drops the rest of that payload and the message fails
                // (one whose last bytes landed meanwhile is refused with a
                // NAK, as one for a buffer no longer queued). Messages
                // that had arrived are delivered by their events. A PUT
                // going out, which LNet may hold until its transaction
                // timeout, completes now too (whatever LNet does later
                // with the MD finds the memory gone), as does one LNet is
                // done with (a PUT waiting for its answer). The rest (an
                // active buffer's MEs, a passive buffer's GET, a receive
                // nothing was coming into) complete with their unlink's
                // event.
                if (incoming && busy) || puts || idle {
                    let (peer, xid) = {
                        let mut s = op.st.lock();
                        s.stage = Stage::Done;
                        (s.peer, s.xid)
                    };
                    if op.kind == Kind::Passive {
                        // Its requester is told by an ABORT.
                        sh.forget_claim(&op);
                        sh.abort_requester(&e, peer, xid, &NetError::Cancelled);
                    }
                    sh.complete_later(&e, &op, Err(NetError::Cancelled));
                }
            }
            Stage::Done => {}
            Stage::Idle => {
                sh.st.lock().pending.retain(|o| o.id != op.id);
                op.st.lock().stage = Stage::Done;
                sh.complete_later(&e, &op, Err(NetError::Cancelled));
            }
        }
    }

    fn deliver(&self, delivery: Delivery) {
        self.sh.push(&self.sh.engine(), Work::Deliver(delivery));
    }

    /// Pins the machine's own delivery thread (`thread_per_tm`: the only
    /// thread that runs its callbacks) to the first CPU of `cpus`
    /// (`colibri_net::cpu`, as every transport checks and pins). Without one (the callbacks run on
    /// the node's engine thread, shared by its machines) the domain does
    /// not declare `Caps::confine` and the core refuses before this.
    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let cpu = colibri_net::cpu::check_cpu_set(cpus)?;
        let lane = self.sh.lane.get().ok_or(NetError::Unsupported {
            transport: "lnet",
            what: "confining a transfer machine without a thread of its own (thread_per_tm)",
        })?;
        lane.push(Work::Pin(cpu));
        Ok(())
    }
}

/// Whether `ev`, an error event of an active send's GET ME, is the REPLY
/// of an operation deleted while it went out: LNet reports the last
/// operation of an MD unlinked while busy `TimedOut` whether or not it
/// succeeded (an aborted MD, as Lustre does), so its fate is unknown here
/// and the passive side's LANDED or ABORT decides. A REPLY that failed
/// reports its own error.
fn masked_reply(ev: &Event, err: OpError, del: bool) -> bool {
    del && ev.unlinked && matches!(err, OpError::TimedOut)
}

/// Puts `op` in the engine's deadlines (`handshake_timeout` from now).
fn arm_deadline(e: &Engine, op: &Op) {
    let d = Instant::now() + e.handshake_timeout;
    if let Some(old) = op.st.lock().deadline.replace(d) {
        e.handshakes.lock().remove(&(old, op.id));
    }
    e.handshakes.lock().insert((d, op.id));
}

/// Takes `op` out of the engine's deadlines.
fn disarm_deadline(e: &Engine, op: &Op) {
    if let Some(d) = op.st.lock().deadline.take() {
        e.handshakes.lock().remove(&(d, op.id));
    }
}

/// The sequence number of a send (in its header data).
/// A one-shot MD spec (one operation, then unlinked) over `mem`.
fn one_shot(mem: MemRef, opts: MdOptions, user: u64) -> MdSpec {
    MdSpec::new(mem, opts)
        .threshold(Threshold::Count(1))
        .unlink(Unlink::Unlink)
        .user_ptr(user)
}

/// [`Engine::bind_and_start`] for `op`, whose state stays locked across
/// the call: `bound` records the MD in it before any thread can act on an
/// event of the MD (whoever handles one locks the state first).
fn bind_and_start(
    e: &Engine,
    op: &Op,
    mem: MemRef,
    threshold: u32,
    start: Start,
    bound: impl FnOnce(&mut OpSt, MdHandle),
) -> std::result::Result<(), colibri_lnet_rt::LnetError> {
    let mut s = op.st.lock();
    let md = e.bind_and_start(mem, threshold, op.id, start)?;
    bound(&mut s, md);
    Ok(())
}

/// The passive side's transfer against the requester's MEs (`to`'s
/// portal, match bits `bits`) for request `xid`: a PUT of its data,
/// whose header data says who sends, for which request and whether it is
/// the transfer's `last` chunk (the requester answers LANDED once all
/// landed: a PUT it resends on another rail, where an LNet ACK, a
/// response, could not be), or a GET of the requester's data. Returns it
/// with its MD's threshold (a PUT's SEND; a GET's SEND and REPLY).
fn transfer_start(
    put: bool,
    to: (ProcessId, u32),
    bits: u64,
    from: (u32, u16),
    xid: u64,
    last: bool,
) -> (Start, u32) {
    if put {
        let kind = if last { HDR_BULK_LAST } else { HDR_BULK };
        let start = Start::Put {
            ack: false,
            target: to.0,
            portal: to.1,
            match_bits: bits,
            offset: 0,
            hdr_data: hdr_data(kind, from.0, from.1, (xid as u32) & SEQ_MASK),
        };
        (start, 1)
    } else {
        let start = Start::Get {
            target: to.0,
            portal: to.1,
            match_bits: bits,
            offset: 0,
        };
        (start, 2)
    }
}

/// The match bits of an active operation's MEs: unique among the
/// machine's operations in flight (the operation's sequence number), the
/// low 8 bits left for the chunk index.
fn active_bits(tmid: u16, id: u64) -> u64 {
    match_bits(tmid, CNT_ACTIVE | (u64::from(seq_of(id)) << CHUNK_BITS))
}

fn seq_of(id: u64) -> u32 {
    (id as u32) & SEQ_MASK
}

fn kind_of(q: QueueType) -> Kind {
    match q {
        QueueType::MsgRecv => Kind::Recv,
        QueueType::MsgSend => Kind::Send,
        QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => Kind::Passive,
        QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => Kind::Active,
    }
}
