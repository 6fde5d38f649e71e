//! Wire formats: the 72-byte LNet message header and the ping buffer.
//!
//! Both layouts are byte-exact with Lustre (`lnet-idl.h`, see `DESIGN.md`,
//! "Wire layouts"). Decoding goes in two steps, as in smoltcp's wire layer:
//! a *view* ([`HeaderView`]) checks the length once and then reads fields
//! infallibly; the *representation* ([`Header`], [`PingInfo`]) validates every
//! field and is what the rest of the crate works with. No decoder panics on
//! any input; every rejection is a [`WireError`].
//!
//! ## Message header (72 bytes, little-endian)
//!
//! ```text
//! off size field            off size PUT          GET           REPLY   ACK        HELLO
//!   0  8   dest_nid          32 16  ack_wmd      return_wmd    dst_wmd dst_wmd    incarnation(8)
//!   8  8   src_nid           48  8  match_bits   match_bits            match_bits type(4)@40
//!  16  4   dest_pid          56  8  hdr_data     ptl_index(4)          mlength(4)
//!  20  4   src_pid           60  4               src_offset(4)
//!  24  4   type              64  4  ptl_index    sink_length(4)
//!  28  4   payload_length    68  4  offset
//! ```
//!
//! ## Ping buffer
//!
//! A 16-byte header (`magic` 0x70696E67, `features`, `pid`, `nnis`) followed
//! by `nnis` 16-byte entries (`nid` u64, `status` u32, `msg_size` u32). Entry 0
//! is always `0@lo` and its status carries the ping-target sequence number;
//! entry 1 is the node's primary NID.

use std::fmt;

use colibri_wire::{Endian, Reader, Short, Writer};

use crate::ids::{Nid, Pid};

/// Size of the LNet message header on the wire.
pub const HEADER_LEN: usize = 72;
/// `LNET_MTU`: the largest PUT or REPLY payload (1 MiB).
pub const LNET_MTU: u32 = 1 << 20;
/// `MAX_PORTALS`: number of portals (portal indices are `0..64`).
pub const MAX_PORTALS: u32 = 64;
/// `LNET_RESERVED_PORTAL`: LNet's own portal for ping and push.
pub const RESERVED_PORTAL: u32 = 0;
/// `LNET_PROTO_PING_MATCHBITS`: match bits of ping GETs and push PUTs.
pub const PING_MATCHBITS: u64 = 0x8000_0000_0000_0000;

/// Errors decoding wire data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the fixed layout needs.
    #[error("buffer too short: need {needed} bytes, got {got}")]
    TooShort {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The message type field is not ACK, PUT, GET, REPLY or HELLO.
    #[error("unknown message type {0}")]
    UnknownType(u32),
    /// An ACK or GET carried a payload.
    #[error("{ty} must not carry a payload (payload_length {len})")]
    PayloadNotAllowed {
        /// The message type.
        ty: MsgType,
        /// The payload length in the header.
        len: u32,
    },
    /// A PUT or REPLY payload is larger than [`LNET_MTU`].
    #[error("payload length {0} exceeds LNET_MTU")]
    PayloadTooLarge(u32),
    /// The bytes following the header do not match `payload_length`.
    #[error("payload_length {header} but {actual} payload bytes follow")]
    PayloadLengthMismatch {
        /// Length in the header.
        header: u32,
        /// Bytes actually present.
        actual: usize,
    },
    /// The ping buffer magic is wrong (in either byte order).
    #[error("bad ping magic {0:#010x}")]
    BadMagic(u32),
    /// The ping buffer lacks the NI_STATUS feature (pre-2.x format).
    #[error("ping buffer without NI status")]
    NoNiStatus,
    /// The ping buffer's interface count is out of range.
    #[error("ping buffer interface count {nnis} outside 1..={max}")]
    BadInterfaceCount {
        /// Count in the buffer.
        nnis: u32,
        /// Largest accepted count.
        max: u32,
    },
    /// The ping buffer's first entry is not `0@lo`.
    #[error("ping buffer entry 0 is {0}, not 0@lo")]
    FirstNotLoopback(Nid),
    /// The ping buffer was truncated by the receiver's buffer size; retry with
    /// a buffer of `needed` bytes.
    #[error("ping buffer truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes the full buffer needs.
        needed: usize,
        /// Bytes received.
        got: usize,
    },
    /// An interface status is neither UP, DOWN nor INVALID.
    #[error("bad interface status {0:#010x}")]
    BadNiStatus(u32),
    /// The primary NID is a large (IPv6) NID, which this crate does not support.
    #[error("large (20-byte) primary NID not supported")]
    LargePrimaryUnsupported,
}

/// An LNet message type (`enum lnet_msg_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MsgType {
    /// Acknowledgement of a PUT (0).
    Ack,
    /// PUT (1).
    Put,
    /// GET (2).
    Get,
    /// REPLY to a GET (3).
    Reply,
    /// Socket LND V1 hello (4).
    Hello,
}

impl MsgType {
    /// The wire value.
    #[must_use]
    pub const fn to_u32(self) -> u32 {
        match self {
            Self::Ack => 0,
            Self::Put => 1,
            Self::Get => 2,
            Self::Reply => 3,
            Self::Hello => 4,
        }
    }

    /// The type for a wire value.
    ///
    /// # Errors
    /// [`WireError::UnknownType`] for values above 4.
    pub const fn from_u32(v: u32) -> Result<Self, WireError> {
        Ok(match v {
            0 => Self::Ack,
            1 => Self::Put,
            2 => Self::Get,
            3 => Self::Reply,
            4 => Self::Hello,
            other => return Err(WireError::UnknownType(other)),
        })
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ack => "ACK",
            Self::Put => "PUT",
            Self::Get => "GET",
            Self::Reply => "REPLY",
            Self::Hello => "HELLO",
        })
    }
}

