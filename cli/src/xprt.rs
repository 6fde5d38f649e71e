//! Transport choice: the `--xprt` values and the one factory that turns
//! them into transports. Adding a transport (TCP, RDMA) is one variant
//! here, one arm in [`Xprt::transport`] and one in [`Xprt::default_addr`].

use std::sync::Arc;

use clap::ValueEnum;
use colibri_bench::PairConfig;
use colibri_bulk_mem::{MemConfig, MemTransport};
use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
use colibri_bulk_tcp::{TcpConfig, TcpTransport};
use colibri_net::Transport;

/// A transport the program can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Xprt {
    /// The in-memory transport: transfer machines of one process only.
    Mem,
    /// The TCP transport: transfer machines of any processes (loopback in
    /// benchmarks, compared with a raw TCP socket pair).
    Tcp,
    /// The verbs RDMA transport: needs an RDMA device (the Soft-RoCE VM,
    /// `../shared/rdma-vm/run.sh --net lo -- colibri ...`).
    Rdma,
}

impl Xprt {
    /// Its name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Mem => "mem",
            Self::Tcp => "tcp",
            Self::Rdma => "rdma",
        }
    }

    /// Builds the transport: `polling` workers spin before they sleep,
    /// with `workers` threads per transfer machine.
    pub(crate) fn transport(self, polling: bool, workers: usize) -> Arc<dyn Transport> {
        match self {
            Self::Mem => {
                let base = if polling {
                    MemConfig::polling()
                } else {
                    MemConfig::blocking()
                };
                Arc::new(MemTransport::new(MemConfig {
                    workers: workers.max(1),
                    ..base
                }))
            }
            // One I/O thread per domain (`workers` does not apply); polling:
            // it spins 1 ms in epoll_wait(0) before it blocks, so a busy
            // transfer machine never sleeps.
            Self::Tcp => Arc::new(TcpTransport::new(TcpConfig {
                spin: if polling {
                    std::time::Duration::from_millis(1)
                } else {
                    std::time::Duration::ZERO
                },
                ..TcpConfig::default()
            })),
            // One engine thread per domain; polling: it spins 1 ms on the
            // CQ and the sockets before it arms the CQ and blocks.
            Self::Rdma => Arc::new(RdmaTransport::new(if polling {
                RdmaConfig::polling()
            } else {
                RdmaConfig::blocking()
            })),
        }
    }

    /// The address a server listens at by default, and a client's own
    /// address (port 0: any free port).
    pub(crate) fn default_addr(self, server: bool) -> &'static str {
        match (self, server) {
            (Self::Mem, true) => "127.0.0.1:4040:1",
            (Self::Mem, false) => "127.0.0.1:0:2",
            (Self::Tcp, true) => "127.0.0.1:4041:1",
            (Self::Tcp, false) => "127.0.0.1:0:2",
            (Self::Rdma, true) => "127.0.0.1:4042:1",
            (Self::Rdma, false) => "127.0.0.1:0:2",
        }
    }

    /// Where a benchmark starts its client and server.
    pub(crate) fn pair(self) -> PairConfig {
        match self {
            Self::Mem | Self::Tcp | Self::Rdma => PairConfig::mem(),
        }
    }

    /// True when another process can reach a server on this transport.
    pub(crate) fn crosses_processes(self) -> bool {
        match self {
            Self::Mem => false,
            Self::Tcp | Self::Rdma => true,
        }
    }
}
