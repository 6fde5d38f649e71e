//! Maps keyed by [`Nid`] for the per-message lookups of the send and
//! receive paths (health, credits, selection, traffic counts).
//!
//! A node that knows a thousand peers looks several of them up for every
//! message; in a B-tree each lookup walks about ten nodes, each a likely
//! cache miss once the maps outgrow the caches. A hash map finds an entry
//! in one or two probes. The hash is a keyed folded multiply (the key is
//! drawn once per process from the standard library's random source), so
//! a peer that chooses the NIDs it announces cannot aim them at one bucket
//! without knowing the key.
//!
//! The order of iteration of these maps varies from one process to the
//! next: code must never let it decide anything. The maps here are only
//! ever looked up by key; a listing sorts what it takes out (see
//! [`sorted_keys`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use crate::ids::Nid;

/// A hash map keyed by NID (see the module docs).
pub type NidMap<V> = HashMap<Nid, V, NidHash>;

/// A hash map keyed by a number the node allocates (message ids): the
/// same hash, for the same reasons (values are only looked up by key, and
/// a B-tree of large values moves them about on every removal).
pub type IdMap<V> = HashMap<u64, V, NidHash>;

/// A hash map with the same keyed hash for the other keys of the
/// per-message paths (connection, memory and receive ids, handles): looked
/// up by key only, never listed in its own order.
pub type KeyedMap<K, V> = HashMap<K, V, NidHash>;

/// A new, empty [`NidMap`].
#[must_use]
pub fn nid_map<V>() -> NidMap<V> {
    HashMap::with_hasher(NidHash::default())
}

/// The keys of `map`, in NID order (for listings).
#[must_use]
pub fn sorted_keys<V>(map: &NidMap<V>) -> Vec<Nid> {
    let mut keys: Vec<Nid> = map.keys().copied().collect();
    keys.sort_unstable();
    keys
}

/// The per-process key of the hash, drawn once.
fn process_key() -> (u64, u64) {
    static KEY: OnceLock<(u64, u64)> = OnceLock::new();
    *KEY.get_or_init(|| {
        let s = std::collections::hash_map::RandomState::new();
        // Odd multiplier, so the multiply loses no bit of the input.
        (s.hash_one(0x6e69_645f_6b65_795fu64), s.hash_one(1u64) | 1)
    })
}

/// Builds [`NidHasher`]s with the process's key.
#[derive(Clone, Copy, Debug)]
pub struct NidHash {
    k0: u64,
    k1: u64,
}

impl Default for NidHash {
    fn default() -> Self {
        let (k0, k1) = process_key();
        Self { k0, k1 }
    }
}

impl BuildHasher for NidHash {
    type Hasher = NidHasher;

    fn build_hasher(&self) -> NidHasher {
        NidHasher {
            state: self.k0,
            k1: self.k1,
        }
    }
}

/// Hashes the integers a [`Nid`] is made of: each word is mixed in with a
/// 64x64->128-bit multiply by the key, folded (high half XOR low half).
#[derive(Clone, Copy, Debug)]
pub struct NidHasher {
    state: u64,
    k1: u64,
}

impl NidHasher {
    #[inline]
    fn mix(&mut self, v: u64) {
        let m = u128::from(self.state ^ v) * u128::from(self.k1);
        #[allow(clippy::cast_possible_truncation)]
        let folded = (m as u64) ^ ((m >> 64) as u64);
        self.state = folded;
    }
}

impl Hasher for NidHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }

    #[inline]
    fn finish(&self) -> u64 {
        // One more round so that the top bits (hashbrown's control byte)
        // depend on every input bit.
        let m = u128::from(self.state) * u128::from(self.k1 ^ 0x9e37_79b9_7f4a_7c15);
        #[allow(clippy::cast_possible_truncation)]
        let folded = (m as u64) ^ ((m >> 64) as u64);
        folded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_sorted_listing() {
        let mut m = nid_map();
        let nids: Vec<Nid> = (0..2000u32)
            .map(|i| {
                format!("10.{}.{}.{}@tcp{}", i % 7, i / 256, i % 256, i % 3)
                    .parse()
                    .unwrap()
            })
            .collect();
        for (i, n) in nids.iter().enumerate() {
            m.insert(*n, i);
        }
        assert_eq!(m.len(), nids.len());
        for (i, n) in nids.iter().enumerate() {
            assert_eq!(m.get(n), Some(&i));
        }
        let keys = sorted_keys(&m);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys.len(), nids.len());
    }

    #[test]
    fn nids_that_differ_in_one_bit_spread_over_buckets() {
        // Addresses 0..4096 on one net: the low 12 bits of the hashes
        // (a table of 4096 buckets) take most of the possible values.
        let b = NidHash::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096u32 {
            let nid: Nid = format!("192.168.{}.{}@tcp", i / 256, i % 256)
                .parse()
                .unwrap();
            seen.insert(b.hash_one(nid) & 0xfff);
        }
        assert!(seen.len() > 2400, "{} distinct of 4096", seen.len());
    }
}
