//! Whole LNet messages (header and payload): never panics; round trips.
#![no_main]

use colibri_lnet::wire::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::decode(data) {
        let again = Message::decode(&m.encode()).expect("re-decode");
        assert_eq!(again, m);
    }
});
