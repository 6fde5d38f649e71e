//! Client sessions: transaction ids, calls in flight, their timeouts and
//! resends, and the session's formation queue.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use colibri_net::{BufferCallbacks, EndPoint, NetBuffer, NetError, QueueType};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Span, debug, debug_span, warn};

use crate::call::{BulkArg, BulkCall, BulkDone, BulkOutcome, CallHandle, CallState, Canceller};
use crate::codec;
use crate::config::CallOpts;
use crate::error::{Result, RpcError, check_may_block};
use crate::machine::{
    ACK_DELAY, Freed, Inner, Link, MsgRecord, OutRef, Parsed, QItem, RxMsg, SendOutcome,
};
use crate::seq::Now;
use crate::stats::{SessionStats, bump};
use crate::wire::{
    self, BulkDesc, BulkKind, FLAG_RESEND, ItemHeader, ItemKind, MAX_DESCS, MsgHeader,
};
use colibri_net::fasthash::FastMap;

/// A random nonzero 64-bit value (session ids).
pub(crate) fn random_id() -> u64 {
    static CTR: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(CTR.fetch_add(1, Ordering::Relaxed));
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(t);
        let v = h.finish();
        if v != 0 {
            return v;
        }
    }
}

struct Pending {
    call: Arc<CallState>,
    deadline: Instant,
    timeout: Duration,
    retries_left: u32,
    req: Option<Vec<u8>>,
}

/// A reply handed out: the call it completes.
type Done = (Arc<CallState>, ItemHeader, Vec<u8>);

struct SessState {
    /// No call below this xid is pending (advanced lazily: requests tell
    /// the server it may forget replies below it).
    low_xid: u64,
    /// Next request xid.
    next_xid: u64,
    /// Next one-way item number (one-way items have their own sequence,
    /// so that stepping `low_xid` over xids visits requests only).
    next_post: u64,
    pending: FastMap<u64, Pending>,
    link: Link,
    closed: bool,
    waiters: usize,
    stats: SessionStats,
    /// The dispatcher's list of replies, kept between batches.
    scratch: Vec<Done>,
}

impl SessState {
    /// The replied-below gap of request `xid`: every call below the lowest
    /// one still pending has its reply (or was given up), so the server may
    /// drop those replies. Each request xid is stepped over once (one-way
    /// items are numbered apart), so this costs one lookup per call.
    fn low_gap(&mut self, xid: u64) -> u32 {
        while self.low_xid < xid && !self.pending.contains_key(&self.low_xid) {
            self.low_xid += 1;
        }
        ItemHeader::gap_for(xid, self.low_xid)
    }
}

/// The machine's side of a client session.
pub(crate) struct SessionInner {
    pub(crate) id: u64,
    pub(crate) ep: EndPoint,
    span: Span,
    st: Mutex<SessState>,
    drained: Condvar,
}

type Failed = Vec<(Arc<CallState>, RpcError)>;

impl SessionInner {
    fn take_failed(st: &mut SessState, failed: Vec<(u64, RpcError)>, out: &mut Failed) {
        for (xid, e) in failed {
            if let Some(p) = st.pending.remove(&xid) {
                out.push((p.call, e));
            }
        }
    }

