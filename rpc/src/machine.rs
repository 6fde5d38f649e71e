//! The RPC machine: one transfer machine, its receive buffers, the send
//! buffer pool and formation, the receive path, and the timer thread.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, EndPoint, NetBuffer, NetError, QueueType,
    RecvParams, TmEvent, TmEventKind, TmHandle, TmState, TransferMachine, Transport,
};
use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{debug, trace, warn};

use crate::config::RpcConfig;
use crate::error::{Result, RpcError, STATUS_PROTOCOL, STATUS_UNKNOWN_OPCODE};
use crate::fasthash::FastMap;
use crate::server::{Handler, ReplyHandle, Request, SrvSession};
use crate::session::{Session, SessionInner};
use crate::stats::{Counters, RpcStats, bump};
use crate::wire::{
    self, BulkDesc, ItemError, ItemHeader, ItemKind, MSG_HEADER_SIZE, MsgReader, WireError,
};

/// How long a message refused for lack of receive buffers waits before it
/// is sent again.
const RETRY_DELAY: Duration = Duration::from_millis(1);
/// How long start and stop wait for the transfer machine.
const TM_WAIT: Duration = Duration::from_secs(30);

/// An encoded item waiting in a formation queue.
pub(crate) struct QItem {
    pub(crate) bytes: Vec<u8>,
    /// The call's xid for requests (to fail it if its message fails).
    pub(crate) call_xid: Option<u64>,
}

/// Whose queue a message came from.
#[derive(Clone)]
pub(crate) enum OutRef {
    Client(Arc<SessionInner>),
    Server(Arc<SrvSession>),
}

/// The xids of the calls a message carries (usually one: kept inline).
#[derive(Debug, Default)]
pub(crate) struct Xids {
    first: Option<u64>,
    rest: Vec<u64>,
}

impl Xids {
    fn push(&mut self, x: u64) {
        if self.first.is_none() {
            self.first = Some(x);
        } else {
            self.rest.push(x);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.first.into_iter().chain(self.rest.iter().copied())
    }
}

/// A message in flight: where it came from and the calls it carries.
pub(crate) struct MsgRecord {
    pub(crate) owner: OutRef,
    pub(crate) xids: Xids,
    len: usize,
}

/// Formation state of one direction to one peer: items waiting to be
/// packed, and the messages in flight.
#[derive(Default)]
pub(crate) struct Outbound {
    queue: VecDeque<QItem>,
    queued_bytes: usize,
    first_at: Option<Instant>,
    pub(crate) in_flight: usize,
    retry: VecDeque<(NetBuffer, MsgRecord)>,
    retry_at: Option<Instant>,
    starved: bool,
    /// Send what is queued without waiting for the batch delay.
    pub(crate) forced: bool,
    /// The first send failure since it was last taken.
    pub(crate) send_error: Option<RpcError>,
    pub(crate) msgs: u64,
    pub(crate) items: u64,
    pub(crate) bytes: u64,
}

impl Outbound {
    pub(crate) fn push(&mut self, item: QItem, now: Instant) {
        self.queued_bytes += item.bytes.len();
        if self.queue.is_empty() {
            self.first_at = Some(now);
        }
        self.queue.push_back(item);
    }

    /// Puts a message refused for lack of receive buffers back, to be sent
    /// again at `at` (before anything queued after it).
    pub(crate) fn requeue(&mut self, buf: NetBuffer, rec: MsgRecord, at: Instant) {
        self.retry.push_back((buf, rec));
        self.retry_at = Some(at);
    }

    /// True when something waits to be sent.
    pub(crate) fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.retry.is_empty()
    }

