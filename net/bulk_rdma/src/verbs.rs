//! Everything that touches libibverbs: the device, memory registration, the
//! completion queue with its channel, and queue pairs. The only module of
//! the crate with `unsafe` code; every block says why it is sound.
//!
//! sideway wraps most of it; what it lacks (arming the CQ, reading and
//! acknowledging completion events, forcing a QP into the error state
//! without its cached-state check) goes straight to `rdma-mummy-sys`, the
//! FFI sideway itself is built on.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;
use std::sync::Arc;

use colibri_net::NetError;

pub(crate) use crate::wire::QpInfo;
use rdma_mummy_sys::{
    ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_modify_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_state, ibv_req_notify_cq, ibv_sge,
};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid, GidType};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, GenericCompletionQueue,
    WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, SetInlineData,
    SetScatterGatherEntry, WorkRequestFlags,
};

/// The port every queue pair uses.
const PORT: u8 = 1;

/// Limits read from the device and its port (never hard-coded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DevLimits {
    /// Scatter/gather entries per send work request (RDMA WRITE).
    pub max_sge: usize,
    /// Scatter/gather entries per RDMA READ.
    pub max_sge_rd: usize,
    /// Work requests per queue pair.
    pub max_qp_wr: usize,
    /// Outstanding RDMA READs a queue pair may initiate / serve.
    pub max_qp_rd_atom: usize,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Largest message (one work request) on the port.
    pub max_msg_sz: u64,
    /// Completion queue entries.
    pub max_cqe: usize,
}

/// An opened RDMA device with its protection domain: one per domain (the
/// domain's queue pairs only ever touch the domain's registrations).
pub(crate) struct Device {
    name: String,
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    gid: [u8; 16],
    gid_index: u8,
    mtu: u32,
    limits: DevLimits,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("gid_index", &self.gid_index)
            .field("limits", &self.limits)
            .finish()
    }
}

fn io_err(what: &str, e: impl fmt::Display) -> NetError {
    NetError::Io {
        kind: io::ErrorKind::Other,
        message: format!("{what}: {e}"),
    }
}

/// The error for a machine without a usable RDMA device.
fn no_device(detail: String) -> NetError {
    NetError::Io {
        kind: io::ErrorKind::NotFound,
        message: format!("no RDMA device: {detail}"),
    }
}

impl Device {
    /// Opens `name` (or the first device), picks the first RoCE v2 GID with
    /// an IPv4-mapped address (else index 0), reads its limits and allocates
    /// the protection domain.
    pub(crate) fn open(name: Option<&str>) -> Result<Arc<Self>, NetError> {
        let list = DeviceList::new().map_err(|e| no_device(format!("{e}")))?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        let dev = match name {
            Some(n) => list.iter().find(|d| d.name() == n),
            None => list.iter().next(),
        }
        .ok_or_else(|| {
            no_device(format!(
                "{} not found (devices: {names:?})",
                name.unwrap_or("any device")
            ))
        })?;
        let dev_name = dev.name();
        let ctx = dev.open().map_err(|e| io_err("ibv_open_device", e))?;
        let port = ctx
            .query_port(PORT)
            .map_err(|e| io_err("ibv_query_port", e))?;
        let attr = ctx
            .query_device()
            .map_err(|e| io_err("ibv_query_device", e))?;
        let gid_index = ctx
            .query_gid_table()
            .ok()
            .and_then(|t| {
                t.iter()
                    .find(|e| {
                        let r = e.gid().raw;
                        e.port_num() == u32::from(PORT)
                            && e.gid_type() == GidType::RoceV2
                            && r[..10].iter().all(|&b| b == 0)
                            && r[10] == 0xff
                            && r[11] == 0xff
                    })
                    .map(|e| e.gid_index())
            })
            .unwrap_or(0);
        let gid = ctx
            .query_gid(PORT, gid_index)
            .map_err(|e| io_err("ibv_query_gid", e))?;
        let pd = ctx.alloc_pd().map_err(|e| io_err("ibv_alloc_pd", e))?;
        let pos = |v: i32| usize::try_from(v).unwrap_or(0).max(1);
        let limits = DevLimits {
            max_sge: pos(attr.max_sge()),
            max_sge_rd: pos(attr.max_sge_rd()).min(pos(attr.max_sge())),
            max_qp_wr: pos(attr.max_qp_wr()),
            max_qp_rd_atom: pos(attr.max_qp_rd_atom()).min(255),
            max_mr_size: attr.max_mr_size(),
            max_msg_sz: u64::from(port.attr.max_msg_sz).max(1),
            max_cqe: pos(attr.max_cqe()),
        };
        Ok(Arc::new(Self {
            name: dev_name,
            ctx,
            pd,
            gid: gid.raw,
            gid_index: u8::try_from(gid_index).unwrap_or(0),
            mtu: port.active_mtu() as u32,
            limits,
        }))
    }

