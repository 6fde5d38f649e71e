//! Queued buffers: the slot of each add (parameters, memory, flags,
//! receive reservations, per-buffer event backlog).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::sync::{AtomicU8, LeafMutex, Mutex};

use crate::buffer::{BufferCallbacks, NetBuffer};
use crate::desc::DescFields;
use crate::ep::EndPoint;
use crate::error::Result;
use crate::queue::QueueType;
use crate::xprt::XprtData;

use super::RecvParams;

pub(crate) const F_IN_USE: u8 = 1;

pub(crate) const F_CANCEL: u8 = 2;

pub(crate) const F_TIMED_OUT: u8 = 4;

/// A receive buffer in its machine's list of buffers that may take
/// another message (changed only under the machine's lock).
pub(crate) const F_LISTED: u8 = 8;

/// A queued buffer: the parameters of its operation and its memory.
pub(crate) struct Slot {
    pub(crate) token: u64,
    pub(crate) tm_id: u64,
    pub(crate) queue: QueueType,
    pub(crate) length: usize,
    pub(crate) size: usize,
    /// Destination of a send; released when the buffer completes, even if
    /// the transport keeps its `QueuedBuf`.
    pub(crate) ep: LeafMutex<Option<EndPoint>>,
    pub(crate) actor: Option<String>,
    pub(crate) desc: Option<Box<DescFields>>,
    pub(crate) cookie: u64,
    pub(crate) recv: RecvParams,
    pub(crate) deadline: Option<Instant>,
    pub(crate) add_time: Instant,
    pub(crate) reg: Option<XprtData>,
    /// The buffer's callbacks (`None` only in a spare slot).
    pub(crate) callbacks: Option<Arc<BufferCallbacks>>,
    pub(crate) buf: LeafMutex<Option<NetBuffer>>,
    pub(super) flags: AtomicU8,
    pub(super) rs: Mutex<RecvState>,
    pub(super) events: Mutex<SlotEvents>,
}

/// Reservations of a message receive buffer. Several messages may be
/// written into one buffer at once, each into its own reserved region;
/// their events are delivered in reservation order, the final one last.
#[derive(Default)]
pub(super) struct RecvState {
    /// End of the reserved space.
    pub(super) reserved: usize,
    /// Messages reserved (released reservations excluded).
    pub(super) claimed: u32,
    /// Messages delivered.
    pub(super) delivered: u32,
    pub(super) next_seq: u64,
    pub(super) next_drain: u64,
    pub(super) inflight: Few<(u64, Claim)>,
    /// Finished reservations waiting for earlier ones; `None` for a
    /// released one.
    pub(super) ready: Few<(u64, Option<Ready>)>,
    /// The final reservation was made (or the buffer is being failed):
    /// no more claims.
    pub(super) closed: bool,
}

pub(super) struct Claim {
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) fin: bool,
}

pub(super) struct Ready {
    pub(super) status: Result<()>,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) sender: Option<EndPoint>,
    pub(super) fin: bool,
}

/// Spare slots a transfer machine keeps for its next adds.
pub(super) const SPARE_SLOTS: usize = 8;

/// What an add puts in its slot.
pub(super) struct SlotInit {
    pub(super) token: u64,
    pub(super) tm_id: u64,
    pub(super) queue: QueueType,
    pub(super) length: usize,
    pub(super) size: usize,
    pub(super) ep: Option<EndPoint>,
    pub(super) actor: Option<String>,
    pub(super) desc: Option<Box<DescFields>>,
    pub(super) cookie: u64,
    pub(super) recv: RecvParams,
    pub(super) deadline: Option<Instant>,
    pub(super) add_time: Instant,
    pub(super) reg: Option<XprtData>,
    pub(super) callbacks: Arc<BufferCallbacks>,
    pub(super) buf: NetBuffer,
}

impl Slot {
    /// The slot of an add: `spare` (a slot nobody else references, see
    /// [`Slot::make_spare`]) filled in place, or a new one.
    pub(super) fn make(spare: Option<Arc<Slot>>, init: SlotInit) -> Arc<Slot> {
        if let Some(mut arc) = spare
            && let Some(s) = Arc::get_mut(&mut arc)
        {
            s.token = init.token;
            s.tm_id = init.tm_id;
            s.queue = init.queue;
            s.length = init.length;
            s.size = init.size;
            *s.ep.get_mut() = init.ep;
            s.actor = init.actor;
            s.desc = init.desc;
            s.cookie = init.cookie;
            s.recv = init.recv;
            s.deadline = init.deadline;
            s.add_time = init.add_time;
            s.reg = init.reg;
            s.callbacks = Some(init.callbacks);
            *s.buf.get_mut() = Some(init.buf);
            // Cleared when it became spare: flags 0, no reservation, no
            // event.
            return arc;
        }
        Arc::new(Slot {
            token: init.token,
            tm_id: init.tm_id,
            queue: init.queue,
            length: init.length,
            size: init.size,
            ep: LeafMutex::new(init.ep),
            actor: init.actor,
            desc: init.desc,
            cookie: init.cookie,
            recv: init.recv,
            deadline: init.deadline,
            add_time: init.add_time,
            reg: init.reg,
            callbacks: Some(init.callbacks),
            buf: LeafMutex::new(Some(init.buf)),
            flags: AtomicU8::new(0),
            rs: Mutex::new(RecvState::default()),
            events: Mutex::new(SlotEvents::default()),
        })
    }

