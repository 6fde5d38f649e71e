//! Network domains.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tracing::debug;

use crate::buffer::NetBuffer;
use crate::bufvec::BufVec;
use crate::clock::Clock;
use crate::error::{FiniError, NetError, RegisterError, Result};
use crate::tm::{TmCallback, TransferMachine};
use crate::util::next_id;
use crate::xprt::{Caps, Limits, Transport, XprtDomain};

pub(crate) struct DomainInner {
    pub(crate) id: u64,
    pub(crate) xprt: Box<dyn XprtDomain>,
    pub(crate) limits: Limits,
    pub(crate) caps: Caps,
    pub(crate) clock: Clock,
    /// Senders' end points each transfer machine keeps alive.
    pub(crate) sender_cache: usize,
    pub(crate) tms: AtomicUsize,
    pub(crate) bufs: AtomicUsize,
    finalized: AtomicBool,
}

impl DomainInner {
    pub(crate) fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    fn fini_once(&self) {
        if !self.finalized.swap(true, Ordering::AcqRel) {
            self.xprt.fini();
        }
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        self.fini_once();
    }
}

/// Settings of a domain that are the core's, not the transport's.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DomainConfig {
    /// The time source of the domain's transfer machines for buffer
    /// timeouts ([`Clock::real`] by default; [`Clock::manual`] in tests).
    pub clock: Clock,
    /// How many senders' end points each transfer machine keeps alive
    /// (oldest first out) so that a message from a recent sender finds its
    /// end point without parsing its address or allocating
    /// ([`DomainConfig::DEFAULT_SENDER_CACHE`] by default). A server
    /// answering N clients in turn wants at least N; the cache only grows
    /// with senders actually seen.
    pub sender_cache: usize,
}

impl Default for DomainConfig {
    fn default() -> Self {
        Self {
            clock: Clock::default(),
            sender_cache: Self::DEFAULT_SENDER_CACHE,
        }
    }
}

impl DomainConfig {
    /// The default size of the sender cache: a server with this many
    /// clients sending in turn creates no end point per message.
    pub const DEFAULT_SENDER_CACHE: usize = 4096;

    /// The default configuration with another sender cache size (at
    /// least 1).
    #[must_use]
    pub fn with_sender_cache(mut self, n: usize) -> Self {
        self.sender_cache = n.max(1);
        self
    }

    /// The default configuration with another clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// A network domain: the resources of one transport. Buffers are
/// registered with a domain and transfer machines are created in it.
///
/// A domain can be finalised ([`Domain::fini`]) only once its transfer
/// machines are finalised and its buffers deregistered. Dropping a domain
/// that still has them is allowed: the transport's domain state is then
/// released when the last of them goes.
pub struct Domain {
    pub(crate) inner: Arc<DomainInner>,
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain")
            .field("id", &self.inner.id)
            .field("transport", &self.inner.xprt.name())
            .field("tms", &self.inner.tms.load(Ordering::Relaxed))
            .field("buffers", &self.inner.bufs.load(Ordering::Relaxed))
            .finish()
    }
}

impl Domain {
    /// Creates a domain over a transport.
    ///
    /// # Errors
    /// Whatever the transport's domain set-up reports.
    pub fn new<T: Transport + ?Sized>(transport: &T) -> Result<Self> {
        Self::with_config(transport, DomainConfig::default())
    }

    /// Creates a domain over a transport with core settings (for example a
    /// manual clock for tests of timeouts).
    ///
    /// # Errors
    /// Whatever the transport's domain set-up reports.
    pub fn with_config<T: Transport + ?Sized>(transport: &T, cfg: DomainConfig) -> Result<Self> {
        let xprt = transport.dom_init()?;
        let limits = xprt.limits();
        let caps = xprt.caps();
        let id = next_id();
        debug!(dom = id, transport = xprt.name(), "domain init");
        Ok(Self {
            inner: Arc::new(DomainInner {
                id,
                xprt,
                limits,
                caps,
                clock: cfg.clock,
                sender_cache: cfg.sender_cache.max(1),
                tms: AtomicUsize::new(0),
                bufs: AtomicUsize::new(0),
                finalized: AtomicBool::new(false),
            }),
        })
    }

