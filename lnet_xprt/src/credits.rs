//! Credits: per peer NI, per NI, per router peer, and the router buffer pools
//! (seed 004, lnet.md sections 5 and 6.5).
//!
//! A [`CreditQueue`] is a counter that starts at its maximum. Taking a credit
//! decrements it; at or above zero the item may go, below zero it waits in a
//! **strictly FIFO** queue. Returning a credit increments it and, while the
//! counter is still `<= 0`, hands the head of the queue its credit. So
//! `credits < 0` exactly when items wait, and `-credits` of them do (the one
//! exception: right after [`CreditQueue::resize`] lowered the maximum below
//! what is out, the counter is negative with nothing waiting until enough
//! credits come back). The lowest value ever seen is kept (`min`, negative =
//! something had to wait).
//!
//! On top of it:
//! - [`TxCredits`]: a message being sent takes a **peer NI** credit (default
//!   8 per peer NI) and then an **NI** credit (default 256 per local NI), in
//!   that order, as Lustre does; [`TxCredits::send`] and
//!   [`TxCredits::complete`] return the messages that now hold both and can
//!   be handed to the LND.
//! - [`RouterCredits`]: a message a router forwards takes a **router credit**
//!   of the peer it came from (`peer_buffer_credits`, 0 = same as
//!   `peer_credits`) and then a buffer from the **tiny** (no payload),
//!   **small** (≤ 4 KiB) or **large** (≤ 1 MiB) pool (default 2048, 16384 and
//!   1024 buffers).
//!
//! Everything is generic over the queued item, so the node queues its own
//! message type. Nothing here does I/O.

use std::collections::{BTreeMap, VecDeque};

use crate::ids::{Net, Nid};
use crate::nidmap::{NidMap, nid_map, sorted_keys};

/// `DEFAULT_PEER_CREDITS`: credits per peer NI.
pub const DEFAULT_PEER_CREDITS: u32 = 8;
/// `DEFAULT_CREDITS`: credits per local NI.
pub const DEFAULT_NI_CREDITS: u32 = 256;
/// Default number of tiny router buffers (`LNET_NRB_TINY`).
pub const DEFAULT_TINY_BUFFERS: u32 = 2048;
/// Default number of small router buffers (`LNET_NRB_SMALL`).
pub const DEFAULT_SMALL_BUFFERS: u32 = 16384;
/// Default number of large router buffers (`LNET_NRB_LARGE`).
pub const DEFAULT_LARGE_BUFFERS: u32 = 1024;
/// Page size the router pools are measured in.
pub const PAGE_SIZE: u32 = 4096;
/// `LNET_MTU`: the largest payload (1 MiB, 256 pages).
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// Wire header size counted in queued bytes (`lpni_txqnob`).
const HEADER_BYTES: u64 = 72;

/// Misuse of credit queues.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// A queue needs at least one credit.
    #[error("a credit queue needs at least one credit")]
    ZeroCredits,
    /// More credits returned than were taken.
    #[error("credit returned that was never taken")]
    Overflow,
    /// No queue for this NI / peer NI / peer.
    #[error("no credit queue for {0}")]
    Unknown(Nid),
    /// A payload larger than the largest router buffer (1 MiB).
    #[error("payload of {0} bytes exceeds the 1 MiB maximum")]
    TooLarge(u32),
}

/// Outcome of [`CreditQueue::acquire`].
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Acquire<T> {
    /// A credit was available: the item may proceed.
    Granted(T),
    /// No credit: the item waits in the queue.
    Queued,
}

/// A credit counter with a strictly FIFO wait queue.
#[derive(Clone, Debug)]
pub struct CreditQueue<T> {
    max: u32,
    credits: i64,
    min: i64,
    queue: VecDeque<T>,
}

