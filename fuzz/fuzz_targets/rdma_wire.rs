//! RDMA transport control frames (`colibri_bulk_rdma::wire`): decoding
//! arbitrary bytes never panics, a decoded frame says how many bytes it
//! used (never more than given), and it re-encodes to bytes that decode to
//! the same frame.
#![no_main]

use colibri_bulk_rdma::wire::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, used))) = Frame::decode(data) {
        assert!(used <= data.len());
        let mut out = Vec::new();
        frame.encode(&mut out);
        match Frame::decode(&out) {
            Ok(Some((again, n))) => {
                assert_eq!(n, out.len());
                assert_eq!(again, frame);
            }
            other => panic!("re-encoded frame does not decode: {other:?}"),
        }
    }
});
