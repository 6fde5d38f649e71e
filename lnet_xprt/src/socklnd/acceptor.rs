//! The acceptor's connection request (`lnet/lnet/acceptor.c`,
//! `struct lnet_acceptor_connreq` in `lnet-idl.h`).
//!
//! The first 16 bytes on every socklnd TCP connection, sent by the
//! connecting side in its host byte order:
//!
//! ```text
//! off size field
//!   0  4   acr_magic    LNET_PROTO_ACCEPTOR_MAGIC 0xacce7100
//!   4  4   acr_version  1 (2 = 20-byte NID, 28 bytes, not supported here)
//!   8  8   acr_nid      the NID the connector wants to reach
//! ```
//!
//! The acceptor reads the magic, then the version, then the NID
//! (`lnet_accept`); [`ConnReq::decode`] accepts a prefix of the request and
//! tells how many bytes it needs, so a driver can read in the same steps.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use colibri_wire::{Endian, Reader, Writer};

use super::{LNET_PROTO_MAGIC, LNET_PROTO_TCP_MAGIC};
use crate::ids::Nid;

/// `LNET_PROTO_ACCEPTOR_MAGIC`.
pub const ACCEPTOR_MAGIC: u32 = 0xacce_7100;
/// `LNET_PROTO_ACCEPTOR_VERSION`: 8-byte NIDs.
pub const ACCEPTOR_VERSION: u32 = 1;
/// `LNET_PROTO_ACCEPTOR_VERSION_16`: 20-byte NIDs (not supported here).
pub const ACCEPTOR_VERSION_16: u32 = 2;
/// Size of a version 1 connection request.
pub const CONNREQ_LEN: usize = 16;
/// `accept_port`: the acceptor's TCP port (the same on every node).
pub const DEFAULT_ACCEPT_PORT: u16 = 988;
/// `accept_backlog`: the listen backlog.
pub const DEFAULT_ACCEPT_BACKLOG: u32 = 127;
/// `accept_timeout`: how long the acceptor waits for a request's bytes.
pub const DEFAULT_ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);
/// `LNET_ACCEPTOR_MIN_RESERVED_PORT`: the lowest source port a connector
/// binds.
pub const MIN_RESERVED_PORT: u16 = 512;
/// `LNET_ACCEPTOR_MAX_RESERVED_PORT`: the highest privileged port; the
/// connector tries it first.
pub const MAX_RESERVED_PORT: u16 = 1023;

/// Why a connection request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptorError {
    /// More bytes are needed to decide; read until `needed` bytes in all.
    #[error("connection request incomplete: need {needed} bytes, got {got}")]
    Short {
        /// Total bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The peer sent `LNET_PROTO_MAGIC`, a query for a unified protocol:
    /// answer with [`AcceptorError::reply`] (our magic and version) and close.
    #[error("peer sent LNET_PROTO_MAGIC instead of a connection request")]
    ProtoMagic,
    /// The peer speaks the "old" socknal/tcpnal acceptor protocol
    /// (`LNET_PROTO_TCP_MAGIC`).
    #[error("refusing the 'old' socknal/tcpnal acceptor protocol (magic {0:#010x})")]
    OldSocknal(u32),
    /// An unknown magic.
    #[error("unrecognised acceptor magic {0:#010x}")]
    BadMagic(u32),
    /// A version other than 1: answer with [`AcceptorError::reply`] (ours)
    /// and close, as Lustre does, so the peer can retry with version 1.
    #[error("unsupported acceptor protocol version {0}")]
    UnsupportedVersion(u32),
    /// The request names a NID that is none of our NIs.
    #[error("connection request for {0}: no matching NI")]
    NoMatchingNi(Nid),
    /// The request names a loopback NID, which is not reached over TCP.
    #[error("connection request for {0}: that NI does not accept IP connections")]
    Loopback(Nid),
    /// `accept=secure` and the peer's source port is not privileged.
    #[error("refusing connection from insecure port {0}")]
    InsecurePort(u16),
}

