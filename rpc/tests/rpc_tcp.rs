//! The RPC scenarios of `common` over the TCP transport on loopback: two
//! domains per test, each with its own I/O thread and listening port, so
//! messages cross real sockets (and may come back over either of the two
//! connections between the machines).

mod common;

use common::Net;

#[test]
fn request_reply_and_sizes() {
    common::request_reply_and_sizes(&Net::tcp());
}

#[test]
fn concurrent_calls_from_many_threads() {
    common::concurrent_calls(&Net::tcp());
}

#[test]
fn one_way_items_and_batching_preserve_order() {
    common::batching_preserves_order(&Net::tcp());
}

#[test]
fn resend_on_timeout_executes_once() {
    common::resend_executes_once(&Net::tcp());
}

#[test]
fn bulk_both_directions() {
    common::bulk_both_directions(&Net::tcp());
}

#[test]
fn peer_stopped_mid_call() {
    common::peer_stopped_mid_call(&Net::tcp());
}

#[test]
fn a_stopped_server_fails_waiting_calls_promptly() {
    common::stopped_server_fails_waiting_calls(&Net::tcp());
}

#[test]
fn cancel_calls() {
    common::cancel_calls(&Net::tcp());
}

#[test]
fn blocking_handlers() {
    common::blocking_handlers(&Net::tcp());
}

#[test]
fn shutdown_from_a_handler() {
    common::shutdown_from_a_handler(&Net::tcp());
}
