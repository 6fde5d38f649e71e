//! The LNet part of buffer descriptors (40 bytes): never a panic, and what decodes survives a
//! round trip (`colibri_lnet_xprt::fuzzing::descriptor_extra`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colibri_lnet_xprt::fuzzing::descriptor_extra(data);
});
