//! The wire format: a fixed little-endian frame header, and the encoding of
//! a failure status carried in a response body.
//!
//! Every frame is a [`HEADER_LEN`]-byte header followed by `body_len` bytes
//! of body: first `desc_len` bytes of buffer descriptor (bulk requests
//! only), then data (a message, a bulk chunk) or, in a failed response, the
//! encoded status detail ([`encode_status`]).
//!
//! ```text
//! off  size  field
//!   0     4  magic "CLTP" (0x5054_4c43)
//!   4     1  version (2)
//!   5     1  opcode (Opcode)
//!   6     1  queue: the requester's active queue code (GET, PUT), else 0
//!   7     1  flags: bit 0 LAST (last chunk of a bulk transfer, GET, PUT and
//!            GET_DATA only); bit 1 ACKS (MSG only: the frame also
//!            acknowledges a message of its receiver's, see `offset`)
//!   8     8  xid: transfer id chosen by the requester, echoed in responses
//!  16     8  offset of the chunk in the transfer (bulk); in a MSG with
//!            ACKS, the xid of the receiver's message it acknowledges as
//!            taken (what a MSG_ACK with status 0 says); else 0
//!  24     8  total: message length (MSG), active buffer capacity (GET),
//!            bytes to write (PUT), transfer length (GET_DATA), else 0
//!  32     4  chunk: bytes asked for (GET), bytes carried (GET_DATA), else 0
//!  36     4  body_len: bytes following the header
//!  40     2  desc_len: descriptor bytes at the start of the body
//!  42     2  status: 0, or the failure code of a response or abort
//!  44     4  sender IPv4 (network order)
//!  48     4  sender service
//!  52     2  sender port
//!  54     2  receiver port
//!  56     4  receiver IPv4 (network order)
//!  60     4  receiver service
//!  64     4  CRC-32C of bytes 0..64
//! ```
//!
//! The checksum covers the header only: the body's integrity is TCP's, and
//! checksumming bulk data in software would halve the bandwidth.
//! [`Header::decode`] checks every field before anything uses it, including
//! the per-opcode rules (which fields must be zero, how the lengths relate,
//! that offsets do not overflow); a frame that fails them is a protocol
//! error and its connection is closed.

use std::net::Ipv4Addr;

use colibri_net::checksum::crc32c_fixed;
use colibri_net::{NetError, QueueType};
use colibri_wire::{Reader, Short, Writer};

use crate::addr::TcpAddr;

/// Magic number at the start of every frame ("CLTP").
pub const MAGIC: u32 = u32::from_le_bytes(*b"CLTP");
/// Current wire version (2: MSG frames may carry an acknowledgement,
/// [`FLAG_ACKS`]).
pub const VERSION: u8 = 2;
/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 68;
/// Flag: the last chunk of a bulk transfer.
pub const FLAG_LAST: u8 = 1;
/// Flag (MSG only): the frame also acknowledges, with success, the message
/// of its receiver's whose xid is in `offset`, as a MSG_ACK with status 0
/// would. A successful MSG_ACK waiting to be written when a message leaves
/// on the same connection rides in that message's header instead: a
/// request-response exchange then writes one frame per direction.
pub const FLAG_ACKS: u8 = 2;
/// Largest status detail body a response may carry.
pub const MAX_DETAIL: u32 = 4096;

/// Frame types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// A message for the receiver's MSG_RECV queue. Answered by `MsgAck`.
    Msg = 1,
    /// Whether the receiver took a message.
    MsgAck = 2,
    /// Asks a chunk of a passive send buffer. Answered by `GetData`.
    Get = 3,
    /// A chunk of a passive send buffer, or the failure of a GET.
    GetData = 4,
    /// A chunk for a passive receive buffer. The last one (or a failed
    /// one) is answered by `PutAck`.
    Put = 5,
    /// The outcome of a PUT transfer.
    PutAck = 6,
    /// The requester gave up a bulk transfer (timeout, stop with abort);
    /// the status says why.
    Abort = 7,
}

