//! socklnd V3 HELLOs (either byte order, with or without IPs, any prefix):
//! never panics; what decodes little-endian without IPs re-encodes to the
//! same 56 bytes; the handshake checks never panic on what decodes.
#![no_main]

use std::net::Ipv4Addr;

use colibri_lnet::ids::{Nid, ProcessId};
use colibri_lnet::socklnd::hello::HELLO_LEN;
use colibri_lnet::socklnd::{
    ConnType, Endian, Hello, HelloError, LocalEnd, check_active_reply, check_passive_hello,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Hello::decode(data) {
        Ok(got) => {
            assert!(got.len >= HELLO_LEN && got.len <= data.len());
            if got.byte_order == Endian::Little && got.len == HELLO_LEN {
                assert_eq!(&got.hello.encode()[..], &data[..HELLO_LEN]);
            }
            let again = Hello::decode(&got.hello.encode()).expect("re-decode");
            assert_eq!(again.hello, got.hello);
            let local = LocalEnd {
                nid: got.hello.dst_nid,
                pid: 12345,
                incarnation: 1,
            };
            let _ = check_passive_hello(&local, &got.hello, Ipv4Addr::LOCALHOST, 1023);
            let _ = check_passive_hello(&local, &got.hello, Ipv4Addr::LOCALHOST, 50000);
            let peer = ProcessId::new(got.hello.src_nid, got.hello.src_pid);
            for t in ConnType::ALL {
                let _ = check_active_reply(&local, peer, t, &got.hello);
            }
            let _ = Nid::from_u64(got.hello.src_nid.as_u64()).to_string();
        }
        Err(HelloError::Short { needed, got }) => {
            assert_eq!(got, data.len());
            assert!(needed > got);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
