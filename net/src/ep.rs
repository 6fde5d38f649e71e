//! End points.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::sync::AtomicBool;

use crate::tm::TmId;
use crate::xprt::XprtData;

pub(crate) struct EpInner {
    pub(crate) addr: String,
    pub(crate) tm: TmId,
    pub(crate) data: XprtData,
    /// Held by the transfer machine's cache of recent senders.
    pub(crate) cached: AtomicBool,
}

/// An addressable peer, as seen by one transfer machine.
///
/// Made by [`TmHandle::ep_create`](crate::TmHandle::ep_create) from an
/// address string, or handed to receive callbacks as the sender of a
/// message. Creating the same address twice in one transfer machine gives
/// the same end point. The handle is reference counted: `clone` takes a
/// reference (Motr's `end_point_get`) and `drop` releases it
/// (`end_point_put`); the transport's resources for it are released when
/// the last reference goes. The transfer machine keeps the end points of
/// its most recent message senders (up to 64) alive in a cache of its own,
/// so that a busy peer's end point is not re-created for every message;
/// that cache is not counted by [`EndPoint::ref_count`] and is emptied by
/// finalisation. An end point belongs to the transfer machine
/// that made it; its printable [`addr`](EndPoint::addr) recreates it in
/// another one.
#[derive(Clone)]
pub struct EndPoint(pub(crate) Arc<EpInner>);

impl EndPoint {
    /// The canonical printable address.
    pub fn addr(&self) -> &str {
        &self.0.addr
    }

    /// The transfer machine this end point belongs to.
    pub fn tm_id(&self) -> TmId {
        self.0.tm
    }

    /// Number of references currently held (application handles, queued
    /// sends, pending events). The transfer machine's own cache of recent
    /// message senders is not counted.
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.0) - usize::from(self.0.cached.load(Ordering::Acquire))
    }

    /// The transport's parsed form of the address (for transports).
    pub fn xprt_data(&self) -> &XprtData {
        &self.0.data
    }

    /// The transport's parsed form, downcast to the transport's type.
    pub fn downcast<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.0.data.downcast_ref::<T>()
    }
}

impl PartialEq for EndPoint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EndPoint {}

impl Hash for EndPoint {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as *const u8 as usize).hash(state);
    }
}

impl fmt::Debug for EndPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndPoint")
            .field("addr", &self.0.addr)
            .field("tm", &self.0.tm)
            .finish()
    }
}

impl fmt::Display for EndPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.addr)
    }
}
