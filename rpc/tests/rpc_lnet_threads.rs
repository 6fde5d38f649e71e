//! The RPC scenarios of `common` over the LNet transport with a delivery
//! thread per transfer machine (`LnetXprtConfig::thread_per_tm`); otherwise
//! as `rpc_lnet.rs`.

mod common;

use common::Net;

#[test]
fn request_reply_and_sizes() {
    common::request_reply_and_sizes(&Net::lnet_threads());
}

#[test]
fn concurrent_calls_from_many_threads() {
    common::concurrent_calls(&Net::lnet_threads());
}

#[test]
fn one_way_items_and_batching_preserve_order() {
    common::batching_preserves_order(&Net::lnet_threads());
}

#[test]
fn resend_on_timeout_executes_once() {
    common::resend_executes_once(&Net::lnet_threads());
}

#[test]
fn bulk_both_directions() {
    common::bulk_both_directions(&Net::lnet_threads());
}

#[test]
fn peer_stopped_mid_call() {
    common::peer_stopped_mid_call(&Net::lnet_threads());
}

#[test]
fn a_stopped_server_fails_waiting_calls_promptly() {
    common::stopped_server_fails_waiting_calls(&Net::lnet_threads());
}

#[test]
fn cancel_calls() {
    common::cancel_calls(&Net::lnet_threads());
}

#[test]
fn blocking_handlers() {
    common::blocking_handlers(&Net::lnet_threads());
}

#[test]
fn shutdown_from_a_handler() {
    common::shutdown_from_a_handler(&Net::lnet_threads());
}