    /// The device's limits.
    pub(crate) fn limits(&self) -> DevLimits {
        self.limits
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// What a peer needs to connect to a queue pair of ours.
    pub(crate) fn endpoint(&self, qpn: u32, psn: u32) -> QpInfo {
        QpInfo {
            qpn,
            psn,
            gid: self.gid,
            mtu: u8::try_from(self.mtu).unwrap_or(1),
            rd_atom: u8::try_from(self.limits.max_qp_rd_atom).unwrap_or(u8::MAX),
            slots: 0,
        }
    }

    /// Registers `len` bytes of the engine's own memory (the eager slot
    /// rings) for local access only: no peer can reach it by RDMA.
    /// Takes `mem` mutably: the device writes into it.
    pub(crate) fn register_local(&self, mem: &mut [u8]) -> Result<Mr, NetError> {
        // SAFETY: `mem` is a boxed slice owned by a connection of the
        // engine, which keeps it (at a fixed address) until the queue pair
        // using it is destroyed and every work request naming it retired;
        // the MR is dropped before the memory (field order of the owner).
        let mr = unsafe {
            self.pd.reg_mr(
                mem.as_mut_ptr() as usize,
                mem.len(),
                AccessFlags::LocalWrite,
            )
        };
        mr.map(Mr)
            .map_err(|e| io_err(&format!("ibv_reg_mr of {} bytes", mem.len()), e))
    }

    /// Registers `len` bytes at `addr` for local write and remote read and
    /// write.
    ///
    /// # Errors
    /// `Io` with the verbs error; `ENOMEM` (the locked-memory limit,
    /// `RLIMIT_MEMLOCK`, on most hosts) says so.
    pub(crate) fn register(&self, addr: *const u8, len: usize) -> Result<Mr, NetError> {
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        // SAFETY: `addr..addr + len` is one segment of a registered buffer
        // (a `Box<[u8]>` the core keeps at a fixed address from register to
        // deregister); the MR is dropped in `buf_deregister`, after every
        // operation on the buffer completed, and the device only touches
        // the memory through work requests this crate posts for a buffer in
        // use, or on behalf of a peer holding a live request for it.
        let mr = unsafe { self.pd.reg_mr(addr as usize, len, access) };
        match mr {
            Ok(mr) => Ok(Mr(mr)),
            Err(e) => {
                let os = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<io::Error>())
                    .and_then(io::Error::raw_os_error);
                let text = format!("{e}: {}", io::Error::last_os_error());
                if os == Some(libc::ENOMEM) || text.contains("Cannot allocate memory") {
                    Err(NetError::Io {
                        kind: io::ErrorKind::OutOfMemory,
                        message: format!(
                            "ibv_reg_mr of {len} bytes: out of lockable memory \
                             (check RLIMIT_MEMLOCK, `ulimit -l`): {text}"
                        ),
                    })
                } else {
                    Err(io_err(&format!("ibv_reg_mr of {len} bytes"), text))
                }
            }
        }
    }
}

/// A registered memory region (one segment).
pub(crate) struct Mr(Arc<MemoryRegion>);

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr").field("lkey", &self.lkey()).finish()
    }
}

impl Mr {
    pub(crate) fn lkey(&self) -> u32 {
        self.0.lkey()
    }
    pub(crate) fn rkey(&self) -> u32 {
        self.0.rkey()
    }
}

/// One work completion, copied out of the CQ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wc {
    pub wr_id: u64,
    pub status: u32,
    /// Bytes received (receive completions).
    pub byte_len: u32,
}

impl Wc {
    pub(crate) fn ok(&self) -> bool {
        self.status == WorkCompletionStatus::Success as u32
    }

    /// A work request flushed because its queue pair went to ERROR.
    pub(crate) fn flushed(&self) -> bool {
        self.status == WorkCompletionStatus::WorkRequestFlushedError as u32
    }

