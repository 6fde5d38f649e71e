//! The transport boundary: the `xo_*` table as traits, and the sink through
//! which a transport reports to the core.
//!
//! A transport implements three traits:
//!
//! * [`Transport`]: the transport itself and its configuration; makes domains.
//! * [`XprtDomain`]: per-domain state; limits, capabilities, buffer
//!   registration, and making transfer machines.
//! * [`XprtTm`]: per-transfer-machine state; start, stop, end point address
//!   parsing, buffer add and delete.
//!
//! The core does all the bookkeeping (queues, flags, statistics, end point
//! references, event delivery, descriptor encoding, exactly-once completion,
//! buffer timeouts, cancellation of idle buffers and the stop sequence) and
//! calls the transport with the locks documented on each method. The
//! transport reports through the [`TmSink`] it is given when the transfer
//! machine is created: its start, buffer completions, received messages,
//! errors. It never calls application code itself, except by running a
//! [`Delivery`] the core hands it.
//!
//! # What a transport still does itself
//!
//! Move bytes: start an operation when a buffer is added, claim receive and
//! passive buffers for incoming requests, complete what it started, and end
//! an operation in flight when the core asks ([`XprtTm::buf_del`] is only
//! called for buffers the transport is using). Run the core's deliveries on
//! its own threads ([`XprtTm::deliver`]). Release its address when the core
//! says the transfer machine stopped ([`XprtTm::stopped`]). Everything else
//! (which buffers a cancel, a timeout or a stop reaches, when STOPPED is
//! posted, the clock) is the core's.
//!
//! # Locks held on entry
//!
//! | method | lock held by the caller |
//! |---|---|
//! | [`Transport::dom_init`] | none |
//! | [`XprtDomain::buf_register`], [`XprtDomain::buf_deregister`], [`XprtDomain::tm_init`], [`XprtDomain::fini`] | none (domain state is atomic) |
//! | [`XprtTm::start`], [`XprtTm::stop`], [`XprtTm::stopped`], [`XprtTm::ep_parse`], [`XprtTm::desc_extra`], [`XprtTm::buf_add`], [`XprtTm::buf_del`], [`XprtTm::deliver`], [`XprtTm::confine`] | the transfer machine's lock |
//! | [`XprtTm::fini`] | none |
//!
//! While the transfer machine's lock is held the transport must not block,
//! must not call any [`TmSink`] method of the same transfer machine (the sink
//! takes that lock) and must not wait for a buffer's data lock (see
//! [`QueuedBuf::data`]) that another thread may hold while waiting for a
//! transport lock. Events are therefore always posted from another thread,
//! or later from the same thread once the call returned.
//!
//! # Exactly one completion
//!
//! A buffer the transport never touched is the core's to complete: a
//! cancel, a timeout or a stop completes it at once (its callback runs
//! through [`XprtTm::deliver`]). A buffer the transport uses (after
//! [`TmSink::begin_use`], a receive claim or a passive claim) must be
//! completed by the transport through [`TmSink::complete`] (or, for a
//! message receive buffer, by the final [`TmSink::post_msg`]), and promptly
//! once [`XprtTm::buf_del`] asked. The core ignores completions of buffers
//! that already completed, so a transport that races a cancellation against
//! a normal completion may post both. The core posts STOPPED itself when
//! the last buffer of a stopping transfer machine completed.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::bufvec::BufVec;
use crate::error::{NetError, Result};
use crate::tm::TmId;

pub use crate::sink::{
    ClaimError, Delivery, PassiveClaim, PassiveError, QueuedBuf, RecvClaim, TmSink,
};

/// Transport-private data attached to buffers and end points.
pub type XprtData = Arc<dyn Any + Send + Sync>;

/// Size limits of a transport, cached by the domain at init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest buffer, in bytes (sum of its segments).
    pub max_buffer_size: usize,
    /// Largest segment, in bytes.
    pub max_segment_size: usize,
    /// Most segments in one buffer.
    pub max_segments: usize,
    /// Largest descriptor, in bytes.
    pub max_desc_size: usize,
}

impl Limits {
    /// Builds a set of limits.
    pub const fn new(
        max_buffer_size: usize,
        max_segment_size: usize,
        max_segments: usize,
        max_desc_size: usize,
    ) -> Self {
        Self {
            max_buffer_size,
            max_segment_size,
            max_segments,
            max_desc_size,
        }
    }
}

