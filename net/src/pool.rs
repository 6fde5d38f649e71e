//! Buffer pools and receive-queue provisioning.
//!
//! The messaging layer leaves buffer management to the application; this module is
//! the help Motr gives its users (`m0_net_buffer_pool` and
//! `m0_net_tm_pool_attach`), built on the public API only:
//!
//! * [`BufferPool`]: registered buffers of one shape in one domain, handed
//!   out and taken back (most recently returned first, which keeps the
//!   memory warm in cache), grown with [`BufferPool::provision`] and
//!   shrunk with [`BufferPool::prune`], with a low-water callback.
//!   Buffers may be returned with a *colour* and asked for by colour
//!   (Motr's pool colours): a transfer machine given a colour
//!   ([`TmHandle::set_colour`]) gets back, through its provisioner, the
//!   buffers it last used, still warm in its CPU's cache.
//! * [`RecvProvisioner`]: keeps a transfer machine's MSG_RECV queue at a
//!   minimum length with buffers from a pool. Each buffer's final event
//!   goes to the application's callback and then, unless the callback
//!   took the buffer, back to the pool (with the machine's colour); the
//!   queue is topped up from the pool (the machine's colour first) after
//!   each such event, and, when the pool ran dry, as soon as a buffer is
//!   returned to it.
//!
//! Locks: the pool's lock is never held while calling into a transfer
//! machine or a user callback, so callbacks may use the pool and the
//! provisioner freely.
//!
//! ```
//! use std::time::Duration;
//! use colibri_bulk_mem::MemTransport;
//! use colibri_net::pool::{BufferPool, PoolConfig, RecvProvisioner};
//! use colibri_net::{Domain, RecvParams, TmState, ignore_tm_events};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let xprt = MemTransport::default();
//! let dom = Domain::new(&xprt)?;
//! let tm = dom.tm_init(ignore_tm_events())?;
//! let pool = BufferPool::new(&dom, PoolConfig::new(4096).initial(8))?;
//! // Eight receive buffers stay queued; each message goes to the closure,
//! // then its buffer returns to the pool and the queue is topped up.
//! let rx = RecvProvisioner::attach(&tm, &pool, RecvParams::default(), 8, |_tm, ev| {
//!     let _ = ev.message();
//! })?;
//! tm.start("127.0.0.1:4100:1")?;
//! tm.wait_for_state(TmState::Started, Duration::from_secs(5))?;
//! assert_eq!(rx.queued(), 8);
//! rx.detach();
//! tm.stop(true)?;
//! tm.wait_stopped(Duration::from_secs(5))?;
//! tm.fini().map_err(|e| e.error)?;
//! pool.fini().map_err(|e| e.error)?;
//! dom.fini().map_err(|e| e.error)?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tracing::{debug, warn};

use crate::buffer::{BufferCallbacks, BufferEvent, NetBuffer};
use crate::bufvec::BufVec;
use crate::domain::Domain;
use crate::error::{AddError, FiniError, NetError, Result};
use crate::queue::QueueType;
use crate::tm::{RecvParams, TmHandle};

/// The shape and sizing of a [`BufferPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Segments per buffer (at least 1).
    pub segments: usize,
    /// Bytes per segment (at least 1).
    pub segment_size: usize,
    /// Buffers registered when the pool is made.
    pub initial: usize,
    /// The low-water callback runs when a `get` leaves fewer free buffers
    /// than this.
    pub low_water: usize,
}

impl PoolConfig {
    /// Buffers of one segment of `size` bytes; none registered up front,
    /// no low-water mark.
    pub fn new(size: usize) -> Self {
        Self {
            segments: 1,
            segment_size: size,
            initial: 0,
            low_water: 0,
        }
    }

    /// Buffers of `segments` segments of `size` bytes each.
    #[must_use]
    pub fn segments(mut self, segments: usize, size: usize) -> Self {
        self.segments = segments;
        self.segment_size = size;
        self
    }

    /// Registers `n` buffers when the pool is made.
    #[must_use]
    pub fn initial(mut self, n: usize) -> Self {
        self.initial = n;
        self
    }

    /// Sets the low-water mark.
    #[must_use]
    pub fn low_water(mut self, n: usize) -> Self {
        self.low_water = n;
        self
    }
}

/// What the low-water callback is.
pub type LowWater = dyn Fn(&BufferPool) + Send + Sync;

