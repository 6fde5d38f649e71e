//! Addresses of the in-memory transport and the process-wide registry of
//! started transfer machines.

use std::sync::{Arc, Weak};

use colibri_net::NetError;
use colibri_net::registry::Registry;
use parking_lot::Mutex;

use crate::tm::Shared;

/// An in-memory address: `a.b.c.d:port` or `a.b.c.d:port:service`.
///
/// Service 0 is the same as no service, so `127.0.0.1:5000` and
/// `127.0.0.1:5000:0` name the same end point; the canonical form
/// ([`InetAddr::compact`](colibri_net::addr::InetAddr::compact)) omits a
/// zero service.
pub use colibri_net::addr::InetAddr as MemAddr;

/// Started transfer machines by address (the core's registry).
static REGISTRY: Registry<Shared> = Registry::new();

/// Claims `addr` for `tm`; port 0 picks a free port. Returns the address
/// actually claimed.
pub(crate) fn register(addr: MemAddr, tm: &Arc<Shared>) -> Result<MemAddr, NetError> {
    REGISTRY.claim(addr, tm)
}

/// Releases `addr` if `tm` holds it.
pub(crate) fn unregister(addr: MemAddr, tm: &Arc<Shared>) {
    REGISTRY.release(&addr, tm);
}

/// The transfer machine started at `addr`, if any.
pub(crate) fn lookup(addr: &MemAddr) -> Option<Arc<Shared>> {
    REGISTRY.lookup(addr)
}

/// The transport's data of an end point: its address, and the transfer
/// machine last found there (valid while the registry has not changed).
#[derive(Debug)]
pub(crate) struct MemEp {
    pub(crate) addr: MemAddr,
    cache: Mutex<(u64, Weak<Shared>)>,
}

impl MemEp {
    pub(crate) fn new(addr: MemAddr) -> Self {
        Self {
            addr,
            cache: Mutex::new((0, Weak::new())),
        }
    }

    /// The transfer machine started at this address, if any; the global
    /// registry is only consulted after it changed.
    pub(crate) fn lookup(&self) -> Option<Arc<Shared>> {
        let generation = REGISTRY.generation();
        let mut c = self.cache.lock();
        if c.0 == generation
            && let Some(tm) = c.1.upgrade()
        {
            return Some(tm);
        }
        let found = lookup(&self.addr);
        *c = (
            generation,
            found.as_ref().map_or_else(Weak::new, Arc::downgrade),
        );
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_omits_a_zero_service() {
        let a = MemAddr::parse("127.0.0.1:5000:0").unwrap();
        assert_eq!(a.compact(), "127.0.0.1:5000");
        assert_eq!(
            MemAddr::parse("10.1.2.3:7:42").unwrap().compact(),
            "10.1.2.3:7:42"
        );
    }
}
