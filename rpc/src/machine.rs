//! The RPC machine: one transfer machine, its receive buffers, the send
//! buffer pool and formation, message sequencing and acknowledgements,
//! the receive path, and the timer thread.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
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
use crate::error::{
    Result, RpcError, STATUS_BUSY, STATUS_SHUTDOWN, STATUS_UNKNOWN_OPCODE, check_may_block,
};
use crate::seq::{Inbound, Now, Offer, new_epoch};
use crate::server::{Handler, ReplyHandle, Request, SrvSession};
use crate::session::{Session, SessionInner};
use crate::stats::{Counters, RpcStats, bump};
use crate::wire::{self, BulkDesc, ItemError, ItemHeader, MSG_HEADER_SIZE, MsgHeader, WireError};
use crate::workers::{BoxFuture, HandlerPool};
use colibri_net::fasthash::FastMap;

/// First delay before a message refused by the receiver (no free receive
/// buffer, or a broken connection) is sent again; it doubles with each
/// refusal, up to [`RETRY_DELAY_MAX`].
const RETRY_DELAY: Duration = Duration::from_millis(1);
/// Longest delay between two sends of a refused message.
const RETRY_DELAY_MAX: Duration = Duration::from_millis(16);
/// How long a receiver waits for a message of its own to carry an
/// acknowledgement before it sends one by itself.
pub(crate) const ACK_DELAY: Duration = Duration::from_millis(10);
/// How long start and stop wait for the transfer machine.
const TM_WAIT: Duration = Duration::from_secs(30);
/// How long a shutdown lets messages already handed to the transport (a
/// reply sent just before) leave before it aborts them.
const SEND_GRACE: Duration = Duration::from_secs(2);

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

impl OutRef {
    fn session(&self) -> u64 {
        match self {
            Self::Client(s) => s.id,
            Self::Server(s) => s.id,
        }
    }

    fn replies(&self) -> bool {
        matches!(self, Self::Server(_))
    }
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

/// What a send buffer carries.
pub(crate) enum RecKind {
    /// A sequenced message: when it was first refused, and how often.
    Data {
        first_fail: Option<Instant>,
        tries: u32,
    },
    /// An acknowledgement or probe.
    Ack,
}

/// A message in flight: where it came from and its header.
pub(crate) struct MsgRecord {
    pub(crate) owner: OutRef,
    pub(crate) kind: RecKind,
    pub(crate) hdr: MsgHeader,
}

/// A message sent and not yet acknowledged by the receiver: what to fail
/// if it turns out lost.
struct Unacked {
    seq: u64,
    xids: Xids,
    posts: u32,
}

/// Send buffers to give back to the pool once the session lock is
/// released (usually one: kept inline, no allocation).
#[derive(Default)]
pub(crate) struct Freed {
    one: Option<NetBuffer>,
    more: Vec<NetBuffer>,
}

impl Freed {
    pub(crate) fn push(&mut self, b: NetBuffer) {
        if self.one.is_none() {
            self.one = Some(b);
        } else {
            self.more.push(b);
        }
    }

    fn is_empty(&self) -> bool {
        self.one.is_none()
    }

    fn into_iter(self) -> impl Iterator<Item = NetBuffer> {
        self.one.into_iter().chain(self.more)
    }
}

impl Extend<NetBuffer> for Freed {
    fn extend<I: IntoIterator<Item = NetBuffer>>(&mut self, it: I) {
        for b in it {
            self.push(b);
        }
    }
}

/// What a send completion (or an acknowledgement) left for the owner of
/// the queue to do once its lock is released.
#[derive(Default)]
pub(crate) struct SendOutcome {
    /// Send buffers to give back to the pool.
    pub(crate) free: Freed,
    /// Calls to fail.
    pub(crate) failed: Vec<(u64, RpcError)>,
    /// The failure that made the session restart its sequence.
    pub(crate) reset: Option<RpcError>,
    /// The failure says the peer is gone.
    pub(crate) peer_gone: bool,
}

/// The send side of one session and direction: items waiting to be packed
/// into messages, messages in flight, and the message sequence (epoch,
/// next sequence number, messages not yet acknowledged by the receiver).
pub(crate) struct Outbound {
    queue: VecDeque<QItem>,
    queued_bytes: usize,
    first_at: Option<Instant>,
    /// Messages of the current epoch handed to the transport and not yet
    /// completed.
    pub(crate) in_flight: usize,
    /// Messages of earlier epochs not yet completed.
    stale_in_flight: usize,
    /// Messages refused by the receiver, to be sent again (sequence
    /// order).
    retry: Vec<(NetBuffer, MsgRecord)>,
    retry_at: Option<Instant>,
    starved: bool,
    /// Send what is queued without waiting for the batch delay.
    pub(crate) forced: bool,
    /// The first send failure since it was last taken.
    pub(crate) send_error: Option<RpcError>,
    epoch: u64,
    next_seq: u64,
    /// Highest sequence number the receiver acknowledged.
    acked: u64,
    unacked: VecDeque<Unacked>,
    /// Since when the window has been full with no acknowledgement.
    stalled_since: Option<Instant>,
    /// When the last message or acknowledgement left.
    pub(crate) last_tx: Instant,
    /// Never sends a message again (a session refused by a full server).
    transient: bool,
    pub(crate) msgs: u64,
    pub(crate) items: u64,
    pub(crate) bytes: u64,
}

impl Default for Outbound {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            queued_bytes: 0,
            first_at: None,
            in_flight: 0,
            stale_in_flight: 0,
            retry: Vec::new(),
            retry_at: None,
            starved: false,
            forced: false,
            send_error: None,
            epoch: new_epoch(),
            next_seq: 1,
            acked: 0,
            unacked: VecDeque::new(),
            stalled_since: None,
            last_tx: Instant::now(),
            transient: false,
            msgs: 0,
            items: 0,
            bytes: 0,
        }
    }
}

