//! The RPC wire format: fixed little-endian headers, checked once on
//! receipt.
//!
//! One network message carries one or more *items* (requests, replies,
//! one-way items) of one session in one direction, packed back to back
//! after a message header. The header numbers the message in its
//! session's sequence for that direction (see `rpc/DESIGN.md`, "Ordering"),
//! and carries the acknowledgement of the opposite direction:
//!
//! ```text
//! message header (64 bytes)
//! off size field
//!   0    4  magic "CRPC" (0x4350_5243 little-endian)
//!   4    1  version (3)
//!   5    1  flags: bit 0 REPLIES (server to client; else client to
//!           server), bit 1 ACK_ONLY (no items, no sequence number: an
//!           acknowledgement or a probe), bit 2 ACK_NOW (the sender asks
//!           for an acknowledgement as soon as this message is handled);
//!           other bits 0; ACK_NOW never with ACK_ONLY
//!   6    2  item count N (at least 1; 0 with ACK_ONLY)
//!   8    4  message length in bytes, this header included; must equal the
//!           length the transport delivered
//!  12    4  reserved (0)
//!  16    8  session id (nonzero)
//!  24    8  epoch of the sender's sequence (nonzero; grows when the
//!           sender restarts its sequence)
//!  32    8  sequence number in the epoch (from 1; 0 with ACK_ONLY)
//!  40    8  low: the sender's lowest sequence number not yet acknowledged
//!           (1 <= low <= seq; 0 with ACK_ONLY)
//!  48    8  acknowledged epoch of the opposite direction (0: none)
//!  56    8  acknowledged sequence number: every message of that epoch up
//!           to this one was handled (nonzero exactly when the epoch is)
//!
//! item header (40 bytes), N times, each followed by its payload and its
//! bulk descriptor section
//! off size field
//!   0    1  kind: 1 request, 2 reply, 3 one-way (replies exactly in
//!           REPLIES messages)
//!   1    1  flags: bit 0 = resent request (others 0)
//!   2    1  number of bulk descriptors K (at most 16; 0 on replies and
//!           one-way items)
//!   3    1  reserved (0)
//!   4    4  opcode
//!   8    8  session id (the message's)
//!  16    8  transaction id (xid; nonzero on requests and replies)
//!  24    4  status, i32: 0 on requests and one-way items; on replies 0 for
//!           success, else the failure (negative errno or handler code)
//!  28    4  payload length P
//!  32    4  bulk descriptor section length D
//!  36    4  replied-below gap G, requests only (0 on replies and one-way
//!           items): 0 claims nothing; 1 <= G <= xid says the client has
//!           the reply to (or gave up) every call of the session with an
//!           xid below xid + 1 - G, so the server may drop those replies
//!           from its cache
//!  40    P  payload
//! 40+P   D  K bulk descriptor entries:
//!           off size field
//!             0    1  kind: 1 source (the server reads it), 2 sink (the
//!                     server writes into it)
//!             1    1  reserved (0)
//!             2    2  descriptor length L
//!             4    4  reserved (0)
//!             8    8  bytes offered (source) or space (sink)
//!            16    L  the transport's opaque descriptor
//! ```
//!
//! Decoding never panics: every length is checked against what remains,
//! every reserved field and flag must be zero, and the items must end
//! exactly at the message length. A malformed item stops the decoding of
//! its message; the items before it are still delivered. Messages of
//! versions 1 (16-byte header, no sequence numbers) and 2 (no replied-below
//! gap) are refused with [`WireError::BadVersion`].

use colibri_net::NetBufDesc;
use colibri_wire::{Reader, Short, Writer};

