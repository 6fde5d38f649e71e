//! RDMA transport control frames (`colibri_bulk_rdma::wire`), as read from
//! the TCP control connection and from an eager receive slot: decoding
//! arbitrary bytes never panics, a decoded frame says how many bytes it
//! used (never more than given), and it re-encodes, with the same credits,
//! to bytes that decode to the same frame and credits. An eager slot holds
//! exactly one frame: the engine refuses a SEND whose frame does not use
//! every received byte, which `used == data.len()` models here.
#![no_main]

use colibri_bulk_rdma::wire::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, credits, used))) = Frame::decode_with_credits(data) {
        assert!(used <= data.len());
        assert!(credits <= u32::from(u16::MAX));
        let mut out = Vec::new();
        frame.encode_with_credits(credits, &mut out);
        match Frame::decode_with_credits(&out) {
            Ok(Some((again, c, n))) => {
                assert_eq!(n, out.len());
                assert_eq!(c, credits);
                assert_eq!(again, frame);
            }
            other => panic!("re-encoded frame does not decode: {other:?}"),
        }
        // The credits-free decoder agrees.
        let plain = Frame::decode(data).expect("decoded once").expect("complete");
        assert_eq!(plain, (frame, used));
    }
});