fn retryable(e: &NetError) -> bool {
    matches!(e, NetError::NoBuffers | NetError::ConnectionReset(_))
}

impl Outbound {
    /// A queue that sends its messages once, never again (refusals).
    pub(crate) fn transient() -> Self {
        Self {
            transient: true,
            ..Self::default()
        }
    }

    /// True for a queue that never sends a message again.
    pub(crate) fn is_transient(&self) -> bool {
        self.transient
    }

    pub(crate) fn push(&mut self, item: QItem, now: Instant) {
        self.queued_bytes += item.bytes.len();
        if self.queue.is_empty() {
            self.first_at = Some(now);
        }
        self.queue.push_back(item);
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
        self.queue.is_empty()
            && self.retry.is_empty()
            && self.in_flight == 0
            && self.stale_in_flight == 0
    }

    /// Takes the queued (not yet packed) items of call `xid` out of the
    /// queue: a cancelled call's request that has not left is never sent.
    /// Items are numbered only once packed into a message, so this leaves
    /// the sequence untouched.
    pub(crate) fn withdraw(&mut self, xid: u64) {
        let before = self.queue.len();
        let mut freed = 0;
        self.queue.retain(|q| {
            let keep = q.call_xid != Some(xid);
            if !keep {
                freed += q.bytes.len();
            }
            keep
        });
        if self.queue.len() != before {
            self.queued_bytes -= freed;
            if self.queue.is_empty() {
                self.first_at = None;
            }
        }
    }

    /// Empties the queue (shutdown, peer gone): returns the xids of the
    /// calls whose requests were waiting, and the buffers of the messages
    /// waiting to be sent again.
    pub(crate) fn drain(&mut self, free: &mut Freed) -> Vec<u64> {
        let xids: Vec<u64> = self.queue.drain(..).filter_map(|q| q.call_xid).collect();
        free.extend(self.retry.drain(..).map(|(b, _)| b));
        self.queued_bytes = 0;
        self.first_at = None;
        self.retry_at = None;
        xids
    }

    /// Forgets every message in flight (shutdown: the transfer machine
    /// stops and completes them; nothing waits for them).
    pub(crate) fn forget_in_flight(&mut self) {
        self.in_flight = 0;
        self.stale_in_flight = 0;
        self.unacked.clear();
    }

    /// When the timer must look at this queue again: the end of the batch
    /// delay, or the time to resend a refused message. `None` when only a
    /// send completion or an acknowledgement can make progress (the
    /// session is at its limit of messages in flight, waits for a send
    /// buffer, or its window is full), or when there is nothing to send;
    /// with no batch delay, queued items leave from the completions, never
    /// from the timer.
    pub(crate) fn deadline(&self, cfg: &RpcConfig) -> Option<Instant> {
        if self.starved || self.in_flight >= cfg.max_in_flight {
            return None;
        }
        if let Some(t) = self.retry_at.filter(|_| !self.retry.is_empty()) {
            return Some(t);
        }
        if self.queue.is_empty()
            || cfg.batch_delay.is_zero()
            || self.forced
            || self.unacked.len() >= cfg.window
        {
            return None;
        }
        self.first_at.map(|t| t + cfg.batch_delay)
    }

    /// When a full window with no acknowledgement makes the session give
    /// up its sequence.
    pub(crate) fn stall_deadline(&self, cfg: &RpcConfig) -> Option<Instant> {
        self.stalled_since.map(|t| t + cfg.gap_timeout * 2)
    }

    /// Starts a new sequence after message `failed_seq` failed for good
    /// with `err`: the calls of every message not acknowledged fail (with
    /// `err` for that message, `SessionReset` for the others, which the
    /// receiver may or may not have handled); messages waiting to be sent
    /// again are dropped. Returns the one-way items lost.
    fn reset(&mut self, failed_seq: u64, err: &RpcError, o: &mut SendOutcome) -> u64 {
        let others = RpcError::SessionReset(err.to_string());
        let mut lost = 0;
        for u in self.unacked.drain(..) {
            let e = if u.seq == failed_seq { err } else { &others };
            o.failed.extend(u.xids.iter().map(|x| (x, e.clone())));
            lost += u64::from(u.posts);
        }
        o.free.extend(self.retry.drain(..).map(|(b, _)| b));
        self.retry_at = None;
        self.stale_in_flight += self.in_flight;
        self.in_flight = 0;
        self.epoch = new_epoch();
        self.next_seq = 1;
        self.acked = 0;
        self.stalled_since = None;
        if self.send_error.is_none() {
            self.send_error = Some(err.clone());
        }
        o.reset = Some(err.clone());
        lost
    }

    /// Restarts the sequence because the peer is gone (`e`): as
    /// [`Outbound::reset`] for every message not acknowledged.
    pub(crate) fn restart(&mut self, e: &RpcError, o: &mut SendOutcome) -> u64 {
        self.reset(0, e, o)
    }

    /// Gives the sequence up because the window stayed full with no
    /// acknowledgement (the receiver lost its state, or is stuck).
    pub(crate) fn give_up_stalled(&mut self, o: &mut SendOutcome) -> u64 {
        let err = RpcError::SessionReset(
            "the receiver acknowledged nothing while the window was full".into(),
        );
        self.reset(0, &err, o)
    }

    /// The receiver acknowledged every message of `epoch` up to `seq`.
    /// Returns the one-way items of messages it gave up waiting for
    /// (acknowledged while we still had them to send again).
    pub(crate) fn on_ack(&mut self, epoch: u64, seq: u64, o: &mut SendOutcome) -> u64 {
        let seq = seq.min(self.next_seq - 1);
        if epoch != self.epoch || seq <= self.acked {
            return 0;
        }
        self.acked = seq;
        self.stalled_since = None;
        // Messages acknowledged while waiting to be sent again: the
        // receiver gave up waiting for them.
        let mut skipped = Vec::new();
        let mut i = 0;
        while i < self.retry.len() {
            if self.retry[i].1.hdr.seq <= seq {
                let (b, r) = self.retry.remove(i);
                skipped.push(r.hdr.seq);
                o.free.push(b);
            } else {
                i += 1;
            }
        }
        let mut lost = 0;
        while self.unacked.front().is_some_and(|u| u.seq <= seq) {
            let Some(u) = self.unacked.pop_front() else {
                break;
            };
            if skipped.contains(&u.seq) {
                let e =
                    RpcError::SessionReset("the receiver gave up waiting for the message".into());
                o.failed.extend(u.xids.iter().map(|x| (x, e.clone())));
                lost += u64::from(u.posts);
            }
        }
        lost
    }

