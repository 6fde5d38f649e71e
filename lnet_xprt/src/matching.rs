//! Matching: portals, match entries (MEs), memory descriptors (MDs) and events.
//!
//! This is LNet's `lib-ptl.c`/`lib-me.c`/`lib-md.c` as a plain data structure.
//! A [`MatchTable`] owns 64 portals, the MEs attached to them and every MD
//! (attached to an ME for incoming traffic, or free-floating "bound" MDs used
//! as sources and sinks of outgoing PUTs and GETs).
//!
//! **MD memory belongs to the caller.** An MD names its memory with a
//! [`MemRef`] (an opaque caller key, an offset and a length); the table only
//! records it and computes byte ranges of it ([`Matched`] plus
//! [`MatchTable::md_mem`]). It never reads or writes MD memory: the node hands
//! those ranges to its driver, which moves payload bytes between the network
//! and that memory. Every event carries the MD's [`MemRef`]; once the MD's
//! last event (`unlinked == true`) has been delivered the core never names
//! that memory again, so the caller may reuse it.
//!
//! The table does not send anything. The node asks it to
//! [match](MatchTable::match_request) an incoming PUT/GET, to
//! [commit](MatchTable::commit_bound) a bound MD to an outgoing message, to find the
//! MD an ACK or REPLY is [addressed to](MatchTable::match_response), and to
//! [finish](MatchTable::finish) an operation, which produces the [`Event`].
//!
//! Matching rules (first matching ME wins, MEs with ignore bits first):
//! 1. MD exhausted (threshold 0, or `MAX_SIZE` and `offset + max_size > length`) → skip;
//! 2. MD lacks the operation → skip;
//! 3. `(me.bits ^ bits) & !me.ignore != 0` → skip;
//! 4. pid / 5. NID mismatch (the NID rule accepts two NIDs of one peer) → skip;
//! 6. compute offset and space; too large without `TRUNCATE` → **drop** (search stops);
//! 7. commit: threshold−−, offset advances, auto-unlink when exhausted.
//!
//! No match: GET dropped; PUT dropped unless the portal is *lazy*, in which
//! case it waits until an MD is attached or laziness is cleared.

use std::collections::VecDeque;
use std::fmt;

use crate::ids::{LNET_PID_ANY, Nid, ProcessId};
use crate::wire::{LNET_MTU, MAX_PORTALS, MsgType, WireHandle};

/// Errors from the matching API (caller misuse).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatchError {
    /// Portal index outside `0..64` (`-EINVAL`).
    #[error("portal index {0} out of range")]
    BadPortal(u32),
    /// The handle names no live ME or MD (`-ENOENT`).
    #[error("stale or unknown handle")]
    NoSuchHandle,
    /// An MD attached to an ME must allow PUT and/or GET; a bound MD must not (`-EINVAL`).
    #[error("invalid MD options for this use")]
    BadOptions,
    /// MD length above [`LNET_MTU`] or `max_size` larger than the buffer (`-EINVAL`).
    #[error("invalid MD length")]
    BadLength,
    /// The ME already has an MD (`-EBUSY`).
    #[error("match entry already has an MD")]
    MeBusy,
    /// A unique ME on a wildcard portal or the reverse (`-EPERM`).
    #[error("match entry kind does not fit portal {0}")]
    PortalKindMismatch(u32),
    /// The MD is attached to an ME, exhausted or being unlinked (`-ENOENT`).
    #[error("MD is not usable for sending")]
    MdNotUsable,
}

/// MD option bits (`enum lnet_md_options`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MdOptions(u32);

impl MdOptions {
    /// Accept PUTs (attached MDs).
    pub const OP_PUT: Self = Self(0x1);
    /// Accept GETs (attached MDs).
    pub const OP_GET: Self = Self(0x2);
    /// Offsets come from the request, not the MD's running offset.
    pub const MANAGE_REMOTE: Self = Self(0x4);
    /// Accept oversize requests, truncating them to the space left.
    pub const TRUNCATE: Self = Self(0x10);
    /// Never send an ACK for PUTs into this MD.
    pub const ACK_DISABLE: Self = Self(0x20);
    /// Limit each operation to `max_size` bytes.
    pub const MAX_SIZE: Self = Self(0x80);
    /// Track the response (ACK/REPLY) of messages sent from this MD.
    pub const TRACK_RESPONSE: Self = Self(0x400);
    /// Never track responses of messages sent from this MD.
    pub const NO_TRACK_RESPONSE: Self = Self(0x800);
}

bit_set!(MdOptions);

impl fmt::Debug for MdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MdOptions({:#x})", self.0)
    }
}

/// How many operations an MD accepts (`md_threshold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Threshold {
    /// `LNET_MD_THRESH_INF`.
    Infinite,
    /// This many more operations.
    Count(u32),
}

impl Threshold {
    fn is_zero(self) -> bool {
        self == Self::Count(0)
    }
    fn decrement(&mut self) {
        if let Self::Count(n) = self {
            *n = n.saturating_sub(1);
        }
    }
}

/// Whether an object goes away by itself (`LNET_UNLINK`) or stays (`LNET_RETAIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unlink {
    /// MD: unlink when exhausted; ME: destroyed when its MD unlinks.
    Unlink,
    /// Stay until explicitly unlinked.
    Retain,
}

/// Where a new ME goes in its portal's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsertPos {
    /// Head of the list (`LNET_INS_BEFORE`).
    Before,
    /// Tail of the list (`LNET_INS_AFTER`).
    After,
    /// Just before this ME in the list the new one goes to (as the older
    /// `LNetMEInsert(current, LNET_INS_BEFORE)`), so that an ME meant to
    /// be searched last (a catch-all) stays last while others are added;
    /// at the tail when that ME is not in the list.
    Ahead(MeHandle),
}

/// A caller's opaque key for a piece of memory (a registered buffer, a page
/// list, …). The core never interprets it; the driver resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemKey(pub u64);

/// A region of caller memory: `len` bytes at byte `offset` of the memory
/// named by `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemRef {
    /// The caller's key.
    pub key: MemKey,
    /// Byte offset of the region in the memory named by `key`.
    pub offset: u64,
    /// Length of the region in bytes.
    pub len: u32,
}

impl MemRef {
    /// The region of `len` bytes at `offset` of the memory named by `key`.
    #[must_use]
    pub const fn new(key: MemKey, offset: u64, len: u32) -> Self {
        Self { key, offset, len }
    }

    /// The sub-region `[off, off + len)` of this region, clamped to it
    /// (offsets relative to the region's start).
    #[must_use]
    pub fn slice(self, off: u32, len: u32) -> Self {
        let off = off.min(self.len);
        Self {
            key: self.key,
            offset: self.offset.saturating_add(u64::from(off)),
            len: len.min(self.len - off),
        }
    }
}

/// Everything needed to create an MD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdSpec {
    /// The MD's memory (the caller's); its length is the MD length.
    pub mem: MemRef,
    /// Option bits.
    pub options: MdOptions,
    /// Operations accepted.
    pub threshold: Threshold,
    /// Per-operation size limit (with [`MdOptions::MAX_SIZE`]).
    pub max_size: u32,
    /// Opaque user value reported in events.
    pub user_ptr: u64,
    /// Auto-unlink when exhausted?
    pub unlink: Unlink,
}

impl MdSpec {
    /// An MD over the caller's memory `mem` with the given options, infinite
    /// threshold, retained.
    #[must_use]
    pub fn new(mem: MemRef, options: MdOptions) -> Self {
        Self {
            mem,
            options,
            threshold: Threshold::Infinite,
            max_size: 0,
            user_ptr: 0,
            unlink: Unlink::Retain,
        }
    }

