//! # colibri-ut: the conformance suite
//!
//! One set of tests that every transport of the messaging layer must pass,
//! generic over a [`Factory`] that makes the transport and hands out
//! addresses. A transport runs the whole suite with one macro call in a test
//! file:
//!
//! ```ignore
//! struct MyFactory;
//! impl colibri_ut::Factory for MyFactory { /* ... */ }
//! colibri_ut::conformance_tests!(MyFactory);
//! ```
//!
//! which expands into one `#[test]` per case of [`cases`]. Cases that need
//! an optional capability (multi-message receive buffers, timeouts,
//! synchronous delivery) test the feature when the transport declares it
//! and test the clean `Unsupported` refusal when it does not.
//!
//! The cases follow the conformance checklist of Motr's net layer:
//! lifecycle, end points, buffers and queues, descriptors and their abuse,
//! multi-message receive, cancellation, timeouts, statistics, synchronous
//! delivery, re-entrant callbacks, and a bounded concurrency stress test
//! that checks the project's first invariant: every add gets exactly one
//! final completion, and no data is corrupted; and receive queues stocked
//! from a buffer pool (`colibri_net::pool`).

#![forbid(unsafe_code)]

use std::sync::Arc;

use colibri_net::Transport;

pub mod cases;
pub mod harness;
pub mod soak;
pub mod soak_two_process;

pub use harness::{Node, Rng, pattern};

/// Largest message the in-flight cases send to a deaf peer: more than a
/// loopback socket pair buffers, so the send stays on the wire.
pub const STALL_MSG: usize = 12 << 20;

/// Makes the transport under test and addresses for it.
pub trait Factory: Send + Sync {
    /// Name of the transport, for messages.
    fn name(&self) -> &'static str;

    /// The transport (shared by the domains of one test).
    fn transport(&self) -> Arc<dyn Transport>;

    /// A fresh address to start a transfer machine at. It may ask the
    /// transport to pick a port; tests read the real address from the
    /// started transfer machine.
    fn addr(&self) -> String;

    /// A valid address at which no transfer machine is started.
    fn unreachable_addr(&self) -> String;

    /// A string the transport must refuse as an address.
    fn invalid_addr(&self) -> String {
        "not an address".to_string()
    }

    /// Peers that stop half-way, for the cases that end operations in
    /// flight. `None` (the default) for a transport whose transfers cannot
    /// stall (bulk_mem copies in one step): those cases then test what
    /// they can without one.
    fn staller(&self) -> Option<Box<dyn Staller>> {
        None
    }
}

/// Misbehaving peers a transport's test provides, speaking its wire
/// protocol: they stop in the middle of a transfer and keep the connection
/// open. Dropping the staller closes everything it opened.
pub trait Staller: Send {
    /// An address at which a peer accepts connections and never reads:
    /// a large enough send to it stays in flight.
    fn deaf_peer(&mut self) -> String;

    /// Bytes of a send that stays in flight to a [`Staller::deaf_peer`]:
    /// [`STALL_MSG`] (more than the sockets buffer) unless the transport's
    /// messages are smaller and its peers stall before taking any byte
    /// (LNet's are at most 1 MiB, and a deaf peer never completes the
    /// socket LND's handshake).
    fn stall_msg(&self) -> usize {
        STALL_MSG
    }

    /// Sends the start of a `len`-byte message to the transfer machine at
    /// `to` and stops, so that a receive buffer stays claimed.
    fn stalled_message(&mut self, to: &str, len: usize);

    /// Whether a [`Staller::stalled_message`] shows its receive buffer in
    /// use while the message's bytes stop coming. LNet reports a message
    /// only once all of it arrived, so its transport cannot (false): the
    /// case that deletes such a buffer mid-message then does not run, and
    /// the transport's own tests cover it.
    fn shows_stalled_receives(&self) -> bool {
        true
    }

    /// Starts an active send of `len` bytes into the passive receive
    /// buffer named by `desc` and stops half-way, so that the passive
    /// buffer stays in use.
    fn stalled_put(&mut self, desc: &colibri_net::NetBufDesc, len: usize);
}

/// Expands into one `#[test]` per conformance case, each calling
/// `colibri_ut::cases::<case>(&factory)`.
///
/// `conformance_tests!(factory, ignore = "why")` marks every case
/// `#[ignore]`, for a transport that needs hardware the build machine may
/// lack (the RDMA transport): the tests are listed as ignored there and run
/// with `--include-ignored` where the hardware is (the Soft-RoCE VM).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@with [] $factory);
    };
    ($factory:expr, ignore = $why:literal) => {
        $crate::conformance_tests!(@with [$why] $factory);
    };
    (@with $ignore:tt $factory:expr) => {
        $crate::conformance_tests!(@cases $ignore $factory;
            domain_init_fini,
            tm_init_fini_without_start,
            start_posts_started_once,
            start_invalid_address,
            start_address_in_use,
            failed_tm_only_finalises,
            recv_added_before_start,
            recv_before_start_cancel_and_timeout,
            timeouts_on_a_manual_clock,
            del_ends_a_send_in_flight,
            stop_abort_after_del_in_flight,
            del_ends_a_stalled_receive,
            del_ends_a_stalled_passive_transfer,
            pool_tops_up_before_the_callback,
            blocking_waits_fail_on_delivery_threads,
            confine_checks_the_cpu_set,
            stress_with_faults,
            faults_duplicate_truncate_reset,
            add_needs_started,
            stop_abort_cancels_everything,
            stop_without_abort,
            stop_racing_start,
            fini_refusals,
            end_point_identity_and_refs,
            end_point_addr_recreates,
            send_holds_end_point_ref,
            register_limits,
            add_refusals_return_buffer,
            message_data_and_shapes,
            message_to_unreachable,
            message_without_receive_buffer,
            no_buffers_flood_is_counted_and_coalesced,
            message_too_large,
            bulk_both_directions_with_shapes,
            passive_descriptor_fresh_per_add,
            descriptor_corrupt_and_foreign,
            descriptor_wrong_pairing,
            descriptor_size_violations,
            descriptor_wrong_actor,
            descriptor_forged_cookie,
            descriptor_stale_after_cancel,
            multi_message_receive,
            multi_message_events_serialized,
            cancel_semantics,
            cancel_races_completion,
            timeouts,
            timeouts_mixed_with_cancel,
            stats_exact_and_reset,
            sync_delivery,
            reentrant_callbacks,
            data_view_rejects_api_calls,
            echo_many_round_trips,
            stress_exactly_once,
            pool_keeps_receive_queue_stocked,
            pool_dry_then_refilled,
            pool_misuse,
            pool_colours_keep_each_machines_buffers,
            pool_low_water_grows_the_pool,
        );
    };
    (@cases [] $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::cases::$name(&$factory);
            }
        )*
    };
    (@cases [$why:literal] $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = $why]
            fn $name() {
                $crate::cases::$name(&$factory);
            }
        )*
    };
}
