//! End point addresses (`NID:PID:PORTAL:TMID`), the match-bit layout and
//! the PUT header data that names a sender.

use std::fmt;

use colibri_lnet_rt::colibri_lnet::ids::{Nid, Pid, ProcessId};
use colibri_net::NetError;

/// Portals a transfer machine may use (LNet has 64; portal 0 is kept for
/// LNet's own use here, as Lustre reserves its low portals).
pub const PORTALS: std::ops::RangeInclusive<u32> = 1..=63;

/// Largest transfer machine id (12 bits of the match bits).
pub const TMID_MAX: u16 = 4095;

/// Bits of the match bits below the TMID.
pub const COUNTER_BITS: u32 = 52;

/// Counter value of messages (Motr's: counter 0 is the TMID's
/// unsolicited messages). Every receive buffer's ME and the catch-all
/// match it with [`RECV_IGNORE`], so a message may also carry an
/// acknowledgement in its counter ([`msg_counter`]).
pub const CNT_MSG: u64 = 0;
/// Counter bit of a message that carries an acknowledgement: the
/// sequence number of a message the receiver sent to the sender and that
/// the sender posted (what a DELIVERED control message says otherwise),
/// in the counter's low 24 bits.
pub const ACK_FLAG: u64 = 1 << 51;
/// Ignore bits of the MEs that take messages (receive buffers and the
/// catch-all): the acknowledgement a message may carry. They put those MEs
/// on the portal's ignore list, searched before the exact MEs.
pub const RECV_IGNORE: u64 = ACK_FLAG | SEQ_MASK as u64;
/// Counter value of the transfer machine's control messages (bulk
/// requests, verdicts, aborts): a bit no message sets.
pub const CNT_CTL: u64 = 1 << 50;
/// Counter bit of every passive buffer's match bits (a bit no message
/// sets), above the buffer's number and chunk.
pub const CNT_PASSIVE: u64 = 1 << 49;

/// Counter bit of every active buffer's match bits (a bit no message,
/// control message or passive buffer sets), above the operation's
/// sequence number and chunk: the requester's MEs over its buffer, which
/// the passive side PUTs into or GETs from.
pub const CNT_ACTIVE: u64 = 1 << 47;

/// A counter bit none of our match bits set (a passive buffer's number
/// stays below bit 41): the ignore bit of MEs that must sit on the
/// portal's ignore list without ignoring anything we send. A passive ME
/// made for one requester stays a wildcard ME of the portal with it (LNet
/// does not mix the two kinds on one portal); a machine's control ME goes
/// ahead of the portal's vacancy with it (LNet searches the ignore list
/// before the exact MEs, and the vacancy is on it).
pub const PASSIVE_SPARE: u64 = 1 << 48;

/// The counter of a message: [`CNT_MSG`], or with an acknowledgement of
/// the receiver's send `ack` (its sequence number).
pub const fn msg_counter(ack: Option<u32>) -> u64 {
    match ack {
        Some(seq) => ACK_FLAG | (seq & SEQ_MASK) as u64,
        None => CNT_MSG,
    }
}

/// The acknowledgement a message's match bits carry, if any.
pub const fn carried_ack(bits: u64) -> Option<u32> {
    if bits & ACK_FLAG != 0 {
        Some((bits & SEQ_MASK as u64) as u32)
    } else {
        None
    }
}

const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// Match bits of a transfer machine's `counter`.
pub const fn match_bits(tmid: u16, counter: u64) -> u64 {
    ((tmid as u64) << COUNTER_BITS) | (counter & COUNTER_MASK)
}

/// The TMID and counter of match bits.
pub const fn split_bits(bits: u64) -> (u16, u64) {
    ((bits >> COUNTER_BITS) as u16, bits & COUNTER_MASK)
}

/// Header data kinds: a message.
pub const HDR_MSG: u8 = 1;
/// A control message that expects an answer (a bulk request or verdict):
/// a stopped machine's tomb answers it GONE.
pub const HDR_CTL: u8 = 2;
/// A passive side's bulk PUT into the requester's MEs (a chunk before the
/// last one of a transfer in several); the sequence number is the
/// request's (a stopped requester's tomb answers GONE with it).
pub const HDR_BULK: u8 = 3;
/// The last (or only) chunk of a passive side's bulk PUT: the requester
/// knows from it how many chunks the transfer has (the passive buffer may
/// fill fewer of its MEs than it offered room for).
pub const HDR_BULK_LAST: u8 = 5;
/// A control message that expects no answer (DELIVERED, NAK, ABORT,
/// GONE): a tomb drops it. (Answered, a GONE between two tombs would be
/// answered for as long as both addresses stayed free.)
pub const HDR_NOTE: u8 = 4;
const HDR_MAGIC: u64 = 0xC1;

