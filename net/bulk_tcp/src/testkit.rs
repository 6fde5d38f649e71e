//! An in-process setup for the protocol without sockets: real colibri-net
//! transfer machines on a fake transport that records what the core hands
//! it, a [`Directory`] of them, and byte movers that write a [`Proto`]'s
//! frames the way the I/O layer does (from the registered buffers) and
//! feed them to another. Used by the protocol's unit tests and by the
//! fuzzing entry points.

use std::sync::Arc;
use std::time::{Duration, Instant};

use colibri_net::xprt::{
    Caps, DelReason, Delivery, EpAddr, QueuedBuf, TmSink, Transport, XprtDomain, XprtTm,
};
use colibri_net::{
    BufToken, Clock, Domain, DomainConfig, NetError, Result, TmId, TmState, TransferMachine,
    ignore_tm_events,
};
use parking_lot::Mutex;

use crate::addr::TcpAddr;
use crate::proto::{Directory, Machine, Proto, ProtoConfig};
use crate::wire::{HEADER_LEN, Header};
use crate::{TCP_TRANSPORT_ID, TcpConfig};

/// What the fake transport was handed by the core.
#[derive(Debug, Default)]
struct Script {
    sink: Option<TmSink>,
    /// Every buffer added, in order.
    queued: Vec<QueuedBuf>,
    /// Deletions of buffers in use the core asked for.
    dels: Vec<(QueuedBuf, DelReason)>,
    /// The core's deliveries, run by [`Node::pump`].
    deliveries: Vec<Delivery>,
}

/// A transport that does nothing itself: the test plays the I/O thread.
#[derive(Debug, Clone, Default)]
struct Fake {
    script: Arc<Mutex<Script>>,
}

impl Transport for Fake {
    fn name(&self) -> &'static str {
        "tcp-fake"
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(self.clone()))
    }
}

impl XprtDomain for Fake {
    fn name(&self) -> &'static str {
        "tcp-fake"
    }

    fn limits(&self) -> colibri_net::xprt::Limits {
        TcpConfig::default().limits
    }

    fn caps(&self) -> Caps {
        // The real transport's id, so that its descriptors pass the
        // protocol's check.
        Caps::new(TCP_TRANSPORT_ID)
            .with_multi_message()
            .with_timeouts()
    }

    fn tm_init(&self, _tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        self.script.lock().sink = Some(sink);
        Ok(Box::new(self.clone()))
    }
}

impl XprtTm for Fake {
    fn start(&self, _addr: &str) -> Result<()> {
        Ok(())
    }

    fn stop(&self, _abort: bool) -> Result<()> {
        Ok(())
    }

    fn fini(&self) {}

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        crate::addr::ep_addr(addr)
    }

    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        self.script.lock().queued.push(buf.clone());
        Ok(())
    }

    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        self.script.lock().dels.push((buf.clone(), reason));
    }

    fn deliver(&self, delivery: Delivery) {
        self.script.lock().deliveries.push(delivery);
    }
}

/// A transfer machine as the protocol sees it, recording every completion
/// the protocol makes (the core would hide a second one).
#[derive(Debug)]
pub(crate) struct TestTm {
    sink: TmSink,
    own: TcpAddr,
    completions: Mutex<Vec<(BufToken, Result<usize>)>>,
}

impl TestTm {
    /// How many times the protocol completed the buffer of `token`.
    #[cfg(test)]
    pub(crate) fn completions_of(&self, token: BufToken) -> usize {
        self.completions
            .lock()
            .iter()
            .filter(|(t, _)| *t == token)
            .count()
    }

    /// Takes the completions recorded so far.
    pub(crate) fn take_completions(&self) -> Vec<(BufToken, Result<usize>)> {
        std::mem::take(&mut *self.completions.lock())
    }
}

impl Machine for TestTm {
    fn sink(&self) -> &TmSink {
        &self.sink
    }

    fn own(&self) -> Option<TcpAddr> {
        Some(self.own)
    }

    fn complete(&self, q: &QueuedBuf, status: Result<usize>) {
        self.completions.lock().push((q.token(), status.clone()));
        self.sink.complete(q, status);
    }

    fn complete_deferred(&self, q: &QueuedBuf, status: Result<usize>) -> Delivery {
        self.completions.lock().push((q.token(), status.clone()));
        self.sink.complete_deferred(q, status)
    }
}

/// A started transfer machine of the fake transport, in its own domain.
#[derive(Debug)]
pub(crate) struct Node {
    fake: Fake,
    /// The transfer machine.
    pub(crate) tm: TransferMachine,
    /// Its domain (for registering buffers).
    pub(crate) dom: Domain,
    /// The protocol's view of it.
    pub(crate) m: Arc<TestTm>,
    /// Its address.
    pub(crate) addr: TcpAddr,
}

impl Node {
    /// A transfer machine started at `addr` (nothing listens: no socket is
    /// involved), timing its buffers on `clock`.
    pub(crate) fn new(addr: &str, clock: Clock) -> Self {
        let fake = Fake::default();
        let dom = Domain::with_config(&fake, DomainConfig::default().with_clock(clock))
            .expect("fake domain");
        let tm = dom
            .tm_init(ignore_tm_events())
            .expect("fake transfer machine");
        let addr = TcpAddr::parse(addr).expect("a TCP address");
        tm.start(&addr.to_string()).expect("start");
        let sink = fake.script.lock().sink.clone().expect("initialised");
        sink.post_started(&addr.to_string());
        assert_eq!(tm.state(), TmState::Started);
        let m = Arc::new(TestTm {
            sink,
            own: addr,
            completions: Mutex::new(Vec::new()),
        });
        Self {
            fake,
            tm,
            dom,
            m,
            addr,
        }
    }