/// What a transport can do. Optional features are declared here and the
/// core refuses their use with [`NetError::Unsupported`] when absent: a
/// transport never pretends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Identifier stamped into descriptors, so that a descriptor made by
    /// another transport is refused.
    pub transport_id: u32,
    /// Completions may be held until the application calls
    /// [`deliver_all`](crate::TmHandle::deliver_all) (the core keeps the
    /// queue; the transport must only post events from its own threads).
    pub sync_delivery: bool,
    /// Several messages may land in one receive buffer.
    pub multi_message: bool,
    /// Buffer timeouts are enforced: the transport ends an operation in
    /// flight when [`XprtTm::buf_del`] says [`DelReason::Timeout`] (the
    /// core's clock decides when).
    pub timeouts: bool,
    /// The transfer machine's threads can be confined to CPUs.
    pub confine: bool,
    /// The network owns every queued buffer from its add (LNet: an MD is
    /// attached to each receive and passive buffer): the core never
    /// completes a queued buffer itself on a cancel, a timeout or a stop,
    /// it hands every one to [`XprtTm::buf_del`], in use or not, and the
    /// transport completes it once the network let go of its memory. A
    /// message receive buffer then ends only with the transport's final
    /// report (see [`TmSink::claim_recv_placed`]).
    pub network_owned: bool,
    /// [`XprtTm::reset_peer`] breaks connections (the transport has
    /// connections to break).
    pub reset_peer: bool,
}

impl Caps {
    /// Capabilities with every optional feature off.
    pub const fn new(transport_id: u32) -> Self {
        Self {
            transport_id,
            sync_delivery: false,
            multi_message: false,
            timeouts: false,
            confine: false,
            network_owned: false,
            reset_peer: false,
        }
    }

    /// Declares synchronous delivery support.
    #[must_use]
    pub const fn with_sync_delivery(mut self) -> Self {
        self.sync_delivery = true;
        self
    }

    /// Declares multi-message receive buffers.
    #[must_use]
    pub const fn with_multi_message(mut self) -> Self {
        self.multi_message = true;
        self
    }

    /// Declares buffer timeouts.
    #[must_use]
    pub const fn with_timeouts(mut self) -> Self {
        self.timeouts = true;
        self
    }

    /// Declares CPU confinement.
    #[must_use]
    pub const fn with_confine(mut self) -> Self {
        self.confine = true;
        self
    }

    /// Declares that the network owns every queued buffer
    /// ([`Caps::network_owned`]).
    #[must_use]
    pub const fn with_network_owned(mut self) -> Self {
        self.network_owned = true;
        self
    }

    /// Declares that [`XprtTm::reset_peer`] breaks connections.
    #[must_use]
    pub const fn with_reset_peer(mut self) -> Self {
        self.reset_peer = true;
        self
    }
}

/// A parsed end point address: the canonical printable form and the
/// transport's own representation.
#[derive(Clone)]
pub struct EpAddr {
    /// Canonical printable address; two strings naming the same end point
    /// must give the same canonical address.
    pub addr: String,
    /// The transport's parsed form.
    pub data: XprtData,
}

impl fmt::Debug for EpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpAddr").field("addr", &self.addr).finish()
    }
}

/// Why the core asks a transport to delete a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DelReason {
    /// The application called `del`.
    Cancel,
    /// The buffer's timeout expired (complete with `Cancelled`; the core
    /// reports `TimedOut`).
    Timeout,
    /// The transfer machine is stopping with abort (a stop without abort
    /// lets operations in flight finish and never asks).
    Stop,
}

/// A transport: the factory of its domains.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Short name ("mem", "tcp", ...).
    fn name(&self) -> &'static str;

    /// Sets up the transport's state for a new domain.
    ///
    /// # Errors
    /// Whatever prevents the domain from working (missing device, ...).
    fn dom_init(&self) -> Result<Box<dyn XprtDomain>>;
}

/// Per-domain transport state.
pub trait XprtDomain: Send + Sync + fmt::Debug {
    /// Name of the transport.
    fn name(&self) -> &'static str;

    /// Size limits.
    fn limits(&self) -> Limits;

    /// Capabilities.
    fn caps(&self) -> Caps;

    /// Registers (pins, maps) a buffer's memory. The core has already
    /// checked the buffer against [`XprtDomain::limits`].
    ///
    /// # Errors
    /// Registration failures; the memory goes back to the application.
    fn buf_register(&self, bufvec: &BufVec) -> Result<Option<XprtData>> {
        let _ = bufvec;
        Ok(None)
    }