    /// Sets the threshold.
    #[must_use]
    pub fn threshold(mut self, t: Threshold) -> Self {
        self.threshold = t;
        self
    }

    /// Sets auto-unlink.
    #[must_use]
    pub fn unlink(mut self, u: Unlink) -> Self {
        self.unlink = u;
        self
    }

    /// Sets the user value.
    #[must_use]
    pub fn user_ptr(mut self, p: u64) -> Self {
        self.user_ptr = p;
        self
    }

    /// Sets `MAX_SIZE` and the limit.
    #[must_use]
    pub fn max_size(mut self, max: u32) -> Self {
        self.options = self.options.with(MdOptions::MAX_SIZE);
        self.max_size = max;
        self
    }
}

/// Everything needed to attach an ME.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeSpec {
    /// Portal index.
    pub portal: u32,
    /// Which initiators match (`ANY` parts are wildcards).
    pub match_id: ProcessId,
    /// Match bits.
    pub match_bits: u64,
    /// Bits ignored when comparing.
    pub ignore_bits: u64,
    /// Destroy the ME when its MD unlinks?
    pub unlink: Unlink,
    /// Insert at head or tail.
    pub pos: InsertPos,
}

/// A handle to a match entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MeHandle {
    idx: u32,
    generation: u32,
}

/// A handle to a memory descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MdHandle {
    idx: u32,
    generation: u32,
}

impl MdHandle {
    /// The object cookie used in wire handles.
    #[must_use]
    pub const fn cookie(self) -> u64 {
        ((self.generation as u64) << 32) | self.idx as u64
    }

    /// The handle for an object cookie.
    #[must_use]
    pub const fn from_cookie(c: u64) -> Self {
        Self {
            idx: (c & 0xffff_ffff) as u32,
            generation: (c >> 32) as u32,
        }
    }
}

/// A slab with generation counters: stale handles are detected, never reused.
#[derive(Debug)]
struct Slab<V> {
    slots: Vec<(u32, Option<V>)>,
    free: Vec<u32>,
}

impl<V> Slab<V> {
    fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, v: V) -> (u32, u32) {
        if let Some(idx) = self.free.pop() {
            let slot = &mut self.slots[idx as usize];
            slot.0 = slot.0.wrapping_add(1);
            slot.1 = Some(v);
            (idx, slot.0)
        } else {
            let idx = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
            self.slots.push((1, Some(v)));
            (idx, 1)
        }
    }
    fn get(&self, idx: u32, generation: u32) -> Option<&V> {
        match self.slots.get(idx as usize) {
            Some((g, Some(v))) if *g == generation => Some(v),
            _ => None,
        }
    }
    fn get_mut(&mut self, idx: u32, generation: u32) -> Option<&mut V> {
        match self.slots.get_mut(idx as usize) {
            Some((g, Some(v))) if *g == generation => Some(v),
            _ => None,
        }
    }
    fn remove(&mut self, idx: u32, generation: u32) -> Option<V> {
        match self.slots.get_mut(idx as usize) {
            Some((g, v @ Some(_))) if *g == generation => {
                self.free.push(idx);
                v.take()
            }
            _ => None,
        }
    }
    fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[derive(Debug)]
struct Me {
    spec: MeSpec,
    md: Option<MdHandle>,
}

#[derive(Debug)]
struct Md {
    mem: MemRef,
    options: MdOptions,
    threshold: Threshold,
    max_size: u32,
    user_ptr: u64,
    auto_unlink: bool,
    /// Running local offset.
    offset: u32,
    /// Operations in progress.
    refcount: u32,
    /// Unlinked (explicitly or automatically): no new operations; freed when idle.
    zombie: bool,
    /// Explicitly unlinked while busy (`LNET_MD_FLAG_ABORTED`).
    aborted: bool,
    me: Option<MeHandle>,
}

impl Md {
    fn len(&self) -> u32 {
        self.mem.len
    }
    fn exhausted(&self) -> bool {
        self.threshold.is_zero()
            || (self.options.contains(MdOptions::MAX_SIZE)
                && u64::from(self.offset) + u64::from(self.max_size) > u64::from(self.len()))
    }
}

/// The operation of an incoming request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// PUT.
    Put,
    /// GET.
    Get,
}

/// What the matcher needs to know about an incoming PUT or GET.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatchInfo {
    /// Initiator: primary NID of the source peer and the source pid.
    pub initiator: ProcessId,
    /// PUT or GET.
    pub op: Op,
    /// Portal index.
    pub portal: u32,
    /// Requested length (PUT payload length / GET sink length).
    pub rlength: u32,
    /// Requested offset (PUT offset / GET src_offset).
    pub roffset: u32,
    /// Match bits.
    pub match_bits: u64,
}

/// A successful match: the MD and the byte range of the operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Matched {
    /// The MD.
    pub md: MdHandle,
    /// Offset into the MD.
    pub offset: u32,
    /// Bytes accepted (≤ requested).
    pub mlength: u32,
}

/// The result of matching an incoming request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchOutcome {
    /// Matched and committed; finish it with [`MatchTable::finish`].
    Matched(Matched),
    /// No usable MD: drop the message silently.
    Drop,
    /// Held on a lazy portal; it comes back from [`MatchTable::md_attach`] or
    /// [`MatchTable::set_lazy`].
    Delayed,
}

/// What happened to a message held on a lazy portal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DelayedOutcome<T> {
    /// It matched the newly attached MD.
    Matched(T, Matched),
    /// It must be dropped (too large for the MD, or laziness cleared).
    Dropped(T),
}

/// Event kinds (`enum lnet_event_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Target: a GET was served (REPLY sent).
    Get,
    /// Target: PUT data landed.
    Put,
    /// Initiator: REPLY data landed.
    Reply,
    /// Initiator: ACK received.
    Ack,
    /// Initiator: the LND is done with the outgoing buffer (no delivery guarantee).
    Send,
    /// An idle MD was explicitly unlinked.
    Unlink,
}

/// Why an operation failed (the event's negative errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// No response in time, or the MD was unlinked while busy (`-ETIMEDOUT`).
    #[error("timed out")]
    TimedOut,
    /// The MD was unlinked before the message reached the LND (`-ECANCELED`).
    #[error("canceled")]
    Canceled,
    /// No route or peer unreachable (`-EHOSTUNREACH`).
    #[error("host unreachable")]
    Unreachable,
    /// The network failed to send the message (`-EIO`).
    #[error("network error")]
    NetworkError,
    /// Protocol error (`-EPROTO`).
    #[error("protocol error")]
    Protocol,
}

/// Message-side fields of an event, supplied by the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventInfo {
    /// The event kind.
    pub kind: EventKind,
    /// Target process of the message.
    pub target: ProcessId,
    /// Initiator (primary NID of the source peer).
    pub initiator: ProcessId,
    /// Actual source NID in the header.
    pub source: Nid,
    /// Immediate sender (next hop the message came from).
    pub sender: Nid,
    /// For SEND events: whether a PUT or a GET was sent.
    pub msg_type: Option<MsgType>,
    /// Portal index.
    pub portal: u32,
    /// Match bits.
    pub match_bits: u64,
    /// Requested length.
    pub rlength: u32,
    /// Matched length.
    pub mlength: u32,
    /// Offset into the MD.
    pub offset: u32,
    /// PUT header data.
    pub hdr_data: u64,
    /// Outcome.
    pub status: Result<(), OpError>,
}

