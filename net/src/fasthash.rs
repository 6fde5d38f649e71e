//! A fast hasher for the maps on the per-message paths (the RPC layer's
//! xids and sessions, a transport's connections and transfers, a transfer
//! machine's end points): a multiply-rotate mix (in the style of FxHash),
//! much cheaper than SipHash. Keys may come from peers, so the hash is
//! seeded with a per-process random value (from the standard library's
//! OS-seeded `RandomState`): colliding keys cannot be computed in advance.
//!
//! ```
//! use colibri_net::fasthash::FastMap;
//! let mut m: FastMap<u64, &str> = FastMap::default();
//! m.insert(7, "seven");
//! assert_eq!(m.get(&7), Some(&"seven"));
//! ```

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// The hasher (build one through [`FastState`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut a = [0u8; 8];
            a[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(a));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(K);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Builds [`FastHasher`]s starting from the process's random seed.
#[derive(Debug, Clone, Copy)]
pub struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        Self(*SEED.get_or_init(|| RandomState::new().hash_one(0x5eed_u64) | 1))
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// A `HashMap` with the fast hasher.
pub type FastMap<K, V> = HashMap<K, V, FastState>;