    fn complete_failed(m: &Inner, failed: Failed) {
        for (call, e) in failed {
            bump(&m.stats.calls_failed, 1);
            // A completion callback that panics must not stop the thread
            // completing the others (often a session's dispatcher).
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.finish(Err(e))))
                .is_err()
            {
                warn!("call completion callback panicked");
            }
        }
    }

    /// Completes call `xid` with `Cancelled` if it is still in flight
    /// (its bulk buffers are cancelled and come back through the
    /// outcome), and takes its request out of the formation queue if it
    /// has not left yet. A reply that arrives later counts as unmatched.
    /// Returns whether this cancelled the call.
    pub(crate) fn cancel(&self, m: &Inner, xid: u64) -> bool {
        let mut calls = Vec::new();
        {
            let mut st = self.st.lock();
            Self::take_failed(&mut st, vec![(xid, RpcError::Cancelled)], &mut calls);
            if calls.is_empty() {
                return false;
            }
            st.stats.cancelled += 1;
            st.link.out.withdraw(xid);
            self.notify_drained(&st);
            self.remove_if_done(m, &st);
        }
        {
            let _g = self.span.enter();
            debug!(xid, "call cancelled");
        }
        bump(&m.stats.cancelled, 1);
        Self::complete_failed(m, calls);
        true
    }

    fn notify_drained(&self, st: &SessState) {
        if st.waiters > 0 && st.link.out.idle() {
            self.drained.notify_all();
        }
    }

    fn owner(self: &Arc<Self>) -> OutRef {
        OutRef::Client(Arc::clone(self))
    }

    /// Leaves the machine's map once closed and done.
    fn remove_if_done(&self, m: &Inner, st: &SessState) {
        if st.closed && st.pending.is_empty() && st.link.out.idle() {
            m.sessions.write().remove(&self.id);
        }
    }

    /// The peer is gone (`e` says so): every call fails now rather than
    /// at its timeout, queued items are dropped, and the next message
    /// starts a new sequence.
    fn peer_gone(st: &mut SessState, e: &RpcError, o: &mut SendOutcome, out: &mut Failed) {
        // Every call fails with the reason, whichever message it was in.
        let mut failed: Vec<(u64, RpcError)> = st.pending.keys().map(|&x| (x, e.clone())).collect();
        failed.append(&mut o.failed);
        if o.reset.is_none() {
            st.link.out.restart(e, o);
            failed.append(&mut o.failed);
        }
        failed.extend(
            st.link
                .out
                .drain(&mut o.free)
                .into_iter()
                .map(|x| (x, e.clone())),
        );
        Self::take_failed(st, failed, out);
    }

    /// Flushes the session's queue (`force`: ignore the batch delay).
    pub(crate) fn flush(self: &Arc<Self>, m: &Arc<Inner>, force: bool) {
        let mut calls = Vec::new();
        {
            let mut st = self.st.lock();
            if force {
                st.link.out.forced = true;
            }
            let failed = m.flush(&self.owner(), &self.ep, &mut st.link, Instant::now());
            Self::take_failed(&mut st, failed, &mut calls);
            self.notify_drained(&st);
        }
        Self::complete_failed(m, calls);
    }

    /// Completion of one of the session's messages.
    pub(crate) fn sent_done(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        buf: NetBuffer,
        rec: MsgRecord,
        status: std::result::Result<(), &NetError>,
    ) {
        let mut now = Now::lazy();
        let mut o = SendOutcome::default();
        let mut calls = Vec::new();
        {
            let mut st = self.st.lock();
            m.completed(&mut st.link, buf, rec, status, &mut now, &mut o);
            if let Some(e) = o.reset.clone() {
                let _g = self.span.enter();
                debug!(error = %e, "message to the server failed for good");
                if o.peer_gone {
                    Self::peer_gone(&mut st, &e, &mut o, &mut calls);
                }
            }
            let failed = std::mem::take(&mut o.failed);
            Self::take_failed(&mut st, failed, &mut calls);
            if st.link.out.has_work() {
                let failed = m.flush(&self.owner(), &self.ep, &mut st.link, now.get());
                Self::take_failed(&mut st, failed, &mut calls);
            }
            self.notify_drained(&st);
            self.remove_if_done(m, &st);
        }
        m.put_send_bufs(o.free);
        Self::complete_failed(m, calls);
    }

    /// An acknowledgement or probe could not be sent.
    pub(crate) fn ack_failed(self: &Arc<Self>, m: &Arc<Inner>, e: &NetError) {
        let now = Instant::now();
        let mut o = SendOutcome::default();
        let mut calls = Vec::new();
        {
            let mut st = self.st.lock();
            let err = RpcError::Net(e.clone());
            if matches!(e, NetError::Unreachable(_)) {
                let _g = self.span.enter();
                debug!(error = %err, "probe or acknowledgement: the server is gone");
                Self::peer_gone(&mut st, &err, &mut o, &mut calls);
                bump(&m.stats.seq_resets, 1);
                self.notify_drained(&st);
            } else {
                st.link.inb.ack.lost();
                if retryable_soon(e) {
                    // Probe again shortly: the transport may reconnect,
                    // or tell us the peer is gone.
                    st.link.out.last_tx = now
                        .checked_sub(m.cfg.probe_interval)
                        .map_or(now, |t| t + ACK_DELAY);
                }
                let at = now + ACK_DELAY;
                st.link.inb.ack.due = Some(at);
                m.arm(at);
            }
        }
        m.put_send_bufs(o.free);
        Self::complete_failed(m, calls);
    }

    /// A message from the server: its acknowledgement is applied at once,
    /// its replies are handed out in sequence order.
    pub(crate) fn receive(self: &Arc<Self>, m: &Arc<Inner>, h: &MsgHeader, items: RxMsg) {
        let mut now = Now::lazy();
        let mut o = SendOutcome::default();
        let mut calls = Vec::new();
        let mut st = self.st.lock();
        st.link.on_ack(m, h, &mut o);
        let failed = std::mem::take(&mut o.failed);
        Self::take_failed(&mut st, failed, &mut calls);
        if !h.ack_only {
            st.link.offer(m, h, items, &mut now);
        }
        if h.ack.is_some() && st.link.out.has_work() {
            // The window may have opened.
            let failed = m.flush(&self.owner(), &self.ep, &mut st.link, now.get());
            Self::take_failed(&mut st, failed, &mut calls);
        }
        self.dispatch(m, st, &mut calls);
        m.put_send_bufs(o.free);
        Self::complete_failed(m, calls);
    }

    /// Hands out the ready replies, one thread at a time, in order.
    fn dispatch<'a>(
        self: &'a Arc<Self>,
        m: &Arc<Inner>,
        mut st: MutexGuard<'a, SessState>,
        calls: &mut Failed,
    ) {
        if st.link.inb.dispatching || !st.link.inb.has_ready() {
            return;
        }
        st.link.inb.dispatching = true;
        // Reused across batches (no allocation per message once warm).
        let mut done = std::mem::take(&mut st.scratch);
        loop {
            while let Some(msg) = st.link.inb.pop_ready() {
                for p in msg {
                    match p {
                        Parsed::Item {
                            header, payload, ..
                        } => {
                            bump(&m.stats.items_received, 1);
                            match st.pending.remove(&header.xid) {
                                Some(p) => {
                                    st.stats.replies += 1;
                                    done.push((p.call, header, payload));
                                }
                                None => bump(&m.stats.unmatched_replies, 1),
                            }
                        }
                        Parsed::BadItem(e) => {
                            bump(&m.stats.protocol_errors, 1);
                            let _g = self.span.enter();
                            debug!(error = %e.error, "malformed reply");
                        }
                    }
                }
            }
            if done.is_empty() && calls.is_empty() {
                st.link.inb.dispatching = false;
                st.scratch = done;
                if st.link.inb.ack.pending() {
                    let failed = m.ack_after_dispatch(
                        &self.owner(),
                        &self.ep,
                        &mut st.link,
                        &mut Now::lazy(),
                    );
                    Self::take_failed(&mut st, failed, calls);
                }
                self.remove_if_done(m, &st);
                return;
            }
            drop(st);
            Self::complete_failed(m, std::mem::take(calls));
            for (call, h, payload) in done.drain(..) {
                let result = if h.status == 0 {
                    bump(&m.stats.calls_ok, 1);
                    Ok(payload)
                } else {
                    bump(&m.stats.calls_failed, 1);
                    Err(RpcError::from_status(h.status, h.opcode))
                };
                // A completion callback that panics must not stop the
                // session's dispatch.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.finish(result)))
                    .is_err()
                {
                    let _g = self.span.enter();
                    warn!("call completion callback panicked");
                }
            }
            st = self.st.lock();
        }
    }

    /// Expires and resends calls; flushes a delayed batch; sends due
    /// acknowledgements and probes; gives up on gaps. Returns when to come
    /// back.
    pub(crate) fn timer_pass(self: &Arc<Self>, m: &Arc<Inner>, now: Instant) -> Option<Instant> {
        let mut calls = Vec::new();
        let mut next: Option<Instant> = None;
        let mut merge = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        let mut o = SendOutcome::default();
        let mut st = self.st.lock();
        {
            let st = &mut *st;
            let mut expired = Vec::new();
            let mut resend = Vec::new();
            for (&xid, p) in &mut st.pending {
                if p.deadline > now {
                    merge(Some(p.deadline));
                    continue;
                }
                match &p.req {
                    Some(req) if p.retries_left > 0 => {
                        p.retries_left -= 1;
                        p.deadline = now + p.timeout;
                        merge(Some(p.deadline));
                        let mut bytes = req.clone();
                        bytes[1] |= FLAG_RESEND;
                        resend.push(QItem {
                            bytes,
                            call_xid: Some(xid),
                        });
                    }
                    _ => expired.push(xid),
                }
            }
            if !resend.is_empty() || !expired.is_empty() {
                let _g = self.span.enter();
                debug!(
                    resent = resend.len(),
                    expired = expired.len(),
                    "call timeouts"
                );
            }
            st.stats.resends += resend.len() as u64;
            st.stats.timeouts += expired.len() as u64;
            bump(&m.stats.resends, resend.len() as u64);
            bump(&m.stats.timeouts, expired.len() as u64);
            let resent = !resend.is_empty();
            for it in resend {
                st.link.out.push(it, now);
            }
            Self::take_failed(
                st,
                expired
                    .into_iter()
                    .map(|x| (x, RpcError::TimedOut))
                    .collect(),
                &mut calls,
            );
            if resent || st.link.out.deadline(&m.cfg).is_some_and(|t| t <= now) {
                let failed = m.flush(&self.owner(), &self.ep, &mut st.link, now);
                Self::take_failed(st, failed, &mut calls);
            }
            merge(st.link.out.deadline(&m.cfg));
            let (t, _) = m.link_timer(&self.owner(), &self.ep, &mut st.link, now, &mut o);
            merge(t);
            let failed = std::mem::take(&mut o.failed);
            Self::take_failed(st, failed, &mut calls);
            // Probe a server we wait for and have not sent anything to for
            // a while: a server that stopped fails the calls now.
            let probe = m.cfg.probe_interval;
            if !probe.is_zero() && !st.pending.is_empty() {
                let at = st.link.out.last_tx + probe;
                if at <= now && st.link.out.in_flight == 0 {
                    st.link.out.last_tx = now;
                    if m.send_ack(&self.owner(), &self.ep, &mut st.link, now) {
                        bump(&m.stats.probes_sent, 1);
                    }
                    merge(Some(now + probe));
                } else {
                    merge(Some(at.max(now + ACK_DELAY)));
                }
            }
            self.notify_drained(st);
            self.remove_if_done(m, st);
        }
        // Messages that became ready when a gap was given up on.
        self.dispatch(m, st, &mut calls);
        m.put_send_bufs(o.free);
        Self::complete_failed(m, calls);
        next
    }

    /// Fails everything in flight with `Shutdown` (machine stopping).
    pub(crate) fn shutdown(&self) {
        let calls: Vec<Arc<CallState>> = {
            let mut st = self.st.lock();
            st.closed = true;
            let mut free = Freed::default();
            st.link.out.drain(&mut free);
            st.link.out.forget_in_flight();
            st.link.inb.clear();
            let c = st.pending.drain().map(|(_, p)| p.call).collect();
            self.drained.notify_all();
            c
        };
        for c in calls {
            c.finish(Err(RpcError::Shutdown));
        }
    }
}

