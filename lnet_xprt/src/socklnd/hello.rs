//! The socklnd HELLO, protocol V3 (`struct ksock_hello_msg_nid4`,
//! `lnet/klnds/socklnd/socklnd-idl.h`; sent by `ksocknal_send_hello_v2`,
//! read by `ksocknal_recv_hello` and `ksocknal_recv_hello_v2`).
//!
//! 56 packed bytes in the sender's byte order, then `nips` 4-byte IPv4
//! addresses (always 0 of them since Lustre dropped TCP bonding; still read
//! and checked when present):
//!
//! ```text
//! off size field
//!   0  4   kshm_magic            LNET_PROTO_MAGIC 0x45726963 (swapped: flip)
//!   4  4   kshm_version          3
//!   8  8   kshm_src_nid          sender's NID
//!  16  8   kshm_dst_nid          NID the sender wants to reach
//!  24  4   kshm_src_pid          sender's pid (12345 for kernel LNet)
//!  28  4   kshm_dst_pid          0 from Lustre (never set)
//!  32  8   kshm_src_incarnation  sender's incarnation (its NI start time, ns)
//!  40  8   kshm_dst_incarnation  0 from Lustre (never set)
//!  48  4   kshm_ctype            SOCKLND_CONN_*; 0xffffffff (NONE) = refused
//!  52  4   kshm_nips             number of IPs that follow (≤ 16)
//!  56  4×n kshm_ips[]            deprecated
//! ```
//!
//! Only protocol V3 is spoken. A V1 HELLO (`LNET_PROTO_TCP_MAGIC` inside an
//! LNet header), V2, V4 (20-byte NIDs) or an unknown version is identified
//! and refused with [`HelloError::UnsupportedVersion`]; a passive side then
//! answers with its own V3 HELLO (connection type NONE), as Lustre does, so
//! a peer that also speaks V3 retries with it.

use colibri_wire::{Endian, Reader, Writer};

use super::{CONN_NONE, ConnType, KSOCK_PROTO_V1, KSOCK_PROTO_V3, LNET_INTERFACES_NUM};
use super::{LNET_PROTO_MAGIC, LNET_PROTO_TCP_MAGIC};
use crate::ids::{Nid, Pid};

/// Size of a V3 HELLO without IPs.
pub const HELLO_LEN: usize = 56;

/// Why a HELLO was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// More bytes are needed; read until `needed` bytes in all.
    #[error("HELLO incomplete: need {needed} bytes, got {got}")]
    Short {
        /// Total bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The first word is no socklnd magic (Lustre: "Bad magic").
    #[error("bad HELLO magic {0:#010x}")]
    BadMagic(u32),
    /// A protocol version other than 3 (1 = legacy V1 HELLO, 2, 4 = large
    /// NIDs, or unknown). A passive side answers with its own V3 HELLO
    /// with connection type NONE before closing, so the peer can retry.
    #[error("socklnd protocol version {0} not supported (only version 3)")]
    UnsupportedVersion(u32),
    /// The connection type is neither a type nor NONE.
    #[error("bad connection type {0:#x} in HELLO")]
    BadConnType(u32),
    /// More IPs than `LNET_INTERFACES_NUM` (16).
    #[error("bad IP count {0} in HELLO")]
    TooManyIps(u32),
    /// A zero IP address in the list.
    #[error("zero IP address at index {0} in HELLO")]
    ZeroIp(usize),
}

/// A V3 HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// The sender's NID.
    pub src_nid: Nid,
    /// The NID the sender wants to reach.
    pub dst_nid: Nid,
    /// The sender's pid.
    pub src_pid: Pid,
    /// Destination pid (Lustre sends 0).
    pub dst_pid: Pid,
    /// The sender's incarnation: changes when its NI restarts.
    pub src_incarnation: u64,
    /// Destination incarnation (Lustre sends 0).
    pub dst_incarnation: u64,
    /// The connection type from the sender's side; `None` is
    /// `SOCKLND_CONN_NONE`, a refusal.
    pub conn_type: Option<ConnType>,
}

