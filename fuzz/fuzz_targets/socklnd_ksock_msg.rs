//! socklnd ksock_msg headers in both byte orders: never panics; what
//! decodes little-endian re-encodes to the same 24 bytes; the cookie
//! readings never panic.
#![no_main]

use colibri_lnet::socklnd::frame::KSOCK_MSG_HDR_LEN;
use colibri_lnet::socklnd::{Endian, KsockMsgHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for order in [Endian::Little, Endian::Big] {
        if let Ok(h) = KsockMsgHeader::decode(data, order) {
            assert!(data.len() >= KSOCK_MSG_HDR_LEN);
            if order == Endian::Little {
                assert_eq!(&h.encode()[..], &data[..KSOCK_MSG_HDR_LEN]);
            }
            if let Ok(Some(ack)) = h.zc_ack_cookies() {
                assert!(ack.count() >= 1);
                let _ = ack.contains(h.zc_cookies[1]);
            }
            let _ = (h.checksum(), h.zc_request());
        }
    }
});