/// A wire handle (`lnet_handle_wire`): names an MD on the node that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireHandle {
    /// Interface cookie (identifies the LNet instance).
    pub interface_cookie: u64,
    /// Object cookie (identifies the MD).
    pub object_cookie: u64,
}

impl WireHandle {
    /// `LNET_WIRE_HANDLE_COOKIE_NONE` in both halves: "no handle" (e.g. no ACK wanted).
    pub const NONE: Self = Self {
        interface_cookie: u64::MAX,
        object_cookie: u64::MAX,
    };

    /// Whether this is [`WireHandle::NONE`].
    #[must_use]
    pub const fn is_none(self) -> bool {
        self.interface_cookie == u64::MAX && self.object_cookie == u64::MAX
    }
}

/// The type-specific part of a [`Header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// ACK: acknowledges a PUT.
    Ack {
        /// The initiator's MD (copied from the PUT's `ack_wmd`).
        dst_wmd: WireHandle,
        /// Match bits of the PUT.
        match_bits: u64,
        /// Bytes the target accepted.
        mlength: u32,
    },
    /// PUT: sends `payload_length` bytes to a portal.
    Put {
        /// Initiator MD to acknowledge, or [`WireHandle::NONE`] for no ACK.
        ack_wmd: WireHandle,
        /// Match bits.
        match_bits: u64,
        /// Opaque user data delivered in the PUT event.
        hdr_data: u64,
        /// Portal index (`0..64`).
        ptl_index: u32,
        /// Remote offset (used only by MANAGE_REMOTE MDs).
        offset: u32,
    },
    /// GET: asks for `sink_length` bytes from a portal.
    Get {
        /// Initiator MD that receives the REPLY.
        return_wmd: WireHandle,
        /// Match bits.
        match_bits: u64,
        /// Portal index (`0..64`).
        ptl_index: u32,
        /// Remote offset (used only by MANAGE_REMOTE MDs).
        src_offset: u32,
        /// Bytes the initiator wants.
        sink_length: u32,
    },
    /// REPLY: answers a GET with data.
    Reply {
        /// Initiator MD (copied from the GET's `return_wmd`).
        dst_wmd: WireHandle,
    },
    /// HELLO (socket LND V1 only).
    Hello {
        /// Sender incarnation.
        incarnation: u64,
        /// Connection type.
        conn_type: u32,
    },
}

impl Body {
    /// The message type of this body.
    #[must_use]
    pub const fn msg_type(&self) -> MsgType {
        match self {
            Self::Ack { .. } => MsgType::Ack,
            Self::Put { .. } => MsgType::Put,
            Self::Get { .. } => MsgType::Get,
            Self::Reply { .. } => MsgType::Reply,
            Self::Hello { .. } => MsgType::Hello,
        }
    }

    /// The portal of a PUT or GET.
    #[must_use]
    pub const fn portal(&self) -> Option<u32> {
        match self {
            Self::Put { ptl_index, .. } | Self::Get { ptl_index, .. } => Some(*ptl_index),
            _ => None,
        }
    }

    /// The match bits of a PUT, GET or ACK.
    #[must_use]
    pub const fn match_bits(&self) -> Option<u64> {
        match self {
            Self::Put { match_bits, .. }
            | Self::Get { match_bits, .. }
            | Self::Ack { match_bits, .. } => Some(*match_bits),
            _ => None,
        }
    }
}

/// A validated LNet message header (`struct _lnet_hdr_nid4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Final destination NID (not the next hop).
    pub dest_nid: Nid,
    /// Originating NID (routers keep it unchanged).
    pub src_nid: Nid,
    /// Destination pid.
    pub dest_pid: Pid,
    /// Source pid.
    pub src_pid: Pid,
    /// Number of payload bytes following the header.
    pub payload_length: u32,
    /// Type-specific fields.
    pub body: Body,
}

/// A length-checked view of a 72-byte header; field reads cannot fail.
#[derive(Clone, Copy, Debug)]
pub struct HeaderView<'a> {
    buf: &'a [u8; HEADER_LEN],
}

impl<'a> HeaderView<'a> {
    /// A view of the first [`HEADER_LEN`] bytes of `buf`.
    ///
    /// # Errors
    /// [`WireError::TooShort`] if `buf` has fewer than 72 bytes.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        let head = buf.first_chunk::<HEADER_LEN>().ok_or(WireError::TooShort {
            needed: HEADER_LEN,
            got: buf.len(),
        })?;
        Ok(Self { buf: head })
    }

    /// A reader at `off`. Every caller passes an offset that leaves room
    /// in the 72 bytes for the fields it reads, so those reads cannot come
    /// up short and their zero fallbacks are never taken.
    fn at(&self, off: usize) -> Reader<'a> {
        let mut r = Reader::new(self.buf);
        let _ = r.skip(off);
        r
    }

    /// `dest_nid` (offset 0).
    #[must_use]
    pub fn dest_nid(&self) -> Nid {
        Nid::from_u64(self.at(0).u64().unwrap_or(0))
    }
    /// `src_nid` (offset 8).
    #[must_use]
    pub fn src_nid(&self) -> Nid {
        Nid::from_u64(self.at(8).u64().unwrap_or(0))
    }
    /// `dest_pid` (offset 16).
    #[must_use]
    pub fn dest_pid(&self) -> Pid {
        self.at(16).u32().unwrap_or(0)
    }
    /// `src_pid` (offset 20).
    #[must_use]
    pub fn src_pid(&self) -> Pid {
        self.at(20).u32().unwrap_or(0)
    }
    /// Raw `type` (offset 24).
    #[must_use]
    pub fn raw_type(&self) -> u32 {
        self.at(24).u32().unwrap_or(0)
    }
    /// `payload_length` (offset 28).
    #[must_use]
    pub fn payload_length(&self) -> u32 {
        self.at(28).u32().unwrap_or(0)
    }
    /// A u64 of the variant part at absolute offset `off` (32..=64).
    #[must_use]
    pub fn u64_at(&self, off: usize) -> u64 {
        self.at(off.clamp(32, HEADER_LEN - 8)).u64().unwrap_or(0)
    }
    /// A u32 of the variant part at absolute offset `off` (32..=68).
    #[must_use]
    pub fn u32_at(&self, off: usize) -> u32 {
        self.at(off.clamp(32, HEADER_LEN - 4)).u32().unwrap_or(0)
    }
    /// A wire handle at absolute offset `off` (32..=56).
    #[must_use]
    pub fn handle_at(&self, off: usize) -> WireHandle {
        let mut r = self.at(off.clamp(32, HEADER_LEN - 16));
        WireHandle {
            interface_cookie: r.u64().unwrap_or(0),
            object_cookie: r.u64().unwrap_or(0),
        }
    }
}