    /// Items waiting.
    pub(crate) fn queued_len(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing is queued or in flight.
    pub(crate) fn idle(&self) -> bool {
        self.queue.is_empty() && self.retry.is_empty() && self.in_flight == 0
    }

    /// Empties the queues (shutdown, peer gone): returns the xids of the
    /// calls whose requests were waiting.
    pub(crate) fn drain(&mut self) -> Vec<u64> {
        let mut xids: Vec<u64> = self.queue.drain(..).filter_map(|q| q.call_xid).collect();
        for (_, rec) in self.retry.drain(..) {
            xids.extend(rec.xids.iter());
        }
        self.queued_bytes = 0;
        self.first_at = None;
        self.retry_at = None;
        xids
    }

    /// When the timer must look at this queue again: the end of the batch
    /// delay, or the time to resend a message refused for lack of receive
    /// buffers. `None` when only a send completion can make progress (the
    /// session is at its limit of messages in flight, or waits for a send
    /// buffer), or when there is nothing to send; with no batch delay,
    /// queued items leave from the completions, never from the timer.
    pub(crate) fn deadline(&self, delay: Duration, max_in_flight: usize) -> Option<Instant> {
        if self.starved || self.in_flight >= max_in_flight {
            return None;
        }
        if let Some(t) = self.retry_at.filter(|_| !self.retry.is_empty()) {
            return Some(t);
        }
        if self.queue.is_empty() || delay.is_zero() || self.forced {
            return None;
        }
        self.first_at.map(|t| t + delay)
    }
}

#[derive(Default)]
struct TimerSt {
    stop: bool,
    armed: bool,
}

pub(crate) struct Inner {
    pub(crate) cfg: RpcConfig,
    pub(crate) tm: TmHandle,
    dom: RwLock<Option<Domain>>,
    addr: OnceLock<String>,
    pub(crate) stopping: AtomicBool,
    max_msg: usize,
    recv_params: RecvParams,
    send_free: Mutex<Vec<NetBuffer>>,
    send_count: AtomicUsize,
    records: Box<[Mutex<Option<MsgRecord>>]>,
    starved: Mutex<VecDeque<OutRef>>,
    starved_n: AtomicUsize,
    send_cbs: Arc<BufferCallbacks>,
    recv_cbs: Arc<BufferCallbacks>,
    pub(crate) sessions: RwLock<FastMap<u64, Arc<SessionInner>>>,
    pub(crate) handlers: RwLock<FastMap<u32, Handler>>,
    pub(crate) srv_sessions: Mutex<FastMap<(u64, EndPoint), Arc<SrvSession>>>,
    timer: Mutex<TimerSt>,
    timer_cv: Condvar,
    next_wake: AtomicU64,
    base: Instant,
    pub(crate) stats: Counters,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcMachine")
            .field("addr", &self.addr.get())
            .field("tm", &self.tm.id())
            .finish_non_exhaustive()
    }
}

/// One message's decoded content, copied out of the receive buffer.
enum Parsed {
    Item {
        header: ItemHeader,
        payload: Vec<u8>,
        descs: Vec<BulkDesc>,
    },
    BadItem(ItemError),
    BadMsg(WireError),
}

fn parse_into(bytes: &[u8], out: &mut Vec<Parsed>) {
    match MsgReader::new(bytes) {
        Ok(r) => {
            for it in r {
                out.push(match it {
                    Ok(i) => Parsed::Item {
                        header: i.header,
                        payload: i.payload.to_vec(),
                        descs: i.descs,
                    },
                    Err(e) => Parsed::BadItem(e),
                });
            }
        }
        Err(e) => out.push(Parsed::BadMsg(e)),
    }
}

fn parse_bufvec(bv: &BufVec, off: usize, len: usize) -> Vec<Parsed> {
    let mut out = Vec::new();
    // Receive buffers are one segment: read the message in place.
    if let Some(seg) = bv.segments().next().filter(|s| off + len <= s.len()) {
        parse_into(&seg[off..off + len], &mut out);
    } else {
        match bv.to_vec(off, len) {
            Ok(v) => parse_into(&v, &mut out),
            Err(_) => out.push(Parsed::BadMsg(WireError::Truncated(
                "message outside its buffer",
            ))),
        }
    }
    out
}

