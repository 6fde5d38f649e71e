//! TCP transport frame headers with a correct magic, version and checksum,
//! so that every field check runs on arbitrary field values: never panics;
//! what decodes re-encodes to the same bytes and keeps its invariants.
#![no_main]

use colibri_bulk_tcp::wire::{HEADER_LEN, Header, MAGIC, VERSION};
use colibri_net::checksum::crc32c;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 + HEADER_LEN {
        return;
    }
    let max = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let mut b = [0u8; HEADER_LEN];
    b.copy_from_slice(&data[4..4 + HEADER_LEN]);
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4] = VERSION;
    let crc = crc32c(&b[..64]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    if let Ok(h) = Header::decode(&b, max) {
        assert_eq!(h.encode(), b);
        assert!(u32::from(h.desc_len) <= h.body_len);
        assert!(h.offset.checked_add(u64::from(h.chunk)).is_some());
    }
});