impl Opcode {
    /// The opcode of a wire byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Msg,
            2 => Self::MsgAck,
            3 => Self::Get,
            4 => Self::GetData,
            5 => Self::Put,
            6 => Self::PutAck,
            7 => Self::Abort,
            _ => return None,
        })
    }

    /// True for the frames a requester sends (MSG, GET, PUT, ABORT); the
    /// others are responses.
    pub fn is_request(self) -> bool {
        matches!(self, Self::Msg | Self::Get | Self::Put | Self::Abort)
    }
}

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame type.
    pub opcode: Opcode,
    /// Requester's active queue code (GET and PUT), else 0.
    pub queue: u8,
    /// Flags ([`FLAG_LAST`], [`FLAG_ACKS`]).
    pub flags: u8,
    /// Transfer id.
    pub xid: u64,
    /// Chunk offset.
    pub offset: u64,
    /// Message length, capacity, or transfer length (see the table).
    pub total: u64,
    /// Chunk length asked for (GET) or carried (GET_DATA).
    pub chunk: u32,
    /// Body bytes following the header.
    pub body_len: u32,
    /// Descriptor bytes at the start of the body.
    pub desc_len: u16,
    /// 0, or a failure code ([`encode_status`]).
    pub status: u16,
    /// Address of the sending transfer machine.
    pub sender: TcpAddr,
    /// Address of the receiving transfer machine.
    pub receiver: TcpAddr,
}

fn proto(why: impl Into<String>) -> NetError {
    NetError::Protocol(why.into())
}

fn u16_at(f: &[u8; HEADER_LEN - 4], at: usize) -> u16 {
    u16::from_le_bytes(*f[at..].first_chunk().expect("in the header"))
}

fn u32_at(f: &[u8; HEADER_LEN - 4], at: usize) -> u32 {
    u32::from_le_bytes(*f[at..].first_chunk().expect("in the header"))
}

fn u64_at(f: &[u8; HEADER_LEN - 4], at: usize) -> u64 {
    u64::from_le_bytes(*f[at..].first_chunk().expect("in the header"))
}

/// The error of a field that must be zero in `op`'s frames.
#[cold]
fn must_be_zero(what: &str, op: Opcode) -> NetError {
    proto(format!("{what} must be 0 in {op:?}"))
}

impl Header {
    /// A header with every optional field zero.
    pub fn new(opcode: Opcode, xid: u64, sender: TcpAddr, receiver: TcpAddr) -> Self {
        Self {
            opcode,
            queue: 0,
            flags: 0,
            xid,
            offset: 0,
            total: 0,
            chunk: 0,
            body_len: 0,
            desc_len: 0,
            status: 0,
            sender,
            receiver,
        }
    }

    /// True when the LAST flag is set.
    pub fn is_last(&self) -> bool {
        self.flags & FLAG_LAST != 0
    }

    /// The xid of the message this MSG frame acknowledges ([`FLAG_ACKS`]).
    pub fn acks(&self) -> Option<u64> {
        (self.flags & FLAG_ACKS != 0).then_some(self.offset)
    }

    /// Data bytes of the body (after the descriptor).
    pub fn data_len(&self) -> u32 {
        self.body_len - u32::from(self.desc_len)
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut w = Writer::new([0u8; HEADER_LEN]);
        w.put_u32(MAGIC);
        w.put_u8(VERSION);
        w.put_u8(self.opcode as u8);
        w.put_u8(self.queue);
        w.put_u8(self.flags);
        w.put_u64(self.xid);
        w.put_u64(self.offset);
        w.put_u64(self.total);
        w.put_u32(self.chunk);
        w.put_u32(self.body_len);
        w.put_u16(self.desc_len);
        w.put_u16(self.status);
        w.put_bytes(&self.sender.ip.octets());
        w.put_u32(self.sender.service);
        w.put_u16(self.sender.port);
        w.put_u16(self.receiver.port);
        w.put_bytes(&self.receiver.ip.octets());
        w.put_u32(self.receiver.service);
        let mut out = w.into_inner();
        let (fields, crc) = out.split_at_mut(HEADER_LEN - 4);
        let fields: &[u8; HEADER_LEN - 4] = (&*fields)
            .try_into()
            .expect("the header minus its checksum");
        crc.copy_from_slice(&crc32c_fixed(fields).to_le_bytes());
        out
    }