impl Header {
    /// The message type.
    #[must_use]
    pub const fn msg_type(&self) -> MsgType {
        self.body.msg_type()
    }

    /// Decodes and validates the first 72 bytes of `buf`.
    ///
    /// Bytes of the 40-byte variant part that the message type does not use
    /// are ignored: Lustre turns a GET into its REPLY in place, so a REPLY
    /// carries the GET's leftover fields there.
    ///
    /// # Errors
    /// Short buffer, unknown type, payload on ACK/GET, payload over
    /// [`LNET_MTU`]. A portal index beyond the table (`>= 64`) is *not* a
    /// decoding error: the target drops such a request at matching and a
    /// router forwards it without looking (Lustre's `lnet_ptl_match_md`).
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let v = HeaderView::new_checked(buf)?;
        let ty = MsgType::from_u32(v.raw_type())?;
        let payload_length = v.payload_length();
        match ty {
            MsgType::Ack | MsgType::Get if payload_length != 0 => {
                return Err(WireError::PayloadNotAllowed {
                    ty,
                    len: payload_length,
                });
            }
            MsgType::Put | MsgType::Reply if payload_length > LNET_MTU => {
                return Err(WireError::PayloadTooLarge(payload_length));
            }
            _ => {}
        }
        let body = match ty {
            MsgType::Ack => Body::Ack {
                dst_wmd: v.handle_at(32),
                match_bits: v.u64_at(48),
                mlength: v.u32_at(56),
            },
            MsgType::Put => Body::Put {
                ack_wmd: v.handle_at(32),
                match_bits: v.u64_at(48),
                hdr_data: v.u64_at(56),
                ptl_index: v.u32_at(64),
                offset: v.u32_at(68),
            },
            MsgType::Get => Body::Get {
                return_wmd: v.handle_at(32),
                match_bits: v.u64_at(48),
                ptl_index: v.u32_at(56),
                src_offset: v.u32_at(60),
                sink_length: v.u32_at(64),
            },
            MsgType::Reply => Body::Reply {
                dst_wmd: v.handle_at(32),
            },
            MsgType::Hello => Body::Hello {
                incarnation: v.u64_at(32),
                conn_type: v.u32_at(40),
            },
        };
        Ok(Self {
            dest_nid: v.dest_nid(),
            src_nid: v.src_nid(),
            dest_pid: v.dest_pid(),
            src_pid: v.src_pid(),
            payload_length,
            body,
        })
    }

    /// Encodes the header into its 72-byte wire form (unused bytes zero).
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut w = Writer::new([0u8; HEADER_LEN]);
        w.put_u64(self.dest_nid.as_u64());
        w.put_u64(self.src_nid.as_u64());
        w.put_u32(self.dest_pid);
        w.put_u32(self.src_pid);
        w.put_u32(self.msg_type().to_u32());
        w.put_u32(self.payload_length);
        // The variant part (offset 32); bytes a type does not use stay zero.
        match self.body {
            Body::Ack {
                dst_wmd,
                match_bits,
                mlength,
            } => {
                put_handle(&mut w, dst_wmd);
                w.put_u64(match_bits);
                w.put_u32(mlength);
            }
            Body::Put {
                ack_wmd,
                match_bits,
                hdr_data,
                ptl_index,
                offset,
            } => {
                put_handle(&mut w, ack_wmd);
                w.put_u64(match_bits);
                w.put_u64(hdr_data);
                w.put_u32(ptl_index);
                w.put_u32(offset);
            }
            Body::Get {
                return_wmd,
                match_bits,
                ptl_index,
                src_offset,
                sink_length,
            } => {
                put_handle(&mut w, return_wmd);
                w.put_u64(match_bits);
                w.put_u32(ptl_index);
                w.put_u32(src_offset);
                w.put_u32(sink_length);
            }
            Body::Reply { dst_wmd } => put_handle(&mut w, dst_wmd),
            Body::Hello {
                incarnation,
                conn_type,
            } => {
                w.put_u64(incarnation);
                w.put_u32(conn_type);
            }
        }
        w.into_inner()
    }
}

fn put_handle(w: &mut Writer<[u8; HEADER_LEN]>, h: WireHandle) {
    w.put_u64(h.interface_cookie);
    w.put_u64(h.object_cookie);
}

