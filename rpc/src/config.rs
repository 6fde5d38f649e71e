//! Configuration of an RPC machine and options of one call.

use std::time::Duration;

use crate::error::{Result, RpcError};
use crate::wire::{ITEM_HEADER_SIZE, MAX_WINDOW, MSG_HEADER_SIZE};

/// Configuration of an [`RpcMachine`](crate::RpcMachine).
///
/// ```
/// use std::time::Duration;
/// use colibri_rpc::RpcConfig;
///
/// let cfg = RpcConfig::default()
///     .with_batch_delay(Duration::from_micros(100))
///     .with_timeout(Duration::from_secs(2))
///     .with_retries(3);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RpcConfig {
    /// Largest message, in bytes (clamped to the transport's largest
    /// buffer). Items are packed into messages up to this size; an item
    /// larger than a message is refused (`TooBig`): move its data with
    /// bulk. Default 16 KiB.
    pub max_msg_size: usize,
    /// Receive buffers kept on the message receive queue. Default 8.
    pub recv_buffers: usize,
    /// Size of each receive buffer; each takes messages until less than
    /// `max_msg_size` is left. Default 256 KiB.
    pub recv_buffer_size: usize,
    /// Most send buffers (of `max_msg_size` bytes) the machine registers;
    /// items wait in their session's queue while none is free.
    /// Default 256.
    pub send_buffers: usize,
    /// Pack several items to the same peer into one message (true), or
    /// send one item per message (false). Default true.
    pub batching: bool,
    /// How long an item may wait for more items to share its message.
    /// Zero sends at once (items still share a message when the session's
    /// messages in flight are at their limit). Default zero.
    pub batch_delay: Duration,
    /// Most messages in flight per session (client sessions and the
    /// server's reply path to each client session). Items queue behind
    /// them and leave together in the next message, so a low limit batches
    /// under load without delaying a lone call. Default 2 (with 16 null
    /// calls in flight on bulk_mem, 2 gave twice the call rate of 8).
    pub max_in_flight: usize,
    /// Most messages of a session (per direction) sent and not yet
    /// acknowledged by the receiver. Messages of one session are numbered
    /// and handled in order; the receiver holds messages that arrive ahead
    /// of a missing one, and this bounds how many. At least
    /// `max_in_flight`, at most [`MAX_WINDOW`](crate::wire::MAX_WINDOW)
    /// (the most any receiver holds). Default 128.
    pub window: usize,
    /// How long a message the receiver refused (no free receive buffer, or
    /// a connection that broke) keeps being sent again, with the same
    /// sequence number, before the session gives it up and restarts its
    /// sequence (its calls fail). Default 10 s.
    pub msg_retry_time: Duration,
    /// How long a receiver holds messages behind a missing one before it
    /// gives the missing one up and handles them. A sender whose window
    /// stays full with no acknowledgement for twice this restarts its
    /// sequence. Must exceed `msg_retry_time`. Default 20 s.
    pub gap_timeout: Duration,
    /// A client session with calls waiting that has sent nothing for this
    /// long sends a probe (an empty acknowledgement), so that a server
    /// that stopped fails the calls at once (when the transport reports
    /// it unreachable) instead of at their timeouts. Zero: never. Default
    /// 1 s.
    pub probe_interval: Duration,
    /// Most client sessions a server keeps; messages of further sessions
    /// are refused (requests answered `Busy`, one-way items dropped) until
    /// sessions go idle. Default 65536.
    pub max_sessions: usize,
    /// Default time a call waits for its reply, per attempt. Default 10 s.
    pub timeout: Duration,
    /// Default number of resends after a timeout. Default 0.
    pub retries: u32,
    /// Most replies the server keeps per client session to answer resent
    /// requests without executing them again. Replies the client says it
    /// has (the replied-below mark of its requests) are dropped before
    /// this bound is reached, so it matters only for a client with many
    /// calls in flight, and must exceed that number. Default 1024.
    pub reply_cache: usize,
    /// Server-side sessions idle this long (with no request in progress)
    /// are forgotten, with their reply caches. Default 10 minutes.
    pub session_idle: Duration,
    /// How long a thread waiting for a call spins before it parks.
    /// Default 50 µs.
    pub spin: Duration,
    /// CPUs to confine the transfer machine's threads to (when the
    /// transport can). Default none.
    pub cpus: Option<Vec<usize>>,
    /// Threads of the handler pool, which runs the handlers registered
    /// with [`RpcHandle::on_blocking`](crate::RpcHandle::on_blocking) and
    /// [`RpcHandle::on_async`](crate::RpcHandle::on_async); started with
    /// the first such handler. As many requests wait at once as there are
    /// threads. Default 4.
    pub handler_threads: usize,
    /// Most requests the handler pool holds at once (queued, running, or
    /// an async handler not finished); more are answered `Busy` at once.
    /// Default 4096.
    pub handler_queue: usize,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self {
            max_msg_size: 16 << 10,
            recv_buffers: 8,
            recv_buffer_size: 256 << 10,
            send_buffers: 256,
            batching: true,
            batch_delay: Duration::ZERO,
            max_in_flight: 2,
            window: 128,
            msg_retry_time: Duration::from_secs(10),
            gap_timeout: Duration::from_secs(20),
            probe_interval: Duration::from_secs(1),
            max_sessions: 65536,
            timeout: Duration::from_secs(10),
            retries: 0,
            reply_cache: 1024,
            session_idle: Duration::from_secs(600),
            spin: Duration::from_micros(50),
            cpus: None,
            handler_threads: 4,
            handler_queue: 4096,
        }
    }
}