impl<T> CreditQueue<T> {
    /// A queue with `max` credits, all available.
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`] for `max == 0`.
    pub fn new(max: u32) -> Result<Self, CreditError> {
        if max == 0 {
            return Err(CreditError::ZeroCredits);
        }
        Ok(Self {
            max,
            credits: i64::from(max),
            min: i64::from(max),
            queue: VecDeque::new(),
        })
    }

    /// Configured number of credits.
    #[must_use]
    pub const fn max(&self) -> u32 {
        self.max
    }

    /// Current credits (negative: that many items wait).
    #[must_use]
    pub const fn credits(&self) -> i64 {
        self.credits
    }

    /// Lowest value `credits` ever had.
    #[must_use]
    pub const fn min_credits(&self) -> i64 {
        self.min
    }

    /// Items waiting.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Items holding a credit.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        let waiting = i64::try_from(self.queue.len()).unwrap_or(i64::MAX);
        u64::try_from(i64::from(self.max) - self.credits - waiting).unwrap_or(0)
    }

    /// The waiting items, head first.
    pub fn iter_queued(&self) -> impl Iterator<Item = &T> + '_ {
        self.queue.iter()
    }

    /// Takes a credit for `item`: granted at once, or queued at the tail.
    pub fn acquire(&mut self, item: T) -> Acquire<T> {
        self.credits -= 1;
        self.min = self.min.min(self.credits);
        if self.credits >= 0 {
            Acquire::Granted(item)
        } else {
            self.queue.push_back(item);
            Acquire::Queued
        }
    }

    /// Returns a credit. If an item was waiting, the head of the queue now
    /// holds the credit and is returned.
    ///
    /// # Errors
    /// [`CreditError::Overflow`] when no credit is out (nothing in flight).
    pub fn release(&mut self) -> Result<Option<T>, CreditError> {
        if self.in_flight() == 0 {
            return Err(CreditError::Overflow);
        }
        self.credits += 1;
        if self.credits <= 0 {
            Ok(self.queue.pop_front())
        } else {
            Ok(None)
        }
    }

    /// Removes the waiting items `pred` selects (cancelled messages), in
    /// queue order, giving their credits back.
    pub fn remove_queued(&mut self, pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let removed = crate::deque::take_where(&mut self.queue, pred);
        self.credits += i64::try_from(removed.len()).unwrap_or(i64::MAX);
        removed
    }

    /// Changes the number of credits. Raising it grants waiting items
    /// (returned, in order); lowering it takes effect as credits come back
    /// (meanwhile `credits` may be below `-queued`).
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`] for `max == 0`.
    pub fn resize(&mut self, max: u32) -> Result<Vec<T>, CreditError> {
        if max == 0 {
            return Err(CreditError::ZeroCredits);
        }
        self.credits += i64::from(max) - i64::from(self.max);
        self.max = max;
        self.min = self.min.min(self.credits);
        let mut granted = Vec::new();
        while self.credits > -i64::try_from(self.queue.len()).unwrap_or(i64::MAX) {
            match self.queue.pop_front() {
                Some(item) => granted.push(item),
                None => break,
            }
        }
        Ok(granted)
    }

    /// Resets the low-water mark to the current value.
    pub fn reset_min(&mut self) {
        self.min = self.credits;
    }
}

/// Per-net credit tunables (`lnetctl net add --credits --peer-credits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetTunables {
    /// Credits per local NI on the net (256).
    pub credits: u32,
    /// Credits per peer NI reached on the net (8).
    pub peer_credits: u32,
    /// Router credits per peer on the net (`peer_buffer_credits`; 0 = same
    /// as `peer_credits`).
    pub peer_buffer_credits: u32,
}

impl Default for NetTunables {
    fn default() -> Self {
        Self {
            credits: DEFAULT_NI_CREDITS,
            peer_credits: DEFAULT_PEER_CREDITS,
            peer_buffer_credits: 0,
        }
    }
}

impl NetTunables {
    /// Router credits per peer after the 0 = `peer_credits` rule.
    #[must_use]
    pub const fn router_credits(&self) -> u32 {
        if self.peer_buffer_credits == 0 {
            self.peer_credits
        } else {
            self.peer_buffer_credits
        }
    }
}

/// A message going out through the tx credit pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tx<T> {
    /// Local NI it leaves from.
    pub local: Nid,
    /// Peer NI (next hop) it goes to.
    pub peer_ni: Nid,
    /// Payload bytes (for queued-bytes accounting).
    pub bytes: u32,
    /// The message.
    pub item: T,
}

/// Peer NI and NI tx credits of one node (`lnet_post_send_locked`).
#[derive(Clone, Debug, Default)]
pub struct TxCredits<T> {
    tunables: BTreeMap<Net, NetTunables>,
    peer: NidMap<CreditQueue<Tx<T>>>,
    ni: NidMap<CreditQueue<Tx<T>>>,
    queued_bytes: NidMap<u64>,
}

impl<T> TxCredits<T> {
    /// No queues yet; every net uses [`NetTunables::default`] until set.
    #[must_use]
    pub fn new() -> Self {
        Self {
            tunables: BTreeMap::new(),
            peer: nid_map(),
            ni: nid_map(),
            queued_bytes: nid_map(),
        }
    }

