//! Control messages between transfer machines: the bulk request and what
//! answers it, and the answers to messages.
//!
//! ```text
//! off size field (little-endian)
//!   0    4 magic "CLNC"
//!   4    1 version (2: the REQUEST names the requester's MEs; 3: an ABORT says
//!            which side sent it)
//!   5    1 kind: 1 REQUEST, 2 VERDICT, 3 ABORT, 4 NAK, 5 DELIVERED, 6 GONE,
//!            7 DELIVERED_MANY, 8 LANDED, 9 AGAIN
//!   6    2 reserved (0)
//!   8    8 xid: the active operation (the requester's MD user value)
//!  16    .. body
//! REQUEST: active queue u8 | 7 reserved | active size u64 | match bits u64 (of the
//!          requester's MEs over its buffer, for the passive side's PUT or GET)
//!          | desc len u16 | desc bytes
//! VERDICT: status u16 | aux u16 (queues of WrongQueue) | 4 reserved | length u64
//!          | match bits u64 | detail len u16 | detail bytes (UTF-8)
//!          (the passive side refuses a request with it; status 0, an acceptance,
//!          is not sent since version 2: the transfer itself answers)
//! ABORT:   status u16 | 2 reserved | by requester u8 (1: the requester gives its request
//!          up; 0: the passive side ends the transfer) | 3 reserved
//! NAK:     status u16 | aux u16 | 4 reserved   (xid: the message's sequence number)
//! DELIVERED: length u64                        (xid: the message's sequence number)
//! GONE:    8 reserved       (xid: the sequence number of a control message that reached
//!                            a stopped machine)
//! DELIVERED_MANY: n x (sequence number u32 | 4 reserved | length u64)
//!                           (xid: n, 2 to DELIVERED_MANY_MAX: several DELIVEREDs to one
//!                            machine, as a receiver that took several messages at once
//!                            sends them)
//! LANDED:  length u64       (xid: the active operation: the passive side's PUT of
//!                            that many bytes landed in the requester's buffer)
//! AGAIN:   chunk u64        (xid: the active operation: the requester's REPLY to the
//!                            passive side's GET of that chunk failed to go; GET it
//!                            again)
//! ```

use colibri_net::{NetError, QueueType};

const MAGIC: u32 = u32::from_le_bytes(*b"CLNC");
const VERSION: u8 = 3;
const HEAD: usize = 16;

/// Largest control message (a request with a 1 KiB descriptor fits).
pub(crate) const CTL_MAX: usize = 1536;

/// Most acknowledgements in one DELIVERED_MANY.
pub(crate) const DELIVERED_MANY_MAX: usize = 64;