/// No colour (Motr's `M0_BUFFER_ANY_COLOUR`): a buffer returned with it
/// belongs to nobody in particular, and a `get` with it takes the most
/// recently returned such buffer, or else the one returned longest ago.
pub const ANY_COLOUR: u32 = u32::MAX;

/// A free item where a `get` finds it: its place in [`FreeList::slots`]
/// and the sequence number it was returned with (an entry whose slot holds
/// another number, or nothing, is stale).
type Mark = (usize, u64);

/// The pool's free buffers, by colour and by age (generic so that the
/// rules can be tested without a transport).
struct FreeList<T> {
    /// The free items, each with the sequence number of its return;
    /// `None` where an item was taken (the place is reused).
    slots: Vec<Option<(T, u64)>>,
    vacant: Vec<usize>,
    /// Free items in the order they came back, oldest first.
    lru: std::collections::VecDeque<Mark>,
    /// Free items by the colour they came back with ([`ANY_COLOUR`] for
    /// none), most recent last.
    stacks: std::collections::HashMap<u32, Vec<Mark>>,
    /// Live entries of `slots`.
    len: usize,
    seq: u64,
}

impl<T> FreeList<T> {
    fn new() -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            lru: std::collections::VecDeque::new(),
            stacks: std::collections::HashMap::new(),
            len: 0,
            seq: 0,
        }
    }

    fn push(&mut self, item: T, colour: u32) {
        self.seq += 1;
        let seq = self.seq;
        let i = match self.vacant.pop() {
            Some(i) => {
                self.slots[i] = Some((item, seq));
                i
            }
            None => {
                self.slots.push(Some((item, seq)));
                self.slots.len() - 1
            }
        };
        self.lru.push_back((i, seq));
        self.stacks.entry(colour).or_default().push((i, seq));
        self.len += 1;
        // Entries of taken items linger in the lists they were not taken
        // from; drop them once they outnumber the live ones.
        if self.lru.len() > 2 * self.len + 32 {
            self.compact();
        }
    }

    fn live(&self, (i, seq): Mark) -> bool {
        matches!(self.slots.get(i), Some(Some((_, s))) if *s == seq)
    }

    fn take(&mut self, (i, _): Mark) -> Option<T> {
        let (item, _) = self.slots.get_mut(i)?.take()?;
        self.vacant.push(i);
        self.len -= 1;
        Some(item)
    }

    /// The most recent live entry of `colour`'s stack.
    fn pop_colour(&mut self, colour: u32) -> Option<T> {
        loop {
            let m = self.stacks.get_mut(&colour)?.pop()?;
            if self.live(m) {
                return self.take(m);
            }
        }
    }

    /// The item returned longest ago.
    fn pop_oldest(&mut self) -> Option<T> {
        loop {
            let m = self.lru.pop_front()?;
            if self.live(m) {
                return self.take(m);
            }
        }
    }

    /// Motr's `m0_net_buffer_pool_get`: the colour's most recent item,
    /// else the most recent one without a colour, else the oldest (so that
    /// other colours keep their warm buffers as long as they can).
    fn pop(&mut self, colour: u32) -> Option<T> {
        if colour != ANY_COLOUR
            && let Some(b) = self.pop_colour(colour)
        {
            return Some(b);
        }
        self.pop_colour(ANY_COLOUR).or_else(|| self.pop_oldest())
    }

    fn compact(&mut self) {
        let slots = &self.slots;
        let live = |&(i, seq): &Mark| matches!(slots.get(i), Some(Some((_, s))) if *s == seq);
        self.lru.retain(live);
        self.stacks.retain(|_, v| {
            v.retain(live);
            !v.is_empty()
        });
    }
}

struct PoolState {
    free: FreeList<NetBuffer>,
    total: usize,
    /// Provisioners short of buffers, topped up when one comes back.
    waiters: Vec<Weak<ProvShared>>,
}

struct PoolShared {
    /// Shares the application's domain (not a second domain: the pool's
    /// buffers count in its `buffer_count`, so it cannot be finalised
    /// before the pool).
    dom: Domain,
    cfg: PoolConfig,
    st: Mutex<PoolState>,
    on_low: Mutex<Option<Arc<LowWater>>>,
    /// Set while the low-water callback runs: a `get` it causes (its
    /// `provision` tops up waiting provisioners) does not call it again.
    in_low: AtomicBool,
}

