//! The TCP transport's connection protocol, without sockets: each input
//! becomes reads (cut at sizes the input picks) of frames with correct
//! checksums and arbitrary fields, real or garbage descriptors and
//! arbitrary bodies (or of raw bytes), fed into the protocol's receive
//! path twice: on a connection accepted by a transfer machine with
//! receive and passive buffers queued, and on an outgoing connection with
//! a message, a GET and a PUT in flight. The entry point
//! (`colibri_bulk_tcp::fuzzing::tcp_frames`, feature `fuzzing`) panics on
//! a panic in the protocol, a buffer completed twice, a malformed frame
//! written, a buffer left in use after the connection closed, or (every
//! 64 inputs) a well-formed message that no longer gets through. No
//! thread, no socket: runs at the speed of the protocol.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| colibri_bulk_tcp::fuzzing::tcp_frames(data));