/// A control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ctl {
    /// An active side asks for the passive buffer a descriptor names.
    Request {
        /// The active operation.
        xid: u64,
        /// Its queue.
        active: QueueType,
        /// Capacity (active receive) or bytes to send (active send).
        size: u64,
        /// Match bits of the requester's MEs over its buffer (one per MiB,
        /// consecutive), which the passive side PUTs into or GETs from.
        bits: u64,
        /// The descriptor's bytes.
        desc: Vec<u8>,
    },
    /// The passive side's answer.
    Verdict {
        /// The active operation.
        xid: u64,
        /// `Ok((length, match bits))` to GET or PUT, or the refusal.
        result: Result<(u64, u64), NetError>,
    },
    /// The passive buffer is gone (cancelled, timed out, stopped), or the
    /// active side gave up: the other side ends its part.
    Abort {
        /// The active operation.
        xid: u64,
        /// Why.
        status: NetError,
        /// Sent by the requester (about its request, which the receiver
        /// may have claimed a passive buffer for), not by the passive side
        /// (about the receiver's own active operation). Operation ids are
        /// per process, so the two can name the same number.
        by_requester: bool,
    },
    /// A message was placed in a receive buffer and posted: the sender's
    /// send completes (the receive MDs send no LNet ACK, so that a sender
    /// never completes before the receiver saw the message).
    Delivered {
        /// The message's sequence number (from its header data).
        xid: u64,
        /// Bytes received.
        len: u64,
    },
    /// The passive side's PUT landed in the requester's buffer (sent by
    /// the requester, as a PUT that LNet resends on another rail, where
    /// an LNet ACK, a response, could not be): the passive buffer
    /// completes.
    Landed {
        /// The active operation (the request's id).
        xid: u64,
        /// Bytes that landed.
        len: u64,
    },
    /// The requester's answer to the passive side's GET of one chunk of
    /// an active send failed to go (a REPLY is a response: LNet sends it
    /// back the way the GET came and never on another rail): its ME still
    /// offers the data; GET it again. Sent as a PUT, which LNet resends on
    /// another rail.
    Again {
        /// The active operation (the request's id).
        xid: u64,
        /// The chunk (0 for a transfer in one LNet message).
        chunk: u64,
    },
    /// Several DELIVEREDs for one machine: (sequence number, bytes
    /// received) each, 2 to [`DELIVERED_MANY_MAX`] of them.
    DeliveredMany {
        /// The messages.
        acks: Vec<(u32, u64)>,
    },
    /// A control message reached a machine that stopped (answered by what
    /// it left behind).
    Gone {
        /// The control message's sequence number.
        xid: u64,
    },
    /// A message found no receive buffer, did not fit, or reached a
    /// stopped machine (sent by the receiver after it counted the loss).
    Nak {
        /// The message's sequence number (from its header data).
        xid: u64,
        /// Why (`NoBuffers`).
        status: NetError,
    },
}

/// Error codes on the wire.
fn err_code(e: &NetError) -> (u16, u16, String) {
    match e {
        NetError::Cancelled => (1, 0, String::new()),
        NetError::TimedOut => (2, 0, String::new()),
        NetError::NoEntry => (3, 0, String::new()),
        NetError::WrongQueue { passive, active } => (
            4,
            u16::from(passive.code()) | (u16::from(active.code()) << 8),
            String::new(),
        ),
        NetError::AccessDenied { requester, allowed } => (5, 0, format!("{requester}\n{allowed}")),
        NetError::TooBig(s) => (6, 0, s.clone()),
        NetError::InvalidDescriptor(s) => (7, 0, s.clone()),
        NetError::Busy(s) => (8, 0, s.clone()),
        NetError::Unreachable(s) => (9, 0, s.clone()),
        NetError::NoBuffers => (11, 0, String::new()),
        // The sizes do not fit the NAK: the sender knows its length.
        NetError::MessageTooLarge { .. } => (12, 0, String::new()),
        other => (10, 0, other.to_string()),
    }
}

fn err_decode(code: u16, aux: u16, detail: String) -> Option<NetError> {
    Some(match code {
        1 => NetError::Cancelled,
        2 => NetError::TimedOut,
        3 => NetError::NoEntry,
        4 => NetError::WrongQueue {
            passive: QueueType::from_code((aux & 0xff) as u8)?,
            active: QueueType::from_code((aux >> 8) as u8)?,
        },
        5 => {
            let (r, a) = detail.split_once('\n')?;
            NetError::AccessDenied {
                requester: r.to_string(),
                allowed: a.to_string(),
            }
        }
        6 => NetError::TooBig(detail),
        7 => NetError::InvalidDescriptor(detail),
        8 => NetError::Busy(detail),
        9 => NetError::Unreachable(detail),
        10 => NetError::Protocol(format!("passive side: {detail}")),
        11 => NetError::NoBuffers,
        12 => NetError::MessageTooLarge { len: 0, space: 0 },
        _ => return None,
    })
}

impl Ctl {
    /// The active operation it is about.
    pub(crate) fn xid(&self) -> u64 {
        match self {
            Self::Request { xid, .. }
            | Self::Verdict { xid, .. }
            | Self::Abort { xid, .. }
            | Self::Nak { xid, .. }
            | Self::Delivered { xid, .. }
            | Self::Landed { xid, .. }
            | Self::Again { xid, .. }
            | Self::Gone { xid } => *xid,
            Self::DeliveredMany { acks } => acks.len() as u64,
        }
    }