/// Registered buffers of one shape in one domain, handed out and taken
/// back. Clones share the pool.
#[derive(Clone)]
pub struct BufferPool {
    sh: Arc<PoolShared>,
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.sh.st.lock();
        f.debug_struct("BufferPool")
            .field("size", &self.buffer_size())
            .field("free", &st.free.len)
            .field("total", &st.total)
            .finish()
    }
}

impl BufferPool {
    /// Makes a pool in `dom` and registers `cfg.initial` buffers.
    ///
    /// # Errors
    /// `InvalidArgument` for a zero shape; `TooBig` for a shape beyond the
    /// transport's limits; the transport's registration failure.
    pub fn new(dom: &Domain, cfg: PoolConfig) -> Result<Self> {
        if cfg.segments == 0 || cfg.segment_size == 0 {
            return Err(NetError::InvalidArgument(
                "a pool's buffers need at least one segment of at least one byte".into(),
            ));
        }
        let pool = Self {
            sh: Arc::new(PoolShared {
                dom: Domain {
                    inner: Arc::clone(&dom.inner),
                },
                cfg,
                st: Mutex::new(PoolState {
                    free: FreeList::new(),
                    total: 0,
                    waiters: Vec::new(),
                }),
                on_low: Mutex::new(None),
                in_low: AtomicBool::new(false),
            }),
        };
        pool.provision(cfg.initial)?;
        Ok(pool)
    }

    /// Bytes per buffer.
    pub fn buffer_size(&self) -> usize {
        self.sh.cfg.segments * self.sh.cfg.segment_size
    }

    /// The domain's id.
    pub fn domain_id(&self) -> u64 {
        self.sh.dom.id()
    }

    /// Free buffers.
    pub fn free(&self) -> usize {
        self.sh.st.lock().free.len
    }

    /// Buffers registered by the pool and not pruned (free or handed out).
    pub fn total(&self) -> usize {
        self.sh.st.lock().total
    }

    /// Sets the callback that runs (on the thread calling `get`, without
    /// the pool's lock) when a `get` leaves fewer than `low_water` free
    /// buffers; it may call [`BufferPool::provision`]. It does not run
    /// again while it runs (on any thread).
    pub fn on_low_water(&self, f: impl Fn(&BufferPool) + Send + Sync + 'static) {
        *self.sh.on_low.lock() = Some(Arc::new(f));
    }

    /// Registers `n` more buffers. Returns how many were added (all `n`
    /// unless an error stops it).
    ///
    /// # Errors
    /// The first registration failure (buffers registered before it stay
    /// in the pool).
    pub fn provision(&self, n: usize) -> Result<usize> {
        let cfg = self.sh.cfg;
        if n > 0 && self.sh.dom.inner.is_finalized() {
            return Err(NetError::InvalidArgument(
                "the pool's domain was finalised".into(),
            ));
        }
        for i in 0..n {
            let buf = match self
                .sh
                .dom
                .register(BufVec::new(cfg.segments, cfg.segment_size))
            {
                Ok(b) => b,
                Err(e) if i == 0 => return Err(e.error),
                Err(e) => {
                    warn!(added = i, error = %e.error, "pool provisioning stopped");
                    return Ok(i);
                }
            };
            self.sh.st.lock().total += 1;
            self.give_back(buf, ANY_COLOUR);
        }
        Ok(n)
    }

    /// Takes a free buffer (the most recently returned), or `None` when
    /// the pool is empty. It carries no callbacks and no timeout. Once
    /// buffers come back with colours, this is
    /// [`get_coloured`](Self::get_coloured) with [`ANY_COLOUR`].
    pub fn get(&self) -> Option<NetBuffer> {
        self.get_coloured(ANY_COLOUR)
    }

    /// Takes a free buffer, preferring those returned with `colour`
    /// (Motr's `m0_net_buffer_pool_get`): the most recently returned
    /// buffer of that colour, else the most recently returned one without
    /// a colour, else the one returned longest ago (the coldest of other
    /// colours'). Any `u32` is a colour; [`ANY_COLOUR`] asks for none.
    pub fn get_coloured(&self, colour: u32) -> Option<NetBuffer> {
        let (buf, low) = {
            let mut st = self.sh.st.lock();
            let buf = st.free.pop(colour);
            (buf, st.free.len < self.sh.cfg.low_water)
        };
        if low && !self.sh.in_low.swap(true, Ordering::SeqCst) {
            let f = self.sh.on_low.lock().clone();
            if let Some(f) = f {
                f(self);
            }
            self.sh.in_low.store(false, Ordering::SeqCst);
        }
        buf
    }