/// An LNet event (`struct lnet_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Message-side fields.
    pub info: EventInfo,
    /// The MD.
    pub md: MdHandle,
    /// The MD's user value.
    pub user_ptr: u64,
    /// Whether this is the MD's last event: afterwards the core never names
    /// `mem` again.
    pub unlinked: bool,
    /// The MD's memory (`md_start`/`md_length`); `info.offset` is relative to
    /// it.
    pub mem: MemRef,
}

impl Event {
    /// Shorthand for `info.kind`.
    #[must_use]
    pub fn kind(&self) -> EventKind {
        self.info.kind
    }
    /// Shorthand for `info.status`.
    ///
    /// # Errors
    /// The operation's failure.
    pub fn status(&self) -> Result<(), OpError> {
        self.info.status
    }
}

/// Unique (exact id, no ignore bits) or wildcard portal (`lnet_ptl_match_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortalKind {
    Unique,
    Wildcard,
}

#[derive(Debug)]
struct Portal<T> {
    kind: Option<PortalKind>,
    /// MEs with ignore bits: searched first.
    ignore_list: Vec<MeHandle>,
    /// MEs without ignore bits.
    list: Vec<MeHandle>,
    lazy: bool,
    delayed: VecDeque<(MatchInfo, T)>,
}

impl<T> Portal<T> {
    fn new() -> Self {
        Self {
            kind: None,
            ignore_list: Vec::new(),
            list: Vec::new(),
            lazy: false,
            delayed: VecDeque::new(),
        }
    }
}

/// Portals, MEs and MDs of one node. `T` is whatever the node keeps for a PUT
/// delayed on a lazy portal (typically the received message).
#[derive(Debug)]
pub struct MatchTable<T> {
    interface_cookie: u64,
    portals: Vec<Portal<T>>,
    mes: Slab<Me>,
    mds: Slab<Md>,
}

/// Result of a response (ACK/REPLY) lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResponseMatch {
    /// The MD accepts it: `mlength` bytes at offset 0.
    Matched(Matched),
    /// No live bound MD with threshold left, or REPLY too big without TRUNCATE: drop.
    Drop,
}

impl<T> MatchTable<T> {
    /// An empty table; `interface_cookie` goes into every wire handle it makes.
    #[must_use]
    pub fn new(interface_cookie: u64) -> Self {
        Self {
            interface_cookie,
            portals: (0..MAX_PORTALS).map(|_| Portal::new()).collect(),
            mes: Slab::new(),
            mds: Slab::new(),
        }
    }

    /// The interface cookie.
    #[must_use]
    pub fn interface_cookie(&self) -> u64 {
        self.interface_cookie
    }

    /// The wire handle naming `md` (for `ack_wmd` / `return_wmd`).
    #[must_use]
    pub fn wire_handle(&self, md: MdHandle) -> WireHandle {
        WireHandle {
            interface_cookie: self.interface_cookie,
            object_cookie: md.cookie(),
        }
    }

    /// Number of live MEs.
    #[must_use]
    pub fn me_count(&self) -> usize {
        self.mes.len()
    }

    /// Number of live MDs (including zombies still busy).
    #[must_use]
    pub fn md_count(&self) -> usize {
        self.mds.len()
    }

    fn portal_mut(&mut self, portal: u32) -> Result<&mut Portal<T>, MatchError> {
        self.portals
            .get_mut(portal as usize)
            .ok_or(MatchError::BadPortal(portal))
    }

    /// `LNetMEAttach`: creates an ME without an MD.
    ///
    /// # Errors
    /// [`MatchError::BadPortal`], [`MatchError::PortalKindMismatch`].
    pub fn me_attach(&mut self, spec: MeSpec) -> Result<MeHandle, MatchError> {
        let unique = !spec.match_id.nid.is_any()
            && spec.match_id.pid != LNET_PID_ANY
            && spec.ignore_bits == 0;
        let kind = if unique {
            PortalKind::Unique
        } else {
            PortalKind::Wildcard
        };
        {
            let p = self.portal_mut(spec.portal)?;
            match p.kind {
                Some(k) if k != kind => return Err(MatchError::PortalKindMismatch(spec.portal)),
                _ => p.kind = Some(kind),
            }
        }
        let (idx, generation) = self.mes.insert(Me { spec, md: None });
        let h = MeHandle { idx, generation };
        let p = self.portal_mut(spec.portal)?;
        let list = if spec.ignore_bits != 0 {
            &mut p.ignore_list
        } else {
            &mut p.list
        };
        match spec.pos {
            InsertPos::Before => list.insert(0, h),
            InsertPos::After => list.push(h),
            InsertPos::Ahead(next) => match list.iter().rposition(|x| *x == next) {
                Some(i) => list.insert(i, h),
                None => list.push(h),
            },
        }
        Ok(h)
    }

    fn check_md_spec(spec: &MdSpec) -> Result<(), MatchError> {
        let len = spec.mem.len;
        if len > LNET_MTU || spec.mem.offset.checked_add(u64::from(len)).is_none() {
            return Err(MatchError::BadLength);
        }
        if spec.options.contains(MdOptions::MAX_SIZE) && spec.max_size > len {
            return Err(MatchError::BadLength);
        }
        Ok(())
    }

    fn new_md(spec: MdSpec, me: Option<MeHandle>) -> Md {
        Md {
            mem: spec.mem,
            options: spec.options,
            threshold: spec.threshold,
            max_size: spec.max_size,
            user_ptr: spec.user_ptr,
            auto_unlink: spec.unlink == Unlink::Unlink,
            offset: 0,
            refcount: 0,
            zombie: false,
            aborted: false,
            me,
        }
    }

    /// `LNetMDAttach`: attaches an MD to an ME; messages delayed on a lazy
    /// portal are re-matched against it in arrival order.
    ///
    /// # Errors
    /// Unknown ME, ME busy, MD without OP_PUT/OP_GET, bad length.
    pub fn md_attach(
        &mut self,
        me: MeHandle,
        spec: MdSpec,
    ) -> Result<(MdHandle, Vec<DelayedOutcome<T>>), MatchError> {
        if !spec.options.contains(MdOptions::OP_PUT) && !spec.options.contains(MdOptions::OP_GET) {
            return Err(MatchError::BadOptions);
        }
        Self::check_md_spec(&spec)?;
        let entry = self
            .mes
            .get(me.idx, me.generation)
            .ok_or(MatchError::NoSuchHandle)?;
        if entry.md.is_some() {
            return Err(MatchError::MeBusy);
        }
        let portal = entry.spec.portal;
        let (idx, generation) = self.mds.insert(Self::new_md(spec, Some(me)));
        let md = MdHandle { idx, generation };
        if let Some(e) = self.mes.get_mut(me.idx, me.generation) {
            e.md = Some(md);
        }
        // Re-match delayed messages against this MD only (lnet_ptl_attach_md).
        let mut out = Vec::new();
        let delayed = std::mem::take(&mut self.portal_mut(portal)?.delayed);
        let mut keep = VecDeque::new();
        for (info, msg) in delayed {
            match self.try_match_me(me, &info, &|_, _| false) {
                Some(MatchOutcome::Matched(m)) => out.push(DelayedOutcome::Matched(msg, m)),
                Some(_) => out.push(DelayedOutcome::Dropped(msg)),
                None => keep.push_back((info, msg)),
            }
        }
        self.portal_mut(portal)?.delayed = keep;
        Ok((md, out))
    }

    /// `LNetMDBind`: a free-floating MD for outgoing PUTs (source) and GETs (sink).
    ///
    /// # Errors
    /// OP_PUT/OP_GET set, bad length.
    pub fn md_bind(&mut self, spec: MdSpec) -> Result<MdHandle, MatchError> {
        if spec.options.contains(MdOptions::OP_PUT) || spec.options.contains(MdOptions::OP_GET) {
            return Err(MatchError::BadOptions);
        }
        Self::check_md_spec(&spec)?;
        let (idx, generation) = self.mds.insert(Self::new_md(spec, None));
        Ok(MdHandle { idx, generation })
    }

