//! Test harness: nodes (a domain with one started transfer machine and
//! event channels), buffer helpers, data patterns and a seeded PRNG.

use std::sync::Arc;
use std::time::Duration;

use colibri_net::{
    BufVec, BufferCallbacks, BufferEvent, Domain, DomainConfig, EndPoint, EventReceiver, NetBuffer,
    QueueType, TmEvent, TmEventKind, TmEventReceiver, TmState, TransferMachine, event_channel,
    tm_event_channel,
};

use crate::Factory;

/// How long a test waits for an event that must come.
pub const EVENT_WAIT: Duration = Duration::from_secs(20);
/// How long a test waits to be sure an event does not come.
pub const QUIET_WAIT: Duration = Duration::from_millis(150);

/// A domain with one transfer machine, and channels receiving all of its
/// buffer and transfer machine events.
pub struct Node {
    /// The domain.
    pub dom: Domain,
    /// The transfer machine.
    pub tm: TransferMachine,
    /// Its buffer events.
    pub events: EventReceiver,
    /// Its transfer machine events.
    pub tm_events: TmEventReceiver,
    /// Callbacks forwarding into `events`.
    pub cbs: Arc<BufferCallbacks>,
    /// Address it was (or will be) started at; the real one once started.
    pub addr: String,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).finish()
    }
}

impl Node {
    /// An initialised, not started node.
    pub fn init(f: &dyn Factory) -> Self {
        Self::init_with(f, DomainConfig::default())
    }

    /// An initialised, not started node whose domain has `cfg` (a manual
    /// clock, say).
    pub fn init_with(f: &dyn Factory, cfg: DomainConfig) -> Self {
        let dom = Domain::with_config(&*f.transport(), cfg).expect("domain init");
        let (tm_cb, tm_events) = tm_event_channel(1024);
        let tm = dom.tm_init(tm_cb).expect("tm init");
        let (cbs, events) = event_channel(4096);
        Self {
            dom,
            tm,
            events,
            tm_events,
            cbs,
            addr: f.addr(),
        }
    }

    /// A started node.
    pub fn start(f: &dyn Factory) -> Self {
        let mut n = Self::init(f);
        n.start_tm();
        n
    }

    /// Starts the transfer machine and waits for STARTED (and its event).
    pub fn start_tm(&mut self) {
        self.tm.start(&self.addr).expect("start");
        let ev = self.next_tm_event();
        match ev.kind {
            TmEventKind::StateChange {
                state: TmState::Started,
                status: Ok(()),
                ep: Some(ep),
            } => self.addr = ep.addr().to_string(),
            other => panic!("expected STARTED, got {other:?}"),
        }
    }

    /// A registered buffer of `size` bytes in one segment, with the node's
    /// callbacks.
    pub fn buf(&self, size: usize) -> NetBuffer {
        self.buf_vec(BufVec::new(1, size))
    }

    /// A registered buffer of the given segment sizes.
    pub fn buf_shaped(&self, segs: &[usize]) -> NetBuffer {
        self.buf_vec(BufVec::from_segments(
            segs.iter().map(|&n| vec![0u8; n]).collect(),
        ))
    }

    /// A registered buffer over `bv`.
    pub fn buf_vec(&self, bv: BufVec) -> NetBuffer {
        self.dom
            .register(bv)
            .expect("register")
            .with_callbacks(self.cbs.clone())
    }

    /// A registered buffer holding `data` (segments of `seg` bytes; 0 for
    /// one segment).
    pub fn buf_with(&self, data: &[u8], seg: usize) -> NetBuffer {
        let mut b = self.buf_vec(BufVec::with_len(data.len(), seg));
        b.bufvec_mut().copy_in(0, data).expect("fill");
        b
    }

    /// The next buffer event; panics if none comes in time.
    pub fn next_event(&self) -> BufferEvent {
        self.events.recv_timeout(EVENT_WAIT).unwrap_or_else(|e| {
            panic!(
                "no buffer event on {} within {EVENT_WAIT:?}: {e}",
                self.addr
            )
        })
    }

    /// The next buffer event of `queue`, asserting its queue.
    pub fn next_event_on(&self, queue: QueueType) -> BufferEvent {
        let ev = self.next_event();
        assert_eq!(ev.queue(), queue, "event on an unexpected queue: {ev:?}");
        ev
    }

    /// The next events of the given queues, in any arrival order (events of
    /// different buffers are not ordered with each other), returned in the
    /// order of `queues`.
    pub fn next_events(&self, queues: &[QueueType]) -> Vec<BufferEvent> {
        let mut got: Vec<Option<BufferEvent>> = queues.iter().map(|_| None).collect();
        for _ in 0..queues.len() {
            let ev = self.next_event();
            let slot = queues
                .iter()
                .zip(got.iter())
                .position(|(q, g)| *q == ev.queue() && g.is_none())
                .unwrap_or_else(|| panic!("unexpected event {ev:?}, waiting for {queues:?}"));
            got[slot] = Some(ev);
        }
        got.into_iter().flatten().collect()
    }

    /// The next transfer machine event; panics if none comes in time.
    pub fn next_tm_event(&self) -> TmEvent {
        self.tm_events
            .recv_timeout(EVENT_WAIT)
            .unwrap_or_else(|e| panic!("no tm event on {} within {EVENT_WAIT:?}: {e}", self.addr))
    }

    /// Asserts that no buffer event arrives for a short while.
    pub fn expect_quiet(&self) {
        if let Ok(ev) = self.events.recv_timeout(QUIET_WAIT) {
            panic!("unexpected buffer event: {ev:?}");
        }
    }

    /// An end point for `addr` in this node's transfer machine.
    pub fn ep(&self, addr: &str) -> EndPoint {
        self.tm.ep_create(addr).expect("ep_create")
    }

    /// Stops (with abort) and waits for STOPPED; returns the buffer events
    /// that came before STOPPED, which must all be final, and asserts the
    /// STOPPED event itself.
    pub fn stop(&self, abort: bool) -> Vec<BufferEvent> {
        self.tm.stop(abort).expect("stop");
        self.tm
            .wait_stopped(EVENT_WAIT)
            .expect("transfer machine did not stop");
        let mut stopped = false;
        while let Some(ev) = self.tm_events.try_recv() {
            if let TmEventKind::StateChange {
                state: TmState::Stopped,
                ..
            } = ev.kind
            {
                stopped = true;
            }
        }
        assert!(stopped, "no STOPPED event");
        let mut evs = Vec::new();
        while let Some(ev) = self.events.try_recv() {
            evs.push(ev);
        }
        evs
    }

    /// Stops if needed, finalises the transfer machine and the domain, and
    /// checks that nothing leaked: every buffer event is final and every
    /// buffer was deregistered.
    pub fn shutdown(self) {
        if matches!(
            self.tm.state(),
            TmState::Started | TmState::Starting | TmState::Initialized
        ) && (self.tm.state() != TmState::Initialized || self.tm.queued() > 0)
        {
            self.tm.stop(true).expect("stop");
        }
        if self.tm.state() != TmState::Initialized {
            self.tm.wait_stopped(EVENT_WAIT).expect("stopped");
        }
        while let Some(ev) = self.events.try_recv() {
            assert!(ev.is_final(), "retained event left over: {ev:?}");
        }
        if let Err(e) = self.tm.fini() {
            panic!("tm fini: {}", e.error);
        }
        if let Err(e) = self.dom.fini() {
            panic!("domain fini: {}", e.error);
        }
    }
}

/// A deterministic data pattern: byte `i` of pattern `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

/// A small seeded PRNG (splitmix64), so failures replay.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next value.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
