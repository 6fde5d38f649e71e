//! # colibri-net: the Colibri messaging layer
//!
//! Asynchronous one-way messaging and zero-copy bulk transfer between
//! *transfer machines*, over interchangeable transports (in-memory, TCP,
//! RDMA verbs, LNet). This crate is the API and the transport boundary; it
//! does no I/O of its own.
//!
//! ```text
//!   Domain (one transport's resources)
//!    ├── NetBuffer (registered memory: a BufVec of segments)
//!    └── TransferMachine (an end point's engine)
//!          ├── six queues of buffers: MSG_RECV, MSG_SEND,
//!          │   PASSIVE_BULK_RECV/SEND, ACTIVE_BULK_RECV/SEND
//!          ├── EndPoints (peers, reference counted)
//!          ├── statistics per queue
//!          └── XprtTm ──── the transport, reporting through a TmSink
//! ```
//!
//! * An application registers memory with a [`Domain`] and gets a
//!   [`NetBuffer`].
//! * It adds buffers to a [`TransferMachine`]'s queues with typed operations
//!   ([`AddOp`]): receive messages, send a message to an [`EndPoint`], offer
//!   a buffer for remote bulk access (which returns a [`NetBufDesc`]), or
//!   read/write a remote buffer named by a descriptor.
//! * Adding moves the buffer into the transfer machine; its completion
//!   event ([`BufferEvent`]) hands it back to the buffer's callback for that
//!   queue. **Every add gets exactly one final completion** (success,
//!   failure, `Cancelled`, `TimedOut`), whatever happens: stop, peer death,
//!   cancellation, timeouts.
//! * Callbacks run without the transfer machine's lock and may call back
//!   into the API; events for one buffer are serialized. A transfer machine
//!   can instead hold events until the application calls
//!   [`TmHandle::deliver_all`] on its own thread.
//!
//! [`pool`] adds buffer pools and keeps receive queues stocked from them
//! (Motr's buffer pool and `tm_pool_attach`), on top of the public API.
//!
//! Transports implement the traits of [`xprt`]; the core does all the
//! bookkeeping and the checks shared by every transport.
//!
//! ## Example: a message between two transfer machines in one process
//!
//! ```
//! use std::time::Duration;
//! use colibri_bulk_mem::MemTransport;
//! use colibri_net::{BufVec, Domain, QueueType, RecvParams, TmState, event_channel, ignore_tm_events};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let xprt = MemTransport::default();
//! let (sdom, cdom) = (Domain::new(&xprt)?, Domain::new(&xprt)?);
//! let (callbacks, events) = event_channel(8);
//! let server = sdom.tm_init(ignore_tm_events())?;
//! let client = cdom.tm_init(ignore_tm_events())?;
//! server.start("127.0.0.1:4000:1")?;
//! client.start("127.0.0.1:4000:2")?;
//! server.wait_for_state(TmState::Started, Duration::from_secs(5))?;
//! client.wait_for_state(TmState::Started, Duration::from_secs(5))?;
//!
//! let rbuf = sdom.register(BufVec::new(1, 4096))?.with_callbacks(callbacks.clone());
//! server.add_msg_recv(rbuf, RecvParams::default())?;
//! let mut sbuf = cdom.register(BufVec::new(1, 4096))?.with_callbacks(callbacks);
//! sbuf.bufvec_mut().copy_in(0, b"hello")?;
//! let server_ep = client.ep_create("127.0.0.1:4000:1")?;
//! client.add_msg_send(sbuf, &server_ep, 5)?;
//!
//! for _ in 0..2 {
//!     let ev = events.recv_timeout(Duration::from_secs(5)).expect("an event");
//!     assert!(ev.is_ok());
//!     if ev.queue() == QueueType::MsgRecv {
//!         assert_eq!(ev.message()?, b"hello");
//!         assert_eq!(ev.sender().unwrap().addr(), "127.0.0.1:4000:2");
//!     }
//! }
//! # drop(server_ep);
//! # Ok(())
//! # }
//! ```

// One module (`checksum::hw`, the CPU's CRC-32C instruction) allows it.
#![deny(unsafe_code)]

pub mod addr;
pub mod buffer;
pub mod bufvec;
pub mod checksum;
pub mod clock;
pub mod cpu;
pub mod desc;
pub mod domain;
pub mod ep;
pub mod error;
pub mod fasthash;
pub mod fault;
pub mod pool;
pub mod queue;
pub mod registry;
mod sink;
mod slab;
pub mod stats;
#[doc(hidden)]
pub mod sync;
pub mod tm;
mod util;
pub mod wait;
pub mod xprt;

pub use buffer::{BufState, BufferCallback, BufferCallbacks, BufferEvent, NetBuffer};
pub use bufvec::BufVec;
pub use clock::{Clock, ManualClock};
pub use desc::{DescFields, NetBufDesc};
pub use domain::{Domain, DomainConfig};
pub use ep::EndPoint;
pub use error::{AddError, FiniError, NetError, RegisterError, Result};
pub use queue::QueueType;
pub use stats::QueueStats;
pub use tm::{
    AddOp, Added, BufToken, RecvParams, TmCallback, TmEvent, TmEventKind, TmHandle, TmId, TmState,
    TransferMachine,
};
pub use wait::{EventReceiver, TmEventReceiver, event_channel, ignore_tm_events, tm_event_channel};
pub use xprt::{Caps, Limits, Transport};