    /// Decodes and validates a header. `max_body` bounds the body of data
    /// frames (the receiver's largest buffer plus descriptor).
    ///
    /// # Errors
    /// `Protocol` naming the first field found wrong.
    pub fn decode(b: &[u8], max_body: u32) -> Result<Self, NetError> {
        let head = b
            .first_chunk::<HEADER_LEN>()
            .ok_or_else(|| proto("short header"))?;
        let (f, crc) = head
            .split_first_chunk::<{ HEADER_LEN - 4 }>()
            .expect("fits");
        if u32_at(f, 0) != MAGIC {
            return Err(proto("bad magic"));
        }
        if u32::from_le_bytes(*crc.first_chunk::<4>().expect("fits")) != crc32c_fixed(f) {
            return Err(proto("header checksum mismatch"));
        }
        let version = f[4];
        if version != VERSION {
            return Err(proto(format!("unsupported version {version}")));
        }
        let op = f[5];
        let opcode = Opcode::from_u8(op).ok_or_else(|| proto(format!("unknown opcode {op}")))?;
        let h = Self::read_fields(opcode, f);
        h.validate(max_body)?;
        Ok(h)
    }

    /// Reads the fields after the opcode (offsets 6 to 64) at their fixed
    /// offsets (the header's size is known: no bounds check per field).
    #[inline]
    fn read_fields(opcode: Opcode, f: &[u8; HEADER_LEN - 4]) -> Self {
        let ip = |at: usize| Ipv4Addr::from(*f[at..].first_chunk::<4>().expect("in the header"));
        Self {
            opcode,
            queue: f[6],
            flags: f[7],
            xid: u64_at(f, 8),
            offset: u64_at(f, 16),
            total: u64_at(f, 24),
            chunk: u32_at(f, 32),
            body_len: u32_at(f, 36),
            desc_len: u16_at(f, 40),
            status: u16_at(f, 42),
            sender: TcpAddr {
                ip: ip(44),
                service: u32_at(f, 48),
                port: u16_at(f, 52),
            },
            receiver: TcpAddr {
                ip: ip(56),
                service: u32_at(f, 60),
                port: u16_at(f, 54),
            },
        }
    }

    /// True when `offset + len` neither overflows nor passes `total`.
    fn end_ok(&self, len: u64) -> bool {
        self.offset
            .checked_add(len)
            .is_some_and(|end| end <= self.total)
    }

    fn validate(&self, max_body: u32) -> Result<(), NetError> {
        use Opcode::*;
        let desc = u32::from(self.desc_len);
        if desc > self.body_len {
            return Err(proto("descriptor longer than the body"));
        }
        if self.status != 0 && !(MIN_STATUS..=MAX_STATUS).contains(&self.status) {
            return Err(proto(format!("unknown status {}", self.status)));
        }
        let allowed = match self.opcode {
            Get | GetData | Put => FLAG_LAST,
            Msg => FLAG_ACKS,
            _ => 0,
        };
        if self.flags & !allowed != 0 {
            return Err(proto("unknown flags"));
        }
        let want_queue = match self.opcode {
            Get => QueueType::ActiveBulkRecv.code(),
            Put => QueueType::ActiveBulkSend.code(),
            _ => 0,
        };
        if self.queue != want_queue {
            return Err(proto("queue does not match the opcode"));
        }
        let failed = self.status != 0;
        // Each rule is a plain comparison; the message is built only for
        // a frame that breaks one (no closure or allocation per field on
        // the good path).
        match self.opcode {
            Msg => {
                if desc != 0 {
                    return Err(must_be_zero("desc_len", self.opcode));
                }
                if failed {
                    return Err(must_be_zero("status", self.opcode));
                }
                // Transfer ids start at 1.
                if (self.offset != 0) != (self.flags & FLAG_ACKS != 0) {
                    return Err(proto(
                        "offset must name the acknowledged message with ACKS, else be 0 in Msg",
                    ));
                }
                if self.chunk != 0 {
                    return Err(must_be_zero("chunk", self.opcode));
                }
                if self.body_len == 0 || u64::from(self.body_len) != self.total {
                    return Err(proto("message length does not match the body"));
                }
                if self.body_len > max_body {
                    return Err(proto("message larger than any buffer"));
                }
            }
            MsgAck | PutAck | Abort => {
                if desc != 0 {
                    return Err(must_be_zero("desc_len", self.opcode));
                }
                if self.offset != 0 {
                    return Err(must_be_zero("offset", self.opcode));
                }
                if self.total != 0 {
                    return Err(must_be_zero("total", self.opcode));
                }
                if self.chunk != 0 {
                    return Err(must_be_zero("chunk", self.opcode));
                }
                if self.opcode == Abort && !failed {
                    return Err(proto("abort without a status"));
                }
                if !failed {
                    if self.body_len != 0 {
                        return Err(must_be_zero("body_len", self.opcode));
                    }
                } else if self.body_len > MAX_DETAIL {
                    return Err(proto("status detail too long"));
                }
            }
            Get => {
                if failed {
                    return Err(must_be_zero("status", self.opcode));
                }
                if desc == 0 || self.body_len != desc {
                    return Err(proto("GET must carry a descriptor and nothing else"));
                }
                if self.chunk == 0 || !self.end_ok(self.chunk.into()) {
                    return Err(proto("GET chunk outside the transfer"));
                }
            }
            GetData => {
                if desc != 0 {
                    return Err(must_be_zero("desc_len", self.opcode));
                }
                if failed {
                    if self.chunk != 0 {
                        return Err(must_be_zero("chunk", self.opcode));
                    }
                    if self.body_len > MAX_DETAIL {
                        return Err(proto("status detail too long"));
                    }
                } else {
                    if self.chunk == 0 || self.body_len != self.chunk {
                        return Err(proto("GET_DATA chunk does not match the body"));
                    }
                    if self.body_len > max_body || !self.end_ok(self.chunk.into()) {
                        return Err(proto("GET_DATA chunk outside the transfer"));
                    }
                }
            }
            Put => {
                if failed {
                    return Err(must_be_zero("status", self.opcode));
                }
                if self.chunk != 0 {
                    return Err(must_be_zero("chunk", self.opcode));
                }
                let data = self.body_len - desc;
                if desc == 0 || data == 0 {
                    return Err(proto("PUT must carry a descriptor and data"));
                }
                if self.body_len > max_body || !self.end_ok(data.into()) {
                    return Err(proto("PUT chunk outside the transfer"));
                }
            }
        }
        Ok(())
    }
}

