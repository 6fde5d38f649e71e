//! Active bulk on the server side: pull a client's source buffer into a
//! server buffer, or push a server buffer into a client's sink, named by
//! the descriptors of a request.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use colibri_net::{BufferCallbacks, BufferEvent, NetBuffer, QueueType};

use crate::call::BulkDone;
use crate::completion::Completion;
use crate::error::{BlockedWait, RpcError, check_may_block};
use crate::machine::{Inner, RpcHandle};
use crate::stats::bump;
use crate::wire::{BulkDesc, BulkKind};

/// An active bulk transfer in flight; completes with the buffer.
///
/// Wait for it, poll it, give it a callback or `.await` it (through
/// [`BulkOpFuture`]). A transfer refused at once (wrong
/// direction, buffer too small, machine stopping) completes at once with
/// the failure and the buffer.
#[must_use = "the buffer comes back only through the handle"]
pub struct BulkOp {
    cell: Arc<Completion<BulkDone>>,
    spin: Duration,
}

impl fmt::Debug for BulkOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkOp")
            .field("done", &self.cell.is_done())
            .finish()
    }
}

impl BulkOp {
    fn done_now(buffer: NetBuffer, e: RpcError, spin: Duration) -> Self {
        let cell = Arc::new(Completion::default());
        cell.complete(BulkDone {
            buffer,
            result: Err(e),
        });
        Self { cell, spin }
    }

    /// True once the transfer completed.
    pub fn is_done(&self) -> bool {
        self.cell.is_done()
    }

    /// Blocks until the transfer completes.
    ///
    /// # Errors
    /// On a thread that delivers events (in a handler registered with
    /// [`RpcHandle::on`](crate::RpcHandle::on), in a completion callback),
    /// the handle back in a [`BlockedWait`] at once: the transfer goes on.
    /// Wait in a handler registered with
    /// [`RpcHandle::on_blocking`](crate::RpcHandle::on_blocking), `.await`
    /// the operation in one registered with
    /// [`RpcHandle::on_async`](crate::RpcHandle::on_async), or use
    /// [`BulkOp::on_complete`].
    pub fn wait(self) -> Result<BulkDone, BlockedWait<Self>> {
        if check_may_block("BulkOp::wait").is_err() {
            return Err(BlockedWait::new(self, "BulkOp::wait"));
        }
        loop {
            // Only this handle (consumed here) takes the value: it comes.
            if let Some(d) = self.cell.wait(self.spin, None) {
                return Ok(d);
            }
        }
    }

    /// The outcome if it is there, else the handle back.
    ///
    /// # Errors
    /// The handle, when the transfer has not completed yet.
    pub fn try_result(self) -> Result<BulkDone, Self> {
        match self.cell.try_take() {
            Some(d) => Ok(d),
            None => Err(self),
        }
    }

    /// Runs `f` with the outcome (on the transport thread that completes
    /// the transfer, or on this thread if it already completed).
    pub fn on_complete(self, f: impl FnOnce(BulkDone) + Send + 'static) {
        let _ = self.cell.on_complete(f);
    }
}

/// The future of a [`BulkOp`] (`.await` it directly).
#[must_use = "futures do nothing unless polled"]
pub struct BulkOpFuture {
    cell: Arc<Completion<BulkDone>>,
}

impl fmt::Debug for BulkOpFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkOpFuture").finish_non_exhaustive()
    }
}

impl IntoFuture for BulkOp {
    type Output = BulkDone;
    type IntoFuture = BulkOpFuture;

    fn into_future(self) -> BulkOpFuture {
        BulkOpFuture { cell: self.cell }
    }
}

impl Future for BulkOpFuture {
    type Output = BulkDone;

    /// Polling again after `Ready` stays pending (the value was handed out).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BulkDone> {
        match self.cell.poll(cx) {
            Poll::Ready(Some(d)) => Poll::Ready(d),
            _ => Poll::Pending,
        }
    }
}

