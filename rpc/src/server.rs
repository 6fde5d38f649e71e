//! The server side: handlers, requests, reply handles, and the server's
//! view of each client session with its bounded reply cache.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use colibri_net::{EndPoint, NetBuffer, NetError};
use parking_lot::{Mutex, MutexGuard};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Span, debug, debug_span, warn};

use crate::codec;
use crate::config::RpcConfig;
use crate::error::{Result, RpcError, STATUS_BUSY, STATUS_NO_REPLY, STATUS_PROTOCOL, STATUS_STALE};
use crate::machine::{
    ACK_DELAY, Freed, Inner, Link, MsgRecord, OutRef, Outbound, Parsed, QItem, RxMsg, SendOutcome,
};
use crate::seq::{Inbound, Now};
use crate::stats::bump;
use crate::wire::{self, BulkDesc, FLAG_RESEND, ItemHeader, ItemKind, MsgHeader};
use colibri_net::fasthash::FastMap;

/// A request handler (see [`RpcHandle::on`](crate::RpcHandle::on)).
pub(crate) type Handler = Arc<dyn Fn(Request, ReplyHandle) + Send + Sync>;

enum Cached {
    InProgress,
    Done(Vec<u8>),
}

struct SrvState {
    cache: FastMap<u64, Cached>,
    order: VecDeque<u64>,
    /// Highest xid evicted from the cache (or below the client's
    /// replied-below mark).
    evicted_max: u64,
    /// The highest replied-below mark the client sent: replies below it
    /// are not kept.
    replied_below: u64,
    in_progress: usize,
    link: Link,
    /// When the session was last seen active (refreshed by the timer when
    /// `active` is set, so that receiving reads no clock).
    last_active: Instant,
    /// A message came since the timer last looked.
    active: bool,
    closed: bool,
    /// The dispatcher's work list, kept between batches.
    scratch: Vec<Work>,
}

/// What the dispatcher does with an item once the session lock is
/// released.
enum Work {
    /// Give a request or one-way item to its handler.
    Run(Request, ReplyHandle),
    /// Answer a malformed request with a failure.
    Fail(ReplyHandle, i32),
}

/// The server's view of one client session: where to reply, the replies
/// kept for resends, the reorder window of the session's messages, and
/// the formation queue of replies.
pub(crate) struct SrvSession {
    pub(crate) id: u64,
    ep: EndPoint,
    span: Span,
    st: Mutex<SrvState>,
}

impl SrvSession {
    fn with_link(id: u64, ep: EndPoint, link: Link) -> Arc<Self> {
        let span = debug_span!(
            "rpc_server_session",
            id = format_args!("{id:016x}"),
            peer = ep.addr()
        );
        Arc::new(Self {
            id,
            ep,
            span,
            st: Mutex::new(SrvState {
                cache: FastMap::default(),
                order: VecDeque::new(),
                evicted_max: 0,
                replied_below: 0,
                in_progress: 0,
                link,
                last_active: Instant::now(),
                active: false,
                closed: false,
                scratch: Vec::new(),
            }),
        })
    }

    pub(crate) fn new(id: u64, ep: EndPoint) -> Arc<Self> {
        let s = Self::with_link(id, ep, Link::default());
        {
            let _g = s.span.enter();
            debug!("new client session");
        }
        s
    }

    pub(crate) fn key(&self) -> (u64, EndPoint) {
        (self.id, self.ep.clone())
    }

    fn owner(self: &Arc<Self>) -> OutRef {
        OutRef::Server(Arc::clone(self))
    }

    /// Refuses message `h` of a session the machine has no room for (it
    /// already has `max_sessions`): its requests are answered `Busy`, its
    /// one-way items dropped, and the message acknowledged so that the
    /// client's sequence moves on. Nothing is kept.
    pub(crate) fn refuse(m: &Arc<Inner>, sender: &EndPoint, h: &MsgHeader, items: RxMsg) {
        bump(&m.stats.sessions_refused, 1);
        debug!(
            session = format_args!("{:016x}", h.session),
            peer = sender.addr(),
            "too many sessions: message refused"
        );
        let link = Link {
            out: Outbound::transient(),
            inb: Inbound::acknowledging(h.epoch, h.seq),
        };
        let s = Self::with_link(h.session, sender.clone(), link);
        let now = Instant::now();
        let mut st = s.st.lock();
        for p in items {
            let header = match p {
                Parsed::Item { header, .. } if header.kind == ItemKind::Request => header,
                Parsed::BadItem(e) => match e.request {
                    Some((session, xid, opcode)) => ItemHeader {
                        kind: ItemKind::Request,
                        flags: 0,
                        opcode,
                        session,
                        xid,
                        status: 0,
                        low_gap: 0,
                    },
                    None => continue,
                },
                Parsed::Item { .. } => {
                    bump(&m.stats.items_refused, 1);
                    continue;
                }
            };
            bump(&m.stats.items_refused, 1);
            let mut bytes = Vec::new();
            if wire::encode_item(&mut bytes, &reply_header(&header, STATUS_BUSY), &[], &[]).is_ok()
            {
                st.link.out.push(
                    QItem {
                        bytes,
                        call_xid: None,
                    },
                    now,
                );
            }
        }
        st.link.out.forced = true;
        let _ = m.flush(&s.owner(), &s.ep, &mut st.link, now);
        if st.link.inb.ack.pending() {
            m.send_ack(&s.owner(), &s.ep, &mut st.link, now);
        }
    }