/// A decoded HELLO with what the receiver needs besides its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedHello {
    /// The HELLO.
    pub hello: Hello,
    /// The sender's byte order: the `ksock_msg` headers of this connection
    /// arrive in it (Lustre's `ksnc_flip`).
    pub byte_order: Endian,
    /// Bytes the HELLO took: 56 plus 4 per IP.
    pub len: usize,
}

impl Hello {
    /// The 56 bytes on the wire (little-endian, version 3, no IPs).
    #[must_use]
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut w = Writer::new([0u8; HELLO_LEN]);
        w.put_u32(LNET_PROTO_MAGIC);
        w.put_u32(KSOCK_PROTO_V3);
        w.put_u64(self.src_nid.as_u64());
        w.put_u64(self.dst_nid.as_u64());
        w.put_u32(self.src_pid);
        w.put_u32(self.dst_pid);
        w.put_u64(self.src_incarnation);
        w.put_u64(self.dst_incarnation);
        w.put_u32(self.conn_type.map_or(CONN_NONE, ConnType::to_u32));
        w.put_u32(0);
        w.into_inner()
    }

    /// Decodes a HELLO from the front of `buf`.
    ///
    /// `buf` may hold a prefix: the magic is judged from 4 bytes, the
    /// version from 8, the fields from 56, the IPs after that;
    /// [`HelloError::Short`] says how many bytes are needed to go on (as
    /// Lustre reads magic, version, the rest, then the IPs).
    ///
    /// # Errors
    /// See [`HelloError`].
    pub fn decode(buf: &[u8]) -> Result<ReceivedHello, HelloError> {
        let short = |needed: usize| HelloError::Short {
            needed,
            got: buf.len(),
        };
        let magic = u32::from_le_bytes(*buf.first_chunk::<4>().ok_or_else(|| short(4))?);
        let order = if magic == LNET_PROTO_MAGIC {
            Endian::Little
        } else if magic.swap_bytes() == LNET_PROTO_MAGIC {
            Endian::Big
        } else if magic == LNET_PROTO_TCP_MAGIC {
            // V1: the magic and a u16 major/minor version, little-endian, in
            // the first 8 bytes of an LNet header (`lnet_magicversion`).
            let v = buf.get(4..8).ok_or_else(|| short(8))?;
            let major = u16::from_le_bytes([v[0], v[1]]);
            let minor = u16::from_le_bytes([v[2], v[3]]);
            let version = if (major, minor) == (1, 0) {
                KSOCK_PROTO_V1
            } else {
                u32::from(major) << 16 | u32::from(minor)
            };
            return Err(HelloError::UnsupportedVersion(version));
        } else {
            return Err(HelloError::BadMagic(magic));
        };
        let mut r = Reader::with_endian(buf, order);
        let _ = r.skip(4);
        let version = r.u32().map_err(|_| short(8))?;
        if version != KSOCK_PROTO_V3 {
            return Err(HelloError::UnsupportedVersion(version));
        }
        let (mut hello, ctype, nips) = read_fixed(&mut r).map_err(|_| short(HELLO_LEN))?;
        hello.conn_type = match ctype {
            CONN_NONE => None,
            v => Some(ConnType::from_u32(v).ok_or(HelloError::BadConnType(v))?),
        };
        if nips > LNET_INTERFACES_NUM {
            return Err(HelloError::TooManyIps(nips));
        }
        let len = HELLO_LEN + 4 * nips as usize;
        for i in 0..nips as usize {
            let ip = r.u32().map_err(|_| short(len))?;
            if ip == 0 {
                return Err(HelloError::ZeroIp(i));
            }
        }
        Ok(ReceivedHello {
            hello,
            byte_order: order,
            len,
        })
    }
}