    /// A send completion of a sequenced message. Puts a refused message
    /// back to be sent again (same epoch and sequence number) for up to
    /// `retry_for` after its first refusal (`None`: never, the machine is
    /// stopping), else the sequence restarts.
    fn completed(
        &mut self,
        buf: NetBuffer,
        mut rec: MsgRecord,
        status: std::result::Result<(), &NetError>,
        retry_for: Option<Duration>,
        now: &mut Now,
        o: &mut SendOutcome,
    ) -> (u64, Option<Instant>) {
        if rec.hdr.epoch != self.epoch {
            // Its sequence was given up: its calls already failed.
            self.stale_in_flight = self.stale_in_flight.saturating_sub(1);
            o.free.push(buf);
            return (0, None);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        let e = match status {
            Ok(()) => {
                o.free.push(buf);
                return (0, None);
            }
            Err(e) => e,
        };
        let Some(retry_for) = retry_for.filter(|_| !self.transient) else {
            o.free.push(buf);
            return (0, None);
        };
        if rec.hdr.seq <= self.acked {
            // Acknowledged meanwhile: the receiver has it, or gave up on
            // it.
            o.free.push(buf);
            return (0, None);
        }
        let RecKind::Data { first_fail, tries } = &mut rec.kind else {
            o.free.push(buf);
            return (0, None);
        };
        let now = now.get();
        let first = *first_fail.get_or_insert(now);
        if retryable(e) && now < first + retry_for {
            let shift = (*tries).min(4);
            *tries += 1;
            let at = now + (RETRY_DELAY * (1 << shift)).min(RETRY_DELAY_MAX);
            let pos = self.retry.partition_point(|(_, r)| r.hdr.seq < rec.hdr.seq);
            self.retry.insert(pos, (buf, rec));
            self.retry_at = Some(at);
            return (0, Some(at));
        }
        let err = RpcError::Net(e.clone());
        o.peer_gone = err.peer_gone();
        o.free.push(buf);
        (self.reset(rec.hdr.seq, &err, o), None)
    }
}

/// Both directions of one session at one end: what we send, and the
/// reorder window of what we receive (with its acknowledgements).
#[derive(Default)]
pub(crate) struct Link {
    pub(crate) out: Outbound,
    pub(crate) inb: Inbound<RxMsg>,
}

impl Link {
    /// Applies the acknowledgement a received message carries.
    pub(crate) fn on_ack(&mut self, m: &Inner, h: &MsgHeader, o: &mut SendOutcome) {
        if let Some((e, s)) = h.ack {
            let lost = self.out.on_ack(e, s, o);
            bump(&m.stats.items_lost, lost);
        }
    }