    /// Returns a buffer taken from this pool, without a colour. Waiting
    /// provisioners are topped up.
    ///
    /// # Errors
    /// An [`AddError`] with `InvalidArgument` and the buffer handed back,
    /// for a buffer of another domain or of another size (one that does not
    /// come from this pool).
    pub fn put(&self, buf: NetBuffer) -> std::result::Result<(), AddError> {
        self.put_coloured(buf, ANY_COLOUR)
    }

    /// Returns a buffer taken from this pool with `colour` (Motr's
    /// `m0_net_buffer_pool_put`): a later `get_coloured(colour)` takes it
    /// before any other. Waiting provisioners are topped up.
    ///
    /// # Errors
    /// As [`put`](Self::put).
    pub fn put_coloured(&self, buf: NetBuffer, colour: u32) -> std::result::Result<(), AddError> {
        if buf.domain_id() != self.domain_id() || buf.len() != self.buffer_size() {
            let e = NetError::InvalidArgument(format!(
                "a buffer of {} bytes in domain {} does not belong to this pool ({} bytes, domain {})",
                buf.len(),
                buf.domain_id(),
                self.buffer_size(),
                self.domain_id()
            ));
            return Err(AddError {
                error: e,
                buffer: buf,
            });
        }
        self.give_back(buf, colour);
        Ok(())
    }

    fn give_back(&self, mut buf: NetBuffer, colour: u32) {
        buf.clear_for_pool();
        let waiters = {
            let mut st = self.sh.st.lock();
            st.free.push(buf, colour);
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            if let Some(p) = w.upgrade() {
                p.fill();
            }
        }
    }

    /// Deregisters free buffers beyond `keep`, those returned longest ago
    /// first. Returns how many went.
    pub fn prune(&self, keep: usize) -> usize {
        let gone: Vec<NetBuffer> = {
            let mut st = self.sh.st.lock();
            let n = st.free.len.saturating_sub(keep);
            let gone: Vec<NetBuffer> = (0..n).map_while(|_| st.free.pop_oldest()).collect();
            st.total -= gone.len();
            st.free.compact();
            gone
        };
        let n = gone.len();
        for b in gone {
            drop(b.deregister());
        }
        n
    }

    /// Deregisters every buffer and lets go of the domain.
    ///
    /// # Errors
    /// `Busy`, with the pool back, while buffers are handed out.
    pub fn fini(self) -> std::result::Result<(), FiniError<Self>> {
        let out = {
            let st = self.sh.st.lock();
            st.total - st.free.len
        };
        if out > 0 {
            return Err(FiniError {
                error: NetError::Busy(format!("{out} pool buffer(s) still handed out")),
                object: self,
            });
        }
        self.prune(0);
        Ok(())
    }

    fn wait_for_buffer(&self, p: &Arc<ProvShared>) -> bool {
        let mut st = self.sh.st.lock();
        if st.free.len > 0 {
            return false;
        }
        st.waiters.retain(|w| w.strong_count() > 0);
        if !st.waiters.iter().any(|w| w.as_ptr() == Arc::as_ptr(p)) {
            st.waiters.push(Arc::downgrade(p));
        }
        true
    }
}

/// What the application's receive callback is.
pub type RecvCallback = dyn Fn(&TmHandle, &mut BufferEvent) + Send + Sync;

struct ProvShared {
    pool: BufferPool,
    tm: TmHandle,
    params: RecvParams,
    min: AtomicUsize,
    /// Buffers this provisioner added that have not had their final event.
    queued: AtomicUsize,
    detached: AtomicBool,
    cbs: Mutex<Option<Arc<BufferCallbacks>>>,
}