    /// Makes a finished slot spare: releases everything it refers to (the
    /// application's callbacks, a buffer never handed back, descriptor,
    /// transport data) and resets its state, keeping the allocations of
    /// its queues. Only on a slot nobody else references (`&mut`).
    pub(super) fn make_spare(&mut self) {
        *self.ep.get_mut() = None;
        self.actor = None;
        self.desc = None;
        self.reg = None;
        self.callbacks = None;
        *self.buf.get_mut() = None;
        self.flags.store(0, Ordering::Relaxed);
        let rs = self.rs.get_mut();
        rs.reserved = 0;
        rs.claimed = 0;
        rs.delivered = 0;
        rs.next_seq = 0;
        rs.next_drain = 0;
        rs.inflight.clear();
        rs.ready.clear();
        rs.closed = false;
        let ev = self.events.get_mut();
        ev.busy = false;
        ev.backlog.clear();
    }

    pub(crate) fn flag(&self, f: u8) -> bool {
        self.flags.load(Ordering::Acquire) & f != 0
    }
    pub(crate) fn set(&self, f: u8) {
        self.flags.fetch_or(f, Ordering::AcqRel);
    }
    pub(super) fn clear(&self, f: u8) {
        self.flags.fetch_and(!f, Ordering::AcqRel);
    }
}

#[derive(Default)]
pub(super) struct SlotEvents {
    pub(super) busy: bool,
    /// Events not yet delivered (the first inline: a buffer's events are
    /// almost always one at a time, and a new slot allocates nothing).
    pub(super) backlog: Few<EvData>,
}

pub(super) struct EvData {
    pub(super) status: Result<()>,
    pub(super) offset: usize,
    pub(super) length: usize,
    pub(super) sender: Option<EndPoint>,
    pub(super) time: Instant,
    pub(super) fin: bool,
    pub(super) msgs: u32,
}

/// A small ordered collection holding its first element inline: the
/// events one post produces (almost always one), the reservations of a
/// receive buffer in flight (usually one), a buffer's undelivered events.
/// Only a second element allocates.
pub(super) struct Few<T> {
    pub(super) first: Option<T>,
    pub(super) rest: VecDeque<T>,
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Self {
            first: None,
            rest: VecDeque::new(),
        }
    }
}

impl<T> Few<T> {
    pub(super) fn push(&mut self, v: T) {
        if self.first.is_none() {
            self.first = Some(v);
        } else {
            self.rest.push_back(v);
        }
    }

    /// Removes and returns the first element.
    pub(super) fn pop_front(&mut self) -> Option<T> {
        let v = self.first.take();
        self.first = self.rest.pop_front();
        v
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Moves every element, in order, to the back of `dst` (the usual
    /// single element in one move, without an iterator).
    pub(super) fn append_to(mut self, dst: &mut Few<T>) {
        if let Some(v) = self.first.take() {
            dst.push(v);
        }
        if self.rest.capacity() == 0 {
            // The usual case: nothing left in `self` and nothing ever
            // allocated (a deque without capacity owns no memory), so its
            // drop would do nothing but cost the deque's drop glue.
            std::mem::forget(self);
            return;
        }
        dst.rest.append(&mut self.rest);
    }

    /// The elements after the first (an empty iterator without touching
    /// the deque when there are none).
    pub(super) fn rest_iter(&self) -> impl Iterator<Item = &T> {
        (!self.rest.is_empty())
            .then(|| self.rest.iter())
            .into_iter()
            .flatten()
    }

    /// Removes every element, keeping the allocation.
    pub(super) fn clear(&mut self) {
        self.first = None;
        if !self.rest.is_empty() {
            self.rest.clear();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(self.rest_iter())
    }

    /// Removes and returns the first element matching `pred`, keeping the
    /// order of the others.
    pub(super) fn take(&mut self, pred: impl Fn(&T) -> bool) -> Option<T> {
        if self.first.as_ref().is_some_and(&pred) {
            return self.pop_front();
        }
        let i = self.rest.iter().position(pred)?;
        self.rest.remove(i)
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<T>, std::collections::vec_deque::IntoIter<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

pub(super) type Out = Few<EvData>;

pub(crate) enum Post<'a> {
    Complete(Result<usize>),
    Msg {
        seq: u64,
        len: usize,
        sender: &'a str,
    },
    Hole {
        seq: u64,
    },
}