impl RpcConfig {
    /// Sets `max_msg_size`.
    #[must_use]
    pub fn with_max_msg_size(mut self, n: usize) -> Self {
        self.max_msg_size = n;
        self
    }

    /// Sets `recv_buffers` and `recv_buffer_size`.
    #[must_use]
    pub fn with_recv_buffers(mut self, count: usize, size: usize) -> Self {
        self.recv_buffers = count;
        self.recv_buffer_size = size;
        self
    }

    /// Sets `send_buffers`.
    #[must_use]
    pub fn with_send_buffers(mut self, n: usize) -> Self {
        self.send_buffers = n;
        self
    }

    /// Sets `batching`.
    #[must_use]
    pub fn with_batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Sets `batch_delay`.
    #[must_use]
    pub fn with_batch_delay(mut self, d: Duration) -> Self {
        self.batch_delay = d;
        self
    }

    /// Sets `max_in_flight`.
    #[must_use]
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Sets `window`.
    #[must_use]
    pub fn with_window(mut self, n: usize) -> Self {
        self.window = n;
        self
    }

    /// Sets `msg_retry_time` and `gap_timeout`.
    #[must_use]
    pub fn with_retry_times(mut self, msg_retry: Duration, gap: Duration) -> Self {
        self.msg_retry_time = msg_retry;
        self.gap_timeout = gap;
        self
    }

    /// Sets `probe_interval`.
    #[must_use]
    pub fn with_probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d;
        self
    }

    /// Sets `max_sessions`.
    #[must_use]
    pub fn with_max_sessions(mut self, n: usize) -> Self {
        self.max_sessions = n;
        self
    }

    /// Sets the default call `timeout`.
    #[must_use]
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Sets the default number of `retries`.
    #[must_use]
    pub fn with_retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// Sets `reply_cache`.
    #[must_use]
    pub fn with_reply_cache(mut self, n: usize) -> Self {
        self.reply_cache = n;
        self
    }

    /// Sets `spin`.
    #[must_use]
    pub fn with_spin(mut self, d: Duration) -> Self {
        self.spin = d;
        self
    }

    /// Sets `cpus`.
    #[must_use]
    pub fn with_cpus(mut self, cpus: Vec<usize>) -> Self {
        self.cpus = Some(cpus);
        self
    }

    /// Sets `handler_threads`.
    #[must_use]
    pub fn with_handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = n;
        self
    }

    /// Sets `handler_queue`.
    #[must_use]
    pub fn with_handler_queue(mut self, n: usize) -> Self {
        self.handler_queue = n;
        self
    }

    /// Checks that the values can work.
    ///
    /// # Errors
    /// `InvalidArgument` naming the bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(RpcError::InvalidArgument(s));
        if self.max_msg_size < MSG_HEADER_SIZE + ITEM_HEADER_SIZE
            || self.max_msg_size > u32::MAX as usize
        {
            return bad(format!("max_msg_size {} out of range", self.max_msg_size));
        }
        if self.recv_buffers == 0 {
            return bad("recv_buffers must be at least 1".into());
        }
        if self.recv_buffer_size < self.max_msg_size {
            return bad(format!(
                "recv_buffer_size {} smaller than max_msg_size {}",
                self.recv_buffer_size, self.max_msg_size
            ));
        }
        if self.send_buffers == 0
            || self.max_in_flight == 0
            || self.reply_cache == 0
            || self.max_sessions == 0
        {
            return bad(
                "send_buffers, max_in_flight, reply_cache and max_sessions must be at least 1"
                    .into(),
            );
        }
        if self.window < self.max_in_flight || self.window as u64 > MAX_WINDOW {
            return bad(format!(
                "window {} must be at least max_in_flight ({}) and at most {MAX_WINDOW}",
                self.window, self.max_in_flight
            ));
        }
        if self.gap_timeout <= self.msg_retry_time {
            return bad(format!(
                "gap_timeout {:?} must exceed msg_retry_time {:?}",
                self.gap_timeout, self.msg_retry_time
            ));
        }
        if self.timeout.is_zero() {
            return bad("timeout must be positive".into());
        }
        if self.handler_queue == 0 {
            return bad("handler_queue must be at least 1".into());
        }
        if self.handler_threads == 0 || self.handler_threads > 1024 {
            return bad(format!(
                "handler_threads {} must be between 1 and 1024",
                self.handler_threads
            ));
        }
        Ok(())
    }
}

/// Options of one call; unset fields take the machine's defaults.
///
/// ```
/// use std::time::Duration;
/// use colibri_rpc::CallOpts;
///
/// let opts = CallOpts::new().timeout(Duration::from_millis(200)).retries(2);
/// assert_eq!(opts.retries, Some(2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOpts {
    /// Time to wait for the reply, per attempt.
    pub timeout: Option<Duration>,
    /// Resends after a timeout (the server answers a resent request from
    /// its reply cache when it already executed it).
    pub retries: Option<u32>,
}

impl CallOpts {
    /// The machine's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the timeout per attempt.
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Sets the number of resends.
    #[must_use]
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = Some(n);
        self
    }
}
