//! LNet header decoding: never panics; a decoded header re-encodes into
//! bytes that decode to the same header.
#![no_main]

use colibri_lnet::wire::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        let again = Header::decode(&h.encode()).expect("re-decode");
        assert_eq!(again, h);
    }
});
