//! Calls in flight on the client side, and the handles their callers hold.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use colibri_net::{BufToken, NetBuffer, TmHandle};
use parking_lot::Mutex;

use crate::completion::Completion;
use crate::error::{BlockedWait, Result, RpcError, check_may_block};
use crate::machine::Inner;
use crate::session::SessionInner;

/// A client buffer to hand to the server for bulk transfer with a call.
///
/// The machine adds it to a passive queue (its descriptor, usable only by
/// the server the session talks to, travels in the request) and hands it
/// back in the call's [`BulkOutcome`] once both the reply and the buffer's
/// own completion have arrived.
#[derive(Debug)]
pub enum BulkArg {
    /// Data the server reads: the first `len` bytes of `buf`.
    Source {
        /// The buffer (registered with the client machine's domain).
        buf: NetBuffer,
        /// Bytes offered.
        len: usize,
    },
    /// Space the server writes into.
    Sink {
        /// The buffer (registered with the client machine's domain).
        buf: NetBuffer,
    },
}

impl BulkArg {
    pub(crate) fn into_buffer(self) -> NetBuffer {
        match self {
            Self::Source { buf, .. } | Self::Sink { buf } => buf,
        }
    }
}

/// A buffer handed back after a bulk transfer (or its failure).
#[derive(Debug)]
pub struct BulkDone {
    /// The buffer.
    pub buffer: NetBuffer,
    /// Bytes transferred, or why not.
    pub result: Result<usize>,
}

/// The outcome of a call with bulk buffers: the reply (or the failure) and
/// every buffer, in the order they were given.
#[derive(Debug)]
pub struct BulkOutcome {
    /// The reply payload, or the failure.
    pub result: Result<Vec<u8>>,
    /// The call's bulk buffers, in argument order.
    pub buffers: Vec<BulkDone>,
}

#[derive(Default)]
struct BulkSt {
    result: Option<Result<Vec<u8>>>,
    outstanding: usize,
    done: Vec<Option<BulkDone>>,
    tokens: Vec<Option<BufToken>>,
}

/// A call's shared state: its completion cell and, for bulk calls, the
/// bookkeeping of its buffers.
pub(crate) struct CallState {
    pub(crate) cell: Completion<BulkOutcome>,
    bulk: Option<(Mutex<BulkSt>, TmHandle)>,
}

impl fmt::Debug for CallState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallState")
            .field("done", &self.cell.is_done())
            .field("bulk", &self.bulk.is_some())
            .finish()
    }
}

impl CallState {
    pub(crate) fn plain() -> Arc<Self> {
        Arc::new(Self {
            cell: Completion::default(),
            bulk: None,
        })
    }

    pub(crate) fn with_bulk(n: usize, tm: TmHandle) -> Arc<Self> {
        let st = BulkSt {
            done: (0..n).map(|_| None).collect(),
            tokens: vec![None; n],
            ..BulkSt::default()
        };
        Arc::new(Self {
            cell: Completion::default(),
            bulk: Some((Mutex::new(st), tm)),
        })
    }

    /// Counts a bulk buffer about to be added.
    pub(crate) fn bulk_expect(&self) {
        if let Some((b, _)) = &self.bulk {
            b.lock().outstanding += 1;
        }
    }

    /// Records the token of bulk buffer `i` once added.
    pub(crate) fn bulk_added(&self, i: usize, token: BufToken) {
        let Some((b, tm)) = &self.bulk else {
            return;
        };
        let mut st = b.lock();
        if st.done[i].is_none() {
            st.tokens[i] = Some(token);
            if st.result.is_some() {
                // The call already failed: cancel the buffer at once.
                drop(st);
                let _ = tm.del(token);
            }
        }
    }

    /// Records the completion of bulk buffer `i` (its add failed, it was
    /// never added, or its passive operation completed).
    pub(crate) fn bulk_done(&self, i: usize, done: BulkDone, counted: bool) {
        let Some((b, _)) = &self.bulk else {
            return;
        };
        let mut st = b.lock();
        if i >= st.done.len() {
            return;
        }
        st.done[i] = Some(done);
        st.tokens[i] = None;
        if counted {
            st.outstanding -= 1;
        }
        if st.outstanding == 0 && st.result.is_some() {
            let out = Self::outcome(&mut st);
            drop(st);
            self.cell.complete(out);
        }
    }

    fn outcome(st: &mut BulkSt) -> BulkOutcome {
        BulkOutcome {
            result: st.result.take().unwrap_or(Err(RpcError::Cancelled)),
            buffers: st.done.iter_mut().filter_map(Option::take).collect(),
        }
    }