    /// Checks the reply cache for a request. Returns a reply handle when
    /// the request must be executed. Called with the session locked.
    fn begin(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        st: &mut SrvState,
        h: &ItemHeader,
        now: &mut Now,
    ) -> Option<ReplyHandle> {
        if st.closed {
            return None;
        }
        if let Some(low) = h.replied_below()
            && low > st.replied_below
        {
            Self::prune(m, st, low);
        }
        // `last_active` is set when the reply is made: a request in
        // progress keeps the session anyway.
        match st.cache.get(&h.xid) {
            Some(Cached::InProgress) => {
                bump(&m.stats.duplicates, 1);
                return None;
            }
            Some(Cached::Done(bytes)) => {
                bump(&m.stats.duplicates, 1);
                let _g = self.span.enter();
                debug!(xid = h.xid, "resent request answered from the reply cache");
                let bytes = bytes.clone();
                self.queue_reply(m, st, bytes, now.get());
                return None;
            }
            None if h.flags & FLAG_RESEND != 0 && h.xid <= st.evicted_max => {
                bump(&m.stats.stale, 1);
                let now = now.get();
                let mut bytes = Vec::new();
                let rh = reply_header(h, STATUS_STALE);
                if wire::encode_item(&mut bytes, &rh, &[], &[]).is_ok() {
                    st.link.out.push(
                        QItem {
                            bytes,
                            call_xid: None,
                        },
                        now,
                    );
                }
                let _ = m.flush(&self.owner(), &self.ep, &mut st.link, now);
                return None;
            }
            None => {}
        }
        st.cache.insert(h.xid, Cached::InProgress);
        st.order.push_back(h.xid);
        st.in_progress += 1;
        Some(ReplyHandle {
            to: Some(ReplyTo {
                m: Arc::clone(m),
                s: Arc::clone(self),
                header: *h,
            }),
        })
    }

    /// A message from the client: its acknowledgement is applied at once,
    /// its items are handed out in sequence order.
    pub(crate) fn receive(self: &Arc<Self>, m: &Arc<Inner>, h: &MsgHeader, items: RxMsg) {
        let mut now = Now::lazy();
        let mut o = SendOutcome::default();
        let mut st = self.st.lock();
        if st.closed {
            return;
        }
        st.link.on_ack(m, h, &mut o);
        if !h.ack_only {
            st.active = true;
            st.link.offer(m, h, items, &mut now);
        }
        if h.ack.is_some() && st.link.out.has_work() {
            let _ = m.flush(&self.owner(), &self.ep, &mut st.link, now.get());
        }
        self.dispatch(m, st);
        m.put_send_bufs(o.free);
    }

