//! The header data of LNet transport PUTs (sender portal, TMID, sequence): never a panic, and what decodes survives a
//! round trip (`colibri_lnet_xprt::fuzzing::header_data`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colibri_lnet_xprt::fuzzing::header_data(data);
});
