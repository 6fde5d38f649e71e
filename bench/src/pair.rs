//! A client and a server transfer machine, each in its own domain.

use std::time::Duration;

use colibri_net::{
    Domain, EndPoint, NetError, TmState, TransferMachine, Transport, ignore_tm_events,
};

use crate::BenchResult;

const WAIT: Duration = Duration::from_secs(30);

/// Where to start the two transfer machines and how to place them.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// Address of the client transfer machine.
    pub client_addr: String,
    /// Address of the server transfer machine.
    pub server_addr: String,
    /// CPUs to confine (client, server) threads to, if the transport can.
    pub cpus: Option<(usize, usize)>,
}

impl PairConfig {
    /// Addresses for the in-memory transport (ports picked at start).
    pub fn mem() -> Self {
        Self {
            client_addr: "127.0.0.1:0:1".into(),
            server_addr: "127.0.0.1:0:2".into(),
            cpus: None,
        }
    }

    /// The same, with the client's threads on `client` and the server's on
    /// `server`.
    #[must_use]
    pub fn pinned(mut self, client: usize, server: usize) -> Self {
        self.cpus = Some((client, server));
        self
    }
}

/// One side of a pair.
#[derive(Debug)]
pub struct Side {
    /// Its domain.
    pub dom: Domain,
    /// Its transfer machine (started).
    pub tm: TransferMachine,
    /// Its address (as started).
    pub addr: String,
}

impl Side {
    fn start(xprt: &dyn Transport, addr: &str, cpu: Option<usize>) -> BenchResult<Self> {
        let dom = Domain::new(xprt)?;
        let tm = dom.tm_init(ignore_tm_events())?;
        if let Some(cpu) = cpu {
            match tm.confine(&[cpu]) {
                Ok(()) | Err(NetError::Unsupported { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        tm.start(addr)?;
        tm.wait_for_state(TmState::Started, WAIT)?;
        let addr = tm
            .ep()
            .map(|e| e.addr().to_string())
            .unwrap_or_else(|| addr.to_string());
        Ok(Self { dom, tm, addr })
    }

    fn shutdown(self) {
        if self.tm.state() == TmState::Started {
            let _ = self.tm.stop(true);
        }
        let _ = self.tm.wait_stopped(WAIT);
        if let Err(e) = self.tm.fini() {
            eprintln!("warning: benchmark transfer machine fini: {}", e.error);
            return;
        }
        if let Err(e) = self.dom.fini() {
            eprintln!("warning: benchmark domain fini: {}", e.error);
        }
    }
}

/// A started client and server.
#[derive(Debug)]
pub struct BenchPair {
    /// The client (initiates every transfer).
    pub client: Side,
    /// The server.
    pub server: Side,
}

impl BenchPair {
    /// Starts both transfer machines.
    ///
    /// # Errors
    /// Any failure to start.
    pub fn new(xprt: &dyn Transport, cfg: &PairConfig) -> BenchResult<Self> {
        let server = Side::start(xprt, &cfg.server_addr, cfg.cpus.map(|c| c.1))?;
        let client = Side::start(xprt, &cfg.client_addr, cfg.cpus.map(|c| c.0))?;
        Ok(Self { client, server })
    }

    /// The server's end point in the client's transfer machine.
    ///
    /// # Errors
    /// The transport's refusal.
    pub fn server_ep(&self) -> BenchResult<EndPoint> {
        Ok(self.client.tm.ep_create(&self.server.addr)?)
    }

    /// Stops both sides (with abort) and waits until every buffer came back.
    pub fn stop(&self) {
        for tm in [&self.client.tm, &self.server.tm] {
            if tm.state() == TmState::Started {
                let _ = tm.stop(true);
            }
        }
        for tm in [&self.client.tm, &self.server.tm] {
            let _ = tm.wait_stopped(WAIT);
        }
    }

    /// Stops (if needed) and finalises both sides. The workload must have
    /// released its end points first.
    pub fn shutdown(self) {
        self.client.shutdown();
        self.server.shutdown();
    }
}
