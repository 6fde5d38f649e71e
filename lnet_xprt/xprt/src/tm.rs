//! A transfer machine over LNet: its MEs and MDs, the operations of its
//! queued buffers, and what each LNet event means for them.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
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
    CNT_CTL, CNT_MSG, CNT_PASSIVE, COUNTER_BITS, HDR_BULK, HDR_CTL, HDR_MSG, LnetAddr, RECV_IGNORE,
    SEQ_MASK, carried_ack, hdr_data, match_bits, msg_counter, parse_hdr,
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
    /// An active operation waiting for the passive side's verdict.
    Verdict,
    /// An MD is live.
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
    /// answered yet: kept in the engine's table for its deadline.
    pub(crate) fn awaits_answer(&self) -> bool {
        self.kind == Kind::Send && self.st.lock().stage == Stage::Live
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
        if op.kind == Kind::Send && op.st.lock().md.is_none() {
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
        if op.kind == Kind::Send && sent {
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
        let (bits, ignore, mem, opts, thr, unlink) = if kind == Kind::Ctl {
            let region = colibri_lnet_rt::MemRegion::zeroed(CTL_MD_BYTES);
            let key = e.lnet.register(&region);
            self.st.lock().ctl_mem.insert(op.id, region);
            op.st.lock().key = Some(key);
            (
                match_bits(tmid, CNT_CTL),
                0,
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
        match op.kind {
            Kind::Recv => self.ev_recv(&e, op, ev),
            Kind::Send => self.ev_send(op, ev),
            Kind::Passive => self.ev_passive(&e, op, ev),
            Kind::Active => self.ev_active(&e, op, ev),
            Kind::Ctl => self.ev_ctl(&e, op, ev),
            Kind::Chunk => self.ev_chunk(&e, op, ev),
            Kind::Tomb => {
                if ev.kind() == EventKind::Put
                    && ev.info.status.is_ok()
                    && let (Some(p), _) = self.sender(&e, ev)
                {
                    let from = self.from();
                    let xid = u64::from(p.seq);
                    // A message gets a NAK, a request or verdict a GONE;
                    // notes and bulk PUTs nothing (an answered note could
                    // be a GONE to another tomb, which would answer it).
                    let answer = match parse_hdr(ev.info.hdr_data).map(|h| h.0) {
                        Some(HDR_MSG) => Some(Ctl::Nak {
                            xid,
                            status: NetError::Unreachable(String::new()),
                        }),
                        Some(HDR_CTL) => Some(Ctl::Gone { xid }),
                        _ => None,
                    };
                    if let Some(a) = answer {
                        let _ = e.send_ctl(p.proc_, p.portal, p.tmid, from, &a, 0);
                    }
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

    fn ev_passive(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        match (ev.kind(), ev.info.status) {
            (EventKind::Get | EventKind::Put, Ok(())) => {
                self.forget_claim(op);
                self.finish(op, Ok(ev.info.mlength as usize));
            }
            (EventKind::Get | EventKind::Put, Err(err)) => {
                self.forget_claim(op);
                self.finish(op, Err(op_err(err, "bulk peer")));
            }
            _ if ev.unlinked => {
                let (release, peer, xid) = {
                    let mut s = op.st.lock();
                    s.md = None;
                    (std::mem::take(&mut s.release), s.peer, s.xid)
                };
                self.forget_claim(op);
                if release {
                    // The requester gave up: the buffer is available again.
                    disarm_deadline(e, op);
                    {
                        let mut s = op.st.lock();
                        s.stage = Stage::Idle;
                        s.peer = None;
                    }
                    if let Some(q) = &op.buf {
                        self.sink.release_claim(q);
                    }
                    return;
                }
                let r = op.st.lock().fail.take().unwrap_or(NetError::Cancelled);
                self.abort_requester(e, peer, xid, &r);
                self.finish(op, Err(r));
            }
            _ => {}
        }
    }

    /// Sends an ABORT for operation `xid` to the machine `(process,
    /// portal, TMID)`: a passive buffer's requester (the buffer is gone)
    /// or an active request's passive side (the request is given up). Its
    /// side of the transfer ends with `status`.
    fn send_abort(&self, e: &Engine, to: (ProcessId, u32, u16), xid: u64, status: &NetError) {
        let _ = e.send_ctl(
            to.0,
            to.1,
            to.2,
            self.from(),
            &Ctl::Abort {
                xid,
                status: status.clone(),
            },
            0,
        );
    }

    /// [`TmShared::send_abort`] to a passive buffer's requester, if any.
    fn abort_requester(&self, e: &Engine, peer: Option<Peer>, xid: u64, status: &NetError) {
        if let Some(p) = peer {
            self.send_abort(e, (p.proc_, p.portal, p.tmid), xid, status);
        }
    }

    /// An event of one chunk of a transfer larger than one LNet message:
    /// the transfer ends when every chunk's MD did.
    fn ev_chunk(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        let Some(parent) = op.parent.clone() else {
            return;
        };
        let active = parent.kind == Kind::Active;
        match (ev.kind(), ev.info.status) {
            (EventKind::Get | EventKind::Put | EventKind::Reply, Ok(())) => {
                parent.st.lock().moved += ev.info.mlength as usize;
            }
            (EventKind::Ack, Ok(())) => {
                let n = op.st.lock().len;
                parent.st.lock().moved += n;
            }
            (EventKind::Send, Ok(())) => {}
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
                if active
                    && !ev.unlinked
                    && let Some(md) = op.st.lock().md
                {
                    // The REPLY or ACK will not come.
                    let _ = e.lnet.md_unlink(md);
                }
            }
            (EventKind::Unlink, _) => {
                let mut s = parent.st.lock();
                if s.fail.is_none() {
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
        let (moved, fail) = {
            let mut s = parent.st.lock();
            s.children.clear();
            (s.moved, s.fail.take())
        };
        e.remove_op(parent.id);
        if active {
            Self::unregister(e, &parent);
            self.finish(&parent, fail.map_or(Ok(moved), Err));
        } else {
            self.passive_ended(e, &parent, fail.map_or(Ok(moved), Err));
            Self::unregister(e, &parent);
        }
    }

    /// A claimed passive buffer's MDs all ended: with the bytes moved, or
    /// unlinked (a requester that gave up hands the claim back; otherwise
    /// the requester is told and the buffer completes).
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
            {
                let mut s = op.st.lock();
                s.stage = Stage::Idle;
                s.peer = None;
                s.moved = 0;
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

    fn ev_active(&self, e: &Engine, op: &Arc<Op>, ev: &Event) {
        let (del, len, fail, owner) = {
            let s = op.st.lock();
            (
                s.del,
                s.len,
                s.fail.clone(),
                s.target
                    .as_ref()
                    .map(|t| t.owner.clone())
                    .unwrap_or_default(),
            )
        };
        match (ev.kind(), ev.info.status) {
            (EventKind::Reply, Ok(())) => self.finish(op, Ok(ev.info.mlength as usize)),
            (EventKind::Ack, Ok(())) => self.finish(op, Ok(len)),
            (EventKind::Send, Ok(())) => {}
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
                if ev.unlinked {
                    self.finish(op, Err(fail.unwrap_or(NetError::Cancelled)));
                }
            }
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
    // The bulk handshake

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
                desc,
            } => {
                let answer = |result| {
                    let _ = e.send_ctl(
                        peer.proc_,
                        peer.portal,
                        peer.tmid,
                        from,
                        &Ctl::Verdict { xid, result },
                        0,
                    );
                };
                let fields = match NetBufDesc::from_bytes(desc).decode() {
                    Ok(f) => f,
                    Err(err) => return answer(Err(err)),
                };
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                match self.sink.claim_passive(&fields, &requester, active, size) {
                    Err(PassiveError { error, notice }) => {
                        self.notice(e, notice);
                        answer(Err(error));
                    }
                    Ok(PassiveClaim { buf, len }) => {
                        match self.attach_passive(e, &buf, len, peer, xid) {
                            Ok(bits) => answer(Ok((len as u64, bits))),
                            Err(err) => {
                                self.sink.release_claim(&buf);
                                answer(Err(err));
                            }
                        }
                    }
                }
            }
            Ctl::Verdict { xid, result } => {
                let Some(op) = e
                    .op(xid)
                    .filter(|o| Arc::ptr_eq(&o.tm, self) && o.kind == Kind::Active)
                else {
                    // We gave up on it: the passive side waits for nothing.
                    if result.is_ok() {
                        self.abort_requester(e, Some(peer), xid, &NetError::Cancelled);
                    }
                    return;
                };
                self.on_verdict(e, &op, peer, result);
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
                if let Some(op) = op
                    && op.st.lock().stage == Stage::Verdict
                {
                    e.remove_op(op.id);
                    Self::unregister(e, &op);
                    let owner = op
                        .st
                        .lock()
                        .target
                        .as_ref()
                        .map(|t| t.owner.clone())
                        .unwrap_or_default();
                    self.finish(&op, Err(NetError::Unreachable(owner)));
                }
                // ...or a verdict of ours did: its claim goes back.
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
                    op.st.lock().release = true;
                    for md in op.live_mds() {
                        let _ = e.lnet.md_unlink(md);
                    }
                }
            }
            Ctl::Abort { xid, status } => {
                // From the passive side: our active operation ends.
                if let Some(op) = e.op(xid).filter(|o| {
                    Arc::ptr_eq(&o.tm, self) && o.kind == Kind::Active && o.went_to(&peer)
                }) {
                    let (stage, md) = {
                        let mut s = op.st.lock();
                        s.fail = Some(status.clone());
                        (s.stage, s.md)
                    };
                    let _ = md;
                    match stage {
                        Stage::Live => {
                            // LNet may hold the MD until its transaction
                            // timeout (a GET whose REPLY will not come); the
                            // buffer completes now: a late REPLY finds its
                            // memory gone (BufMem) and is dropped.
                            for md in op.live_mds() {
                                let _ = e.lnet.md_unlink(md);
                            }
                            self.finish(&op, Err(status));
                        }
                        Stage::Verdict => {
                            e.remove_op(op.id);
                            Self::unregister(e, &op);
                            self.finish(&op, Err(status));
                        }
                        _ => {}
                    }
                    return;
                }
                // From the active side: hand the claim back.
                let claimed = self.st.lock().claims.get(&(peer.proc_, xid)).cloned();
                if let Some(op) = claimed.filter(|o| o.claimed_by(&peer)) {
                    op.st.lock().release = true;
                    for md in op.live_mds() {
                        let _ = e.lnet.md_unlink(md);
                    }
                }
            }
        }
    }

    /// Attaches the claimed passive buffer's ME and MD for `peer`'s
    /// request; returns the match bits.
    fn attach_passive(
        self: &Arc<Self>,
        e: &Engine,
        q: &QueuedBuf,
        len: usize,
        peer: Peer,
        xid: u64,
    ) -> Result<u64> {
        let op = self
            .st
            .lock()
            .ops
            .get(&q.token().raw())
            .cloned()
            .ok_or(NetError::NoEntry)?;
        let addr = self.st.lock().addr.ok_or(NetError::NoEntry)?;
        let bits = passive_bits(addr.tmid.unwrap_or(0), q);
        let key = self.register(e, &op, len).ok_or(NetError::NoEntry)?;
        let opts = if q.queue() == QueueType::PassiveBulkSend {
            MdOptions::OP_GET
        } else {
            MdOptions::OP_PUT
        };
        {
            let mut s = op.st.lock();
            s.peer = Some(peer);
            s.xid = xid;
            s.len = len;
        }
        e.add_op(&op);
        if len > MTU {
            return self.attach_passive_chunks(e, &op, addr, key, opts, bits, peer, xid);
        }
        let r = e.attach_for(
            addr.portal,
            bits,
            peer.proc_,
            one_shot(MemRef::new(key, 0, len as u32), opts, op.id),
        );
        match r {
            Ok(md) => {
                let mut s = op.st.lock();
                s.md = Some(md);
                s.stage = Stage::Live;
                drop(s);
                arm_deadline(e, &op);
                self.st.lock().claims.insert((peer.proc_, xid), op);
                Ok(bits)
            }
            Err(err) => {
                e.remove_op(op.id);
                Self::unregister(e, &op);
                op.st.lock().peer = None;
                Err(lnet_err(&err, "passive buffer"))
            }
        }
    }

    /// The MEs and MDs of a claimed passive buffer larger than one LNet
    /// message: one per MiB, with consecutive match bits (Lustre's bulk).
    #[allow(clippy::too_many_arguments)]
    fn attach_passive_chunks(
        self: &Arc<Self>,
        e: &Engine,
        op: &Arc<Op>,
        addr: LnetAddr,
        key: MemKey,
        opts: MdOptions,
        bits: u64,
        peer: Peer,
        xid: u64,
    ) -> Result<u64> {
        let len = op.st.lock().len;
        let parts = chunks(len);
        if parts.len() > 1 << CHUNK_BITS {
            e.remove_op(op.id);
            Self::unregister(e, op);
            return Err(NetError::TooBig(format!("{len} bytes in one transfer")));
        }
        let mut children = Vec::with_capacity(parts.len());
        let mut failed = None;
        for (k, &(off, n)) in parts.iter().enumerate() {
            let c = self.new_chunk(e, op);
            c.st.lock().len = n;
            e.add_op(&c);
            let r = e.attach_for(
                addr.portal,
                bits + k as u64,
                peer.proc_,
                one_shot(MemRef::new(key, off as u64, n as u32), opts, c.id),
            );
            match r {
                Ok(md) => {
                    c.st.lock().md = Some(md);
                    children.push(c);
                }
                Err(err) => {
                    e.remove_op(c.id);
                    failed = Some(err);
                    break;
                }
            }
        }
        if let Some(err) = failed {
            for c in &children {
                if let Some(md) = c.st.lock().md.take() {
                    let _ = e.lnet.md_unlink(md);
                }
                e.remove_op(c.id);
            }
            e.remove_op(op.id);
            Self::unregister(e, op);
            op.st.lock().peer = None;
            return Err(lnet_err(&err, "passive buffer"));
        }
        {
            let mut s = op.st.lock();
            s.left = children.len();
            s.moved = 0;
            s.children = children;
            s.stage = Stage::Live;
        }
        arm_deadline(e, op);
        self.st
            .lock()
            .claims
            .insert((peer.proc_, xid), Arc::clone(op));
        Ok(bits)
    }

    /// GETs or PUTs of a transfer larger than one LNet message, one per
    /// MiB, against the passive buffer's consecutive match bits.
    fn start_active_chunks(
        self: &Arc<Self>,
        e: &Engine,
        op: &Arc<Op>,
        t: &BulkTarget,
        key: MemKey,
        len: usize,
        bits: u64,
    ) -> std::result::Result<(), colibri_lnet_rt::LnetError> {
        let recv = op
            .buf
            .as_ref()
            .is_some_and(|q| q.queue() == QueueType::ActiveBulkRecv);
        let from = self.from();
        let parts = chunks(len);
        {
            let mut s = op.st.lock();
            s.stage = Stage::Live;
            s.len = len;
            s.moved = 0;
            s.left = parts.len();
        }
        for (k, &(off, n)) in parts.iter().enumerate() {
            let c = self.new_chunk(e, op);
            c.st.lock().len = n;
            e.add_op(&c);
            op.st.lock().children.push(Arc::clone(&c));
            let r = bind_and_start(
                e,
                &c,
                MemRef::new(key, off as u64, n as u32),
                2,
                bulk_start(recv, t, bits + k as u64, from),
                |s, md| s.md = Some(md),
            );
            if let Err(err) = r {
                // Chunks already started end by themselves; the rest never
                // will: the transfer fails now.
                op.st.lock().left -= parts.len() - k;
                e.remove_op(c.id);
                for md in op.live_mds() {
                    let _ = e.lnet.md_unlink(md);
                }
                return Err(err);
            }
        }
        Ok(())
    }

    fn on_verdict(
        self: &Arc<Self>,
        e: &Engine,
        op: &Arc<Op>,
        peer: Peer,
        result: Result<(u64, u64)>,
    ) {
        let (target, stage, del) = {
            let s = op.st.lock();
            (s.target.clone(), s.stage, s.del)
        };
        let Some(t) = target else { return };
        if stage == Stage::Done {
            // Cancelled while the request was on its way: free the claim.
            self.abort_requester(e, Some(peer), op.id, &NetError::Cancelled);
            e.remove_op(op.id);
            Self::unregister(e, op);
            return;
        }
        if stage != Stage::Verdict
            || peer.proc_ != t.proc_
            || peer.portal != t.portal
            || peer.tmid != t.tmid
        {
            warn!(tm = %self.id, "verdict from an unexpected peer or at an unexpected time ignored");
            return;
        }
        let (len, bits) = match result {
            Err(err) => {
                e.remove_op(op.id);
                Self::unregister(e, op);
                self.finish(op, Err(err));
                return;
            }
            Ok(x) => x,
        };
        let Some(q) = op.buf.clone() else { return };
        let recv = q.queue() == QueueType::ActiveBulkRecv;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bad = if recv {
            len > q.size()
        } else {
            len != q.length()
        };
        let from = self.from();
        let abort = |status| self.send_abort(e, (t.proc_, t.portal, t.tmid), op.id, &status);
        if del || bad || op.st.lock().stage == Stage::Done {
            abort(NetError::Cancelled);
            e.remove_op(op.id);
            Self::unregister(e, op);
            let r = if bad {
                NetError::Protocol(format!("verdict for {len} bytes"))
            } else {
                NetError::Cancelled
            };
            self.finish(op, Err(r));
            return;
        }
        let key = op.st.lock().key;
        let Some(key) = key else { return };
        if len > MTU {
            if let Err(err) = self.start_active_chunks(e, op, &t, key, len, bits) {
                abort(NetError::Cancelled);
                let ne = lnet_err(&err, &t.owner);
                let none_left = op.st.lock().left == 0;
                if none_left {
                    e.remove_op(op.id);
                    Self::unregister(e, op);
                }
                // Completed now; chunks still in LNet end on their own.
                self.finish(op, Err(ne));
            }
            return;
        }
        let r = bind_and_start(
            e,
            op,
            MemRef::new(key, 0, len as u32),
            2,
            bulk_start(recv, &t, bits, from),
            |s, md| {
                s.md = Some(md);
                s.stage = Stage::Live;
                s.len = len;
            },
        );
        if let Err(err) = r {
            abort(NetError::Cancelled);
            let ne = lnet_err(&err, &t.owner);
            op.st.lock().fail = Some(ne.clone());
            if op.st.lock().md.is_none() {
                e.remove_op(op.id);
                Self::unregister(e, op);
                self.finish(op, Err(ne));
            }
        }
    }

    /// A bulk request could not be sent.
    pub(crate) fn fail_request(&self, op: &Arc<Op>, err: OpError) {
        let e = self.engine();
        if op.st.lock().stage != Stage::Verdict {
            return;
        }
        let owner = op
            .st
            .lock()
            .target
            .as_ref()
            .map(|t| t.owner.clone())
            .unwrap_or_default();
        e.remove_op(op.id);
        Self::unregister(&e, op);
        self.finish(op, Err(op_err(err, &owner)));
    }

    /// No verdict came in time (active), or no GET or PUT after the
    /// verdict (passive: the claim is handed back).
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
        if op.kind == Kind::Passive {
            {
                let mut s = op.st.lock();
                if s.stage != Stage::Live || s.peer.is_none() {
                    return;
                }
                s.release = true;
            }
            debug!(tm = %self.id, "passive claim unused: handed back");
            for md in op.live_mds() {
                let _ = e.lnet.md_unlink(md);
            }
            return;
        }
        let (stage, owner) = {
            let s = op.st.lock();
            (
                s.stage,
                s.target
                    .as_ref()
                    .map(|t| t.owner.clone())
                    .unwrap_or_default(),
            )
        };
        if stage == Stage::Verdict || stage == Stage::Done {
            e.remove_op(op.id);
            Self::unregister(&e, op);
        }
        if stage == Stage::Verdict {
            self.finish(
                op,
                Err(NetError::Unreachable(format!(
                    "{owner}: no answer to the bulk request"
                ))),
            );
        }
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
                let size = mem_len as u64;
                let key = sh.register(e, op, mem_len).ok_or(NetError::Cancelled)?;
                let _ = key;
                {
                    let mut s = op.st.lock();
                    s.stage = Stage::Verdict;
                    s.target = Some(t.clone());
                    s.len = mem_len;
                }
                e.add_op(op);
                sh.st.lock().sends.insert(seq_of(op.id), Arc::clone(op));
                let desc = NetBufDesc::encode(fields, 4096)?;
                let req = Ctl::Request {
                    xid: op.id,
                    active: q.queue(),
                    size,
                    desc: desc.as_bytes().to_vec(),
                };
                arm_deadline(e, op);
                if let Err(err) = e.send_ctl(
                    t.proc_,
                    t.portal,
                    t.tmid,
                    (a.portal, a.tmid.unwrap_or(0)),
                    &req,
                    op.id,
                ) {
                    e.remove_op(op.id);
                    TmShared::unregister(e, op);
                    op.st.lock().stage = Stage::Done;
                    sh.complete_later(e, op, Err(lnet_err(&err, &t.owner)));
                } else {
                    q.mark_taken_by_network();
                }
            }
            Kind::Ctl | Kind::Catch | Kind::Tomb | Kind::Chunk => {}
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
            MdSpec::new(
                MemRef::new(e.empty, 0, 0),
                MdOptions::OP_PUT
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
        for kind in std::iter::repeat_n(Kind::Ctl, CTL_MDS).chain([Kind::Catch]) {
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
        if matches!(op.kind, Kind::Send | Kind::Active)
            && op.st.lock().stage == Stage::Live
            && (reason == DelReason::Cancel || (reason == DelReason::Stop && !abort))
        {
            // A message or bulk transfer LNet already has cannot be taken
            // back without losing what it tells: whether it arrived. A
            // plain cancel (and a stop without abort) lets it end with its
            // answer (DELIVERED or NAK, bounded by `handshake_timeout`;
            // ACK or REPLY, bounded by LNet's transaction timeout) or its
            // failure; a timeout or a stop with abort ends it at once.
            op.st.lock().del = true;
            if op.kind == Kind::Send && reason == DelReason::Cancel {
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
        match (stage, mds.is_empty()) {
            (Stage::Live, false) => {
                // Whether an operation still holds an MD, unlinked now or
                // already unlinking (a receive MD is exhausted, and unlinks
                // itself, when the message that fills it is matched).
                let mut busy = false;
                for md in mds {
                    busy |= match e.lnet.md_unlink(md) {
                        Ok(b) => b,
                        Err(_) => {
                            trace!(tm = %sh.id, "MD already unlinking");
                            e.lnet.md_busy(md)
                        }
                    };
                }
                let incoming = op.kind == Kind::Recv
                    || (op.kind == Kind::Passive
                        && op.buf.as_ref().map(QueuedBuf::queue)
                            == Some(QueueType::PassiveBulkRecv));
                if incoming && busy {
                    // A message may be being read into the buffer, and its
                    // sender may have stalled: LNet would hold the MD until
                    // the socket LND gives the connection up. The buffer
                    // completes now; the LND finds its memory gone, drops
                    // the rest of that payload and the message fails (one
                    // whose last bytes landed meanwhile is refused with a
                    // NAK, as one for a buffer no longer queued). Messages
                    // that had arrived are delivered by their events. A
                    // passive buffer's requester, whose PUT is coming in,
                    // is told by an ABORT. (Data going out, a GET's REPLY,
                    // cannot be cut short: that waits for its end.)
                    let (peer, xid) = {
                        let mut s = op.st.lock();
                        s.stage = Stage::Done;
                        (s.peer, s.xid)
                    };
                    if op.kind == Kind::Passive {
                        sh.forget_claim(&op);
                        sh.abort_requester(&e, peer, xid, &NetError::Cancelled);
                    }
                    sh.complete_later(&e, &op, Err(NetError::Cancelled));
                }
                if matches!(op.kind, Kind::Send | Kind::Active) {
                    // An operation LNet may hold until its transaction
                    // timeout: the buffer completes now (whatever LNet does
                    // later with the MD finds the memory gone).
                    op.st.lock().stage = Stage::Done;
                    sh.complete_later(&e, &op, Err(NetError::Cancelled));
                }
            }
            (Stage::Done, _) => {}
            (Stage::Verdict, _) => {
                // The answer may still come: it is then refused with an
                // ABORT. One goes now too, for a request already claimed
                // (a passive claim nobody uses also ends by itself after
                // the handshake timeout).
                let t = {
                    let mut s = op.st.lock();
                    s.stage = Stage::Done;
                    s.target.clone()
                };
                if let Some(t) = t {
                    sh.send_abort(&e, (t.proc_, t.portal, t.tmid), op.id, &NetError::Cancelled);
                }
                sh.complete_later(&e, &op, Err(NetError::Cancelled));
            }
            _ => {
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

/// The active side's transfer: a GET of the passive buffer when it
/// receives, else a PUT with ACK carrying who sends.
fn bulk_start(recv: bool, t: &BulkTarget, bits: u64, from: (u32, u16)) -> Start {
    if recv {
        Start::Get {
            target: t.proc_,
            portal: t.portal,
            match_bits: bits,
            offset: 0,
        }
    } else {
        Start::Put {
            ack: true,
            target: t.proc_,
            portal: t.portal,
            match_bits: bits,
            offset: 0,
            hdr_data: hdr_data(HDR_BULK, from.0, from.1, 0),
        }
    }
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
