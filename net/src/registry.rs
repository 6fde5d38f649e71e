//! The registry of started transfer machines' addresses: one mechanism for
//! every transport that names its machines with [`InetAddr`]s.
//!
//! A transport keeps one `static` registry of its own transfer machines,
//! keyed by `a.b.c.d:port:service`, holding them weakly (a machine that
//! went away without releasing its address frees it). Claiming a live
//! address fails with `AddrInUse`; port 0 picks a free port in constant
//! time on average (a rotating cursor over the dynamic range, for
//! transports whose ports are not the kernel's); the generation counter
//! lets end points cache a lookup until the registry changes.
//!
//! ```
//! use std::sync::Arc;
//! use colibri_net::addr::InetAddr;
//! use colibri_net::registry::Registry;
//!
//! static MACHINES: Registry<String> = Registry::new();
//! let me = Arc::new("machine".to_string());
//! let got = MACHINES.claim(InetAddr::parse("127.0.0.1:0:7")?, &me)?;
//! assert_ne!(got.port, 0);
//! assert!(MACHINES.claim(got, &me).is_err());
//! assert_eq!(MACHINES.lookup(&got).as_deref(), Some(&*me));
//! MACHINES.release(&got, &me);
//! assert!(MACHINES.lookup(&got).is_none());
//! # Ok::<(), colibri_net::NetError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::addr::InetAddr;
use crate::error::NetError;
use crate::fasthash::FastMap;

/// First port of the dynamic range used for port 0.
pub const DYNAMIC_PORT_BASE: u16 = 32768;

/// Started transfer machines (or what a transport keeps for them) by
/// address.
pub struct Registry<T> {
    inner: Mutex<Inner<T>>,
    generation: AtomicU64,
}

struct Inner<T> {
    map: BTreeMap<Key, Weak<T>>,
    /// The same entries by hash, for [`Registry::lookup`] (once per
    /// incoming message: constant time with thousands of machines). Made
    /// at the first claim (the registry is a `static`).
    index: Option<FastMap<Key, Weak<T>>>,
    /// Where the next search for a free dynamic port starts.
    cursor: u16,
}

/// Ordered by IP, then port, then service, so that the services of one
/// listening point are a range.
type Key = (u32, u16, u32);

fn key(a: &InetAddr) -> Key {
    (u32::from(a.ip), a.port, a.service)
}

