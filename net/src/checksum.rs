//! CRC-32C (Castagnoli), the integrity check of descriptors and of the
//! transports' wire headers.
//!
//! On x86-64 CPUs with SSE4.2 (detected once at run time) the CPU's own
//! `crc32` instruction does eight bytes per instruction; elsewhere
//! slicing-by-8 (eight 256-entry tables computed at compile time: eight
//! bytes per step) gives the same values. It protects against corruption
//! and accidental misuse, not against an adversary: descriptors carry a
//! random cookie for that.

const POLY: u32 = 0x82F6_3B78; // reflected Castagnoli polynomial

const TABLE: [u32; 256] = build_table();
const TABLES: [[u32; 256]; 8] = build_tables();

const fn build_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

const fn build_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    t[0] = build_table();
    let mut i = 0;
    while i < 256 {
        let mut k = 1;
        while k < 8 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            k += 1;
        }
        i += 1;
    }
    t
}

/// Incremental CRC-32C state.
#[derive(Debug, Clone, Copy)]
pub struct Crc32c(u32);

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// A fresh checksum.
    pub const fn new() -> Self {
        Self(!0)
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if hw::available() {
            self.0 = hw::update(self.0, data);
            return;
        }
        self.update_sliced(data);
    }

    /// [`Crc32c::update`] with the tables.
    fn update_sliced(&mut self, data: &[u8]) {
        let mut crc = self.0;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let lo = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ crc;
            let hi = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            crc = TABLES[7][(lo & 0xff) as usize]
                ^ TABLES[6][((lo >> 8) & 0xff) as usize]
                ^ TABLES[5][((lo >> 16) & 0xff) as usize]
                ^ TABLES[4][(lo >> 24) as usize]
                ^ TABLES[3][(hi & 0xff) as usize]
                ^ TABLES[2][((hi >> 8) & 0xff) as usize]
                ^ TABLES[1][((hi >> 16) & 0xff) as usize]
                ^ TABLES[0][(hi >> 24) as usize];
        }
        for &b in chunks.remainder() {
            crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
        }
        self.0 = crc;
    }

    /// The checksum of everything fed so far.
    pub const fn finish(&self) -> u32 {
        !self.0
    }
}

/// The CPU's CRC-32C instruction (SSE4.2), the only `unsafe` of this
/// crate.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod hw {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    use std::sync::OnceLock;

    /// True when the CPU has SSE4.2 (asked once).
    pub(super) fn available() -> bool {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("sse4.2"))
    }

    /// Feeds `data` into the running (not inverted) `crc`. Call only when
    /// [`available`] said so.
    pub(super) fn update(crc: u32, data: &[u8]) -> u32 {
        debug_assert!(available());
        // SAFETY: `available()` checked at run time that this CPU has
        // SSE4.2, the only target feature `update_sse42` enables; the
        // function itself only reads `data` through safe slices.
        unsafe { update_sse42(crc, data) }
    }

    /// [`update`] for a block whose size is known at compile time (a
    /// wire header): the loop is unrolled and no length is checked.
    pub(super) fn update_fixed<const N: usize>(crc: u32, data: &[u8; N]) -> u32 {
        debug_assert!(available());
        // SAFETY: as in `update`: SSE4.2 was detected at run time.
        unsafe { fixed_sse42(crc, data) }
    }

    #[target_feature(enable = "sse4.2")]
    fn fixed_sse42<const N: usize>(crc: u32, data: &[u8; N]) -> u32 {
        // The general loop, inlined here with a length known at compile
        // time, so that it is unrolled.
        update_sse42(crc, data)
    }

    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn update_sse42(crc: u32, data: &[u8]) -> u32 {
        let mut c = u64::from(crc);
        let mut chunks = data.chunks_exact(8);
        for w in &mut chunks {
            let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            c = _mm_crc32_u64(c, v);
        }
        let mut c = c as u32;
        for &b in chunks.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        c
    }
}

/// CRC-32C of a block whose size is known at compile time (a wire
/// header): the same value as [`crc32c`], with less work per call.
#[inline]
pub fn crc32c_fixed<const N: usize>(data: &[u8; N]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if hw::available() {
        return !hw::update_fixed(!0, data);
    }
    crc32c(data)
}

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    c.update(data);
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 appendix B.4 test vectors.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn sliced_matches_bytewise() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 999] {
            let mut bytewise = !0u32;
            for &b in &data[..len] {
                bytewise = TABLE[((bytewise ^ u32::from(b)) & 0xff) as usize] ^ (bytewise >> 8);
            }
            assert_eq!(crc32c(&data[..len]), !bytewise, "len {len}");
        }
    }

    #[test]
    fn hardware_matches_tables() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 131 + 7) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000, 2999] {
            let mut sliced = Crc32c::new();
            sliced.update_sliced(&data[..len]);
            let mut any = Crc32c::new();
            any.update(&data[..len]);
            assert_eq!(any.finish(), sliced.finish(), "len {len}");
        }
    }

    #[test]
    fn fixed_size_matches() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 13 + 5) as u8).collect();
        let a64: [u8; 64] = data[..64].try_into().unwrap();
        assert_eq!(crc32c_fixed(&a64), crc32c(&a64));
        let a13: [u8; 13] = data[7..20].try_into().unwrap();
        assert_eq!(crc32c_fixed(&a13), crc32c(&a13));
        assert_eq!(crc32c_fixed(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..200u8).collect();
        let mut c = Crc32c::new();
        c.update(&data[..77]);
        c.update(&data[77..]);
        assert_eq!(c.finish(), crc32c(&data));
    }
}