    pub(crate) fn status_text(&self) -> String {
        format!("{:?}", WorkCompletionStatus::from(self.status))
    }
}

/// The completion queue of an engine, with its completion channel.
pub(crate) struct Cq {
    cq: Arc<BasicCompletionQueue>,
    generic: GenericCompletionQueue,
    chan: Arc<CompletionChannel>,
    depth: usize,
    /// Events read from the channel and not yet acknowledged.
    unacked: u32,
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq").field("depth", &self.depth).finish()
    }
}

impl Cq {
    /// A CQ of `depth` entries with a non-blocking completion channel.
    pub(crate) fn new(dev: &Device, depth: usize) -> Result<Self, NetError> {
        let chan = dev
            .ctx
            .create_comp_channel()
            .map_err(|e| io_err("ibv_create_comp_channel", e))?;
        chan.set_nonblocking(true)
            .map_err(|e| io_err("completion channel O_NONBLOCK", e))?;
        let mut b = dev.ctx.create_cq_builder();
        b.setup_cqe(u32::try_from(depth).unwrap_or(u32::MAX))
            .setup_comp_channel(&chan, 0);
        let cq = b.build().map_err(|e| io_err("ibv_create_cq", e))?;
        let generic = GenericCompletionQueue::from(Arc::clone(&cq));
        Ok(Self {
            cq,
            generic,
            chan,
            depth,
            unacked: 0,
        })
    }

    /// Entries of the CQ.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// The completion channel's file descriptor (readable when an event
    /// is pending).
    pub(crate) fn fd(&self) -> RawFd {
        self.chan.as_raw_fd()
    }

    /// Appends the available completions (at most `max`) to `out`.
    pub(crate) fn poll(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        let Ok(mut p) = self.cq.start_poll() else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(wc) = p.next() else { break };
            out.push(Wc {
                wr_id: wc.wr_id(),
                status: wc.status(),
                byte_len: wc.byte_len(),
            });
            n += 1;
        }
        n
    }

    /// Asks for an event on the next completion. The caller polls once
    /// more afterwards: a completion that arrived before the arm raises no
    /// event.
    pub(crate) fn arm(&self) -> Result<(), NetError> {
        // SAFETY: the CQ handle is valid while `self.cq` lives (we hold an
        // `Arc` to it); `ibv_req_notify_cq` only sets the CQ's arm state.
        let r = unsafe { ibv_req_notify_cq(self.generic.cq().as_ptr(), 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(io_err("ibv_req_notify_cq", io::Error::from_raw_os_error(r)))
        }
    }

    /// Reads every pending event of the (non-blocking) channel and
    /// acknowledges them in batches. Returns how many were read.
    pub(crate) fn take_events(&mut self) -> u32 {
        let mut got = 0;
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: the channel is valid while `self.chan` lives; the
            // channel is non-blocking, so this returns -1 (EAGAIN) at once
            // when nothing is pending; both out-pointers point to locals.
            let r = unsafe {
                ibv_get_cq_event(self.chan.comp_channel().as_ptr(), &raw mut cq, &raw mut ctx)
            };
            if r != 0 {
                break;
            }
            got += 1;
            self.unacked += 1;
        }
        if self.unacked >= 64 {
            self.ack();
        }
        got
    }

    fn ack(&mut self) {
        if self.unacked > 0 {
            // SAFETY: the CQ is valid (held by `self.cq`); we acknowledge
            // exactly the events read from its channel and not yet acked.
            unsafe { ibv_ack_cq_events(self.generic.cq().as_ptr(), self.unacked) };
            self.unacked = 0;
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // Every event must be acknowledged before the CQ is destroyed, or
        // the destroy blocks for ever.
        self.take_events();
        self.ack();
    }
}

/// Queue-pair parameters from the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpParams {
    pub sq_depth: u32,
    /// Receive queue depth (the eager slots posted on it); 0: none.
    pub rq_depth: u32,
    /// Bytes a SEND may carry inline (asked of the device; 0 if it
    /// refuses).
    pub max_inline: u32,
    pub max_sge: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
}

/// An RC queue pair: READs, WRITEs and eager SENDs on its send queue,
/// the eager receive slots on its receive queue.
pub(crate) struct Qp {
    qp: BasicQueuePair,
    dev: Arc<Device>,
    /// Inline bytes the queue pair was created with.
    inline: u32,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qp.qp_number())
            .finish()
    }
}