    /// Sets the tunables of `net`; queues created afterwards use them.
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`] if `credits` or `peer_credits` is 0.
    pub fn set_tunables(&mut self, net: Net, t: NetTunables) -> Result<(), CreditError> {
        if t.credits == 0 || t.peer_credits == 0 {
            return Err(CreditError::ZeroCredits);
        }
        self.tunables.insert(net, t);
        Ok(())
    }

    /// The tunables in force for `net`.
    #[must_use]
    pub fn tunables(&self, net: Net) -> NetTunables {
        self.tunables.get(&net).copied().unwrap_or_default()
    }

    /// The credit queue of peer NI `nid`, if it has been used.
    #[must_use]
    pub fn peer_ni(&self, nid: Nid) -> Option<&CreditQueue<Tx<T>>> {
        self.peer.get(&nid)
    }

    /// The credit queue of local NI `nid`, if it has been used.
    #[must_use]
    pub fn ni(&self, nid: Nid) -> Option<&CreditQueue<Tx<T>>> {
        self.ni.get(&nid)
    }

    /// Available credits of peer NI `nid` (its full allowance if unused).
    #[must_use]
    pub fn peer_ni_credits(&self, nid: Nid) -> i64 {
        self.peer.get(&nid).map_or_else(
            || i64::from(self.tunables(nid.net()).peer_credits),
            CreditQueue::credits,
        )
    }

    /// Available credits of local NI `nid` (its full allowance if unused).
    #[must_use]
    pub fn ni_credits(&self, nid: Nid) -> i64 {
        self.ni.get(&nid).map_or_else(
            || i64::from(self.tunables(nid.net()).credits),
            CreditQueue::credits,
        )
    }

    /// Bytes (payload + 72-byte header) in flight or queued towards peer NI
    /// `nid` (`lpni_txqnob`, used to rank gateways).
    #[must_use]
    pub fn queued_bytes(&self, nid: Nid) -> u64 {
        self.queued_bytes.get(&nid).copied().unwrap_or(0)
    }

    fn peer_queue(&mut self, nid: Nid) -> &mut CreditQueue<Tx<T>> {
        let max = self.tunables(nid.net()).peer_credits.max(1);
        self.peer.entry(nid).or_insert_with(|| CreditQueue {
            max,
            credits: i64::from(max),
            min: i64::from(max),
            queue: VecDeque::new(),
        })
    }

    fn ni_stage(&mut self, tx: Tx<T>, ready: &mut Vec<Tx<T>>) {
        if let Some(tx) = self.ni_acquire(tx) {
            ready.push(tx);
        }
    }

    /// NI credit for `tx`, which holds its peer NI credit: `tx` back if it
    /// got it, `None` if it waits for it.
    fn ni_acquire(&mut self, tx: Tx<T>) -> Option<Tx<T>> {
        let max = self.tunables(tx.local.net()).credits.max(1);
        let q = self.ni.entry(tx.local).or_insert_with(|| CreditQueue {
            max,
            credits: i64::from(max),
            min: i64::from(max),
            queue: VecDeque::new(),
        });
        match q.acquire(tx) {
            Acquire::Granted(tx) => Some(tx),
            _ => None,
        }
    }

    /// Queues `item` for sending from `local` to `peer_ni` with `bytes` of
    /// payload: peer NI credit first, then NI credit. Returns the item if
    /// it can be handed to the LND now, `None` if it waits.
    pub fn send(&mut self, local: Nid, peer_ni: Nid, bytes: u32, item: T) -> Option<Tx<T>> {
        *self.queued_bytes.entry(peer_ni).or_default() += u64::from(bytes) + HEADER_BYTES;
        let tx = Tx {
            local,
            peer_ni,
            bytes,
            item,
        };
        match self.peer_queue(peer_ni).acquire(tx) {
            Acquire::Granted(tx) => self.ni_acquire(tx),
            _ => None,
        }
    }

    /// A message that held both credits finished (`lnet_return_tx_credits`):
    /// the NI credit and then the peer NI credit come back, and the messages
    /// that now hold both are returned in the order they become ready.
    ///
    /// # Errors
    /// [`CreditError::Unknown`] for queues never used, [`CreditError::Overflow`]
    /// if no message was in flight on them; nothing changes on error.
    pub fn complete(
        &mut self,
        local: Nid,
        peer_ni: Nid,
        bytes: u32,
    ) -> Result<Vec<Tx<T>>, CreditError> {
        let ni = self.ni.get(&local).ok_or(CreditError::Unknown(local))?;
        let peer = self
            .peer
            .get(&peer_ni)
            .ok_or(CreditError::Unknown(peer_ni))?;
        if ni.in_flight() == 0 || peer.in_flight() == 0 {
            return Err(CreditError::Overflow);
        }
        if let Some(q) = self.queued_bytes.get_mut(&peer_ni) {
            *q = q.saturating_sub(u64::from(bytes) + HEADER_BYTES);
        }
        let mut ready = Vec::new();
        if let Some(q) = self.ni.get_mut(&local)
            && let Some(tx) = q.release()?
        {
            ready.push(tx);
        }
        let next = match self.peer.get_mut(&peer_ni) {
            Some(q) => q.release()?,
            None => None,
        };
        if let Some(tx) = next {
            self.ni_stage(tx, &mut ready);
        }
        Ok(ready)
    }

    /// Withdraws the messages `pred` selects that wait for credits on the
    /// way from `local` to `peer_ni` (cancelled before they were sent):
    /// those waiting for a peer NI credit hold nothing; those waiting for
    /// the NI credit give their peer NI credit back, which may let the next
    /// message to `peer_ni` go on. Returns the withdrawn messages, then
    /// those that now hold both credits, in the order they became ready.
    pub fn cancel(
        &mut self,
        local: Nid,
        peer_ni: Nid,
        mut pred: impl FnMut(&T) -> bool,
    ) -> (Vec<Tx<T>>, Vec<Tx<T>>) {
        let mut removed = match self.peer.get_mut(&peer_ni) {
            Some(q) => q.remove_queued(|t| t.peer_ni == peer_ni && pred(&t.item)),
            None => Vec::new(),
        };
        let holding = match self.ni.get_mut(&local) {
            Some(q) => q.remove_queued(|t| t.peer_ni == peer_ni && pred(&t.item)),
            None => Vec::new(),
        };
        let mut ready = Vec::new();
        for _ in &holding {
            let next = match self.peer.get_mut(&peer_ni) {
                Some(q) => q.release().unwrap_or(None),
                None => None,
            };
            if let Some(tx) = next {
                self.ni_stage(tx, &mut ready);
            }
        }
        removed.extend(holding);
        if let Some(q) = self.queued_bytes.get_mut(&peer_ni) {
            for t in &removed {
                *q = q.saturating_sub(u64::from(t.bytes) + HEADER_BYTES);
            }
        }
        (removed, ready)
    }
}

/// Router buffer pool sizes (lnet.md 6.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// 0 pages: messages without payload (GET, ACK).
    Tiny,
    /// 1 page: payloads up to 4 KiB.
    Small,
    /// 256 pages: payloads up to 1 MiB.
    Large,
}

impl PoolKind {
    /// The smallest pool whose buffers hold `payload` bytes.
    ///
    /// # Errors
    /// [`CreditError::TooLarge`] above 1 MiB.
    pub const fn for_payload(payload: u32) -> Result<Self, CreditError> {
        match payload {
            0 => Ok(Self::Tiny),
            1..=PAGE_SIZE => Ok(Self::Small),
            p if p <= MAX_PAYLOAD => Ok(Self::Large),
            p => Err(CreditError::TooLarge(p)),
        }
    }

    /// Pages per buffer.
    #[must_use]
    pub const fn pages(self) -> u32 {
        match self {
            Self::Tiny => 0,
            Self::Small => 1,
            Self::Large => MAX_PAYLOAD / PAGE_SIZE,
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Tiny => 0,
            Self::Small => 1,
            Self::Large => 2,
        }
    }
}

/// Router buffer counts (`tiny_router_buffers`, `small_router_buffers`,
/// `large_router_buffers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterBufferConfig {
    /// Tiny buffers (2048).
    pub tiny: u32,
    /// Small buffers (16384).
    pub small: u32,
    /// Large buffers (1024).
    pub large: u32,
}

impl Default for RouterBufferConfig {
    fn default() -> Self {
        Self {
            tiny: DEFAULT_TINY_BUFFERS,
            small: DEFAULT_SMALL_BUFFERS,
            large: DEFAULT_LARGE_BUFFERS,
        }
    }
}

/// A message a router is forwarding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fwd<T> {
    /// The peer NI it came from (whose router credit it holds).
    pub from: Nid,
    /// The buffer pool it uses.
    pub pool: PoolKind,
    /// The message.
    pub item: T,
}

