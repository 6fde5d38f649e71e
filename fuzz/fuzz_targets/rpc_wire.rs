//! RPC wire decoding: never panics; every item that decodes re-encodes to
//! exactly the bytes it came from; the typed codec never panics either.
#![no_main]

use colibri_rpc::wire::{self, MsgReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = MsgReader::new(data) {
        let mut off = wire::MSG_HEADER_SIZE;
        for item in reader {
            let Ok(item) = item else {
                break;
            };
            let mut again = Vec::new();
            wire::encode_item(&mut again, &item.header, item.payload, &item.descs)
                .expect("a decoded item re-encodes");
            assert_eq!(&data[off..off + again.len()], &again[..]);
            off += again.len();
        }
    }
    let _ = colibri_rpc::codec::decode::<(u64, String, Vec<Option<u32>>)>(data);
});
