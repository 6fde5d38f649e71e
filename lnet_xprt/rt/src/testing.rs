//! Test support (feature `test-util`, off by default): what the tests of
//! this crate and of the `colibri` program share to exercise the socket
//! LND against real interfaces. Not part of the API.

use std::net::Ipv4Addr;
use std::process::Command;

/// A veth pair made for one test (`ip link add ... type veth`), its end
/// `a` holding `addr`/32 (a loopback address: the kernel still delivers it
/// locally, through lo's 127/8, whatever the pair's state), both ends up;
/// deleted when dropped, on every path (a failed assertion included).
#[derive(Debug)]
pub struct Veth {
    /// The end holding the address.
    pub a: String,
    /// The other end (setting it down takes `a`'s carrier away).
    pub b: String,
}

impl Veth {
    /// Makes the pair, or returns `None` where the machine cannot (no
    /// `ip`, no privilege, no veth driver), having printed that the
    /// calling test skips.
    ///
    /// # Panics
    /// An `ip` command that fails once the pair exists.
    #[must_use]
    pub fn new(addr: Ipv4Addr) -> Option<Self> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        // Interface names are at most 15 bytes: "cv" + 5 + "x" + 2 + "a".
        let base = format!(
            "cv{}x{}",
            std::process::id() % 100_000,
            N.fetch_add(1, Ordering::Relaxed) % 100
        );
        let v = Self {
            a: format!("{base}a"),
            b: format!("{base}b"),
        };
        let made = Command::new("ip")
            .args(["link", "add", &v.a, "type", "veth", "peer", "name", &v.b])
            .output()
            .is_ok_and(|o| o.status.success());
        if !made {
            eprintln!(
                "skipped: this machine cannot make a veth pair (`ip link add ... type veth`)"
            );
            return None;
        }
        // From here `v` deletes the pair however the set-up ends.
        ip(&["addr", "add", &format!("{addr}/32"), "dev", &v.a]);
        v.set(&v.b, true);
        v.set(&v.a, true);
        Some(v)
    }

    /// `ip link set dev END up|down`.
    ///
    /// # Panics
    /// The command fails.
    pub fn set(&self, end: &str, up: bool) {
        ip(&["link", "set", "dev", end, if up { "up" } else { "down" }]);
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting one end deletes its peer.
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

/// Runs `ip ARGS`.
///
/// # Panics
/// It cannot run or fails.
pub fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
