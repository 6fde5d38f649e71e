//! # colibri-bulk-mem: the in-memory transport
//!
//! Transfer machines in different [`Domain`](colibri_net::Domain)s of one
//! process exchange messages and do bulk transfers, with each byte copied
//! once, directly from the sender's registered buffer into the receiver's
//! (the two may have different segment shapes). It is the reference
//! transport: every test of an application above the messaging layer can
//! run on it, in one process, with no network.
//!
//! * Addresses are `a.b.c.d:port` or `a.b.c.d:port:service`
//!   ([`MemAddr`]); nothing is bound, the address is a name in a
//!   process-wide registry. Port 0 picks a free port; the started transfer
//!   machine's end point reports it. Two transfer machines cannot be
//!   started at the same address.
//! * Each transfer machine has a pool of worker threads
//!   ([`MemConfig::workers`]) that run its sends and active bulk transfers
//!   and its callbacks. Workers poll for [`MemConfig::spin`] before they
//!   sleep.
//! * Errors are reported to both sides as Motr's bulk_mem does:
//!   a message to a transfer machine that is not started fails with
//!   `Unreachable`; with no free receive buffer the sender gets `NoBuffers`
//!   and the receiver a `NoBuffers` error event (counted as a failed
//!   MSG_RECV event); a message larger than the receive buffer fails both
//!   with `MessageTooLarge`; bulk pairing and size errors fail both sides
//!   with `WrongQueue` or `TooBig`; stale or forged descriptors fail the
//!   active side with `NoEntry` and show on the passive side as an error
//!   event.
//! * Supports multi-message receive buffers, buffer timeouts, synchronous
//!   delivery and confining worker threads to CPUs. An in-flight copy
//!   cannot be aborted: a buffer being copied when it is cancelled
//!   completes normally.
//!
//! ```
//! use std::time::Duration;
//! use colibri_bulk_mem::{MemConfig, MemTransport};
//! use colibri_net::{Domain, TmState, ignore_tm_events};
//!
//! let xprt = MemTransport::new(MemConfig { workers: 2, ..MemConfig::default() });
//! let dom = Domain::new(&xprt).unwrap();
//! let tm = dom.tm_init(ignore_tm_events()).unwrap();
//! tm.start("127.0.0.1:0:7").unwrap();
//! tm.wait_for_state(TmState::Started, Duration::from_secs(5)).unwrap();
//! let me = tm.ep().unwrap();
//! assert!(me.addr().starts_with("127.0.0.1:") && me.addr().ends_with(":7"));
//! tm.stop(false).unwrap();
//! tm.wait_stopped(Duration::from_secs(5)).unwrap();
//! drop(me);
//! tm.fini().unwrap();
//! dom.fini().unwrap();
//! ```

#![forbid(unsafe_code)]

mod addr;
mod engine;
mod tm;
mod workq;

use std::time::Duration;

use colibri_net::xprt::{Caps, Limits, TmSink, Transport, XprtDomain, XprtTm};
use colibri_net::{Result, TmId};

pub use addr::MemAddr;

/// Identifier stamped into this transport's descriptors ("MEM1").
pub const MEM_TRANSPORT_ID: u32 = u32::from_le_bytes(*b"MEM1");

/// Configuration of the in-memory transport.
#[derive(Debug, Clone)]
pub struct MemConfig {
    /// Worker threads per transfer machine.
    pub workers: usize,
    /// How long an idle worker polls its queue before it sleeps.
    /// `Duration::ZERO` blocks at once; `Duration::MAX` never sleeps.
    pub spin: Duration,
    /// Size limits.
    pub limits: Limits,
    /// A shared engine to run the transfer machines' work instead of
    /// worker threads of their own (`workers` and `spin` then do not
    /// apply; `confine` is not supported). See [`MemEngine`].
    pub engine: Option<MemEngine>,
}

