//! The RPC scenarios of `common` over the verbs RDMA transport: two
//! domains per test, each with its own engine, control listener and queue
//! pairs. They need an RDMA device, so they are `#[ignore]`d on the host;
//! `.ci/run` runs them in the Soft-RoCE VM with `--include-ignored`.

mod common;

use common::Net;

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn request_reply_and_sizes() {
    common::request_reply_and_sizes(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn concurrent_calls_from_many_threads() {
    common::concurrent_calls(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn one_way_items_and_batching_preserve_order() {
    common::batching_preserves_order(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn resend_on_timeout_executes_once() {
    common::resend_executes_once(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn bulk_both_directions() {
    common::bulk_both_directions(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn peer_stopped_mid_call() {
    common::peer_stopped_mid_call(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn a_stopped_server_fails_waiting_calls_promptly() {
    common::stopped_server_fails_waiting_calls(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn cancel_calls() {
    common::cancel_calls(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn blocking_handlers() {
    common::blocking_handlers(&Net::rdma());
}

#[test]
#[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
fn shutdown_from_a_handler() {
    common::shutdown_from_a_handler(&Net::rdma());
}
