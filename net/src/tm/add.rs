//! The add path: checking an operation, making its slot and descriptor,
//! and handing it to the transport.

use std::sync::Arc;

use tracing::{debug, trace};

use crate::buffer::NetBuffer;
use crate::desc::{DescFields, NetBufDesc};
use crate::ep::EndPoint;
use crate::error::{AddError, NetError, Result};
use crate::queue::QueueType;
use crate::util::random_u64;
use crate::xprt::QueuedBuf;

use super::slot::{F_LISTED, Slot, SlotInit};
use super::{BufToken, RecvParams, TmCore, TmHandle, TmState};

/// A buffer operation: the queue to add to, with what that queue needs.
#[derive(Debug, Clone, Copy)]
pub enum AddOp<'a> {
    /// Receive unsolicited messages.
    MsgRecv(RecvParams),
    /// Send the first `len` bytes of the buffer to `ep`.
    MsgSend {
        /// Destination (an end point of this transfer machine).
        ep: &'a EndPoint,
        /// Bytes to send.
        len: usize,
    },
    /// Let a remote transfer machine write into the buffer. Returns a
    /// descriptor. With `actor`, only that end point may use it.
    PassiveRecv {
        /// The only end point allowed to use the descriptor, if any.
        actor: Option<&'a EndPoint>,
    },
    /// Let a remote transfer machine read the first `len` bytes. Returns a
    /// descriptor. With `actor`, only that end point may use it.
    PassiveSend {
        /// Bytes offered.
        len: usize,
        /// The only end point allowed to use the descriptor, if any.
        actor: Option<&'a EndPoint>,
    },
    /// Read the remote passive send buffer named by `desc` into this one.
    ActiveRecv {
        /// Descriptor from the passive side.
        desc: &'a NetBufDesc,
    },
    /// Write the first `len` bytes into the remote passive receive buffer
    /// named by `desc`.
    ActiveSend {
        /// Descriptor from the passive side.
        desc: &'a NetBufDesc,
        /// Bytes to write.
        len: usize,
    },
}

impl AddOp<'_> {
    /// The queue this operation adds to.
    pub fn queue(&self) -> QueueType {
        match self {
            Self::MsgRecv(_) => QueueType::MsgRecv,
            Self::MsgSend { .. } => QueueType::MsgSend,
            Self::PassiveRecv { .. } => QueueType::PassiveBulkRecv,
            Self::PassiveSend { .. } => QueueType::PassiveBulkSend,
            Self::ActiveRecv { .. } => QueueType::ActiveBulkRecv,
            Self::ActiveSend { .. } => QueueType::ActiveBulkSend,
        }
    }
}

/// A successful add.
#[derive(Debug, Clone)]
pub struct Added {
    /// Token of the add.
    pub token: BufToken,
    /// The descriptor, for the passive queues.
    pub desc: Option<NetBufDesc>,
}

fn check_len(len: usize, size: usize) -> Result<()> {
    if len == 0 {
        return Err(NetError::InvalidArgument("zero length".into()));
    }
    if len > size {
        return Err(NetError::InvalidArgument(format!(
            "length {len} beyond a buffer of {size} bytes"
        )));
    }
    Ok(())
}

impl TmHandle {
    pub(super) fn decode_desc(&self, desc: &NetBufDesc) -> Result<DescFields> {
        let f = desc.decode()?;
        let mine = self.inner.dom.caps.transport_id;
        if f.transport_id != mine {
            return Err(NetError::InvalidDescriptor(format!(
                "made by transport {:#x}, this is {:#x}",
                f.transport_id, mine
            )));
        }
        Ok(f)
    }

    pub(super) fn check_ep(&self, ep: &EndPoint) -> Result<()> {
        if ep.tm_id() != self.inner.id {
            return Err(NetError::ForeignEndPoint(ep.addr().to_string()));
        }
        Ok(())
    }

