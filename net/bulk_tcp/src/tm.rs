//! The TCP transfer machine: the `xo_tm_*` and `xo_buf_*` operations. Each
//! one only queues a command to an I/O thread (they run under the transfer
//! machine's lock and must not block).

use std::sync::{Arc, OnceLock};

use colibri_net::xprt::{DelReason, Delivery, EpAddr, QueuedBuf, TmSink, XprtTm};
use colibri_net::{NetError, QueueType, Result, TmId};
use parking_lot::Mutex;
use tracing::debug;

use crate::addr::TcpAddr;
use crate::engine::{self, Cmd, Engine, Listener};
use crate::proto::Machine;

/// State of a transfer machine shared by its transport object and the I/O
/// threads.
pub(crate) struct TmShared {
    pub(crate) id: TmId,
    /// The I/O thread of the transfer machine's domain: its sends and
    /// active transfers, and the core's deliveries.
    pub(crate) engine: Arc<Engine>,
    sink: TmSink,
    own: OnceLock<TcpAddr>,
    listener: Mutex<Option<Arc<Listener>>>,
}

impl std::fmt::Debug for TmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TmShared")
            .field("id", &self.id)
            .field("own", &self.own.get())
            .finish()
    }
}

impl Machine for TmShared {
    fn sink(&self) -> &TmSink {
        &self.sink
    }

    fn own(&self) -> Option<TcpAddr> {
        self.own.get().copied()
    }
}

impl TmShared {
    fn leave_listener(&self) {
        let l = self.listener.lock().take();
        if let (Some(l), Some(own)) = (l, self.own()) {
            engine::release_addr(&l, own.service, self);
        }
    }
}

/// The transport object of one transfer machine.
#[derive(Debug)]
pub(crate) struct TcpTm {
    sh: Arc<TmShared>,
}

impl TcpTm {
    pub(crate) fn new(id: TmId, engine: Arc<Engine>, sink: TmSink) -> Self {
        Self {
            sh: Arc::new(TmShared {
                id,
                engine,
                sink,
                own: OnceLock::new(),
                listener: Mutex::new(None),
            }),
        }
    }
}

impl XprtTm for TcpTm {
    fn start(&self, addr: &str) -> Result<()> {
        let want = TcpAddr::parse(addr)?;
        if want.ip.is_unspecified() || want.ip.is_broadcast() || want.ip.is_multicast() {
            return Err(NetError::InvalidAddress {
                addr: addr.to_string(),
                reason: "a transfer machine needs a unicast address peers can reach".into(),
            });
        }
        let (l, got) = engine::claim_addr(want, &self.sh)?;
        let _ = self.sh.own.set(got);
        *self.sh.listener.lock() = Some(l);
        debug!(tm = %self.sh.id, addr = %got, "starting");
        self.sh.engine.push(Cmd::Started(Arc::clone(&self.sh)));
        Ok(())
    }

    fn stop(&self, abort: bool) -> Result<()> {
        debug!(tm = %self.sh.id, abort, "stop requested");
        Ok(())
    }

    fn stopped(&self) {
        self.sh.leave_listener();
        debug!(tm = %self.sh.id, "stopped");
    }

    fn fini(&self) {
        self.sh.leave_listener();
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        crate::addr::ep_addr(addr)
    }

    fn reset_peer(&self, addr: &str) -> bool {
        let Ok(a) = TcpAddr::parse(addr) else {
            return false;
        };
        let peer = a.sock();
        // Any engine of the process may hold a connection with it (its
        // listener's engine reads the requests it sends us).
        engine::push_all(|| Cmd::Reset(peer));
        true
    }

    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        match buf.queue() {
            QueueType::MsgSend => {
                let sh = Arc::clone(&self.sh);
                self.sh.engine.push(Cmd::Send(sh, buf.clone()));
            }
            QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => {
                let sh = Arc::clone(&self.sh);
                self.sh.engine.push(Cmd::Active(sh, buf.clone()));
            }
            // Receive and passive buffers wait for requests.
            QueueType::MsgRecv | QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => {}
        }
        Ok(())
    }

    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        let del = || Cmd::Del(buf.clone(), reason);
        if buf.queue().is_passive() || buf.queue() == QueueType::MsgRecv {
            // A request is filling or reading it. Requests for this machine
            // are read by the engine of its listener, by its own engine when
            // they come back over a connection it opened, and (when its
            // port is shared with another domain's machines) by that
            // domain's engine: every engine looks for it.
            engine::push_all(del);
        } else {
            self.sh.engine.push(del());
        }
    }

    fn deliver(&self, delivery: Delivery) {
        self.sh.engine.push(Cmd::Deliver(delivery));
    }

    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let first = colibri_net::cpu::check_cpu_set(cpus)?;
        self.sh.engine.push(Cmd::Pin(first));
        Ok(())
    }
}