impl Inner {
    fn new_cyclic(
        cfg: RpcConfig,
        tm: TmHandle,
        dom: Domain,
        max_msg: usize,
        recv_size: usize,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me: &Weak<Inner>| {
            let (w1, w2) = (me.clone(), me.clone());
            let send_cbs = Arc::new(BufferCallbacks::new().on(
                QueueType::MsgSend,
                move |_tm, ev| {
                    if let Some(m) = w1.upgrade() {
                        m.on_send(ev);
                    }
                },
            ));
            let recv_cbs = Arc::new(BufferCallbacks::new().on(
                QueueType::MsgRecv,
                move |tm, ev| {
                    if let Some(m) = w2.upgrade() {
                        m.on_recv(tm, ev);
                    }
                },
            ));
            let records = (0..cfg.send_buffers).map(|_| Mutex::new(None)).collect();
            Inner {
                max_msg,
                recv_params: RecvParams::multi(max_msg.min(recv_size), u32::MAX),
                cfg,
                tm,
                dom: RwLock::new(Some(dom)),
                addr: OnceLock::new(),
                stopping: AtomicBool::new(false),
                send_free: Mutex::new(Vec::new()),
                send_count: AtomicUsize::new(0),
                records,
                starved: Mutex::new(VecDeque::new()),
                starved_n: AtomicUsize::new(0),
                send_cbs,
                recv_cbs,
                sessions: RwLock::new(FastMap::default()),
                handlers: RwLock::new(FastMap::default()),
                srv_sessions: Mutex::new(FastMap::default()),
                timer: Mutex::new(TimerSt::default()),
                timer_cv: Condvar::new(),
                next_wake: AtomicU64::new(u64::MAX),
                base: Instant::now(),
                stats: Counters::default(),
            }
        })
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Largest encoded item a message carries.
    pub(crate) fn max_item(&self) -> usize {
        self.max_msg - MSG_HEADER_SIZE
    }

    pub(crate) fn register(&self, bv: BufVec) -> Result<NetBuffer> {
        let dom = self.dom.read();
        let dom = dom.as_ref().ok_or(RpcError::Shutdown)?;
        Ok(dom.register(bv)?)
    }

    // ---- timer ------------------------------------------------------------

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Makes sure the timer thread looks around no later than `at`.
    pub(crate) fn arm(&self, at: Instant) {
        let n = self.nanos(at);
        if n < self.next_wake.load(Ordering::Acquire) {
            let mut t = self.timer.lock();
            t.armed = true;
            self.next_wake.fetch_min(n, Ordering::AcqRel);
            drop(t);
            self.timer_cv.notify_one();
        }
    }

    fn timer_loop(self: Arc<Self>) {
        loop {
            let next = self.timer_pass(Instant::now());
            let mut t = self.timer.lock();
            if t.stop {
                return;
            }
            if std::mem::take(&mut t.armed) {
                continue;
            }
            match next {
                Some(at) => {
                    self.next_wake.store(self.nanos(at), Ordering::Release);
                    let _ = self.timer_cv.wait_until(&mut t, at);
                }
                None => {
                    self.next_wake.store(u64::MAX, Ordering::Release);
                    self.timer_cv.wait(&mut t);
                }
            }
            t.armed = false;
        }
    }

    /// Expires calls, resends, flushes delayed batches and retries, and
    /// forgets idle server sessions. Returns when to come back.
    fn timer_pass(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut merge = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        let sessions: Vec<Arc<SessionInner>> = self.sessions.read().values().cloned().collect();
        for s in sessions {
            merge(s.timer_pass(self, now));
        }
        let srv: Vec<Arc<SrvSession>> = self.srv_sessions.lock().values().cloned().collect();
        if !srv.is_empty() {
            let mut idle = Vec::new();
            for s in &srv {
                let (t, is_idle) = s.timer_pass(self, now);
                merge(t);
                if is_idle {
                    idle.push(s.key());
                }
            }
            if !idle.is_empty() {
                let mut map = self.srv_sessions.lock();
                for k in idle {
                    if map.get(&k).is_some_and(|s| s.is_idle(&self.cfg, now)) {
                        debug!(
                            session = format_args!("{:016x}", k.0),
                            peer = k.1.addr(),
                            "idle server session forgotten"
                        );
                        map.remove(&k);
                    }
                }
            }
            merge(Some(
                now + self.cfg.session_idle.min(Duration::from_secs(60)),
            ));
        }
        next
    }

    // ---- send path ----------------------------------------------------------

