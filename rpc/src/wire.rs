//! The RPC wire format: fixed little-endian headers, checked once on
//! receipt.
//!
//! One network message carries one or more *items* (requests, replies,
//! one-way items), packed back to back after a message header:
//!
//! ```text
//! message header (16 bytes)
//! off size field
//!   0    4  magic "CRPC" (0x4350_5243 little-endian)
//!   4    1  version (1)
//!   5    1  flags (0; no flag is defined)
//!   6    2  item count N (at least 1)
//!   8    4  message length in bytes, this header included; must equal the
//!           length the transport delivered
//!  12    4  reserved (0)
//!
//! item header (40 bytes), N times, each followed by its payload and its
//! bulk descriptor section
//! off size field
//!   0    1  kind: 1 request, 2 reply, 3 one-way
//!   1    1  flags: bit 0 = resent request (others 0)
//!   2    1  number of bulk descriptors K (at most 16; 0 on replies and
//!           one-way items)
//!   3    1  reserved (0)
//!   4    4  opcode
//!   8    8  session id (nonzero)
//!  16    8  transaction id (xid; nonzero on requests and replies)
//!  24    4  status, i32: 0 on requests and one-way items; on replies 0 for
//!           success, else the failure (negative errno or handler code)
//!  28    4  payload length P
//!  32    4  bulk descriptor section length D
//!  36    4  reserved (0)
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
//! its message; the items before it are still delivered.

use colibri_net::NetBufDesc;

/// Magic number at the start of every RPC message ("CRPC").
pub const MAGIC: u32 = u32::from_le_bytes(*b"CRPC");
/// Version of the wire format.
pub const VERSION: u8 = 1;
/// Size of the message header.
pub const MSG_HEADER_SIZE: usize = 16;
/// Size of an item header.
pub const ITEM_HEADER_SIZE: usize = 40;
/// Size of a bulk descriptor entry's fixed part.
pub const DESC_ENTRY_SIZE: usize = 16;
/// Most bulk descriptors one request carries.
pub const MAX_DESCS: usize = 16;
/// Flag of a resent request.
pub const FLAG_RESEND: u8 = 1;

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