impl AcceptorError {
    /// The 16 bytes to send before closing, if Lustre answers this case:
    /// our magic and version with a zero NID (a "tell her I'm old" reply to
    /// `LNET_PROTO_MAGIC` or an unknown version).
    #[must_use]
    pub fn reply(&self) -> Option<[u8; CONNREQ_LEN]> {
        match self {
            Self::ProtoMagic | Self::UnsupportedVersion(_) => Some(ConnReq::version_reply()),
            _ => None,
        }
    }
}

/// A version 1 connection request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnReq {
    /// The NID the connector wants to reach.
    pub nid: Nid,
}

impl ConnReq {
    /// A request for `nid`.
    #[must_use]
    pub const fn new(nid: Nid) -> Self {
        Self { nid }
    }

    /// The 16 bytes on the wire (little-endian).
    #[must_use]
    pub fn encode(&self) -> [u8; CONNREQ_LEN] {
        let mut w = Writer::new([0u8; CONNREQ_LEN]);
        w.put_u32(ACCEPTOR_MAGIC);
        w.put_u32(ACCEPTOR_VERSION);
        w.put_u64(self.nid.as_u64());
        w.into_inner()
    }

    /// The answer to a version query: magic, version 1, NID 0.
    #[must_use]
    pub fn version_reply() -> [u8; CONNREQ_LEN] {
        let mut w = Writer::new([0u8; CONNREQ_LEN]);
        w.put_u32(ACCEPTOR_MAGIC);
        w.put_u32(ACCEPTOR_VERSION);
        w.put_u64(0);
        w.into_inner()
    }

    /// Decodes a request from the front of `buf`, in the sender's byte order
    /// (told by the magic), and returns it with that order.
    ///
    /// `buf` may hold a prefix: the magic is judged from 4 bytes and the
    /// version from 8, and [`AcceptorError::Short`] says how many bytes are
    /// needed to go on. Bytes after the 16 are not looked at.
    ///
    /// # Errors
    /// See [`AcceptorError`]; [`AcceptorError::reply`] tells whether to
    /// answer before closing.
    pub fn decode(buf: &[u8]) -> Result<(Self, Endian), AcceptorError> {
        let short = |needed: usize| AcceptorError::Short {
            needed,
            got: buf.len(),
        };
        let magic_bytes = *buf.first_chunk::<4>().ok_or_else(|| short(4))?;
        let order = detect_order(magic_bytes)?;
        let mut r = Reader::with_endian(buf, order);
        let _ = r.skip(4);
        let version = r.u32().map_err(|_| short(8))?;
        if version != ACCEPTOR_VERSION {
            return Err(AcceptorError::UnsupportedVersion(version));
        }
        let nid = r.u64().map_err(|_| short(CONNREQ_LEN))?;
        Ok((Self::new(Nid::from_u64(nid)), order))
    }

    /// Checks that the request is for one of `local_nids` and not for the
    /// loopback NI (`lnet_accept`: "No matching NI", "NI does not accept IP
    /// connections").
    ///
    /// # Errors
    /// [`AcceptorError::Loopback`] or [`AcceptorError::NoMatchingNi`].
    pub fn check_target(&self, local_nids: &[Nid]) -> Result<(), AcceptorError> {
        if self.nid.is_lo() {
            return Err(AcceptorError::Loopback(self.nid));
        }
        if !local_nids.contains(&self.nid) {
            return Err(AcceptorError::NoMatchingNi(self.nid));
        }
        Ok(())
    }
}

/// The byte order of a request from its first four bytes.
fn detect_order(magic: [u8; 4]) -> Result<Endian, AcceptorError> {
    let le = u32::from_le_bytes(magic);
    let swapped = le.swap_bytes();
    if le == ACCEPTOR_MAGIC {
        return Ok(Endian::Little);
    }
    if swapped == ACCEPTOR_MAGIC {
        return Ok(Endian::Big);
    }
    if le == LNET_PROTO_MAGIC || swapped == LNET_PROTO_MAGIC {
        return Err(AcceptorError::ProtoMagic);
    }
    if le == LNET_PROTO_TCP_MAGIC || swapped == LNET_PROTO_TCP_MAGIC {
        return Err(AcceptorError::OldSocknal(le));
    }
    Err(AcceptorError::BadMagic(le))
}