/// Magic number at the start of every RPC message ("CRPC").
pub const MAGIC: u32 = u32::from_le_bytes(*b"CRPC");
/// Version of the wire format.
pub const VERSION: u8 = 3;
/// Size of the message header.
pub const MSG_HEADER_SIZE: usize = 64;
/// Size of an item header.
pub const ITEM_HEADER_SIZE: usize = 40;
/// Size of a bulk descriptor entry's fixed part.
pub const DESC_ENTRY_SIZE: usize = 16;
/// Most bulk descriptors one request carries.
pub const MAX_DESCS: usize = 16;
/// Flag of a resent request.
pub const FLAG_RESEND: u8 = 1;
/// Message flag: the message travels from server to client (replies).
pub const MSG_REPLIES: u8 = 1;
/// Message flag: an acknowledgement (or probe) with no items and no
/// sequence number.
pub const MSG_ACK_ONLY: u8 = 2;
/// Message flag: acknowledge as soon as this message is handled.
pub const MSG_ACK_NOW: u8 = 4;
/// Most messages of one session and direction a receiver holds out of
/// order (sequence numbers at or beyond `expected + MAX_WINDOW` are
/// dropped). A sender's window ([`RpcConfig::window`]) may not exceed it.
///
/// [`RpcConfig::window`]: crate::RpcConfig::window
pub const MAX_WINDOW: u64 = 1024;

/// The fixed header of a message: where it belongs in its session's
/// sequence, and the acknowledgement of the opposite direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsgHeader {
    /// True for the server-to-client direction (replies).
    pub replies: bool,
    /// True for an acknowledgement or probe: no items, no sequence number.
    pub ack_only: bool,
    /// The sender asks for an acknowledgement once this message is handled.
    pub ack_now: bool,
    /// Number of items (0 exactly with `ack_only`).
    pub items: u16,
    /// Message length, this header included.
    pub len: u32,
    /// Session id.
    pub session: u64,
    /// Epoch of the sender's sequence (nonzero).
    pub epoch: u64,
    /// Sequence number in the epoch (0 exactly with `ack_only`).
    pub seq: u64,
    /// The sender's lowest sequence number not yet acknowledged (0 exactly
    /// with `ack_only`).
    pub low: u64,
    /// Acknowledgement of the opposite direction: (epoch, every message up
    /// to this sequence number handled).
    pub ack: Option<(u64, u64)>,
}

impl MsgHeader {
    fn flags(&self) -> u8 {
        let mut f = 0;
        if self.replies {
            f |= MSG_REPLIES;
        }
        if self.ack_only {
            f |= MSG_ACK_ONLY;
        }
        if self.ack_now {
            f |= MSG_ACK_NOW;
        }
        f
    }

    /// Writes the header into the first [`MSG_HEADER_SIZE`] bytes of
    /// `dst`.
    ///
    /// # Panics
    /// If `dst` is shorter than the header (a bug of the caller).
    pub fn write(&self, dst: &mut [u8]) {
        let (ae, aseq) = self.ack.unwrap_or((0, 0));
        let mut w = Writer::new(dst);
        w.put_u32(MAGIC);
        w.put_u8(VERSION);
        w.put_u8(self.flags());
        w.put_u16(self.items);
        w.put_u32(self.len);
        w.put_zeros(4);
        w.put_u64(self.session);
        w.put_u64(self.epoch);
        w.put_u64(self.seq);
        w.put_u64(self.low);
        w.put_u64(ae);
        w.put_u64(aseq);
    }

