//! RDMA transport control frames (`colibri_bulk_rdma::wire`), as read from
//! the TCP control connection and from an eager receive slot: decoding
//! arbitrary bytes never panics, a decoded frame says how many bytes it
//! used (never more than given, never none), and it re-encodes, with the
//! same credits, to bytes that decode to the same frame and credits. An
//! eager SEND carries one or more whole frames (`Frame::decode_send`):
//! accepted only if every byte belongs to a frame, and then the frames
//! re-encoded back to back decode to the same frames.
#![no_main]

use colibri_bulk_rdma::wire::Frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, credits, used))) = Frame::decode_with_credits(data) {
        assert!(used > 0 && used <= data.len());
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
    if let Ok(frames) = Frame::decode_send(data) {
        assert!(!frames.is_empty());
        let mut out = Vec::new();
        for (f, c) in &frames {
            f.encode_with_credits(*c, &mut out);
        }
        if out.len() <= colibri_bulk_rdma::wire::SLOT_SIZE {
            let again = Frame::decode_send(&out).expect("re-encoded frames decode");
            assert_eq!(again, frames);
        }
    }
});