    /// The MD's memory (the caller's region), while the MD is alive.
    #[must_use]
    pub fn md_mem(&self, md: MdHandle) -> Option<MemRef> {
        self.mds.get(md.idx, md.generation).map(|m| m.mem)
    }

    /// The MD's options and user value, while alive.
    #[must_use]
    pub fn md_info(&self, md: MdHandle) -> Option<(MdOptions, u64)> {
        self.mds
            .get(md.idx, md.generation)
            .map(|m| (m.options, m.user_ptr))
    }

    /// Whether the MD is alive and not being unlinked.
    #[must_use]
    pub fn md_is_active(&self, md: MdHandle) -> bool {
        self.mds
            .get(md.idx, md.generation)
            .is_some_and(|m| !m.zombie)
    }

    /// Whether the MD was explicitly unlinked while busy (messages not yet
    /// handed to the network must be canceled).
    #[must_use]
    pub fn md_is_aborted(&self, md: MdHandle) -> bool {
        self.mds
            .get(md.idx, md.generation)
            .is_some_and(|m| m.aborted)
    }

    /// Detaches an MD from its ME (and destroys the ME if it was `Unlink`).
    fn detach_from_me(&mut self, md: MdHandle) {
        let Some(me) = self
            .mds
            .get_mut(md.idx, md.generation)
            .and_then(|m| m.me.take())
        else {
            return;
        };
        let Some(entry) = self.mes.get_mut(me.idx, me.generation) else {
            return;
        };
        entry.md = None;
        if entry.spec.unlink == Unlink::Unlink {
            self.remove_me(me);
        }
    }

    fn remove_me(&mut self, me: MeHandle) {
        if let Some(entry) = self.mes.remove(me.idx, me.generation)
            && let Some(p) = self.portals.get_mut(entry.spec.portal as usize)
        {
            p.list.retain(|h| *h != me);
            p.ignore_list.retain(|h| *h != me);
        }
    }

    /// Makes an MD a zombie: no new operations; an idle MD is freed at once.
    fn unlink_md(&mut self, md: MdHandle) {
        self.detach_from_me(md);
        let Some(m) = self.mds.get_mut(md.idx, md.generation) else {
            return;
        };
        m.zombie = true;
        if m.refcount == 0 {
            self.mds.remove(md.idx, md.generation);
        }
    }

    /// Whether an operation holds `md` now (a payload being read into it,
    /// a message on its way), unlinked or not: its last event is still to
    /// come. False for an unknown MD, or one whose last event was built.
    #[must_use]
    pub fn md_busy(&self, md: MdHandle) -> bool {
        self.mds
            .get(md.idx, md.generation)
            .is_some_and(|m| m.refcount > 0)
    }

    /// `LNetMDUnlink`. An idle MD is unlinked at once and an UNLINK event is
    /// returned; a busy MD is marked aborted, and its last pending operation's
    /// event carries `unlinked` (with `TimedOut` if it otherwise succeeded).
    ///
    /// # Errors
    /// [`MatchError::NoSuchHandle`] for an unknown or already unlinked MD.
    pub fn md_unlink(&mut self, md: MdHandle) -> Result<Option<Event>, MatchError> {
        let m = self
            .mds
            .get_mut(md.idx, md.generation)
            .ok_or(MatchError::NoSuchHandle)?;
        if m.zombie {
            return Err(MatchError::NoSuchHandle);
        }
        let user_ptr = m.user_ptr;
        let mem = m.mem;
        if m.refcount > 0 {
            m.aborted = true;
            self.unlink_md(md);
            return Ok(None);
        }
        self.unlink_md(md);
        Ok(Some(Event {
            info: EventInfo {
                kind: EventKind::Unlink,
                target: ProcessId::ANY,
                initiator: ProcessId::ANY,
                source: Nid::ANY,
                sender: Nid::ANY,
                msg_type: None,
                portal: 0,
                match_bits: 0,
                rlength: 0,
                mlength: 0,
                offset: 0,
                hdr_data: 0,
                status: Ok(()),
            },
            md,
            user_ptr,
            unlinked: true,
            mem,
        }))
    }

    /// `LNetMEUnlink`: removes the ME and unlinks its MD (see [`MatchTable::md_unlink`]).
    ///
    /// # Errors
    /// [`MatchError::NoSuchHandle`].
    pub fn me_unlink(&mut self, me: MeHandle) -> Result<Option<Event>, MatchError> {
        let entry = self
            .mes
            .get(me.idx, me.generation)
            .ok_or(MatchError::NoSuchHandle)?;
        let md = entry.md;
        let ev = match md {
            Some(md) => self.md_unlink(md)?,
            None => None,
        };
        self.remove_me(me);
        Ok(ev)
    }

    /// Makes a portal lazy (or not). Clearing laziness drops every delayed message.
    ///
    /// # Errors
    /// [`MatchError::BadPortal`].
    pub fn set_lazy(&mut self, portal: u32, lazy: bool) -> Result<Vec<T>, MatchError> {
        let p = self.portal_mut(portal)?;
        p.lazy = lazy;
        if lazy {
            Ok(Vec::new())
        } else {
            Ok(p.delayed.drain(..).map(|(_, m)| m).collect())
        }
    }

    /// Removes the messages delayed on lazy portals that `pred` selects
    /// (their connection failed before they matched), in arrival order.
    pub fn remove_delayed(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        for p in &mut self.portals {
            let taken = crate::deque::take_where(&mut p.delayed, |(_, msg)| pred(msg));
            removed.extend(taken.into_iter().map(|(_, msg)| msg));
        }
        removed
    }

    /// Number of messages delayed on a lazy portal.
    #[must_use]
    pub fn delayed_count(&self, portal: u32) -> usize {
        self.portals
            .get(portal as usize)
            .map_or(0, |p| p.delayed.len())
    }

    /// Tries one ME: `None` = skip to the next ME, `Some(Drop)` = stop and drop,
    /// `Some(Matched)` = committed.
    fn try_match_me(
        &mut self,
        me: MeHandle,
        info: &MatchInfo,
        same_peer: &dyn Fn(Nid, Nid) -> bool,
    ) -> Option<MatchOutcome> {
        let entry = self.mes.get(me.idx, me.generation)?;
        let spec = entry.spec;
        let mdh = entry.md?;
        let md = self.mds.get(mdh.idx, mdh.generation)?;
        if md.zombie || md.exhausted() {
            return None;
        }
        let need = match info.op {
            Op::Put => MdOptions::OP_PUT,
            Op::Get => MdOptions::OP_GET,
        };
        if !md.options.contains(need) {
            return None;
        }
        if (spec.match_bits ^ info.match_bits) & !spec.ignore_bits != 0 {
            return None;
        }
        if spec.match_id.pid != LNET_PID_ANY && spec.match_id.pid != info.initiator.pid {
            return None;
        }
        if !spec.match_id.nid.is_any()
            && spec.match_id.nid != info.initiator.nid
            && !same_peer(spec.match_id.nid, info.initiator.nid)
        {
            return None;
        }
        let len = md.len();
        let offset = if md.options.contains(MdOptions::MANAGE_REMOTE) {
            info.roffset
        } else {
            md.offset
        }
        .min(len);
        // Space left; never past the end of the buffer, even with MAX_SIZE or a
        // remote offset beyond the MD (Lustre would underflow here).
        let room = len.saturating_sub(offset);
        let space = if md.options.contains(MdOptions::MAX_SIZE) {
            md.max_size.min(room)
        } else {
            room
        };
        let mlength = if info.rlength <= space {
            info.rlength
        } else if md.options.contains(MdOptions::TRUNCATE) {
            space
        } else {
            tracing::debug!(
                target: "colibri_lnet::matching",
                portal = info.portal,
                rlength = info.rlength,
                space,
                "request too large for matching MD without TRUNCATE: dropped"
            );
            return Some(MatchOutcome::Drop);
        };
        let md = self.mds.get_mut(mdh.idx, mdh.generation)?;
        md.threshold.decrement();
        md.refcount += 1;
        md.offset = offset.saturating_add(mlength);
        if md.exhausted() && md.auto_unlink {
            self.unlink_md(mdh);
        }
        Some(MatchOutcome::Matched(Matched {
            md: mdh,
            offset,
            mlength,
        }))
    }