    /// Sets the call's result. A bulk call completes once its buffers are
    /// all back; those still queued are cancelled (a completion that is
    /// already under way still arrives normally).
    pub(crate) fn finish(&self, result: Result<Vec<u8>>) {
        let Some((b, tm)) = &self.bulk else {
            self.cell.complete(BulkOutcome {
                result,
                buffers: Vec::new(),
            });
            return;
        };
        let mut st = b.lock();
        if st.result.is_some() {
            return;
        }
        st.result = Some(result);
        if st.outstanding == 0 {
            let out = Self::outcome(&mut st);
            drop(st);
            self.cell.complete(out);
            return;
        }
        let tokens: Vec<BufToken> = st.tokens.iter().flatten().copied().collect();
        drop(st);
        for t in tokens {
            let _ = tm.del(t);
        }
    }
}

/// Cancels one call from any thread, also after its handle was consumed
/// by [`CallHandle::wait`] or [`CallHandle::on_complete`]; made by
/// [`CallHandle::canceller`] and [`BulkCall::canceller`].
///
/// Cancelling completes the call at once with
/// [`RpcError::Cancelled`](crate::RpcError::Cancelled) if it is still in
/// flight; a bulk call's buffers still queued are cancelled and come back
/// in its outcome (one whose transfer is under way completes first). A
/// request still waiting in the session's formation queue is never sent;
/// the server is not told about one already sent: its handler may still
/// run, and its reply is dropped as unmatched.
#[derive(Clone)]
pub struct Canceller {
    pub(crate) s: Weak<SessionInner>,
    pub(crate) m: Weak<Inner>,
    pub(crate) xid: u64,
}

impl fmt::Debug for Canceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canceller").field("xid", &self.xid).finish()
    }
}

impl Canceller {
    /// Cancels the call. True if this completed it; false if it had
    /// already completed (replied, failed, timed out or cancelled) or its
    /// machine is gone.
    pub fn cancel(&self) -> bool {
        match (self.s.upgrade(), self.m.upgrade()) {
            (Some(s), Some(m)) => s.cancel(&m, self.xid),
            _ => false,
        }
    }
}

fn taken() -> RpcError {
    RpcError::ApiMisuse("the call's result was already taken".into())
}

/// An asynchronous call in flight.
///
/// Wait for it ([`CallHandle::wait`]), poll it ([`CallHandle::try_result`]),
/// give it a callback ([`CallHandle::on_complete`]), or `.await` it: it is
/// a [`Future`] that needs no particular runtime (see
/// [`block_on`](crate::block_on)). Cancel it with [`CallHandle::cancel`]
/// (or a [`Canceller`] from another thread). Dropping the handle does not
/// cancel the call; its result is discarded.
#[must_use = "a call's result is only available through its handle"]
pub struct CallHandle {
    pub(crate) call: Arc<CallState>,
    pub(crate) spin: Duration,
    pub(crate) xid: u64,
    pub(crate) cancel: Canceller,
}

impl fmt::Debug for CallHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallHandle")
            .field("xid", &self.xid)
            .field("done", &self.call.cell.is_done())
            .finish()
    }
}

impl CallHandle {
    /// The call's transaction id.
    pub fn xid(&self) -> u64 {
        self.xid
    }

    /// True once the result is available.
    pub fn is_done(&self) -> bool {
        self.call.cell.is_done()
    }

    /// Cancels the call (see [`Canceller`]): if it is still in flight it
    /// completes now with `Cancelled`, which the handle then returns.
    /// True if this cancelled it.
    pub fn cancel(&self) -> bool {
        self.cancel.cancel()
    }

    /// A [`Canceller`] for this call, to cancel it from another thread or
    /// after handing the handle to [`CallHandle::wait`] or
    /// [`CallHandle::on_complete`].
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// Blocks until the reply (spinning briefly, then parking).
    ///
    /// # Errors
    /// The call's failure; `ApiMisuse` on a thread that delivers events
    /// (in a handler registered with [`RpcHandle::on`], in a completion
    /// callback): the call goes on, its result is dropped. Wait in a
    /// handler registered with [`RpcHandle::on_blocking`], `.await` the
    /// handle in one registered with [`RpcHandle::on_async`], or use
    /// [`CallHandle::on_complete`].
    ///
    /// [`RpcHandle::on`]: crate::RpcHandle::on
    /// [`RpcHandle::on_blocking`]: crate::RpcHandle::on_blocking
    /// [`RpcHandle::on_async`]: crate::RpcHandle::on_async
    pub fn wait(self) -> Result<Vec<u8>> {
        check_may_block("CallHandle::wait")?;
        self.call
            .cell
            .wait(self.spin, None)
            .map_or_else(|| Err(taken()), |o| o.result)
    }