    /// Hands out the ready items, one thread at a time, in order: handlers
    /// of one session never run concurrently, while other sessions' run
    /// on other threads.
    fn dispatch<'a>(self: &'a Arc<Self>, m: &Arc<Inner>, mut st: MutexGuard<'a, SrvState>) {
        if st.link.inb.dispatching || !st.link.inb.has_ready() {
            return;
        }
        st.link.inb.dispatching = true;
        // Reused across batches (no allocation per message once warm).
        let mut work = std::mem::take(&mut st.scratch);
        let mut now = Now::lazy();
        loop {
            while let Some(msg) = st.link.inb.pop_ready() {
                self.prepare(m, &mut st, msg, &mut now, &mut work);
            }
            if work.is_empty() {
                st.link.inb.dispatching = false;
                st.scratch = work;
                if st.link.inb.ack.pending() {
                    let _ = m.ack_after_dispatch(&self.owner(), &self.ep, &mut st.link, &mut now);
                }
                return;
            }
            drop(st);
            for w in work.drain(..) {
                // A handler that panics loses its request (its reply
                // handle, dropped while unwinding, answers NoReply), not
                // the session: this thread still dispatches what follows.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match w {
                    Work::Fail(rh, status) => rh.error(status),
                    Work::Run(req, rh) => m.run_handler(req, rh),
                }));
                if ran.is_err() {
                    bump(&m.stats.handler_panics, 1);
                    let _g = self.span.enter();
                    warn!("request handler panicked");
                }
            }
            st = self.st.lock();
            now = Now::lazy();
        }
    }

    /// Turns the items of a message handed out into work for the
    /// dispatcher (reply cache checked under the session lock).
    fn prepare(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        st: &mut SrvState,
        msg: RxMsg,
        now: &mut Now,
        work: &mut Vec<Work>,
    ) {
        for p in msg {
            match p {
                Parsed::Item {
                    header,
                    payload,
                    descs,
                } => {
                    bump(&m.stats.items_received, 1);
                    match header.kind {
                        ItemKind::OneWay => {
                            bump(&m.stats.oneways, 1);
                            let req = Request::new(header, payload, descs, self.ep.clone());
                            work.push(Work::Run(req, ReplyHandle::oneway()));
                        }
                        ItemKind::Request => {
                            if let Some(rh) = self.begin(m, st, &header, now) {
                                let req = Request::new(header, payload, descs, self.ep.clone());
                                work.push(Work::Run(req, rh));
                            }
                        }
                        // The decoder refuses replies in this direction.
                        ItemKind::Reply => bump(&m.stats.protocol_errors, 1),
                    }
                }
                Parsed::BadItem(e) => {
                    bump(&m.stats.protocol_errors, 1);
                    let _g = self.span.enter();
                    debug!(error = %e.error, "malformed item");
                    if let Some((session, xid, opcode)) = e.request {
                        let header = ItemHeader {
                            kind: ItemKind::Request,
                            flags: 0,
                            opcode,
                            session,
                            xid,
                            status: 0,
                            low_gap: 0,
                        };
                        if let Some(rh) = self.begin(m, st, &header, now) {
                            work.push(Work::Fail(rh, STATUS_PROTOCOL));
                        }
                    }
                }
            }
        }
    }

    /// The client has the replies below `low` (or gave those calls up):
    /// drops them from the cache, oldest first, in arrival order (which is
    /// xid order: one session's requests are dispatched in order), and
    /// treats them as evicted (a resend below `low` is answered `ESTALE`,
    /// not run). A request below `low` still in progress is dropped when
    /// its reply is made.
    #[cold]
    fn prune(m: &Inner, st: &mut SrvState, low: u64) {
        st.replied_below = low;
        st.evicted_max = st.evicted_max.max(low - 1);
        let mut pruned = 0;
        while let Some(&x) = st.order.front() {
            if x >= low {
                break;
            }
            st.order.pop_front();
            if matches!(st.cache.get(&x), Some(Cached::Done(_))) {
                st.cache.remove(&x);
                pruned += 1;
            }
        }
        bump(&m.stats.replies_pruned, pruned);
    }

    /// Records and sends a reply.
    fn reply(self: &Arc<Self>, m: &Arc<Inner>, bytes: Vec<u8>, xid: u64) {
        let now = Instant::now();
        let mut st = self.st.lock();
        if st.closed {
            return;
        }
        st.in_progress = st.in_progress.saturating_sub(1);
        st.last_active = now;
        if xid < st.replied_below {
            // The client no longer waits for it.
            if st.cache.remove(&xid).is_some() {
                bump(&m.stats.replies_pruned, 1);
            }
        } else if let Some(e) = st.cache.get_mut(&xid) {
            *e = Cached::Done(bytes.clone());
        }
        let cap = m.cfg.reply_cache;
        let mut turns = st.order.len();
        while st.cache.len() > cap && turns > 0 {
            turns -= 1;
            let Some(x) = st.order.pop_front() else {
                break;
            };
            match st.cache.get(&x) {
                Some(Cached::Done(_)) => {
                    st.cache.remove(&x);
                    st.evicted_max = st.evicted_max.max(x);
                }
                // Never evict a request still being executed.
                Some(Cached::InProgress) => st.order.push_back(x),
                None => {}
            }
        }
        self.queue_reply(m, &mut st, bytes, now);
    }

    /// Queues an encoded reply item in the session's formation queue and
    /// sends what can leave.
    fn queue_reply(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        st: &mut SrvState,
        bytes: Vec<u8>,
        now: Instant,
    ) {
        st.link.out.push(
            QItem {
                bytes,
                call_xid: None,
            },
            now,
        );
        bump(&m.stats.replies, 1);
        let _ = m.flush(&self.owner(), &self.ep, &mut st.link, now);
    }

    pub(crate) fn flush(self: &Arc<Self>, m: &Arc<Inner>, force: bool) {
        let mut st = self.st.lock();
        if force {
            st.link.out.forced = true;
        }
        let _ = m.flush(&self.owner(), &self.ep, &mut st.link, Instant::now());
    }

    /// Completion of one of the session's reply messages.
    pub(crate) fn sent_done(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        buf: NetBuffer,
        rec: MsgRecord,
        status: std::result::Result<(), &NetError>,
    ) {
        let mut now = Now::lazy();
        let mut o = SendOutcome::default();
        {
            let mut st = self.st.lock();
            m.completed(&mut st.link, buf, rec, status, &mut now, &mut o);
            if let Some(e) = &o.reset {
                let _g = self.span.enter();
                debug!(error = %e, "reply message failed (the client resends or times out)");
                if o.peer_gone {
                    st.link.out.drain(&mut o.free);
                }
            }
            if st.link.out.has_work() {
                let _ = m.flush(&self.owner(), &self.ep, &mut st.link, now.get());
            }
        }
        m.put_send_bufs(o.free);
    }

    /// An acknowledgement could not be sent.
    pub(crate) fn ack_failed(self: &Arc<Self>, m: &Arc<Inner>, e: &NetError) {
        let now = Instant::now();
        let mut o = SendOutcome::default();
        {
            let mut st = self.st.lock();
            if matches!(e, NetError::Unreachable(_)) {
                let err = RpcError::Net(e.clone());
                st.link.out.restart(&err, &mut o);
                st.link.out.drain(&mut o.free);
            } else if !st.link.out.is_transient() {
                st.link.inb.ack.lost();
                let at = now + ACK_DELAY;
                st.link.inb.ack.due = Some(at);
                m.arm(at);
            }
        }
        m.put_send_bufs(o.free);
    }

    /// Flushes a delayed batch, sends a due acknowledgement, gives up on a
    /// gap; returns when to come back and whether the session is idle
    /// long enough to be forgotten.
    pub(crate) fn timer_pass(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        now: Instant,
    ) -> (Option<Instant>, bool) {
        let mut o = SendOutcome::default();
        let mut st = self.st.lock();
        if std::mem::take(&mut st.active) {
            st.last_active = now;
        }
        if st.link.out.deadline(&m.cfg).is_some_and(|t| t <= now) {
            let _ = m.flush(&self.owner(), &self.ep, &mut st.link, now);
        }
        let mut next = st.link.out.deadline(&m.cfg);
        let (t, _) = m.link_timer(&self.owner(), &self.ep, &mut st.link, now, &mut o);
        if let Some(t) = t {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let idle = Self::idle_now(&st, &m.cfg, now);
        self.dispatch(m, st);
        m.put_send_bufs(o.free);
        (next, idle)
    }

    fn idle_now(st: &SrvState, cfg: &RpcConfig, now: Instant) -> bool {
        !st.active
            && st.in_progress == 0
            && st.link.out.idle()
            && st.link.inb.is_idle()
            && now >= st.last_active + cfg.session_idle
    }

    pub(crate) fn is_idle(&self, cfg: &RpcConfig, now: Instant) -> bool {
        Self::idle_now(&self.st.lock(), cfg, now)
    }

    pub(crate) fn shutdown(&self) {
        let mut st = self.st.lock();
        st.closed = true;
        let mut free = Freed::default();
        st.link.out.drain(&mut free);
        st.link.out.forget_in_flight();
        st.link.inb.clear();
        st.cache.clear();
        st.order.clear();
    }
}

