//! Addresses of the in-memory transport and the process-wide registry of
//! started transfer machines.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use colibri_net::NetError;
use parking_lot::Mutex;

use crate::tm::Shared;

/// An in-memory address: `a.b.c.d:port` or `a.b.c.d:port:service`.
///
/// Service 0 is the same as no service, so `127.0.0.1:5000` and
/// `127.0.0.1:5000:0` name the same end point; the canonical form omits a
/// zero service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemAddr {
    /// IPv4 address (only a name here: nothing is bound).
    pub ip: Ipv4Addr,
    /// Port; 0 at start means "pick a free one".
    pub port: u16,
    /// Service id (the seed's third tuple).
    pub service: u32,
}

impl MemAddr {
    /// Parses an address.
    ///
    /// # Errors
    /// `InvalidAddress` naming what is wrong.
    pub fn parse(s: &str) -> Result<Self, NetError> {
        let bad = |reason: &str| NetError::InvalidAddress {
            addr: s.to_string(),
            reason: reason.to_string(),
        };
        let mut parts = s.split(':');
        let ip = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| bad("missing IPv4 address"))?
            .parse::<Ipv4Addr>()
            .map_err(|_| bad("not a dotted IPv4 address"))?;
        let port = parts
            .next()
            .ok_or_else(|| bad("missing port"))?
            .parse::<u16>()
            .map_err(|_| bad("port is not a number in 0..=65535"))?;
        let service = match parts.next() {
            None => 0,
            Some(p) => p
                .parse::<u32>()
                .map_err(|_| bad("service id is not a 32-bit number"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many ':'-separated parts"));
        }
        Ok(Self { ip, port, service })
    }
}

impl fmt::Display for MemAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.service == 0 {
            write!(f, "{}:{}", self.ip, self.port)
        } else {
            write!(f, "{}:{}:{}", self.ip, self.port, self.service)
        }
    }
}

/// Bumped whenever the registry changes, so that cached lookups know when
/// to look again.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Started transfer machines by address.
static REGISTRY: LazyLock<Mutex<HashMap<MemAddr, Weak<Shared>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// First port tried for port 0.
const DYNAMIC_PORT_BASE: u16 = 32768;

/// Claims `addr` for `tm`; port 0 picks a free port. Returns the address
/// actually claimed.
pub(crate) fn register(addr: MemAddr, tm: &Arc<Shared>) -> Result<MemAddr, NetError> {
    let mut reg = REGISTRY.lock();
    let taken = |reg: &HashMap<MemAddr, Weak<Shared>>, a: &MemAddr| {
        reg.get(a).is_some_and(|w| w.strong_count() > 0)
    };
    let addr = if addr.port == 0 {
        (DYNAMIC_PORT_BASE..=u16::MAX)
            .map(|port| MemAddr { port, ..addr })
            .find(|a| !taken(&reg, a))
            .ok_or_else(|| NetError::AddrInUse(format!("{}:0 (no free port left)", addr.ip)))?
    } else {
        if taken(&reg, &addr) {
            return Err(NetError::AddrInUse(addr.to_string()));
        }
        addr
    };
    reg.insert(addr, Arc::downgrade(tm));
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(addr)
}

/// Releases `addr` if `tm` holds it.
pub(crate) fn unregister(addr: MemAddr, tm: &Arc<Shared>) {
    let mut reg = REGISTRY.lock();
    if reg
        .get(&addr)
        .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(tm)))
    {
        reg.remove(&addr);
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The transfer machine started at `addr`, if any.
pub(crate) fn lookup(addr: &MemAddr) -> Option<Arc<Shared>> {
    REGISTRY.lock().get(addr).and_then(Weak::upgrade)
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
        let generation = GENERATION.load(Ordering::Acquire);
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
    fn parse_and_print() {
        let a = MemAddr::parse("127.0.0.1:5000").unwrap();
        assert_eq!((a.port, a.service), (5000, 0));
        assert_eq!(a.to_string(), "127.0.0.1:5000");
        let b = MemAddr::parse("10.1.2.3:7:42").unwrap();
        assert_eq!(b.to_string(), "10.1.2.3:7:42");
        assert_eq!(MemAddr::parse("127.0.0.1:5000:0").unwrap(), a);
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:",
            "256.0.0.1:1",
            "127.0.0.1:65536",
            "127.0.0.1:1:x",
            "127.0.0.1:1:2:3",
            "host:1",
            " 127.0.0.1:1",
        ] {
            assert!(
                matches!(MemAddr::parse(bad), Err(NetError::InvalidAddress { .. })),
                "{bad:?}"
            );
        }
    }
}
