//! The transport's bytes in a descriptor (the `extra` field of the core's
//! descriptor format): where the passive buffer is on LNet.
//!
//! ```text
//! off size field (little-endian)
//!   0    1 version (1)
//!   1    1 reserved (0)
//!   2    2 TMID
//!   4    4 portal
//!   8    8 NID
//!  16    4 PID
//!  20    4 reserved (0)
//!  24    8 match bits of the passive buffer's ME
//!  32    8 length (bytes offered, or space)
//! ```

use colibri_lnet_rt::colibri_lnet::ids::{Nid, ProcessId};
use colibri_net::NetError;

use crate::addr::{PORTALS, TMID_MAX, split_bits};

/// Size of the extra bytes.
pub(crate) const EXTRA_LEN: usize = 40;

/// Where a passive buffer is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BulkTarget {
    pub(crate) proc_: ProcessId,
    pub(crate) portal: u32,
    pub(crate) tmid: u16,
    pub(crate) bits: u64,
    pub(crate) len: u64,
    /// The owner's canonical address (from the core's descriptor; not
    /// encoded here).
    pub(crate) owner: String,
}

impl BulkTarget {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(EXTRA_LEN);
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&self.tmid.to_le_bytes());
        v.extend_from_slice(&self.portal.to_le_bytes());
        v.extend_from_slice(&self.proc_.nid.as_u64().to_le_bytes());
        v.extend_from_slice(&self.proc_.pid.to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        v.extend_from_slice(&self.bits.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, NetError> {
        let bad = |why: &str| NetError::InvalidDescriptor(format!("LNet part: {why}"));
        if b.len() != EXTRA_LEN {
            return Err(bad("wrong length"));
        }
        let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64at = |o: usize| {
            let mut a = [0; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        if b[0] != 1 {
            return Err(bad("unknown version"));
        }
        if b[1] != 0 || u32at(20) != 0 {
            return Err(bad("reserved bytes set"));
        }
        let tmid = u16at(2);
        let portal = u32at(4);
        let bits = u64at(24);
        if tmid > TMID_MAX || !PORTALS.contains(&portal) || split_bits(bits).0 != tmid {
            return Err(bad("TMID, portal or match bits out of range"));
        }
        Ok(Self {
            proc_: ProcessId::new(Nid::from_u64(u64at(8)), u32at(16)),
            portal,
            tmid,
            bits,
            len: u64at(32),
            owner: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(nid in any::<u64>(), pid in any::<u32>(), portal in 1u32..=63, tmid in 0u16..=TMID_MAX, c in 0u64..(1 << 52), len in any::<u64>()) {
            let t = BulkTarget {
                proc_: ProcessId::new(Nid::from_u64(nid), pid),
                portal,
                tmid,
                bits: crate::addr::match_bits(tmid, c),
                len,
                owner: String::new(),
            };
            prop_assert_eq!(BulkTarget::decode(&t.encode()).unwrap(), t);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..60)) {
            let _ = BulkTarget::decode(&b);
        }
    }
}
