//! TCP transport frame headers: decoding arbitrary bytes never panics, and
//! whatever decodes re-encodes to the same bytes. The first four bytes pick
//! the receiver's body limit.
#![no_main]

use colibri_bulk_tcp::wire::{HEADER_LEN, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let max = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let b = &data[4..];
    if let Ok(h) = Header::decode(b, max) {
        assert_eq!(&h.encode()[..], &b[..HEADER_LEN]);
        assert!(u32::from(h.desc_len) <= h.body_len);
        if h.opcode == colibri_bulk_tcp::wire::Opcode::Msg {
            assert!(h.body_len <= max);
        }
    }
});
