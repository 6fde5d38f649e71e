//! The LNet node's two-step receive path (header, then the payload's fate)
//! on arbitrary streams from a peer: never panics, never places a payload
//! outside the memory it was given, every received message finishes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    colibri_lnet::fuzzing::receive_path(data);
});
