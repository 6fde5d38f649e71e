//! The server side: handlers, requests, reply handles, and the server's
//! view of each client session with its bounded reply cache.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use colibri_net::{EndPoint, NetBuffer};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Span, debug, debug_span};

use crate::codec;
use crate::config::RpcConfig;
use crate::error::{Result, RpcError, STATUS_NO_REPLY, STATUS_STALE};
use crate::machine::{Inner, MsgRecord, OutRef, Outbound, QItem};
use crate::stats::bump;
use crate::wire::{self, BulkDesc, FLAG_RESEND, ItemHeader, ItemKind};

/// A request handler (see [`RpcHandle::on`](crate::RpcHandle::on)).
pub(crate) type Handler = Arc<dyn Fn(Request, ReplyHandle) + Send + Sync>;

enum Cached {
    InProgress,
    Done(Vec<u8>),
}

struct SrvState {
    cache: HashMap<u64, Cached>,
    order: VecDeque<u64>,
    /// Highest xid evicted from the cache.
    evicted_max: u64,
    in_progress: usize,
    out: Outbound,
    last_active: Instant,
    closed: bool,
}

/// The server's view of one client session: where to reply, the replies
/// kept for resends, and the formation queue of replies.
pub(crate) struct SrvSession {
    id: u64,
    ep: EndPoint,
    span: Span,
    st: Mutex<SrvState>,
}

impl SrvSession {
    pub(crate) fn new(id: u64, ep: EndPoint) -> Arc<Self> {
        let span = debug_span!(
            "rpc_server_session",
            id = format_args!("{id:016x}"),
            peer = ep.addr()
        );
        {
            let _g = span.enter();
            debug!("new client session");
        }
        Arc::new(Self {
            id,
            ep,
            span,
            st: Mutex::new(SrvState {
                cache: HashMap::new(),
                order: VecDeque::new(),
                evicted_max: 0,
                in_progress: 0,
                out: Outbound::default(),
                last_active: Instant::now(),
                closed: false,
            }),
        })
    }

    pub(crate) fn key(&self) -> (u64, EndPoint) {
        (self.id, self.ep.clone())
    }

    /// Checks the reply cache for a request. Returns a reply handle when
    /// the request must be executed.
    pub(crate) fn begin(self: &Arc<Self>, m: &Arc<Inner>, h: &ItemHeader) -> Option<ReplyHandle> {
        let mut st = self.st.lock();
        if st.closed {
            return None;
        }
        // `last_active` is set when the reply is made: a request in
        // progress keeps the session anyway.
        match st.cache.get(&h.xid) {
            Some(Cached::InProgress) => {
                bump(&m.stats.duplicates, 1);
                return None;
            }
            Some(Cached::Done(bytes)) => {
                let now = Instant::now();
                bump(&m.stats.duplicates, 1);
                let _g = self.span.enter();
                debug!(xid = h.xid, "resent request answered from the reply cache");
                let bytes = bytes.clone();
                st.out.push(
                    QItem {
                        bytes,
                        call_xid: None,
                    },
                    now,
                );
                bump(&m.stats.replies, 1);
                drop(st);
                self.flush(m, false);
                return None;
            }
            None if h.flags & FLAG_RESEND != 0 && h.xid <= st.evicted_max => {
                let now = Instant::now();
                bump(&m.stats.stale, 1);
                let mut bytes = Vec::new();
                let rh = reply_header(h, STATUS_STALE);
                if wire::encode_item(&mut bytes, &rh, &[], &[]).is_ok() {
                    st.out.push(
                        QItem {
                            bytes,
                            call_xid: None,
                        },
                        now,
                    );
                }
                drop(st);
                self.flush(m, false);
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

    /// Records and sends a reply.
    fn reply(self: &Arc<Self>, m: &Arc<Inner>, bytes: Vec<u8>, xid: u64) {
        let now = Instant::now();
        {
            let mut st = self.st.lock();
            if st.closed {
                return;
            }
            st.in_progress = st.in_progress.saturating_sub(1);
            st.last_active = now;
            if let Some(e) = st.cache.get_mut(&xid) {
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
            st.out.push(
                QItem {
                    bytes,
                    call_xid: None,
                },
                now,
            );
            bump(&m.stats.replies, 1);
            let _ = m.flush(
                &OutRef::Server(Arc::clone(self)),
                &self.ep,
                &mut st.out,
                now,
            );
        }
    }

    pub(crate) fn flush(self: &Arc<Self>, m: &Arc<Inner>, force: bool) {
        let mut st = self.st.lock();
        if force {
            st.out.forced = true;
        }
        let _ = m.flush(
            &OutRef::Server(Arc::clone(self)),
            &self.ep,
            &mut st.out,
            Instant::now(),
        );
    }

    pub(crate) fn requeue(&self, _m: &Arc<Inner>, buf: NetBuffer, rec: MsgRecord, at: Instant) {
        let mut st = self.st.lock();
        st.out.in_flight = st.out.in_flight.saturating_sub(1);
        st.out.requeue(buf, rec, at);
    }

    pub(crate) fn sent_done(self: &Arc<Self>, m: &Arc<Inner>, err: Option<RpcError>) {
        let mut st = self.st.lock();
        st.out.in_flight = st.out.in_flight.saturating_sub(1);
        if let Some(e) = err {
            let _g = self.span.enter();
            debug!(error = %e, "reply message failed (the client resends or times out)");
            if e.peer_gone() {
                st.out.drain();
            }
        }
        if st.out.has_work() {
            let _ = m.flush(
                &OutRef::Server(Arc::clone(self)),
                &self.ep,
                &mut st.out,
                Instant::now(),
            );
        }
    }

    /// Flushes a delayed batch; returns when to come back and whether the
    /// session is idle long enough to be forgotten.
    pub(crate) fn timer_pass(
        self: &Arc<Self>,
        m: &Arc<Inner>,
        now: Instant,
    ) -> (Option<Instant>, bool) {
        let mut st = self.st.lock();
        let mi = m.cfg.max_in_flight;
        if st
            .out
            .deadline(m.cfg.batch_delay, mi)
            .is_some_and(|t| t <= now)
        {
            let _ = m.flush(
                &OutRef::Server(Arc::clone(self)),
                &self.ep,
                &mut st.out,
                now,
            );
        }
        let idle =
            st.in_progress == 0 && st.out.idle() && now >= st.last_active + m.cfg.session_idle;
        (st.out.deadline(m.cfg.batch_delay, mi), idle)
    }

    pub(crate) fn is_idle(&self, cfg: &RpcConfig, now: Instant) -> bool {
        let st = self.st.lock();
        st.in_progress == 0 && st.out.idle() && now >= st.last_active + cfg.session_idle
    }

    pub(crate) fn shutdown(&self) {
        let mut st = self.st.lock();
        st.closed = true;
        st.out.drain();
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
