//! Splitting one transfer into RDMA work requests, and the registration
//! data of a buffer. No I/O here.
//!
//! A transfer moves `len` bytes between a local region (pieces of the
//! local buffer's registered segments) and the peer's segments. One work
//! request covers a contiguous remote range inside one remote segment, at
//! most `max_sge` local pieces and at most `max_msg` bytes (the port's
//! `max_msg_sz`); the split happens at both sides' segment boundaries.

use std::sync::Arc;

use colibri_net::{NetError, Result};

use crate::verbs::Mr;
use crate::wire::Seg;

/// A local piece: (address, length, lkey).
pub(crate) type Piece = (u64, u64, u32);

/// One planned work request: the remote start, its key and the local
/// pieces (whose lengths sum to the bytes it moves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedWr {
    pub remote_addr: u64,
    pub rkey: u32,
    pub sges: Vec<(u64, u32, u32)>,
}

/// Splits a transfer of `len` bytes.
///
/// # Errors
/// `Protocol` when the remote segments or the local pieces hold fewer than
/// `len` bytes (checked before anything is planned).
pub(crate) fn plan(
    remote: &[Seg],
    local: &[Piece],
    len: u64,
    max_sge: usize,
    max_msg: u64,
) -> Result<Vec<PlannedWr>> {
    let rt: u64 = remote.iter().map(|s| u64::from(s.len)).sum();
    let lt: u64 = local.iter().map(|p| p.1).sum();
    if rt < len || lt < len {
        return Err(NetError::Protocol(format!(
            "transfer of {len} bytes: remote segments hold {rt}, local region {lt}"
        )));
    }
    let max_sge = max_sge.max(1);
    let max_msg = max_msg.clamp(1, u64::from(u32::MAX));
    let mut out = Vec::new();
    let (mut ri, mut roff) = (0usize, 0u64);
    let (mut li, mut loff) = (0usize, 0u64);
    let mut left = len;
    while left > 0 {
        while u64::from(remote[ri].len) == roff {
            ri += 1;
            roff = 0;
        }
        let r = remote[ri];
        let wr_max = (u64::from(r.len) - roff).min(max_msg).min(left);
        let mut sges = Vec::new();
        let mut wl = 0u64;
        while wl < wr_max && sges.len() < max_sge {
            while local[li].1 == loff {
                li += 1;
                loff = 0;
            }
            let p = local[li];
            let take = (p.1 - loff).min(wr_max - wl);
            // `take` <= max_msg <= u32::MAX.
            sges.push((p.0 + loff, u32::try_from(take).unwrap_or(u32::MAX), p.2));
            wl += take;
            loff += take;
        }
        out.push(PlannedWr {
            remote_addr: r.addr + roff,
            rkey: r.rkey,
            sges,
        });
        roff += wl;
        left -= wl;
    }
    Ok(out)
}

/// One registered segment of a buffer.
#[derive(Debug)]
pub(crate) struct RegSeg {
    pub addr: u64,
    pub len: u64,
    /// `None` for an empty segment (nothing to register).
    pub mr: Option<Mr>,
}

/// What `buf_register` returns: the segments' addresses and keys.
#[derive(Debug)]
pub(crate) struct Reg {
    pub segs: Vec<RegSeg>,
}