fn retryable_soon(e: &NetError) -> bool {
    matches!(e, NetError::ConnectionReset(_))
}

/// Closes the session when the last user handle goes.
struct Guard {
    s: Arc<SessionInner>,
    m: Weak<Inner>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(m) = self.m.upgrade() else {
            return;
        };
        let remove = {
            let mut st = self.s.st.lock();
            st.closed = true;
            st.pending.is_empty() && st.link.out.idle()
        };
        if remove {
            m.sessions.write().remove(&self.s.id);
        } else {
            // Send what is queued now; the timer removes the session once
            // its calls are done.
            self.s.flush(&m, true);
        }
    }
}

/// A client session to one server: calls, one-way items, bulk calls.
///
/// Made by [`RpcHandle::session`](crate::RpcHandle::session). Each session
/// has a random 64-bit id; its requests carry increasing transaction ids
/// (xids). Its items are packed into messages by its own formation queue,
/// in order, and the server hands them to its handlers in that order, one
/// at a time, each once, whatever order the transport delivers the
/// messages in (items queued by different threads are ordered as they
/// were queued). Replies are handed back in the order the server sent
/// them. Clone it to use it from several threads; the session closes when
/// the last clone is dropped (calls in flight still complete).
#[derive(Clone)]
pub struct Session {
    s: Arc<SessionInner>,
    m: Arc<Inner>,
    _guard: Arc<Guard>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:016x}", self.s.id))
            .field("peer", &self.s.ep.addr())
            .finish()
    }
}