/// A fixed set of threads serving the work of any number of in-memory
/// transfer machines (of any domains whose [`MemConfig::engine`] names
/// it), as Lustre's socklnd schedulers serve every peer.
///
/// With a thread of its own per transfer machine (the default), a
/// process with a thousand transfer machines has a thousand threads, each
/// spinning after work: the rate falls as they take turns on the CPUs.
/// With an engine, the threads are as many as asked, whatever the number
/// of machines. One machine's work still runs in order and on one thread
/// at a time (callbacks of a machine never run concurrently, as with one
/// worker); a busy machine yields its thread to the others every 64 items.
/// The trade-off: a machine's work waits behind the other machines' work
/// on the engine's threads, and its threads cannot be confined to CPUs of
/// its own; two machines ping-ponging on an otherwise idle engine see the
/// latency of one worker each. The threads exit when the engine and every
/// transfer machine using it are gone.
///
/// ```
/// use std::time::Duration;
/// use colibri_bulk_mem::{MemConfig, MemEngine, MemTransport};
/// use colibri_net::{Domain, TmState, ignore_tm_events};
///
/// let engine = MemEngine::new(2, Duration::from_micros(50))?;
/// let xprt = MemTransport::new(MemConfig::shared(&engine));
/// let dom = Domain::new(&xprt)?;
/// let tms: Vec<_> = (0..100)
///     .map(|_| dom.tm_init(ignore_tm_events()))
///     .collect::<Result<_, _>>()?;
/// for (i, tm) in tms.iter().enumerate() {
///     tm.start(&format!("127.0.0.1:0:{}", i + 1))?;
/// }
/// for tm in &tms {
///     tm.wait_for_state(TmState::Started, Duration::from_secs(5))?;
/// }
/// assert_eq!(engine.threads(), 2); // not 100
/// # for tm in &tms { tm.stop(true)?; }
/// # for tm in &tms { tm.wait_stopped(Duration::from_secs(5))?; }
/// # Ok::<(), colibri_net::NetError>(())
/// ```
#[derive(Clone)]
pub struct MemEngine(std::sync::Arc<EngineHandle>);

struct EngineHandle {
    core: std::sync::Arc<tm::MemEngineCore>,
    threads: usize,
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.core.shutdown();
    }
}

impl std::fmt::Debug for MemEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemEngine")
            .field("threads", &self.0.threads)
            .finish()
    }
}

impl MemEngine {
    /// An engine of `threads` threads (at least 1) that poll for `spin`
    /// before they sleep.
    ///
    /// # Errors
    /// The system refused a thread.
    pub fn new(threads: usize, spin: Duration) -> Result<Self> {
        let core = engine::Engine::new(spin);
        let threads = threads.max(1);
        if let Err(e) = core.spawn(threads, "colibri-mem-engine") {
            core.shutdown();
            return Err(e);
        }
        Ok(Self(std::sync::Arc::new(EngineHandle { core, threads })))
    }

    /// Its number of threads.
    pub fn threads(&self) -> usize {
        self.0.threads
    }

    pub(crate) fn core(&self) -> &tm::MemEngineCore {
        &self.0.core
    }
}

impl Default for MemConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            spin: Duration::from_micros(50),
            limits: Limits::new(256 << 20, 256 << 20, 4096, 1024),
            engine: None,
        }
    }
}

impl MemConfig {
    /// Workers that poll for a millisecond before they sleep: a busy
    /// transfer machine never sleeps (lowest latency; each worker burns a
    /// CPU while traffic flows), an idle one gets out of the way.
    pub fn polling() -> Self {
        Self {
            spin: Duration::from_millis(1),
            ..Self::default()
        }
    }

    /// Transfer machines served by `engine`'s threads instead of workers
    /// of their own.
    pub fn shared(engine: &MemEngine) -> Self {
        Self {
            engine: Some(engine.clone()),
            ..Self::default()
        }
    }

    /// Workers that sleep as soon as they are idle (no CPU burnt; each
    /// hand-off pays a thread wake-up).
    pub fn blocking() -> Self {
        Self {
            spin: Duration::ZERO,
            ..Self::default()
        }
    }
}

/// The in-memory transport.
#[derive(Debug, Clone, Default)]
pub struct MemTransport {
    cfg: MemConfig,
}

impl MemTransport {
    /// A transport with the given configuration.
    pub fn new(cfg: MemConfig) -> Self {
        Self { cfg }
    }

    /// Its configuration.
    pub fn config(&self) -> &MemConfig {
        &self.cfg
    }
}

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn dom_init(&self) -> Result<Box<dyn XprtDomain>> {
        Ok(Box::new(MemDomain {
            cfg: self.cfg.clone(),
        }))
    }
}

#[derive(Debug)]
struct MemDomain {
    cfg: MemConfig,
}

impl XprtDomain for MemDomain {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn limits(&self) -> Limits {
        self.cfg.limits
    }

    fn caps(&self) -> Caps {
        let caps = Caps::new(MEM_TRANSPORT_ID)
            .with_sync_delivery()
            .with_multi_message()
            .with_timeouts();
        // A shared engine's threads serve every machine: none can be
        // confined on its own.
        if self.cfg.engine.is_some() {
            caps
        } else {
            caps.with_confine()
        }
    }

    fn tm_init(&self, tm: TmId, sink: TmSink) -> Result<Box<dyn XprtTm>> {
        Ok(Box::new(tm::MemTm::new(tm, self.cfg.clone(), sink)?))
    }
}

/// The README's example, compiled and run as a doctest so that it cannot
/// rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