    /// Decodes and checks the header at the start of `buf`, a whole
    /// message as delivered.
    ///
    /// # Errors
    /// A [`WireError`] for anything that is not a valid message header, or
    /// a length field that disagrees with `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        // One length check, then every field is read (from a reader of known
        // length, so no read can fail) before any is checked.
        let short = |_: Short| WireError::Truncated("message header");
        let mut r = Reader::new(Reader::new(buf).array::<MSG_HEADER_SIZE>().map_err(short)?);
        let magic = r.u32().map_err(short)?;
        let version = r.u8().map_err(short)?;
        let flags = r.u8().map_err(short)?;
        let items = r.u16().map_err(short)?;
        let len = r.u32().map_err(short)?;
        let reserved = r.u32().map_err(short)?;
        let session = r.u64().map_err(short)?;
        let epoch = r.u64().map_err(short)?;
        let seq = r.u64().map_err(short)?;
        let low = r.u64().map_err(short)?;
        let ack_epoch = r.u64().map_err(short)?;
        let ack_seq = r.u64().map_err(short)?;
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        if flags & !(MSG_REPLIES | MSG_ACK_ONLY | MSG_ACK_NOW) != 0 {
            return Err(WireError::BadField("message flags"));
        }
        let h = Self {
            replies: flags & MSG_REPLIES != 0,
            ack_only: flags & MSG_ACK_ONLY != 0,
            ack_now: flags & MSG_ACK_NOW != 0,
            items,
            len,
            session,
            epoch,
            seq,
            low,
            ack: match (ack_epoch, ack_seq) {
                (0, 0) => None,
                (0, _) | (_, 0) => return Err(WireError::BadField("acknowledgement")),
                (e, s) => Some((e, s)),
            },
        };
        if h.len as usize != buf.len() {
            return Err(WireError::Length("message length field"));
        }
        if reserved != 0 {
            return Err(WireError::BadField("message reserved field"));
        }
        if h.session == 0 {
            return Err(WireError::BadField("zero session id"));
        }
        if h.epoch == 0 {
            return Err(WireError::BadField("zero epoch"));
        }
        if h.ack_only {
            if h.items != 0 || h.seq != 0 || h.low != 0 || h.ack_now {
                return Err(WireError::BadField("acknowledgement-only message"));
            }
        } else {
            if h.items == 0 {
                return Err(WireError::BadField("message with no item"));
            }
            if h.seq == 0 || h.low == 0 || h.low > h.seq {
                return Err(WireError::BadField("sequence number"));
            }
        }
        Ok(h)
    }
}

/// What an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ItemKind {
    /// A request, answered by a reply with the same session and xid.
    Request,
    /// The reply to a request.
    Reply,
    /// A one-way item: no reply.
    OneWay,
}

impl ItemKind {
    /// The wire code.
    pub const fn code(self) -> u8 {
        match self {
            Self::Request => 1,
            Self::Reply => 2,
            Self::OneWay => 3,
        }
    }

    /// The kind of a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Self::Request),
            2 => Some(Self::Reply),
            3 => Some(Self::OneWay),
            _ => None,
        }
    }
}

/// Direction of a bulk buffer a request names, seen from the client that
/// offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BulkKind {
    /// The client offers data: the server reads it (active receive into a
    /// server buffer).
    Source,
    /// The client offers space: the server writes into it (active send
    /// from a server buffer).
    Sink,
}

impl BulkKind {
    const fn code(self) -> u8 {
        match self {
            Self::Source => 1,
            Self::Sink => 2,
        }
    }

    const fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Self::Source),
            2 => Some(Self::Sink),
            _ => None,
        }
    }
}

/// A bulk buffer named in a request: its direction, size and descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkDesc {
    /// Direction.
    pub kind: BulkKind,
    /// Bytes the client offers (source) or can take (sink).
    pub len: u64,
    /// The transport's descriptor of the client's passive buffer.
    pub desc: NetBufDesc,
}

/// The fixed header of an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemHeader {
    /// Kind.
    pub kind: ItemKind,
    /// Flags ([`FLAG_RESEND`]).
    pub flags: u8,
    /// Opcode.
    pub opcode: u32,
    /// Session id.
    pub session: u64,
    /// Transaction id.
    pub xid: u64,
    /// Status (replies).
    pub status: i32,
    /// Requests: the replied-below gap (see [`ItemHeader::replied_below`]);
    /// 0 on other items.
    pub low_gap: u32,
}

impl ItemHeader {
    /// The gap that says "every call below `low` is done" in a request
    /// numbered `xid` (`low <= xid`); 0 (no claim) when it does not fit.
    pub fn gap_for(xid: u64, low: u64) -> u32 {
        if low == 0 || low > xid {
            return 0;
        }
        u32::try_from(xid - low + 1).unwrap_or(0)
    }

    /// For a request, the xid below which the client has every reply (or
    /// gave the call up): the server need not keep those replies. `None`
    /// when the request claims nothing.
    pub fn replied_below(&self) -> Option<u64> {
        let g = u64::from(self.low_gap);
        (self.kind == ItemKind::Request && g != 0 && g <= self.xid).then(|| self.xid - (g - 1))
    }
}