/// Encodes a whole message: header followed by its payload.
///
/// `header.payload_length` must equal `payload.len()`; the encoder does not
/// rewrite it (use [`Message::new`] to build consistent messages).
#[must_use]
pub fn encode_message(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    out
}

/// Decodes a whole message: a header and exactly `payload_length` bytes.
///
/// # Errors
/// Any [`Header::decode`] error, or [`WireError::PayloadLengthMismatch`].
pub fn decode_message(buf: &[u8]) -> Result<(Header, &[u8]), WireError> {
    let header = Header::decode(buf)?;
    let payload = &buf[HEADER_LEN..];
    if payload.len() != header.payload_length as usize {
        return Err(WireError::PayloadLengthMismatch {
            header: header.payload_length,
            actual: payload.len(),
        });
    }
    Ok((header, payload))
}

/// A header with its payload, kept consistent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The header; `payload_length` equals `payload.len()`.
    pub header: Header,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl Message {
    /// A message; sets `header.payload_length` from the payload.
    ///
    /// # Errors
    /// [`WireError::PayloadTooLarge`] if the payload exceeds [`LNET_MTU`],
    /// [`WireError::PayloadNotAllowed`] for a non-empty ACK or GET payload.
    pub fn new(mut header: Header, payload: Vec<u8>) -> Result<Self, WireError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|l| *l <= LNET_MTU)
            .ok_or(WireError::PayloadTooLarge(
                u32::try_from(payload.len()).unwrap_or(u32::MAX),
            ))?;
        let ty = header.msg_type();
        if matches!(ty, MsgType::Ack | MsgType::Get) && len != 0 {
            return Err(WireError::PayloadNotAllowed { ty, len });
        }
        header.payload_length = len;
        Ok(Self { header, payload })
    }

    /// The encoded bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encode_message(&self.header, &self.payload)
    }

    /// Decodes and validates a message.
    ///
    /// # Errors
    /// As [`decode_message`].
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let (header, payload) = decode_message(buf)?;
        Ok(Self {
            header,
            payload: payload.to_vec(),
        })
    }
}

// ---------------------------------------------------------------------------
// Ping buffer

/// `LNET_PROTO_PING_MAGIC`: 'ping'.
pub const PING_MAGIC: u32 = 0x7069_6E67;
/// Size of the ping buffer header.
pub const PING_HEADER_LEN: usize = 16;
/// Size of one `lnet_ni_status` entry.
pub const PING_ENTRY_LEN: usize = 16;
/// `LNET_INTERFACES_MIN`: interfaces a minimum-size ping buffer holds.
pub const INTERFACES_MIN: u32 = 16;
/// `LNET_PING_INFO_MIN_SIZE`: 16 + 16×16 = 272 bytes.
pub const PING_INFO_MIN_SIZE: usize = PING_HEADER_LEN + PING_ENTRY_LEN * INTERFACES_MIN as usize;
/// Default `lnet_interfaces_max` (200, as in Lustre ≤ 2.17.0).
pub const INTERFACES_MAX_DEFAULT: u32 = 200;
/// `LNET_NI_STATUS_UP`.
pub const NI_STATUS_UP: u32 = 0x15aa_c0de;
/// `LNET_NI_STATUS_DOWN`.
pub const NI_STATUS_DOWN: u32 = 0xdead_face;
/// `LNET_NI_STATUS_INVALID`.
pub const NI_STATUS_INVALID: u32 = 0;

/// Ping feature bits (`pi_features`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PingFeatures(u32);

impl PingFeatures {
    /// `LNET_PING_FEAT_BASE`.
    pub const BASE: Self = Self(0x1);
    /// `LNET_PING_FEAT_NI_STATUS` (always set).
    pub const NI_STATUS: Self = Self(0x2);
    /// `LNET_PING_FEAT_RTE_DISABLED`: routing disabled on the node.
    pub const RTE_DISABLED: Self = Self(0x4);
    /// `LNET_PING_FEAT_MULTI_RAIL` (set by Multi-Rail capable nodes).
    pub const MULTI_RAIL: Self = Self(0x8);
    /// `LNET_PING_FEAT_DISCOVERY`: discovery enabled on the node.
    pub const DISCOVERY: Self = Self(0x10);
    /// `LNET_PING_FEAT_LARGE_ADDR`: large NIDs follow the 8-byte ones.
    pub const LARGE_ADDR: Self = Self(0x20);
    /// `LNET_PING_FEAT_PRIMARY_LARGE`: the primary NID is a large NID.
    pub const PRIMARY_LARGE: Self = Self(0x40);
    /// `LNET_PING_FEAT_METADATA`.
    pub const METADATA: Self = Self(0x80);
    /// `LNET_PING_FEAT_BITS`: every known bit.
    pub const ALL: Self = Self(0xff);

    /// Features from raw bits, dropping unknown ones.
    #[must_use]
    pub const fn from_bits_truncate(bits: u32) -> Self {
        Self(bits & Self::ALL.0)
    }
}

bit_set!(PingFeatures);

impl fmt::Debug for PingFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 8] = [
            "BASE",
            "NI_STATUS",
            "RTE_DISABLED",
            "MULTI_RAIL",
            "DISCOVERY",
            "LARGE_ADDR",
            "PRIMARY_LARGE",
            "METADATA",
        ];
        let set: Vec<&str> = NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        write!(f, "PingFeatures({})", set.join("|"))
    }
}

/// The status an interface reports in a ping buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NiStatus {
    /// `LNET_NI_STATUS_UP`.
    Up,
    /// `LNET_NI_STATUS_DOWN`.
    Down,
    /// `LNET_NI_STATUS_INVALID`.
    Invalid,
}

