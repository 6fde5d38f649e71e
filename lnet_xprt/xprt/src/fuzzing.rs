//! Entry points for the fuzz targets (feature `fuzzing`; also compiled in
//! tests): the decoders of what arrives from the network, fed arbitrary
//! bytes. Each must refuse bad input with an error, never panic, and what
//! it accepts must survive being encoded and decoded again.

use crate::addr::{hdr_data, parse_hdr};
use crate::ctl::Ctl;
use crate::desc::{BulkTarget, EXTRA_LEN};

/// A control message (bulk request, verdict, abort, NAK, DELIVERED,
/// gone): decoded, re-encoded and decoded again to the same kind of
/// message about the same operation. (Error details are free text and
/// may be reworded on the way: only the operation is compared.)
pub fn control_message(data: &[u8]) {
    if let Ok(c) = Ctl::decode(data) {
        let again = Ctl::decode(&c.encode()).expect("a re-encoded control message decodes");
        assert_eq!(again.xid(), c.xid());
        assert_eq!(
            std::mem::discriminant(&again),
            std::mem::discriminant(&c),
            "{c:?} became {again:?}"
        );
    }
}

/// The LNet part of a buffer descriptor (40 bytes: where the passive
/// buffer is): decoded and re-encoded to the same bytes.
pub fn descriptor_extra(data: &[u8]) {
    if let Ok(t) = BulkTarget::decode(data) {
        assert_eq!(data.len(), EXTRA_LEN);
        assert_eq!(t.encode(), data);
    }
}

/// A PUT's header data (the sender's portal, TMID and sequence number):
/// what parses rebuilds the same 64 bits.
pub fn header_data(data: &[u8]) {
    let Some(b) = data.get(..8) else { return };
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    let v = u64::from_le_bytes(a);
    if let Some((kind, portal, tmid, seq)) = parse_hdr(v) {
        assert_eq!(hdr_data(kind, portal, tmid, seq), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_take_garbage() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            control_message(&bytes);
            descriptor_extra(&bytes);
            header_data(&bytes);
        }
    }
}