/// Bits of the sequence number in the header data.
pub const SEQ_MASK: u32 = 0x00ff_ffff;

/// The header data of our PUTs, from the top: magic (8 bits), sequence
/// number of the send (24, echoed by a `NoBuffers` answer), reserved (4),
/// TMID (12), reserved (2), portal (6), kind (8).
pub const fn hdr_data(kind: u8, portal: u32, tmid: u16, seq: u32) -> u64 {
    (HDR_MAGIC << 56)
        | (((seq & SEQ_MASK) as u64) << 32)
        | (((tmid & 0xfff) as u64) << 16)
        | (((portal & 0x3f) as u64) << 8)
        | kind as u64
}

/// Decodes header data: (kind, sender portal, sender TMID, sequence).
pub const fn parse_hdr(h: u64) -> Option<(u8, u32, u16, u32)> {
    if h >> 56 != HDR_MAGIC || (h >> 28) & 0xf != 0 || (h >> 14) & 0x3 != 0 {
        return None;
    }
    Some((
        (h & 0xff) as u8,
        ((h >> 8) & 0x3f) as u32,
        ((h >> 16) & 0xfff) as u16,
        ((h >> 32) as u32) & SEQ_MASK,
    ))
}

/// An LNet transport address: `NID:PID:PORTAL:TMID`, as Motr's.
///
/// ```
/// use colibri_lnet_xprt::LnetAddr;
///
/// let a = LnetAddr::parse("127.0.0.1@tcp:12345:30:5")?;
/// assert_eq!((a.pid, a.portal, a.tmid), (12345, 30, Some(5)));
/// assert_eq!(a.to_string(), "127.0.0.1@tcp:12345:30:5");
/// assert_eq!(LnetAddr::parse("0@lo:12345:31:*")?.tmid, None);
/// assert!(LnetAddr::parse("127.0.0.1@tcp:12345:64:5").is_err());
/// # Ok::<(), colibri_net::NetError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LnetAddr {
    /// The node's NID.
    pub nid: Nid,
    /// The process id (12345 for Lustre's kernel LNet).
    pub pid: Pid,
    /// The portal of the transfer machine.
    pub portal: u32,
    /// The transfer machine id; `None` (`*`) asks for one at start.
    pub tmid: Option<u16>,
}

impl LnetAddr {
    /// Parses `NID:PID:PORTAL:TMID` (`TMID` may be `*`).
    ///
    /// # Errors
    /// `InvalidAddress` saying which part is wrong.
    pub fn parse(s: &str) -> Result<Self, NetError> {
        let bad = |reason: String| NetError::InvalidAddress {
            addr: s.to_string(),
            reason,
        };
        let mut parts = s.rsplitn(4, ':');
        let (Some(tmid), Some(portal), Some(pid), Some(nid)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected NID:PID:PORTAL:TMID".into()));
        };
        let nid: Nid = nid.parse().map_err(|e| bad(format!("NID {nid:?}: {e}")))?;
        if nid.is_any() {
            return Err(bad("the NID may not be LNET_NID_ANY".into()));
        }
        let num = |what: &str, v: &str| -> Result<u64, NetError> {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.len() > 10 {
                return Err(bad(format!("{what} {v:?} is not a decimal number")));
            }
            v.parse::<u64>()
                .map_err(|_| bad(format!("{what} {v:?} is out of range")))
        };
        let pid = num("PID", pid)?;
        let pid = u32::try_from(pid)
            .ok()
            .filter(|&p| p != u32::MAX)
            .ok_or_else(|| bad(format!("PID {pid} is out of range")))?;
        let portal = num("portal", portal)?;
        let portal = u32::try_from(portal)
            .ok()
            .filter(|p| PORTALS.contains(p))
            .ok_or_else(|| {
                bad(format!(
                    "portal {portal} is not in {}..={}",
                    PORTALS.start(),
                    PORTALS.end()
                ))
            })?;
        let tmid = if tmid == "*" {
            None
        } else {
            let t = num("TMID", tmid)?;
            Some(
                u16::try_from(t)
                    .ok()
                    .filter(|&t| t <= TMID_MAX)
                    .ok_or_else(|| bad(format!("TMID {t} is not in 0..={TMID_MAX} or *")))?,
            )
        };
        Ok(Self {
            nid,
            pid,
            portal,
            tmid,
        })
    }

