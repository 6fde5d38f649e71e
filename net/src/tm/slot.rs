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
    pub(crate) callbacks: Arc<BufferCallbacks>,
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

impl Slot {
    pub(crate) fn flag(&self, f: u8) -> bool {
        self.flags.load(Ordering::Acquire) & f != 0
    }
    pub(super) fn set(&self, f: u8) {
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

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(self.rest.iter())
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