/// Why a message or an item could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a header or a declared length needs.
    #[error("truncated: {0}")]
    Truncated(&'static str),
    /// Not an RPC message.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A version this code does not speak.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// A field out of its range (unknown kind or flag, nonzero reserved
    /// field, zero id, ...).
    #[error("invalid field: {0}")]
    BadField(&'static str),
    /// The message length field disagrees with the bytes delivered, or
    /// items do not end exactly at the message's end.
    #[error("length mismatch: {0}")]
    Length(&'static str),
}

/// Encoded size of an item with `payload` bytes and `descs`.
pub fn item_size(payload: usize, descs: &[BulkDesc]) -> usize {
    ITEM_HEADER_SIZE + payload + descs_size(descs)
}

fn descs_size(descs: &[BulkDesc]) -> usize {
    descs.iter().map(|d| DESC_ENTRY_SIZE + d.desc.len()).sum()
}

/// Appends an encoded item to `out`.
///
/// # Errors
/// `BadField` for more than [`MAX_DESCS`] descriptors or one longer than
/// 65535 bytes, `Length` for a payload or descriptor section over 4 GiB.
pub fn encode_item(
    out: &mut Vec<u8>,
    h: &ItemHeader,
    payload: &[u8],
    descs: &[BulkDesc],
) -> Result<(), WireError> {
    if descs.len() > MAX_DESCS {
        return Err(WireError::BadField("too many bulk descriptors"));
    }
    if descs.iter().any(|d| d.desc.len() > usize::from(u16::MAX)) {
        return Err(WireError::BadField("bulk descriptor too long"));
    }
    let plen = u32::try_from(payload.len()).map_err(|_| WireError::Length("payload over 4 GiB"))?;
    let dlen = u32::try_from(descs_size(descs))
        .map_err(|_| WireError::Length("descriptor section over 4 GiB"))?;
    out.reserve(item_size(payload.len(), descs));
    let mut w = Writer::new(out);
    w.put_u8(h.kind.code());
    w.put_u8(h.flags);
    w.put_u8(descs.len() as u8);
    w.put_u8(0);
    w.put_u32(h.opcode);
    w.put_u64(h.session);
    w.put_u64(h.xid);
    w.put_i32(h.status);
    w.put_u32(plen);
    w.put_u32(dlen);
    w.put_u32(h.low_gap);
    w.put_bytes(payload);
    for d in descs {
        w.put_u8(d.kind.code());
        w.put_u8(0);
        w.put_u16(d.desc.len() as u16);
        w.put_zeros(4);
        w.put_u64(d.len);
        w.put_bytes(d.desc.as_bytes());
    }
    Ok(())
}

/// A whole message in a `Vec`: header `h` (its item count and length
/// are set from `items`) and the given encoded items.
pub fn encode_message(h: &MsgHeader, items: &[&[u8]]) -> Vec<u8> {
    let len = MSG_HEADER_SIZE + items.iter().map(|i| i.len()).sum::<usize>();
    let mut out = vec![0u8; MSG_HEADER_SIZE];
    for i in items {
        out.extend_from_slice(i);
    }
    MsgHeader {
        items: items.len() as u16,
        len: len as u32,
        ..*h
    }
    .write(&mut out);
    out
}

/// A decoded item, borrowing the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<'a> {
    /// Its header.
    pub header: ItemHeader,
    /// Its payload.
    pub payload: &'a [u8],
    /// Its bulk descriptors.
    pub descs: Vec<BulkDesc>,
}

/// An item that failed to decode, with whatever of its header could be
/// read (to address an error reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemError {
    /// The failure.
    pub error: WireError,
    /// Kind, session, xid and opcode, when the fixed header was readable
    /// and named a request.
    pub request: Option<(u64, u64, u32)>,
}

/// Iterates over the items of a message, checking everything.
#[derive(Debug)]
pub struct MsgReader<'a> {
    buf: &'a [u8],
    header: MsgHeader,
    off: usize,
    left: u16,
    failed: bool,
}

