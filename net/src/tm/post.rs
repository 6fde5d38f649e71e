//! Reports about buffers: completions, messages and released
//! reservations (from the transport or from the core itself), claims of
//! receive and passive buffers, and the core's own cancellations.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tracing::{debug, trace, warn};

use crate::desc::DescFields;
use crate::error::{NetError, Result};
use crate::queue::QueueType;
use crate::sink::Job;
use crate::xprt::{
    ClaimError, DelReason, Delivery, PassiveClaim, PassiveError, QueuedBuf, RecvClaim,
};

use super::slot::{
    Claim, EvData, F_CANCEL, F_IN_USE, F_LISTED, F_TIMED_OUT, Out, Post, Ready, RecvState, Slot,
};
use super::{BufToken, TmCore, TmInner, TmState};

impl TmInner {
    /// Completes every queued buffer with `Cancelled` (a failed start).
    /// Returns the callbacks to run once the lock is released.
    pub(super) fn cancel_all(self: &Arc<Self>, core: &mut TmCore) -> Vec<Delivery> {
        let left: Vec<Arc<Slot>> = core.slots.iter().cloned().collect();
        if !left.is_empty() {
            debug!(tm = %self.id, n = left.len(), "completing queued buffers with Cancelled");
        }
        left.into_iter()
            .map(|s| {
                s.set(F_CANCEL);
                self.post_locked(
                    core,
                    &QueuedBuf(s),
                    Post::Complete(Err(NetError::Cancelled)),
                )
            })
            .collect()
    }

    /// Ends a queued buffer's operation (cancel, timeout, stop): a buffer
    /// the transport does not use is completed here, its callback run by
    /// one of the transport's threads; one in use is the transport's to
    /// end.
    pub(super) fn cancel_slot(
        self: &Arc<Self>,
        core: &mut TmCore,
        slot: &Arc<Slot>,
        reason: DelReason,
    ) {
        let q = QueuedBuf(Arc::clone(slot));
        if slot.flag(F_IN_USE) || self.dom.caps.network_owned {
            self.xprt.buf_del(&q, reason);
            return;
        }
        let d = self.post_locked(core, &q, Post::Complete(Err(NetError::Cancelled)));
        if d.is_pending() {
            self.xprt.deliver(d);
        }
    }