    /// Adds a buffer to a queue, starting the operation `op` describes.
    ///
    /// The buffer moves into the transfer machine; its final completion
    /// event hands it back. Refusals hand it back at once, with the reason:
    /// buffer of another domain, no callback for the queue, wrong state
    /// (message receive buffers may be added from INITIALIZED until
    /// STOPPING, the others only when STARTED), a zero or too large length,
    /// an end point of another transfer machine, receive parameters that
    /// cannot work, an undecodable descriptor or one made by another
    /// transport, a timeout already past, or an optional feature the
    /// transport lacks.
    ///
    /// # Errors
    /// [`AddError`] with the reason and the buffer.
    pub fn add(&self, buf: NetBuffer, op: AddOp<'_>) -> Result<Added, AddError> {
        match self.add_checked(buf, op) {
            Ok(added) => Ok(added),
            Err((error, buffer)) => {
                debug!(tm = %self.inner.id, queue = %op.queue(), %error, "add refused");
                Err(AddError { error, buffer })
            }
        }
    }

    pub(super) fn add_checked(
        &self,
        buf: NetBuffer,
        op: AddOp<'_>,
    ) -> std::result::Result<Added, (NetError, NetBuffer)> {
        macro_rules! check {
            ($e:expr) => {
                if let Err(e) = $e {
                    return Err((e, buf));
                }
            };
        }
        check!(self.inner.check_api());
        if !Arc::ptr_eq(buf.dom(), &self.inner.dom) {
            return Err((NetError::WrongDomain, buf));
        }
        let queue = op.queue();
        let Some(callbacks) = buf.callbacks().filter(|c| c.has(queue)).cloned() else {
            return Err((NetError::NoCallback(queue), buf));
        };
        let size = buf.len();
        let caps = self.inner.dom.caps;
        let mut length = 0;
        let mut ep = None;
        let mut actor: Option<String> = None;
        let mut desc = None;
        let mut recv = RecvParams::default();
        match op {
            AddOp::MsgRecv(p) => {
                if p.max_receive_msgs == 0 || p.min_receive_size == 0 || p.min_receive_size > size {
                    return Err((
                        NetError::InvalidArgument(format!(
                            "receive parameters {p:?} for a buffer of {size} bytes"
                        )),
                        buf,
                    ));
                }
                if p.max_receive_msgs > 1 && !caps.multi_message {
                    return Err((
                        NetError::Unsupported {
                            transport: self.inner.dom.xprt.name(),
                            what: "several messages per receive buffer",
                        },
                        buf,
                    ));
                }
                recv = p;
            }
            AddOp::MsgSend { ep: e, len } => {
                check!(check_len(len, size));
                check!(self.check_ep(e));
                ep = Some(e.clone());
                length = len;
            }
            AddOp::PassiveRecv { actor: a } | AddOp::PassiveSend { actor: a, .. } => {
                if let AddOp::PassiveSend { len, .. } = op {
                    check!(check_len(len, size));
                    length = len;
                }
                if let Some(a) = a {
                    check!(self.check_ep(a));
                    actor = Some(a.addr().to_string());
                }
            }
            AddOp::ActiveRecv { desc: d } | AddOp::ActiveSend { desc: d, .. } => {
                if let AddOp::ActiveSend { len, .. } = op {
                    check!(check_len(len, size));
                    length = len;
                }
                match self.decode_desc(d) {
                    Ok(f) => desc = Some(Box::new(f)),
                    Err(e) => return Err((e, buf)),
                }
            }
        }
        let deadline = buf.timeout();
        let now = crate::clock::stamp_now();
        if let Some(d) = deadline {
            let now = self.inner.dom.clock.now();
            if !caps.timeouts {
                return Err((
                    NetError::Unsupported {
                        transport: self.inner.dom.xprt.name(),
                        what: "buffer timeouts",
                    },
                    buf,
                ));
            }
            if d <= now {
                return Err((NetError::TimeoutInPast, buf));
            }
        }
        let mut core = self.inner.core.lock();
        let allowed = match queue {
            QueueType::MsgRecv => matches!(
                core.state,
                TmState::Initialized | TmState::Starting | TmState::Started
            ),
            _ => core.state == TmState::Started,
        };
        if !allowed {
            let state = core.state;
            drop(core);
            return Err((NetError::WrongState { op: "add", state }, buf));
        }
        let cookie = if queue.is_passive() { random_u64() } else { 0 };
        let reg = buf.reg();
        let tm_id = self.inner.id.0;
        let key = core.slots.next_key();
        let spare = self.inner.spare.lock().pop();
        let slot = Slot::make(
            spare,
            SlotInit {
                token: key,
                tm_id,
                queue,
                length,
                size,
                ep,
                actor: actor.clone(),
                desc,
                cookie,
                recv,
                deadline,
                add_time: now,
                reg,
                callbacks,
                buf,
            },
        );
        let inserted = core.slots.insert_with(|_| Arc::clone(&slot));
        debug_assert_eq!(inserted, key);
        let q = QueuedBuf(Arc::clone(&slot));
        let undo = |core: &mut TmCore, e: NetError| {
            core.slots.remove(key);
            let buffer = slot.buf.lock().take().expect(
                "the buffer was placed in its slot above and nobody takes it before completion",
            );
            (e, buffer)
        };
        let out_desc = if queue.is_passive() {
            let owner = core.own_addr.clone().unwrap_or_default();
            let extra = match self.inner.xprt.desc_extra(&q) {
                Ok(x) => x,
                Err(e) => return Err(undo(&mut core, e)),
            };
            let fields = DescFields {
                transport_id: caps.transport_id,
                queue,
                len: if queue == QueueType::PassiveBulkSend {
                    length as u64
                } else {
                    size as u64
                },
                token: key,
                cookie,
                owner,
                actor,
                extra,
            };
            match NetBufDesc::encode(&fields, self.inner.dom.limits.max_desc_size) {
                Ok(d) => Some(d),
                Err(e) => return Err(undo(&mut core, e)),
            }
        } else {
            None
        };
        // Publish the deadline before the transport sees the buffer: a
        // transport wakes its timer loop in buf_add, and that loop must
        // then find the new earliest deadline.
        if let Some(d) = deadline {
            core.timers.insert((d, key));
            self.inner.update_earliest(&mut core);
        }
        if let Err(e) = self.inner.xprt.buf_add(&q) {
            if let Some(d) = deadline {
                core.timers.remove(&(d, key));
                self.inner.update_earliest(&mut core);
            }
            return Err(undo(&mut core, e));
        }
        core.qlen[queue.index()] += 1;
        core.stats[queue.index()].adds += 1;
        if queue == QueueType::MsgRecv {
            core.recv_list.push_back(key);
            slot.set(F_LISTED);
        }
        trace!(tm = %self.inner.id, token = key, %queue, "added");
        Ok(Added {
            token: BufToken { tm: tm_id, key },
            desc: out_desc,
        })
    }

