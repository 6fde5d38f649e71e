//! Framing after the HELLO: the `ksock_msg` header (`struct ksock_msg_hdr`,
//! `socklnd-idl.h`) and the two-step receiver of a connection's byte stream
//! (`ksocknal_process_receive`, `socklnd_cb.c`).
//!
//! Every message is a 24-byte header in the sender's byte order, followed
//! for an LNet message by the 72-byte little-endian LNet header
//! ([`crate::wire::Header`]) and `payload_length` bytes of payload:
//!
//! ```text
//! off size field
//!   0  4   ksh_type           0xc0 NOOP, 0xc1 LNET
//!   4  4   ksh_csum           0 = none; else the checksum (see below)
//!   8  8   ksh_zc_cookies[0]  zero-copy request: the receiver must ACK it
//!  16  8   ksh_zc_cookies[1]  zero-copy ACK (1 = keepalive ping)
//!  24 72   LNet header        LNET only
//!  96  n   payload            LNET only, n = payload_length ≤ 1 MiB
//! ```
//!
//! Checksum: with protocol V3 a receiver checks `ksh_csum`, when it is not
//! 0, against Linux's `crc32_le(~0, payload)` (headers excluded; an empty
//! payload gives 0xFFFFFFFF, which is also the only value a NOOP may carry).
//! Lustre itself only fills it on V2 connections; we fill it on request
//! ([`super::Tunables::enable_csum`]) the way a V3 Lustre receiver checks it.
//!
//! Zero copy: a Lustre sender may put a cookie in `zc_cookies[0]` of a large
//! message and hold the message until the receiver sends it back in a NOOP
//! ([`KsockMsgHeader::zc_ack`]); the receiver tells the driver when
//! ([`PayloadDone::zc_request`]). We never ask for zero-copy ACKs ourselves.

use colibri_wire::{Endian, Reader, Writer};

use crate::ids::ProcessId;
use crate::wire::{HEADER_LEN, Header, LNET_MTU, MsgType, WireError};

const TARGET: &str = "colibri_lnet::socklnd";

/// `KSOCK_MSG_NOOP`.
pub const KSOCK_MSG_NOOP: u32 = 0xc0;
/// `KSOCK_MSG_LNET`.
pub const KSOCK_MSG_LNET: u32 = 0xc1;
/// Size of the `ksock_msg` header.
pub const KSOCK_MSG_HDR_LEN: usize = 24;
/// Size of the headers in front of an LNet payload (24 + 72).
pub const LNET_FRAME_HDR_LEN: usize = KSOCK_MSG_HDR_LEN + HEADER_LEN;
/// `SOCKNAL_KEEPALIVE_PING`: the zero-copy ACK cookie of a keepalive NOOP.
pub const KEEPALIVE_PING_COOKIE: u64 = 1;
/// The checksum of no bytes: the only checksum a NOOP may carry on V3.
pub const EMPTY_CHECKSUM: u32 = 0xFFFF_FFFF;

/// Errors decoding frames; every one closes the connection (Lustre's
/// `-EPROTO`/`-EIO`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer bytes than the header needs.
    #[error("ksock_msg header too short: need {needed} bytes, got {got}")]
    Short {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The receiver was given another number of bytes than it asked for.
    #[error("wrong length: expected {expected} bytes, got {got}")]
    WrongLength {
        /// Bytes asked for.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A call that does not fit what the receiver asked for.
    #[error("receiver asked for {wanted}, not {called}")]
    OutOfOrder {
        /// What the receiver wanted.
        wanted: &'static str,
        /// What was called.
        called: &'static str,
    },
    /// The receiver failed earlier; the connection must be closed.
    #[error("receiver failed earlier; close the connection")]
    Closed,
    /// Neither NOOP nor LNET.
    #[error("unknown ksock_msg type {0:#x}")]
    UnknownType(u32),
    /// A NOOP carrying a checksum other than that of no bytes.
    #[error("NOOP checksum error: wire {0:#010x}")]
    NoopChecksum(u32),
    /// Zero-copy ACK cookies that cannot go together (a keepalive cookie
    /// with another one).
    #[error("bad zero-copy ACK cookies {0:#x}, {1:#x}")]
    BadZcAck(u64, u64),
    /// The LNet header failed validation (payload over `LNET_MTU`, bad
    /// type, payload on ACK/GET, portal out of range, ...).
    #[error("bad LNet header: {0}")]
    Header(#[from] WireError),
    /// An LNet HELLO header outside the handshake.
    #[error("LNet HELLO header in a ksock_msg")]
    HelloInFrame,
    /// A payload larger than `LNET_MTU`.
    #[error("payload length {0} exceeds LNET_MTU")]
    PayloadTooLarge(u32),
    /// The payload's checksum does not match the header's.
    #[error("checksum error: wire {wire:#010x}, data {computed:#010x}")]
    ChecksumMismatch {
        /// `ksh_csum`.
        wire: u32,
        /// What the receiver computed.
        computed: u32,
    },
}

/// The `ksock_msg` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KsockMsgType {
    /// `KSOCK_MSG_NOOP`: keepalive or zero-copy ACK, nothing follows.
    Noop,
    /// `KSOCK_MSG_LNET`: an LNet header and payload follow.
    Lnet,
}

impl KsockMsgType {
    /// The wire value.
    #[must_use]
    pub const fn to_u32(self) -> u32 {
        match self {
            Self::Noop => KSOCK_MSG_NOOP,
            Self::Lnet => KSOCK_MSG_LNET,
        }
    }
}

/// The 24-byte `ksock_msg` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KsockMsgHeader {
    /// NOOP or LNET.
    pub msg_type: KsockMsgType,
    /// Checksum, 0 = none.
    pub csum: u32,
    /// `[zero-copy request, zero-copy ACK]`.
    pub zc_cookies: [u64; 2],
}

