//! The RPC scenarios of `common` over the LNet transport: two LNet nodes
//! of this process on loopback addresses (socket LND), the machines of a
//! test alternately on one and the other, so that calls and bulk cross
//! real sockets.

mod common;

use common::Net;

#[test]
fn request_reply_and_sizes() {
    common::request_reply_and_sizes(&Net::lnet());
}

#[test]
fn concurrent_calls_from_many_threads() {
    common::concurrent_calls(&Net::lnet());
}

#[test]
fn one_way_items_and_batching_preserve_order() {
    common::batching_preserves_order(&Net::lnet());
}

#[test]
fn resend_on_timeout_executes_once() {
    common::resend_executes_once(&Net::lnet());
}

#[test]
fn bulk_both_directions() {
    common::bulk_both_directions(&Net::lnet());
}

#[test]
fn peer_stopped_mid_call() {
    common::peer_stopped_mid_call(&Net::lnet());
}

#[test]
fn a_stopped_server_fails_waiting_calls_promptly() {
    common::stopped_server_fails_waiting_calls(&Net::lnet());
}

#[test]
fn cancel_calls() {
    common::cancel_calls(&Net::lnet());
}

#[test]
fn blocking_handlers() {
    common::blocking_handlers(&Net::lnet());
}

#[test]
fn shutdown_from_a_handler() {
    common::shutdown_from_a_handler(&Net::lnet());
}