fn u16_at(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[off..off + 2]);
    u16::from_le_bytes(a)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
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
    out.push(h.kind.code());
    out.push(h.flags);
    out.push(descs.len() as u8);
    out.push(0);
    out.extend_from_slice(&h.opcode.to_le_bytes());
    out.extend_from_slice(&h.session.to_le_bytes());
    out.extend_from_slice(&h.xid.to_le_bytes());
    out.extend_from_slice(&h.status.to_le_bytes());
    out.extend_from_slice(&plen.to_le_bytes());
    out.extend_from_slice(&dlen.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(payload);
    for d in descs {
        out.push(d.kind.code());
        out.push(0);
        out.extend_from_slice(&(d.desc.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&d.len.to_le_bytes());
        out.extend_from_slice(d.desc.as_bytes());
    }
    Ok(())
}

/// Writes a message header for `nitems` items and `len` bytes in all into
/// the first [`MSG_HEADER_SIZE`] bytes of `dst`.
///
/// # Panics
/// If `dst` is shorter than the header (a bug of the caller).
pub fn write_msg_header(dst: &mut [u8], nitems: u16, len: u32) {
    dst[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    dst[4] = VERSION;
    dst[5] = 0;
    dst[6..8].copy_from_slice(&nitems.to_le_bytes());
    dst[8..12].copy_from_slice(&len.to_le_bytes());
    dst[12..16].copy_from_slice(&0u32.to_le_bytes());
}

/// A whole message in a `Vec`: header and the given encoded items.
pub fn encode_message(items: &[&[u8]]) -> Vec<u8> {
    let len = MSG_HEADER_SIZE + items.iter().map(|i| i.len()).sum::<usize>();
    let mut out = vec![0u8; MSG_HEADER_SIZE];
    for i in items {
        out.extend_from_slice(i);
    }
    write_msg_header(&mut out, items.len() as u16, len as u32);
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
    off: usize,
    left: u16,
    failed: bool,
}

impl<'a> MsgReader<'a> {
    /// Checks the message header.
    ///
    /// # Errors
    /// A [`WireError`] for anything that is not a valid message header, or
    /// a length field that disagrees with `buf`.
    pub fn new(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < MSG_HEADER_SIZE {
            return Err(WireError::Truncated("message header"));
        }
        let magic = u32_at(buf, 0);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if buf[4] != VERSION {
            return Err(WireError::BadVersion(buf[4]));
        }
        if buf[5] != 0 {
            return Err(WireError::BadField("message flags"));
        }
        let n = u16_at(buf, 6);
        if n == 0 {
            return Err(WireError::BadField("message with no item"));
        }
        if u32_at(buf, 8) as usize != buf.len() {
            return Err(WireError::Length("message length field"));
        }
        if u32_at(buf, 12) != 0 {
            return Err(WireError::BadField("message reserved field"));
        }
        Ok(Self {
            buf,
            off: MSG_HEADER_SIZE,
            left: n,
            failed: false,
        })
    }

    /// Number of items the header announces.
    pub fn announced(&self) -> u16 {
        u16_at(self.buf, 6)
    }

    fn item(&mut self) -> Result<Item<'a>, ItemError> {
        let b = &self.buf[self.off..];
        let plain = |error| ItemError {
            error,
            request: None,
        };
        if b.len() < ITEM_HEADER_SIZE {
            return Err(plain(WireError::Truncated("item header")));
        }
        let kind = ItemKind::from_code(b[0]);
        let session = u64_at(b, 8);
        let xid = u64_at(b, 16);
        let opcode = u32_at(b, 4);
        let request = (kind == Some(ItemKind::Request) && session != 0 && xid != 0)
            .then_some((session, xid, opcode));
        let fail = |error| ItemError { error, request };
        let Some(kind) = kind else {
            return Err(fail(WireError::BadField("item kind")));
        };
        let flags = b[1];
        let ndesc = usize::from(b[2]);
        if b[3] != 0 || u32_at(b, 36) != 0 {
            return Err(fail(WireError::BadField("item reserved field")));
        }
        if flags & !FLAG_RESEND != 0 || (flags != 0 && kind != ItemKind::Request) {
            return Err(fail(WireError::BadField("item flags")));
        }
        if session == 0 {
            return Err(fail(WireError::BadField("zero session id")));
        }
        if xid == 0 && kind != ItemKind::OneWay {
            return Err(fail(WireError::BadField("zero transaction id")));
        }
        let status = u32_at(b, 24) as i32;
        if status != 0 && kind != ItemKind::Reply {
            return Err(fail(WireError::BadField("status on a request")));
        }
        if ndesc > MAX_DESCS || (ndesc > 0 && kind != ItemKind::Request) {
            return Err(fail(WireError::BadField("bulk descriptor count")));
        }
        let plen = u32_at(b, 28) as usize;
        let dlen = u32_at(b, 32) as usize;
        let body = &b[ITEM_HEADER_SIZE..];
        if plen > body.len() || dlen > body.len() - plen {
            return Err(fail(WireError::Truncated("item payload or descriptors")));
        }
        let payload = &body[..plen];
        let descs = parse_descs(&body[plen..plen + dlen], ndesc).map_err(fail)?;
        self.off += ITEM_HEADER_SIZE + plen + dlen;
        Ok(Item {
            header: ItemHeader {
                kind,
                flags,
                opcode,
                session,
                xid,
                status,
            },
            payload,
            descs,
        })
    }
}

fn parse_descs(mut b: &[u8], n: usize) -> Result<Vec<BulkDesc>, WireError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if b.len() < DESC_ENTRY_SIZE {
            return Err(WireError::Truncated("bulk descriptor entry"));
        }
        let kind = BulkKind::from_code(b[0]).ok_or(WireError::BadField("bulk descriptor kind"))?;
        if b[1] != 0 || u32_at(b, 4) != 0 {
            return Err(WireError::BadField("bulk descriptor reserved field"));
        }
        let l = usize::from(u16_at(b, 2));
        let len = u64_at(b, 8);
        let rest = &b[DESC_ENTRY_SIZE..];
        if l > rest.len() {
            return Err(WireError::Truncated("bulk descriptor"));
        }
        out.push(BulkDesc {
            kind,
            len,
            desc: NetBufDesc::from_bytes(rest[..l].to_vec()),
        });
        b = &rest[l..];
    }
    if !b.is_empty() {
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
pub fn decode_message(buf: &[u8]) -> Result<Vec<Item<'_>>, WireError> {
    MsgReader::new(buf)?
        .map(|r| r.map_err(|e| e.error))
        .collect()
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
        }
    }

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
        let mut c = Vec::new();
        let mut h = hdr(ItemKind::Reply, 2);
        h.status = -5;
        encode_item(&mut c, &h, &[1, 2, 3], &[]).unwrap();
        encode_message(&[&a, &b, &c])
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let items = decode_message(&m).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].payload, b"hello");
        assert_eq!(items[0].descs.len(), 1);
        assert_eq!(items[0].descs[0].len, 4096);
        assert_eq!(items[0].descs[0].kind, BulkKind::Sink);
        assert_eq!(items[1].header.kind, ItemKind::OneWay);
        assert_eq!(items[2].header.status, -5);
        assert_eq!(items[2].payload, &[1, 2, 3]);
        assert_eq!(
            item_size(5, &items[0].descs) + item_size(0, &[]) + item_size(3, &[]) + MSG_HEADER_SIZE,
            m.len()
        );
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
        assert!(matches!(decode_message(&bad), Err(WireError::BadMagic(_))));
        let mut bad = m.clone();
        bad[4] = 2;
        assert_eq!(decode_message(&bad), Err(WireError::BadVersion(2)));
        let mut bad = m.clone();
        bad.push(0);
        assert!(decode_message(&bad).is_err());
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
        // Items before a malformed one are delivered.
        let mut bad = m.clone();
        let second = MSG_HEADER_SIZE + item_size(5, &decode_message(&m).unwrap()[0].descs);
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
            pos in 0usize..200, byte in any::<u8>(), cut in 0usize..200
        ) {
            let mut m = sample();
            let p = pos % m.len();
            m[p] = byte;
            m.truncate(m.len() - cut % m.len());
            if let Ok(r) = MsgReader::new(&m) {
                for _ in r {}
            }
        }
    }
}