/// A router's per-peer router credits and its buffer pools
/// (`lnet_post_routed_recv_locked`, `lnet_return_rx_credits_locked`).
#[derive(Clone, Debug)]
pub struct RouterCredits<T> {
    tunables: BTreeMap<Net, NetTunables>,
    peer: NidMap<CreditQueue<Fwd<T>>>,
    pools: [CreditQueue<Fwd<T>>; 3],
}

impl<T> RouterCredits<T> {
    /// Pools of the given sizes; peers get router credits per their net's
    /// tunables (default 8).
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`] if a pool size is 0.
    pub fn new(config: RouterBufferConfig) -> Result<Self, CreditError> {
        Ok(Self {
            tunables: BTreeMap::new(),
            peer: nid_map(),
            pools: [
                CreditQueue::new(config.tiny)?,
                CreditQueue::new(config.small)?,
                CreditQueue::new(config.large)?,
            ],
        })
    }

    /// Sets the tunables of `net` (router credits for peers created later).
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`] if the resulting router credits are 0.
    pub fn set_tunables(&mut self, net: Net, t: NetTunables) -> Result<(), CreditError> {
        if t.router_credits() == 0 {
            return Err(CreditError::ZeroCredits);
        }
        self.tunables.insert(net, t);
        Ok(())
    }

    /// The pool of `kind`.
    #[must_use]
    pub fn pool(&self, kind: PoolKind) -> &CreditQueue<Fwd<T>> {
        &self.pools[kind.index()]
    }

    /// Router credits of peer NI `nid`, if it has been used.
    #[must_use]
    pub fn peer(&self, nid: Nid) -> Option<&CreditQueue<Fwd<T>>> {
        self.peer.get(&nid)
    }

    /// Resizes a pool (`lnetctl set tiny_buffers|small_buffers|large_buffers`);
    /// raising grants waiting messages (returned), lowering takes effect as
    /// buffers come back.
    ///
    /// # Errors
    /// [`CreditError::ZeroCredits`].
    pub fn set_pool_size(&mut self, kind: PoolKind, n: u32) -> Result<Vec<Fwd<T>>, CreditError> {
        self.pools[kind.index()].resize(n)
    }

    fn pool_stage(&mut self, fwd: Fwd<T>, ready: &mut Vec<Fwd<T>>) {
        if let Acquire::Granted(f) = self.pools[fwd.pool.index()].acquire(fwd) {
            ready.push(f);
        }
    }

    /// A message with `payload` bytes from peer NI `from` must be forwarded:
    /// router credit of `from` first, then a buffer of the right pool.
    /// Returns the messages that may now be received into a buffer and sent
    /// on.
    ///
    /// # Errors
    /// [`CreditError::TooLarge`] above 1 MiB (nothing is queued).
    pub fn receive(
        &mut self,
        from: Nid,
        payload: u32,
        item: T,
    ) -> Result<Vec<Fwd<T>>, CreditError> {
        let pool = PoolKind::for_payload(payload)?;
        let max = self
            .tunables
            .get(&from.net())
            .copied()
            .unwrap_or_default()
            .router_credits()
            .max(1);
        let q = self.peer.entry(from).or_insert_with(|| CreditQueue {
            max,
            credits: i64::from(max),
            min: i64::from(max),
            queue: VecDeque::new(),
        });
        let mut ready = Vec::new();
        if let Acquire::Granted(f) = q.acquire(Fwd { from, pool, item }) {
            self.pool_stage(f, &mut ready);
        }
        Ok(ready)
    }

    /// Withdraws the waiting messages `pred` selects (their connection failed
    /// while they waited for a router credit or a buffer). A message waiting
    /// for a buffer gives its router credit back, which may let the next
    /// message of that peer go on to the pools. Returns the withdrawn
    /// messages and those that now hold both a router credit and a buffer.
    pub fn cancel(&mut self, mut pred: impl FnMut(&T) -> bool) -> (Vec<Fwd<T>>, Vec<Fwd<T>>) {
        let mut removed = Vec::new();
        // In NID order, so that what is withdrawn comes out in the same
        // order in every run.
        for nid in sorted_keys(&self.peer) {
            if let Some(q) = self.peer.get_mut(&nid) {
                removed.extend(q.remove_queued(|f| pred(&f.item)));
            }
        }
        let mut holding_credit = Vec::new();
        for pool in &mut self.pools {
            holding_credit.extend(pool.remove_queued(|f| pred(&f.item)));
        }
        let mut ready = Vec::new();
        for f in &holding_credit {
            let next = match self.peer.get_mut(&f.from) {
                Some(q) => q.release().unwrap_or(None),
                None => None,
            };
            if let Some(n) = next {
                self.pool_stage(n, &mut ready);
            }
        }
        removed.extend(holding_credit);
        (removed, ready)
    }

    /// A forwarded message that came from `from` through a `pool` buffer is
    /// done: the buffer and then the router credit come back; returns the
    /// messages that now hold both.
    ///
    /// # Errors
    /// [`CreditError::Unknown`] / [`CreditError::Overflow`]; nothing changes
    /// on error.
    pub fn forwarded(&mut self, from: Nid, pool: PoolKind) -> Result<Vec<Fwd<T>>, CreditError> {
        let peer = self.peer.get(&from).ok_or(CreditError::Unknown(from))?;
        if peer.in_flight() == 0 || self.pools[pool.index()].in_flight() == 0 {
            return Err(CreditError::Overflow);
        }
        let mut ready = Vec::new();
        if let Some(f) = self.pools[pool.index()].release()? {
            ready.push(f);
        }
        let next = match self.peer.get_mut(&from) {
            Some(q) => q.release()?,
            None => None,
        };
        if let Some(f) = next {
            self.pool_stage(f, &mut ready);
        }
        Ok(ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    #[test]
    fn fifo_queue_with_watermarks() {
        let mut q = CreditQueue::new(2).unwrap();
        assert_eq!(q.acquire(1), Acquire::Granted(1));
        assert_eq!(q.acquire(2), Acquire::Granted(2));
        assert_eq!(q.acquire(3), Acquire::Queued);
        assert_eq!(q.acquire(4), Acquire::Queued);
        assert_eq!(q.acquire(5), Acquire::Queued);
        assert_eq!((q.credits(), q.min_credits(), q.queued()), (-3, -3, 3));
        assert_eq!(q.in_flight(), 2);
        assert_eq!(q.iter_queued().copied().collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(q.release(), Ok(Some(3)));
        assert_eq!(q.release(), Ok(Some(4)));
        assert_eq!(q.release(), Ok(Some(5)));
        assert_eq!(q.release(), Ok(None));
        assert_eq!(q.release(), Ok(None));
        assert_eq!(q.release(), Err(CreditError::Overflow));
        assert_eq!((q.credits(), q.min_credits()), (2, -3), "min kept");
        q.reset_min();
        assert_eq!(q.min_credits(), 2);
        assert_eq!(
            CreditQueue::<u8>::new(0).unwrap_err(),
            CreditError::ZeroCredits
        );
    }

    #[test]
    fn router_cancel_gives_credits_back_in_order() {
        let mut rc: RouterCredits<u32> = RouterCredits::new(RouterBufferConfig {
            tiny: 1,
            small: 1,
            large: 1,
        })
        .unwrap();
        let t = NetTunables {
            credits: 8,
            peer_credits: 1,
            peer_buffer_credits: 0,
        };
        rc.set_tunables(nid("10.0.0.1@tcp").net(), t).unwrap();
        let (a, b) = (nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp"));
        // a1 holds a's credit and the small buffer; b1 holds b's credit and
        // waits for the buffer; a2 and a3 wait for a's credit.
        assert_eq!(rc.receive(a, 100, 1).unwrap().len(), 1);
        assert!(rc.receive(b, 100, 2).unwrap().is_empty());
        assert!(rc.receive(a, 100, 3).unwrap().is_empty());
        assert!(rc.receive(a, 100, 4).unwrap().is_empty());
        // a2 gives up: nobody moves.
        let (gone, ready) = rc.cancel(|i| *i == 3);
        assert_eq!(gone.iter().map(|f| f.item).collect::<Vec<_>>(), vec![3]);
        assert!(ready.is_empty());
        assert_eq!(rc.peer(a).unwrap().credits(), -1);
        // b1 gives up while waiting for the buffer: its credit comes back.
        let (gone, ready) = rc.cancel(|i| *i == 2);
        assert_eq!(gone.len(), 1);
        assert!(ready.is_empty());
        assert_eq!(rc.peer(b).unwrap().credits(), 1);
        assert_eq!(rc.pool(PoolKind::Small).credits(), 0);
        // a1 done: the buffer and a's credit go to a3.
        let ready = rc.forwarded(a, PoolKind::Small).unwrap();
        assert_eq!(ready.iter().map(|f| f.item).collect::<Vec<_>>(), vec![4]);
        rc.forwarded(a, PoolKind::Small).unwrap();
        assert_eq!(rc.peer(a).unwrap().credits(), 1);
        assert_eq!(rc.pool(PoolKind::Small).credits(), 1);
    }

    #[test]
    fn tx_cancel_gives_credits_back() {
        let (l, p) = (nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp"));
        let mut tc = TxCredits::new();
        tc.set_tunables(
            l.net(),
            NetTunables {
                credits: 1,
                peer_credits: 2,
                peer_buffer_credits: 0,
            },
        )
        .unwrap();
        // 1 holds both credits; 2 holds a peer credit and waits for the NI
        // credit; 3 and 4 wait for a peer credit.
        assert!(tc.send(l, p, 10, 1).is_some());
        for i in 2..=4 {
            assert!(tc.send(l, p, 10, i).is_none());
        }
        // 3 gives up: it held nothing, nobody moves.
        let (gone, ready) = tc.cancel(l, p, |&i| i == 3);
        assert_eq!(gone.iter().map(|t| t.item).collect::<Vec<_>>(), vec![3]);
        assert!(ready.is_empty());
        assert_eq!(tc.peer_ni_credits(p), -1);
        // 2 gives up: its peer credit goes to 4, which waits for the NI
        // credit in its place.
        let (gone, ready) = tc.cancel(l, p, |&i| i == 2);
        assert_eq!(gone.iter().map(|t| t.item).collect::<Vec<_>>(), vec![2]);
        assert!(ready.is_empty());
        assert_eq!(tc.peer_ni_credits(p), 0);
        assert_eq!(tc.queued_bytes(p), 2 * (10 + HEADER_BYTES));
        // Another path's cancel touches nothing here.
        let (gone, _) = tc.cancel(l, nid("10.0.0.3@tcp"), |_| true);
        assert!(gone.is_empty());
        // 1 done: 4 goes.
        let ready = tc.complete(l, p, 10).unwrap();
        assert_eq!(ready.iter().map(|t| t.item).collect::<Vec<_>>(), vec![4]);
        tc.complete(l, p, 10).unwrap();
        assert_eq!((tc.peer_ni_credits(p), tc.ni_credits(l)), (2, 1));
        assert_eq!(tc.queued_bytes(p), 0);
    }

    #[test]
    fn cancel_and_resize() {
        let mut q = CreditQueue::new(1).unwrap();
        let _ = q.acquire(1);
        for i in 2..=5 {
            assert_eq!(q.acquire(i), Acquire::Queued);
        }
        assert_eq!(q.remove_queued(|&i| i % 2 == 0), vec![2, 4]);
        assert_eq!((q.credits(), q.queued()), (-2, 2));
        assert_eq!(q.resize(2).unwrap(), vec![3]);
        assert_eq!((q.credits(), q.queued()), (-1, 1));
        assert_eq!(q.resize(4).unwrap(), vec![5]);
        assert_eq!((q.credits(), q.queued(), q.in_flight()), (1, 0, 3));
        // Lowering below what is out: credits go negative with nothing waiting.
        assert!(q.resize(1).unwrap().is_empty());
        assert_eq!(q.credits(), -2);
        assert_eq!(q.release(), Ok(None));
        assert_eq!(q.release(), Ok(None));
        assert_eq!(q.release(), Ok(None));
        assert_eq!(q.release(), Err(CreditError::Overflow));
        assert_eq!(q.credits(), 1);
    }

    #[test]
    fn tx_peer_credit_before_ni_credit() {
        let (l, p1, p2) = (
            nid("10.0.0.1@tcp"),
            nid("10.0.0.2@tcp"),
            nid("10.0.0.3@tcp"),
        );
        let mut tx: TxCredits<u32> = TxCredits::new();
        tx.set_tunables(
            l.net(),
            NetTunables {
                credits: 3,
                peer_credits: 2,
                peer_buffer_credits: 0,
            },
        )
        .unwrap();
        fn items(v: impl IntoIterator<Item = Tx<u32>>) -> Vec<u32> {
            v.into_iter().map(|t| t.item).collect()
        }
        assert_eq!(items(tx.send(l, p1, 100, 1)), vec![1]);
        assert_eq!(items(tx.send(l, p1, 100, 2)), vec![2]);
        // Peer NI p1 out of credits: 3 waits on the peer queue.
        assert!(tx.send(l, p1, 100, 3).is_none());
        assert_eq!(tx.peer_ni_credits(p1), -1);
        assert_eq!(tx.ni_credits(l), 1);
        // p2 uses the last NI credit; 5 waits on the NI queue.
        assert_eq!(items(tx.send(l, p2, 0, 4)), vec![4]);
        assert!(tx.send(l, p2, 0, 5).is_none());
        assert_eq!(tx.ni_credits(l), -1);
        assert_eq!(tx.queued_bytes(p1), 3 * 172);
        // 1 completes: its NI credit goes to 5 (head of the NI queue), its
        // peer credit to 3, which then queues for an NI credit.
        assert_eq!(items(tx.complete(l, p1, 100).unwrap()), vec![5]);
        assert_eq!(tx.ni_credits(l), -1);
        assert_eq!(
            tx.ni(l)
                .unwrap()
                .iter_queued()
                .map(|t| t.item)
                .collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(items(tx.complete(l, p2, 0).unwrap()), vec![3]);
        assert_eq!(tx.ni(l).unwrap().min_credits(), -1);
        assert_eq!(tx.peer_ni(p1).unwrap().min_credits(), -1);
        assert_eq!(tx.queued_bytes(p1), 2 * 172);
        assert_eq!(
            tx.complete(nid("10.0.0.9@tcp"), p1, 0).unwrap_err(),
            CreditError::Unknown(nid("10.0.0.9@tcp"))
        );
        // Default tunables elsewhere.
        assert_eq!(tx.ni_credits(nid("192.168.0.1@o2ib")), 256);
        assert_eq!(tx.peer_ni_credits(nid("192.168.0.2@o2ib")), 8);
    }

    #[test]
    fn pool_choice_by_size() {
        assert_eq!(PoolKind::for_payload(0), Ok(PoolKind::Tiny));
        assert_eq!(PoolKind::for_payload(1), Ok(PoolKind::Small));
        assert_eq!(PoolKind::for_payload(4096), Ok(PoolKind::Small));
        assert_eq!(PoolKind::for_payload(4097), Ok(PoolKind::Large));
        assert_eq!(PoolKind::for_payload(1 << 20), Ok(PoolKind::Large));
        assert_eq!(
            PoolKind::for_payload((1 << 20) + 1),
            Err(CreditError::TooLarge((1 << 20) + 1))
        );
        assert_eq!(
            [PoolKind::Tiny, PoolKind::Small, PoolKind::Large].map(PoolKind::pages),
            [0, 1, 256]
        );
        let r: RouterCredits<u8> = RouterCredits::new(RouterBufferConfig::default()).unwrap();
        assert_eq!(r.pool(PoolKind::Tiny).max(), 2048);
        assert_eq!(r.pool(PoolKind::Small).max(), 16384);
        assert_eq!(r.pool(PoolKind::Large).max(), 1024);
    }

    #[test]
    fn router_credits_then_buffers_in_order() {
        let a = nid("10.0.0.2@tcp");
        let b = nid("10.0.0.3@tcp");
        let mut r: RouterCredits<u32> = RouterCredits::new(RouterBufferConfig {
            tiny: 4,
            small: 1,
            large: 1,
        })
        .unwrap();
        r.set_tunables(
            a.net(),
            NetTunables {
                peer_credits: 2,
                ..NetTunables::default()
            },
        )
        .unwrap();
        let items = |v: Vec<Fwd<u32>>| v.into_iter().map(|f| f.item).collect::<Vec<_>>();
        assert_eq!(items(r.receive(a, 100, 1).unwrap()), vec![1]);
        // Small pool exhausted: 2 holds a router credit and waits for a buffer.
        assert!(r.receive(a, 200, 2).unwrap().is_empty());
        // a's router credits (2, from peer_credits) exhausted: 3 waits there.
        assert!(r.receive(a, 0, 3).unwrap().is_empty());
        assert_eq!(r.peer(a).unwrap().credits(), -1);
        assert_eq!(r.pool(PoolKind::Small).credits(), -1);
        // Another peer is not starved by a.
        assert_eq!(items(r.receive(b, 0, 4).unwrap()), vec![4]);
        // 1 done: small buffer to 2, a's credit to 3 (tiny buffer free).
        assert_eq!(items(r.forwarded(a, PoolKind::Small).unwrap()), vec![2, 3]);
        assert_eq!(r.pool(PoolKind::Small).min_credits(), -1);
        assert_eq!(r.peer(a).unwrap().min_credits(), -1);
        assert!(r.receive(a, 2 << 20, 9).is_err());
        assert_eq!(
            r.forwarded(nid("10.0.0.99@tcp"), PoolKind::Tiny),
            Err(CreditError::Unknown(nid("10.0.0.99@tcp")))
        );
        // Growing a pool releases waiters (b still has a router credit; the
        // small buffer is held by 2).
        assert!(r.receive(b, 10, 5).unwrap().is_empty());
        assert_eq!(r.pool(PoolKind::Small).queued(), 1);
        assert_eq!(items(r.set_pool_size(PoolKind::Small, 2).unwrap()), vec![5]);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any interleaving of acquires and releases grants items in the
            /// order they arrived, and credits + waiting stays consistent.
            #[test]
            fn fifo_order_and_accounting(max in 1u32..6, ops in proptest::collection::vec(any::<bool>(), 1..200)) {
                let mut q = CreditQueue::new(max).unwrap();
                let mut next = 0u32;
                let mut granted = Vec::new();
                let mut min_seen = i64::from(max);
                for acquire in ops {
                    if acquire {
                        if let Acquire::Granted(i) = q.acquire(next) {
                            granted.push(i);
                        }
                        next += 1;
                    } else {
                        match q.release() {
                            Ok(Some(i)) => granted.push(i),
                            Ok(None) => {}
                            Err(CreditError::Overflow) => prop_assert_eq!(q.in_flight(), 0),
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    min_seen = min_seen.min(q.credits());
                    let waiting = i64::try_from(q.queued()).unwrap();
                    prop_assert_eq!(q.credits() < 0, waiting > 0);
                    prop_assert_eq!(waiting, (-q.credits()).max(0));
                    prop_assert!(q.in_flight() <= u64::from(max));
                    prop_assert_eq!(q.min_credits(), min_seen);
                    prop_assert_eq!(granted.len() + q.queued(), next as usize);
                }
                // Granted strictly in arrival order.
                prop_assert!(granted.windows(2).all(|w| w[0] < w[1]));
            }

            /// The two-stage tx pipeline never loses, duplicates or reorders
            /// messages between one pair of NIs.
            #[test]
            fn tx_pipeline_conserves_and_orders(ops in proptest::collection::vec(any::<bool>(), 1..200)) {
                let (l, p) = (nid("10.0.0.1@tcp"), nid("10.0.0.2@tcp"));
                let mut tx: TxCredits<u32> = TxCredits::new();
                tx.set_tunables(l.net(), NetTunables { credits: 3, peer_credits: 2, peer_buffer_credits: 0 }).unwrap();
                let mut next = 0u32;
                let mut ready = Vec::new();
                let mut in_flight = 0usize;
                for send in ops {
                    let out = if send {
                        next += 1;
                        tx.send(l, p, 10, next).into_iter().collect()
                    } else if in_flight > 0 {
                        in_flight -= 1;
                        tx.complete(l, p, 10).unwrap()
                    } else {
                        prop_assert!(tx.complete(l, p, 10).is_err() || tx.peer_ni(p).is_none());
                        Vec::new()
                    };
                    in_flight += out.len();
                    ready.extend(out.into_iter().map(|t| t.item));
                    prop_assert!(in_flight <= 2);
                }
                prop_assert!(ready.windows(2).all(|w| w[0] < w[1]));
                let queued = tx.peer_ni(p).map_or(0, CreditQueue::queued)
                    + tx.ni(l).map_or(0, CreditQueue::queued);
                prop_assert_eq!(ready.len() + queued, next as usize);
            }
        }
    }
}