    /// Whether the receiver answers it (a bulk request gets the transfer
    /// or a refusal), so that a stopped machine's tomb answers it GONE.
    /// The others are notes: answering them could only start an exchange
    /// without end.
    pub(crate) fn expects_answer(&self) -> bool {
        matches!(self, Self::Request { .. })
    }

    /// The bytes on the wire.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        let kind = match self {
            Self::Request { .. } => 1,
            Self::Verdict { .. } => 2,
            Self::Abort { .. } => 3,
            Self::Nak { .. } => 4,
            Self::Delivered { .. } => 5,
            Self::Gone { .. } => 6,
            Self::DeliveredMany { .. } => 7,
            Self::Landed { .. } => 8,
            Self::Again { .. } => 9,
        };
        v.extend_from_slice(&MAGIC.to_le_bytes());
        v.extend_from_slice(&[VERSION, kind, 0, 0]);
        v.extend_from_slice(&self.xid().to_le_bytes());
        match self {
            Self::Request {
                active,
                size,
                bits,
                desc,
                ..
            } => {
                v.extend_from_slice(&[active.code(), 0, 0, 0, 0, 0, 0, 0]);
                v.extend_from_slice(&size.to_le_bytes());
                v.extend_from_slice(&bits.to_le_bytes());
                let n = desc.len().min(CTL_MAX - HEAD - 26);
                v.extend_from_slice(&(n as u16).to_le_bytes());
                v.extend_from_slice(&desc[..n]);
            }
            Self::Verdict { result, .. } => {
                let (code, aux, detail, len, bits) = match result {
                    Ok((len, bits)) => (0, 0, String::new(), *len, *bits),
                    Err(e) => {
                        let (c, a, d) = err_code(e);
                        (c, a, d, 0, 0)
                    }
                };
                v.extend_from_slice(&code.to_le_bytes());
                v.extend_from_slice(&aux.to_le_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&len.to_le_bytes());
                v.extend_from_slice(&bits.to_le_bytes());
                let mut d = detail.into_bytes();
                d.truncate(CTL_MAX - HEAD - 26);
                v.extend_from_slice(&(d.len() as u16).to_le_bytes());
                v.extend_from_slice(&d);
            }
            Self::Abort {
                status,
                by_requester,
                ..
            } => {
                let (c, aux, _) = err_code(status);
                v.extend_from_slice(&c.to_le_bytes());
                v.extend_from_slice(&aux.to_le_bytes());
                v.extend_from_slice(&[u8::from(*by_requester), 0, 0, 0]);
            }
            Self::Nak { status, .. } => {
                let (c, aux, _) = err_code(status);
                v.extend_from_slice(&c.to_le_bytes());
                v.extend_from_slice(&aux.to_le_bytes());
                v.extend_from_slice(&[0; 4]);
            }
            Self::Delivered { len, .. }
            | Self::Landed { len, .. }
            | Self::Again { chunk: len, .. } => {
                v.extend_from_slice(&len.to_le_bytes());
            }
            Self::Gone { .. } => v.extend_from_slice(&[0; 8]),
            Self::DeliveredMany { acks } => {
                for (seq, len) in acks.iter().take(DELIVERED_MANY_MAX) {
                    v.extend_from_slice(&seq.to_le_bytes());
                    v.extend_from_slice(&[0; 4]);
                    v.extend_from_slice(&len.to_le_bytes());
                }
            }
        }
        v
    }

    /// Decodes a control message; every field is checked.
    ///
    /// # Errors
    /// `Protocol` naming what is wrong.
    pub(crate) fn decode(b: &[u8]) -> Result<Self, NetError> {
        let bad = |why: &str| NetError::Protocol(format!("control message: {why}"));
        let u16at = |o: usize| -> Result<u16, NetError> {
            b.get(o..o + 2)
                .map(|s| u16::from_le_bytes([s[0], s[1]]))
                .ok_or_else(|| bad("truncated"))
        };
        let u64at = |o: usize| -> Result<u64, NetError> {
            b.get(o..o + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| bad("truncated"))
        };
        if b.len() < HEAD || b.len() > CTL_MAX {
            return Err(bad("bad length"));
        }
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != MAGIC {
            return Err(bad("bad magic"));
        }
        if b[4] != VERSION {
            return Err(bad("unknown version"));
        }
        if b[6] != 0 || b[7] != 0 {
            return Err(bad("reserved bytes set"));
        }
        let xid = u64at(8)?;
        let exact = |n: usize| {
            if b.len() == n {
                Ok(())
            } else {
                Err(bad("length does not match the contents"))
            }
        };
        match b[5] {
            1 => {
                let active = b
                    .get(16)
                    .and_then(|&c| QueueType::from_code(c))
                    .filter(|q| q.is_active())
                    .ok_or_else(|| bad("not an active queue"))?;
                if b.get(17..24).is_none_or(|r| r.iter().any(|&x| x != 0)) {
                    return Err(bad("reserved bytes set"));
                }
                let size = u64at(24)?;
                let bits = u64at(32)?;
                let n = usize::from(u16at(40)?);
                exact(42 + n)?;
                Ok(Self::Request {
                    xid,
                    active,
                    size,
                    bits,
                    desc: b[42..].to_vec(),
                })
            }
            2 => {
                let code = u16at(16)?;
                let aux = u16at(18)?;
                let len = u64at(24)?;
                let bits = u64at(32)?;
                let n = usize::from(u16at(40)?);
                exact(42 + n)?;
                let detail = String::from_utf8(b[42..].to_vec()).map_err(|_| bad("detail"))?;
                let result = if code == 0 {
                    Ok((len, bits))
                } else {
                    Err(err_decode(code, aux, detail).ok_or_else(|| bad("unknown status"))?)
                };
                Ok(Self::Verdict { xid, result })
            }
            6 => {
                exact(24)?;
                if b[16..24].iter().any(|&x| x != 0) {
                    return Err(bad("reserved bytes set"));
                }
                Ok(Self::Gone { xid })
            }
            5 | 8 | 9 => {
                exact(24)?;
                let len = u64at(16)?;
                Ok(match b[5] {
                    5 => Self::Delivered { xid, len },
                    8 => Self::Landed { xid, len },
                    _ => Self::Again { xid, chunk: len },
                })
            }
            7 => {
                let n = usize::try_from(xid).unwrap_or(usize::MAX);
                if !(2..=DELIVERED_MANY_MAX).contains(&n) {
                    return Err(bad("bad acknowledgement count"));
                }
                exact(HEAD + 16 * n)?;
                let acks = b[HEAD..]
                    .chunks_exact(16)
                    .map(|e| {
                        if e[4..8].iter().any(|&x| x != 0) {
                            return Err(bad("reserved bytes set"));
                        }
                        Ok((
                            u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
                            u64::from_le_bytes(e[8..16].try_into().map_err(|_| bad("truncated"))?),
                        ))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Self::DeliveredMany { acks })
            }
            3 | 4 => {
                exact(24)?;
                let status = err_decode(u16at(16)?, u16at(18)?, String::new())
                    .ok_or_else(|| bad("unknown status"))?;
                // An ABORT's byte 20 says which side sent it (0 or 1).
                let flag = b[20];
                if b[21..24].iter().any(|&x| x != 0) || flag > u8::from(b[5] == 3) {
                    return Err(bad("reserved bytes set"));
                }
                Ok(if b[5] == 3 {
                    Self::Abort {
                        xid,
                        status,
                        by_requester: flag == 1,
                    }
                } else {
                    Self::Nak { xid, status }
                })
            }
            _ => Err(bad("unknown kind")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Ctl> {
        vec![
            Ctl::Request {
                xid: 7,
                active: QueueType::ActiveBulkRecv,
                size: 1 << 20,
                bits: (3 << 52) | (1 << 47) | (9 << 8),
                desc: vec![1, 2, 3],
            },
            Ctl::Verdict {
                xid: 8,
                result: Ok((100, 0xabc)),
            },
            Ctl::Verdict {
                xid: 9,
                result: Err(NetError::WrongQueue {
                    passive: QueueType::PassiveBulkRecv,
                    active: QueueType::ActiveBulkRecv,
                }),
            },
            Ctl::Verdict {
                xid: 9,
                result: Err(NetError::AccessDenied {
                    requester: "a".into(),
                    allowed: "b".into(),
                }),
            },
            Ctl::Verdict {
                xid: 10,
                result: Err(NetError::TooBig("x".into())),
            },
            Ctl::Verdict {
                xid: 10,
                result: Err(NetError::NoEntry),
            },
            Ctl::Abort {
                xid: 11,
                status: NetError::Cancelled,
                by_requester: false,
            },
            Ctl::Abort {
                xid: 11,
                status: NetError::TimedOut,
                by_requester: true,
            },
            Ctl::Nak {
                xid: 12,
                status: NetError::NoBuffers,
            },
            Ctl::Delivered { xid: 13, len: 77 },
            Ctl::Landed {
                xid: 16,
                len: 1 << 20,
            },
            Ctl::Again { xid: 17, chunk: 15 },
            Ctl::Gone { xid: 14 },
            Ctl::DeliveredMany {
                acks: vec![(15, 1), (0xff_ffff, 1 << 20)],
            },
            Ctl::DeliveredMany {
                acks: (0..DELIVERED_MANY_MAX as u32)
                    .map(|i| (i, u64::from(i)))
                    .collect(),
            },
        ]
    }

    #[test]
    fn round_trips() {
        for c in samples() {
            assert_eq!(Ctl::decode(&c.encode()).unwrap(), c);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for c in samples() {
            let b = c.encode();
            for n in 0..b.len() {
                assert!(Ctl::decode(&b[..n]).is_err(), "{c:?} cut at {n}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Ctl::decode(&long).is_err());
        }
    }

    #[test]
    fn an_abort_says_who_sent_it_and_a_nak_has_no_such_byte() {
        let abort = |by_requester| Ctl::Abort {
            xid: 5,
            status: NetError::Cancelled,
            by_requester,
        };
        assert_eq!(abort(false).encode()[20], 0);
        assert_eq!(abort(true).encode()[20], 1);
        let mut b = abort(true).encode();
        b[20] = 2;
        assert!(Ctl::decode(&b).is_err(), "flag 2");
        let mut b = Ctl::Nak {
            xid: 5,
            status: NetError::NoBuffers,
        }
        .encode();
        b[20] = 1;
        assert!(Ctl::decode(&b).is_err(), "a NAK with the flag");
    }

    #[test]
    fn delivered_many_counts_are_bounded() {
        let many = |n: usize| {
            let mut b = Ctl::DeliveredMany {
                acks: vec![(1, 2); 2],
            }
            .encode();
            b[8..16].copy_from_slice(&(n as u64).to_le_bytes());
            b.resize(HEAD + 16 * n, 0);
            b
        };
        assert!(Ctl::decode(&many(2)).is_ok());
        for n in [0, 1, DELIVERED_MANY_MAX + 1] {
            assert!(Ctl::decode(&many(n)).is_err(), "{n} acknowledgements");
        }
        let mut b = many(2);
        b[HEAD + 5] = 1;
        assert!(Ctl::decode(&b).is_err(), "reserved bytes");
    }

    proptest! {
        #[test]
        fn delivered_many_round_trips(acks in proptest::collection::vec(any::<(u32, u64)>(), 2..=DELIVERED_MANY_MAX)) {
            let c = Ctl::DeliveredMany { acks };
            prop_assert_eq!(Ctl::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Ctl::decode(&b);
        }

        #[test]
        fn flipped_headers_are_refused_or_decode_consistently(i in 0usize..16, bit in 0u8..8) {
            for c in samples() {
                let mut b = c.encode();
                b[i] ^= 1 << bit;
                if let Ok(d) = Ctl::decode(&b) {
                    prop_assert_eq!(Ctl::decode(&d.encode()).unwrap(), d);
                }
            }
        }
    }
}
