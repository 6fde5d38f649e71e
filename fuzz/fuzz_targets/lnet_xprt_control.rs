//! LNet transport control messages (bulk request, verdict, abort, NAK, DELIVERED, gone): never a panic, and what decodes survives a
//! round trip (`colibri_lnet_xprt::fuzzing::control_message`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colibri_lnet_xprt::fuzzing::control_message(data);
});
