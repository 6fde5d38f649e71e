//! The socket LND protocol (Lustre's `ksocklnd`), without sockets.
//!
//! Everything a TCP driver needs to speak LNet to Lustre's socket LND byte
//! for byte, as plain data and pure functions; the driver (threads, sockets,
//! clocks) lives elsewhere and calls into this module:
//!
//! * [`acceptor`]: the 16-byte connection request that opens every TCP
//!   connection (`lnet_acceptor_connreq`), the acceptor port and the
//!   secure-port policy.
//! * [`hello`]: the 56-byte protocol V3 HELLO (`ksock_hello_msg_nid4`) that
//!   both ends exchange next.
//! * [`frame`]: the 24-byte `ksock_msg` header in front of every message
//!   (LNet message or NOOP), the optional checksum, and [`FrameReceiver`],
//!   the two-step receiver of a connection's byte stream that never touches
//!   payload bytes.
//! * [`handshake`]: what to answer to a HELLO and whether to keep a new
//!   connection ([`PeerConns`]: incarnations, connection races, duplicates),
//!   and which connection carries a message.
//! * [`reconnect`]: the reconnection back-off and the keepalive timer,
//!   driven by `now`.
//! * [`tunables`]: the module parameters with Lustre's names and defaults.
//! * [`errors`]: socket errors mapped to LNet health statuses.
//!
//! Byte order: Lustre sends the connection request, the HELLO and the
//! `ksock_msg` header in its host byte order and the receiver swaps them
//! when the magic arrives swapped; the 72-byte LNet header is always
//! little-endian. We always send little-endian (what an x86 Lustre sends)
//! and accept both orders.
//!
//! A connection, active side (we connect):
//!
//! ```text
//! connect from a port in 1023..=512 to the peer's port 988
//! send ConnReq (16 B) ─► send Hello (56 B) ─► read Hello ─► PeerConns::admit
//! then frames both ways: [ksock_msg 24 B][LNet header 72 B][payload] or [NOOP 24 B]
//! ```
//!
//! Passive side (the peer connects): secure-port check, read `ConnReq`,
//! check its NID, read the peer's `Hello`, [`PeerConns::admit`], send our
//! `Hello` (or a refusal HELLO with connection type NONE), then frames.
//!
//! See `DESIGN.md`, "Socket LND protocol (`socklnd`)", for the layouts and
//! what is and is not compatible with Lustre.

pub mod acceptor;
mod csum;
pub mod errors;
pub mod frame;
pub mod handshake;
pub mod hello;
pub mod reconnect;
pub mod tunables;

use std::fmt;

pub use acceptor::{AcceptPolicy, AcceptorError, ConnReq};
pub use colibri_wire::Endian;
pub use csum::{Crc32, payload_checksum};
pub use errors::{RECEIVE_FAILURE_STATUS, SocketError, TxFailure};
pub use frame::{
    Frame, FrameError, FrameReceiver, KsockMsgHeader, KsockMsgType, LnetFrame, Noop, PayloadDone,
    Want, ZcAck,
};
pub use handshake::{
    ActiveReply, Admission, Candidate, ConnId, ConnLoad, HandshakeError, LocalEnd, Match,
    PassiveHello, PeerConns, Refusal, TxKind, check_active_reply, check_passive_hello,
    userspace_peer,
};
pub use hello::{Hello, HelloError, ReceivedHello};
pub use reconnect::{Keepalive, Reconnect};
pub use tunables::{Tunables, TunablesError};

/// `LNET_PROTO_MAGIC`: the magic of socklnd HELLOs since protocol V2.
pub const LNET_PROTO_MAGIC: u32 = 0x4572_6963;
/// `LNET_PROTO_TCP_MAGIC`: the magic of protocol V1 HELLOs (and of the
/// "old" socknal acceptor protocol).
pub const LNET_PROTO_TCP_MAGIC: u32 = 0xeebc_0ded;
/// `KSOCK_PROTO_V1`: the legacy protocol (a HELLO inside an LNet header).
pub const KSOCK_PROTO_V1: u32 = 1;
/// `KSOCK_PROTO_V2`.
pub const KSOCK_PROTO_V2: u32 = 2;
/// `KSOCK_PROTO_V3`: the protocol this module speaks (Lustre's default
/// for IPv4 peers).
pub const KSOCK_PROTO_V3: u32 = 3;
/// `KSOCK_PROTO_V4`: 20-byte NIDs (IPv6); not supported here.
pub const KSOCK_PROTO_V4: u32 = 4;
/// `LNET_INTERFACES_NUM`: the most IP addresses a HELLO may list.
pub const LNET_INTERFACES_NUM: u32 = 16;