/// The acceptor's policy on incoming connections (module parameter
/// `accept`, default `secure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AcceptPolicy {
    /// `secure`: only connections from privileged source ports (< 1024).
    #[default]
    Secure,
    /// `all`: any source port. A peer connecting from an unprivileged port
    /// is a userspace peer (see [`super::handshake::userspace_peer`]).
    All,
    /// `none`: no acceptor at all.
    None,
}

impl AcceptPolicy {
    /// Whether a connection from `source_port` may proceed to the request.
    #[must_use]
    pub const fn admits(self, source_port: u16) -> bool {
        match self {
            Self::Secure => source_port <= MAX_RESERVED_PORT,
            Self::All => true,
            Self::None => false,
        }
    }

    /// Checks a connection's source port.
    ///
    /// # Errors
    /// [`AcceptorError::InsecurePort`] when [`AcceptPolicy::admits`] is false.
    pub fn check(self, source_port: u16) -> Result<(), AcceptorError> {
        if self.admits(source_port) {
            Ok(())
        } else {
            Err(AcceptorError::InsecurePort(source_port))
        }
    }

    /// Whether a listener is needed at all.
    #[must_use]
    pub const fn listens(self) -> bool {
        !matches!(self, Self::None)
    }
}

impl fmt::Display for AcceptPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Secure => "secure",
            Self::All => "all",
            Self::None => "none",
        })
    }
}

/// A string that is not `secure`, `all` or `none`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("can't parse accept={0:?} (secure|all|none)")]
pub struct BadAcceptPolicy(pub String);

impl FromStr for AcceptPolicy {
    type Err = BadAcceptPolicy;

    fn from_str(s: &str) -> Result<Self, BadAcceptPolicy> {
        match s {
            "secure" => Ok(Self::Secure),
            "all" => Ok(Self::All),
            "none" => Ok(Self::None),
            _ => Err(BadAcceptPolicy(s.to_owned())),
        }
    }
}