    /// Waits up to `timeout`; `None` if the result is not there by then
    /// (the call goes on). On a thread that delivers events it returns
    /// `ApiMisuse` at once (see [`CallHandle::wait`]) and the call goes
    /// on.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<Vec<u8>>> {
        if let Err(e) = check_may_block("CallHandle::wait_timeout") {
            return Some(Err(e));
        }
        if self.call.cell.is_taken() {
            return Some(Err(taken()));
        }
        self.call
            .cell
            .wait(self.spin.min(timeout), Some(Instant::now() + timeout))
            .map(|o| o.result)
    }

    /// The result if it is there, without blocking (once).
    pub fn try_result(&mut self) -> Option<Result<Vec<u8>>> {
        self.call.cell.try_take().map(|o| o.result)
    }

    /// Runs `f` with the result when it arrives (on the thread that
    /// completes the call: a transport thread, the machine's timer thread,
    /// or this thread when it is already there). `f` must not block.
    pub fn on_complete(self, f: impl FnOnce(Result<Vec<u8>>) + Send + 'static) {
        if !self.call.cell.on_complete(move |o| f(o.result)) {
            tracing::debug!(
                xid = self.xid,
                "on_complete on a call whose result was taken"
            );
        }
    }
}

impl Future for CallHandle {
    type Output = Result<Vec<u8>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.call
            .cell
            .poll(cx)
            .map(|o| o.map_or_else(|| Err(taken()), |o| o.result))
    }
}

/// An asynchronous call with bulk buffers in flight: as [`CallHandle`],
/// with a [`BulkOutcome`] that hands the buffers back.
#[must_use = "a call's buffers come back only through its handle"]
pub struct BulkCall {
    pub(crate) call: Arc<CallState>,
    pub(crate) spin: Duration,
    /// `None` when the call failed before its request was queued.
    pub(crate) cancel: Option<Canceller>,
}

impl fmt::Debug for BulkCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkCall")
            .field("done", &self.call.cell.is_done())
            .finish()
    }
}

fn taken_outcome() -> BulkOutcome {
    BulkOutcome {
        result: Err(taken()),
        buffers: Vec::new(),
    }
}

impl BulkCall {
    /// True once the outcome is available.
    pub fn is_done(&self) -> bool {
        self.call.cell.is_done()
    }

    /// Cancels the call (see [`Canceller`]): its reply is no longer
    /// awaited and its queued buffers are cancelled; the outcome, with
    /// every buffer, arrives once they are back. True if this cancelled
    /// it.
    pub fn cancel(&self) -> bool {
        self.cancel.as_ref().is_some_and(Canceller::cancel)
    }

    /// A [`Canceller`] for this call (see [`CallHandle::canceller`]);
    /// `None` when the call already failed before its request was queued.
    pub fn canceller(&self) -> Option<Canceller> {
        self.cancel.clone()
    }

    /// Blocks until the reply and every bulk buffer are back.
    ///
    /// # Errors
    /// On a thread that delivers events (see [`CallHandle::wait`]), the
    /// handle back in a [`BlockedWait`]: the call goes on.
    pub fn wait(self) -> std::result::Result<BulkOutcome, BlockedWait<Self>> {
        if check_may_block("BulkCall::wait").is_err() {
            return Err(BlockedWait::new(self, "BulkCall::wait"));
        }
        Ok(self.wait_here())
    }

    /// [`BulkCall::wait`] once the thread is known to be allowed to block.
    pub(crate) fn wait_here(self) -> BulkOutcome {
        self.call
            .cell
            .wait(self.spin, None)
            .unwrap_or_else(taken_outcome)
    }

    /// The outcome if it is there, without blocking (once).
    pub fn try_result(&mut self) -> Option<BulkOutcome> {
        self.call.cell.try_take()
    }

    /// Runs `f` with the outcome when it is complete (see
    /// [`CallHandle::on_complete`] for the thread).
    pub fn on_complete(self, f: impl FnOnce(BulkOutcome) + Send + 'static) {
        let _ = self.call.cell.on_complete(f);
    }
}

impl Future for BulkCall {
    type Output = BulkOutcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.call
            .cell
            .poll(cx)
            .map(|o| o.unwrap_or_else(taken_outcome))
    }
}

/// Runs a future to completion on this thread, parking between polls: the
/// smallest executor, enough to `.await` calls without an async runtime.
///
/// ```
/// let v = colibri_rpc::block_on(async { 40 + 2 })?;
/// assert_eq!(v, 42);
/// # Ok::<(), colibri_rpc::RpcError>(())
/// ```
///
/// # Errors
/// `ApiMisuse` on a thread that delivers events (see
/// [`CallHandle::wait`]); the future is dropped unpolled.
pub fn block_on<F: Future>(fut: F) -> Result<F::Output> {
    check_may_block("block_on")?;
    Ok(block_on_here(fut))
}

/// [`block_on`] without the thread check (the handler pool's own use).
pub(crate) fn block_on_here<F: Future>(fut: F) -> F::Output {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Wake, Waker};

    struct Unpark {
        thread: std::thread::Thread,
        woken: AtomicBool,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.woken.store(true, Ordering::Release);
            self.thread.unpark();
        }
    }
    let w = Arc::new(Unpark {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let waker = Waker::from(Arc::clone(&w));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        while !w.woken.swap(false, Ordering::AcqRel) {
            std::thread::park();
        }
    }
}