impl<T> fmt::Debug for Registry<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("entries", &self.inner.lock().map.len())
            .field("generation", &self.generation())
            .finish()
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Registry<T> {
    /// An empty registry (usable in a `static`).
    pub const fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                map: BTreeMap::new(),
                index: None,
                cursor: DYNAMIC_PORT_BASE,
            }),
            generation: AtomicU64::new(1),
        }
    }

    /// Changes whenever an address is claimed or released.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Claims `addr` for `v`; port 0 picks a free port of the dynamic
    /// range (32768 and up). Returns the address claimed.
    ///
    /// # Errors
    /// `AddrInUse` when a live entry holds the address (or no dynamic port
    /// is left).
    pub fn claim(&self, addr: InetAddr, v: &Arc<T>) -> Result<InetAddr, NetError> {
        let mut g = self.inner.lock();
        let taken =
            |g: &Inner<T>, a: &InetAddr| g.map.get(&key(a)).is_some_and(|w| w.strong_count() > 0);
        let addr = if addr.port == 0 {
            let span = u32::from(u16::MAX - DYNAMIC_PORT_BASE) + 1;
            let start = g.cursor;
            let found = (0..span)
                .map(|i| {
                    let off = (u32::from(start - DYNAMIC_PORT_BASE) + i) % span;
                    InetAddr {
                        port: DYNAMIC_PORT_BASE + off as u16,
                        ..addr
                    }
                })
                .find(|a| !taken(&g, a))
                .ok_or_else(|| NetError::AddrInUse(format!("{}:0 (no free port left)", addr.ip)))?;
            g.cursor = if found.port == u16::MAX {
                DYNAMIC_PORT_BASE
            } else {
                found.port + 1
            };
            found
        } else {
            if taken(&g, &addr) {
                return Err(NetError::AddrInUse(addr.to_string()));
            }
            addr
        };
        g.map.insert(key(&addr), Arc::downgrade(v));
        g.index
            .get_or_insert_with(FastMap::default)
            .insert(key(&addr), Arc::downgrade(v));
        drop(g);
        self.bump();
        Ok(addr)
    }

    /// Releases `addr` if `v` holds it. Returns true if it did.
    pub fn release(&self, addr: &InetAddr, v: &T) -> bool {
        let mut g = self.inner.lock();
        let k = key(addr);
        let held = g.map.get(&k).is_some_and(|w| std::ptr::eq(w.as_ptr(), v));
        if held {
            g.map.remove(&k);
            if let Some(i) = g.index.as_mut() {
                i.remove(&k);
            }
            drop(g);
            self.bump();
        }
        held
    }

    /// The live entry at `addr`.
    pub fn lookup(&self, addr: &InetAddr) -> Option<Arc<T>> {
        self.inner
            .lock()
            .index
            .as_ref()?
            .get(&key(addr))
            .and_then(Weak::upgrade)
    }

    /// True while a live entry holds any service at `ip:port`.
    pub fn any_at(&self, ip: Ipv4Addr, port: u16) -> bool {
        let lo = (u32::from(ip), port, 0);
        let hi = (u32::from(ip), port, u32::MAX);
        self.inner
            .lock()
            .map
            .range(lo..=hi)
            .any(|(_, w)| w.strong_count() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> InetAddr {
        InetAddr::parse(s).unwrap()
    }

    #[test]
    fn claim_release_and_dead_entries() {
        let r: Registry<u8> = Registry::new();
        let x = Arc::new(1);
        let y = Arc::new(2);
        let g0 = r.generation();
        r.claim(a("127.0.0.1:5000:1"), &x).unwrap();
        assert!(r.generation() > g0);
        assert!(matches!(
            r.claim(a("127.0.0.1:5000:1"), &y),
            Err(NetError::AddrInUse(_))
        ));
        r.claim(a("127.0.0.1:5000:2"), &y).unwrap();
        assert!(r.any_at("127.0.0.1".parse().unwrap(), 5000));
        assert!(!r.any_at("127.0.0.1".parse().unwrap(), 5001));
        assert!(!r.release(&a("127.0.0.1:5000:1"), &y), "not y's");
        assert!(r.release(&a("127.0.0.1:5000:1"), &x));
        assert!(r.lookup(&a("127.0.0.1:5000:1")).is_none());
        // An entry whose holder is gone is free.
        drop(y);
        assert!(!r.any_at("127.0.0.1".parse().unwrap(), 5000));
        r.claim(a("127.0.0.1:5000:2"), &x).unwrap();
    }

    #[test]
    fn dynamic_ports_rotate_and_skip_taken_ones() {
        let r: Registry<u8> = Registry::new();
        let x = Arc::new(0);
        let p1 = r.claim(a("127.0.0.2:0"), &x).unwrap();
        let p2 = r.claim(a("127.0.0.2:0"), &x).unwrap();
        assert_eq!(p1.port, DYNAMIC_PORT_BASE);
        assert_eq!(p2.port, DYNAMIC_PORT_BASE + 1);
        // A port claimed explicitly ahead of the cursor is skipped.
        r.claim(a("127.0.0.2:32770"), &x).unwrap();
        assert_eq!(r.claim(a("127.0.0.2:0"), &x).unwrap().port, 32771);
        // Released ports are found again once the cursor wraps.
        assert!(r.release(&p1, &x));
        for _ in 0..(u16::MAX - 32771) {
            r.claim(a("127.0.0.2:0"), &x).unwrap();
        }
        assert_eq!(
            r.claim(a("127.0.0.2:0"), &x).unwrap().port,
            DYNAMIC_PORT_BASE
        );
        assert!(matches!(
            r.claim(a("127.0.0.2:0"), &x),
            Err(NetError::AddrInUse(_))
        ));
    }
}