// Status codes of failed responses. 0 is success.
const S_CANCELLED: u16 = 1;
const S_TIMED_OUT: u16 = 2;
const S_NO_BUFFERS: u16 = 3;
const S_MSG_TOO_LARGE: u16 = 4;
const S_TOO_BIG: u16 = 5;
const S_UNREACHABLE: u16 = 6;
const S_CONN_RESET: u16 = 7;
const S_WRONG_QUEUE: u16 = 8;
const S_ACCESS_DENIED: u16 = 9;
const S_NO_ENTRY: u16 = 10;
const S_INVALID_DESC: u16 = 11;
const S_BUSY: u16 = 12;
const S_PROTOCOL: u16 = 13;
const S_OTHER: u16 = 14;
const MIN_STATUS: u16 = S_CANCELLED;
const MAX_STATUS: u16 = S_OTHER;

/// Longest text in a status detail.
const MAX_TEXT: usize = 1024;

fn put_str(out: &mut Writer<&mut Vec<u8>>, s: &str) {
    // Details are bounded; longer texts are cut at a character boundary.
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.put_u16(end as u16);
    out.put_bytes(&s.as_bytes()[..end]);
}

/// Encodes a failure as a status code and a detail body, so that the peer
/// completes its buffer with an equal [`NetError`].
pub fn encode_status(e: &NetError) -> (u16, Vec<u8>) {
    let mut detail = Vec::new();
    let mut d = Writer::new(&mut detail);
    let code = match e {
        NetError::Cancelled => S_CANCELLED,
        NetError::TimedOut => S_TIMED_OUT,
        NetError::NoBuffers => S_NO_BUFFERS,
        NetError::MessageTooLarge { len, space } => {
            d.put_u64(*len as u64);
            d.put_u64(*space as u64);
            S_MSG_TOO_LARGE
        }
        NetError::TooBig(s) => {
            put_str(&mut d, s);
            S_TOO_BIG
        }
        NetError::Unreachable(s) => {
            put_str(&mut d, s);
            S_UNREACHABLE
        }
        NetError::ConnectionReset(s) => {
            put_str(&mut d, s);
            S_CONN_RESET
        }
        NetError::WrongQueue { passive, active } => {
            d.put_u8(passive.code());
            d.put_u8(active.code());
            S_WRONG_QUEUE
        }
        NetError::AccessDenied { requester, allowed } => {
            put_str(&mut d, requester);
            put_str(&mut d, allowed);
            S_ACCESS_DENIED
        }
        NetError::NoEntry => S_NO_ENTRY,
        NetError::InvalidDescriptor(s) => {
            put_str(&mut d, s);
            S_INVALID_DESC
        }
        NetError::Busy(s) => {
            put_str(&mut d, s);
            S_BUSY
        }
        NetError::Protocol(s) => {
            put_str(&mut d, s);
            S_PROTOCOL
        }
        NetError::Io { message, .. } => {
            put_str(&mut d, message);
            S_OTHER
        }
        other => {
            put_str(&mut d, &other.to_string());
            S_OTHER
        }
    };
    (code, detail)
}