impl NiStatus {
    /// The wire value.
    #[must_use]
    pub const fn to_u32(self) -> u32 {
        match self {
            Self::Up => NI_STATUS_UP,
            Self::Down => NI_STATUS_DOWN,
            Self::Invalid => NI_STATUS_INVALID,
        }
    }

    /// The status for a wire value.
    ///
    /// # Errors
    /// [`WireError::BadNiStatus`] for any other value.
    pub const fn from_u32(v: u32) -> Result<Self, WireError> {
        match v {
            NI_STATUS_UP => Ok(Self::Up),
            NI_STATUS_DOWN => Ok(Self::Down),
            NI_STATUS_INVALID => Ok(Self::Invalid),
            other => Err(WireError::BadNiStatus(other)),
        }
    }
}

/// One interface (entry 1 and later) of a ping buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PingNi {
    /// The interface NID.
    pub nid: Nid,
    /// Its status.
    pub status: NiStatus,
    /// `ns_msg_size` (0 for 8-byte NIDs).
    pub msg_size: u32,
}

/// A validated ping buffer (`struct lnet_ping_info`).
///
/// Entry 0 (`0@lo` with the sequence number) is implicit: it is produced by
/// [`PingInfo::encode`] from [`PingInfo::seqno`] and checked and removed by
/// [`PingInfo::decode`]. `nis[0]`, if any, is the primary NID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PingInfo {
    /// Feature bits.
    pub features: PingFeatures,
    /// Pid of the pinged process.
    pub pid: Pid,
    /// Ping-target sequence number (entry 0's status field).
    pub seqno: u32,
    /// Entry 0's `msg_size` (total size when large NIDs follow, else 0).
    pub lo_msg_size: u32,
    /// The node's interfaces, primary first.
    pub nis: Vec<PingNi>,
}

impl PingInfo {
    /// The primary NID (entry 1), if the node listed any interface besides `0@lo`.
    #[must_use]
    pub fn primary_nid(&self) -> Option<Nid> {
        self.nis.first().map(|n| n.nid)
    }

    /// `pi_nnis`: entries on the wire including `0@lo`.
    #[must_use]
    pub fn nnis(&self) -> usize {
        self.nis.len() + 1
    }

    /// Size of the encoded buffer.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        PING_HEADER_LEN + PING_ENTRY_LEN * self.nnis()
    }

    /// Encodes the buffer (little-endian, entry 0 = `0@lo` carrying `seqno`).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        let mut w = Writer::new(&mut out);
        w.put_u32(PING_MAGIC);
        w.put_u32(self.features.bits());
        w.put_u32(self.pid);
        w.put_u32(u32::try_from(self.nnis()).unwrap_or(u32::MAX));
        let mut entry = |nid: Nid, status: u32, size: u32| {
            w.put_u64(nid.as_u64());
            w.put_u32(status);
            w.put_u32(size);
        };
        entry(Nid::LO_0, self.seqno, self.lo_msg_size);
        for ni in &self.nis {
            entry(ni.nid, ni.status.to_u32(), ni.msg_size);
        }
        out
    }

    /// Decodes with the default interface limit ([`INTERFACES_MAX_DEFAULT`]).
    ///
    /// # Errors
    /// As [`PingInfo::decode_with_limit`].
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        Self::decode_with_limit(buf, INTERFACES_MAX_DEFAULT)
    }

    /// Decodes and validates a ping buffer of either byte order (Lustre sends
    /// it in the sender's order; a byte-swapped magic means "swap").
    ///
    /// Unknown feature bits are dropped (as Lustre's discovery does); bytes
    /// after the last 8-byte entry (large-NID entries) are ignored.
    ///
    /// # Errors
    /// Bad magic, missing NI_STATUS feature, interface count outside
    /// `1..=max_nis`, [`WireError::Truncated`] when the buffer holds fewer
    /// entries than it announces, entry 0 not `0@lo`, a bad status value, or a
    /// large primary NID.
    pub fn decode_with_limit(buf: &[u8], max_nis: u32) -> Result<Self, WireError> {
        let too_short = |_: Short| WireError::TooShort {
            needed: PING_HEADER_LEN,
            got: buf.len(),
        };
        let head = Reader::new(buf).bytes(PING_HEADER_LEN).map_err(too_short)?;
        // The magic, read little-endian, tells the sender's byte order.
        let raw_magic = Reader::new(head).u32().map_err(too_short)?;
        let endian = if raw_magic == PING_MAGIC {
            Endian::Little
        } else if raw_magic.swap_bytes() == PING_MAGIC {
            Endian::Big
        } else {
            return Err(WireError::BadMagic(raw_magic));
        };
        let mut r = Reader::with_endian(buf, endian);
        r.skip(4).map_err(too_short)?;
        let features = PingFeatures::from_bits_truncate(r.u32().map_err(too_short)?);
        if !features.contains(PingFeatures::NI_STATUS) {
            return Err(WireError::NoNiStatus);
        }
        if features.contains(PingFeatures::PRIMARY_LARGE) {
            return Err(WireError::LargePrimaryUnsupported);
        }
        let pid = r.u32().map_err(too_short)?;
        let nnis = r.u32().map_err(too_short)?;
        if nnis == 0 || nnis > max_nis {
            return Err(WireError::BadInterfaceCount { nnis, max: max_nis });
        }
        let needed = PING_HEADER_LEN + PING_ENTRY_LEN * nnis as usize;
        let truncated = || WireError::Truncated {
            needed,
            got: buf.len(),
        };
        if buf.len() < needed {
            return Err(truncated());
        }
        let mut entry = || read_entry(&mut r).map_err(|_| truncated());
        let (lo, seqno, lo_msg_size) = entry()?;
        if lo != Nid::LO_0 {
            return Err(WireError::FirstNotLoopback(lo));
        }
        let mut nis = Vec::with_capacity(nnis as usize - 1);
        for _ in 1..nnis {
            let (nid, status, msg_size) = entry()?;
            nis.push(PingNi {
                nid,
                status: NiStatus::from_u32(status)?,
                msg_size,
            });
        }
        Ok(Self {
            features,
            pid,
            seqno,
            lo_msg_size,
            nis,
        })
    }
}