impl KsockMsgHeader {
    /// The header of an LNet message without checksum or cookies.
    #[must_use]
    pub const fn lnet() -> Self {
        Self {
            msg_type: KsockMsgType::Lnet,
            csum: 0,
            zc_cookies: [0, 0],
        }
    }

    /// A keepalive NOOP (cookie `SOCKNAL_KEEPALIVE_PING`).
    #[must_use]
    pub const fn keepalive() -> Self {
        Self::zc_ack(KEEPALIVE_PING_COOKIE)
    }

    /// A NOOP acknowledging the zero-copy request `cookie`.
    #[must_use]
    pub const fn zc_ack(cookie: u64) -> Self {
        Self {
            msg_type: KsockMsgType::Noop,
            csum: 0,
            zc_cookies: [0, cookie],
        }
    }

    /// The 24 bytes on the wire (little-endian).
    #[must_use]
    pub fn encode(&self) -> [u8; KSOCK_MSG_HDR_LEN] {
        let mut w = Writer::new([0u8; KSOCK_MSG_HDR_LEN]);
        w.put_u32(self.msg_type.to_u32());
        w.put_u32(self.csum);
        w.put_u64(self.zc_cookies[0]);
        w.put_u64(self.zc_cookies[1]);
        w.into_inner()
    }

    /// Decodes the first 24 bytes of `buf`, sent in byte order `order` (the
    /// peer's, from its HELLO).
    ///
    /// # Errors
    /// [`FrameError::Short`] or [`FrameError::UnknownType`].
    pub fn decode(buf: &[u8], order: Endian) -> Result<Self, FrameError> {
        let short = || FrameError::Short {
            needed: KSOCK_MSG_HDR_LEN,
            got: buf.len(),
        };
        let mut r = Reader::with_endian(buf, order);
        let ty = r.u32().map_err(|_| short())?;
        let csum = r.u32().map_err(|_| short())?;
        let z0 = r.u64().map_err(|_| short())?;
        let z1 = r.u64().map_err(|_| short())?;
        let msg_type = match ty {
            KSOCK_MSG_NOOP => KsockMsgType::Noop,
            KSOCK_MSG_LNET => KsockMsgType::Lnet,
            t => return Err(FrameError::UnknownType(t)),
        };
        Ok(Self {
            msg_type,
            csum,
            zc_cookies: [z0, z1],
        })
    }

    /// The checksum to verify, if the sender put one.
    #[must_use]
    pub const fn checksum(&self) -> Option<u32> {
        if self.csum == 0 {
            None
        } else {
            Some(self.csum)
        }
    }

    /// The zero-copy ACK this header carries, if any; keepalive pings are
    /// not ACKs (`ksocknal_handle_zcack` with the V3 rules).
    ///
    /// # Errors
    /// [`FrameError::BadZcAck`]: a keepalive cookie together with another.
    pub fn zc_ack_cookies(&self) -> Result<Option<ZcAck>, FrameError> {
        let [c0, c1] = self.zc_cookies;
        if c1 == 0 {
            return Ok(None);
        }
        // Only a NOOP's first cookie is part of its ACK; an LNet message's
        // first cookie is its own zero-copy request.
        let first = match self.msg_type {
            KsockMsgType::Noop => c0,
            KsockMsgType::Lnet => 0,
        };
        let ack = ZcAck::from_cookies(first, c1);
        if c1 == KEEPALIVE_PING_COOKIE {
            return match ack {
                ZcAck::One(_) => Ok(None),
                _ => Err(FrameError::BadZcAck(c0, c1)),
            };
        }
        Ok(Some(ack))
    }