impl Session {
    pub(crate) fn open(m: &Arc<Inner>, ep: EndPoint) -> Self {
        let id = random_id();
        let span = debug_span!(
            "rpc_session",
            id = format_args!("{id:016x}"),
            peer = ep.addr()
        );
        let s = Arc::new(SessionInner {
            id,
            ep,
            span,
            st: Mutex::new(SessState {
                low_xid: 1,
                next_xid: 1,
                next_post: 1,
                pending: FastMap::default(),
                link: Link::default(),
                closed: false,
                waiters: 0,
                stats: SessionStats::default(),
                scratch: Vec::new(),
            }),
            drained: Condvar::new(),
        });
        m.sessions.write().insert(id, Arc::clone(&s));
        {
            let _g = s.span.enter();
            debug!("session opened");
        }
        Self {
            _guard: Arc::new(Guard {
                s: Arc::clone(&s),
                m: Arc::downgrade(m),
            }),
            s,
            m: Arc::clone(m),
        }
    }

    /// The session id.
    pub fn id(&self) -> u64 {
        self.s.id
    }

    /// The server's address.
    pub fn peer(&self) -> &str {
        self.s.ep.addr()
    }

    /// Counters of this session.
    pub fn stats(&self) -> SessionStats {
        let st = self.s.st.lock();
        SessionStats {
            msgs_sent: st.link.out.msgs,
            items_sent: st.link.out.items,
            bytes_sent: st.link.out.bytes,
            ..st.stats
        }
    }