/// The source ports a connector tries, in order: 1023 down to 512
/// (`lnet_connect` moves on when a port is in use).
pub fn connector_ports() -> impl Iterator<Item = u16> {
    (MIN_RESERVED_PORT..=MAX_RESERVED_PORT).rev()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    /// Written from `struct lnet_acceptor_connreq`, independently of the
    /// encoder: magic, version, NID, each little-endian.
    const GOLDEN: [u8; 16] = [
        0x00, 0x71, 0xce, 0xac, // acr_magic 0xacce7100
        0x01, 0x00, 0x00, 0x00, // acr_version 1
        0x02, 0x01, 0xa8, 0xc0, // acr_nid 192.168.1.2@tcp ...
        0x00, 0x00, 0x02, 0x00, // ... = 0x00020000_c0a80102
    ];

    #[test]
    fn golden_bytes() {
        let req = ConnReq::new(nid("192.168.1.2@tcp"));
        assert_eq!(req.encode(), GOLDEN);
        assert_eq!(ConnReq::decode(&GOLDEN), Ok((req, Endian::Little)));
    }

    #[test]
    fn byte_swapped_request_is_accepted() {
        // A big-endian host sends every field in its own order.
        let mut be = Vec::new();
        be.extend_from_slice(&ACCEPTOR_MAGIC.to_be_bytes());
        be.extend_from_slice(&1u32.to_be_bytes());
        be.extend_from_slice(&0x0002_0000_c0a8_0102u64.to_be_bytes());
        assert_eq!(
            ConnReq::decode(&be),
            Ok((ConnReq::new(nid("192.168.1.2@tcp")), Endian::Big))
        );
    }

    #[test]
    fn decodes_in_steps() {
        assert_eq!(
            ConnReq::decode(&GOLDEN[..0]),
            Err(AcceptorError::Short { needed: 4, got: 0 })
        );
        assert_eq!(
            ConnReq::decode(&GOLDEN[..4]),
            Err(AcceptorError::Short { needed: 8, got: 4 })
        );
        assert_eq!(
            ConnReq::decode(&GOLDEN[..15]),
            Err(AcceptorError::Short {
                needed: 16,
                got: 15
            })
        );
        // A bad magic is known from 4 bytes.
        assert_eq!(
            ConnReq::decode(&[1, 2, 3, 4]),
            Err(AcceptorError::BadMagic(0x0403_0201))
        );
    }

    #[test]
    fn other_magics_and_versions() {
        let e = ConnReq::decode(&LNET_PROTO_MAGIC.to_le_bytes()).unwrap_err();
        assert_eq!(e, AcceptorError::ProtoMagic);
        assert_eq!(e.reply(), Some(ConnReq::version_reply()));
        let e = ConnReq::decode(&LNET_PROTO_MAGIC.to_be_bytes()).unwrap_err();
        assert_eq!(e, AcceptorError::ProtoMagic);
        let e = ConnReq::decode(&LNET_PROTO_TCP_MAGIC.to_le_bytes()).unwrap_err();
        assert!(matches!(e, AcceptorError::OldSocknal(_)));
        assert_eq!(e.reply(), None);
        assert!(e.to_string().contains("old"));

        let mut v2 = GOLDEN;
        v2[4] = 2;
        let e = ConnReq::decode(&v2).unwrap_err();
        assert_eq!(e, AcceptorError::UnsupportedVersion(2));
        let reply = e.reply().unwrap();
        assert_eq!(&reply[..8], &GOLDEN[..8]);
        assert_eq!(&reply[8..], &[0; 8]);
    }

    #[test]
    fn target_check() {
        let me = nid("10.0.0.1@tcp");
        let req = ConnReq::new(me);
        assert_eq!(req.check_target(&[me]), Ok(()));
        assert_eq!(
            ConnReq::new(nid("10.0.0.2@tcp")).check_target(&[me]),
            Err(AcceptorError::NoMatchingNi(nid("10.0.0.2@tcp")))
        );
        assert_eq!(
            ConnReq::new(Nid::LO_0).check_target(&[me, Nid::LO_0]),
            Err(AcceptorError::Loopback(Nid::LO_0))
        );
    }

    #[test]
    fn secure_port_policy() {
        assert_eq!(AcceptPolicy::default(), AcceptPolicy::Secure);
        assert!(AcceptPolicy::Secure.admits(1023));
        assert!(AcceptPolicy::Secure.admits(512));
        assert!(AcceptPolicy::Secure.admits(1));
        assert!(!AcceptPolicy::Secure.admits(1024));
        assert_eq!(
            AcceptPolicy::Secure.check(40000),
            Err(AcceptorError::InsecurePort(40000))
        );
        assert!(AcceptPolicy::All.admits(40000));
        assert!(!AcceptPolicy::None.admits(1000));
        assert!(!AcceptPolicy::None.listens());
        for p in [AcceptPolicy::Secure, AcceptPolicy::All, AcceptPolicy::None] {
            assert_eq!(p.to_string().parse::<AcceptPolicy>(), Ok(p));
        }
        assert!("maybe".parse::<AcceptPolicy>().is_err());
        let ports: Vec<u16> = connector_ports().collect();
        assert_eq!(ports.first(), Some(&1023));
        assert_eq!(ports.last(), Some(&512));
        assert_eq!(ports.len(), 512);
        assert_eq!(DEFAULT_ACCEPT_PORT, 988);
    }

    proptest! {
        #[test]
        fn round_trip(raw in any::<u64>()) {
            let req = ConnReq::new(Nid::from_u64(raw));
            prop_assert_eq!(ConnReq::decode(&req.encode()), Ok((req, Endian::Little)));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok((req, order)) = ConnReq::decode(&bytes) {
                prop_assert!(bytes.len() >= CONNREQ_LEN);
                if order == Endian::Little {
                    prop_assert_eq!(&req.encode()[..], &bytes[..CONNREQ_LEN]);
                }
            }
        }
    }
}
