//! Application memory ([`MemRegion`]), the registry that resolves the
//! node's [`MemRef`]s to it, and the router buffers the runtime owns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use colibri_lnet::credits::PoolKind;
use colibri_lnet::matching::{MemKey, MemRef};
use colibri_lnet::nidmap::KeyedMap;
use colibri_lnet::node::RxId;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use crate::splice::{Pipe, PipePool, PooledPipe};

/// Bytes the application owns and shares with the runtime.
///
/// A region is a cheap handle (`Clone` shares the same bytes). Register it
/// with [`crate::Lnet::register`] to get a [`MemKey`]; MDs then name ranges
/// of it ([`MemRef`]) and the runtime reads outgoing payloads from it and
/// reads incoming payloads from the socket straight into it: the runtime
/// never copies a user payload into memory of its own.
///
/// While an MD over a range is in use (until its last event, the one with
/// `unlinked`), the application should not touch that range: the runtime
/// may be writing into it. The lock inside only keeps the accesses memory
/// safe; it does not order them with the network. Keep [`MemRegion::read`]
/// and [`MemRegion::write`] closures short: a scheduler thread reading a
/// payload into the region (or writing one from it) waits for them.
///
/// ```
/// use colibri_lnet_rt::MemRegion;
///
/// let r = MemRegion::from_vec(b"hello".to_vec());
/// assert_eq!(r.len(), 5);
/// r.write(|b| b[0] = b'j');
/// assert_eq!(r.to_vec(), b"jello");
/// ```
#[derive(Clone)]
pub struct MemRegion {
    inner: Arc<RwLock<Box<[u8]>>>,
}

impl std::fmt::Debug for MemRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemRegion")
            .field("len", &self.len())
            .finish()
    }
}

impl MemRegion {
    /// A region of `len` zero bytes.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A region holding `bytes` (no copy).
    #[must_use]
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self {
            inner: Arc::new(RwLock::new(bytes.into_boxed_slice())),
        }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether the region has no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the bytes.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.inner.read())
    }

    /// Runs `f` on the bytes, mutably.
    pub fn write<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.inner.write())
    }

    /// A copy of the bytes (for the application; the runtime never calls it).
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        self.inner.read().to_vec()
    }

    /// Whether two handles share the same bytes.
    #[must_use]
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn lock_read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.inner.read()
    }

    fn lock_write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.inner.write()
    }
}

/// Memory the application owns and keeps behind its own lock, made of
/// segments (scatter-gather), registered with
/// [`crate::Lnet::register_foreign`]: the runtime reads payloads from it
/// and reads sockets straight into it, through these calls, each held for
/// one system call or one copy (loopback) at most.
///
/// A transport whose buffers live in another library's memory (the
/// messaging layer's registered buffers) uses it so that an MD is that
/// memory, with no copy. The memory may go away (the calls then return
/// false): an operation that needs it fails as with deregistered memory.
/// The runtime never holds two foreign memories' locks at once except on
/// the loopback thread (source, then destination), and never the same
/// one twice.
pub trait ForeignMemory: Send + Sync {
    /// Total length in bytes (the sum of the segments).
    fn len(&self) -> usize;

    /// Whether the memory has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the segments, in order; false (without calling `f`)
    /// when the memory is gone.
    fn read(&self, f: &mut dyn FnMut(&[&[u8]])) -> bool;

    /// Runs `f` on the segments, mutably, in order; false (without
    /// calling `f`) when the memory is gone.
    fn write(&self, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool;
}

/// What a key names: a region, or foreign memory.
#[derive(Clone)]
pub(crate) enum Backing {
    Region(MemRegion),
    Foreign(Arc<dyn ForeignMemory>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Region(r) => r.fmt(f),
            Self::Foreign(m) => f.debug_struct("Foreign").field("len", &m.len()).finish(),
        }
    }
}

impl Backing {
    fn len(&self) -> usize {
        match self {
            Self::Region(r) => r.len(),
            Self::Foreign(m) => m.len(),
        }
    }
}

/// A [`MemRef`] resolved to its memory and a checked byte range.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub(crate) mem: Backing,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// Pieces of memory a message is read from or written to: a few, kept on
/// the stack (a message's buffer is usually one or two segments).
pub(crate) type Pieces<T> = SmallVec<[T; 4]>;

/// The pieces of `[start, start + len)` over `segs`.
fn pieces<'a>(segs: &[&'a [u8]], start: usize, len: usize) -> Pieces<&'a [u8]> {
    let mut out = Pieces::new();
    let (mut skip, mut left) = (start, len);
    for s in segs {
        if left == 0 {
            break;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let n = (s.len() - skip).min(left);
        out.push(&s[skip..skip + n]);
        left -= n;
        skip = 0;
    }
    out
}