impl<'a> MsgReader<'a> {
    /// Checks the message header ([`MsgHeader::decode`]).
    ///
    /// # Errors
    /// A [`WireError`] for anything that is not a valid message header, or
    /// a length field that disagrees with `buf`.
    pub fn new(buf: &'a [u8]) -> Result<Self, WireError> {
        let header = MsgHeader::decode(buf)?;
        Ok(Self {
            buf,
            header,
            off: MSG_HEADER_SIZE,
            left: header.items,
            failed: false,
        })
    }

    /// The message header.
    pub fn header(&self) -> &MsgHeader {
        &self.header
    }

    /// Number of items the header announces.
    pub fn announced(&self) -> u16 {
        self.header.items
    }

    fn item(&mut self) -> Result<Item<'a>, ItemError> {
        let mut r = Reader::new(&self.buf[self.off..]);
        let plain = |error| ItemError {
            error,
            request: None,
        };
        let short = |_: Short| plain(WireError::Truncated("item header"));
        let mut h = Reader::new(r.array::<ITEM_HEADER_SIZE>().map_err(short)?);
        let kind = h.u8().map_err(short)?;
        let flags = h.u8().map_err(short)?;
        let ndesc = usize::from(h.u8().map_err(short)?);
        let reserved = h.u8().map_err(short)?;
        let opcode = h.u32().map_err(short)?;
        let session = h.u64().map_err(short)?;
        let xid = h.u64().map_err(short)?;
        let status = h.i32().map_err(short)?;
        let plen = h.u32().map_err(short)? as usize;
        let dlen = h.u32().map_err(short)? as usize;
        let low_gap = h.u32().map_err(short)?;
        let kind = ItemKind::from_code(kind);
        // Only a request of this message's own session, in the client to
        // server direction, is answered with an error reply.
        let request = (kind == Some(ItemKind::Request)
            && !self.header.replies
            && session == self.header.session
            && xid != 0)
            .then_some((session, xid, opcode));
        let fail = |error| ItemError { error, request };
        let Some(kind) = kind else {
            return Err(fail(WireError::BadField("item kind")));
        };
        if reserved != 0 {
            return Err(fail(WireError::BadField("item reserved field")));
        }
        if low_gap != 0 && (kind != ItemKind::Request || u64::from(low_gap) > xid) {
            return Err(fail(WireError::BadField("replied-below gap")));
        }
        if flags & !FLAG_RESEND != 0 || (flags != 0 && kind != ItemKind::Request) {
            return Err(fail(WireError::BadField("item flags")));
        }
        if session != self.header.session {
            return Err(fail(WireError::BadField("item of another session")));
        }
        if (kind == ItemKind::Reply) != self.header.replies {
            return Err(fail(WireError::BadField(
                "item kind against the message direction",
            )));
        }
        if xid == 0 && kind != ItemKind::OneWay {
            return Err(fail(WireError::BadField("zero transaction id")));
        }
        if status != 0 && kind != ItemKind::Reply {
            return Err(fail(WireError::BadField("status on a request")));
        }
        if ndesc > MAX_DESCS || (ndesc > 0 && kind != ItemKind::Request) {
            return Err(fail(WireError::BadField("bulk descriptor count")));
        }
        let truncated = |_: Short| fail(WireError::Truncated("item payload or descriptors"));
        let payload = r.bytes(plen).map_err(truncated)?;
        let section = r.bytes(dlen).map_err(truncated)?;
        let descs = parse_descs(section, ndesc).map_err(fail)?;
        self.off += r.position();
        Ok(Item {
            header: ItemHeader {
                kind,
                flags,
                opcode,
                session,
                xid,
                status,
                low_gap,
            },
            payload,
            descs,
        })
    }
}