    /// The zero-copy request of an LNet message (`zc_cookies[0]`).
    #[must_use]
    pub const fn zc_request(&self) -> Option<u64> {
        match self.msg_type {
            KsockMsgType::Lnet if self.zc_cookies[0] != 0 => Some(self.zc_cookies[0]),
            _ => None,
        }
    }
}

/// The zero-copy requests a NOOP or LNet message acknowledges
/// (`ksocknal_handle_zcack`: cookies `c1`, `c2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZcAck {
    /// One cookie.
    One(u64),
    /// Two separate cookies (`c1 > c2`).
    Two(u64, u64),
    /// Every cookie from `first` to `last` (`c1 < c2`).
    Range {
        /// First cookie.
        first: u64,
        /// Last cookie.
        last: u64,
    },
}

impl ZcAck {
    /// The set Lustre reads from cookies `c1` and `c2` (`c2` not 0).
    #[must_use]
    pub const fn from_cookies(c1: u64, c2: u64) -> Self {
        let c1 = if c1 == 0 { c2 } else { c1 };
        if c1 == c2 {
            Self::One(c2)
        } else if c1 > c2 {
            Self::Two(c1, c2)
        } else {
            Self::Range {
                first: c1,
                last: c2,
            }
        }
    }

    /// Whether `cookie` is acknowledged.
    #[must_use]
    pub const fn contains(&self, cookie: u64) -> bool {
        match *self {
            Self::One(c) => cookie == c,
            Self::Two(a, b) => cookie == a || cookie == b,
            Self::Range { first, last } => first <= cookie && cookie <= last,
        }
    }

    /// How many requests are acknowledged; Lustre closes the connection
    /// unless exactly that many were pending.
    #[must_use]
    pub const fn count(&self) -> u64 {
        match *self {
            Self::One(_) => 1,
            Self::Two(..) => 2,
            Self::Range { first, last } => last.saturating_sub(first).saturating_add(1),
        }
    }
}

/// A received NOOP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Noop {
    /// Its header.
    pub ksock: KsockMsgHeader,
    /// Whether it is a keepalive ping (nothing to do but note the peer is
    /// alive).
    pub keepalive: bool,
    /// The zero-copy requests it acknowledges. A driver that never asks for
    /// zero-copy ACKs treats any as a protocol error, as Lustre does for
    /// unknown cookies.
    pub zc_ack: Option<ZcAck>,
}

/// A received or outgoing LNet message's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LnetFrame {
    /// The `ksock_msg` header.
    pub ksock: KsockMsgHeader,
    /// The LNet header; `payload_length` bytes follow.
    pub header: Header,
}

impl LnetFrame {
    /// An LNet message without checksum or zero-copy cookies.
    #[must_use]
    pub const fn new(header: Header) -> Self {
        Self {
            ksock: KsockMsgHeader::lnet(),
            header,
        }
    }

    /// The same message carrying `csum` (see [`super::payload_checksum`]).
    #[must_use]
    pub const fn with_checksum(mut self, csum: u32) -> Self {
        self.ksock.csum = csum;
        self
    }

    /// The 96 bytes in front of the payload (the `ksock_msg` type is always
    /// LNET; little-endian).
    #[must_use]
    pub fn encode(&self) -> [u8; LNET_FRAME_HDR_LEN] {
        let mut out = [0u8; LNET_FRAME_HDR_LEN];
        let ksock = KsockMsgHeader {
            msg_type: KsockMsgType::Lnet,
            ..self.ksock
        };
        out[..KSOCK_MSG_HDR_LEN].copy_from_slice(&ksock.encode());
        out[KSOCK_MSG_HDR_LEN..].copy_from_slice(&self.header.encode());
        out
    }
}

/// A frame's headers as the receiver yields them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A NOOP; complete.
    Noop(Noop),
    /// An LNet message; its payload comes next ([`Want::Payload`]).
    Lnet(LnetFrame),
}

/// What the receiver needs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Exactly this many header bytes, for [`FrameReceiver::handle_header`].
    Header(usize),
    /// The payload of the last LNet message: read these bytes wherever they
    /// belong (or discard them), then call
    /// [`FrameReceiver::payload_received`] (also when the length is 0).
    Payload(u32),
    /// Nothing: a protocol error was found; close the connection.
    Done,
}

/// What the driver must do once a payload is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PayloadDone {
    /// A zero-copy request to acknowledge: send
    /// [`KsockMsgHeader::zc_ack`] of this cookie as a NOOP, on the
    /// connection [`super::PeerConns::choose`] gives for
    /// [`super::TxKind::Noop`] `{ nonblk: true }`.
    pub zc_request: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
enum RxState {
    KsockHeader,
    LnetHeader(KsockMsgHeader),
    Payload(KsockMsgHeader, u32),
    Failed,
}