/// A socklnd connection type (`SOCKLND_CONN_*`, `socklnd.h`).
///
/// With typed connections (Lustre's default) a peer has one `Control`
/// connection for small messages and `conns_per_peer` each of `BulkIn`
/// (bulk data arriving) and `BulkOut` (bulk data leaving). The active side
/// announces the type from its point of view; the passive side records the
/// inverse ([`ConnType::invert`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConnType {
    /// `SOCKLND_CONN_ANY` (0): untyped; never used with protocol V3.
    Any,
    /// `SOCKLND_CONN_CONTROL` (1): small messages.
    Control,
    /// `SOCKLND_CONN_BULK_IN` (2): large messages from the peer; also
    /// carries our zero-copy ACKs and keepalives (`SOCKLND_CONN_ACK`).
    BulkIn,
    /// `SOCKLND_CONN_BULK_OUT` (3): large messages to the peer.
    BulkOut,
}

/// The wire value of `SOCKLND_CONN_NONE` (−1): "no connection", sent by a
/// passive side that refuses a connection and wants the peer to retry.
pub const CONN_NONE: u32 = u32::MAX;

impl ConnType {
    /// All types, in wire order.
    pub const ALL: [Self; 4] = [Self::Any, Self::Control, Self::BulkIn, Self::BulkOut];

    /// The wire value.
    #[must_use]
    pub const fn to_u32(self) -> u32 {
        match self {
            Self::Any => 0,
            Self::Control => 1,
            Self::BulkIn => 2,
            Self::BulkOut => 3,
        }
    }

    /// The type for a wire value (`None` for `SOCKLND_CONN_NONE` and any
    /// unknown value).
    #[must_use]
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Any),
            1 => Some(Self::Control),
            2 => Some(Self::BulkIn),
            3 => Some(Self::BulkOut),
            _ => None,
        }
    }

    /// The same connection seen from the other end
    /// (`ksocknal_invert_type`): `BulkIn` ⇄ `BulkOut`; `Any` and
    /// `Control` unchanged.
    #[must_use]
    pub const fn invert(self) -> Self {
        match self {
            Self::BulkIn => Self::BulkOut,
            Self::BulkOut => Self::BulkIn,
            t => t,
        }
    }
}

