//! RPC wire decoding: never panics; a header that decodes re-encodes to
//! exactly its bytes, and so does every item that decodes (a request's
//! replied-below mark lies in 1..=xid); the typed codec never panics either.
#![no_main]

use colibri_rpc::wire::{self, MsgHeader, MsgReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = MsgReader::new(data) {
        let h = *reader.header();
        let mut again = vec![0u8; wire::MSG_HEADER_SIZE];
        h.write(&mut again);
        assert_eq!(&data[..wire::MSG_HEADER_SIZE], &again[..]);
        assert_eq!(MsgHeader::decode(data), Ok(h));
        let mut off = wire::MSG_HEADER_SIZE;
        for item in reader {
            let Ok(item) = item else {
                break;
            };
            assert_eq!(item.header.session, h.session);
            if let Some(low) = item.header.replied_below() {
                assert!((1..=item.header.xid).contains(&low));
            }
            let mut again = Vec::new();
            wire::encode_item(&mut again, &item.header, item.payload, &item.descs)
                .expect("a decoded item re-encodes");
            assert_eq!(&data[off..off + again.len()], &again[..]);
            off += again.len();
        }
    }
    let _ = colibri_rpc::codec::decode::<(u64, String, Vec<Option<u32>>)>(data);
});