/// The outcome of a bulk buffer's final event (active on the server,
/// passive on the client), counted in the machine's bulk statistics when
/// it succeeded. `None` for an event that carries no buffer.
pub(crate) fn bulk_outcome(ev: &mut BufferEvent, m: &Weak<Inner>) -> Option<BulkDone> {
    let buffer = ev.take_buffer()?;
    let result = match ev.status() {
        Ok(()) => Ok(ev.length()),
        Err(e) => Err(RpcError::Net(e.clone())),
    };
    if let (Ok(n), Some(m)) = (&result, m.upgrade()) {
        bump(&m.stats.bulk_ok, 1);
        bump(&m.stats.bulk_bytes, *n as u64);
    }
    Some(BulkDone { buffer, result })
}

impl RpcHandle {
    fn bulk_cbs(&self, cell: &Arc<Completion<BulkDone>>) -> Arc<BufferCallbacks> {
        // The callbacks hold the cell until the transfer's completion (a
        // handle given a callback is gone by then), and let go of it at
        // that point: the buffer, stored in the cell, must not keep the
        // cell alive through its callbacks.
        let holder = Arc::new(parking_lot::Mutex::new(Some(Arc::clone(cell))));
        let m = Arc::downgrade(&self.inner);
        let cb = move |_tm: &colibri_net::TmHandle, mut ev: BufferEvent| {
            let Some(done) = bulk_outcome(&mut ev, &m) else {
                return;
            };
            let cell = holder.lock().take();
            if let Some(c) = cell {
                c.complete(done);
            }
        };
        Arc::new(
            BufferCallbacks::new()
                .on(QueueType::ActiveBulkRecv, cb.clone())
                .on(QueueType::ActiveBulkSend, cb),
        )
    }

    /// Reads a client's source buffer (`desc`, from
    /// [`Request::bulk`](crate::Request::bulk)) into `buf`, which must
    /// hold at least `desc.len` bytes.
    pub fn bulk_pull(&self, desc: &BulkDesc, buf: NetBuffer) -> BulkOp {
        let spin = self.inner.cfg.spin;
        if desc.kind != BulkKind::Source {
            return BulkOp::done_now(
                buf,
                RpcError::InvalidArgument("bulk_pull needs a source descriptor".into()),
                spin,
            );
        }
        if (buf.len() as u64) < desc.len {
            let e = RpcError::InvalidArgument(format!(
                "buffer of {} bytes for a source of {} bytes",
                buf.len(),
                desc.len
            ));
            return BulkOp::done_now(buf, e, spin);
        }
        if self.inner.is_stopping() {
            return BulkOp::done_now(buf, RpcError::Shutdown, spin);
        }
        let cell = Arc::new(Completion::default());
        let buf = buf.with_callbacks(self.bulk_cbs(&cell));
        match self.inner.tm.add_active_recv(buf, &desc.desc) {
            Ok(_) => BulkOp { cell, spin },
            Err(e) => BulkOp::done_now(e.buffer, RpcError::Net(e.error), spin),
        }
    }

    /// Writes the first `len` bytes of `buf` into a client's sink buffer
    /// (`desc`); `len` must not exceed `desc.len`.
    pub fn bulk_push(&self, desc: &BulkDesc, buf: NetBuffer, len: usize) -> BulkOp {
        let spin = self.inner.cfg.spin;
        if desc.kind != BulkKind::Sink {
            return BulkOp::done_now(
                buf,
                RpcError::InvalidArgument("bulk_push needs a sink descriptor".into()),
                spin,
            );
        }
        if len as u64 > desc.len {
            let e =
                RpcError::InvalidArgument(format!("{len} bytes for a sink of {} bytes", desc.len));
            return BulkOp::done_now(buf, e, spin);
        }
        if self.inner.is_stopping() {
            return BulkOp::done_now(buf, RpcError::Shutdown, spin);
        }
        let cell = Arc::new(Completion::default());
        let buf = buf.with_callbacks(self.bulk_cbs(&cell));
        match self.inner.tm.add_active_send(buf, &desc.desc, len) {
            Ok(_) => BulkOp { cell, spin },
            Err(e) => BulkOp::done_now(e.buffer, RpcError::Net(e.error), spin),
        }
    }
}