    /// Process-unique identifier of the domain.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Name of the transport.
    pub fn transport_name(&self) -> &'static str {
        self.inner.xprt.name()
    }

    /// The transport's size limits.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The transport's capabilities.
    pub fn caps(&self) -> Caps {
        self.inner.caps
    }

    /// The clock of the domain's buffer timeouts: take deadlines for
    /// [`NetBuffer::set_timeout`] from its [`Clock::now`].
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Largest buffer the transport accepts, in bytes.
    pub fn max_buffer_size(&self) -> usize {
        self.inner.limits.max_buffer_size
    }

    /// Largest segment the transport accepts, in bytes.
    pub fn max_segment_size(&self) -> usize {
        self.inner.limits.max_segment_size
    }

    /// Most segments in one buffer.
    pub fn max_segments(&self) -> usize {
        self.inner.limits.max_segments
    }

    /// Largest descriptor the transport makes, in bytes.
    pub fn max_desc_size(&self) -> usize {
        self.inner.limits.max_desc_size
    }

    /// Number of transfer machines not yet finalised.
    pub fn tm_count(&self) -> usize {
        self.inner.tms.load(Ordering::Acquire)
    }

    /// Number of registered buffers.
    pub fn buffer_count(&self) -> usize {
        self.inner.bufs.load(Ordering::Acquire)
    }

    /// Registers memory with the domain, checking it against the
    /// transport's limits; the transport may pin or register it.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty vector, `TooBig` for one over the
    /// limits, or the transport's failure; the memory is handed back.
    pub fn register(&self, bufvec: BufVec) -> Result<NetBuffer, RegisterError> {
        let l = &self.inner.limits;
        let err = if bufvec.is_empty() {
            Some(NetError::InvalidArgument("empty buffer".into()))
        } else if bufvec.len() > l.max_buffer_size {
            Some(NetError::TooBig(format!(
                "buffer of {} bytes, transport maximum {}",
                bufvec.len(),
                l.max_buffer_size
            )))
        } else if bufvec.nr_segments() > l.max_segments {
            Some(NetError::TooBig(format!(
                "{} segments, transport maximum {}",
                bufvec.nr_segments(),
                l.max_segments
            )))
        } else if bufvec.max_segment_size() > l.max_segment_size {
            Some(NetError::TooBig(format!(
                "segment of {} bytes, transport maximum {}",
                bufvec.max_segment_size(),
                l.max_segment_size
            )))
        } else {
            None
        };
        if let Some(error) = err {
            return Err(RegisterError { error, bufvec });
        }
        match self.inner.xprt.buf_register(&bufvec) {
            Ok(reg) => {
                self.inner.bufs.fetch_add(1, Ordering::AcqRel);
                Ok(NetBuffer::new(self.inner.clone(), bufvec, reg))
            }
            Err(error) => Err(RegisterError { error, bufvec }),
        }
    }

    /// Creates a transfer machine in this domain. `callback` receives its
    /// state changes and error events; it may be shared by several transfer
    /// machines.
    ///
    /// # Errors
    /// The transport's failure to set the transfer machine up.
    pub fn tm_init(&self, callback: Arc<TmCallback>) -> Result<TransferMachine> {
        TransferMachine::new(self, callback)
    }

    /// Finalises the domain.
    ///
    /// # Errors
    /// `Busy` while transfer machines or registered buffers remain; the
    /// domain is handed back.
    pub fn fini(self) -> Result<(), FiniError<Self>> {
        let tms = self.tm_count();
        let bufs = self.buffer_count();
        if tms > 0 || bufs > 0 {
            return Err(FiniError {
                error: NetError::Busy(format!(
                    "domain has {tms} transfer machine(s) and {bufs} registered buffer(s)"
                )),
                object: self,
            });
        }
        debug!(dom = self.inner.id, "domain fini");
        self.inner.fini_once();
        Ok(())
    }
}
