//! Network buffer descriptors.
//!
//! Adding a buffer to a passive bulk queue produces a [`NetBufDesc`]: opaque
//! bytes the application sends to the peer that will perform the transfer,
//! which adds its own buffer to the matching active queue with it. To the
//! application a descriptor is only bytes: it can be cloned, compared,
//! serialized with serde (as a byte string) and embedded in messages.
//!
//! Inside, every transport uses the one layout defined here ([`DescFields`]
//! encoded by [`NetBufDesc::encode`]), so that the checks are written once:
//!
//! ```text
//! off  size  field
//!   0     4  magic "CLBD" (0x4442_4c43, little-endian)
//!   4     1  version (1)
//!   5     1  queue of the passive buffer (QueueType::code)
//!   6     1  flags: bit 0 = an allowed actor is named
//!   7     1  reserved, 0
//!   8     4  transport id (which transport made it)
//!  12     8  length: bytes to read (passive send) or space (passive receive)
//!  20     8  buffer token: identity and generation of the passive buffer
//!  28     8  cookie: random, unguessable, checked by the passive side
//!  36     2  owner address length O, then O bytes of UTF-8
//!   .     2  actor address length A, then A bytes (A = 0 without flag bit 0)
//!   .     2  transport extra length X, then X bytes
//!   .     4  CRC-32C of everything before it
//! ```
//!
//! The passive side re-checks every field against the real buffer when a
//! request arrives ([`crate::xprt::TmSink::claim_passive`]), so a descriptor that
//! was edited, replayed after its buffer completed, or presented by another
//! end point fails cleanly.

use std::fmt;

use colibri_wire::{Reader, Short, Writer};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::checksum::crc32c;
use crate::error::{NetError, Result};
use crate::queue::QueueType;

/// Magic number at the start of every descriptor ("CLBD").
pub const DESC_MAGIC: u32 = u32::from_le_bytes(*b"CLBD");
/// Current descriptor layout version.
pub const DESC_VERSION: u8 = 1;
/// Size of a descriptor with empty addresses and no extra bytes.
pub const DESC_FIXED_SIZE: usize = 36 + 2 + 2 + 2 + 4;
const FLAG_ACTOR: u8 = 1;

/// An opaque, serializable network buffer descriptor.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct NetBufDesc {
    bytes: Vec<u8>,
}

impl fmt::Debug for NetBufDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetBufDesc({} bytes)", self.bytes.len())
    }
}

impl NetBufDesc {
    /// Wraps bytes received from a peer. Nothing is checked until the
    /// descriptor is used.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Consumes the descriptor, returning its bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Encoded size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for an empty (never valid) descriptor.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Encodes descriptor fields. Used by the core when a passive buffer is
    /// added.
    ///
    /// # Errors
    /// `InvalidDescriptor` when the encoding would exceed `max_size` bytes or
    /// a field does not fit its length prefix.
    pub fn encode(fields: &DescFields, max_size: usize) -> Result<Self> {
        let actor = fields.actor.as_deref().unwrap_or("");
        let total = DESC_FIXED_SIZE + fields.owner.len() + actor.len() + fields.extra.len();
        if total > max_size {
            return Err(NetError::InvalidDescriptor(format!(
                "descriptor of {total} bytes exceeds the transport's maximum of {max_size}"
            )));
        }
        let mut bytes = Vec::with_capacity(total);
        let mut w = Writer::new(&mut bytes);
        w.put_u32(DESC_MAGIC);
        w.put_u8(DESC_VERSION);
        w.put_u8(fields.queue.code());
        w.put_u8(if fields.actor.is_some() {
            FLAG_ACTOR
        } else {
            0
        });
        w.put_u8(0);
        w.put_u32(fields.transport_id);
        w.put_u64(fields.len);
        w.put_u64(fields.token);
        w.put_u64(fields.cookie);
        for part in [fields.owner.as_bytes(), actor.as_bytes(), &fields.extra[..]] {
            let n = u16::try_from(part.len()).map_err(|_| {
                NetError::InvalidDescriptor(format!("descriptor field of {} bytes", part.len()))
            })?;
            w.put_u16(n);
            w.put_bytes(part);
        }
        let crc = crc32c(w.written());
        w.put_u32(crc);
        Ok(Self { bytes })
    }

    /// Decodes and validates the descriptor's bytes: size, magic, version,
    /// queue, flags, reserved bits, length prefixes, UTF-8 and checksum.
    ///
    /// # Errors
    /// `InvalidDescriptor` naming the first field found wrong.
    pub fn decode(&self) -> Result<DescFields> {
        let b = &self.bytes;
        let bad = |why: &str| NetError::InvalidDescriptor(why.to_string());
        if b.len() < DESC_FIXED_SIZE {
            return Err(bad("too short"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let truncated = |_: Short| bad("truncated");
        if Reader::new(crc).u32().map_err(truncated)? != crc32c(body) {
            return Err(bad("checksum mismatch"));
        }
        let mut r = Reader::new(body);
        if r.u32().map_err(truncated)? != DESC_MAGIC {
            return Err(bad("bad magic"));
        }
        if r.u8().map_err(truncated)? != DESC_VERSION {
            return Err(bad("unsupported version"));
        }
        let queue = QueueType::from_code(r.u8().map_err(truncated)?)
            .ok_or_else(|| bad("bad queue code"))?;
        if !queue.is_passive() {
            return Err(bad("descriptor does not name a passive buffer"));
        }
        let flags = r.u8().map_err(truncated)?;
        if flags & !FLAG_ACTOR != 0 || r.u8().map_err(truncated)? != 0 {
            return Err(bad("unknown flags"));
        }
        let transport_id = r.u32().map_err(truncated)?;
        let len = r.u64().map_err(truncated)?;
        let token = r.u64().map_err(truncated)?;
        let cookie = r.u64().map_err(truncated)?;
        let owner = string(&mut r)?;
        let actor = string(&mut r)?;
        let extra = prefixed(&mut r)?.to_vec();
        if !r.is_empty() {
            return Err(bad("trailing bytes"));
        }
        let actor = if flags & FLAG_ACTOR != 0 {
            Some(actor)
        } else if actor.is_empty() {
            None
        } else {
            return Err(bad("actor address without actor flag"));
        };
        Ok(DescFields {
            transport_id,
            queue,
            len,
            token,
            cookie,
            owner,
            actor,
            extra,
        })
    }
}

/// A field of a descriptor's variable part: a `u16` length, then the bytes.
fn prefixed<'a>(r: &mut Reader<'a>) -> Result<&'a [u8]> {
    let truncated = |_: Short| NetError::InvalidDescriptor("truncated".into());
    let n = r.u16().map_err(truncated)?;
    r.bytes(n.into()).map_err(truncated)
}

fn string(r: &mut Reader<'_>) -> Result<String> {
    let s = prefixed(r)?;
    String::from_utf8(s.to_vec())
        .map_err(|_| NetError::InvalidDescriptor("address is not UTF-8".into()))
}

impl Serialize for NetBufDesc {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.bytes)
    }
}