    /// Adds a message receive buffer.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_msg_recv(&self, buf: NetBuffer, params: RecvParams) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::MsgRecv(params)).map(|a| a.token)
    }

    /// Sends the first `len` bytes of `buf` to `ep`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_msg_send(
        &self,
        buf: NetBuffer,
        ep: &EndPoint,
        len: usize,
    ) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::MsgSend { ep, len }).map(|a| a.token)
    }

    /// Offers `buf` for a remote active bulk send; returns its descriptor.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_passive_recv(
        &self,
        buf: NetBuffer,
        actor: Option<&EndPoint>,
    ) -> Result<(BufToken, NetBufDesc), AddError> {
        self.add(buf, AddOp::PassiveRecv { actor })
            .map(|a| (a.token, a.desc.unwrap_or_default()))
    }

    /// Offers the first `len` bytes of `buf` for a remote active bulk
    /// receive; returns its descriptor.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_passive_send(
        &self,
        buf: NetBuffer,
        len: usize,
        actor: Option<&EndPoint>,
    ) -> Result<(BufToken, NetBufDesc), AddError> {
        self.add(buf, AddOp::PassiveSend { len, actor })
            .map(|a| (a.token, a.desc.unwrap_or_default()))
    }

    /// Reads the remote passive send buffer named by `desc` into `buf`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_active_recv(&self, buf: NetBuffer, desc: &NetBufDesc) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::ActiveRecv { desc }).map(|a| a.token)
    }

    /// Writes the first `len` bytes of `buf` into the remote passive receive
    /// buffer named by `desc`.
    ///
    /// # Errors
    /// As [`TmHandle::add`].
    pub fn add_active_send(
        &self,
        buf: NetBuffer,
        desc: &NetBufDesc,
        len: usize,
    ) -> Result<BufToken, AddError> {
        self.add(buf, AddOp::ActiveSend { desc, len })
            .map(|a| a.token)
    }
}