impl Reg {
    /// The local pieces of `len` bytes at `offset`.
    pub(crate) fn pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece>> {
        let mut out = Vec::new();
        let mut skip = offset;
        let mut left = len;
        for s in &self.segs {
            if left == 0 {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let take = (s.len - skip).min(left);
            let key = s.mr.as_ref().map_or(0, Mr::lkey);
            out.push((s.addr + skip, take, key));
            left -= take;
            skip = 0;
        }
        if left > 0 {
            return Err(NetError::InvalidArgument(format!(
                "region {offset}+{len} outside the buffer"
            )));
        }
        Ok(out)
    }

    /// The segments covering the first `len` bytes, as sent to the peer.
    pub(crate) fn remote(&self, len: u64) -> Result<Vec<Seg>> {
        let mut out = Vec::new();
        let mut left = len;
        for s in &self.segs {
            if left == 0 {
                break;
            }
            let take = s.len.min(left);
            if take == 0 {
                continue;
            }
            let mr =
                s.mr.as_ref()
                    .ok_or_else(|| NetError::InvalidArgument("unregistered segment".into()))?;
            out.push(Seg {
                addr: s.addr,
                len: u32::try_from(take)
                    .map_err(|_| NetError::TooBig("segment over 4 GiB".into()))?,
                rkey: mr.rkey(),
            });
            left -= take;
        }
        if left > 0 {
            return Err(NetError::InvalidArgument(format!(
                "{len} bytes asked of a smaller buffer"
            )));
        }
        Ok(out)
    }
}

/// The registration of a queued buffer, from the core's `XprtData`.
pub(crate) fn reg_of(data: Option<&colibri_net::xprt::XprtData>) -> Option<Arc<Reg>> {
    data.and_then(|d| Arc::clone(d).downcast::<Reg>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segs(lens: &[u32]) -> Vec<Seg> {
        let mut at = 0x10_0000u64;
        lens.iter()
            .enumerate()
            .map(|(i, &l)| {
                let s = Seg {
                    addr: at,
                    len: l,
                    rkey: i as u32 + 100,
                };
                at += u64::from(l) + 4096;
                s
            })
            .collect()
    }

    fn pieces(lens: &[u64]) -> Vec<Piece> {
        let mut at = 0x9000_0000u64;
        lens.iter()
            .enumerate()
            .map(|(i, &l)| {
                let p = (at, l, i as u32 + 1);
                at += l + 8192;
                p
            })
            .collect()
    }

    /// Byte-by-byte maps of what a plan moves must equal both sides' byte
    /// order.
    fn check(remote: &[Seg], local: &[Piece], len: u64, max_sge: usize, max_msg: u64) {
        let wrs = plan(remote, local, len, max_sge, max_msg).unwrap();
        let mut rbytes = Vec::new();
        let mut lbytes = Vec::new();
        for w in &wrs {
            assert!(!w.sges.is_empty() && w.sges.len() <= max_sge.max(1));
            let n: u64 = w.sges.iter().map(|s| u64::from(s.1)).sum();
            assert!(n > 0 && n <= max_msg.max(1));
            let seg = remote
                .iter()
                .find(|s| s.rkey == w.rkey)
                .expect("known remote key");
            assert!(w.remote_addr >= seg.addr);
            assert!(w.remote_addr + n <= seg.addr + u64::from(seg.len));
            rbytes.extend(w.remote_addr..w.remote_addr + n);
            for s in &w.sges {
                lbytes.extend(s.0..s.0 + u64::from(s.1));
            }
        }
        let rwant: Vec<u64> = remote
            .iter()
            .flat_map(|s| s.addr..s.addr + u64::from(s.len))
            .take(len as usize)
            .collect();
        let lwant: Vec<u64> = local
            .iter()
            .flat_map(|p| p.0..p.0 + p.1)
            .take(len as usize)
            .collect();
        assert_eq!(rbytes, rwant);
        assert_eq!(lbytes, lwant);
    }

    #[test]
    fn splits_at_both_boundaries_and_limits() {
        check(&segs(&[10]), &pieces(&[10]), 10, 1, 100);
        check(&segs(&[3, 7, 5]), &pieces(&[4, 4, 4, 4]), 15, 2, 6);
        check(&segs(&[0, 5, 0, 5]), &pieces(&[0, 1, 9]), 10, 30, 3);
        assert!(
            plan(&segs(&[10]), &pieces(&[10]), 0, 1, 1)
                .unwrap()
                .is_empty()
        );
        assert!(plan(&segs(&[4]), &pieces(&[10]), 5, 1, 10).is_err());
        assert!(plan(&segs(&[10]), &pieces(&[4]), 5, 1, 10).is_err());
    }

    proptest! {
        #[test]
        fn plans_cover_the_transfer_exactly(
            r in proptest::collection::vec(0u32..50, 1..8),
            l in proptest::collection::vec(0u64..50, 1..8),
            max_sge in 1usize..5,
            max_msg in 1u64..70,
            frac in 0u64..=100,
        ) {
            let rt: u64 = r.iter().map(|&x| u64::from(x)).sum();
            let lt: u64 = l.iter().sum();
            let len = rt.min(lt) * frac / 100;
            check(&segs(&r), &pieces(&l), len, max_sge, max_msg);
        }
    }
}