    /// The transport's view of the buffer added last.
    pub(crate) fn last_added(&self) -> QueuedBuf {
        self.fake
            .script
            .lock()
            .queued
            .last()
            .cloned()
            .expect("a buffer was added")
    }

    /// Marks the buffer added last in use and queues its operation on `p`,
    /// as the I/O thread does for a send or an active buffer.
    pub(crate) fn start_last(&self, p: &mut Proto<TestTm>) -> QueuedBuf {
        let q = self.last_added();
        assert!(self.m.sink.begin_use(&q), "buffer available");
        let plan = crate::proto::plan(&q).expect("a plan");
        p.start(Arc::clone(&self.m), q.clone(), self.addr, plan);
        q
    }

    /// Deletions of buffers in use the core asked for since the last call.
    pub(crate) fn take_dels(&self) -> Vec<(QueuedBuf, DelReason)> {
        std::mem::take(&mut self.fake.script.lock().dels)
    }

    /// How many buffers still queued the transport is using (and forgets
    /// the ones that left the queue).
    pub(crate) fn in_use(&self) -> usize {
        let queued = std::mem::take(&mut self.fake.script.lock().queued);
        // Looked up with the script unlocked: the core calls the fake
        // transport with its lock held.
        let live: Vec<QueuedBuf> = queued
            .into_iter()
            .filter(|q| self.m.sink.lookup(q.token()).is_some())
            .collect();
        let n = live.iter().filter(|q| q.is_in_use()).count();
        let mut s = self.fake.script.lock();
        let added_since = std::mem::take(&mut s.queued);
        s.queued = live;
        s.queued.extend(added_since);
        n
    }

    /// Runs the core's deliveries (callbacks of buffers the core completed
    /// itself), as the transport's thread would; returns how many ran.
    pub(crate) fn pump(&self) -> usize {
        let mut n = 0;
        loop {
            let ds = std::mem::take(&mut self.fake.script.lock().deliveries);
            if ds.is_empty() {
                return n;
            }
            n += ds.len();
            for d in ds {
                d.run();
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Stop with abort, completing what the core asks to end as a
        // transport would, so that dropping the transfer machine does not
        // wait for a STOPPED nobody delivers.
        if self.tm.state() == TmState::Started {
            let _ = self.tm.stop(true);
        }
        for _ in 0..100 {
            for (q, _) in self.take_dels() {
                self.m.sink.complete(&q, Err(NetError::Cancelled));
            }
            self.pump();
            if self.tm.state() == TmState::Stopped {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The transfer machines requests may be for.
#[derive(Debug, Default)]
pub(crate) struct Dir(pub(crate) Vec<Arc<TestTm>>);

impl Directory<TestTm> for Dir {
    fn machine(&self, addr: &TcpAddr) -> Option<Arc<TestTm>> {
        self.0.iter().find(|m| m.own == *addr).cloned()
    }
}

/// The protocol configuration of the tests: small chunks, the default
/// limits.
pub(crate) fn config(chunk: usize) -> ProtoConfig {
    ProtoConfig::new(&TcpConfig {
        chunk,
        ..TcpConfig::default()
    })
}

/// An accepted connection on `local`'s listener.
pub(crate) fn accepted(cfg: ProtoConfig, local: TcpAddr, now: Instant) -> Proto<TestTm> {
    Proto::accepted(0, cfg, local.sock(), now)
}

/// An established outgoing connection.
pub(crate) fn connected(cfg: ProtoConfig, now: Instant) -> Proto<TestTm> {
    let mut p = Proto::connecting(1, cfg, now, now + Duration::from_secs(5));
    p.set_connected();
    p
}

/// Writes at most `limit` bytes of what `p` has to write, as one vectored
/// write from the registered buffers would, and returns them.
///
/// # Errors
/// A buffer's memory is gone (handed back while its frame was queued).
pub(crate) fn take_output<M: Machine>(
    p: &mut Proto<M>,
    limit: usize,
    now: Instant,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for o in p.to_write() {
        if out.len() >= limit {
            break;
        }
        let mem = match o.buf() {
            Some(q) => Some(q.data().ok_or(NetError::Cancelled)?),
            None => None,
        };
        let mut iov = Vec::new();
        o.slices(mem.as_deref(), &mut iov)?;
        for s in &iov {
            out.extend_from_slice(s);
        }
    }
    out.truncate(limit);
    if !out.is_empty() {
        p.written(out.len(), now);
    }
    Ok(out)
}

/// Splits a byte stream into frames: each header and its body. Panics on
/// anything the protocol should never write (a header that does not
/// decode, a truncated frame).
pub(crate) fn frames(mut bytes: &[u8]) -> Vec<(Header, Vec<u8>)> {
    let mut v = Vec::new();
    while !bytes.is_empty() {
        let h = Header::decode(bytes, u32::MAX).expect("the protocol writes valid headers");
        let end = HEADER_LEN + h.body_len as usize;
        assert!(bytes.len() >= end, "truncated frame {h:?}");
        v.push((h, bytes[HEADER_LEN..end].to_vec()));
        bytes = &bytes[end..];
    }
    v
}