    /// Releases what [`XprtDomain::buf_register`] set up.
    fn buf_deregister(&self, reg: Option<XprtData>) {
        drop(reg);
    }

    /// Creates the transport's state for a new transfer machine. `sink` is
    /// its end of the core for the transfer machine's whole life: keep it.
    ///
    /// # Errors
    /// Resource exhaustion.
    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>>;

    /// Releases the domain's state; called once, after every transfer
    /// machine and buffer of the domain is gone.
    fn fini(&self) {}
}

/// Per-transfer-machine transport state: the `xo_tm_*` and `xo_buf_*`
/// operations.
pub trait XprtTm: Send + Sync + fmt::Debug {
    /// Starts the transfer machine at `addr`. Must post
    /// [`TmSink::post_started`] or [`TmSink::post_start_failed`] later, from
    /// another thread (never from inside this call).
    ///
    /// # Errors
    /// A synchronous failure (invalid or busy address): the core moves the
    /// transfer machine to FAILED.
    fn start(&self, addr: &str) -> Result<()>;

    /// The transfer machine is stopping: accept no new work. The core then
    /// completes every idle buffer itself and asks (through
    /// [`XprtTm::buf_del`]) for the operations in flight to end, all of
    /// them with `abort`, none without (they finish normally). May be
    /// called in INITIALIZED, STARTING or STARTED.
    ///
    /// # Errors
    /// A failure to stop; the core restores the previous state.
    fn stop(&self, abort: bool) -> Result<()>;

    /// Every buffer completed after a stop: release the address (so that
    /// another transfer machine may start there) and forget the transfer
    /// machine's work. Called once, before STOPPED is posted. Must not
    /// block.
    fn stopped(&self) {}

    /// Releases the transfer machine's resources (joins threads). Called
    /// without locks, after STOPPED or FAILED, or in INITIALIZED, with no
    /// buffer queued and no callback running.
    fn fini(&self);

    /// Parses an address into its canonical form.
    ///
    /// # Errors
    /// `InvalidAddress` for strings this transport does not accept.
    fn ep_parse(&self, addr: &str) -> Result<EpAddr>;

    /// For a passive buffer about to be added, transport bytes to carry in
    /// its descriptor (for example remote keys). Called before
    /// [`XprtTm::buf_add`].
    ///
    /// # Errors
    /// Any failure refuses the add.
    fn desc_extra(&self, buf: &QueuedBuf) -> Result<Vec<u8>> {
        let _ = buf;
        Ok(Vec::new())
    }

    /// Breaks every connection this transfer machine's transport holds
    /// with the peer at `addr` (a canonical address), as a network reset
    /// would: the operations in flight on them fail on both sides, later
    /// ones open new connections. Returns false when nothing could be
    /// broken (the default, for a transport without connections; one that
    /// implements it declares [`Caps::reset_peer`]). Used by the fault
    /// injector; never called under the transfer machine's lock. Must not
    /// block.
    fn reset_peer(&self, addr: &str) -> bool {
        let _ = addr;
        false
    }

    /// Starts the operation of a newly queued buffer. Must not block.
    ///
    /// # Errors
    /// A refusal; the core hands the buffer back to the application and
    /// will never accept a completion for it.
    fn buf_add(&self, buf: &QueuedBuf) -> Result<()>;

    /// Ends the operation of a buffer the transport is using (the core
    /// completes idle buffers itself): a cancel, a timeout, or a stop with
    /// abort. The transport aborts the transfer (telling the peer where the
    /// protocol can) and completes the buffer with `Cancelled` (reported as
    /// `TimedOut` after a timeout), or lets an operation that is about to
    /// finish complete normally. Either way the buffer must complete
    /// promptly. May be called again for the same buffer (a timeout after a
    /// cancel, a stop after either). Never completes inline.
    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason);

    /// Runs `delivery` (callbacks the core decided: a buffer cancelled or
    /// timed out by the core, the STOPPED event) soon on one of the
    /// transfer machine's threads, never inline. Called from any state,
    /// INITIALIZED included. Must not block.
    fn deliver(&self, delivery: Delivery);

    /// Confines the transfer machine's threads to the given CPUs; called in
    /// INITIALIZED only, and only when [`Caps::confine`] is set.
    ///
    /// # Errors
    /// Invalid CPU numbers.
    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let _ = cpus;
        Err(NetError::Unsupported {
            transport: "unknown",
            what: "confine",
        })
    }
}
