//! Failure statuses carried in TCP transport responses: decoding an
//! arbitrary code and detail never panics, and what decodes survives an
//! encode/decode round trip unchanged.
#![no_main]

use colibri_bulk_tcp::wire::{decode_status, encode_status};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let code = u16::from_le_bytes([data[0], data[1]]);
    if let Ok(e) = decode_status(code, &data[2..]) {
        let (c2, d2) = encode_status(&e);
        if d2.len() == data.len() - 2 {
            assert_eq!(c2, code);
        }
        assert_eq!(decode_status(c2, &d2).ok(), Some(e));
    }
});