/// The pieces of `[start, start + len)` over `segs`, mutably.
fn pieces_mut<'a>(segs: &'a mut [&mut [u8]], start: usize, len: usize) -> Pieces<&'a mut [u8]> {
    let mut out = Pieces::new();
    let (mut skip, mut left) = (start, len);
    for s in segs.iter_mut() {
        if left == 0 {
            break;
        }
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        let n = (s.len() - skip).min(left);
        out.push(&mut s[skip..skip + n]);
        left -= n;
        skip = 0;
    }
    out
}

/// Copies `src` pieces into `dst` pieces (as many bytes as both hold);
/// returns the bytes copied.
pub(crate) fn copy_pieces(src: &[&[u8]], dst: &mut [&mut [u8]]) -> usize {
    let (mut si, mut so, mut copied) = (0, 0, 0);
    for d in dst.iter_mut() {
        let mut doff = 0;
        while doff < d.len() && si < src.len() {
            let s = &src[si][so..];
            let n = s.len().min(d.len() - doff);
            d[doff..doff + n].copy_from_slice(&s[..n]);
            doff += n;
            so += n;
            copied += n;
            if so == src[si].len() {
                si += 1;
                so = 0;
            }
        }
    }
    copied
}

impl Resolved {
    /// Runs `f` on the range's bytes (one piece for a region, one per
    /// segment crossed for foreign memory); `None` if the memory is gone.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> Option<R> {
        match &self.mem {
            Backing::Region(r) => {
                let g = r.lock_read();
                Some(f(&[&g[self.start..self.start + self.len]]))
            }
            Backing::Foreign(m) => {
                let mut f = Some(f);
                let mut out = None;
                m.read(&mut |segs| {
                    if let Some(f) = f.take() {
                        out = Some(f(&pieces(segs, self.start, self.len)));
                    }
                });
                out
            }
        }
    }

    /// Runs `f` on the range's bytes, mutably; `None` if the memory is gone.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut [&mut [u8]]) -> R) -> Option<R> {
        match &self.mem {
            Backing::Region(r) => {
                let mut g = r.lock_write();
                Some(f(&mut [&mut g[self.start..self.start + self.len]]))
            }
            Backing::Foreign(m) => {
                let mut f = Some(f);
                let mut out = None;
                m.write(&mut |segs| {
                    if let Some(f) = f.take() {
                        out = Some(f(&mut pieces_mut(segs, self.start, self.len)));
                    }
                });
                out
            }
        }
    }

    /// Whether two ranges are in the same memory.
    pub(crate) fn same_memory(&self, other: &Self) -> bool {
        match (&self.mem, &other.mem) {
            (Backing::Region(a), Backing::Region(b)) => a.same(b),
            (Backing::Foreign(a), Backing::Foreign(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The region, for a range of a [`MemRegion`].
    pub(crate) fn region(&self) -> Option<&MemRegion> {
        match &self.mem {
            Backing::Region(r) => Some(r),
            Backing::Foreign(_) => None,
        }
    }
}

/// The registered memory, by key.
#[derive(Debug, Default)]
pub(crate) struct MemTable {
    next: AtomicU64,
    regions: RwLock<KeyedMap<MemKey, Backing>>,
}

impl MemTable {
    pub(crate) fn register(&self, region: &MemRegion) -> MemKey {
        self.insert(Backing::Region(region.clone()))
    }

    pub(crate) fn register_foreign(&self, mem: Arc<dyn ForeignMemory>) -> MemKey {
        self.insert(Backing::Foreign(mem))
    }

    fn insert(&self, b: Backing) -> MemKey {
        let key = MemKey(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.regions.write().insert(key, b);
        key
    }

    /// Keys registered.
    pub(crate) fn len(&self) -> usize {
        self.regions.read().len()
    }

    /// Forgets a key; the region, when it named one.
    pub(crate) fn deregister(&self, key: MemKey) -> Option<MemRegion> {
        match self.regions.write().remove(&key)? {
            Backing::Region(r) => Some(r),
            Backing::Foreign(_) => None,
        }
    }

    /// The range `r` names, if it is registered and in bounds.
    pub(crate) fn resolve(&self, r: MemRef) -> Option<Resolved> {
        let mem = self.regions.read().get(&r.key).cloned()?;
        let start = usize::try_from(r.offset).ok()?;
        let len = r.len as usize;
        let end = start.checked_add(len)?;
        if end > mem.len() {
            return None;
        }
        Some(Resolved { mem, start, len })
    }
}

/// A filled router buffer's payload: in memory, or held in a kernel pipe
/// (`crate::splice`).
#[derive(Debug)]
pub(crate) enum Held {
    /// Read into memory (its first bytes; the vector may be longer).
    Mem(Vec<u8>),
    /// Spliced into a pipe, which holds exactly the payload.
    Pipe {
        pipe: PooledPipe,
        /// A send took the payload out of the pipe itself (no spare pipe
        /// to duplicate it into): it cannot be sent again.
        consumed: AtomicBool,
    },
}

impl Held {
    /// The first `len` bytes, when in memory.
    pub(crate) fn bytes(&self, len: usize) -> Option<&[u8]> {
        match self {
            Self::Mem(v) => v.get(..len),
            Self::Pipe { .. } => None,
        }
    }

    /// The pipe, when held in one.
    pub(crate) fn pipe(&self) -> Option<&Pipe> {
        match self {
            Self::Mem(_) => None,
            Self::Pipe { pipe, .. } => Some(pipe),
        }
    }
}

/// A filled router buffer (shared with the transmits that send it).
pub(crate) type RouterBuf = Arc<Held>;

/// Router buffers: free lists per pool, the filled buffers by message, and
/// the pipes that hold large forwarded payloads.
#[derive(Debug)]
pub(crate) struct RouterBuffers {
    free: Mutex<[Vec<Vec<u8>>; 3]>,
    filled: Mutex<KeyedMap<RxId, RouterBuf>>,
    pub(crate) pipes: Arc<PipePool>,
}

impl Default for RouterBuffers {
    fn default() -> Self {
        Self::new(0, crate::splice::PIPE_BYTES)
    }
}

/// Free buffers kept per pool; more are dropped.
const FREE_KEEP: usize = 64;

fn pool_index(p: PoolKind) -> usize {
    match p {
        PoolKind::Tiny => 0,
        PoolKind::Small => 1,
        PoolKind::Large => 2,
    }
}

impl RouterBuffers {
    /// Router buffers whose large payloads may be held in up to `pipes`
    /// pipes of `pipe_bytes` at once (0: always in memory).
    pub(crate) fn new(pipes: usize, pipe_bytes: usize) -> Self {
        Self {
            free: Mutex::new(Default::default()),
            filled: Mutex::new(KeyedMap::default()),
            pipes: PipePool::new(pipes, pipe_bytes),
        }
    }

    /// A buffer of at least `len` bytes from `pool` (allocated if the pool
    /// is empty); the payload goes in its first `len` bytes. A buffer
    /// keeps its length from one message to the next, so a reused buffer
    /// is not zeroed again (for a 1 MiB message, a pass over 1 MiB that
    /// the socket read overwrites at once).
    pub(crate) fn take(&self, pool: PoolKind, len: usize) -> Vec<u8> {
        let mut v = self.free.lock()[pool_index(pool)].pop().unwrap_or_default();
        if v.len() < len {
            v.resize(len, 0);
        }
        v
    }

    /// Gives back a buffer (filled or not).
    pub(crate) fn give_back(&self, pool: PoolKind, v: Vec<u8>) {
        let mut free = self.free.lock();
        let list = &mut free[pool_index(pool)];
        if list.len() < FREE_KEEP {
            list.push(v);
        }
    }

    pub(crate) fn insert(&self, rx: RxId, buf: Vec<u8>) {
        self.filled.lock().insert(rx, Arc::new(Held::Mem(buf)));
    }

    /// `rx`'s payload is all in `pipe`.
    pub(crate) fn insert_pipe(&self, rx: RxId, pipe: PooledPipe) {
        let held = Held::Pipe {
            pipe,
            consumed: AtomicBool::new(false),
        };
        self.filled.lock().insert(rx, Arc::new(held));
    }

    pub(crate) fn get(&self, rx: RxId) -> Option<RouterBuf> {
        self.filled.lock().get(&rx).cloned()
    }

    /// The node no longer needs `rx`'s buffer.
    pub(crate) fn release(&self, rx: RxId) {
        let Some(buf) = self.filled.lock().remove(&rx) else {
            return;
        };
        // A pipe goes back to its pool when its last holder drops it.
        if let Ok(Held::Mem(v)) = Arc::try_unwrap(buf) {
            let pool = if v.is_empty() {
                PoolKind::Tiny
            } else if v.len() <= 4096 {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            self.give_back(pool, v);
        }
    }

    pub(crate) fn filled_count(&self) -> usize {
        self.filled.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_buffers_are_reused_without_zeroing() {
        let b = RouterBuffers::default();
        let mut v = b.take(PoolKind::Large, 8192);
        assert_eq!(v.len(), 8192);
        v.fill(0xab);
        let at = v.as_ptr();
        b.give_back(PoolKind::Large, v);
        // A shorter message gets the same buffer, as it was: the payload
        // goes in its first bytes and nothing is written before the read.
        let v = b.take(PoolKind::Large, 100);
        assert_eq!(v.as_ptr(), at);
        assert!(v.len() >= 100 && v.iter().all(|&x| x == 0xab));
        b.give_back(PoolKind::Large, v);
        // A longer one grows it; only the new tail is zeroed.
        let v = b.take(PoolKind::Large, 10_000);
        assert_eq!(v.len(), 10_000);
        assert!(v[..8192].iter().all(|&x| x == 0xab));
        assert!(v[8192..].iter().all(|&x| x == 0));
        b.give_back(PoolKind::Large, v);
        assert_eq!(b.take(PoolKind::Large, 1).len(), 10_000);
    }
}