/// The receiving half of one connection's framing: it says how many bytes
/// it wants, decodes headers, and lets the driver put payloads wherever it
/// likes; no payload byte passes through it.
///
/// ```
/// use colibri_lnet::socklnd::{Endian, Frame, FrameReceiver, LnetFrame, Want};
/// use colibri_lnet::wire::{Body, Header, WireHandle};
///
/// let header = Header {
///     dest_nid: "10.0.0.2@tcp".parse()?,
///     src_nid: "10.0.0.1@tcp".parse()?,
///     dest_pid: 12345,
///     src_pid: 12345,
///     payload_length: 5,
///     body: Body::Put {
///         ack_wmd: WireHandle::NONE,
///         match_bits: 7,
///         hdr_data: 0,
///         ptl_index: 4,
///         offset: 0,
///     },
/// };
/// let mut stream = LnetFrame::new(header).encode().to_vec();
/// stream.extend_from_slice(b"hello");
///
/// let mut rx = FrameReceiver::new(Endian::Little);
/// let mut at = 0;
/// let mut dest = Vec::new();
/// loop {
///     match rx.want() {
///         Want::Header(n) => {
///             if let Some(Frame::Lnet(f)) = rx.handle_header(&stream[at..at + n])? {
///                 assert_eq!(f.header, header);
///             }
///             at += n;
///         }
///         Want::Payload(n) => {
///             dest.extend_from_slice(&stream[at..at + n as usize]); // "elsewhere"
///             at += n as usize;
///             rx.payload_received(None)?;
///         }
///         Want::Done => unreachable!(),
///     }
///     if at == stream.len() {
///         break;
///     }
/// }
/// assert_eq!(dest, b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FrameReceiver {
    order: Endian,
    state: RxState,
    src_override: Option<ProcessId>,
}

impl FrameReceiver {
    /// A receiver for a connection whose peer sends in `order` (from
    /// [`super::ReceivedHello::byte_order`]).
    #[must_use]
    pub const fn new(order: Endian) -> Self {
        Self {
            order,
            state: RxState::KsockHeader,
            src_override: None,
        }
    }

    /// Replaces the source NID and pid of every received LNet header with
    /// `peer`, as Lustre does for a userspace peer (pid with
    /// `LNET_PID_USERFLAG`, see [`super::handshake::userspace_peer`]).
    #[must_use]
    pub const fn with_src_override(mut self, peer: ProcessId) -> Self {
        self.src_override = Some(peer);
        self
    }

    /// What to read next.
    #[must_use]
    pub const fn want(&self) -> Want {
        match self.state {
            RxState::KsockHeader => Want::Header(KSOCK_MSG_HDR_LEN),
            RxState::LnetHeader(_) => Want::Header(HEADER_LEN),
            RxState::Payload(_, n) => Want::Payload(n),
            RxState::Failed => Want::Done,
        }
    }

    /// Feeds exactly the header bytes [`FrameReceiver::want`] asked for.
    /// Returns a frame when its headers are complete (a NOOP after 24
    /// bytes, an LNet message after 24 + 72), else `None`.
    ///
    /// # Errors
    /// Any [`FrameError`]; the receiver then wants [`Want::Done`].
    pub fn handle_header(&mut self, bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
        let r = self.header_step(bytes);
        if let Err(e) = &r {
            if *e != FrameError::Closed {
                tracing::debug!(target: TARGET, error = %e, "socklnd frame rejected");
            }
            self.state = RxState::Failed;
        }
        r
    }

    fn header_step(&mut self, bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
        let expected = match self.want() {
            Want::Header(n) => n,
            Want::Payload(_) => {
                return Err(FrameError::OutOfOrder {
                    wanted: "payload",
                    called: "handle_header",
                });
            }
            Want::Done => return Err(FrameError::Closed),
        };
        if bytes.len() != expected {
            return Err(FrameError::WrongLength {
                expected,
                got: bytes.len(),
            });
        }
        match self.state {
            RxState::KsockHeader => {
                let ksock = KsockMsgHeader::decode(bytes, self.order)?;
                match ksock.msg_type {
                    KsockMsgType::Noop => {
                        if ksock.csum != 0 && ksock.csum != EMPTY_CHECKSUM {
                            return Err(FrameError::NoopChecksum(ksock.csum));
                        }
                        let zc_ack = ksock.zc_ack_cookies()?;
                        let keepalive =
                            zc_ack.is_none() && ksock.zc_cookies[1] == KEEPALIVE_PING_COOKIE;
                        Ok(Some(Frame::Noop(Noop {
                            ksock,
                            keepalive,
                            zc_ack,
                        })))
                    }
                    KsockMsgType::Lnet => {
                        // Checked now, as Lustre does on the header.
                        ksock.zc_ack_cookies()?;
                        self.state = RxState::LnetHeader(ksock);
                        Ok(None)
                    }
                }
            }
            RxState::LnetHeader(ksock) => {
                let mut header = Header::decode(bytes)?;
                if header.msg_type() == MsgType::Hello {
                    return Err(FrameError::HelloInFrame);
                }
                if header.payload_length > LNET_MTU {
                    return Err(FrameError::PayloadTooLarge(header.payload_length));
                }
                if let Some(peer) = self.src_override {
                    header.src_nid = peer.nid;
                    header.src_pid = peer.pid;
                }
                self.state = RxState::Payload(ksock, header.payload_length);
                Ok(Some(Frame::Lnet(LnetFrame { ksock, header })))
            }
            RxState::Payload(..) | RxState::Failed => Err(FrameError::Closed),
        }
    }

