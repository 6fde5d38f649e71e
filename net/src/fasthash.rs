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
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut a = [0u8; 8];
            a.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(a));
        }
        // The tail folded byte by byte: a short copy would be a call to
        // memcpy (an IPv4 address is four bytes).
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let v = rest
                .iter()
                .enumerate()
                .fold(0u64, |v, (i, &b)| v | u64::from(b) << (8 * i));
            self.write_u64(v);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hash<T: std::hash::Hash>(s: &FastState, v: &T) -> u64 {
        s.hash_one(v)
    }

    #[test]
    fn equal_keys_hash_equal_and_tails_count() {
        let s = FastState::default();
        assert_eq!(hash(&s, &"127.0.0.1:4000:7"), hash(&s, &"127.0.0.1:4000:7"));
        // Every byte of a tail shorter than eight bytes takes part.
        let mut seen = std::collections::HashSet::new();
        for len in 0..16 {
            for b in 0..=255u8 {
                let mut v = vec![0u8; len];
                if len > 0 {
                    v[len - 1] = b;
                }
                seen.insert(hash(&s, &v));
            }
        }
        assert!(seen.len() > 15 * 255, "{} distinct", seen.len());
        let mut m: FastMap<(u32, u16, u32), u32> = FastMap::default();
        for i in 0..10_000u32 {
            m.insert((0x7f00_0001, (i % 300) as u16, i), i);
        }
        assert!((0..10_000u32).all(|i| m[&(0x7f00_0001, (i % 300) as u16, i)] == i));
    }
}