    pub(super) fn live<'a>(core: &'a TmCore, q: &QueuedBuf) -> Option<&'a Arc<Slot>> {
        core.slots.get(q.0.token).filter(|s| Arc::ptr_eq(s, &q.0))
    }

    pub(crate) fn begin_use(&self, q: &QueuedBuf) -> bool {
        let core = self.core.lock();
        match Self::live(&core, q) {
            Some(s) if !s.flag(F_CANCEL) => {
                s.set(F_IN_USE);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn resubmit(self: &Arc<Self>, q: &QueuedBuf) -> bool {
        let core = self.core.lock();
        let idle = Self::live(&core, q).is_some_and(|s| !s.flag(F_CANCEL) && !s.flag(F_IN_USE));
        if !idle || core.state != TmState::Started {
            return false;
        }
        match self.xprt.buf_add(q) {
            Ok(()) => true,
            Err(e) => {
                drop(core);
                self.post_buffer(q, Post::Complete(Err(e))).run();
                true
            }
        }
    }

    pub(crate) fn release_claim(self: &Arc<Self>, q: &QueuedBuf) {
        let mut core = self.core.lock();
        let Some(s) = Self::live(&core, q).cloned() else {
            return;
        };
        s.clear(F_IN_USE);
        if core.state == TmState::Stopping && !s.flag(F_CANCEL) {
            // The stop spared it because it was in use; it is not any
            // more, so it goes now.
            s.set(F_CANCEL);
        }
        if s.flag(F_CANCEL) {
            // A deletion arrived while the buffer was in use: now that it
            // is not, the core completes it.
            self.cancel_slot(&mut core, &s, DelReason::Cancel);
        }
    }

    pub(crate) fn lookup(&self, token: BufToken) -> Option<QueuedBuf> {
        if token.tm != self.id.0 {
            return None;
        }
        let core = self.core.lock();
        core.slots.get(token.key).cloned().map(QueuedBuf)
    }

    pub(super) fn remove_slot(&self, core: &mut TmCore, slot: &Slot) {
        core.slots.remove(slot.token);
        // The reference a send holds on its end point ends with the send.
        drop(slot.ep.lock().take());
        core.qlen[slot.queue.index()] -= 1;
        if slot.flag(F_LISTED) {
            Self::unlist(core, slot);
        }
        if let Some(d) = slot.deadline {
            core.timers.remove(&(d, slot.token));
            self.update_earliest(core);
        }
    }

    /// A report about a buffer from its transport: the callbacks to run.
    pub(crate) fn post_buffer(self: &Arc<Self>, q: &QueuedBuf, post: Post<'_>) -> Delivery {
        let mut core = self.core.lock();
        let d = self.post_locked(&mut core, q, post);
        drop(core);
        // For wait_event_after (cheap when nobody waits).
        self.cond.notify_all();
        d
    }

    /// Applies a report about a buffer (a completion, a message, a
    /// released reservation), from the transport or from the core itself.
    /// Returns the callbacks to run once the lock is released: the buffer's
    /// pending events, or in synchronous mode the notify hook.
    pub(super) fn post_locked(
        self: &Arc<Self>,
        core: &mut TmCore,
        q: &QueuedBuf,
        post: Post<'_>,
    ) -> Delivery {
        let slot = &q.0;
        if Self::live(core, q).is_none() {
            trace!(tm = %self.id, token = slot.token, "event for a buffer no longer queued ignored");
            return Delivery::default();
        }
        let now = crate::clock::stamp_now();
        let mut out = Out::default();
        let (fin, redel);
        match post {
            Post::Complete(res) => {
                let status = match res {
                    Ok(n) => Ok(n),
                    Err(NetError::Cancelled) if slot.flag(F_TIMED_OUT) => Err(NetError::TimedOut),
                    Err(e) => Err(e),
                };
                let length = *status.as_ref().unwrap_or(&0);
                (fin, redel) = (true, false);
                out.push(EvData {
                    status: status.map(|_| ()),
                    offset: 0,
                    length,
                    sender: None,
                    time: now,
                    fin: true,
                    msgs: slot.rs.lock().delivered,
                });
            }
            Post::Msg { .. } | Post::Hole { .. } if slot.queue != QueueType::MsgRecv => {
                warn!(tm = %self.id, queue = %slot.queue, "message posted on a non-receive buffer: ignored");
                return Delivery::default();
            }
            Post::Msg { seq, len, sender } => {
                let Some((_, c)) = slot.rs.lock().inflight.take(|(k, _)| *k == seq) else {
                    warn!(tm = %self.id, seq, "message for an unknown reservation ignored");
                    return Delivery::default();
                };
                let (status, len, sender) = match self.sender_ep(core, sender) {
                    Ok(ep) => (Ok(()), len.min(c.len), Some(ep)),
                    Err(e) => {
                        warn!(tm = %self.id, sender, %e, "message from an unparseable sender address");
                        (
                            Err(NetError::Protocol(format!(
                                "sender address {sender:?}: {e}"
                            ))),
                            0,
                            None,
                        )
                    }
                };
                let mut rs = slot.rs.lock();
                let done = Some(Ready {
                    status,
                    offset: c.offset,
                    len,
                    sender,
                    fin: c.fin,
                });
                (fin, redel) = self.drain_recv(core, slot, &mut rs, (seq, done), now, &mut out);
            }
            Post::Hole { seq } => {
                let mut rs = slot.rs.lock();
                let Some((_, c)) = rs.inflight.take(|(k, _)| *k == seq) else {
                    warn!(tm = %self.id, seq, "release of an unknown reservation ignored");
                    return Delivery::default();
                };
                rs.claimed -= 1;
                if c.fin {
                    // The last reservation: give its space back and reopen.
                    rs.closed = false;
                    if rs.reserved == c.offset + c.len {
                        rs.reserved = c.offset;
                    }
                    if !slot.flag(F_LISTED) {
                        core.recv_list.push_front(slot.token);
                        slot.set(F_LISTED);
                    }
                }
                (fin, redel) = self.drain_recv(core, slot, &mut rs, (seq, None), now, &mut out);
            }
        }
        if fin {
            self.remove_slot(core, slot);
        }
        for ev in out.iter() {
            core.stats[slot.queue.index()].record_event(
                ev.status.is_ok(),
                ev.length,
                ev.fin.then(|| now.saturating_duration_since(slot.add_time)),
            );
            trace!(tm = %self.id, token = slot.token, queue = %slot.queue, ok = ev.status.is_ok(), fin = ev.fin, "buffer event");
        }
        core.event_seq += out.len() as u64;
        let d = if out.is_empty() {
            Delivery::default()
        } else if core.sync {
            self.queue_pending(core, out.into_iter().map(|ev| (Arc::clone(slot), ev)))
        } else {
            self.running.fetch_add(out.len(), Ordering::AcqRel);
            // Queued under the transfer machine's lock, so events of one
            // buffer are delivered in the order they were posted.
            let mut se = slot.events.lock();
            out.append_to(&mut se.backlog);
            if std::mem::replace(&mut se.busy, true) {
                Delivery::default()
            } else {
                Delivery {
                    job: Some(Job::Buf(Arc::clone(self), Arc::clone(slot))),
                }
            }
        };
        if redel {
            // Spared by a deletion or a stop while messages were being
            // written into it; now idle, it goes (after the events above).
            if !slot.flag(F_CANCEL) {
                slot.set(F_CANCEL);
                core.stats[slot.queue.index()].dels += 1;
            }
            self.cancel_slot(core, slot, DelReason::Cancel);
        }
        if core.state == TmState::Stopping && core.slots.len() == 0 {
            self.finish_stop(core);
        }
        d
    }

    /// Records the reservation `done` just finished (`None` for a released
    /// one) and moves finished reservations of a receive buffer, in order,
    /// into `out`. Returns (the buffer completed, the buffer is idle and
    /// must be deleted).
    pub(super) fn drain_recv(
        &self,
        core: &TmCore,
        slot: &Slot,
        rs: &mut RecvState,
        done: (u64, Option<Ready>),
        now: Instant,
        out: &mut Out,
    ) -> (bool, bool) {
        let leaving = slot.flag(F_CANCEL) || core.state == TmState::Stopping;
        // A network that places messages itself says which one is final.
        let leaving_fin = leaving && !self.dom.caps.network_owned;
        let mut done = Some(done);
        loop {
            let next = rs.next_drain;
            let entry = match done.take() {
                // The usual case: it finished in order, and goes straight
                // out without waiting among the finished ones.
                Some((k, e)) if k == next => e,
                Some(early) => {
                    rs.ready.push(early);
                    continue;
                }
                None => match rs.ready.take(|(k, _)| *k == next) {
                    Some((_, e)) => e,
                    None => break,
                },
            };
            rs.next_drain += 1;
            let Some(r) = entry else {
                continue;
            };
            rs.delivered += 1;
            let last = rs.inflight.is_empty() && rs.ready.is_empty();
            let fin = r.fin || (last && leaving_fin);
            out.push(EvData {
                status: r.status,
                offset: r.offset,
                length: r.len,
                sender: r.sender,
                time: now,
                fin,
                msgs: rs.delivered,
            });
            if fin {
                return (true, false);
            }
        }
        if rs.inflight.is_empty() {
            slot.clear(F_IN_USE);
            return (false, leaving);
        }
        (false, false)
    }

    /// Claims space for a message, or `None` with no other effect (no
    /// loss counted, no buffer failed as too small).
    pub(crate) fn try_claim_recv(self: &Arc<Self>, len: usize) -> Option<RecvClaim> {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return None;
        }
        Self::claim_in(&mut core, len).ok()
    }

    /// Takes a receive buffer out of the list of those that may take
    /// another message.
    fn unlist(core: &mut TmCore, slot: &Slot) {
        if let Some(pos) = core.recv_list.iter().position(|&k| k == slot.token) {
            core.recv_list.remove(pos);
        }
        slot.clear(F_LISTED);
    }

    /// The claim of `len` bytes in the first receive buffer with room, or
    /// the first empty buffer too small for it (the victim), if any.
    ///
    /// A buffer leaves the list when it closes (its last message claimed),
    /// so a claim looks at the buffers that can still take one, not at
    /// every buffer whose messages are on their way to the application.
    fn claim_in(core: &mut TmCore, len: usize) -> Result<RecvClaim, Option<Arc<Slot>>> {
        let mut victim: Option<Arc<Slot>> = None;
        let mut i = 0;
        while let Some(&key) = core.recv_list.get(i) {
            let Some(slot) = core.slots.get(key) else {
                core.recv_list.remove(i);
                continue;
            };
            if slot.flag(F_CANCEL) {
                i += 1;
                continue;
            }
            let mut rs = slot.rs.lock();
            if rs.closed {
                // Closed by a placement or as a victim.
                drop(rs);
                slot.clear(F_LISTED);
                core.recv_list.remove(i);
                continue;
            }
            if slot.size - rs.reserved >= len {
                let seq = rs.next_seq;
                rs.next_seq += 1;
                let offset = rs.reserved;
                rs.reserved += len;
                rs.claimed += 1;
                let fin = rs.claimed >= slot.recv.max_receive_msgs
                    || slot.size - rs.reserved < slot.recv.min_receive_size;
                rs.closed = fin;
                rs.inflight.push((seq, Claim { offset, len, fin }));
                slot.set(F_IN_USE);
                drop(rs);
                let claim = RecvClaim {
                    buf: QueuedBuf(Arc::clone(slot)),
                    offset,
                    len,
                    seq,
                };
                if fin {
                    slot.clear(F_LISTED);
                    if i == 0 {
                        // The usual case: the first buffer took it.
                        core.recv_list.pop_front();
                    } else {
                        core.recv_list.remove(i);
                    }
                }
                return Ok(claim);
            }
            if rs.reserved == 0 && rs.inflight.is_empty() && victim.is_none() {
                victim = Some(Arc::clone(slot));
            }
            i += 1;
        }
        Err(victim)
    }

    /// Records a message the network already placed at `offset` of
    /// `q` (`fin`: the network will place no more in it).
    pub(crate) fn claim_recv_placed(
        &self,
        q: &QueuedBuf,
        offset: usize,
        len: usize,
        fin: bool,
    ) -> Option<RecvClaim> {
        let core = self.core.lock();
        let slot = Self::live(&core, q)?;
        if slot.queue != QueueType::MsgRecv || offset.checked_add(len)? > slot.size {
            return None;
        }
        let mut rs = slot.rs.lock();
        let seq = rs.next_seq;
        rs.next_seq += 1;
        rs.reserved = rs.reserved.max(offset + len);
        rs.claimed += 1;
        rs.closed |= fin;
        rs.inflight.push((seq, Claim { offset, len, fin }));
        slot.set(F_IN_USE);
        Some(RecvClaim {
            buf: QueuedBuf(Arc::clone(slot)),
            offset,
            len,
            seq,
        })
    }

    /// Counts a message lost for lack of a receive buffer, as
    /// `claim_recv` does, and returns the coalesced loss event.
    pub(crate) fn count_no_buffers(self: &Arc<Self>, len: usize) -> Delivery {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return Delivery::default();
        }
        core.stats[QueueType::MsgRecv.index()].f_events += 1;
        core.no_buffers += 1;
        debug!(tm = %self.id, len, "message dropped: no receive buffer");
        self.loss_event(core, NetError::NoBuffers)
    }

    pub(crate) fn claim_recv(self: &Arc<Self>, len: usize) -> Result<RecvClaim, ClaimError> {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return Err(ClaimError::NotStarted);
        }
        let victim = match Self::claim_in(&mut core, len) {
            Ok(claim) => return Ok(claim),
            Err(victim) => victim,
        };
        if let Some(v) = victim {
            v.rs.lock().closed = true;
            v.set(F_IN_USE);
            return Err(ClaimError::TooLarge {
                space: v.size,
                victim: QueuedBuf(v),
            });
        }
        core.stats[QueueType::MsgRecv.index()].f_events += 1;
        core.no_buffers += 1;
        debug!(tm = %self.id, len, "message dropped: no receive buffer");
        let notice = self.loss_event(core, NetError::NoBuffers);
        Err(ClaimError::NoBuffers { notice })
    }

    pub(crate) fn claim_passive(
        self: &Arc<Self>,
        f: &DescFields,
        requester: &str,
        active: QueueType,
        active_size: usize,
    ) -> Result<PassiveClaim, PassiveError> {
        let mut core = self.core.lock();
        if core.state != TmState::Started {
            return Err(PassiveError {
                error: NetError::Unreachable(f.owner.clone()),
                notice: Delivery::default(),
            });
        }
        let found = core
            .slots
            .get(f.token)
            .filter(|s| s.queue.is_passive() && s.cookie == f.cookie)
            .cloned();
        let reject = match &found {
            None => Some(NetError::NoEntry),
            Some(s) if s.flag(F_CANCEL) => Some(NetError::NoEntry),
            Some(s) if s.flag(F_IN_USE) => Some(NetError::Busy(
                "passive buffer is already in use by another transfer".into(),
            )),
            Some(s) => {
                let len = if s.queue == QueueType::PassiveBulkSend {
                    s.length
                } else {
                    s.size
                };
                if f.queue != s.queue
                    || f.len != len as u64
                    || core.own_addr.as_deref() != Some(f.owner.as_str())
                    || f.actor != s.actor
                {
                    Some(NetError::InvalidDescriptor(
                        "descriptor fields do not match the buffer it names".into(),
                    ))
                } else if s.queue.bulk_peer() != Some(active) {
                    Some(NetError::WrongQueue {
                        passive: s.queue,
                        active,
                    })
                } else if let Some(actor) = s.actor.as_deref().filter(|a| *a != requester) {
                    Some(NetError::AccessDenied {
                        requester: requester.to_string(),
                        allowed: actor.to_string(),
                    })
                } else if s.queue == QueueType::PassiveBulkSend && active_size < s.length {
                    Some(NetError::TooBig(format!(
                        "active receive buffer of {active_size} bytes for {} bytes offered",
                        s.length
                    )))
                } else if s.queue == QueueType::PassiveBulkRecv && active_size > s.size {
                    Some(NetError::TooBig(format!(
                        "active send of {active_size} bytes into a passive buffer of {} bytes",
                        s.size
                    )))
                } else {
                    None
                }
            }
        };
        let slot = match (reject, found) {
            (None, Some(slot)) => slot,
            (reject, _) => {
                // Refused without touching the passive buffer: it stays
                // queued for the transfer it was made for.
                let error = reject.unwrap_or(NetError::NoEntry);
                core.rejected += 1;
                debug!(tm = %self.id, requester, %error, "active bulk request refused");
                let notice = self.loss_event(core, error.clone());
                return Err(PassiveError { error, notice });
            }
        };
        slot.set(F_IN_USE);
        let len = if slot.queue == QueueType::PassiveBulkSend {
            slot.length
        } else {
            active_size
        };
        Ok(PassiveClaim {
            buf: QueuedBuf(slot),
            len,
        })
    }
}