    /// Reports that the payload [`Want::Payload`] announced has been read
    /// (into its destination or discarded). `computed_csum` is the
    /// [`super::Crc32`] of the payload when the driver computed it (it
    /// should when the header carries a checksum and the whole payload was
    /// kept; Lustre skips the check for a truncated or discarded payload).
    ///
    /// # Errors
    /// [`FrameError::ChecksumMismatch`] (Lustre finalizes the message with
    /// `REMOTE_ERROR` and closes the connection), or a call out of order.
    pub fn payload_received(
        &mut self,
        computed_csum: Option<u32>,
    ) -> Result<PayloadDone, FrameError> {
        let RxState::Payload(ksock, _) = self.state else {
            let e = match self.state {
                RxState::Failed => FrameError::Closed,
                _ => FrameError::OutOfOrder {
                    wanted: "header",
                    called: "payload_received",
                },
            };
            self.state = RxState::Failed;
            return Err(e);
        };
        if let (Some(wire), Some(computed)) = (ksock.checksum(), computed_csum)
            && wire != computed
        {
            tracing::debug!(target: TARGET, wire, computed, "socklnd checksum error");
            self.state = RxState::Failed;
            return Err(FrameError::ChecksumMismatch { wire, computed });
        }
        self.state = RxState::KsockHeader;
        Ok(PayloadDone {
            zc_request: ksock.zc_request(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Nid;
    use crate::socklnd::payload_checksum;
    use crate::wire::{Body, WireHandle};
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn put(len: u32) -> Header {
        Header {
            dest_nid: nid("10.0.0.2@tcp"),
            src_nid: nid("10.0.0.1@tcp"),
            dest_pid: 12345,
            src_pid: 12345,
            payload_length: len,
            body: Body::Put {
                ack_wmd: WireHandle::NONE,
                match_bits: 0x42,
                hdr_data: 0,
                ptl_index: 4,
                offset: 0,
            },
        }
    }

    #[test]
    fn golden_ksock_headers() {
        // struct ksock_msg_hdr by hand: type, csum, cookies[0], cookies[1].
        let keepalive: [u8; 24] = [
            0xc0, 0, 0, 0, // KSOCK_MSG_NOOP
            0, 0, 0, 0, // no checksum
            0, 0, 0, 0, 0, 0, 0, 0, // no request
            1, 0, 0, 0, 0, 0, 0, 0, // SOCKNAL_KEEPALIVE_PING
        ];
        assert_eq!(KsockMsgHeader::keepalive().encode(), keepalive);
        let lnet: [u8; 24] = [
            0xc1, 0, 0, 0, // KSOCK_MSG_LNET
            0x78, 0x56, 0x34, 0x12, // csum 0x12345678
            0x05, 0, 0, 0, 0, 0, 0, 0, // ZC request 5
            0x09, 0, 0, 0, 0, 0, 0, 0, // ZC ACK 9
        ];
        let h = KsockMsgHeader {
            msg_type: KsockMsgType::Lnet,
            csum: 0x1234_5678,
            zc_cookies: [5, 9],
        };
        assert_eq!(h.encode(), lnet);
        assert_eq!(KsockMsgHeader::decode(&lnet, Endian::Little), Ok(h));
        // A big-endian sender's header.
        let mut be = Vec::new();
        be.extend_from_slice(&0xc1u32.to_be_bytes());
        be.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        be.extend_from_slice(&5u64.to_be_bytes());
        be.extend_from_slice(&9u64.to_be_bytes());
        assert_eq!(KsockMsgHeader::decode(&be, Endian::Big), Ok(h));
        assert_eq!(
            KsockMsgHeader::decode(&lnet[..23], Endian::Little),
            Err(FrameError::Short {
                needed: 24,
                got: 23
            })
        );
        let mut bad = lnet;
        bad[0] = 0xc2;
        assert_eq!(
            KsockMsgHeader::decode(&bad, Endian::Little),
            Err(FrameError::UnknownType(0xc2))
        );
    }

    #[test]
    fn golden_lnet_frame_prefix() {
        let f = LnetFrame::new(put(5)).with_checksum(payload_checksum(b"hello"));
        let bytes = f.encode();
        assert_eq!(bytes.len(), 96);
        assert_eq!(&bytes[..4], &[0xc1, 0, 0, 0]);
        assert_eq!(&bytes[4..8], &payload_checksum(b"hello").to_le_bytes());
        assert_eq!(&bytes[8..24], &[0; 16]);
        assert_eq!(&bytes[24..], &put(5).encode());
        // dest_nid of the LNet header right after the 24 bytes.
        assert_eq!(&bytes[24..32], &[2, 0, 0, 10, 0, 0, 2, 0]);
    }

    /// Feeds `stream` to a receiver in the steps it asks for; payload bytes
    /// go to `payloads`. Returns the frames, or the first error.
    fn drive(
        rx: &mut FrameReceiver,
        stream: &[u8],
        payloads: &mut Vec<Vec<u8>>,
    ) -> Result<Vec<Frame>, FrameError> {
        let mut frames = Vec::new();
        let mut at = 0;
        loop {
            match rx.want() {
                Want::Header(n) => {
                    let Some(bytes) = stream.get(at..at + n) else {
                        return Ok(frames);
                    };
                    at += n;
                    if let Some(f) = rx.handle_header(bytes)? {
                        frames.push(f);
                    }
                }
                Want::Payload(n) => {
                    let Some(bytes) = stream.get(at..at + n as usize) else {
                        return Ok(frames);
                    };
                    at += n as usize;
                    payloads.push(bytes.to_vec());
                    rx.payload_received(Some(payload_checksum(bytes)))?;
                }
                Want::Done => return Err(FrameError::Closed),
            }
        }
    }

    #[test]
    fn two_step_receive_of_messages_and_noops() {
        let mut stream = KsockMsgHeader::keepalive().encode().to_vec();
        stream.extend_from_slice(&LnetFrame::new(put(5)).encode());
        stream.extend_from_slice(b"hello");
        stream.extend_from_slice(&KsockMsgHeader::zc_ack(7).encode());
        let get = Header {
            payload_length: 0,
            body: Body::Get {
                return_wmd: WireHandle::NONE,
                match_bits: 1,
                ptl_index: 4,
                src_offset: 0,
                sink_length: 100,
            },
            ..put(0)
        };
        stream.extend_from_slice(&LnetFrame::new(get).encode());
        let mut rx = FrameReceiver::new(Endian::Little);
        let mut payloads = Vec::new();
        let frames = drive(&mut rx, &stream, &mut payloads).unwrap();
        assert_eq!(frames.len(), 4);
        assert!(matches!(
            frames[0],
            Frame::Noop(Noop {
                keepalive: true,
                zc_ack: None,
                ..
            })
        ));
        assert!(matches!(frames[1], Frame::Lnet(f) if f.header == put(5)));
        assert!(matches!(
            frames[2],
            Frame::Noop(Noop {
                keepalive: false,
                zc_ack: Some(ZcAck::One(7)),
                ..
            })
        ));
        assert!(matches!(frames[3], Frame::Lnet(f) if f.header == get));
        assert_eq!(payloads, vec![b"hello".to_vec(), Vec::new()]);
        assert_eq!(rx.want(), Want::Header(24));
    }

    #[test]
    fn wants_exact_steps() {
        let mut rx = FrameReceiver::new(Endian::Little);
        assert_eq!(rx.want(), Want::Header(KSOCK_MSG_HDR_LEN));
        assert_eq!(rx.handle_header(&KsockMsgHeader::lnet().encode()), Ok(None));
        assert_eq!(rx.want(), Want::Header(HEADER_LEN));
        let f = rx.handle_header(&put(1000).encode()).unwrap();
        assert!(matches!(f, Some(Frame::Lnet(_))));
        assert_eq!(rx.want(), Want::Payload(1000));
        assert_eq!(
            rx.handle_header(&[0; 24]),
            Err(FrameError::OutOfOrder {
                wanted: "payload",
                called: "handle_header"
            })
        );
        assert_eq!(rx.want(), Want::Done);
        assert_eq!(rx.handle_header(&[0; 24]), Err(FrameError::Closed));
        assert_eq!(rx.payload_received(None), Err(FrameError::Closed));

        let mut rx = FrameReceiver::new(Endian::Little);
        assert_eq!(
            rx.handle_header(&[0; 23]),
            Err(FrameError::WrongLength {
                expected: 24,
                got: 23
            })
        );
        let mut rx = FrameReceiver::new(Endian::Little);
        assert!(matches!(
            rx.payload_received(None),
            Err(FrameError::OutOfOrder { .. })
        ));
        assert_eq!(rx.want(), Want::Done);
    }

    #[test]
    fn oversized_and_bad_headers_are_refused() {
        // A PUT announcing more than LNET_MTU: refused before any payload.
        let mut big = put(0).encode();
        big[28..32].copy_from_slice(&(LNET_MTU + 1).to_le_bytes());
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&KsockMsgHeader::lnet().encode()).unwrap();
        assert_eq!(
            rx.handle_header(&big),
            Err(FrameError::Header(WireError::PayloadTooLarge(LNET_MTU + 1)))
        );
        assert_eq!(rx.want(), Want::Done);

        // Exactly LNET_MTU is fine.
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&KsockMsgHeader::lnet().encode()).unwrap();
        rx.handle_header(&put(LNET_MTU).encode()).unwrap();
        assert_eq!(rx.want(), Want::Payload(LNET_MTU));

        // An LNet HELLO header (any payload length) is refused.
        let hello = Header {
            payload_length: u32::MAX,
            body: Body::Hello {
                incarnation: 1,
                conn_type: 1,
            },
            ..put(0)
        };
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&KsockMsgHeader::lnet().encode()).unwrap();
        assert_eq!(
            rx.handle_header(&hello.encode()),
            Err(FrameError::HelloInFrame)
        );
    }

    #[test]
    fn checksums() {
        // V3: over the payload only.
        let payload = b"some payload".to_vec();
        let mut stream = LnetFrame::new(put(12))
            .with_checksum(payload_checksum(&payload))
            .encode()
            .to_vec();
        stream.extend_from_slice(&payload);
        let mut rx = FrameReceiver::new(Endian::Little);
        assert!(drive(&mut rx, &stream, &mut Vec::new()).is_ok());

        // A wrong checksum fails the frame once the payload is in.
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&stream[..24]).unwrap();
        rx.handle_header(&stream[24..96]).unwrap();
        let wire = payload_checksum(&payload);
        assert_eq!(
            rx.payload_received(Some(wire.wrapping_add(1))),
            Err(FrameError::ChecksumMismatch {
                wire,
                computed: wire.wrapping_add(1)
            })
        );
        assert_eq!(rx.want(), Want::Done);

        // Not computed (payload discarded): not checked.
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&stream[..24]).unwrap();
        rx.handle_header(&stream[24..96]).unwrap();
        assert_eq!(rx.payload_received(None), Ok(PayloadDone::default()));

