//! The control protocol on the out-of-band TCP connection: frames, their
//! encoding and their checks. No I/O here. Public for tests that play a
//! misbehaving peer (and for fuzzing); applications never need it.
//!
//! The same frames travel on the TCP control connection and, once the
//! queue pairs are connected, as RDMA SENDs into the peer's ring of
//! pre-posted receive slots (the eager path: one frame per SEND, filling
//! the received bytes exactly).
//!
//! Every frame is a 24-byte little-endian header and `body_len` bytes:
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `"CLRD"` |
//! | 4 | 1 | version (2) |
//! | 5 | 1 | opcode: 1 HELLO, 2 MSG, 3 GET, 4 PUT, 5 REPLY, 6 ABORT, 7 EAGER, 8 CREDIT |
//! | 6 | 2 | status: 0, or a failure code (REPLY, ABORT) |
//! | 8 | 8 | xid: chosen by the requester, echoed in REPLY and ABORT |
//! | 16 | 4 | body_len |
//! | 20 | 4 | credits: receive slots the sender re-posted since it last said so |
//!
//! Bodies: see [`Frame`]. Segments are `(addr u64, len u32, rkey u32)`.

use colibri_bulk_tcp::wire::{decode_status, encode_status};
use colibri_net::addr::InetAddr;
use colibri_net::{NetError, Result};
use colibri_wire::{Reader, Writer};

/// Frame magic.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CLRD");
/// Protocol version.
pub const VERSION: u8 = 2;
/// Header length.
pub const HEADER_LEN: usize = 24;
/// Largest body accepted (descriptor plus a segment list).
pub const MAX_BODY: usize = 1 << 20;
/// Most segments in one request.
pub const MAX_SEGS: usize = (MAX_BODY - 1024) / 16;

/// What one side sends the other (HELLO) to connect a pair of RC queue
/// pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// The port's GID (RoCE v2: an IPv4-mapped IPv6 address).
    pub gid: [u8; 16],
    /// Active path MTU code (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// RDMA READs this side's responder serves at once.
    pub rd_atom: u8,
    /// Receive slots of [`SLOT_SIZE`] bytes this side posted on its queue
    /// pair for the peer's SENDs (the peer's initial credits); 0: the peer
    /// must send every frame on the TCP connection.
    pub slots: u16,
}

/// Bytes of one eager receive slot: the largest frame that travels as an
/// RDMA SEND (larger ones go on the TCP connection).
pub const SLOT_SIZE: usize = 4096;

/// Fixed part of an EAGER frame: the header and both addresses.
pub const EAGER_OVERHEAD: usize = HEADER_LEN + 20;

/// The largest message carried inline in an EAGER frame that fits a slot.
pub const MAX_EAGER: usize = SLOT_SIZE - EAGER_OVERHEAD;

/// A remote segment: where the peer's bytes are and the key to reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Remote key.
    pub rkey: u32,
}

/// Which active bulk operation a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkOp {
    /// Active receive: the passive side WRITEs into the listed segments.
    Get,
    /// Active send: the passive side READs from the listed segments.
    Put,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Queue-pair exchange, both ways, once per connection.
    Hello(QpInfo),
    /// A message of `len` bytes in `segs`, to be READ by the receiver.
    Msg {
        /// Request id.
        xid: u64,
        /// The sending transfer machine.
        sender: InetAddr,
        /// The receiving transfer machine.
        receiver: InetAddr,
        /// Message length.
        len: u64,
        /// Where the message is.
        segs: Vec<Seg>,
    },
    /// An active bulk request against the passive buffer `desc` names.
    Bulk {
        /// Request id.
        xid: u64,
        /// GET or PUT.
        op: BulkOp,
        /// The active transfer machine.
        sender: InetAddr,
        /// The passive transfer machine (the descriptor's owner).
        receiver: InetAddr,
        /// GET: capacity of the active buffer; PUT: bytes to send.
        size: u64,
        /// The descriptor, as encoded by the core.
        desc: Vec<u8>,
        /// The active buffer's segments (covering `size` bytes).
        segs: Vec<Seg>,
    },
    /// The outcome of a request: `Ok(bytes moved)` or the failure.
    Reply {
        /// Request id.
        xid: u64,
        /// Outcome.
        status: Result<u64>,
    },
    /// The requester gives up on a request (cancel, timeout, stop).
    Abort {
        /// Request id.
        xid: u64,
        /// The status the passive side should complete with.
        status: NetError,
    },
    /// A small message carried in the frame itself: the receiver copies it
    /// into the claimed region and answers with a REPLY.
    Eager {
        /// Request id.
        xid: u64,
        /// The sending transfer machine.
        sender: InetAddr,
        /// The receiving transfer machine.
        receiver: InetAddr,
        /// The message.
        data: Vec<u8>,
    },
    /// Nothing but the header's credits (sent when slots were re-posted
    /// and no other frame carried them back).
    Credit,
}