    /// Offers a received message to the reorder window, counting what
    /// became of it.
    pub(crate) fn offer(&mut self, m: &Inner, h: &MsgHeader, items: RxMsg, now: &mut Now) {
        let (o, dropped) = self.inb.offer(h.epoch, h.seq, h.low, h.ack_now, items, now);
        bump(&m.stats.msgs_discarded, dropped as u64);
        match o {
            Offer::Ready => {}
            Offer::Held => {
                bump(&m.stats.msgs_held, 1);
                if let Some(t) = self.inb.gap_deadline(m.cfg.gap_timeout) {
                    m.arm(t);
                }
            }
            Offer::Duplicate => bump(&m.stats.msgs_duplicate, 1),
            Offer::Stale | Offer::OutOfWindow => {
                trace!(?o, seq = h.seq, "message dropped");
                bump(&m.stats.msgs_discarded, 1);
            }
        }
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
    /// The handler pool, started by the first handler that needs it.
    pool: OnceLock<HandlerPool>,
    /// Serialises the pool's start.
    pool_start: Mutex<()>,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcMachine")
            .field("addr", &self.addr.get())
            .field("tm", &self.tm.id())
            .finish_non_exhaustive()
    }
}

/// One decoded item of a received message, copied out of the receive
/// buffer.
pub(crate) enum Parsed {
    Item {
        header: ItemHeader,
        payload: Vec<u8>,
        descs: Vec<BulkDesc>,
    },
    BadItem(ItemError),
}

/// The items of one received message.
pub(crate) type RxMsg = Vec<Parsed>;

fn parse_into(bytes: &[u8]) -> std::result::Result<(MsgHeader, RxMsg), WireError> {
    let r = wire::MsgReader::new(bytes)?;
    let h = *r.header();
    let items = r
        .map(|it| match it {
            Ok(i) => Parsed::Item {
                header: i.header,
                payload: i.payload.to_vec(),
                descs: i.descs,
            },
            Err(e) => Parsed::BadItem(e),
        })
        .collect();
    Ok((h, items))
}

fn parse_bufvec(
    bv: &BufVec,
    off: usize,
    len: usize,
) -> std::result::Result<(MsgHeader, RxMsg), WireError> {
    // Receive buffers are one segment: read the message in place.
    if let Some(seg) = bv.segments().next().filter(|s| off + len <= s.len()) {
        parse_into(&seg[off..off + len])
    } else {
        match bv.to_vec(off, len) {
            Ok(v) => parse_into(&v),
            Err(_) => Err(WireError::Truncated("message outside its buffer")),
        }
    }
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
                pool: OnceLock::new(),
                pool_start: Mutex::new(()),
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

    /// Expires calls, resends, flushes delayed batches and retries, sends
    /// delayed acknowledgements and probes, gives up on gaps, and forgets
    /// idle server sessions. Returns when to come back.
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

    /// Gives send buffers back to the pool and lets a starved queue use
    /// them. Called with no session lock held.
    pub(crate) fn put_send_bufs(self: &Arc<Self>, bufs: Freed) {
        if bufs.is_empty() || self.is_stopping() {
            return;
        }
        let n = 1 + bufs.more.len();
        self.send_free.lock().extend(bufs.into_iter());
        for _ in 0..n {
            if self.starved_n.load(Ordering::Acquire) == 0 {
                break;
            }
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

    fn write_header(buf: &mut NetBuffer, h: &MsgHeader) -> bool {
        match buf.bufvec_mut().segments_mut().next() {
            Some(seg) if seg.len() >= MSG_HEADER_SIZE => {
                h.write(seg);
                true
            }
            _ => false,
        }
    }

    /// Sends what `link` may send now: messages refused earlier first,
    /// then queued items packed into new messages (up to the message size,
    /// one item per message without batching), while the session has
    /// fewer than `max_in_flight` messages out, fewer than `window`
    /// messages not acknowledged, and a send buffer is free. Every message
    /// carries the acknowledgement of what `link` received. Called with
    /// the owner's lock held. Returns the calls whose requests could not
    /// be sent, with the reason.
    pub(crate) fn flush(
        self: &Arc<Self>,
        owner: &OutRef,
        ep: &EndPoint,
        link: &mut Link,
        now: Instant,
    ) -> Vec<(u64, RpcError)> {
        let mut o = SendOutcome::default();
        let (out, ack) = (&mut link.out, &mut link.inb.ack);
        if self.is_stopping() {
            let xids = out.drain(&mut o.free);
            o.failed
                .extend(xids.into_iter().map(|x| (x, RpcError::Shutdown)));
            self.send_free
                .lock()
                .extend(std::mem::take(&mut o.free).into_iter());
            return o.failed;
        }
        out.starved = false;
        let window = self.cfg.window;
        while out.in_flight < self.cfg.max_in_flight {
            if !out.retry.is_empty() {
                if out.retry_at.is_some_and(|t| t > now) && !out.forced {
                    break;
                }
                let (mut buf, mut rec) = out.retry.remove(0);
                // Same epoch and sequence number; fresh acknowledgements.
                rec.hdr.low = out.acked + 1;
                rec.hdr.ack = ack.current();
                if Self::write_header(&mut buf, &rec.hdr) && rec.hdr.ack.is_some() {
                    ack.sent();
                }
                bump(&self.stats.send_retries, 1);
                self.send_msg(ep, out, buf, rec, now, &mut o);
                continue;
            }
            if out.queue.is_empty() {
                break;
            }
            if out.unacked.len() >= window {
                out.stalled_since.get_or_insert(now);
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
            let mut posts = 0u32;
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
                    match out.queue.pop_front().and_then(|it| it.call_xid) {
                        Some(x) => xids.push(x),
                        None => posts += 1,
                    }
                }
            }
            if n == 0 {
                // Cannot happen (items are checked against the message
                // size when queued); never send an empty message.
                if let Some(it) = out.queue.pop_front() {
                    out.queued_bytes -= it.bytes.len();
                    let e = RpcError::TooBig {
                        len: it.bytes.len(),
                        max: self.max_item(),
                    };
                    o.failed.extend(it.call_xid.map(|x| (x, e)));
                }
                self.send_free.lock().push(buf);
                continue;
            }
            let seq = out.next_seq;
            out.next_seq += 1;
            out.unacked.push_back(Unacked { seq, xids, posts });
            let k = out.unacked.len();
            let hdr = MsgHeader {
                replies: owner.replies(),
                ack_only: false,
                ack_now: k == window || k == (window / 2).max(1),
                items: n as u16,
                len: off as u32,
                session: owner.session(),
                epoch: out.epoch,
                seq,
                low: out.acked + 1,
                ack: ack.current(),
            };
            if Self::write_header(&mut buf, &hdr) && hdr.ack.is_some() {
                ack.sent();
            }
            out.first_at = (!out.queue.is_empty()).then_some(now);
            out.msgs += 1;
            out.items += n as u64;
            out.bytes += off as u64;
            bump(&self.stats.items_sent, n as u64);
            let rec = MsgRecord {
                owner: owner.clone(),
                kind: RecKind::Data {
                    first_fail: None,
                    tries: 0,
                },
                hdr,
            };
            self.send_msg(ep, out, buf, rec, now, &mut o);
        }
        if out.queue.is_empty() && out.retry.is_empty() {
            out.forced = false;
        }
        if let Some(t) = out.deadline(&self.cfg) {
            self.arm(t);
        }
        if let Some(t) = out.stall_deadline(&self.cfg) {
            self.arm(t);
        }
        if !o.free.is_empty() {
            self.send_free
                .lock()
                .extend(std::mem::take(&mut o.free).into_iter());
        }
        o.failed
    }

    fn send_msg(
        self: &Arc<Self>,
        ep: &EndPoint,
        out: &mut Outbound,
        buf: NetBuffer,
        rec: MsgRecord,
        now: Instant,
        o: &mut SendOutcome,
    ) {
        let tag = buf.tag() as usize;
        let len = rec.hdr.len as usize;
        let seq = rec.hdr.seq;
        let Some(slot) = self.records.get(tag) else {
            warn!(tag, "send buffer with an unknown tag");
            return;
        };
        *slot.lock() = Some(rec);
        match self.tm.add_msg_send(buf, ep, len) {
            Ok(_) => {
                out.in_flight += 1;
                out.last_tx = now;
                bump(&self.stats.msgs_sent, 1);
                bump(&self.stats.bytes_sent, len as u64);
            }
            Err(e) => {
                slot.lock().take();
                let err = RpcError::Net(e.error);
                bump(&self.stats.send_failures, 1);
                debug!(peer = ep.addr(), error = %err, "message send refused");
                o.free.push(e.buffer);
                // The sequence number is spent: start a new sequence.
                let lost = out.reset(seq, &err, o);
                bump(&self.stats.items_lost, lost);
                bump(&self.stats.seq_resets, 1);
            }
        }
    }

    /// Sends an acknowledgement of what `link` received, or a probe when
    /// there is nothing to acknowledge. Called with the owner's lock held.
    /// False when no send buffer was free or the transport refused it.
    pub(crate) fn send_ack(
        self: &Arc<Self>,
        owner: &OutRef,
        ep: &EndPoint,
        link: &mut Link,
        now: Instant,
    ) -> bool {
        if self.is_stopping() || link.out.transient && link.inb.ack.current().is_none() {
            return false;
        }
        let Some(mut buf) = self.take_send_buf() else {
            return false;
        };
        let hdr = MsgHeader {
            replies: owner.replies(),
            ack_only: true,
            len: MSG_HEADER_SIZE as u32,
            session: owner.session(),
            epoch: link.out.epoch,
            ack: link.inb.ack.current(),
            ..MsgHeader::default()
        };
        if !Self::write_header(&mut buf, &hdr) {
            self.send_free.lock().push(buf);
            return false;
        }
        let Some(slot) = self.records.get(buf.tag() as usize) else {
            return false;
        };
        *slot.lock() = Some(MsgRecord {
            owner: owner.clone(),
            kind: RecKind::Ack,
            hdr,
        });
        match self.tm.add_msg_send(buf, ep, MSG_HEADER_SIZE) {
            Ok(_) => {
                link.inb.ack.sent();
                link.out.last_tx = now;
                bump(&self.stats.acks_sent, 1);
                true
            }
            Err(e) => {
                slot.lock().take();
                debug!(peer = ep.addr(), error = %e.error, "acknowledgement refused");
                self.send_free.lock().push(e.buffer);
                false
            }
        }
    }

    /// After messages of `link` were handed out: acknowledge now when the
    /// sender asked, else let a message of ours carry the acknowledgement,
    /// or send one by itself after [`ACK_DELAY`]. Called with the owner's
    /// lock held.
    pub(crate) fn ack_after_dispatch(
        self: &Arc<Self>,
        owner: &OutRef,
        ep: &EndPoint,
        link: &mut Link,
        now: &mut Now,
    ) -> Vec<(u64, RpcError)> {
        let mut failed = Vec::new();
        if !link.inb.ack.pending() {
            return failed;
        }
        if link.inb.ack.urgent() {
            let now = now.get();
            if link.out.has_work() {
                failed = self.flush(owner, ep, link, now);
            }
            if link.inb.ack.pending() && !self.send_ack(owner, ep, link, now) {
                link.inb.ack.due = Some(now + ACK_DELAY);
                self.arm(now + ACK_DELAY);
            }
            return failed;
        }
        // Queued items will leave soon and carry it.
        if !link.out.has_work() && link.inb.ack.due.is_none() {
            let at = now.get() + ACK_DELAY;
            link.inb.ack.due = Some(at);
            self.arm(at);
        }
        failed
    }

    /// The timer's part for `link`: a delayed acknowledgement that is due,
    /// a gap given up on (true when messages became ready), a stalled
    /// window given up on. Returns when to come back.
    pub(crate) fn link_timer(
        self: &Arc<Self>,
        owner: &OutRef,
        ep: &EndPoint,
        link: &mut Link,
        now: Instant,
        o: &mut SendOutcome,
    ) -> (Option<Instant>, bool) {
        let mut next = None;
        let mut merge = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        if let Some(due) = link.inb.ack.due {
            if !link.inb.ack.pending() {
                link.inb.ack.due = None;
            } else if due <= now && !self.send_ack(owner, ep, link, now) {
                link.inb.ack.due = Some(now + ACK_DELAY);
            }
            merge(link.inb.ack.due);
        }
        let mut ready = false;
        if let Some(t) = link.inb.gap_deadline(self.cfg.gap_timeout) {
            if t <= now {
                let skipped = link.inb.skip_gap(now);
                bump(&self.stats.msgs_skipped, skipped);
                debug!(
                    session = format_args!("{:016x}", owner.session()),
                    skipped, "gave up waiting for missing messages"
                );
                ready = link.inb.has_ready();
            }
            merge(link.inb.gap_deadline(self.cfg.gap_timeout));
        }
        if let Some(t) = link.out.stall_deadline(&self.cfg) {
            if t <= now {
                debug!(
                    session = format_args!("{:016x}", owner.session()),
                    "window full with no acknowledgement: sequence restarted"
                );
                let lost = link.out.give_up_stalled(o);
                bump(&self.stats.items_lost, lost);
                bump(&self.stats.seq_resets, 1);
                let failed = self.flush(owner, ep, link, now);
                o.failed.extend(failed);
            } else {
                merge(Some(t));
            }
        }
        (next, ready)
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
            let mut f = Freed::default();
            f.push(buf);
            self.put_send_bufs(f);
            return;
        };
        let status = ev.status().as_ref().map(|_| ());
        if let Err(e) = status {
            if !e.is_cancelled() {
                bump(&self.stats.send_failures, 1);
            }
            if matches!(e, NetError::NoBuffers) {
                trace!("receiver had no free buffer");
            }
        }
        let owner = rec.owner.clone();
        match rec.kind {
            RecKind::Ack => {
                let mut f = Freed::default();
                f.push(buf);
                self.put_send_bufs(f);
                if let Err(e) = status
                    && !self.is_stopping()
                {
                    match &owner {
                        OutRef::Client(s) => s.ack_failed(self, e),
                        OutRef::Server(s) => s.ack_failed(self, e),
                    }
                }
            }
            RecKind::Data { .. } => match &owner {
                OutRef::Client(s) => s.sent_done(self, buf, rec, status),
                OutRef::Server(s) => s.sent_done(self, buf, rec, status),
            },
        }
    }

    /// The common part of a data message's completion, under the owner's
    /// lock.
    pub(crate) fn completed(
        self: &Arc<Self>,
        link: &mut Link,
        buf: NetBuffer,
        rec: MsgRecord,
        status: std::result::Result<(), &NetError>,
        now: &mut Now,
        o: &mut SendOutcome,
    ) {
        let carried_ack = rec.hdr.ack.is_some();
        let retry_for = (!self.is_stopping()).then_some(self.cfg.msg_retry_time);
        let (lost, retry_at) = link.out.completed(buf, rec, status, retry_for, now, o);
        bump(&self.stats.items_lost, lost);
        if let Some(at) = retry_at {
            self.arm(at);
        }
        if let Some(e) = &o.reset {
            bump(&self.stats.seq_resets, 1);
            debug!(error = %e, "message failed for good: sequence restarted");
        }
        if status.is_err() && carried_ack && retry_at.is_none() {
            // Its acknowledgement did not arrive: send it again.
            link.inb.ack.lost();
            if link.inb.ack.pending() && link.inb.ack.due.is_none() {
                let at = now.get() + ACK_DELAY;
                link.inb.ack.due = Some(at);
                self.arm(at);
            }
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
        // A cancelled buffer belongs to a machine that is stopping or whose
        // start failed: it is not re-queued (the add would be refused).
        let cancelled = ev.error().is_some_and(NetError::is_cancelled);
        if let Some(b) = ev
            .take_buffer()
            .filter(|_| !cancelled && !self.is_stopping())
            && let Err(e) = tm.add_msg_recv(b, self.recv_params)
            && !self.is_stopping()
        {
            match e.error {
                NetError::WrongState { .. } => {
                    debug!(error = %e.error, "receive buffer not re-queued: the machine is not running");
                }
                _ => warn!(error = %e.error, "could not re-queue a receive buffer"),
            }
        }
        drop(ev);
        let (Some(parsed), Some(sender)) = (parsed, sender) else {
            return;
        };
        match parsed {
            Ok((h, items)) => self.route(&sender, &h, items),
            Err(e) => {
                bump(&self.stats.protocol_errors, 1);
                debug!(peer = sender.addr(), error = %e, "malformed message dropped (no request to answer)");
            }
        }
    }

    /// The handler pool, started on first use.
    fn pool(&self) -> Result<&HandlerPool> {
        if self.is_stopping() {
            return Err(RpcError::Shutdown);
        }
        if let Some(p) = self.pool.get() {
            return Ok(p);
        }
        let _one = self.pool_start.lock();
        if let Some(p) = self.pool.get() {
            return Ok(p);
        }
        let p = HandlerPool::start(
            self.cfg.handler_threads,
            self.cfg.handler_queue,
            "colibri-rpc-handler",
        )?;
        Ok(self.pool.get_or_init(|| p))
    }

    /// Runs `job` on the handler pool, or answers `reply` at once: `Busy`
    /// when the pool admitted `handler_queue` requests already,
    /// `Shutdown` when the machine is stopping.
    fn run_on_pool(
        m: &Weak<Self>,
        req: Request,
        reply: ReplyHandle,
        job: impl FnOnce(Request, ReplyHandle) + Send + 'static,
    ) {
        let Some(inner) = m.upgrade().filter(|m| !m.is_stopping()) else {
            reply.error(STATUS_SHUTDOWN);
            return;
        };
        let Some(pool) = inner.pool.get() else {
            reply.error(STATUS_SHUTDOWN);
            return;
        };
        let Some(adm) = pool.admit() else {
            bump(&inner.stats.handler_busy, 1);
            reply.error(STATUS_BUSY);
            return;
        };
        // A pool closed meanwhile drops the job: its reply handle answers
        // NoReply.
        let m = m.clone();
        let _ = pool.submit(adm, move || {
            let run = std::panic::AssertUnwindSafe(move || job(req, reply));
            if std::panic::catch_unwind(run).is_err() {
                if let Some(m) = m.upgrade() {
                    bump(&m.stats.handler_panics, 1);
                }
                warn!("a request handler panicked on the handler pool: answered NoReply");
            }
        });
    }

    /// Gives a request or one-way item to the handler of its opcode
    /// (unknown opcodes are answered `ENOSYS`).
    pub(crate) fn run_handler(&self, req: Request, reply: ReplyHandle) {
        let handler = self.handlers.read().get(&req.opcode()).cloned();
        let Some(handler) = handler else {
            bump(&self.stats.unknown_opcodes, 1);
            debug!(
                opcode = req.opcode(),
                peer = req.sender().addr(),
                "no handler for opcode"
            );
            reply.error(STATUS_UNKNOWN_OPCODE);
            return;
        };
        if !req.is_oneway() {
            bump(&self.stats.requests, 1);
        }
        handler(req, reply);
    }

    /// Hands a received message to the session it belongs to: replies to
    /// a client session, requests and one-way items to a server session
    /// (made on first use, unless the machine already has
    /// `max_sessions`).
    fn route(self: &Arc<Self>, sender: &EndPoint, h: &MsgHeader, items: RxMsg) {
        if h.replies {
            let s = self.sessions.read().get(&h.session).cloned();
            match s {
                Some(s) => s.receive(self, h, items),
                None if h.ack_only => {}
                None => {
                    bump(&self.stats.unmatched_replies, u64::from(h.items));
                }
            }
            return;
        }
        let key = (h.session, sender.clone());
        let srv = {
            let mut map = self.srv_sessions.lock();
            match map.get(&key) {
                Some(s) => Some(Arc::clone(s)),
                None if h.ack_only => None,
                None if map.len() >= self.cfg.max_sessions => None,
                None => {
                    let s = SrvSession::new(h.session, sender.clone());
                    map.insert(key, Arc::clone(&s));
                    // The timer forgets idle sessions: make sure it knows.
                    self.arm(Instant::now() + self.cfg.session_idle.min(Duration::from_secs(60)));
                    Some(s)
                }
            }
        };
        match srv {
            Some(s) => s.receive(self, h, items),
            None if h.ack_only => {}
            None => SrvSession::refuse(self, sender, h, items),
        }
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
    /// handle (or send it to another thread) and reply later. The requests
    /// and one-way items of one client session reach their handlers one
    /// at a time, in the order the client queued them; different sessions
    /// run concurrently when the transport has several threads. A handler
    /// should not block for long (its session's later items wait
    /// meanwhile), and must never wait for a later item of its own
    /// session. The blocking waits of this crate (a bulk transfer's
    /// [`BulkOp::wait`](crate::BulkOp::wait), a call to another server)
    /// fail there at once with `ApiMisuse`: the transport thread must
    /// deliver the very completion they wait for. Register such a handler
    /// with [`RpcHandle::on_blocking`] or [`RpcHandle::on_async`], or
    /// finish with [`BulkOp::on_complete`](crate::BulkOp::on_complete).
    pub fn on(&self, opcode: u32, handler: impl Fn(Request, ReplyHandle) + Send + Sync + 'static) {
        self.inner
            .handlers
            .write()
            .insert(opcode, Arc::new(handler));
    }

    /// Registers a typed handler: the payload is decoded as `Q`, the
    /// handler's `Ok` value encoded as the reply, its `Err` code sent as
    /// the failure status. A payload that does not decode gets an
    /// `EINVAL` reply. It runs where [`RpcHandle::on`]'s handlers run.
    pub fn on_typed<Q, R, F>(&self, opcode: u32, f: F)
    where
        Q: serde::de::DeserializeOwned,
        R: serde::Serialize,
        F: Fn(Q, &Request) -> std::result::Result<R, i32> + Send + Sync + 'static,
    {
        self.on(opcode, typed(f));
    }

    /// Registers `handler` for `opcode` to run on the machine's handler
    /// pool ([`RpcConfig::handler_threads`] threads), where it may block:
    /// wait for bulk transfers ([`BulkOp::wait`](crate::BulkOp::wait)),
    /// call other servers, read a disk. The transport thread only queues
    /// the request, so other sessions and completions go on meanwhile.
    ///
    /// The requests of one session are queued in order but may run
    /// concurrently on different pool threads; a handler that needs them
    /// one at a time must serialise them itself. When every pool thread
    /// is busy, requests wait in the pool's queue.
    ///
    /// # Errors
    /// `Shutdown`; a failure to start the pool's threads.
    ///
    /// # Example
    /// A server handler that pulls the client's data, the way bulk is
    /// meant to be done:
    ///
    /// ```
    /// use colibri_bulk_mem::MemTransport;
    /// use colibri_rpc::{BulkArg, RpcConfig, RpcMachine};
    ///
    /// # fn main() -> Result<(), colibri_rpc::RpcError> {
    /// const WRITE: u32 = 7;
    /// let xprt = MemTransport::default();
    /// let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:11", RpcConfig::default())?;
    /// let h = server.handle();
    /// server.on_blocking(WRITE, move |req, reply| {
    ///     let desc = req.bulk()[0].clone();
    ///     let Ok(buf) = h.alloc(desc.len as usize) else {
    ///         return reply.error(-12);
    ///     };
    ///     // Waiting is fine here: this is a pool thread.
    ///     match h.bulk_pull(&desc, buf).wait() {
    ///         Ok(done) => match done.result {
    ///             Ok(n) => reply.ok(&(n as u64).to_le_bytes()),
    ///             Err(e) => reply.error(e.errno()),
    ///         },
    ///         Err(blocked) => reply.error(blocked.error().errno()),
    ///     }
    /// })?;
    ///
    /// let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:12", RpcConfig::default())?;
    /// let session = client.session(server.addr())?;
    /// let mut src = client.alloc(4096)?;
    /// src.bufvec_mut().copy_in(0, &[7u8; 4096])?;
    /// let out = session.call_bulk(WRITE, b"", vec![BulkArg::Source { buf: src, len: 4096 }]);
    /// assert_eq!(out.result?, 4096u64.to_le_bytes());
    /// drop(out.buffers);
    /// drop(session);
    /// client.shutdown()?;
    /// server.shutdown()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`RpcConfig::handler_threads`]: crate::RpcConfig::handler_threads
    pub fn on_blocking(
        &self,
        opcode: u32,
        handler: impl Fn(Request, ReplyHandle) + Send + Sync + 'static,
    ) -> Result<()> {
        self.inner.pool()?;
        let m = Arc::downgrade(&self.inner);
        let handler = Arc::new(handler);
        self.on(opcode, move |req, reply| {
            let h = Arc::clone(&handler);
            Inner::run_on_pool(&m, req, reply, move |req, reply| h(req, reply));
        });
        Ok(())
    }

    /// As [`RpcHandle::on_typed`], on the handler pool (see
    /// [`RpcHandle::on_blocking`]).
    ///
    /// # Errors
    /// As [`RpcHandle::on_blocking`].
    pub fn on_typed_blocking<Q, R, F>(&self, opcode: u32, f: F) -> Result<()>
    where
        Q: serde::de::DeserializeOwned,
        R: serde::Serialize,
        F: Fn(Q, &Request) -> std::result::Result<R, i32> + Send + Sync + 'static,
    {
        self.on_blocking(opcode, typed(f))
    }

    /// Registers an async handler for `opcode`: `handler` makes a future
    /// (on the transport thread: make it cheaply, as an `async move`
    /// block does), which is then polled on the handler pool until it
    /// completes. In it, `.await` bulk transfers and calls instead of
    /// waiting for them; blocking waits fail there too, as on any thread
    /// that runs a poll woken by a transport.
    ///
    /// # Errors
    /// As [`RpcHandle::on_blocking`].
    ///
    /// # Example
    /// ```
    /// use colibri_bulk_mem::MemTransport;
    /// use colibri_rpc::{BulkArg, RpcConfig, RpcMachine};
    ///
    /// # fn main() -> Result<(), colibri_rpc::RpcError> {
    /// const READ: u32 = 8;
    /// let xprt = MemTransport::default();
    /// let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:21", RpcConfig::default())?;
    /// let h = server.handle();
    /// server.on_async(READ, move |req, reply| {
    ///     let h = h.clone();
    ///     async move {
    ///         let desc = req.bulk()[0].clone();
    ///         let Ok(mut buf) = h.alloc(desc.len as usize) else {
    ///             return reply.error(-12);
    ///         };
    ///         let _ = buf.bufvec_mut().copy_in(0, b"hello");
    ///         let done = h.bulk_push(&desc, buf, 5).await;
    ///         match done.result {
    ///             Ok(_) => reply.ok(b""),
    ///             Err(e) => reply.error(e.errno()),
    ///         }
    ///     }
    /// })?;
    ///
    /// let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:22", RpcConfig::default())?;
    /// let session = client.session(server.addr())?;
    /// let sink = client.alloc(64)?;
    /// let out = session.call_bulk(READ, b"", vec![BulkArg::Sink { buf: sink }]);
    /// out.result?;
    /// assert_eq!(out.buffers[0].buffer.bufvec().to_vec(0, 5)?, b"hello");
    /// drop(out.buffers);
    /// drop(session);
    /// client.shutdown()?;
    /// server.shutdown()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_async<F, Fut>(&self, opcode: u32, handler: F) -> Result<()>
    where
        F: Fn(Request, ReplyHandle) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.inner.pool()?;
        let m = Arc::downgrade(&self.inner);
        self.on(opcode, move |req, reply| {
            let Some(inner) = m.upgrade().filter(|m| !m.is_stopping()) else {
                reply.error(STATUS_SHUTDOWN);
                return;
            };
            let Some(pool) = inner.pool.get() else {
                reply.error(STATUS_SHUTDOWN);
                return;
            };
            let Some(adm) = pool.admit() else {
                bump(&inner.stats.handler_busy, 1);
                reply.error(STATUS_BUSY);
                return;
            };
            let fut: BoxFuture = Box::pin(handler(req, reply));
            // A pool closed meanwhile drops the future: its reply handle
            // answers NoReply.
            let _ = pool.spawn(adm, fut);
        });
        Ok(())
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
/// [`shutdown`](RpcMachine::shutdown). Dropping a machine shuts it down,
/// so not keeping one is a warning (an error where warnings are):
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// use colibri_bulk_mem::MemTransport;
/// use colibri_rpc::{RpcConfig, RpcMachine};
///
/// fn main() -> Result<(), colibri_rpc::RpcError> {
///     let xprt = MemTransport::default();
///     RpcMachine::start_on(&xprt, "127.0.0.1:0:1", RpcConfig::default())?;
///     Ok(())
/// }
/// ```
#[must_use = "dropping an RpcMachine shuts it down"]
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

/// A raw handler that decodes the payload as `Q` and encodes `f`'s answer
/// (see [`RpcHandle::on_typed`]).
fn typed<Q, R, F>(f: F) -> impl Fn(Request, ReplyHandle) + Send + Sync + 'static
where
    Q: serde::de::DeserializeOwned,
    R: serde::Serialize,
    F: Fn(Q, &Request) -> std::result::Result<R, i32> + Send + Sync + 'static,
{
    move |req, reply| match req.decode::<Q>() {
        Ok(q) => match f(q, &req) {
            Ok(r) => reply.ok_typed(&r),
            Err(code) => reply.error(code),
        },
        Err(_) => reply.error(crate::error::STATUS_INVALID),
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
            .spawn(move || {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                inner.timer_loop();
            })
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
    /// comes back) and is finalised, the handler pool finishes what it
    /// runs, and the domain is handed back with every buffer of the
    /// machine deregistered.
    ///
    /// # Errors
    /// `Busy`-like transport failures to stop in time; the machine is
    /// dropped regardless. `ApiMisuse` on a thread that delivers events
    /// (a handler registered with [`RpcHandle::on`], a completion
    /// callback), where waiting for the stop could never end: the machine
    /// is then stopped by a thread of its own.
    pub fn shutdown(mut self) -> Result<Domain> {
        check_may_block("RpcMachine::shutdown")?;
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
            // Messages already handed to the transport (a reply sent just
            // before the shutdown) get a bounded grace to leave: over a
            // transport where the receiver pulls the bytes (RDMA) an
            // immediate abort would cancel a reply the caller considers
            // sent.
            let grace = Instant::now() + SEND_GRACE;
            while tm.state() == TmState::Started
                && tm.queue_len(QueueType::MsgSend) > 0
                && Instant::now() < grace
            {
                std::thread::sleep(Duration::from_millis(1));
            }
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
            // Handlers blocked on transfers were released by the stop.
            if let Some(pool) = inner.pool.get() {
                pool.close();
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
        if self.tm.is_none() && self.timer.is_none() {
            return;
        }
        if colibri_net::wait::on_delivery_thread() {
            // Dropped where the stop cannot be waited for (in a handler or
            // a callback): a thread of its own stops it.
            self.h.inner.stopping.store(true, Ordering::Release);
            let mut rest = Self {
                h: self.h.clone(),
                tm: self.tm.take(),
                timer: self.timer.take(),
            };
            let spawned = std::thread::Builder::new()
                .name("colibri-rpc-drop".into())
                .spawn(move || {
                    let _ = rest.stop_all();
                });
            if let Err(e) = spawned {
                tracing::error!(%e, "could not spawn a thread to stop a dropped RPC machine");
            }
            return;
        }
        let _ = self.stop_all();
    }
}