    fn take_send_buf(&self) -> Option<NetBuffer> {
        if let Some(b) = self.send_free.lock().pop() {
            return Some(b);
        }
        let n = self.send_count.fetch_add(1, Ordering::AcqRel);
        if n >= self.records.len() {
            self.send_count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        match self.register(BufVec::new(1, self.max_msg)) {
            Ok(mut b) => {
                b.set_tag(n as u64);
                b.set_callbacks(self.send_cbs.clone());
                Some(b)
            }
            Err(e) => {
                warn!(error = %e, "could not register a send buffer");
                self.send_count.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    fn put_send_buf(self: &Arc<Self>, b: NetBuffer) {
        if self.is_stopping() {
            return;
        }
        self.send_free.lock().push(b);
        if self.starved_n.load(Ordering::Acquire) > 0 {
            let o = {
                let mut q = self.starved.lock();
                let o = q.pop_front();
                self.starved_n.store(q.len(), Ordering::Release);
                o
            };
            if let Some(o) = o {
                self.flush_owner(&o, false);
            }
        }
    }

    fn add_starved(&self, o: OutRef) {
        let mut q = self.starved.lock();
        q.push_back(o);
        self.starved_n.store(q.len(), Ordering::Release);
    }

    /// Flushes the queue of `o`, taking its lock.
    pub(crate) fn flush_owner(self: &Arc<Self>, o: &OutRef, force: bool) {
        match o {
            OutRef::Client(s) => s.flush(self, force),
            OutRef::Server(s) => s.flush(self, force),
        }
    }

    /// Sends what `out` may send now: packs queued items into messages
    /// (up to the message size, one item per message without batching)
    /// while the session has fewer than `max_in_flight` messages out and a
    /// send buffer is free. Called with the owner's lock held. Returns the
    /// calls whose requests could not be sent, with the reason.
    pub(crate) fn flush(
        self: &Arc<Self>,
        owner: &OutRef,
        ep: &EndPoint,
        out: &mut Outbound,
        now: Instant,
    ) -> Vec<(u64, RpcError)> {
        let mut failed = Vec::new();
        if self.is_stopping() {
            failed.extend(out.drain().into_iter().map(|x| (x, RpcError::Shutdown)));
            return failed;
        }
        out.starved = false;
        while out.in_flight < self.cfg.max_in_flight {
            if !out.retry.is_empty() {
                if out.retry_at.is_some_and(|t| t > now) && !out.forced {
                    break;
                }
                let Some((buf, rec)) = out.retry.pop_front() else {
                    break;
                };
                self.send_msg(ep, out, buf, rec, &mut failed);
                continue;
            }
            if out.queue.is_empty() {
                break;
            }
            let delay = self.cfg.batch_delay;
            if !out.forced
                && !delay.is_zero()
                && self.cfg.batching
                && MSG_HEADER_SIZE + out.queued_bytes < self.max_msg
                && out.first_at.is_some_and(|t| now < t + delay)
            {
                break;
            }
            let Some(mut buf) = self.take_send_buf() else {
                out.starved = true;
                self.add_starved(owner.clone());
                break;
            };
            let mut xids = Xids::default();
            let mut n: usize = 0;
            let mut off = MSG_HEADER_SIZE;
            {
                let Some(seg) = buf.bufvec_mut().segments_mut().next() else {
                    break;
                };
                while let Some(it) = out.queue.front() {
                    let l = it.bytes.len();
                    if off + l > seg.len()
                        || (n > 0 && !self.cfg.batching)
                        || n == usize::from(u16::MAX)
                    {
                        break;
                    }
                    seg[off..off + l].copy_from_slice(&it.bytes);
                    off += l;
                    n += 1;
                    out.queued_bytes -= l;
                    if let Some(x) = out.queue.pop_front().and_then(|it| it.call_xid) {
                        xids.push(x);
                    }
                }
                if n == 0 {
                    // Cannot happen (items are checked against the message
                    // size when queued); never send an empty message.
                    if let Some(it) = out.queue.pop_front() {
                        out.queued_bytes -= it.bytes.len();
                        let e = RpcError::TooBig {
                            len: it.bytes.len(),
                            max: seg.len() - MSG_HEADER_SIZE,
                        };
                        failed.extend(it.call_xid.map(|x| (x, e)));
                    }
                    self.send_free.lock().push(buf);
                    continue;
                }
                wire::write_msg_header(seg, n as u16, off as u32);
            }
            out.first_at = (!out.queue.is_empty()).then_some(now);
            out.msgs += 1;
            out.items += n as u64;
            out.bytes += off as u64;
            bump(&self.stats.items_sent, n as u64);
            let rec = MsgRecord {
                owner: owner.clone(),
                xids,
                len: off,
            };
            self.send_msg(ep, out, buf, rec, &mut failed);
        }
        if out.queue.is_empty() && out.retry.is_empty() {
            out.forced = false;
        }
        if let Some(t) = out.deadline(self.cfg.batch_delay, self.cfg.max_in_flight) {
            self.arm(t);
        }
        failed
    }

    fn send_msg(
        self: &Arc<Self>,
        ep: &EndPoint,
        out: &mut Outbound,
        buf: NetBuffer,
        rec: MsgRecord,
        failed: &mut Vec<(u64, RpcError)>,
    ) {
        let tag = buf.tag() as usize;
        let len = rec.len;
        let Some(slot) = self.records.get(tag) else {
            warn!(tag, "send buffer with an unknown tag");
            return;
        };
        *slot.lock() = Some(rec);
        match self.tm.add_msg_send(buf, ep, len) {
            Ok(_) => {
                out.in_flight += 1;
                bump(&self.stats.msgs_sent, 1);
                bump(&self.stats.bytes_sent, len as u64);
            }
            Err(e) => {
                let rec = slot.lock().take();
                let err = RpcError::Net(e.error);
                bump(&self.stats.send_failures, 1);
                debug!(peer = ep.addr(), error = %err, "message send refused");
                if let Some(rec) = rec {
                    failed.extend(rec.xids.iter().map(|x| (x, err.clone())));
                }
                if out.send_error.is_none() {
                    out.send_error = Some(err);
                }
                self.send_free.lock().push(e.buffer);
            }
        }
    }

    fn on_send(self: &Arc<Self>, mut ev: BufferEvent) {
        let Some(buf) = ev.take_buffer() else {
            return;
        };
        let rec = self
            .records
            .get(buf.tag() as usize)
            .and_then(|r| r.lock().take());
        let Some(rec) = rec else {
            self.put_send_buf(buf);
            return;
        };
        match ev.status() {
            Ok(()) => {
                self.put_send_buf(buf);
                self.sent_done(rec, None);
            }
            Err(NetError::NoBuffers) if !self.is_stopping() => {
                bump(&self.stats.send_retries, 1);
                trace!("receiver had no free buffer: message sent again shortly");
                let owner = rec.owner.clone();
                let at = Instant::now() + RETRY_DELAY;
                match &owner {
                    OutRef::Client(s) => s.requeue(self, buf, rec, at),
                    OutRef::Server(s) => s.requeue(self, buf, rec, at),
                }
                self.arm(at);
            }
            Err(e) => {
                let e = e.clone();
                bump(&self.stats.send_failures, 1);
                self.put_send_buf(buf);
                self.sent_done(rec, Some(RpcError::Net(e)));
            }
        }
    }

    fn sent_done(self: &Arc<Self>, rec: MsgRecord, err: Option<RpcError>) {
        match &rec.owner {
            OutRef::Client(s) => s.sent_done(self, &rec.xids, err),
            OutRef::Server(s) => s.sent_done(self, err),
        }
    }

    // ---- receive path -------------------------------------------------------

    fn on_recv(self: &Arc<Self>, tm: &TmHandle, mut ev: BufferEvent) {
        let parsed = if ev.is_ok() && !self.is_stopping() {
            let (off, len) = (ev.offset(), ev.length());
            bump(&self.stats.msgs_received, 1);
            bump(&self.stats.bytes_received, len as u64);
            ev.with_data(|bv| parse_bufvec(bv, off, len)).ok()
        } else {
            if let Some(e) = ev.error().filter(|e| !e.is_cancelled()) {
                debug!(error = %e, "receive buffer failed");
            }
            None
        };
        let sender = ev.take_sender();
        if let Some(b) = ev.take_buffer().filter(|_| !self.is_stopping())
            && let Err(e) = tm.add_msg_recv(b, self.recv_params)
            && !self.is_stopping()
        {
            warn!(error = %e.error, "could not re-queue a receive buffer");
        }
        drop(ev);
        let (Some(items), Some(sender)) = (parsed, sender) else {
            return;
        };
        for p in items {
            match p {
                Parsed::Item {
                    header,
                    payload,
                    descs,
                } => {
                    bump(&self.stats.items_received, 1);
                    match header.kind {
                        ItemKind::Reply => self.on_reply(&header, payload),
                        ItemKind::Request | ItemKind::OneWay => {
                            self.on_request(&sender, header, payload, descs);
                        }
                    }
                }
                Parsed::BadItem(e) => {
                    bump(&self.stats.protocol_errors, 1);
                    debug!(peer = sender.addr(), error = %e.error, "malformed item");
                    if let Some((session, xid, opcode)) = e.request {
                        let header = ItemHeader {
                            kind: ItemKind::Request,
                            flags: 0,
                            opcode,
                            session,
                            xid,
                            status: 0,
                        };
                        if let Some(reply) = self.begin_request(&sender, &header) {
                            reply.error(STATUS_PROTOCOL);
                        }
                    }
                }
                Parsed::BadMsg(e) => {
                    bump(&self.stats.protocol_errors, 1);
                    debug!(peer = sender.addr(), error = %e, "malformed message dropped (no request to answer)");
                }
            }
        }
    }

    fn on_reply(self: &Arc<Self>, h: &ItemHeader, payload: Vec<u8>) {
        let s = self.sessions.read().get(&h.session).cloned();
        let Some(s) = s else {
            bump(&self.stats.unmatched_replies, 1);
            return;
        };
        s.on_reply(self, h, payload);
    }

    /// Finds or creates the server session of a request and checks its
    /// reply cache. Returns the reply handle when the request must be
    /// executed; `None` when it was answered (or dropped) as a duplicate.
    fn begin_request(self: &Arc<Self>, sender: &EndPoint, h: &ItemHeader) -> Option<ReplyHandle> {
        let key = (h.session, sender.clone());
        let srv = {
            let mut map = self.srv_sessions.lock();
            map.entry(key)
                .or_insert_with(|| SrvSession::new(h.session, sender.clone()))
                .clone()
        };
        srv.begin(self, h)
    }

    fn on_request(
        self: &Arc<Self>,
        sender: &EndPoint,
        h: ItemHeader,
        payload: Vec<u8>,
        descs: Vec<BulkDesc>,
    ) {
        let oneway = h.kind == ItemKind::OneWay;
        let reply = if oneway {
            bump(&self.stats.oneways, 1);
            ReplyHandle::oneway()
        } else {
            match self.begin_request(sender, &h) {
                Some(r) => r,
                None => return,
            }
        };
        let handler = self.handlers.read().get(&h.opcode).cloned();
        let Some(handler) = handler else {
            bump(&self.stats.unknown_opcodes, 1);
            debug!(
                opcode = h.opcode,
                peer = sender.addr(),
                "no handler for opcode"
            );
            reply.error(STATUS_UNKNOWN_OPCODE);
            return;
        };
        if !oneway {
            bump(&self.stats.requests, 1);
        }
        let req = Request::new(h, payload, descs, sender.clone());
        handler(req, reply);
    }
}

/// A shareable handle to an RPC machine: sessions, handlers, buffers and
/// statistics. Clone it freely; every clone refers to the same machine.
#[derive(Clone)]
pub struct RpcHandle {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl RpcHandle {
    /// The machine's own address (as its transfer machine started).
    pub fn addr(&self) -> &str {
        self.inner.addr.get().map_or("", String::as_str)
    }

    /// The underlying transfer machine.
    pub fn tm(&self) -> &TmHandle {
        &self.inner.tm
    }

    /// The effective configuration (`max_msg_size` clamped to the
    /// transport).
    pub fn config(&self) -> &RpcConfig {
        &self.inner.cfg
    }

    /// Largest payload a call or post without bulk descriptors can carry.
    pub fn max_payload(&self) -> usize {
        self.inner.max_item() - wire::ITEM_HEADER_SIZE
    }

    /// Opens a client session to the RPC machine at `peer`.
    ///
    /// # Errors
    /// `Shutdown` when the machine is stopping; the transport's refusal of
    /// the address.
    pub fn session(&self, peer: &str) -> Result<Session> {
        if self.inner.is_stopping() {
            return Err(RpcError::Shutdown);
        }
        let ep = self.inner.tm.ep_create(peer)?;
        Ok(Session::open(&self.inner, ep))
    }

    /// Registers `handler` for requests and one-way items with `opcode`,
    /// replacing any previous one.
    ///
    /// The handler runs on a transport thread, once per request, with the
    /// request and a [`ReplyHandle`]: it may reply at once, or keep the
    /// handle (or send it to another thread) and reply later. It should
    /// not block for long: other messages wait meanwhile.
    pub fn on(&self, opcode: u32, handler: impl Fn(Request, ReplyHandle) + Send + Sync + 'static) {
        self.inner
            .handlers
            .write()
            .insert(opcode, Arc::new(handler));
    }

    /// Registers a typed handler: the payload is decoded as `Q`, the
    /// handler's `Ok` value encoded as the reply, its `Err` code sent as
    /// the failure status. A payload that does not decode gets an
    /// `EINVAL` reply.
    pub fn on_typed<Q, R, F>(&self, opcode: u32, f: F)
    where
        Q: serde::de::DeserializeOwned,
        R: serde::Serialize,
        F: Fn(Q, &Request) -> std::result::Result<R, i32> + Send + Sync + 'static,
    {
        self.on(opcode, move |req, reply| match req.decode::<Q>() {
            Ok(q) => match f(q, &req) {
                Ok(r) => reply.ok_typed(&r),
                Err(code) => reply.error(code),
            },
            Err(_) => reply.error(crate::error::STATUS_INVALID),
        });
    }

    /// Removes the handler of `opcode`; true if there was one.
    pub fn remove_handler(&self, opcode: u32) -> bool {
        self.inner.handlers.write().remove(&opcode).is_some()
    }

    /// Registers memory with the machine's domain (for bulk transfers).
    ///
    /// # Errors
    /// `Shutdown`, or the domain's refusal (too big, empty).
    pub fn register(&self, bv: BufVec) -> Result<NetBuffer> {
        self.inner.register(bv)
    }

    /// Registers a zeroed buffer of `len` bytes in one segment.
    ///
    /// # Errors
    /// As [`RpcHandle::register`].
    pub fn alloc(&self, len: usize) -> Result<NetBuffer> {
        self.inner.register(BufVec::new(1, len.max(1)))
    }

    /// A snapshot of the machine's counters.
    pub fn stats(&self) -> RpcStats {
        self.inner.stats.snapshot()
    }

    /// True once shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.is_stopping()
    }
}

/// An RPC machine: one transfer machine of its own domain, with the
/// receive buffers, send buffers, sessions and handlers of the RPC layer.
///
/// Dereferences to [`RpcHandle`] for every operation; adds
/// [`shutdown`](RpcMachine::shutdown). Dropping a machine shuts it down.
pub struct RpcMachine {
    h: RpcHandle,
    tm: Option<TransferMachine>,
    timer: Option<JoinHandle<()>>,
}

impl fmt::Debug for RpcMachine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.h.inner.fmt(f)
    }
}

impl Deref for RpcMachine {
    type Target = RpcHandle;
    fn deref(&self) -> &RpcHandle {
        &self.h
    }
}

fn log_tm_event(tm: &TmHandle, ev: &TmEvent) {
    match &ev.kind {
        TmEventKind::Error(e) => debug!(tm = %tm.id(), error = %e, "transfer machine error"),
        TmEventKind::StateChange { state, status, .. } => {
            debug!(tm = %tm.id(), ?state, ok = status.is_ok(), "transfer machine state");
        }
        other => debug!(tm = %tm.id(), ?other, "transfer machine event"),
    }
}

impl RpcMachine {
    /// Creates a domain over `xprt` and starts a machine at `addr` in it.
    ///
    /// # Errors
    /// As [`RpcMachine::start`].
    pub fn start_on<T: Transport + ?Sized>(xprt: &T, addr: &str, cfg: RpcConfig) -> Result<Self> {
        Self::start(Domain::new(xprt)?, addr, cfg)
    }

    /// Starts a machine at `addr` (transport specific) in `dom`, which it
    /// owns until [`RpcMachine::shutdown`] hands it back.
    ///
    /// # Errors
    /// `InvalidArgument` for a configuration that cannot work; the
    /// transport's failure to start.
    pub fn start(dom: Domain, addr: &str, mut cfg: RpcConfig) -> Result<Self> {
        cfg.validate()?;
        let max_buf = dom.max_buffer_size();
        cfg.max_msg_size = cfg.max_msg_size.min(max_buf);
        cfg.recv_buffer_size = cfg.recv_buffer_size.min(max_buf).max(cfg.max_msg_size);
        cfg.validate()?;
        let tm = dom.tm_init(Arc::new(log_tm_event))?;
        if let Some(cpus) = &cfg.cpus {
            match tm.confine(cpus) {
                Ok(()) | Err(NetError::Unsupported { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (max_msg, recv_size, nrecv) =
            (cfg.max_msg_size, cfg.recv_buffer_size, cfg.recv_buffers);
        let inner = Inner::new_cyclic(cfg, tm.handle(), dom, max_msg, recv_size);
        let mut m = RpcMachine {
            h: RpcHandle { inner },
            tm: Some(tm),
            timer: None,
        };
        let started = m.start_tm(addr, nrecv, recv_size);
        if let Err(e) = started {
            let _ = m.stop_all();
            return Err(e);
        }
        let inner = Arc::clone(&m.h.inner);
        let t = std::thread::Builder::new()
            .name("colibri-rpc-timer".into())
            .spawn(move || inner.timer_loop())
            .map_err(NetError::from)?;
        m.timer = Some(t);
        debug!(addr = m.addr(), "RPC machine started");
        Ok(m)
    }

    fn start_tm(&self, addr: &str, nrecv: usize, recv_size: usize) -> Result<()> {
        let inner = &self.h.inner;
        for _ in 0..nrecv {
            let b = inner
                .register(BufVec::new(1, recv_size))?
                .with_callbacks(inner.recv_cbs.clone());
            inner.tm.add_msg_recv(b, inner.recv_params)?;
        }
        inner.tm.start(addr)?;
        inner.tm.wait_for_state(TmState::Started, TM_WAIT)?;
        let own = inner
            .tm
            .ep()
            .map(|e| e.addr().to_string())
            .unwrap_or_default();
        let _ = inner.addr.set(own);
        Ok(())
    }

    /// A shareable handle.
    pub fn handle(&self) -> RpcHandle {
        self.h.clone()
    }

    /// Stops the machine: calls still in flight fail with `Shutdown`,
    /// queued items are dropped, the transfer machine stops (every buffer
    /// comes back) and is finalised, and the domain is handed back with
    /// every buffer of the machine deregistered.
    ///
    /// # Errors
    /// `Busy`-like transport failures to stop in time; the machine is
    /// dropped regardless.
    pub fn shutdown(mut self) -> Result<Domain> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<Domain> {
        let inner = Arc::clone(&self.h.inner);
        inner.stopping.store(true, Ordering::Release);
        {
            let mut t = inner.timer.lock();
            t.stop = true;
        }
        inner.timer_cv.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        // Fail what is in flight and empty the queues.
        let sessions: Vec<Arc<SessionInner>> =
            inner.sessions.write().drain().map(|(_, s)| s).collect();
        for s in &sessions {
            s.shutdown();
        }
        let srv: Vec<Arc<SrvSession>> = inner.srv_sessions.lock().drain().map(|(_, s)| s).collect();
        for s in &srv {
            s.shutdown();
        }
        drop(srv);
        inner.starved.lock().clear();
        let mut result = Ok(());
        if let Some(tm) = self.tm.take() {
            if matches!(
                tm.state(),
                TmState::Started | TmState::Starting | TmState::Initialized
            ) && let Err(e) = tm.stop(true)
            {
                result = Err(RpcError::Net(e));
            }
            if let Err(e) = tm.wait_stopped(TM_WAIT) {
                result = Err(RpcError::Net(e));
            }
            inner.send_free.lock().clear();
            inner.handlers.write().clear();
            if let Err(e) = tm.fini() {
                debug!(error = %e.error, "transfer machine still referenced: finalised on drop");
                drop(e.object);
            }
        }
        inner.send_free.lock().clear();
        let dom = inner.dom.write().take();
        debug!(addr = self.addr(), "RPC machine shut down");
        result?;
        dom.ok_or(RpcError::Shutdown)
    }
}

impl Drop for RpcMachine {
    fn drop(&mut self) {
        if self.tm.is_some() || self.timer.is_some() {
            let _ = self.stop_all();
        }
    }
}