const OP_HELLO: u8 = 1;
const OP_MSG: u8 = 2;
const OP_GET: u8 = 3;
const OP_PUT: u8 = 4;
const OP_REPLY: u8 = 5;
const OP_ABORT: u8 = 6;
const OP_EAGER: u8 = 7;
const OP_CREDIT: u8 = 8;

fn put_addr(w: &mut Writer<&mut Vec<u8>>, a: &InetAddr) {
    w.put_u32(u32::from(a.ip));
    w.put_u16(a.port);
    w.put_u32(a.service);
}

fn put_segs(w: &mut Writer<&mut Vec<u8>>, segs: &[Seg]) {
    w.put_u32(u32::try_from(segs.len()).unwrap_or(u32::MAX));
    for s in segs {
        w.put_u64(s.addr);
        w.put_u32(s.len);
        w.put_u32(s.rkey);
    }
}

impl Frame {
    /// Appends the encoded frame to `out` (no credits).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with_credits(0, out);
    }

    /// Writes `credits` into the header of the encoded frame at the start
    /// of `frame` (for a frame encoded before the credits were known).
    pub fn set_credits(frame: &mut [u8], credits: u32) {
        if frame.len() >= HEADER_LEN {
            frame[20..24].copy_from_slice(&credits.to_le_bytes());
        }
    }

    /// Appends the encoded frame, returning `credits` slots, to `out`.
    pub fn encode_with_credits(&self, credits: u32, out: &mut Vec<u8>) {
        let start = out.len();
        let (op, xid, status, detail) = match self {
            Self::Hello(_) => (OP_HELLO, 0, 0, Vec::new()),
            Self::Msg { xid, .. } => (OP_MSG, *xid, 0, Vec::new()),
            Self::Bulk { xid, op, .. } => (
                if *op == BulkOp::Get { OP_GET } else { OP_PUT },
                *xid,
                0,
                Vec::new(),
            ),
            Self::Reply { xid, status } => match status {
                Ok(_) => (OP_REPLY, *xid, 0, Vec::new()),
                Err(e) => {
                    let (c, d) = encode_status(e);
                    (OP_REPLY, *xid, c, d)
                }
            },
            Self::Abort { xid, status } => {
                let (c, d) = encode_status(status);
                (OP_ABORT, *xid, c, d)
            }
            Self::Eager { xid, .. } => (OP_EAGER, *xid, 0, Vec::new()),
            Self::Credit => (OP_CREDIT, 0, 0, Vec::new()),
        };
        let mut w = Writer::new(&mut *out);
        w.put_u32(MAGIC);
        w.put_u8(VERSION);
        w.put_u8(op);
        w.put_u16(status);
        w.put_u64(xid);
        w.put_u32(0); // body_len, patched below
        w.put_u32(credits);
        match self {
            Self::Hello(q) => {
                w.put_u32(q.qpn);
                w.put_u32(q.psn);
                w.put_bytes(&q.gid);
                w.put_u8(q.mtu);
                w.put_u8(q.rd_atom);
                w.put_u16(q.slots);
            }
            Self::Msg {
                sender,
                receiver,
                len,
                segs,
                ..
            } => {
                put_addr(&mut w, sender);
                put_addr(&mut w, receiver);
                w.put_u64(*len);
                put_segs(&mut w, segs);
            }
            Self::Bulk {
                sender,
                receiver,
                size,
                desc,
                segs,
                ..
            } => {
                put_addr(&mut w, sender);
                put_addr(&mut w, receiver);
                w.put_u64(*size);
                w.put_u16(u16::try_from(desc.len()).unwrap_or(u16::MAX));
                w.put_bytes(desc);
                put_segs(&mut w, segs);
            }
            Self::Reply { status, .. } => {
                w.put_u64(*status.as_ref().unwrap_or(&0));
                w.put_bytes(&detail);
            }
            Self::Abort { .. } => w.put_bytes(&detail),
            Self::Eager {
                sender,
                receiver,
                data,
                ..
            } => {
                put_addr(&mut w, sender);
                put_addr(&mut w, receiver);
                w.put_bytes(data);
            }
            Self::Credit => {}
        }
        let body = u32::try_from(out.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
        out[start + 16..start + 20].copy_from_slice(&body.to_le_bytes());
    }

    /// Decodes one frame from the start of `buf`: `Ok(None)` when the
    /// frame is not complete yet, else the frame and the bytes it used
    /// (the header's credits are dropped: see [`Frame::decode_with_credits`]).
    ///
    /// # Errors
    /// `Protocol` for anything malformed (the connection is then closed).
    pub fn decode(buf: &[u8]) -> Result<Option<(Self, usize)>> {
        Ok(Self::decode_with_credits(buf)?.map(|(f, _, n)| (f, n)))
    }

    /// As [`Frame::decode`], with the credits the frame returns.
    ///
    /// # Errors
    /// `Protocol` for anything malformed (the connection is then closed).
    pub fn decode_with_credits(buf: &[u8]) -> Result<Option<(Self, u32, usize)>> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let bad = |what: &str| NetError::Protocol(format!("rdma control frame: {what}"));
        let mut r = Reader::new(&buf[..HEADER_LEN]);
        let short = |_| bad("short header");
        let magic = r.u32().map_err(short)?;
        let version = r.u8().map_err(short)?;
        let op = r.u8().map_err(short)?;
        let status = r.u16().map_err(short)?;
        let xid = r.u64().map_err(short)?;
        let body_len = r.u32().map_err(short)? as usize;
        let credits = r.u32().map_err(short)?;
        if magic != MAGIC {
            return Err(bad("bad magic"));
        }
        if version != VERSION {
            return Err(bad(&format!("version {version}")));
        }
        if credits > u32::from(u16::MAX) {
            return Err(bad(&format!("{credits} credits")));
        }
        if body_len > MAX_BODY {
            return Err(bad(&format!("body of {body_len} bytes")));
        }
        if status != 0 && op != OP_REPLY && op != OP_ABORT {
            return Err(bad("status on a request"));
        }
        if buf.len() < HEADER_LEN + body_len {
            return Ok(None);
        }
        let body = &buf[HEADER_LEN..HEADER_LEN + body_len];
        let mut r = Reader::new(body);
        let trunc = |_| bad("truncated body");
        let addr = |r: &mut Reader<'_>| -> Result<InetAddr> {
            let ip = r.u32().map_err(trunc)?;
            let port = r.u16().map_err(trunc)?;
            let service = r.u32().map_err(trunc)?;
            Ok(InetAddr {
                ip: ip.into(),
                port,
                service,
            })
        };
        let segs = |r: &mut Reader<'_>| -> Result<Vec<Seg>> {
            let n = r.u32().map_err(trunc)? as usize;
            if n > MAX_SEGS || n * 16 > r.remaining() {
                return Err(bad(&format!("{n} segments")));
            }
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let addr = r.u64().map_err(trunc)?;
                let len = r.u32().map_err(trunc)?;
                let rkey = r.u32().map_err(trunc)?;
                v.push(Seg { addr, len, rkey });
            }
            Ok(v)
        };
        let covered = |segs: &[Seg], len: u64| -> Result<()> {
            let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
            if total < len {
                return Err(bad(&format!(
                    "segments hold {total} bytes, {len} announced"
                )));
            }
            Ok(())
        };
        let frame = match op {
            OP_HELLO => {
                let qpn = r.u32().map_err(trunc)?;
                let psn = r.u32().map_err(trunc)?;
                let gid = *r.array::<16>().map_err(trunc)?;
                let mtu = r.u8().map_err(trunc)?;
                let rd_atom = r.u8().map_err(trunc)?;
                let slots = r.u16().map_err(trunc)?;
                if !(1..=5).contains(&mtu) {
                    return Err(bad(&format!("path MTU code {mtu}")));
                }
                Self::Hello(QpInfo {
                    qpn,
                    psn,
                    gid,
                    mtu,
                    rd_atom,
                    slots,
                })
            }
            OP_MSG => {
                let sender = addr(&mut r)?;
                let receiver = addr(&mut r)?;
                let len = r.u64().map_err(trunc)?;
                let segs = segs(&mut r)?;
                covered(&segs, len)?;
                Self::Msg {
                    xid,
                    sender,
                    receiver,
                    len,
                    segs,
                }
            }
            OP_GET | OP_PUT => {
                let sender = addr(&mut r)?;
                let receiver = addr(&mut r)?;
                let size = r.u64().map_err(trunc)?;
                let dl = r.u16().map_err(trunc)? as usize;
                let desc = r.bytes(dl).map_err(trunc)?.to_vec();
                let segs = segs(&mut r)?;
                covered(&segs, size)?;
                Self::Bulk {
                    xid,
                    op: if op == OP_GET {
                        BulkOp::Get
                    } else {
                        BulkOp::Put
                    },
                    sender,
                    receiver,
                    size,
                    desc,
                    segs,
                }
            }
            OP_REPLY => {
                let len = r.u64().map_err(trunc)?;
                let rest = r.rest();
                let status = if status == 0 {
                    if !rest.is_empty() {
                        return Err(bad("detail on a success"));
                    }
                    Ok(len)
                } else {
                    Err(decode_status(status, rest)?)
                };
                r = Reader::new(&[]);
                Self::Reply { xid, status }
            }
            OP_ABORT => {
                if status == 0 {
                    return Err(bad("abort without a status"));
                }
                let st = decode_status(status, r.rest())?;
                r = Reader::new(&[]);
                Self::Abort { xid, status: st }
            }
            OP_EAGER => {
                let sender = addr(&mut r)?;
                let receiver = addr(&mut r)?;
                let data = r.rest().to_vec();
                r = Reader::new(&[]);
                Self::Eager {
                    xid,
                    sender,
                    receiver,
                    data,
                }
            }
            OP_CREDIT => {
                if xid != 0 {
                    return Err(bad("xid on a credit frame"));
                }
                Self::Credit
            }
            other => return Err(bad(&format!("opcode {other}"))),
        };
        if !r.is_empty() {
            return Err(bad("trailing bytes in body"));
        }
        Ok(Some((frame, credits, HEADER_LEN + body_len)))
    }

    /// Decodes the whole frames of one eager SEND (a sender packs as many
    /// as fit a slot): every byte must belong to a complete frame.
    ///
    /// # Errors
    /// `Protocol` for an empty or oversized SEND, a malformed frame, or
    /// bytes left that are not a whole frame (the connection is then
    /// fenced).
    pub fn decode_send(buf: &[u8]) -> Result<Vec<(Self, u32)>> {
        let not_whole = || {
            NetError::Protocol(format!(
                "rdma eager: a SEND of {} bytes is not whole frames",
                buf.len()
            ))
        };
        if buf.is_empty() || buf.len() > SLOT_SIZE {
            return Err(not_whole());
        }
        let mut frames = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            match Self::decode_with_credits(&buf[at..])? {
                Some((f, credits, used)) if used > 0 => {
                    frames.push((f, credits));
                    at += used;
                }
                _ => return Err(not_whole()),
            }
        }
        Ok(frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(s: &str) -> InetAddr {
        InetAddr::parse(s).unwrap()
    }

    fn round(f: &Frame) {
        let mut b = Vec::new();
        f.encode(&mut b);
        let (g, n) = Frame::decode(&b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(&g, f);
        // Every proper prefix is incomplete, never an error.
        for cut in 0..b.len() {
            assert!(Frame::decode(&b[..cut]).unwrap().is_none(), "prefix {cut}");
        }
    }

    #[test]
    fn every_frame_round_trips() {
        let segs = vec![
            Seg {
                addr: 0x1000,
                len: 10,
                rkey: 7,
            },
            Seg {
                addr: 0x9000,
                len: 5,
                rkey: 8,
            },
        ];
        round(&Frame::Hello(QpInfo {
            qpn: 0x11,
            psn: 0x22,
            gid: [3; 16],
            mtu: 5,
            rd_atom: 16,
            slots: 32,
        }));
        round(&Frame::Msg {
            xid: 9,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.2:7:8"),
            len: 15,
            segs: segs.clone(),
        });
        round(&Frame::Bulk {
            xid: 10,
            op: BulkOp::Put,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.2:7:8"),
            size: 12,
            desc: vec![1, 2, 3],
            segs,
        });
        round(&Frame::Reply {
            xid: 11,
            status: Ok(99),
        });
        round(&Frame::Reply {
            xid: 12,
            status: Err(NetError::MessageTooLarge { len: 5, space: 4 }),
        });
        round(&Frame::Abort {
            xid: 13,
            status: NetError::TimedOut,
        });
        round(&Frame::Eager {
            xid: 14,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.2:7:8"),
            data: b"hello".to_vec(),
        });
        round(&Frame::Eager {
            xid: 15,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.2:7:8"),
            data: Vec::new(),
        });
        round(&Frame::Credit);
    }

    #[test]
    fn a_send_is_whole_frames_or_refused() {
        let mut b = Vec::new();
        Frame::Reply {
            xid: 3,
            status: Ok(1),
        }
        .encode_with_credits(2, &mut b);
        Frame::Credit.encode_with_credits(5, &mut b);
        let frames = Frame::decode_send(&b).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1], (Frame::Credit, 5));
        // A frame cut short, nothing at all, or more than a slot: refused.
        for bad in [&b[..b.len() - 1], &[][..], &vec![0u8; SLOT_SIZE + 1][..]] {
            assert!(
                matches!(Frame::decode_send(bad), Err(NetError::Protocol(_))),
                "{} bytes",
                bad.len()
            );
        }
    }

    #[test]
    fn credits_travel_in_the_header() {
        let mut b = Vec::new();
        Frame::Reply {
            xid: 3,
            status: Ok(1),
        }
        .encode_with_credits(17, &mut b);
        let (f, c, n) = Frame::decode_with_credits(&b).unwrap().unwrap();
        assert_eq!((c, n), (17, b.len()));
        assert_eq!(
            f,
            Frame::Reply {
                xid: 3,
                status: Ok(1)
            }
        );
        Frame::set_credits(&mut b, 5);
        assert_eq!(Frame::decode_with_credits(&b).unwrap().unwrap().1, 5);
        // More credits than any ring holds, a credit frame with an xid.
        Frame::set_credits(&mut b, 70_000);
        assert!(matches!(Frame::decode(&b), Err(NetError::Protocol(_))));
        let mut c = Vec::new();
        Frame::Credit.encode_with_credits(4, &mut c);
        c[8] = 1;
        assert!(matches!(Frame::decode(&c), Err(NetError::Protocol(_))));
    }

    #[test]
    fn the_largest_eager_message_fills_a_slot() {
        let mut b = Vec::new();
        Frame::Eager {
            xid: 1,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.2:7:8"),
            data: vec![7; MAX_EAGER],
        }
        .encode(&mut b);
        assert_eq!(b.len(), SLOT_SIZE);
    }

    #[test]
    fn malformed_frames_are_protocol_errors() {
        let mut b = Vec::new();
        Frame::Msg {
            xid: 1,
            sender: a("127.0.0.1:5:6"),
            receiver: a("127.0.0.1:5:7"),
            len: 4,
            segs: vec![Seg {
                addr: 1,
                len: 4,
                rkey: 1,
            }],
        }
        .encode(&mut b);
        for (off, val) in [(0, 0u8), (4, 9), (5, 77), (6, 1), (22, 1), (19, 0x7f)] {
            let mut c = b.clone();
            c[off] = val;
            assert!(
                matches!(Frame::decode(&c), Err(NetError::Protocol(_))),
                "byte {off} = {val}"
            );
        }
        // Segments that do not cover the announced length.
        let mut c = b.clone();
        let at = HEADER_LEN + 20;
        c[at..at + 8].copy_from_slice(&5u64.to_le_bytes());
        assert!(matches!(Frame::decode(&c), Err(NetError::Protocol(_))));
    }

    proptest! {
        #[test]
        fn eager_frames_round_trip(xid in any::<u64>(), credits in 0u32..=65_535, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let f = Frame::Eager { xid, sender: a("127.0.0.1:5:6"), receiver: a("127.0.0.3:1:2"), data };
            let mut b = Vec::new();
            f.encode_with_credits(credits, &mut b);
            let (g, c, n) = Frame::decode_with_credits(&b).unwrap().unwrap();
            prop_assert_eq!(g, f);
            prop_assert_eq!((c, n), (credits, b.len()));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Frame::decode(&bytes);
        }

        #[test]
        fn decode_of_valid_header_with_noise_body(op in 1u8..9, body in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut b = Vec::new();
            b.extend_from_slice(&MAGIC.to_le_bytes());
            b.push(VERSION);
            b.push(op);
            b.extend_from_slice(&0u16.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&(body.len() as u32).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&body);
            let _ = Frame::decode(&b);
        }
    }
}