    /// Matches an incoming PUT or GET (`lnet_ptl_match_md`). `same_peer(a, b)`
    /// tells whether two NIDs belong to one peer (ME NID rule). On
    /// [`MatchOutcome::Delayed`] the table keeps `msg`; otherwise `msg` is
    /// returned to the caller alongside the outcome.
    ///
    /// # Errors
    /// [`MatchError::BadPortal`].
    pub fn match_request(
        &mut self,
        info: MatchInfo,
        msg: T,
        same_peer: &dyn Fn(Nid, Nid) -> bool,
    ) -> Result<(MatchOutcome, Option<T>), MatchError> {
        let idx = info.portal as usize;
        if idx >= self.portals.len() {
            return Err(MatchError::BadPortal(info.portal));
        }
        // The ignore list, then the rest, by position: an ME that does not
        // match is left as it is, so the lists do not change until the
        // first match (no copy of a list of thousands of receive MEs for
        // every message).
        let mut i = 0;
        loop {
            let p = &self.portals[idx];
            let me = match p.ignore_list.get(i) {
                Some(&me) => me,
                None => match p.list.get(i - p.ignore_list.len()) {
                    Some(&me) => me,
                    None => break,
                },
            };
            if let Some(outcome) = self.try_match_me(me, &info, same_peer) {
                return Ok((outcome, Some(msg)));
            }
            i += 1;
        }
        let p = self.portal_mut(info.portal)?;
        if info.op == Op::Put && p.lazy {
            p.delayed.push_back((info, msg));
            return Ok((MatchOutcome::Delayed, None));
        }
        Ok((MatchOutcome::Drop, Some(msg)))
    }

    /// Commits a bound MD to an outgoing PUT or GET (`lnet_msg_attach_md`):
    /// threshold−−, one more operation in progress.
    ///
    /// # Errors
    /// [`MatchError::NoSuchHandle`], or [`MatchError::MdNotUsable`] if the MD
    /// is attached to an ME, exhausted or being unlinked.
    pub fn commit_bound(&mut self, md: MdHandle) -> Result<(), MatchError> {
        let m = self
            .mds
            .get_mut(md.idx, md.generation)
            .ok_or(MatchError::NoSuchHandle)?;
        if m.me.is_some() || m.zombie || m.threshold.is_zero() {
            return Err(MatchError::MdNotUsable);
        }
        m.threshold.decrement();
        m.refcount += 1;
        Ok(())
    }

    /// Finds the bound MD an ACK or REPLY is addressed to and commits it
    /// (`lnet_parse_ack`/`lnet_parse_reply`). For a REPLY, `rlength` bytes are
    /// accepted if they fit, truncated with `TRUNCATE`, else dropped.
    #[must_use]
    pub fn match_response(
        &mut self,
        wmd: WireHandle,
        kind: MsgType,
        rlength: u32,
    ) -> ResponseMatch {
        if wmd.interface_cookie != self.interface_cookie {
            return ResponseMatch::Drop;
        }
        let h = MdHandle::from_cookie(wmd.object_cookie);
        let Some(m) = self.mds.get_mut(h.idx, h.generation) else {
            return ResponseMatch::Drop;
        };
        if m.me.is_some() || m.threshold.is_zero() || m.zombie {
            return ResponseMatch::Drop;
        }
        let mlength = match kind {
            MsgType::Reply => {
                let len = m.len();
                if rlength <= len {
                    rlength
                } else if m.options.contains(MdOptions::TRUNCATE) {
                    len
                } else {
                    return ResponseMatch::Drop;
                }
            }
            _ => rlength,
        };
        m.threshold.decrement();
        m.refcount += 1;
        ResponseMatch::Matched(Matched {
            md: h,
            offset: 0,
            mlength,
        })
    }