    /// The LNet process of the address.
    pub const fn process(&self) -> ProcessId {
        ProcessId::new(self.nid, self.pid)
    }

    /// The same address with a TMID.
    #[must_use]
    pub const fn with_tmid(self, tmid: u16) -> Self {
        Self {
            tmid: Some(tmid),
            ..self
        }
    }
}

impl fmt::Display for LnetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:", self.nid, self.pid, self.portal)?;
        match self.tmid {
            Some(t) => write!(f, "{t}"),
            None => f.write_str("*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        let a = LnetAddr::parse("192.168.1.2@o2ib1:12345:30:4095").unwrap();
        assert_eq!(a.to_string(), "192.168.1.2@o2ib1:12345:30:4095");
        let a = LnetAddr::parse("0@lo:12345:1:0").unwrap();
        assert!(a.nid.is_lo());
        assert_eq!(
            LnetAddr::parse("127.0.0.1@tcp:012345:030:05")
                .unwrap()
                .to_string(),
            "127.0.0.1@tcp:12345:30:5"
        );
    }

    #[test]
    fn refuses_with_the_part_named() {
        for (s, part) in [
            ("", "expected"),
            ("127.0.0.1@tcp:12345:30", "expected"),
            ("127.0.0.1:12345:30:5", "NID"),
            ("127.0.0.1@tcp:x:30:5", "PID"),
            ("127.0.0.1@tcp:4294967295:30:5", "PID"),
            ("127.0.0.1@tcp:12345:0:5", "portal"),
            ("127.0.0.1@tcp:12345:64:5", "portal"),
            ("127.0.0.1@tcp:12345:30:4096", "TMID"),
            ("127.0.0.1@tcp:12345:30:-1", "TMID"),
            ("127.0.0.1@tcp:12345:30:", "TMID"),
            ("127.0.0.1@tcp:12345:30:5:", "NID"),
        ] {
            match LnetAddr::parse(s) {
                Err(NetError::InvalidAddress { reason, .. }) => {
                    assert!(reason.contains(part), "{s:?}: {reason}");
                }
                other => panic!("{s:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn match_bits_layout() {
        assert_eq!(match_bits(5, CNT_CTL), (5 << 52) | (1 << 50));
        assert_eq!(match_bits(5, msg_counter(None)), 5 << 52);
        let carrier = match_bits(5, msg_counter(Some(0x12_3456)));
        assert_eq!(carrier, (5 << 52) | (1 << 51) | 0x12_3456);
        assert_eq!(carried_ack(carrier), Some(0x12_3456));
        assert_eq!(carried_ack(match_bits(5, CNT_MSG)), None);
        // A receive ME (bits of counter 0, RECV_IGNORE) takes plain
        // messages and carriers, never control messages or passive bits.
        let takes = |bits: u64| (match_bits(5, CNT_MSG) ^ bits) & !RECV_IGNORE == 0;
        assert!(takes(match_bits(5, CNT_MSG)));
        assert!(takes(carrier));
        assert!(!takes(match_bits(5, CNT_CTL)));
        assert!(!takes(match_bits(5, CNT_PASSIVE | 1 << 8)));
        assert!(!takes(match_bits(6, CNT_MSG)));
        // The spare bit of passive MEs is above every buffer number.
        assert_eq!(((u64::from(u32::MAX) + 1) << 8) & PASSIVE_SPARE, 0);
        assert_eq!(
            split_bits(match_bits(4095, COUNTER_MASK)),
            (4095, COUNTER_MASK)
        );
    }

    proptest! {
        #[test]
        fn hdr_data_round_trips(kind in 0u8.., portal in 0u32..64, tmid in 0u16..=TMID_MAX, seq in 0u32..=SEQ_MASK) {
            prop_assert_eq!(parse_hdr(hdr_data(kind, portal, tmid, seq)), Some((kind, portal, tmid, seq)));
        }

        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = LnetAddr::parse(&s);
        }

        #[test]
        fn printed_addresses_parse_back(a in 0u32.., pid in 0u32..u32::MAX, portal in 1u32..=63, tmid in 0u16..=TMID_MAX) {
            let s = format!("{}@tcp:{pid}:{portal}:{tmid}", std::net::Ipv4Addr::from(a));
            let p = LnetAddr::parse(&s).unwrap();
            prop_assert_eq!(p.to_string(), s);
        }
    }
}