fn parse_descs(section: &[u8], n: usize) -> Result<Vec<BulkDesc>, WireError> {
    let mut r = Reader::new(section);
    let short = |_: Short| WireError::Truncated("bulk descriptor entry");
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut e = Reader::new(r.array::<DESC_ENTRY_SIZE>().map_err(short)?);
        let kind = e.u8().map_err(short)?;
        let reserved = e.u8().map_err(short)?;
        let l = e.u16().map_err(short)?;
        let reserved2 = e.u32().map_err(short)?;
        let len = e.u64().map_err(short)?;
        let kind = BulkKind::from_code(kind).ok_or(WireError::BadField("bulk descriptor kind"))?;
        if reserved != 0 || reserved2 != 0 {
            return Err(WireError::BadField("bulk descriptor reserved field"));
        }
        let desc = r
            .bytes(l.into())
            .map_err(|_| WireError::Truncated("bulk descriptor"))?;
        out.push(BulkDesc {
            kind,
            len,
            desc: NetBufDesc::from_bytes(desc.to_vec()),
        });
    }
    if !r.is_empty() {
        return Err(WireError::Length("bulk descriptor section"));
    }
    Ok(out)
}

impl<'a> Iterator for MsgReader<'a> {
    type Item = Result<Item<'a>, ItemError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.left == 0 {
            if self.off != self.buf.len() {
                self.failed = true;
                return Some(Err(ItemError {
                    error: WireError::Length("bytes after the last item"),
                    request: None,
                }));
            }
            return None;
        }
        self.left -= 1;
        let r = self.item();
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }
}

