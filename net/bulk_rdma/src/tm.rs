//! The transfer machine's transport object: addresses and listeners, and
//! commands to the domain's engine.

use std::collections::HashMap;
use std::net::SocketAddrV4;
use std::sync::{Arc, LazyLock, OnceLock};

use colibri_net::addr::InetAddr;
use colibri_net::registry::Registry;
use colibri_net::xprt::{DelReason, Delivery, EpAddr, QueuedBuf, TmSink, XprtTm};
use colibri_net::{NetError, QueueType, Result, TmId};
use parking_lot::Mutex;
use tracing::debug;

use crate::engine::{Cmd, Engine, ListenerSlot};

/// Started transfer machines of this process, by address.
pub(crate) static SERVICES: Registry<TmShared> = Registry::new();

struct ListenerEntry {
    /// The engine that accepts on it (identity only).
    engine: usize,
    slot: Arc<ListenerSlot>,
    users: usize,
}

/// Listening sockets of this process, by `a.b.c.d:port`.
static LISTENERS: LazyLock<Mutex<HashMap<SocketAddrV4, ListenerEntry>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// State shared by a transfer machine's transport object and the engine.
#[derive(Debug)]
pub(crate) struct TmShared {
    pub id: TmId,
    pub sink: TmSink,
    engine: Arc<Engine>,
    own: OnceLock<InetAddr>,
    /// Our address, while we hold it (service and listener).
    held: Mutex<Option<InetAddr>>,
}

impl TmShared {
    /// Our address (once started).
    pub(crate) fn own(&self) -> InetAddr {
        self.own.get().copied().unwrap_or(InetAddr {
            ip: std::net::Ipv4Addr::UNSPECIFIED,
            port: 0,
            service: 0,
        })
    }

    /// The engine of the machine's domain.
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub(crate) fn own_addr(&self) -> String {
        self.own().to_string()
    }

    /// Leaves the service table and the listener (closing it when we were
    /// its last user, so the address can be started again at once).
    fn leave(&self) {
        let Some(a) = self.held.lock().take() else {
            return;
        };
        SERVICES.release(&a, self);
        let key = SocketAddrV4::new(a.ip, a.port);
        let mut ls = LISTENERS.lock();
        if let Some(e) = ls.get_mut(&key) {
            e.users -= 1;
            if e.users == 0 {
                let e = ls.remove(&key).expect("present");
                drop(e.slot.sock.lock().take());
            }
        }
    }
}

/// The transport object of one transfer machine.
#[derive(Debug)]
pub(crate) struct RdmaTm {
    sh: Arc<TmShared>,
}

impl RdmaTm {
    pub(crate) fn new(id: TmId, engine: Arc<Engine>, sink: TmSink) -> Self {
        Self {
            sh: Arc::new(TmShared {
                id,
                sink,
                engine,
                own: OnceLock::new(),
                held: Mutex::new(None),
            }),
        }
    }

    fn engine_id(&self) -> usize {
        Arc::as_ptr(&self.sh.engine) as usize
    }
}

/// Parses an address for the core.
pub(crate) fn ep_addr(addr: &str) -> Result<EpAddr> {
    let a = InetAddr::parse(addr)?;
    Ok(EpAddr {
        addr: a.to_string(),
        data: Arc::new(a),
    })
}

impl XprtTm for RdmaTm {
    fn start(&self, addr: &str) -> Result<()> {
        let want = InetAddr::parse(addr)?;
        if want.ip.is_unspecified() || want.ip.is_broadcast() || want.ip.is_multicast() {
            return Err(NetError::InvalidAddress {
                addr: addr.to_string(),
                reason: "a transfer machine needs a unicast address peers can reach".into(),
            });
        }
        let mut ls = LISTENERS.lock();
        let key = SocketAddrV4::new(want.ip, want.port);
        let (got, new_slot) = match ls.get_mut(&key) {
            Some(e) if want.port != 0 => {
                if e.engine != self.engine_id() {
                    return Err(NetError::AddrInUse(format!(
                        "{key} (listened on by another domain of this process)"
                    )));
                }
                let got = SERVICES.claim(want, &self.sh)?;
                e.users += 1;
                (got, None)
            }
            _ => {
                let l = std::net::TcpListener::bind(key).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::AddrInUse {
                        NetError::AddrInUse(addr.to_string())
                    } else {
                        NetError::io(&e)
                    }
                })?;
                l.set_nonblocking(true).map_err(|e| NetError::io(&e))?;
                let port = l.local_addr().map_err(|e| NetError::io(&e))?.port();
                let got = SERVICES.claim(
                    InetAddr {
                        ip: want.ip,
                        port,
                        service: want.service,
                    },
                    &self.sh,
                )?;
                let slot = Arc::new(ListenerSlot {
                    sock: Mutex::new(Some(mio::net::TcpListener::from_std(l))),
                });
                ls.insert(
                    SocketAddrV4::new(want.ip, port),
                    ListenerEntry {
                        engine: self.engine_id(),
                        slot: Arc::clone(&slot),
                        users: 1,
                    },
                );
                (got, Some(slot))
            }
        };
        drop(ls);
        let _ = self.sh.own.set(got);
        *self.sh.held.lock() = Some(got);
        if let Some(slot) = new_slot {
            self.sh.engine.push(Cmd::Listen(slot));
        }
        debug!(tm = %self.sh.id, addr = %got, "starting");
        self.sh.engine.push(Cmd::Started(Arc::clone(&self.sh)));
        Ok(())
    }

    fn stop(&self, abort: bool) -> Result<()> {
        debug!(tm = %self.sh.id, abort, "stop requested");
        Ok(())
    }

    fn stopped(&self) {
        self.sh.leave();
    }

    fn fini(&self) {
        self.sh.leave();
    }

    fn ep_parse(&self, addr: &str) -> Result<EpAddr> {
        ep_addr(addr)
    }

    fn buf_add(&self, buf: &QueuedBuf) -> Result<()> {
        match buf.queue() {
            QueueType::MsgSend => self
                .sh
                .engine
                .push(Cmd::Send(Arc::clone(&self.sh), buf.clone())),
            QueueType::ActiveBulkRecv | QueueType::ActiveBulkSend => self
                .sh
                .engine
                .push(Cmd::Active(Arc::clone(&self.sh), buf.clone())),
            // Receive and passive buffers wait for a peer's request.
            QueueType::MsgRecv | QueueType::PassiveBulkRecv | QueueType::PassiveBulkSend => {}
        }
        Ok(())
    }

    fn buf_del(&self, buf: &QueuedBuf, reason: DelReason) {
        self.sh.engine.push(Cmd::Del(buf.clone(), reason));
    }

    fn deliver(&self, delivery: Delivery) {
        self.sh.engine.push(Cmd::Deliver(delivery));
    }

    /// Pins the domain's engine thread (which runs every callback of its
    /// transfer machines) to the first CPU of `cpus`, as `bulk_tcp` does.
    fn confine(&self, cpus: &[usize]) -> Result<()> {
        let first = colibri_net::cpu::check_cpu_set(cpus)?;
        self.sh.engine.push(Cmd::Pin(first));
        Ok(())
    }
}
