//! Raw LNet traffic for the transport's hostile-input tests: PUTs from
//! the node's own LNet API, with whatever match bits and header data a
//! test forges.

// Each test binary uses part of it.
#![allow(dead_code)]

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{MdOptions, MdSpec, MemRef, Threshold, Unlink};
use colibri_lnet_rt::{Lnet, MemRegion};

/// PUTs `bytes` with `hdr` to `(portal, bits)` of the node itself.
pub(crate) fn raw_put(l: &Lnet, portal: u32, bits: u64, hdr: u64, bytes: Vec<u8>) {
    raw_put_to(l, ProcessId::lustre(l.nids()[0]), portal, bits, hdr, bytes);
}

/// PUTs `bytes` with `hdr` from node `l` to `(portal, bits)` of `to`.
pub(crate) fn raw_put_to(
    l: &Lnet,
    to: ProcessId,
    portal: u32,
    bits: u64,
    hdr: u64,
    bytes: Vec<u8>,
) {
    let len = bytes.len() as u32;
    let key = l.register(&MemRegion::from_vec(bytes));
    let md = l
        .md_bind(
            MdSpec::new(MemRef::new(key, 0, len), MdOptions::empty())
                .threshold(Threshold::Count(1))
                .unlink(Unlink::Unlink),
        )
        .unwrap();
    l.put(md, false, to, portal, bits, 0, hdr).unwrap();
}

/// Our header data: magic 0xC1, sequence, TMID, portal, kind.
pub(crate) fn hdr(kind: u64, portal: u64, tmid: u64, seq: u64) -> u64 {
    (0xC1 << 56) | (seq << 32) | (tmid << 16) | (portal << 8) | kind
}

/// A control message (version 3) of `kind` for `xid` with an 8-byte body
/// (GONE, DELIVERED, NAK, ABORT: its fifth byte says it is the
/// requester's).
pub(crate) fn ctl(kind: u8, xid: u64, body: [u8; 8]) -> Vec<u8> {
    let mut b = b"CLNC".to_vec();
    b.extend_from_slice(&[3, kind, 0, 0]);
    b.extend_from_slice(&xid.to_le_bytes());
    b.extend_from_slice(&body);
    b
}

/// A bulk REQUEST (version 3) for `xid` from an active queue `active` of
/// `size` bytes, naming the requester's MEs `bits`, for descriptor `desc`.
pub(crate) fn request(xid: u64, active: u8, size: u64, bits: u64, desc: &[u8]) -> Vec<u8> {
    let mut b = b"CLNC".to_vec();
    b.extend_from_slice(&[3, 1, 0, 0]);
    b.extend_from_slice(&xid.to_le_bytes());
    b.extend_from_slice(&[active, 0, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&bits.to_le_bytes());
    b.extend_from_slice(&(desc.len() as u16).to_le_bytes());
    b.extend_from_slice(desc);
    b
}