/// Reads the fields after magic and version: the HELLO (without its
/// connection type), the raw connection type and the IP count.
fn read_fixed(r: &mut Reader<'_>) -> Result<(Hello, u32, u32), colibri_wire::Short> {
    let hello = Hello {
        src_nid: Nid::from_u64(r.u64()?),
        dst_nid: Nid::from_u64(r.u64()?),
        src_pid: r.u32()?,
        dst_pid: r.u32()?,
        src_incarnation: r.u64()?,
        dst_incarnation: r.u64()?,
        conn_type: None,
    };
    let ctype = r.u32()?;
    let nips = r.u32()?;
    Ok((hello, ctype, nips))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn sample() -> Hello {
        Hello {
            src_nid: nid("10.0.0.1@tcp"),
            dst_nid: nid("10.0.0.2@tcp"),
            src_pid: 12345,
            dst_pid: 0,
            src_incarnation: 0x1122_3344_5566_7788,
            dst_incarnation: 0,
            conn_type: Some(ConnType::BulkIn),
        }
    }

    /// `struct ksock_hello_msg_nid4` written out by hand, little-endian.
    const GOLDEN: [u8; 56] = [
        0x63, 0x69, 0x72, 0x45, // kshm_magic 0x45726963
        0x03, 0x00, 0x00, 0x00, // kshm_version 3
        0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02, 0x00, // src 10.0.0.1@tcp
        0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02, 0x00, // dst 10.0.0.2@tcp
        0x39, 0x30, 0x00, 0x00, // src_pid 12345
        0x00, 0x00, 0x00, 0x00, // dst_pid 0
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // src_incarnation
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dst_incarnation
        0x02, 0x00, 0x00, 0x00, // ctype BULK_IN
        0x00, 0x00, 0x00, 0x00, // nips 0
    ];

    #[test]
    fn golden_bytes() {
        assert_eq!(sample().encode(), GOLDEN);
        let got = Hello::decode(&GOLDEN).unwrap();
        assert_eq!(got.hello, sample());
        assert_eq!(got.byte_order, Endian::Little);
        assert_eq!(got.len, 56);
    }

    /// The same HELLO as a big-endian host sends it.
    fn big_endian(h: &Hello, ctype: u32, ips: &[u32]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&LNET_PROTO_MAGIC.to_be_bytes());
        v.extend_from_slice(&3u32.to_be_bytes());
        v.extend_from_slice(&h.src_nid.as_u64().to_be_bytes());
        v.extend_from_slice(&h.dst_nid.as_u64().to_be_bytes());
        v.extend_from_slice(&h.src_pid.to_be_bytes());
        v.extend_from_slice(&h.dst_pid.to_be_bytes());
        v.extend_from_slice(&h.src_incarnation.to_be_bytes());
        v.extend_from_slice(&h.dst_incarnation.to_be_bytes());
        v.extend_from_slice(&ctype.to_be_bytes());
        v.extend_from_slice(&(ips.len() as u32).to_be_bytes());
        for ip in ips {
            v.extend_from_slice(&ip.to_be_bytes());
        }
        v
    }

    #[test]
    fn swapped_peer_fields_are_swapped_back() {
        let h = sample();
        let got = Hello::decode(&big_endian(&h, 2, &[])).unwrap();
        assert_eq!(got.hello, h);
        assert_eq!(got.byte_order, Endian::Big);
        // NONE is all ones in either order.
        let got = Hello::decode(&big_endian(&h, CONN_NONE, &[])).unwrap();
        assert_eq!(got.hello.conn_type, None);
    }

    #[test]
    fn ips_are_read_and_checked() {
        let h = sample();
        let bytes = big_endian(&h, 2, &[0x0a00_0001, 0x0a00_0002]);
        assert_eq!(bytes.len(), 64);
        assert_eq!(
            Hello::decode(&bytes[..56]),
            Err(HelloError::Short {
                needed: 64,
                got: 56
            })
        );
        let got = Hello::decode(&bytes).unwrap();
        assert_eq!((got.hello, got.len), (h, 64));
        let bytes = big_endian(&h, 2, &[0x0a00_0001, 0]);
        assert_eq!(Hello::decode(&bytes), Err(HelloError::ZeroIp(1)));
        let mut many = GOLDEN;
        many[52] = 17;
        assert_eq!(Hello::decode(&many), Err(HelloError::TooManyIps(17)));
    }

    #[test]
    fn decodes_in_steps() {
        assert_eq!(
            Hello::decode(&GOLDEN[..3]),
            Err(HelloError::Short { needed: 4, got: 3 })
        );
        assert_eq!(
            Hello::decode(&GOLDEN[..4]),
            Err(HelloError::Short { needed: 8, got: 4 })
        );
        assert_eq!(
            Hello::decode(&GOLDEN[..8]),
            Err(HelloError::Short { needed: 56, got: 8 })
        );
    }

    #[test]
    fn other_versions_are_identified_and_refused() {
        // V1: LNET_PROTO_TCP_MAGIC then major 1, minor 0 (LE u16s), the
        // start of a 72-byte LNet header of type HELLO.
        let v1 = [0xed, 0x0d, 0xbc, 0xee, 0x01, 0x00, 0x00, 0x00];
        assert_eq!(Hello::decode(&v1), Err(HelloError::UnsupportedVersion(1)));
        assert_eq!(
            Hello::decode(&v1[..4]),
            Err(HelloError::Short { needed: 8, got: 4 })
        );
        for v in [0u8, 1, 2, 4, 9] {
            let mut b = GOLDEN;
            b[4] = v;
            assert_eq!(
                Hello::decode(&b),
                Err(HelloError::UnsupportedVersion(u32::from(v)))
            );
        }
        assert_eq!(
            Hello::decode(&[0xac, 0xce, 0x71, 0x00]),
            Err(HelloError::BadMagic(0x0071_ceac))
        );
        let mut bad = GOLDEN;
        bad[48] = 4;
        assert_eq!(Hello::decode(&bad), Err(HelloError::BadConnType(4)));
    }

    fn any_hello() -> impl Strategy<Value = Hello> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            prop_oneof![
                Just(None),
                proptest::sample::select(ConnType::ALL.to_vec()).prop_map(Some)
            ],
        )
            .prop_map(|(s, d, sp, dp, si, di, conn_type)| Hello {
                src_nid: Nid::from_u64(s),
                dst_nid: Nid::from_u64(d),
                src_pid: sp,
                dst_pid: dp,
                src_incarnation: si,
                dst_incarnation: di,
                conn_type,
            })
    }

    proptest! {
        #[test]
        fn round_trip(h in any_hello()) {
            let got = Hello::decode(&h.encode()).unwrap();
            prop_assert_eq!(got.hello, h);
            prop_assert_eq!(got.len, HELLO_LEN);
            let ctype = h.conn_type.map_or(CONN_NONE, ConnType::to_u32);
            let be = Hello::decode(&big_endian(&h, ctype, &[])).unwrap();
            prop_assert_eq!(be.hello, h);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..140)) {
            if let Ok(got) = Hello::decode(&bytes) {
                prop_assert!(got.len <= bytes.len());
                if got.byte_order == Endian::Little && got.len == HELLO_LEN {
                    prop_assert_eq!(&got.hello.encode()[..], &bytes[..HELLO_LEN]);
                }
            }
        }

        #[test]
        fn valid_prefix_with_any_tail_never_panics(
            tail in proptest::collection::vec(any::<u8>(), 0..120),
        ) {
            let mut bytes = GOLDEN[..8].to_vec();
            bytes.extend_from_slice(&tail);
            let _ = Hello::decode(&bytes);
        }
    }
}