/// Reads a status detail; every short read is a truncated detail.
struct Detail<'a>(Reader<'a>);

fn truncated(_: Short) -> NetError {
    proto("truncated status detail")
}

impl Detail<'_> {
    fn u64(&mut self) -> Result<u64, NetError> {
        self.0.u64().map_err(truncated)
    }
    fn str(&mut self) -> Result<String, NetError> {
        let n = usize::from(self.0.u16().map_err(truncated)?);
        if n > MAX_TEXT {
            return Err(proto("status detail text too long"));
        }
        let s = self.0.bytes(n).map_err(truncated)?;
        String::from_utf8(s.to_vec()).map_err(|_| proto("status detail is not UTF-8"))
    }
    fn queue(&mut self) -> Result<QueueType, NetError> {
        let c = self.0.u8().map_err(truncated)?;
        QueueType::from_code(c).ok_or_else(|| proto("bad queue code in status detail"))
    }
    fn end(self) -> Result<(), NetError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(proto("trailing bytes in status detail"))
        }
    }
}

/// Decodes a failure status sent by the peer.
///
/// # Errors
/// `Protocol` when the code is unknown or the detail malformed.
pub fn decode_status(code: u16, detail: &[u8]) -> Result<NetError, NetError> {
    let mut r = Detail(Reader::new(detail));
    let e = match code {
        S_CANCELLED => NetError::Cancelled,
        S_TIMED_OUT => NetError::TimedOut,
        S_NO_BUFFERS => NetError::NoBuffers,
        S_MSG_TOO_LARGE => {
            let len = r.u64()?;
            let space = r.u64()?;
            NetError::MessageTooLarge {
                len: usize::try_from(len).map_err(|_| proto("length out of range"))?,
                space: usize::try_from(space).map_err(|_| proto("length out of range"))?,
            }
        }
        S_TOO_BIG => NetError::TooBig(r.str()?),
        S_UNREACHABLE => NetError::Unreachable(r.str()?),
        S_CONN_RESET => NetError::ConnectionReset(r.str()?),
        S_WRONG_QUEUE => NetError::WrongQueue {
            passive: r.queue()?,
            active: r.queue()?,
        },
        S_ACCESS_DENIED => NetError::AccessDenied {
            requester: r.str()?,
            allowed: r.str()?,
        },
        S_NO_ENTRY => NetError::NoEntry,
        S_INVALID_DESC => NetError::InvalidDescriptor(r.str()?),
        S_BUSY => NetError::Busy(r.str()?),
        S_PROTOCOL => NetError::Protocol(r.str()?),
        S_OTHER => NetError::Io {
            kind: std::io::ErrorKind::Other,
            message: r.str()?,
        },
        c => return Err(proto(format!("unknown status {c}"))),
    };
    r.end()?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use colibri_net::checksum::crc32c;
    use proptest::prelude::*;

    fn addr(s: &str) -> TcpAddr {
        TcpAddr::parse(s).unwrap()
    }

    fn msg(len: u32) -> Header {
        let mut h = Header::new(Opcode::Msg, 7, addr("127.0.0.1:5:1"), addr("127.0.0.2:6:2"));
        h.total = len.into();
        h.body_len = len;
        h
    }

    #[test]
    fn round_trip() {
        let h = msg(100);
        let b = h.encode();
        assert_eq!(Header::decode(&b, 1000).unwrap(), h);
        let mut g = Header::new(Opcode::Get, 9, addr("1.2.3.4:1:1"), addr("5.6.7.8:2:3"));
        g.queue = QueueType::ActiveBulkRecv.code();
        g.flags = FLAG_LAST;
        g.offset = 4096;
        g.total = 8192;
        g.chunk = 4096;
        g.desc_len = 80;
        g.body_len = 80;
        assert_eq!(Header::decode(&g.encode(), 1 << 20).unwrap(), g);
    }

    #[test]
    fn every_field_is_checked() {
        let good = msg(100).encode();
        // Any single bit flip is caught (by the checksum if nothing else).
        for i in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut b = good;
                b[i] ^= 1 << bit;
                assert!(Header::decode(&b, 1000).is_err(), "byte {i} bit {bit}");
            }
        }
        assert!(Header::decode(&good[..10], 1000).is_err());
        // Structurally wrong frames with a valid checksum.
        assert!(
            Header::decode(&msg(2000).encode(), 1000).is_err(),
            "too large"
        );
        let mut h = msg(10);
        h.total = 11;
        assert!(Header::decode(&h.encode(), 1000).is_err());
        let mut h = msg(10);
        h.flags = FLAG_LAST;
        assert!(Header::decode(&h.encode(), 1000).is_err());
        let mut h = msg(10);
        h.status = 99;
        assert!(Header::decode(&h.encode(), 1000).is_err());
        // ACKS: on MSG only, and then with the acknowledged xid in
        // `offset` (which is 0 otherwise).
        let mut h = msg(10);
        h.flags = FLAG_ACKS;
        h.offset = 7;
        assert_eq!(Header::decode(&h.encode(), 1000).unwrap().acks(), Some(7));
        h.offset = 0;
        assert!(Header::decode(&h.encode(), 1000).is_err(), "ACKS of xid 0");
        let mut h = msg(10);
        h.offset = 7;
        assert!(
            Header::decode(&h.encode(), 1000).is_err(),
            "offset without ACKS"
        );
        let mut h = Header::new(Opcode::MsgAck, 1, addr("1.1.1.1:1:1"), addr("1.1.1.1:2:1"));
        assert!(Header::decode(&h.encode(), 1000).is_ok());
        h.flags = FLAG_ACKS;
        h.offset = 1;
        assert!(
            Header::decode(&h.encode(), 1000).is_err(),
            "ACKS on a MSG_ACK"
        );
        let mut p = Header::new(Opcode::Put, 1, addr("1.1.1.1:1:1"), addr("1.1.1.1:2:1"));
        p.queue = QueueType::ActiveBulkRecv.code(); // a PUT claiming the wrong queue
        p.desc_len = 10;
        p.body_len = 20;
        p.total = 10;
        assert!(Header::decode(&p.encode(), 1000).is_err());
        p.queue = QueueType::ActiveBulkSend.code();
        assert!(Header::decode(&p.encode(), 1000).is_ok());
        p.offset = u64::MAX;
        assert!(
            Header::decode(&p.encode(), 1000).is_err(),
            "offset overflow"
        );
    }

    #[test]
    fn statuses_round_trip() {
        let all = [
            NetError::Cancelled,
            NetError::TimedOut,
            NetError::NoBuffers,
            NetError::MessageTooLarge {
                len: 200,
                space: 100,
            },
            NetError::TooBig("x".into()),
            NetError::Unreachable("127.0.0.1:1:1".into()),
            NetError::ConnectionReset("gone".into()),
            NetError::WrongQueue {
                passive: QueueType::PassiveBulkRecv,
                active: QueueType::ActiveBulkRecv,
            },
            NetError::AccessDenied {
                requester: "a".into(),
                allowed: "b".into(),
            },
            NetError::NoEntry,
            NetError::InvalidDescriptor("bad".into()),
            NetError::Busy("busy".into()),
            NetError::Protocol("p".into()),
        ];
        for e in all {
            let (code, d) = encode_status(&e);
            assert_eq!(decode_status(code, &d).unwrap(), e);
        }
        let (code, d) = encode_status(&NetError::AddrInUse("x".into()));
        assert!(matches!(decode_status(code, &d), Ok(NetError::Io { .. })));
    }

    proptest! {
        #[test]
        fn header_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100), max in any::<u32>()) {
            if let Ok(h) = Header::decode(&bytes, max) {
                prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
            }
        }

        #[test]
        fn header_with_good_checksum_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN), max in any::<u32>()) {
            // Make the magic, version and checksum right so the field checks run.
            bytes[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            bytes[4] = VERSION;
            bytes[5] = 1 + bytes[5] % 7;
            let crc = crc32c(&bytes[..64]);
            bytes[64..68].copy_from_slice(&crc.to_le_bytes());
            if let Ok(h) = Header::decode(&bytes, max) {
                prop_assert_eq!(&h.encode()[..], &bytes[..]);
                prop_assert!(h.desc_len as u32 <= h.body_len);
            }
        }

        #[test]
        fn status_decoder_never_panics(code in any::<u16>(), bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(e) = decode_status(code, &bytes) {
                let (c2, d2) = encode_status(&e);
                prop_assert_eq!(decode_status(c2, &d2).unwrap(), e);
            }
        }
    }
}