    /// Calls in flight.
    pub fn in_flight(&self) -> usize {
        self.s.st.lock().pending.len()
    }

    /// Items waiting in the session's formation queue (not yet in a
    /// message), for callers that want to bound it.
    pub fn queued_items(&self) -> usize {
        self.s.st.lock().link.out.queued_len()
    }

    fn canceller(&self, xid: u64) -> Canceller {
        Canceller {
            s: Arc::downgrade(&self.s),
            m: Arc::downgrade(&self.m),
            xid,
        }
    }

    /// Enqueues an item; for requests, registers the call first.
    fn enqueue(
        &self,
        kind: ItemKind,
        opcode: u32,
        payload: &[u8],
        descs: &[BulkDesc],
        call: Option<(Arc<CallState>, CallOpts)>,
    ) -> Result<u64> {
        let m = &self.m;
        if m.is_stopping() {
            return Err(RpcError::Shutdown);
        }
        let size = wire::item_size(payload.len(), descs);
        if size > m.max_item() {
            return Err(RpcError::TooBig {
                len: size,
                max: m.max_item(),
            });
        }
        let now = Instant::now();
        let mut calls = Vec::new();
        let deadline;
        let xid;
        {
            let mut st = self.s.st.lock();
            if st.closed {
                return Err(RpcError::Shutdown);
            }
            let counter = if kind == ItemKind::Request {
                &mut st.next_xid
            } else {
                &mut st.next_post
            };
            xid = *counter;
            *counter += 1;
            let low_gap = if kind == ItemKind::Request {
                st.low_gap(xid)
            } else {
                0
            };
            let mut bytes = Vec::with_capacity(size);
            let h = ItemHeader {
                kind,
                flags: 0,
                opcode,
                session: self.s.id,
                xid,
                status: 0,
                low_gap,
            };
            wire::encode_item(&mut bytes, &h, payload, descs)
                .map_err(|e| RpcError::InvalidArgument(e.to_string()))?;
            if let Some((call, opts)) = call {
                let timeout = opts.timeout.unwrap_or(m.cfg.timeout);
                let retries = opts.retries.unwrap_or(m.cfg.retries);
                deadline = Some(now + timeout);
                st.pending.insert(
                    xid,
                    Pending {
                        call,
                        deadline: now + timeout,
                        timeout,
                        retries_left: retries,
                        req: (retries > 0).then(|| bytes.clone()),
                    },
                );
                st.stats.calls += 1;
                bump(&m.stats.calls, 1);
                st.link.out.push(
                    QItem {
                        bytes,
                        call_xid: Some(xid),
                    },
                    now,
                );
            } else {
                deadline = None;
                st.stats.posts += 1;
                bump(&m.stats.posts, 1);
                st.link.out.push(
                    QItem {
                        bytes,
                        call_xid: None,
                    },
                    now,
                );
            }
            let failed = m.flush(
                &OutRef::Client(Arc::clone(&self.s)),
                &self.s.ep,
                &mut st.link,
                now,
            );
            SessionInner::take_failed(&mut st, failed, &mut calls);
        }
        if let Some(d) = deadline {
            m.arm(d);
        }
        SessionInner::complete_failed(m, calls);
        Ok(xid)
    }