fn reply_header(h: &ItemHeader, status: i32) -> ItemHeader {
    ItemHeader {
        kind: ItemKind::Reply,
        flags: 0,
        opcode: h.opcode,
        session: h.session,
        xid: h.xid,
        status,
        low_gap: 0,
    }
}

/// A request (or one-way item) as a handler receives it.
pub struct Request {
    header: ItemHeader,
    payload: Vec<u8>,
    bulk: Vec<BulkDesc>,
    sender: EndPoint,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("opcode", &self.header.opcode)
            .field("session", &format_args!("{:016x}", self.header.session))
            .field("xid", &self.header.xid)
            .field("oneway", &self.is_oneway())
            .field("payload", &self.payload.len())
            .field("bulk", &self.bulk.len())
            .field("sender", &self.sender.addr())
            .finish()
    }
}

impl Request {
    pub(crate) fn new(
        header: ItemHeader,
        payload: Vec<u8>,
        bulk: Vec<BulkDesc>,
        sender: EndPoint,
    ) -> Self {
        Self {
            header,
            payload,
            bulk,
            sender,
        }
    }

    /// The opcode.
    pub fn opcode(&self) -> u32 {
        self.header.opcode
    }

    /// The client's session id.
    pub fn session(&self) -> u64 {
        self.header.session
    }

