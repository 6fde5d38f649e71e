//! Application memory ([`MemRegion`]), the registry that resolves the
//! node's [`MemRef`]s to it, and the router buffers the runtime owns.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use colibri_lnet::credits::PoolKind;
use colibri_lnet::matching::{MemKey, MemRef};
use colibri_lnet::node::RxId;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

    pub(crate) fn lock_read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.inner.read()
    }

    pub(crate) fn lock_write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.inner.write()
    }
}

/// A [`MemRef`] resolved to its region and a checked byte range.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub(crate) region: MemRegion,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl Resolved {
    pub(crate) fn end(&self) -> usize {
        self.start + self.len
    }
}

/// The registered regions, by key.
#[derive(Debug, Default)]
pub(crate) struct MemTable {
    next: AtomicU64,
    regions: RwLock<HashMap<MemKey, MemRegion>>,
}

impl MemTable {
    pub(crate) fn register(&self, region: &MemRegion) -> MemKey {
        let key = MemKey(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.regions.write().insert(key, region.clone());
        key
    }

    pub(crate) fn deregister(&self, key: MemKey) -> Option<MemRegion> {
        self.regions.write().remove(&key)
    }

    pub(crate) fn get(&self, key: MemKey) -> Option<MemRegion> {
        self.regions.read().get(&key).cloned()
    }

    /// The region and range `r` names, if it is registered and in bounds.
    pub(crate) fn resolve(&self, r: MemRef) -> Option<Resolved> {
        let region = self.get(r.key)?;
        let start = usize::try_from(r.offset).ok()?;
        let len = r.len as usize;
        let end = start.checked_add(len)?;
        if end > region.len() {
            return None;
        }
        Some(Resolved { region, start, len })
    }
}

/// A filled router buffer (shared with the transmits that send it).
pub(crate) type RouterBuf = Arc<Vec<u8>>;

/// Router buffers: free lists per pool and the filled buffers by message.
#[derive(Debug, Default)]
pub(crate) struct RouterBuffers {
    free: Mutex<[Vec<Vec<u8>>; 3]>,
    filled: Mutex<HashMap<RxId, RouterBuf>>,
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
    /// A buffer of `len` bytes from `pool` (allocated if the pool is empty).
    pub(crate) fn take(&self, pool: PoolKind, len: usize) -> Vec<u8> {
        let mut v = self.free.lock()[pool_index(pool)].pop().unwrap_or_default();
        v.resize(len, 0);
        v
    }

    /// Gives back a buffer that was never filled.
    pub(crate) fn give_back(&self, pool: PoolKind, mut v: Vec<u8>) {
        v.clear();
        let mut free = self.free.lock();
        let list = &mut free[pool_index(pool)];
        if list.len() < FREE_KEEP {
            list.push(v);
        }
    }

    pub(crate) fn insert(&self, rx: RxId, buf: Vec<u8>) {
        self.filled.lock().insert(rx, Arc::new(buf));
    }

    pub(crate) fn get(&self, rx: RxId) -> Option<RouterBuf> {
        self.filled.lock().get(&rx).cloned()
    }

    /// The node no longer needs `rx`'s buffer.
    pub(crate) fn release(&self, rx: RxId) {
        let Some(buf) = self.filled.lock().remove(&rx) else {
            return;
        };
        if let Ok(v) = Arc::try_unwrap(buf) {
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
