//! Descriptor decoding: never panics; whatever decodes re-encodes to the
//! same bytes.
#![no_main]

use colibri_net::NetBufDesc;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let d = NetBufDesc::from_bytes(data.to_vec());
    if let Ok(fields) = d.decode() {
        let again = NetBufDesc::encode(&fields, usize::MAX).expect("re-encode");
        assert_eq!(again.as_bytes(), data);
    }
});