/// One RDMA work request: `sges` (local) against one remote range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wr {
    pub wr_id: u64,
    pub read: bool,
    pub remote_addr: u64,
    pub rkey: u32,
    /// (address, length, lkey) of each local piece.
    pub sges: Vec<(u64, u32, u32)>,
}

impl Qp {
    /// A new RC queue pair on `cq`, moved to INIT.
    pub(crate) fn new(dev: &Arc<Device>, cq: &Cq, p: QpParams) -> Result<Self, NetError> {
        let build = |inline: u32| {
            dev.pd
                .create_qp_builder()
                .setup_send_cq(cq.generic.clone())
                .setup_recv_cq(cq.generic.clone())
                .setup_max_send_wr(p.sq_depth)
                .setup_max_recv_wr(p.rq_depth.max(1))
                .setup_max_send_sge(p.max_sge)
                .setup_max_recv_sge(1)
                .setup_max_inline_data(inline)
                .build()
        };
        // A device that cannot inline that much refuses the queue pair:
        // then SENDs go from the registered slots only.
        let (mut qp, inline) = match build(p.max_inline) {
            Ok(qp) => (qp, p.max_inline),
            Err(_) if p.max_inline > 0 => (build(0).map_err(|e| io_err("ibv_create_qp", e))?, 0),
            Err(e) => return Err(io_err("ibv_create_qp", e)),
        };
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(PORT)
            .setup_access_flags(access);
        qp.modify(&a).map_err(|e| io_err("modify QP to INIT", e))?;
        Ok(Self {
            qp,
            dev: Arc::clone(dev),
            inline,
        })
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qp_number()
    }

    /// The queue pair's state and the retry parameters the device applied:
    /// (state, local ACK timeout, retry count, RNR retry count).
    #[cfg(test)]
    pub(crate) fn query(&self) -> Result<(QueuePairState, u8, u8, u8), NetError> {
        use sideway::ibverbs::queue_pair::QueuePairAttributeMask as M;
        let (a, _) = self
            .qp
            .query(M::State | M::Timeout | M::RetryCount | M::ResponderNotReadyRetryCount)
            .map_err(|e| io_err("ibv_query_qp", e))?;
        Ok((a.state(), a.timeout(), a.retry_cnt(), a.rnr_retry()))
    }

    /// INIT → RTR → RTS against the peer's queue pair.
    pub(crate) fn connect(
        &mut self,
        local_psn: u32,
        remote: &QpInfo,
        p: QpParams,
    ) -> Result<(), NetError> {
        let mut av = AddressHandleAttribute::new();
        let gid = Gid { raw: remote.gid };
        av.setup_dest_lid(0)
            .setup_port(PORT)
            .setup_service_level(0)
            .setup_grh(&gid, 0, self.dev.gid_index, 64, 0);
        let mtu = Mtu::from(u32::from(remote.mtu).min(self.dev.mtu));
        // Our responder serves at most what our device allows; our requester
        // keeps at most what the peer's responder serves.
        let rd = u8::try_from(self.dev.limits.max_qp_rd_atom).unwrap_or(u8::MAX);
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(rd)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        self.qp
            .modify(&a)
            .map_err(|e| io_err("modify QP to RTR", e))?;
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(local_psn)
            .setup_timeout(p.timeout)
            .setup_retry_cnt(p.retry_cnt.min(6))
            .setup_rnr_retry(0)
            .setup_max_read_atomic(rd.min(remote.rd_atom).max(1));
        self.qp
            .modify(&a)
            .map_err(|e| io_err("modify QP to RTS", e))?;
        Ok(())
    }