impl fmt::Display for ConnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Any => "ANY",
            Self::Control => "CONTROL",
            Self::BulkIn => "BULK_IN",
            Self::BulkOut => "BULK_OUT",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_types_match_socklnd_h() {
        assert_eq!(ConnType::Any.to_u32(), 0);
        assert_eq!(ConnType::Control.to_u32(), 1);
        assert_eq!(ConnType::BulkIn.to_u32(), 2);
        assert_eq!(ConnType::BulkOut.to_u32(), 3);
        assert_eq!(CONN_NONE as i32, -1);
        for t in ConnType::ALL {
            assert_eq!(ConnType::from_u32(t.to_u32()), Some(t));
            assert_eq!(t.invert().invert(), t);
        }
        assert_eq!(ConnType::from_u32(CONN_NONE), None);
        assert_eq!(ConnType::from_u32(4), None);
        assert_eq!(ConnType::BulkIn.invert(), ConnType::BulkOut);
        assert_eq!(ConnType::Control.invert(), ConnType::Control);
        assert_eq!(ConnType::Any.invert(), ConnType::Any);
        assert_eq!(ConnType::BulkOut.to_string(), "BULK_OUT");
    }

    /// Two nodes handshake over bytes, both connecting at once; then a
    /// message crosses the winning connection through the receiver.
    #[test]
    fn both_sides_connect_at_once_and_the_higher_nid_wins() {
        use crate::ids::{Nid, ProcessId};
        use crate::wire::{Body, Header, WireHandle};
        use std::net::Ipv4Addr;

        let a = LocalEnd {
            nid: "10.0.0.1@tcp".parse::<Nid>().unwrap(),
            pid: 12345,
            incarnation: 111,
        };
        let b = LocalEnd {
            nid: "10.0.0.2@tcp".parse::<Nid>().unwrap(),
            pid: 12345,
            incarnation: 222,
        };
        let mut a_peers = PeerConns::new(b.nid, 1);
        let mut b_peers = PeerConns::new(a.nid, 1);
        a_peers.set_connecting(true);
        b_peers.set_connecting(true);

        // Each side's active connection: request + HELLO.
        let open = |from: &LocalEnd, to: &LocalEnd| {
            let mut bytes = ConnReq::new(to.nid).encode().to_vec();
            bytes.extend_from_slice(&from.active_hello(to.nid, ConnType::Control).encode());
            bytes
        };
        // The passive half of a connection: judge the bytes, admit, answer.
        let accept = |me: &LocalEnd, peers: &mut PeerConns, bytes: &[u8], id: u64| {
            let (req, _) = ConnReq::decode(bytes).unwrap();
            req.check_target(&[me.nid]).unwrap();
            let got = Hello::decode(&bytes[16..]).unwrap();
            let seen =
                check_passive_hello(me, &got.hello, Ipv4Addr::new(10, 0, 0, 9), 1023).unwrap();
            let cand = Candidate {
                id: ConnId(id),
                conn_type: seen.conn_type,
                incarnation: seen.incarnation,
                active: false,
                loopback: false,
            };
            let adm = peers.admit(me.nid, cand);
            let ctype = match adm {
                Admission::Accepted => Some(seen.conn_type),
                Admission::Refused { .. } => None,
            };
            (adm, me.passive_reply(&got.hello, ctype).encode())
        };

        let a_to_b = open(&a, &b);
        let b_to_a = open(&b, &a);
        // b (higher NID) refuses a's connection while it connects itself.
        let (adm_b, reply_b) = accept(&b, &mut b_peers, &a_to_b, 1);
        assert!(matches!(
            adm_b,
            Admission::Refused {
                reason: Refusal::LostRace,
                ..
            }
        ));
        // a (lower NID) accepts b's connection.
        let (adm_a, reply_a) = accept(&a, &mut a_peers, &b_to_a, 2);
        assert_eq!(adm_a, Admission::Accepted);

        // a reads b's NONE: retry later.
        let r = Hello::decode(&reply_b).unwrap().hello;
        let got = check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::Control, &r).unwrap();
        assert_eq!(got, ActiveReply::Retry { incarnation: 222 });
        let mut backoff = Reconnect::new(
            Tunables::default().min_reconnect(),
            Tunables::default().max_reconnect(),
        );
        assert_eq!(
            backoff.on_lost_race(crate::time::Time::from_secs(1)),
            crate::time::Time::from_secs(2)
        );
        a_peers.set_connecting(false);

        // b reads a's acceptance and keeps its connection.
        let r = Hello::decode(&reply_a).unwrap().hello;
        let got = check_active_reply(&b, ProcessId::lustre(a.nid), ConnType::Control, &r).unwrap();
        assert_eq!(got, ActiveReply::Accepted { incarnation: 111 });
        let cand = Candidate {
            id: ConnId(7),
            conn_type: ConnType::Control,
            incarnation: 111,
            active: true,
            loopback: false,
        };
        assert_eq!(b_peers.admit(b.nid, cand), Admission::Accepted);
        b_peers.set_connecting(false);

        // b sends a small PUT on the connection choose() gives; a receives it.
        let header = Header {
            dest_nid: a.nid,
            src_nid: b.nid,
            dest_pid: 12345,
            src_pid: 12345,
            payload_length: 3,
            body: Body::Put {
                ack_wmd: WireHandle::NONE,
                match_bits: 9,
                hdr_data: 0,
                ptl_index: 4,
                offset: 0,
            },
        };
        let tx = TxKind::Lnet { payload_len: 3 };
        assert_eq!(
            b_peers.choose(tx, 1024, |_| ConnLoad::default()),
            Some(ConnId(7))
        );
        let mut wire = LnetFrame::new(header)
            .with_checksum(payload_checksum(b"abc"))
            .encode()
            .to_vec();
        wire.extend_from_slice(b"abc");
        let mut rx = FrameReceiver::new(Endian::Little);
        assert_eq!(rx.handle_header(&wire[..24]), Ok(None));
        let Some(Frame::Lnet(f)) = rx.handle_header(&wire[24..96]).unwrap() else {
            panic!("expected an LNet frame");
        };
        assert_eq!(f.header, header);
        assert_eq!(rx.want(), Want::Payload(3));
        let mut c = Crc32::new();
        c.update(&wire[96..]);
        assert_eq!(
            rx.payload_received(Some(c.value())),
            Ok(PayloadDone::default())
        );
    }

    #[test]
    fn magics() {
        // "Eric" in ASCII, as Lustre's comment says.
        assert_eq!(&LNET_PROTO_MAGIC.to_be_bytes(), b"Eric");
    }
}