    /// The transaction id.
    pub fn xid(&self) -> u64 {
        self.header.xid
    }

    /// True for a one-way item (its reply handle sends nothing).
    pub fn is_oneway(&self) -> bool {
        self.header.kind == ItemKind::OneWay
    }

    /// True when the client marked it as a resend (the first copy was
    /// never executed here: executed ones are answered from the cache).
    pub fn is_resend(&self) -> bool {
        self.header.flags & FLAG_RESEND != 0
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Takes the payload.
    pub fn into_payload(self) -> Vec<u8> {
        self.payload
    }

    /// Decodes the payload as a typed value (see [`crate::codec`]).
    ///
    /// # Errors
    /// `Codec`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        codec::decode(&self.payload)
    }

    /// The client's bulk buffers named in the request.
    pub fn bulk(&self) -> &[BulkDesc] {
        &self.bulk
    }

    /// The client's end point (in this machine's transfer machine).
    pub fn sender(&self) -> &EndPoint {
        &self.sender
    }
}

struct ReplyTo {
    m: Arc<Inner>,
    s: Arc<SrvSession>,
    header: ItemHeader,
}

/// The means to answer one request, now or later, from any thread.
///
/// Consumed by [`ReplyHandle::ok`], [`ReplyHandle::ok_typed`] or
/// [`ReplyHandle::error`]. Dropping it without replying answers
/// `NoReply` to the client. The reply is recorded in the session's reply
/// cache, so a resent copy of the request is answered with it instead of
/// being executed again. A one-way item's handle sends nothing.
pub struct ReplyHandle {
    to: Option<ReplyTo>,
}

impl fmt::Debug for ReplyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplyHandle")
            .field("xid", &self.to.as_ref().map(|t| t.header.xid))
            .finish()
    }
}

impl ReplyHandle {
    pub(crate) fn oneway() -> Self {
        Self { to: None }
    }

    /// True for the handle of a one-way item.
    pub fn is_oneway(&self) -> bool {
        self.to.is_none()
    }

    /// The machine the request arrived at (for bulk transfers and
    /// buffers), when this is not a one-way item's handle.
    pub fn machine(&self) -> Option<crate::RpcHandle> {
        self.to.as_ref().map(|t| crate::RpcHandle {
            inner: Arc::clone(&t.m),
        })
    }

    fn send(&mut self, status: i32, payload: &[u8]) {
        let Some(t) = self.to.take() else {
            return;
        };
        if t.m.is_stopping() {
            return;
        }
        let max = t.m.max_item();
        let (status, payload) = if wire::item_size(payload.len(), &[]) > max {
            let _g = t.s.span.enter();
            debug!(
                xid = t.header.xid,
                len = payload.len(),
                "reply too large for a message: sent as EMSGSIZE"
            );
            (
                RpcError::TooBig {
                    len: payload.len(),
                    max,
                }
                .errno(),
                &[][..],
            )
        } else {
            (status, payload)
        };
        let mut bytes = Vec::with_capacity(wire::item_size(payload.len(), &[]));
        if wire::encode_item(&mut bytes, &reply_header(&t.header, status), payload, &[]).is_err() {
            return;
        }
        t.s.reply(&t.m, bytes, t.header.xid);
    }

    /// Replies with a payload.
    pub fn ok(mut self, payload: &[u8]) {
        self.send(0, payload);
    }

    /// Replies with a typed value; a value that does not encode is sent
    /// as an `EINVAL` failure.
    pub fn ok_typed<T: Serialize + ?Sized>(mut self, value: &T) {
        match codec::encode(value) {
            Ok(b) => self.send(0, &b),
            Err(_) => self.send(crate::error::STATUS_INVALID, &[]),
        }
    }

    /// Replies with a failure status (nonzero: a negative errno, or the
    /// application's own code; zero is sent as `EINVAL`).
    pub fn error(mut self, status: i32) {
        let status = if status == 0 {
            crate::error::STATUS_INVALID
        } else {
            status
        };
        self.send(status, &[]);
    }
}

impl Drop for ReplyHandle {
    fn drop(&mut self) {
        if self.to.is_some() {
            self.send(STATUS_NO_REPLY, &[]);
        }
    }
}