    /// Moves the queue pair to ERROR: every work request still queued
    /// completes with a flush error, and no request of the peer reaches
    /// our memory through it any more.
    pub(crate) fn set_error(&mut self) {
        // SAFETY: a zeroed `ibv_qp_attr` is a valid value (plain C struct of
        // integers); only `qp_state` is read, as the mask says; the QP
        // handle is valid while `self.qp` lives.
        let r = unsafe {
            let mut attr: ibv_qp_attr = std::mem::zeroed();
            attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
            ibv_modify_qp(
                self.qp.qp().as_ptr(),
                &raw mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if r != 0 {
            tracing::warn!(qpn = self.qpn(), err = r, "could not move QP to ERROR");
        }
    }

    /// Posts one receive of `len` bytes at `addr` (an eager slot).
    pub(crate) fn post_recv(
        &mut self,
        wr_id: u64,
        addr: u64,
        len: u32,
        lkey: u32,
    ) -> Result<(), NetError> {
        let mut g = self.qp.start_post_recv();
        let h = g.construct_wr(wr_id);
        // SAFETY: `addr..addr + len` is one slot of the connection's
        // receive ring, registered with `lkey`; the ring outlives the
        // queue pair (the connection drops the QP first) and the slot is
        // not read until this receive's completion was polled.
        unsafe { h.setup_sge(lkey, addr, len) };
        g.post().map_err(|e| io_err("ibv_post_recv", e))
    }

    /// Posts one signalled SEND of `frame`, which lies in a registered
    /// send slot at `addr` with `lkey` (inline when it fits).
    pub(crate) fn post_send(
        &mut self,
        wr_id: u64,
        frame: &[u8],
        lkey: u32,
    ) -> Result<(), NetError> {
        let mut g = self.qp.start_post_send();
        let h = g
            .construct_wr(wr_id, WorkRequestFlags::Signaled)
            .setup_send();
        if frame.len() <= self.inline as usize {
            h.setup_inline_data(frame);
        } else {
            let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
            // SAFETY: `frame` is a send slot of the connection's registered
            // send ring (`lkey`), held (not reused) until this SEND's
            // completion was polled; the ring outlives the queue pair.
            unsafe { h.setup_sge(lkey, frame.as_ptr() as u64, len) };
        }
        g.post().map_err(|e| io_err("ibv_post_send (SEND)", e))
    }

    /// Posts `wrs` (all signalled) in one call.
    pub(crate) fn post(&mut self, wrs: &[Wr]) -> Result<(), NetError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut g = self.qp.start_post_send();
        for wr in wrs {
            let h = g.construct_wr(wr.wr_id, WorkRequestFlags::Signaled);
            let h = if wr.read {
                h.setup_read(wr.rkey, wr.remote_addr)
            } else {
                h.setup_write(wr.rkey, wr.remote_addr)
            };
            let sges: Vec<ibv_sge> = wr
                .sges
                .iter()
                .map(|&(addr, length, lkey)| ibv_sge { addr, length, lkey })
                .collect();
            // SAFETY: every SGE names a piece of a registered segment (its
            // lkey is that segment's MR) of a buffer the engine holds in
            // use until this work request's completion was polled; the
            // guard copies the list before `post` returns.
            unsafe { h.setup_sge_list(&sges) };
        }
        g.post().map_err(|e| io_err("ibv_post_send", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configured retry parameters reach the queue pair, with the
    /// retry count capped at 6 (rxe retries 7 for ever), and `set_error`
    /// moves it to ERROR. Needs a device (the VM).
    #[test]
    #[ignore = "needs an RDMA device: run in the Soft-RoCE VM (.ci/run)"]
    fn qp_parameters_are_applied() {
        let dev = Device::open(None).unwrap();
        let lim = dev.limits();
        assert!(lim.max_sge >= 1 && lim.max_qp_wr >= 1 && lim.max_cqe >= 1);
        assert!(lim.max_msg_sz >= 1 && lim.max_mr_size >= 1 && lim.max_qp_rd_atom >= 1);
        let cq = Cq::new(&dev, 64).unwrap();
        let p = QpParams {
            sq_depth: 8,
            rq_depth: 4,
            max_inline: 64,
            max_sge: 2,
            timeout: 17,
            retry_cnt: 7,
        };
        let mut a = Qp::new(&dev, &cq, p).unwrap();
        let mut b = Qp::new(&dev, &cq, p).unwrap();
        let (ia, ib) = (dev.endpoint(a.qpn(), 1), dev.endpoint(b.qpn(), 2));
        a.connect(1, &ib, p).unwrap();
        b.connect(2, &ia, p).unwrap();
        let (state, timeout, retry, rnr) = a.query().unwrap();
        assert_eq!(state, QueuePairState::ReadyToSend);
        assert_eq!(timeout, 17);
        assert_eq!(retry, 6, "retry_cnt 7 must be capped at 6");
        assert_eq!(rnr, 0);
        a.set_error();
        assert_eq!(a.query().unwrap().0, QueuePairState::Error);
    }
}