impl<'de> Deserialize<'de> for NetBufDesc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = NetBufDesc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("descriptor bytes")
            }
            fn visit_bytes<E: serde::de::Error>(
                self,
                v: &[u8],
            ) -> std::result::Result<Self::Value, E> {
                Ok(NetBufDesc::from_bytes(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(
                self,
                v: Vec<u8>,
            ) -> std::result::Result<Self::Value, E> {
                Ok(NetBufDesc::from_bytes(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(NetBufDesc::from_bytes(v))
            }
        }
        d.deserialize_bytes(V)
    }
}

/// The decoded contents of a descriptor. Transports read these on the
/// active side; the core fills them in on the passive side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescFields {
    /// Identifier of the transport that made the descriptor
    /// ([`crate::xprt::Caps::transport_id`]).
    pub transport_id: u32,
    /// Queue of the passive buffer.
    pub queue: QueueType,
    /// For a passive send: the number of bytes the active side will read.
    /// For a passive receive: the space available for the active side.
    pub len: u64,
    /// Identity of the passive buffer in its transfer machine (slot and
    /// generation, see [`crate::BufToken`]).
    pub token: u64,
    /// Random cookie the passive side checks.
    pub cookie: u64,
    /// Address of the transfer machine owning the passive buffer.
    pub owner: String,
    /// Address of the end point allowed to act on the buffer, if the owner
    /// restricted it.
    pub actor: Option<String>,
    /// Transport-specific bytes (for example, remote keys of an RDMA
    /// transport).
    pub extra: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> DescFields {
        DescFields {
            transport_id: 7,
            queue: QueueType::PassiveBulkSend,
            len: 4096,
            token: 0x1234_5678_9abc_def0,
            cookie: 0xfeed_face_dead_beef,
            owner: "127.0.0.1:5000:1".into(),
            actor: Some("127.0.0.1:5001".into()),
            extra: vec![1, 2, 3],
        }
    }

    #[test]
    fn round_trip() {
        let d = NetBufDesc::encode(&sample(), 512).unwrap();
        assert_eq!(d.decode().unwrap(), sample());
        let mut f = sample();
        f.actor = None;
        f.extra.clear();
        let d = NetBufDesc::encode(&f, 512).unwrap();
        assert_eq!(d.len(), DESC_FIXED_SIZE + f.owner.len());
        assert_eq!(d.decode().unwrap(), f);
    }

    #[test]
    fn refuses_oversize_and_active_queues() {
        assert!(NetBufDesc::encode(&sample(), 20).is_err());
        let mut f = sample();
        f.queue = QueueType::ActiveBulkRecv;
        let d = NetBufDesc::encode(&f, 512).unwrap();
        assert!(matches!(d.decode(), Err(NetError::InvalidDescriptor(_))));
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let d = NetBufDesc::encode(&sample(), 512).unwrap();
        for i in 0..d.len() * 8 {
            let mut b = d.as_bytes().to_vec();
            b[i / 8] ^= 1 << (i % 8);
            assert!(NetBufDesc::from_bytes(b).decode().is_err(), "bit {i}");
        }
    }

    #[test]
    fn truncations_are_rejected() {
        let d = NetBufDesc::encode(&sample(), 512).unwrap();
        for n in 0..d.len() {
            assert!(
                NetBufDesc::from_bytes(d.as_bytes()[..n].to_vec())
                    .decode()
                    .is_err()
            );
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = NetBufDesc::from_bytes(bytes).decode();
        }

        #[test]
        fn any_fields_round_trip(
            q in prop_oneof![Just(QueueType::PassiveBulkRecv), Just(QueueType::PassiveBulkSend)],
            tid in any::<u32>(), len in any::<u64>(), token in any::<u64>(), cookie in any::<u64>(),
            owner in "[ -~]{0,40}", actor in proptest::option::of("[ -~]{1,40}"),
            extra in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let f = DescFields { transport_id: tid, queue: q, len, token, cookie, owner, actor, extra };
            let d = NetBufDesc::encode(&f, 4096).unwrap();
            prop_assert_eq!(d.decode().unwrap(), f);
        }

        #[test]
        fn valid_checksum_with_random_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..120)) {
            let mut b = body.clone();
            b.extend_from_slice(&crc32c(&body).to_le_bytes());
            let _ = NetBufDesc::from_bytes(b).decode();
        }
    }
}