    /// Ends one operation on an MD and builds its event
    /// (`lnet_msg_detach_md` + `lnet_build_msg_event`). When this was the last
    /// operation of an exhausted auto-unlink MD, or of an explicitly unlinked
    /// MD, the event has `unlinked` set (the caller's memory is released); an
    /// operation that succeeded on an aborted MD reports [`OpError::TimedOut`].
    ///
    /// Returns `None` for an unknown MD handle.
    pub fn finish(&mut self, md: MdHandle, mut info: EventInfo) -> Option<Event> {
        let m = self.mds.get_mut(md.idx, md.generation)?;
        m.refcount = m.refcount.saturating_sub(1);
        let user_ptr = m.user_ptr;
        let mem = m.mem;
        if m.refcount == 0 && !m.zombie && m.auto_unlink && m.exhausted() {
            m.zombie = true;
        }
        let unlinked = m.refcount == 0 && m.zombie;
        if unlinked && m.aborted && info.status.is_ok() {
            info.status = Err(OpError::TimedOut);
        }
        if unlinked {
            self.detach_from_me(md);
            self.mds.remove(md.idx, md.generation);
        }
        Some(Event {
            info,
            md,
            user_ptr,
            unlinked,
            mem,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Table = MatchTable<u32>;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn me(portal: u32, bits: u64, ignore: u64) -> MeSpec {
        MeSpec {
            portal,
            match_id: ProcessId::ANY,
            match_bits: bits,
            ignore_bits: ignore,
            unlink: Unlink::Retain,
            pos: InsertPos::After,
        }
    }

    fn put(portal: u32, bits: u64, len: u32) -> MatchInfo {
        MatchInfo {
            initiator: ProcessId::lustre(nid("10.0.0.1@tcp")),
            op: Op::Put,
            portal,
            rlength: len,
            roffset: 0,
            match_bits: bits,
        }
    }

    /// A caller region of `len` bytes (the table never looks inside).
    fn mem(len: u32) -> MemRef {
        MemRef::new(MemKey(u64::from(len) + 1000), 64, len)
    }

    fn no_peer(_: Nid, _: Nid) -> bool {
        false
    }

    fn info(kind: EventKind) -> EventInfo {
        EventInfo {
            kind,
            target: ProcessId::ANY,
            initiator: ProcessId::ANY,
            source: Nid::ANY,
            sender: Nid::ANY,
            msg_type: None,
            portal: 0,
            match_bits: 0,
            rlength: 0,
            mlength: 0,
            offset: 0,
            hdr_data: 0,
            status: Ok(()),
        }
    }

    fn attach(t: &mut Table, spec: MeSpec, md: MdSpec) -> (MeHandle, MdHandle) {
        let me = t.me_attach(spec).unwrap();
        let (md, _) = t.md_attach(me, md).unwrap();
        (me, md)
    }

    fn matched(t: &mut Table, i: MatchInfo) -> Matched {
        match t.match_request(i, 0, &no_peer).unwrap().0 {
            MatchOutcome::Matched(m) => m,
            other => panic!("expected match, got {other:?}"),
        }
    }

    #[test]
    fn first_match_wins() {
        let mut t = Table::new(1);
        let (_, a) = attach(&mut t, me(5, 7, 0), MdSpec::new(mem(8), MdOptions::OP_PUT));
        let (_, b) = attach(&mut t, me(5, 7, 0), MdSpec::new(mem(8), MdOptions::OP_PUT));
        assert_eq!(matched(&mut t, put(5, 7, 4)).md, a);
        // Before-insertion puts a new ME at the head.
        let mut head = me(5, 7, 0);
        head.pos = InsertPos::Before;
        let (_, c) = attach(&mut t, head, MdSpec::new(mem(8), MdOptions::OP_PUT));
        assert_eq!(matched(&mut t, put(5, 7, 4)).md, c);
        assert_ne!(b, c);
        // Other bits do not match; other portals do not match.
        assert_eq!(
            t.match_request(put(5, 8, 4), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        assert_eq!(
            t.match_request(put(6, 7, 4), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
    }

    #[test]
    fn ahead_keeps_an_me_last() {
        let mut t = Table::new(1);
        // A catch-all ignoring every bit, then MEs added ahead of it.
        let (last, catch) = attach(
            &mut t,
            me(5, 0, u64::MAX),
            MdSpec::new(mem(8), MdOptions::OP_PUT),
        );
        let mut ahead = me(5, 0, 1);
        ahead.pos = InsertPos::Ahead(last);
        let (_, a) = attach(
            &mut t,
            ahead,
            MdSpec::new(mem(8), MdOptions::OP_PUT).threshold(Threshold::Count(1)),
        );
        let (_, b) = attach(
            &mut t,
            ahead,
            MdSpec::new(mem(8), MdOptions::OP_PUT).threshold(Threshold::Count(1)),
        );
        // In the order they were added, both before the catch-all.
        assert_eq!(matched(&mut t, put(5, 1, 4)).md, a);
        assert_eq!(matched(&mut t, put(5, 0, 4)).md, b);
        assert_eq!(matched(&mut t, put(5, 0, 4)).md, catch);
        assert_eq!(matched(&mut t, put(5, 0x77, 4)).md, catch);
        // Once the catch-all is gone, ahead of it means at the tail.
        t.me_unlink(last).unwrap();
        let (_, c) = attach(&mut t, ahead, MdSpec::new(mem(8), MdOptions::OP_PUT));
        assert_eq!(matched(&mut t, put(5, 1, 4)).md, c);
    }

    #[test]
    fn ignore_bits_and_their_list_is_searched_first() {
        let mut t = Table::new(1);
        let (_, exact) = attach(
            &mut t,
            me(1, 0x10, 0),
            MdSpec::new(mem(8), MdOptions::OP_PUT),
        );
        let (_, wild) = attach(
            &mut t,
            me(1, 0x1000, 0xff),
            MdSpec::new(mem(8), MdOptions::OP_PUT),
        );
        assert_eq!(matched(&mut t, put(1, 0x10ab, 1)).md, wild);
        assert_eq!(
            t.match_request(put(1, 0x20ab, 1), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        // 0x10 matches exact only... but the ignore ME would need bits 0x10xx, so exact wins.
        assert_eq!(matched(&mut t, put(1, 0x10, 1)).md, exact);
        // An ignore-bit ME matching too is preferred even though attached later.
        let (_, wild2) = attach(
            &mut t,
            me(1, 0x0, !0),
            MdSpec::new(mem(8), MdOptions::OP_PUT),
        );
        assert_eq!(matched(&mut t, put(1, 0x10, 1)).md, wild2);
    }

    #[test]
    fn op_and_id_checks() {
        let mut t = Table::new(1);
        let mut spec = me(2, 1, 0);
        spec.match_id = ProcessId::new(nid("10.0.0.9@tcp"), LNET_PID_ANY);
        let (_, md) = attach(&mut t, spec, MdSpec::new(mem(8), MdOptions::OP_GET));
        let mut g = put(2, 1, 4);
        g.op = Op::Get;
        // Wrong initiator NID.
        assert_eq!(
            t.match_request(g, 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        // Same peer (another NID of the same node) is accepted.
        let same = |a: Nid, b: Nid| a == nid("10.0.0.9@tcp") && b == nid("10.0.0.1@tcp");
        assert!(matches!(
            t.match_request(g, 0, &same).unwrap().0,
            MatchOutcome::Matched(Matched { md: m, .. }) if m == md
        ));
        // PUT into a GET-only MD is skipped.
        let mut p = g;
        p.op = Op::Put;
        assert_eq!(t.match_request(p, 0, &same).unwrap().0, MatchOutcome::Drop);
        // pid mismatch.
        let mut spec = me(3, 1, 0);
        spec.match_id = ProcessId::new(Nid::ANY, 99);
        attach(&mut t, spec, MdSpec::new(mem(8), MdOptions::OP_PUT));
        assert_eq!(
            t.match_request(put(3, 1, 1), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
    }

    #[test]
    fn truncation_and_too_large_drop_stops_search() {
        let mut t = Table::new(1);
        let (_, small) = attach(&mut t, me(4, 1, 0), MdSpec::new(mem(4), MdOptions::OP_PUT));
        let (_, big) = attach(&mut t, me(4, 1, 0), MdSpec::new(mem(64), MdOptions::OP_PUT));
        // Too large for the first MD without TRUNCATE: dropped, the second is not tried.
        assert_eq!(
            t.match_request(put(4, 1, 10), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        assert_ne!(small, big);
        let (_, tr) = attach(
            &mut t,
            me(9, 1, 0),
            MdSpec::new(mem(4), MdOptions::OP_PUT | MdOptions::TRUNCATE),
        );
        let m = matched(&mut t, put(9, 1, 10));
        assert_eq!((m.md, m.offset, m.mlength), (tr, 0, 4));
        // Space is now used up: a further PUT gets 0 bytes (truncated), not a drop.
        assert_eq!(matched(&mut t, put(9, 1, 10)).mlength, 0);
    }

    #[test]
    fn local_offset_advances_and_manage_remote_uses_request_offset() {
        let mut t = Table::new(1);
        attach(&mut t, me(7, 1, 0), MdSpec::new(mem(10), MdOptions::OP_PUT));
        assert_eq!(matched(&mut t, put(7, 1, 4)).offset, 0);
        assert_eq!(matched(&mut t, put(7, 1, 4)).offset, 4);
        assert_eq!(
            t.match_request(put(7, 1, 4), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );

        let mut t = Table::new(1);
        attach(
            &mut t,
            me(7, 1, 0),
            MdSpec::new(mem(10), MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE),
        );
        let mut p = put(7, 1, 4);
        p.roffset = 6;
        assert_eq!(matched(&mut t, p).offset, 6);
        p.roffset = 2;
        assert_eq!(matched(&mut t, p).offset, 2);
        p.roffset = 8; // only 2 bytes left there
        assert_eq!(
            t.match_request(p, 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        p.roffset = 1000; // beyond the MD: no space, no panic
        assert_eq!(
            t.match_request(p, 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
    }

    #[test]
    fn max_size() {
        let mut t = Table::new(1);
        attach(
            &mut t,
            me(8, 1, 0),
            MdSpec::new(mem(10), MdOptions::OP_PUT | MdOptions::TRUNCATE).max_size(4),
        );
        assert_eq!(matched(&mut t, put(8, 1, 9)).mlength, 4);
        assert_eq!(matched(&mut t, put(8, 1, 2)).offset, 4);
        // offset 6 + max 4 = 10 ≤ 10: still usable; then 10+4 > 10: exhausted.
        assert_eq!(matched(&mut t, put(8, 1, 9)).offset, 6);
        assert_eq!(
            t.match_request(put(8, 1, 1), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        assert_eq!(
            t.md_bind(MdSpec::new(mem(2), MdOptions::empty()).max_size(3)),
            Err(MatchError::BadLength)
        );
    }

    #[test]
    fn threshold_and_auto_unlink() {
        let mut t = Table::new(1);
        let mut spec = me(10, 1, 0);
        spec.unlink = Unlink::Unlink;
        let (me_h, md) = attach(
            &mut t,
            spec,
            MdSpec::new(mem(8), MdOptions::OP_PUT)
                .threshold(Threshold::Count(2))
                .unlink(Unlink::Unlink)
                .user_ptr(77),
        );
        let m1 = matched(&mut t, put(10, 1, 2));
        // The data of an operation goes to a range of the caller's memory.
        let region = t.md_mem(md).unwrap();
        assert_eq!(region, mem(8));
        assert_eq!(
            region.slice(m1.offset, m1.mlength),
            MemRef::new(region.key, 64, 2)
        );
        let e1 = t.finish(md, info(EventKind::Put)).unwrap();
        assert!(!e1.unlinked);
        assert_eq!((e1.user_ptr, e1.mem), (77, mem(8)));
        let m2 = matched(&mut t, put(10, 1, 2));
        assert_eq!(
            region.slice(m2.offset, m2.mlength),
            MemRef::new(region.key, 66, 2)
        );
        // Exhausted: unlinked from the portal at once (ME too).
        assert_eq!(
            t.match_request(put(10, 1, 1), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        assert_eq!(t.me_count(), 0);
        let e2 = t.finish(md, info(EventKind::Put)).unwrap();
        assert!(e2.unlinked);
        assert_eq!(e2.mem, mem(8));
        assert_eq!(t.md_count(), 0);
        assert_eq!(t.md_mem(md), None, "the memory is no longer referenced");
        // Auto-unlink never produces an UNLINK event; the handle is now stale.
        assert_eq!(t.md_unlink(md), Err(MatchError::NoSuchHandle));
        assert_eq!(t.me_unlink(me_h), Err(MatchError::NoSuchHandle));
    }

    #[test]
    fn retained_md_with_exhausted_threshold_stays() {
        let mut t = Table::new(1);
        let (_, md) = attach(
            &mut t,
            me(11, 1, 0),
            MdSpec::new(mem(8), MdOptions::OP_PUT).threshold(Threshold::Count(1)),
        );
        matched(&mut t, put(11, 1, 1));
        let e = t.finish(md, info(EventKind::Put)).unwrap();
        assert!(!e.unlinked);
        assert_eq!(
            t.match_request(put(11, 1, 1), 0, &no_peer).unwrap().0,
            MatchOutcome::Drop
        );
        let ev = t.md_unlink(md).unwrap().unwrap();
        assert_eq!(ev.kind(), EventKind::Unlink);
        assert!(ev.unlinked);
        assert_eq!(ev.mem, mem(8));
        // The retained ME survives without an MD.
        assert_eq!(t.me_count(), 1);
    }

    #[test]
    fn explicit_unlink_of_busy_md_times_out_last_event() {
        let mut t = Table::new(1);
        let md = t
            .md_bind(MdSpec::new(mem(8), MdOptions::empty()).threshold(Threshold::Count(2)))
            .unwrap();
        t.commit_bound(md).unwrap();
        assert!(t.md_unlink(md).unwrap().is_none());
        assert!(t.md_is_aborted(md));
        assert!(!t.md_is_active(md));
        assert_eq!(t.commit_bound(md), Err(MatchError::MdNotUsable));
        let e = t.finish(md, info(EventKind::Send)).unwrap();
        assert!(e.unlinked);
        assert_eq!(e.status(), Err(OpError::TimedOut));
        assert_eq!(e.mem, mem(8));
    }

    #[test]
    fn lazy_portal_queues_then_matches_on_attach() {
        let mut t = Table::new(1);
        assert!(t.set_lazy(0, true).unwrap().is_empty());
        assert_eq!(
            t.match_request(put(0, 1, 4), 100, &no_peer).unwrap(),
            (MatchOutcome::Delayed, None)
        );
        assert_eq!(
            t.match_request(put(0, 2, 4), 101, &no_peer).unwrap().0,
            MatchOutcome::Delayed
        );
        assert_eq!(
            t.match_request(put(0, 1, 99), 102, &no_peer).unwrap().0,
            MatchOutcome::Delayed
        );
        // GETs are never delayed.
        let mut g = put(0, 1, 4);
        g.op = Op::Get;
        assert_eq!(
            t.match_request(g, 103, &no_peer).unwrap(),
            (MatchOutcome::Drop, Some(103))
        );
        assert_eq!(t.delayed_count(0), 3);
        let me_h = t.me_attach(me(0, 1, 0)).unwrap();
        let (md, out) = t
            .md_attach(me_h, MdSpec::new(mem(16), MdOptions::OP_PUT))
            .unwrap();
        assert_eq!(
            out,
            vec![
                DelayedOutcome::Matched(
                    100,
                    Matched {
                        md,
                        offset: 0,
                        mlength: 4
                    }
                ),
                DelayedOutcome::Dropped(102)
            ]
        );
        assert_eq!(t.delayed_count(0), 1);
        assert_eq!(t.set_lazy(0, false).unwrap(), vec![101]);
        assert_eq!(t.delayed_count(0), 0);
    }

    #[test]
    fn memory_regions_are_validated_and_sliced() {
        let mut t = Table::new(1);
        // A region whose end overflows u64 is refused, as is one above LNET_MTU.
        let wrap = MemRef::new(MemKey(1), u64::MAX - 3, 8);
        assert_eq!(
            t.md_bind(MdSpec::new(wrap, MdOptions::empty())),
            Err(MatchError::BadLength)
        );
        let big = MemRef::new(MemKey(1), 0, LNET_MTU + 1);
        assert_eq!(
            t.md_bind(MdSpec::new(big, MdOptions::empty())),
            Err(MatchError::BadLength)
        );
        // Slices are clamped to the region.
        let r = MemRef::new(MemKey(7), 100, 10);
        assert_eq!(r.slice(2, 3), MemRef::new(MemKey(7), 102, 3));
        assert_eq!(r.slice(8, 5), MemRef::new(MemKey(7), 108, 2));
        assert_eq!(r.slice(50, 5), MemRef::new(MemKey(7), 110, 0));
        let edge = MemRef::new(MemKey(7), u64::MAX - 1, 1);
        assert_eq!(edge.slice(1, 1).offset, u64::MAX);
        let md = t.md_bind(MdSpec::new(r, MdOptions::empty())).unwrap();
        assert_eq!(t.md_mem(md), Some(r));
    }

    #[test]
    fn delayed_messages_can_be_withdrawn() {
        let mut t = Table::new(1);
        t.set_lazy(2, true).unwrap();
        t.set_lazy(3, true).unwrap();
        for (portal, msg) in [(2, 10), (3, 11), (2, 12)] {
            assert_eq!(
                t.match_request(put(portal, 1, 4), msg, &no_peer).unwrap().0,
                MatchOutcome::Delayed
            );
        }
        assert_eq!(t.remove_delayed(|m| *m != 11), vec![10, 12]);
        assert_eq!((t.delayed_count(2), t.delayed_count(3)), (0, 1));
        // What is left still matches a new MD.
        let me_h = t.me_attach(me(3, 1, 0)).unwrap();
        let (_, out) = t
            .md_attach(me_h, MdSpec::new(mem(8), MdOptions::OP_PUT))
            .unwrap();
        assert!(matches!(out[..], [DelayedOutcome::Matched(11, _)]));
    }

    #[test]
    fn response_matching() {
        let mut t = Table::new(42);
        let md = t
            .md_bind(MdSpec::new(mem(4), MdOptions::empty()).threshold(Threshold::Count(2)))
            .unwrap();
        t.commit_bound(md).unwrap();
        let w = t.wire_handle(md);
        assert_eq!(w.interface_cookie, 42);
        // Wrong interface cookie or stale object cookie: dropped.
        let mut bad = w;
        bad.interface_cookie = 1;
        assert_eq!(t.match_response(bad, MsgType::Ack, 0), ResponseMatch::Drop);
        // REPLY too big without TRUNCATE: dropped.
        assert_eq!(t.match_response(w, MsgType::Reply, 5), ResponseMatch::Drop);
        assert_eq!(
            t.match_response(w, MsgType::Reply, 3),
            ResponseMatch::Matched(Matched {
                md,
                offset: 0,
                mlength: 3
            })
        );
        // Threshold used up: a duplicate REPLY is dropped.
        assert_eq!(t.match_response(w, MsgType::Reply, 3), ResponseMatch::Drop);
        // Events in either order; the last one unlinks only if auto-unlink.
        assert!(!t.finish(md, info(EventKind::Reply)).unwrap().unlinked);
        assert!(!t.finish(md, info(EventKind::Send)).unwrap().unlinked);
        // A REPLY for an attached MD is dropped.
        let me_h = t.me_attach(me(3, 0, 0)).unwrap();
        let (amd, _) = t
            .md_attach(me_h, MdSpec::new(mem(4), MdOptions::OP_GET))
            .unwrap();
        assert_eq!(
            t.match_response(t.wire_handle(amd), MsgType::Reply, 1),
            ResponseMatch::Drop
        );
    }

    #[test]
    fn misuse_errors() {
        let mut t = Table::new(1);
        assert_eq!(t.me_attach(me(64, 0, 0)), Err(MatchError::BadPortal(64)));
        let me_h = t.me_attach(me(1, 0, 0)).unwrap();
        assert_eq!(
            t.md_attach(me_h, MdSpec::new(mem(0), MdOptions::empty()))
                .unwrap_err(),
            MatchError::BadOptions
        );
        assert_eq!(
            t.md_bind(MdSpec::new(mem(0), MdOptions::OP_PUT)),
            Err(MatchError::BadOptions)
        );
        assert_eq!(
            t.md_bind(MdSpec::new(mem(LNET_MTU + 1), MdOptions::empty())),
            Err(MatchError::BadLength)
        );
        t.md_attach(me_h, MdSpec::new(mem(0), MdOptions::OP_PUT))
            .unwrap();
        assert_eq!(
            t.md_attach(me_h, MdSpec::new(mem(0), MdOptions::OP_PUT))
                .unwrap_err(),
            MatchError::MeBusy
        );
        // Portal 1 is now a wildcard portal: a unique ME is refused.
        let mut u = me(1, 0, 0);
        u.match_id = ProcessId::lustre(nid("10.0.0.1@tcp"));
        assert_eq!(t.me_attach(u), Err(MatchError::PortalKindMismatch(1)));
        assert!(t.me_attach(u).is_err());
        let mut u2 = u;
        u2.portal = 2;
        t.me_attach(u2).unwrap();
        assert_eq!(
            t.me_attach(me(2, 0, 0)),
            Err(MatchError::PortalKindMismatch(2))
        );
        let mut g = put(64, 0, 0);
        g.op = Op::Get;
        assert_eq!(
            t.match_request(g, 0, &no_peer).unwrap_err(),
            MatchError::BadPortal(64)
        );
        assert_eq!(t.set_lazy(64, true).unwrap_err(), MatchError::BadPortal(64));
    }

    proptest! {
        /// Random operation sequences never panic, never write outside MDs,
        /// and every MD produces exactly one `unlinked` event.
        #[test]
        fn random_operations_keep_invariants(ops in proptest::collection::vec((0u8..6, 0u32..4, 0u32..40, 0u64..4), 1..80)) {
            let mut t = Table::new(9);
            let mut live: Vec<MdHandle> = Vec::new();
            let mut pending: Vec<MdHandle> = Vec::new();
            let mut unlinked = 0usize;
            let mut created = 0usize;
            t.set_lazy(1, true).unwrap();
            for (op, portal, len, bits) in ops {
                match op {
                    0 => {
                        let mut spec = me(portal, bits, if bits == 3 { 1 } else { 0 });
                        spec.unlink = if len % 2 == 0 { Unlink::Unlink } else { Unlink::Retain };
                        let Ok(me_h) = t.me_attach(spec) else { continue };
                        let mut opts = MdOptions::OP_PUT | MdOptions::OP_GET;
                        if len % 3 == 0 { opts = opts | MdOptions::TRUNCATE; }
                        if len % 5 == 0 { opts = opts | MdOptions::MANAGE_REMOTE; }
                        let th = if len % 4 == 0 { Threshold::Infinite } else { Threshold::Count(len % 4) };
                        let (md, out) = t.md_attach(me_h, MdSpec::new(mem(len), opts)
                            .threshold(th).unlink(if len % 2 == 0 { Unlink::Unlink } else { Unlink::Retain })).unwrap();
                        created += 1;
                        live.push(md);
                        for o in out {
                            if let DelayedOutcome::Matched(_, m) = o { pending.push(m.md); }
                        }
                    }
                    1 | 2 => {
                        let mut i = put(portal, bits, len);
                        i.roffset = len / 2;
                        if op == 2 { i.op = Op::Get; }
                        if let (MatchOutcome::Matched(m), _) = t.match_request(i, 0, &no_peer).unwrap() {
                            prop_assert!(m.mlength <= len);
                            let region = t.md_mem(m.md).unwrap();
                            prop_assert!(m.offset as usize + m.mlength as usize <= region.len as usize);
                            let r = region.slice(m.offset, m.mlength);
                            prop_assert_eq!(r.len, m.mlength);
                            prop_assert!(r.offset >= region.offset);
                            prop_assert!(r.offset + u64::from(r.len) <= region.offset + u64::from(region.len));
                            pending.push(m.md);
                        }
                    }
                    3 => {
                        if let Some(md) = pending.pop() {
                            let e = t.finish(md, info(EventKind::Put)).unwrap();
                            if e.unlinked { unlinked += 1; prop_assert_eq!(t.md_mem(md), None); }
                        }
                    }
                    4 => {
                        if let Some(md) = live.get(len as usize % live.len().max(1)).copied()
                            && let Ok(Some(e)) = t.md_unlink(md) {
                                prop_assert!(e.unlinked);
                                unlinked += 1;
                            }
                    }
                    _ => {
                        let md = t.md_bind(MdSpec::new(mem(len), MdOptions::empty())).unwrap();
                        created += 1;
                        live.push(md);
                        if t.commit_bound(md).is_ok() { pending.push(md); }
                    }
                }
            }
            // Drain: finish everything pending, then unlink everything left.
            while let Some(md) = pending.pop() {
                if t.finish(md, info(EventKind::Put)).unwrap().unlinked { unlinked += 1; }
            }
            for md in live {
                if let Ok(Some(_)) = t.md_unlink(md) { unlinked += 1; }
            }
            prop_assert_eq!(t.md_count(), 0);
            prop_assert_eq!(unlinked, created);
        }
    }
}