    /// Starts a call; the reply arrives through the handle.
    ///
    /// # Errors
    /// `TooBig` for a payload that does not fit in a message (send it with
    /// bulk), `Shutdown` when the machine stops. Failures after the start
    /// (transport, timeout, the server's) come through the handle.
    pub fn start(&self, opcode: u32, payload: &[u8], opts: CallOpts) -> Result<CallHandle> {
        let call = CallState::plain();
        let xid = self.enqueue(
            ItemKind::Request,
            opcode,
            payload,
            &[],
            Some((Arc::clone(&call), opts)),
        )?;
        Ok(CallHandle {
            call,
            spin: self.m.cfg.spin,
            xid,
            cancel: self.canceller(xid),
        })
    }

    /// Calls and waits for the reply, with the machine's default timeout
    /// and resends.
    ///
    /// # Errors
    /// As [`Session::start`], and the call's failure; `ApiMisuse`, before
    /// anything is sent, on a thread that delivers events (see
    /// [`CallHandle::wait`]).
    pub fn call(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>> {
        self.call_with(opcode, payload, CallOpts::default())
    }

    /// Calls with options and waits for the reply.
    ///
    /// # Errors
    /// As [`Session::call`].
    pub fn call_with(&self, opcode: u32, payload: &[u8], opts: CallOpts) -> Result<Vec<u8>> {
        check_may_block("Session::call")?;
        self.start(opcode, payload, opts)?.wait()
    }

    /// Calls with a typed request and reply (see [`crate::codec`]).
    ///
    /// # Errors
    /// As [`Session::call`], and `Codec` when either value does not
    /// encode or decode.
    pub fn call_typed<Q: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        opcode: u32,
        req: &Q,
    ) -> Result<R> {
        let bytes = codec::encode(req)?;
        codec::decode(&self.call(opcode, &bytes)?)
    }