impl ProvShared {
    /// Adds pool buffers until `min` are queued, the pool is empty (then
    /// waits for a buffer to come back) or the transfer machine refuses.
    fn fill(self: &Arc<Self>) {
        loop {
            if self.detached.load(Ordering::SeqCst) {
                return;
            }
            // Reserve a slot first, so that concurrent fills never queue
            // more than `min`.
            let min = self.min.load(Ordering::SeqCst);
            let reserved = self
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                    (q < min).then_some(q + 1)
                })
                .is_ok();
            if !reserved {
                return;
            }
            let colour = self.tm.colour();
            let Some(mut buf) = self.pool.get_coloured(colour) else {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                if self.pool.wait_for_buffer(self) {
                    return;
                }
                // A buffer came back meanwhile: try again.
                continue;
            };
            let Some(cbs) = self.cbs.lock().clone() else {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                let _ = self.pool.put_coloured(buf, colour);
                return;
            };
            buf.set_callbacks(cbs);
            if let Err(e) = self.tm.add_msg_recv(buf, self.params) {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                debug!(error = %e.error, "receive provisioning stopped: the transfer machine refused a buffer");
                let _ = self.pool.put_coloured(e.buffer, colour);
                return;
            }
        }
    }
}

/// Keeps a transfer machine's MSG_RECV queue stocked from a
/// [`BufferPool`] (Motr's `m0_net_tm_pool_attach`).
///
/// The queue is topped up when a buffer's final event arrives, before the
/// application's callback runs, so a message arriving during a slow
/// callback finds a buffer (when the pool has one to spare).
///
/// Dropping it (or [`RecvProvisioner::detach`]) stops the topping up;
/// buffers already queued stay queued, and still return to the pool after
/// their final event (a stop with abort cancels them). Forgetting to keep
/// it is a warning (an error where warnings are):
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// use colibri_bulk_mem::MemTransport;
/// use colibri_net::pool::{BufferPool, PoolConfig, RecvProvisioner};
/// use colibri_net::{Domain, RecvParams, ignore_tm_events};
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let xprt = MemTransport::default();
///     let dom = Domain::new(&xprt)?;
///     let tm = dom.tm_init(ignore_tm_events())?;
///     let pool = BufferPool::new(&dom, PoolConfig::new(4096).initial(8))?;
///     // Dropped at once: the server would stop serving after 8 messages.
///     RecvProvisioner::attach(&tm, &pool, RecvParams::default(), 8, |_tm, _ev| {})?;
///     Ok(())
/// }
/// ```
#[must_use = "dropping a RecvProvisioner stops topping the receive queue up: keep it"]
pub struct RecvProvisioner {
    sh: Arc<ProvShared>,
}

impl fmt::Debug for RecvProvisioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvProvisioner")
            .field("queued", &self.queued())
            .field("min", &self.sh.min.load(Ordering::Relaxed))
            .finish()
    }
}

impl RecvProvisioner {
    /// Attaches `pool` to `tm`'s MSG_RECV queue and queues `min` buffers
    /// (as many as the pool has; the rest as buffers come back). The
    /// transfer machine may be initialised or started. `on_msg` receives
    /// every MSG_RECV event of these buffers (messages and failures); it
    /// may take the buffer out of a final event, which then does not return
    /// to the pool until the application puts it back.
    ///
    /// # Errors
    /// `InvalidArgument` for a pool of another domain or `min` zero; the
    /// transfer machine's refusal of the first buffer (wrong state).
    pub fn attach(
        tm: &TmHandle,
        pool: &BufferPool,
        params: RecvParams,
        min: usize,
        on_msg: impl Fn(&TmHandle, &mut BufferEvent) + Send + Sync + 'static,
    ) -> Result<Self> {
        if pool.domain_id() != tm.domain_id() {
            return Err(NetError::InvalidArgument(
                "the pool belongs to another domain than the transfer machine".into(),
            ));
        }
        if min == 0 {
            return Err(NetError::InvalidArgument(
                "a receive queue minimum of zero buffers".into(),
            ));
        }
        let sh = Arc::new(ProvShared {
            pool: pool.clone(),
            tm: tm.clone(),
            params,
            min: AtomicUsize::new(min),
            queued: AtomicUsize::new(0),
            detached: AtomicBool::new(false),
            cbs: Mutex::new(None),
        });
        let weak = Arc::downgrade(&sh);
        let pool2 = pool.clone();
        let on_msg: Arc<RecvCallback> = Arc::new(on_msg);
        let cbs = Arc::new(BufferCallbacks::new().on(
            QueueType::MsgRecv,
            move |tm: &TmHandle, mut ev: BufferEvent| {
                if ev.is_final()
                    && let Some(p) = weak.upgrade()
                {
                    // Top the queue up before the application's callback
                    // runs (as Motr's tm_provision does): a message that
                    // arrives while it works finds a buffer.
                    p.queued.fetch_sub(1, Ordering::SeqCst);
                    p.fill();
                }
                on_msg(tm, &mut ev);
                if !ev.is_final() {
                    return;
                }
                // Unless the application took it, the buffer goes back to
                // the pool with the machine's colour (which tops up a
                // provisioner waiting for one).
                if let Some(b) = ev.take_buffer() {
                    let _ = pool2.put_coloured(b, tm.colour());
                }
            },
        ));
        *sh.cbs.lock() = Some(cbs);
        // Refuse at once if the transfer machine takes no receive buffer.
        if let Some(mut buf) = pool.get_coloured(tm.colour()) {
            buf.set_callbacks(sh.cbs.lock().clone().expect("set above"));
            sh.queued.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = tm.add_msg_recv(buf, params) {
                sh.queued.fetch_sub(1, Ordering::SeqCst);
                let _ = pool.put_coloured(e.buffer, tm.colour());
                return Err(e.error);
            }
        }
        sh.fill();
        Ok(Self { sh })
    }

