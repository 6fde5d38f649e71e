//! The socklnd checksum: Linux's `crc32_le` seeded with all ones and not
//! inverted at the end (`ksocknal_csum(~0, …)`, `socklnd.h`).
//!
//! That is the bitwise NOT of the usual CRC-32 (zlib, Ethernet): the
//! reflected polynomial 0xEDB88320, initial value 0xFFFFFFFF, no final XOR.

/// The reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xEDB8_8320;

/// Byte-at-a-time lookup table, built at compile time.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// A running socklnd checksum.
///
/// ```
/// use colibri_lnet::socklnd::Crc32;
///
/// let mut c = Crc32::new();
/// c.update(b"1234");
/// c.update(b"56789");
/// // The standard CRC-32 of "123456789" is 0xCBF43926; socklnd's value is
/// // its complement.
/// assert_eq!(c.value(), !0xCBF4_3926);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A checksum over no bytes yet (state `~0`, as Lustre seeds it).
    #[must_use]
    pub const fn new() -> Self {
        Self { state: !0 }
    }

    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut c = self.state;
        for &b in bytes {
            c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
        }
        self.state = c;
    }

    /// The checksum of the bytes added so far, as Lustre puts it in
    /// `ksm_csum`.
    #[must_use]
    pub const fn value(&self) -> u32 {
        self.state
    }
}

/// The checksum of a protocol V3 message: over the payload only (a V3
/// receiver leaves the headers out, `ksocknal_lib_recv`); an empty payload
/// gives 0xFFFFFFFF.
#[must_use]
pub fn payload_checksum(payload: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(payload);
    c.value()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit-at-a-time reference, written from the definition.
    fn reference(bytes: &[u8]) -> u32 {
        let mut c: u32 = !0;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                let mask = (c & 1).wrapping_neg();
                c = (c >> 1) ^ (POLY & mask);
            }
        }
        c
    }

    #[test]
    fn known_values() {
        // Check values of CRC-32/ISO-HDLC, complemented (no final XOR).
        assert_eq!(payload_checksum(b"123456789"), !0xCBF4_3926);
        assert_eq!(payload_checksum(b""), 0xFFFF_FFFF);
        assert_eq!(
            payload_checksum(b"The quick brown fox jumps over the lazy dog"),
            !0x414F_A339
        );
        assert_eq!(TABLE[1], 0x7707_3096);
        assert_eq!(TABLE[255], 0x2D02_EF8D);
    }

    proptest! {
        #[test]
        fn table_matches_bitwise_and_chunks_compose(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            cut in 0usize..300,
        ) {
            let cut = cut.min(data.len());
            let mut c = Crc32::new();
            c.update(&data[..cut]);
            c.update(&data[cut..]);
            prop_assert_eq!(c.value(), reference(&data));
            prop_assert_eq!(payload_checksum(&data), reference(&data));
        }
    }
}