    /// Sends a one-way item: no reply. It is packed with the session's
    /// other items; failures to send show in [`Session::flush`] and the
    /// statistics.
    ///
    /// # Errors
    /// `TooBig`, `Shutdown`.
    pub fn post(&self, opcode: u32, payload: &[u8]) -> Result<()> {
        self.enqueue(ItemKind::OneWay, opcode, payload, &[], None)
            .map(|_| ())
    }

    /// Sends a typed one-way item.
    ///
    /// # Errors
    /// As [`Session::post`], and `Codec`.
    pub fn post_typed<Q: Serialize + ?Sized>(&self, opcode: u32, item: &Q) -> Result<()> {
        self.post(opcode, &codec::encode(item)?)
    }

    /// Sends every queued item now (ignoring the batch delay) and waits
    /// until every message of the session has completed.
    ///
    /// # Errors
    /// `TimedOut` if that takes longer than `timeout`; the first send
    /// failure since the previous flush; `ApiMisuse` on a thread that
    /// delivers events (nothing is sent early then).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        check_may_block("Session::flush")?;
        self.s.flush(&self.m, true);
        let deadline = Instant::now() + timeout;
        let mut st = self.s.st.lock();
        while !st.link.out.idle() && !self.m.is_stopping() {
            st.waiters += 1;
            let timed_out = self.s.drained.wait_until(&mut st, deadline).timed_out();
            st.waiters -= 1;
            if timed_out && !st.link.out.idle() {
                return Err(RpcError::TimedOut);
            }
        }
        match st.link.out.send_error.take() {
            Some(e) => Err(e),
            None if self.m.is_stopping() => Err(RpcError::Shutdown),
            None => Ok(()),
        }
    }

    /// Starts a call that hands `bulk` buffers to the server: each is
    /// added to a passive queue for the server's end point only, and its
    /// descriptor travels in the request. The call completes when the
    /// reply and every buffer are back; buffers the server did not use are
    /// cancelled after the reply. A refusal completes the call at once,
    /// with the buffers.
    pub fn start_bulk(
        &self,
        opcode: u32,
        payload: &[u8],
        bulk: Vec<BulkArg>,
        opts: CallOpts,
    ) -> BulkCall {
        let n = bulk.len();
        let call = CallState::with_bulk(n, self.m.tm.clone());
        let mut handle = BulkCall {
            call: Arc::clone(&call),
            spin: self.m.cfg.spin,
            cancel: None,
        };
        if n > MAX_DESCS {
            for (i, a) in bulk.into_iter().enumerate() {
                call.bulk_done(
                    i,
                    BulkDone {
                        buffer: a.into_buffer(),
                        result: Err(RpcError::Cancelled),
                    },
                    false,
                );
            }
            call.finish(Err(RpcError::InvalidArgument(format!(
                "{n} bulk buffers, at most {MAX_DESCS}"
            ))));
            return handle;
        }
        // Each buffer's callback holds the call until that buffer's
        // completion, then lets go (the buffer ends up inside the call).
        let holders: Arc<Mutex<Vec<Option<Arc<CallState>>>>> = Arc::new(Mutex::new(
            (0..n).map(|_| Some(Arc::clone(&call))).collect(),
        ));
        let hold = Arc::clone(&holders);
        let ids: Arc<Vec<u64>> = Arc::new(
            bulk.iter()
                .map(|a| match a {
                    BulkArg::Source { buf, .. } | BulkArg::Sink { buf } => buf.id(),
                })
                .collect(),
        );
        let stats_m = Arc::downgrade(&self.m);
        let cb = move |_tm: &colibri_net::TmHandle, mut ev: colibri_net::BufferEvent| {
            let Some(done) = crate::bulk::bulk_outcome(&mut ev, &stats_m) else {
                return;
            };
            let Some(i) = ids.iter().position(|&id| id == done.buffer.id()) else {
                return;
            };
            let c = hold.lock().get_mut(i).and_then(Option::take);
            if let Some(c) = c {
                c.bulk_done(i, done, true);
            }
        };
        let cbs = Arc::new(
            BufferCallbacks::new()
                .on(QueueType::PassiveBulkSend, cb.clone())
                .on(QueueType::PassiveBulkRecv, cb),
        );
        let mut descs = Vec::with_capacity(n);
        let mut error = None;
        for (i, arg) in bulk.into_iter().enumerate() {
            if error.is_some() {
                holders.lock()[i] = None;
                call.bulk_done(
                    i,
                    BulkDone {
                        buffer: arg.into_buffer(),
                        result: Err(RpcError::Cancelled),
                    },
                    false,
                );
                continue;
            }
            call.bulk_expect();
            let (kind, added) = match arg {
                BulkArg::Source { mut buf, len } => {
                    buf.set_callbacks(cbs.clone());
                    (
                        BulkKind::Source,
                        self.m
                            .tm
                            .add_passive_send(buf, len, Some(&self.s.ep))
                            .map(|a| (a, len)),
                    )
                }
                BulkArg::Sink { mut buf } => {
                    buf.set_callbacks(cbs.clone());
                    let len = buf.len();
                    (
                        BulkKind::Sink,
                        self.m
                            .tm
                            .add_passive_recv(buf, Some(&self.s.ep))
                            .map(|a| (a, len)),
                    )
                }
            };
            match added {
                Ok(((token, desc), len)) => {
                    call.bulk_added(i, token);
                    descs.push(BulkDesc {
                        kind,
                        len: len as u64,
                        desc,
                    });
                }
                Err(e) => {
                    holders.lock()[i] = None;
                    let err = RpcError::Net(e.error.clone());
                    call.bulk_done(
                        i,
                        BulkDone {
                            buffer: e.buffer,
                            result: Err(err.clone()),
                        },
                        true,
                    );
                    error = Some(err);
                }
            }
        }
        if let Some(e) = error {
            call.finish(Err(e));
            return handle;
        }
        match self.enqueue(
            ItemKind::Request,
            opcode,
            payload,
            &descs,
            Some((Arc::clone(&call), opts)),
        ) {
            Ok(xid) => handle.cancel = Some(self.canceller(xid)),
            Err(e) => call.finish(Err(e)),
        }
        handle
    }

    /// Calls with bulk buffers and waits for the outcome.
    ///
    /// On a thread that delivers events (see [`CallHandle::wait`]) nothing
    /// is sent: the outcome is `ApiMisuse` at once, with every buffer
    /// back.
    pub fn call_bulk(&self, opcode: u32, payload: &[u8], bulk: Vec<BulkArg>) -> BulkOutcome {
        if let Err(e) = check_may_block("Session::call_bulk") {
            let buffers = bulk
                .into_iter()
                .map(|a| BulkDone {
                    buffer: a.into_buffer(),
                    result: Err(e.clone()),
                })
                .collect();
            return BulkOutcome {
                result: Err(e),
                buffers,
            };
        }
        self.start_bulk(opcode, payload, bulk, CallOpts::default())
            .wait_here()
    }
}
