//! socklnd acceptor connection requests (either byte order, any prefix):
//! never panics; what decodes little-endian re-encodes to the same 16
//! bytes; a short prefix asks for more bytes than it has.
#![no_main]

use colibri_lnet::socklnd::acceptor::{AcceptorError, CONNREQ_LEN};
use colibri_lnet::socklnd::{ConnReq, Endian};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match ConnReq::decode(data) {
        Ok((req, order)) => {
            assert!(data.len() >= CONNREQ_LEN);
            if order == Endian::Little {
                assert_eq!(&req.encode()[..], &data[..CONNREQ_LEN]);
            }
            let _ = req.check_target(&[req.nid]);
        }
        Err(AcceptorError::Short { needed, got }) => {
            assert_eq!(got, data.len());
            assert!(needed > got && needed <= CONNREQ_LEN);
        }
        Err(e) => {
            let _ = e.reply();
            let _ = e.to_string();
        }
    }
});
