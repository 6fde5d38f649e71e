//! LNet ping buffers (either byte order): never panics; round trips.
#![no_main]

use colibri_lnet::wire::PingInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PingInfo::decode(data) {
        let again = PingInfo::decode(&p.encode()).expect("re-decode");
        assert_eq!(again, p);
    }
});