    /// Buffers queued by this provisioner that have not had their final
    /// event.
    pub fn queued(&self) -> usize {
        self.sh.queued.load(Ordering::SeqCst)
    }

    /// Changes the minimum queue length (at least 1); a higher one is
    /// filled at once. A lower one lets the queue shrink as buffers
    /// complete.
    pub fn set_min(&self, min: usize) {
        self.sh.min.store(min.max(1), Ordering::SeqCst);
        self.sh.fill();
    }

    /// Stops topping up. Buffers still queued return to the pool after
    /// their final event.
    pub fn detach(&self) {
        self.sh.detached.store(true, Ordering::SeqCst);
    }
}

impl Drop for RecvProvisioner {
    fn drop(&mut self) {
        self.detach();
    }
}

#[cfg(test)]
mod tests {
    use super::{ANY_COLOUR, FreeList};
    use proptest::prelude::*;

    /// The rules, the slow way: the free items in the order they came
    /// back, each with its colour.
    #[derive(Default)]
    struct Model(Vec<(u32, u32)>);

    impl Model {
        fn pop(&mut self, colour: u32) -> Option<u32> {
            let last_of = |c: u32, v: &Vec<(u32, u32)>| v.iter().rposition(|&(_, x)| x == c);
            let at = (colour != ANY_COLOUR)
                .then(|| last_of(colour, &self.0))
                .flatten()
                .or_else(|| last_of(ANY_COLOUR, &self.0))
                .or((!self.0.is_empty()).then_some(0))?;
            Some(self.0.remove(at).0)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u32),
        Get(u32),
        PruneOldest,
    }

    fn colour() -> impl Strategy<Value = u32> {
        prop_oneof![Just(ANY_COLOUR), 0u32..4]
    }

    proptest! {
        /// Whatever the order of puts and gets by colour, the free list
        /// hands out what the rules say, and its count stays true.
        #[test]
        fn free_list_follows_the_colour_rules(ops in proptest::collection::vec(
            prop_oneof![
                3 => colour().prop_map(Op::Put),
                3 => colour().prop_map(Op::Get),
                1 => Just(Op::PruneOldest),
            ],
            0..300,
        )) {
            let mut list = FreeList::new();
            let mut model = Model::default();
            let mut out: Vec<u32> = (0..40).collect();
            for op in ops {
                match op {
                    Op::Put(c) => {
                        if let Some(item) = out.pop() {
                            list.push(item, c);
                            model.0.push((item, c));
                            // A push sweeps stale entries once they
                            // outnumber the live ones (takes only leave
                            // them, bounded by the last sweep).
                            prop_assert!(list.lru.len() <= 2 * list.len + 32);
                        }
                    }
                    Op::Get(c) => {
                        let got = list.pop(c);
                        prop_assert_eq!(got, model.pop(c));
                        out.extend(got);
                    }
                    Op::PruneOldest => {
                        let got = list.pop_oldest();
                        let want = (!model.0.is_empty()).then(|| model.0.remove(0).0);
                        prop_assert_eq!(got, want);
                        out.extend(got);
                    }
                }
                prop_assert_eq!(list.len, model.0.len());
            }
        }
    }
}
