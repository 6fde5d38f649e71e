//! A transfer machine's own delivery thread (a *lane*): where its
//! callbacks run when it has one, so that a slow callback holds up only
//! its own machine, never the node's engine thread (which then only hands
//! work over and never waits for the application).
//!
//! A lane is made for every machine when the transport's configuration
//! asks for it ([`LnetXprtConfig::thread_per_tm`](crate::LnetXprtConfig)).
//! Its thread runs the machine's work in the order it was handed over and
//! pins itself as `confine` asked. It leaves once the machine is finalised and what was
//! queued ran: the thread holds only the receiving end of the queue, and
//! the machine's transport object gives up the sending end when it goes.

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use tracing::trace;

use colibri_net::xprt::Delivery;
use colibri_net::{NetError, Result};

use crate::engine::Work;

/// The sending end of a transfer machine's delivery thread.
pub(crate) struct Lane {
    /// `None` once the machine is finalised (the thread then drains what
    /// is queued and leaves).
    tx: Mutex<Option<Sender<Work>>>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("open", &self.tx.lock().is_some())
            .finish()
    }
}

impl Lane {
    /// Starts the thread `name`.
    pub(crate) fn start(name: String) -> Result<Self> {
        // Work items: one per completion or delivery of this machine,
        // bounded by its queued buffers.
        #[allow(clippy::disallowed_methods)]
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _mark = colibri_net::wait::DeliveryThread::enter();
                while let Ok(w) = rx.recv() {
                    run(w);
                }
                trace!("transfer machine delivery thread leaves");
            })
            .map_err(NetError::from)?;
        Ok(Self {
            tx: Mutex::new(Some(tx)),
        })
    }

    /// Hands `w` to the thread; once the lane is closed, runs it here (the
    /// machine is finalised: its sink calls nobody any more).
    pub(crate) fn push(&self, w: Work) {
        let r = match &*self.tx.lock() {
            Some(tx) => tx.send(w).map_err(|e| e.0),
            None => Err(w),
        };
        if let Err(w) = r {
            run(w);
        }
    }

    /// Runs `d` on the thread.
    pub(crate) fn deliver(&self, d: Delivery) {
        if d.is_pending() {
            self.push(Work::Deliver(d));
        }
    }

    /// Gives up the sending end: the thread leaves once it ran what is
    /// queued.
    pub(crate) fn close(&self) {
        self.tx.lock().take();
    }
}

fn run(w: Work) {
    match w {
        Work::Deliver(d) => d.run(),
        Work::Started(tm, own) => tm.sink().post_started(&own),
        Work::Complete(sink, q, r) => sink.complete(&q, r),
        Work::Pin(cpu) => {
            colibri_net::cpu::pin_current_thread(cpu, "LNet transfer machine delivery thread");
        }
    }
}