/// One `lnet_ni_status` entry: NID, status and message size.
fn read_entry(r: &mut Reader<'_>) -> Result<(Nid, u32, u32), Short> {
    Ok((Nid::from_u64(r.u64()?), r.u32()?, r.u32()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LNET_PID_LUSTRE;
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn put_header() -> Header {
        Header {
            dest_nid: nid("10.0.0.2@tcp"),
            src_nid: nid("10.0.0.1@tcp"),
            dest_pid: LNET_PID_LUSTRE,
            src_pid: 7,
            payload_length: 5,
            body: Body::Put {
                ack_wmd: WireHandle {
                    interface_cookie: 0x1111,
                    object_cookie: 0x2222,
                },
                match_bits: 0x0102_0304_0506_0708,
                hdr_data: 0xdead_beef,
                ptl_index: 42,
                offset: 100,
            },
        }
    }

    #[test]
    fn put_offsets_are_byte_exact() {
        let b = put_header().encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[0..8], &nid("10.0.0.2@tcp").as_u64().to_le_bytes());
        assert_eq!(&b[8..16], &[1, 0, 0, 10, 0, 0, 2, 0]);
        assert_eq!(&b[16..20], &12345u32.to_le_bytes());
        assert_eq!(&b[20..24], &7u32.to_le_bytes());
        assert_eq!(&b[24..28], &1u32.to_le_bytes());
        assert_eq!(&b[28..32], &5u32.to_le_bytes());
        assert_eq!(&b[32..40], &0x1111u64.to_le_bytes());
        assert_eq!(&b[40..48], &0x2222u64.to_le_bytes());
        assert_eq!(&b[48..56], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[56..64], &0xdead_beefu64.to_le_bytes());
        assert_eq!(&b[64..68], &42u32.to_le_bytes());
        assert_eq!(&b[68..72], &100u32.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap(), put_header());
    }

    #[test]
    fn get_ack_reply_hello_offsets() {
        let mut h = put_header();
        h.payload_length = 0;
        h.body = Body::Get {
            return_wmd: WireHandle::NONE,
            match_bits: 9,
            ptl_index: 3,
            src_offset: 4,
            sink_length: 5,
        };
        let b = h.encode();
        assert_eq!(&b[24..28], &2u32.to_le_bytes());
        assert_eq!(&b[32..48], &[0xff; 16]);
        assert_eq!(&b[48..56], &9u64.to_le_bytes());
        assert_eq!(&b[56..60], &3u32.to_le_bytes());
        assert_eq!(&b[60..64], &4u32.to_le_bytes());
        assert_eq!(&b[64..68], &5u32.to_le_bytes());
        assert_eq!(&b[68..72], &[0; 4]);

        h.body = Body::Ack {
            dst_wmd: WireHandle {
                interface_cookie: 1,
                object_cookie: 2,
            },
            match_bits: 3,
            mlength: 4,
        };
        let b = h.encode();
        assert_eq!(&b[24..28], &0u32.to_le_bytes());
        assert_eq!(&b[48..56], &3u64.to_le_bytes());
        assert_eq!(&b[56..60], &4u32.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap(), h);

        h.body = Body::Hello {
            incarnation: 77,
            conn_type: 2,
        };
        let b = h.encode();
        assert_eq!(&b[24..28], &4u32.to_le_bytes());
        assert_eq!(&b[32..40], &77u64.to_le_bytes());
        assert_eq!(&b[40..44], &2u32.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap(), h);
    }

    #[test]
    fn reply_ignores_leftover_get_fields() {
        let mut h = put_header();
        h.payload_length = 0;
        h.body = Body::Get {
            return_wmd: WireHandle {
                interface_cookie: 5,
                object_cookie: 6,
            },
            match_bits: 9,
            ptl_index: 3,
            src_offset: 4,
            sink_length: 5,
        };
        let mut b = h.encode();
        b[24..28].copy_from_slice(&3u32.to_le_bytes());
        let r = Header::decode(&b).unwrap();
        assert_eq!(
            r.body,
            Body::Reply {
                dst_wmd: WireHandle {
                    interface_cookie: 5,
                    object_cookie: 6
                }
            }
        );
    }

    #[test]
    fn header_validation() {
        assert_eq!(
            Header::decode(&[0u8; 71]),
            Err(WireError::TooShort {
                needed: 72,
                got: 71
            })
        );
        let mut b = put_header().encode();
        b[24..28].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(Header::decode(&b), Err(WireError::UnknownType(5)));

        let mut b = put_header().encode();
        b[28..32].copy_from_slice(&(LNET_MTU + 1).to_le_bytes());
        assert_eq!(
            Header::decode(&b),
            Err(WireError::PayloadTooLarge(LNET_MTU + 1))
        );
        b[28..32].copy_from_slice(&LNET_MTU.to_le_bytes());
        assert!(Header::decode(&b).is_ok());

        // A portal beyond the table decodes: matching drops it (lnet.md 2.2).
        let mut b = put_header().encode();
        b[64..68].copy_from_slice(&64u32.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap().body.portal(), Some(64));

        // ACK and GET with payload are protocol errors.
        for ty in [0u32, 2] {
            let mut b = put_header().encode();
            b[24..28].copy_from_slice(&ty.to_le_bytes());
            b[56..60].copy_from_slice(&0u32.to_le_bytes());
            assert!(matches!(
                Header::decode(&b),
                Err(WireError::PayloadNotAllowed { len: 5, .. })
            ));
        }
    }

    #[test]
    fn messages_check_payload_length() {
        let h = put_header();
        let m = Message::new(h, b"hello".to_vec()).unwrap();
        let bytes = m.encode();
        assert_eq!(bytes.len(), 77);
        assert_eq!(Message::decode(&bytes).unwrap(), m);
        assert_eq!(
            decode_message(&bytes[..76]),
            Err(WireError::PayloadLengthMismatch {
                header: 5,
                actual: 4
            })
        );
        let mut g = h;
        g.body = Body::Reply {
            dst_wmd: WireHandle::NONE,
        };
        assert!(Message::new(g, vec![0; LNET_MTU as usize + 1]).is_err());
        g.body = Body::Get {
            return_wmd: WireHandle::NONE,
            match_bits: 0,
            ptl_index: 0,
            src_offset: 0,
            sink_length: 0,
        };
        assert!(matches!(
            Message::new(g, vec![1]),
            Err(WireError::PayloadNotAllowed { .. })
        ));
    }

    fn ping_sample() -> PingInfo {
        PingInfo {
            features: PingFeatures::BASE
                .with(PingFeatures::NI_STATUS)
                .with(PingFeatures::MULTI_RAIL)
                .with(PingFeatures::DISCOVERY),
            pid: LNET_PID_LUSTRE,
            seqno: 3,
            lo_msg_size: 0,
            nis: vec![
                PingNi {
                    nid: nid("10.0.0.1@tcp"),
                    status: NiStatus::Up,
                    msg_size: 0,
                },
                PingNi {
                    nid: nid("192.168.1.1@o2ib1"),
                    status: NiStatus::Down,
                    msg_size: 0,
                },
            ],
        }
    }

    #[test]
    fn ping_layout() {
        let p = ping_sample();
        let b = p.encode();
        assert_eq!(b.len(), 16 + 3 * 16);
        assert_eq!(&b[0..4], &[0x67, 0x6e, 0x69, 0x70]);
        assert_eq!(&b[4..8], &0x1bu32.to_le_bytes());
        assert_eq!(&b[8..12], &12345u32.to_le_bytes());
        assert_eq!(&b[12..16], &3u32.to_le_bytes());
        // Entry 0: 0@lo with the sequence number in the status field.
        assert_eq!(&b[16..24], &Nid::LO_0.as_u64().to_le_bytes());
        assert_eq!(&b[24..28], &3u32.to_le_bytes());
        // Entry 1: primary NID, UP.
        assert_eq!(&b[32..40], &nid("10.0.0.1@tcp").as_u64().to_le_bytes());
        assert_eq!(&b[40..44], &NI_STATUS_UP.to_le_bytes());
        assert_eq!(&b[56..60], &NI_STATUS_DOWN.to_le_bytes());
        let d = PingInfo::decode(&b).unwrap();
        assert_eq!(d, p);
        assert_eq!(d.primary_nid(), Some(nid("10.0.0.1@tcp")));
        assert_eq!(PING_INFO_MIN_SIZE, 272);
    }

    #[test]
    fn ping_byte_swapped_is_accepted() {
        let p = ping_sample();
        let le = p.encode();
        // Re-encode big-endian: every u32/u64 field swapped.
        let mut be = Vec::new();
        for w in le[..16].chunks(4) {
            be.extend(w.iter().rev());
        }
        for e in le[16..].chunks(16) {
            be.extend(e[..8].iter().rev());
            be.extend(e[8..12].iter().rev());
            be.extend(e[12..16].iter().rev());
        }
        assert_eq!(PingInfo::decode(&be).unwrap(), p);
    }

    #[test]
    fn ping_validation() {
        let p = ping_sample();
        let b = p.encode();
        let mut bad = b.clone();
        bad[0] = 0;
        assert!(matches!(
            PingInfo::decode(&bad),
            Err(WireError::BadMagic(_))
        ));
        let mut bad = b.clone();
        bad[4..8].copy_from_slice(&0x1u32.to_le_bytes());
        assert_eq!(PingInfo::decode(&bad), Err(WireError::NoNiStatus));
        let mut bad = b.clone();
        bad[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            PingInfo::decode(&bad),
            Err(WireError::BadInterfaceCount { nnis: 0, .. })
        ));
        assert!(matches!(
            PingInfo::decode_with_limit(&b, 2),
            Err(WireError::BadInterfaceCount { nnis: 3, max: 2 })
        ));
        assert_eq!(
            PingInfo::decode(&b[..40]),
            Err(WireError::Truncated {
                needed: 64,
                got: 40
            })
        );
        let mut bad = b.clone();
        bad[16..24].copy_from_slice(&nid("10.0.0.1@tcp").as_u64().to_le_bytes());
        assert!(matches!(
            PingInfo::decode(&bad),
            Err(WireError::FirstNotLoopback(_))
        ));
        let mut bad = b.clone();
        bad[40..44].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(PingInfo::decode(&bad), Err(WireError::BadNiStatus(7)));
        let mut bad = b.clone();
        bad[4..8].copy_from_slice(&0x42u32.to_le_bytes());
        assert_eq!(
            PingInfo::decode(&bad),
            Err(WireError::LargePrimaryUnsupported)
        );
        // Unknown feature bits are dropped, trailing bytes ignored.
        let mut odd = b.clone();
        odd[4..8].copy_from_slice(&0x11bu32.to_le_bytes());
        odd.extend_from_slice(&[0xaa; 8]);
        assert_eq!(PingInfo::decode(&odd).unwrap(), p);
        assert_eq!(
            format!("{:?}", p.features),
            "PingFeatures(BASE|NI_STATUS|MULTI_RAIL|DISCOVERY)"
        );
    }

    fn any_handle() -> impl Strategy<Value = WireHandle> {
        (any::<u64>(), any::<u64>()).prop_map(|(i, o)| WireHandle {
            interface_cookie: i,
            object_cookie: o,
        })
    }

    fn any_body() -> impl Strategy<Value = (Body, u32)> {
        prop_oneof![
            (any_handle(), any::<u64>(), any::<u32>()).prop_map(|(h, m, l)| (
                Body::Ack {
                    dst_wmd: h,
                    match_bits: m,
                    mlength: l
                },
                0
            )),
            (
                any_handle(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                0..=LNET_MTU
            )
                .prop_map(|(h, m, d, p, o, len)| (
                    Body::Put {
                        ack_wmd: h,
                        match_bits: m,
                        hdr_data: d,
                        ptl_index: p,
                        offset: o
                    },
                    len
                )),
            (
                any_handle(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(h, m, p, o, s)| (
                    Body::Get {
                        return_wmd: h,
                        match_bits: m,
                        ptl_index: p,
                        src_offset: o,
                        sink_length: s
                    },
                    0
                )),
            (any_handle(), 0..=LNET_MTU).prop_map(|(h, len)| (Body::Reply { dst_wmd: h }, len)),
            (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(i, t, len)| (
                Body::Hello {
                    incarnation: i,
                    conn_type: t
                },
                len
            )),
        ]
    }

    fn any_header() -> impl Strategy<Value = Header> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any_body(),
        )
            .prop_map(|(d, s, dp, sp, (body, len))| Header {
                dest_nid: Nid::from_u64(d),
                src_nid: Nid::from_u64(s),
                dest_pid: dp,
                src_pid: sp,
                payload_length: len,
                body,
            })
    }

    fn any_ping() -> impl Strategy<Value = PingInfo> {
        let ni = (
            any::<u64>(),
            prop_oneof![
                Just(NiStatus::Up),
                Just(NiStatus::Down),
                Just(NiStatus::Invalid)
            ],
            any::<u32>(),
        )
            .prop_map(|(n, status, msg_size)| PingNi {
                nid: Nid::from_u64(n),
                status,
                msg_size,
            });
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            proptest::collection::vec(ni, 0..20),
        )
            .prop_map(|(f, pid, seqno, lo_msg_size, nis)| PingInfo {
                features: PingFeatures::from_bits_truncate(f)
                    .with(PingFeatures::NI_STATUS)
                    .without(PingFeatures::PRIMARY_LARGE),
                pid,
                seqno,
                lo_msg_size,
                nis,
            })
    }

    proptest! {
        #[test]
        fn header_round_trip(h in any_header()) {
            let b = h.encode();
            prop_assert_eq!(Header::decode(&b).unwrap(), h);
        }

        #[test]
        fn header_random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..160)) {
            if let Ok(h) = Header::decode(&b) {
                // Whatever decodes re-encodes to a header that decodes the same.
                prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
            }
            let _ = decode_message(&b);
        }

        #[test]
        fn header_random_fields_never_panic(
            mut b in proptest::collection::vec(any::<u8>(), 72..100),
            ty in 0u32..7,
            len in prop_oneof![0u32..4, Just(LNET_MTU), any::<u32>()],
        ) {
            b[24..28].copy_from_slice(&ty.to_le_bytes());
            b[28..32].copy_from_slice(&len.to_le_bytes());
            match Header::decode(&b) {
                Ok(h) => {
                    prop_assert!(ty <= 4);
                    prop_assert_eq!(Header::decode(&h.encode()).unwrap(), h);
                    let m = decode_message(&b);
                    prop_assert_eq!(m.is_ok(), b.len() - HEADER_LEN == len as usize);
                }
                Err(e) => {
                    if ty > 4 {
                        prop_assert_eq!(e, WireError::UnknownType(ty));
                    }
                }
            }
        }

        #[test]
        fn ping_round_trip(p in any_ping()) {
            let b = p.encode();
            prop_assert_eq!(b.len(), p.encoded_len());
            prop_assert_eq!(PingInfo::decode(&b).unwrap(), p);
        }

        #[test]
        fn ping_random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(p) = PingInfo::decode(&b) {
                prop_assert_eq!(PingInfo::decode(&p.encode()).unwrap(), p);
            }
        }

        #[test]
        fn ping_random_entries_never_panic(
            rest in proptest::collection::vec(any::<u8>(), 0..200),
            features in any::<u32>(),
            nnis in 0u32..16,
        ) {
            let mut b = Vec::new();
            b.extend_from_slice(&PING_MAGIC.to_le_bytes());
            b.extend_from_slice(&features.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&nnis.to_le_bytes());
            b.extend_from_slice(&rest);
            if let Ok(p) = PingInfo::decode(&b) {
                prop_assert_eq!(p.nnis(), nnis as usize);
                prop_assert_eq!(PingInfo::decode(&p.encode()).unwrap(), p);
            }
        }

        #[test]
        fn ping_corrupted_never_panics(p in any_ping(), idx in any::<usize>(), byte in any::<u8>()) {
            let mut b = p.encode();
            let i = idx % b.len();
            b[i] = byte;
            let _ = PingInfo::decode(&b);
            let cut = idx % (b.len() + 1);
            let _ = PingInfo::decode(&b[..cut]);
        }
    }
}