        // NOOPs: only the checksum of nothing.
        let mut noop = KsockMsgHeader::keepalive();
        noop.csum = EMPTY_CHECKSUM;
        let mut rx = FrameReceiver::new(Endian::Little);
        assert!(rx.handle_header(&noop.encode()).is_ok());
        noop.csum = 5;
        assert_eq!(
            rx.handle_header(&noop.encode()),
            Err(FrameError::NoopChecksum(5))
        );
    }

    #[test]
    fn zero_copy_cookies() {
        // A request on an LNet message: ACK after the payload.
        let f = LnetFrame {
            ksock: KsockMsgHeader {
                msg_type: KsockMsgType::Lnet,
                csum: 0,
                zc_cookies: [77, 0],
            },
            header: put(3),
        };
        let mut stream = f.encode().to_vec();
        stream.extend_from_slice(b"abc");
        let mut rx = FrameReceiver::new(Endian::Little);
        rx.handle_header(&stream[..24]).unwrap();
        rx.handle_header(&stream[24..96]).unwrap();
        assert_eq!(
            rx.payload_received(None),
            Ok(PayloadDone {
                zc_request: Some(77)
            })
        );
        assert_eq!(KsockMsgHeader::zc_ack(77).zc_cookies, [0, 77]);

        // ACK sets as ksocknal_handle_zcack reads them.
        assert_eq!(ZcAck::from_cookies(0, 5), ZcAck::One(5));
        assert_eq!(ZcAck::from_cookies(5, 5), ZcAck::One(5));
        assert_eq!(ZcAck::from_cookies(9, 5), ZcAck::Two(9, 5));
        assert_eq!(
            ZcAck::from_cookies(3, 6),
            ZcAck::Range { first: 3, last: 6 }
        );
        assert_eq!(ZcAck::Range { first: 3, last: 6 }.count(), 4);
        assert!(ZcAck::Range { first: 3, last: 6 }.contains(4));
        assert!(!ZcAck::Two(9, 5).contains(7));
        assert_eq!(ZcAck::Two(9, 5).count(), 2);
        // Built by hand the wrong way round: no overflow.
        assert_eq!(ZcAck::Range { first: 6, last: 3 }.count(), 1);
        assert_eq!(
            ZcAck::Range {
                first: 0,
                last: u64::MAX
            }
            .count(),
            u64::MAX
        );

        // A keepalive cookie with another one is a protocol error.
        let bad = KsockMsgHeader {
            msg_type: KsockMsgType::Noop,
            csum: 0,
            zc_cookies: [4, 1],
        };
        let mut rx = FrameReceiver::new(Endian::Little);
        assert_eq!(
            rx.handle_header(&bad.encode()),
            Err(FrameError::BadZcAck(4, 1))
        );
        // An LNet message piggybacking an ACK: its first cookie is a request.
        let lnet = KsockMsgHeader {
            msg_type: KsockMsgType::Lnet,
            csum: 0,
            zc_cookies: [4, 9],
        };
        assert_eq!(lnet.zc_ack_cookies(), Ok(Some(ZcAck::One(9))));
        assert_eq!(lnet.zc_request(), Some(4));
        let empty = KsockMsgHeader {
            msg_type: KsockMsgType::Noop,
            csum: 0,
            zc_cookies: [0, 0],
        };
        assert_eq!(empty.zc_ack_cookies(), Ok(None));
    }

    #[test]
    fn userspace_peer_source_is_substituted() {
        let peer = ProcessId::new(nid("10.0.0.9@tcp"), 0x8000_0000 | 40000);
        let mut rx = FrameReceiver::new(Endian::Little).with_src_override(peer);
        rx.handle_header(&KsockMsgHeader::lnet().encode()).unwrap();
        let Some(Frame::Lnet(f)) = rx.handle_header(&put(0).encode()).unwrap() else {
            panic!("expected an LNet frame");
        };
        assert_eq!(f.header.src_nid, peer.nid);
        assert_eq!(f.header.src_pid, peer.pid);
    }

    #[test]
    fn swapped_peer_headers() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&KSOCK_MSG_LNET.to_be_bytes());
        stream.extend_from_slice(&0u32.to_be_bytes());
        stream.extend_from_slice(&0u64.to_be_bytes());
        stream.extend_from_slice(&0u64.to_be_bytes());
        // The LNet header stays little-endian.
        stream.extend_from_slice(&put(2).encode());
        stream.extend_from_slice(b"ok");
        let mut rx = FrameReceiver::new(Endian::Big);
        let mut payloads = Vec::new();
        let frames = drive(&mut rx, &stream, &mut payloads).unwrap();
        assert!(matches!(frames[0], Frame::Lnet(f) if f.header == put(2)));
        assert_eq!(payloads, vec![b"ok".to_vec()]);
    }

    proptest! {
        #[test]
        fn ksock_header_round_trip(
            lnet in any::<bool>(),
            csum in any::<u32>(),
            z0 in any::<u64>(),
            z1 in any::<u64>(),
        ) {
            let h = KsockMsgHeader {
                msg_type: if lnet { KsockMsgType::Lnet } else { KsockMsgType::Noop },
                csum,
                zc_cookies: [z0, z1],
            };
            prop_assert_eq!(KsockMsgHeader::decode(&h.encode(), Endian::Little), Ok(h));
        }

        #[test]
        fn ksock_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            for order in [Endian::Little, Endian::Big] {
                if let Ok(h) = KsockMsgHeader::decode(&bytes, order) {
                    if order == Endian::Little {
                        prop_assert_eq!(&h.encode()[..], &bytes[..24]);
                    }
                    let _ = h.zc_ack_cookies();
                }
            }
        }

        #[test]
        fn receiver_never_panics_on_any_stream(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            big in any::<bool>(),
        ) {
            let order = if big { Endian::Big } else { Endian::Little };
            let mut rx = FrameReceiver::new(order);
            let _ = drive(&mut rx, &bytes, &mut Vec::new());
        }

        #[test]
        fn receiver_round_trips_encoded_frames(
            lens in proptest::collection::vec(0u32..64, 1..6),
            noops in proptest::collection::vec(any::<bool>(), 1..6),
        ) {
            let mut stream = Vec::new();
            let mut expected = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                if noops.get(i).copied().unwrap_or(false) {
                    stream.extend_from_slice(&KsockMsgHeader::keepalive().encode());
                }
                let payload: Vec<u8> = (0..*len).map(|b| b as u8).collect();
                stream.extend_from_slice(
                    &LnetFrame::new(put(*len)).with_checksum(payload_checksum(&payload)).encode(),
                );
                stream.extend_from_slice(&payload);
                expected.push(payload);
            }
            let mut rx = FrameReceiver::new(Endian::Little);
            let mut payloads = Vec::new();
            let frames = drive(&mut rx, &stream, &mut payloads).unwrap();
            prop_assert_eq!(payloads, expected);
            prop_assert!(frames.len() >= lens.len());
            prop_assert_eq!(rx.want(), Want::Header(KSOCK_MSG_HDR_LEN));
        }
    }
}