/// Decodes a whole message, stopping at the first malformed item.
///
/// # Errors
/// The header's failure, or the first item's.
pub fn decode_message(buf: &[u8]) -> Result<(MsgHeader, Vec<Item<'_>>), WireError> {
    let r = MsgReader::new(buf)?;
    let h = *r.header();
    let items = r
        .map(|r| r.map_err(|e| e.error))
        .collect::<Result<_, _>>()?;
    Ok((h, items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hdr(kind: ItemKind, xid: u64) -> ItemHeader {
        ItemHeader {
            kind,
            flags: 0,
            opcode: 9,
            session: 0xabc,
            xid,
            status: 0,
            low_gap: 0,
        }
    }

    fn msg_hdr(replies: bool) -> MsgHeader {
        MsgHeader {
            replies,
            session: 0xabc,
            epoch: 7,
            seq: 3,
            low: 2,
            ack: Some((5, 11)),
            ..MsgHeader::default()
        }
    }

    /// A request with a bulk descriptor, then a one-way item.
    fn sample() -> Vec<u8> {
        let mut a = Vec::new();
        let d = BulkDesc {
            kind: BulkKind::Sink,
            len: 4096,
            desc: NetBufDesc::from_bytes(vec![7; 30]),
        };
        encode_item(&mut a, &hdr(ItemKind::Request, 1), b"hello", &[d]).unwrap();
        let mut b = Vec::new();
        encode_item(&mut b, &hdr(ItemKind::OneWay, 0), b"", &[]).unwrap();
        encode_message(&msg_hdr(false), &[&a, &b])
    }

    fn sample_replies() -> Vec<u8> {
        let mut c = Vec::new();
        let mut h = hdr(ItemKind::Reply, 2);
        h.status = -5;
        encode_item(&mut c, &h, &[1, 2, 3], &[]).unwrap();
        encode_message(&msg_hdr(true), &[&c, &c])
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let (h, items) = decode_message(&m).unwrap();
        assert_eq!(
            h,
            MsgHeader {
                items: 2,
                len: m.len() as u32,
                ..msg_hdr(false)
            }
        );
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].payload, b"hello");
        assert_eq!(items[0].descs.len(), 1);
        assert_eq!(items[0].descs[0].len, 4096);
        assert_eq!(items[0].descs[0].kind, BulkKind::Sink);
        assert_eq!(items[1].header.kind, ItemKind::OneWay);
        assert_eq!(
            item_size(5, &items[0].descs) + item_size(0, &[]) + MSG_HEADER_SIZE,
            m.len()
        );
        let r = sample_replies();
        let (h, items) = decode_message(&r).unwrap();
        assert!(h.replies && !h.ack_only);
        assert_eq!(items[1].header.status, -5);
        assert_eq!(items[1].payload, &[1, 2, 3]);
        // An acknowledgement: header only.
        let ack = MsgHeader {
            ack_only: true,
            session: 1,
            epoch: 1,
            ack: Some((3, 4)),
            ..MsgHeader::default()
        };
        let a = encode_message(&ack, &[]);
        assert_eq!(a.len(), MSG_HEADER_SIZE);
        let (h, items) = decode_message(&a).unwrap();
        assert_eq!((h.ack, h.ack_only, items.len()), (Some((3, 4)), true, 0));
        // A probe: no acknowledgement either.
        let probe = encode_message(&MsgHeader { ack: None, ..ack }, &[]);
        assert_eq!(decode_message(&probe).unwrap().0.ack, None);
    }

    fn header_error(m: &[u8]) -> WireError {
        MsgHeader::decode(m).unwrap_err()
    }

    fn set_u64(m: &mut [u8], off: usize, v: u64) {
        m[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn rejects_edits() {
        let m = sample();
        // Every truncation fails.
        for n in 0..m.len() {
            assert!(decode_message(&m[..n]).is_err(), "truncated at {n}");
        }
        let mut bad = m.clone();
        bad[0] ^= 1;
        assert!(matches!(header_error(&bad), WireError::BadMagic(_)));
        let mut bad = m.clone();
        bad[4] = 1;
        assert_eq!(header_error(&bad), WireError::BadVersion(1));
        bad[4] = 2;
        assert_eq!(header_error(&bad), WireError::BadVersion(2));
        let mut bad = m.clone();
        bad.push(0);
        assert!(decode_message(&bad).is_err());
        for (off, v, what) in [
            (16, 0, "zero session id"),
            (24, 0, "zero epoch"),
            (32, 0, "sequence number"),
            (40, 0, "sequence number"),
            (40, 4, "sequence number"),
            (48, 0, "acknowledgement"),
            (56, 0, "acknowledgement"),
        ] {
            let mut bad = m.clone();
            set_u64(&mut bad, off, v);
            assert_eq!(
                header_error(&bad),
                WireError::BadField(what),
                "offset {off}"
            );
        }
        let mut bad = m.clone();
        bad[5] = 8;
        assert_eq!(header_error(&bad), WireError::BadField("message flags"));
        let mut bad = m.clone();
        bad[12] = 1;
        assert_eq!(
            header_error(&bad),
            WireError::BadField("message reserved field")
        );
        let mut bad = m.clone();
        bad[6..8].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(
            header_error(&bad),
            WireError::BadField("message with no item")
        );
        // ACK_ONLY with items, a sequence number or ACK_NOW.
        let mut bad = m.clone();
        bad[5] = MSG_ACK_ONLY;
        assert_eq!(
            header_error(&bad),
            WireError::BadField("acknowledgement-only message")
        );
        let ack = encode_message(
            &MsgHeader {
                ack_only: true,
                session: 1,
                epoch: 1,
                ..MsgHeader::default()
            },
            &[],
        );
        for (off, flag) in [(32, 0), (40, 0), (0, MSG_ACK_NOW)] {
            let mut bad = ack.clone();
            if flag == 0 {
                set_u64(&mut bad, off, 1);
            } else {
                bad[5] |= flag;
            }
            assert_eq!(
                header_error(&bad),
                WireError::BadField("acknowledgement-only message")
            );
        }
        // Item kind 0.
        let mut bad = m.clone();
        bad[MSG_HEADER_SIZE] = 0;
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(e.error, WireError::BadField("item kind"));
        // A request with a bad payload length still names its xid.
        let mut bad = m.clone();
        bad[MSG_HEADER_SIZE + 28..MSG_HEADER_SIZE + 32].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(e.request, Some((0xabc, 1, 9)));
        // An item of another session is refused, and not answered.
        let mut bad = m.clone();
        set_u64(&mut bad, MSG_HEADER_SIZE + 8, 0xabd);
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(
            (e.error, e.request),
            (WireError::BadField("item of another session"), None)
        );
        // A request in a REPLIES message, a reply in a request message.
        let mut bad = m.clone();
        bad[5] |= MSG_REPLIES;
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(
            (e.error, e.request),
            (
                WireError::BadField("item kind against the message direction"),
                None
            )
        );
        let mut bad = sample_replies();
        bad[5] &= !MSG_REPLIES;
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(
            e.error,
            WireError::BadField("item kind against the message direction")
        );
        // A replied-below gap beyond the request's xid, or on another kind.
        let mut bad = m.clone();
        bad[MSG_HEADER_SIZE + 36..MSG_HEADER_SIZE + 40].copy_from_slice(&2u32.to_le_bytes());
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(e.error, WireError::BadField("replied-below gap"));
        let mut bad = sample_replies();
        bad[MSG_HEADER_SIZE + 36] = 1;
        let e = MsgReader::new(&bad).unwrap().next().unwrap().unwrap_err();
        assert_eq!(e.error, WireError::BadField("replied-below gap"));
        // Items before a malformed one are delivered.
        let mut bad = m.clone();
        let second = MSG_HEADER_SIZE + item_size(5, &decode_message(&m).unwrap().1[0].descs);
        bad[second + 3] = 1;
        let got: Vec<_> = MsgReader::new(&bad).unwrap().collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok() && got[1].is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(r) = MsgReader::new(&data) {
                for _ in r {}
            }
        }

        #[test]
        fn mutated_messages_never_panic(
            pos in 0usize..200, byte in any::<u8>(), cut in 0usize..200, replies in any::<bool>()
        ) {
            let mut m = if replies { sample_replies() } else { sample() };
            let p = pos % m.len();
            m[p] = byte;
            m.truncate(m.len() - cut % m.len());
            if let Ok(r) = MsgReader::new(&m) {
                for _ in r {}
            }
        }

        #[test]
        fn replied_below_never_overflows(
            xid in prop_oneof![Just(u64::MAX), Just(1u64), any::<u64>()], gap in any::<u32>()
        ) {
            // The fuzzer's find: xid u64::MAX with a gap overflowed.
            let h = ItemHeader { low_gap: gap, ..hdr(ItemKind::Request, xid) };
            if let Some(low) = h.replied_below() {
                prop_assert!(low >= 1 && low <= xid);
            }
        }

        #[test]
        fn replied_below_round_trips(xid in 1u64.., back in any::<u64>(), kind in 1u8..=3) {
            let kind = ItemKind::from_code(kind).unwrap();
            let low = xid - back % xid; // 1..=xid
            let gap = ItemHeader::gap_for(xid, low);
            let h = ItemHeader { low_gap: if kind == ItemKind::Request { gap } else { 0 }, ..hdr(kind, xid) };
            let mut it = Vec::new();
            encode_item(&mut it, &h, b"", &[]).unwrap();
            let m = encode_message(&msg_hdr(kind == ItemKind::Reply), &[&it]);
            let (_, items) = decode_message(&m).unwrap();
            prop_assert_eq!(items[0].header, h);
            let fits = xid - low < u64::from(u32::MAX);
            let want = (kind == ItemKind::Request && fits).then_some(low);
            prop_assert_eq!(h.replied_below(), want);
        }

        #[test]
        fn headers_round_trip(
            replies in any::<bool>(), ack_now in any::<bool>(), session in 1u64..,
            epoch in 1u64.., seq in 1u64.., low_back in any::<u64>(),
            ack in proptest::option::of((1u64.., 1u64..)),
        ) {
            let h = MsgHeader {
                replies,
                ack_now,
                session,
                epoch,
                seq,
                low: seq - low_back % seq,
                ack,
                ..MsgHeader::default()
            };
            let mut it = Vec::new();
            let kind = if replies { ItemKind::Reply } else { ItemKind::OneWay };
            encode_item(&mut it, &ItemHeader { session, ..hdr(kind, 1) }, b"x", &[]).unwrap();
            let m = encode_message(&h, &[&it]);
            let (got, items) = decode_message(&m).unwrap();
            prop_assert_eq!(got, MsgHeader { items: 1, len: m.len() as u32, ..h });
            prop_assert_eq!(items.len(), 1);
        }
    }
}
