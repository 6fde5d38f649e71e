//! Identifiers: LND types, networks, NIDs and process ids.
//!
//! A [`Nid`] (network identifier) names one network interface of one node.
//! It is the 8-byte form of Lustre's `lnet_nid_t`:
//!
//! ```text
//!  63            48 47            32 31                             0
//! +----------------+----------------+--------------------------------+
//! |   LND type     |   net number   |          address               |
//! +----------------+----------------+--------------------------------+
//! \________ Net (u32) _____________/
//! ```
//!
//! The string form is `address@<lnd><number>` with a zero net number omitted:
//! `10.0.0.1@tcp` (net `tcp0`), `192.168.1.2@o2ib1`, `0@lo`. Addresses of IP
//! based LNDs (`tcp`, `o2ib`, `kfi`, `efa`) are dotted IPv4 quads; the others
//! (`lo`, `gni`, unknown LND types) use a decimal number. An LND type without a
//! known name is written `<type:number>` (as Lustre does), e.g. `7@<99:3>`.
//!
//! ```
//! use colibri_lnet::ids::{LndType, Net, Nid};
//!
//! let nid: Nid = "192.168.1.2@o2ib1".parse()?;
//! assert_eq!(nid.as_u64(), 0x0005_0001_C0A8_0102);
//! assert_eq!(nid.net(), Net::new(LndType::O2ib, 1));
//! assert_eq!(nid.to_string(), "192.168.1.2@o2ib1");
//! assert_eq!("0@lo".parse::<Nid>()?, Nid::LO_0);
//! # Ok::<(), colibri_lnet::ids::IdError>(())
//! ```

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An error parsing a NID, net or process id from a string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The string was empty.
    #[error("empty identifier")]
    Empty,
    /// A NID string had no `@` separating address and net.
    #[error("NID {0:?} has no '@net' part")]
    MissingNet(String),
    /// The net part names no known LND type.
    #[error("unknown network type in {0:?}")]
    UnknownNet(String),
    /// The net number is not a decimal number in `0..=65535`.
    #[error("bad network number in {0:?}")]
    BadNetNumber(String),
    /// The address part does not fit the LND type of the net.
    #[error("bad address {addr:?} for net {net}")]
    BadAddress {
        /// The address text.
        addr: String,
        /// The net it was meant for.
        net: Net,
    },
    /// A process id string had a malformed pid part.
    #[error("bad pid in {0:?}")]
    BadPid(String),
}

/// The LND (network driver) type of a net, the upper 16 bits of a [`Net`].
///
/// Numbers follow Lustre's `nidstr.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LndType {
    /// Loopback (`lo`, 9).
    Lo,
    /// Socket LND (`tcp`, 2).
    Tcp,
    /// InfiniBand verbs LND (`o2ib`, 5).
    O2ib,
    /// Cray Gemini/Aries LND (`gni`, 13).
    Gni,
    /// libfabric LND (`kfi`, 16).
    Kfi,
    /// AWS EFA LND (`efa`, 18).
    Efa,
    /// Any other type number; printed as `<type:num>`.
    Other(u16),
}

/// How the address part of a NID is written for a given LND type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AddrForm {
    Ipv4,
    Decimal,
}

const NAMED_LNDS: [LndType; 6] = [
    LndType::Lo,
    LndType::Tcp,
    LndType::O2ib,
    LndType::Gni,
    LndType::Kfi,
    LndType::Efa,
];

impl LndType {
    /// The LND type number used in NIDs.
    #[must_use]
    pub const fn number(self) -> u16 {
        match self {
            Self::Lo => 9,
            Self::Tcp => 2,
            Self::O2ib => 5,
            Self::Gni => 13,
            Self::Kfi => 16,
            Self::Efa => 18,
            Self::Other(n) => n,
        }
    }

    /// The LND type for a type number (unknown numbers give [`LndType::Other`]).
    #[must_use]
    pub const fn from_number(n: u16) -> Self {
        match n {
            9 => Self::Lo,
            2 => Self::Tcp,
            5 => Self::O2ib,
            13 => Self::Gni,
            16 => Self::Kfi,
            18 => Self::Efa,
            n => Self::Other(n),
        }
    }

    /// The name used in net strings, if the type has one.
    #[must_use]
    pub const fn name(self) -> Option<&'static str> {
        match Self::from_number(self.number()) {
            Self::Lo => Some("lo"),
            Self::Tcp => Some("tcp"),
            Self::O2ib => Some("o2ib"),
            Self::Gni => Some("gni"),
            Self::Kfi => Some("kfi"),
            Self::Efa => Some("efa"),
            Self::Other(_) => None,
        }
    }

    const fn addr_form(self) -> AddrForm {
        match Self::from_number(self.number()) {
            Self::Tcp | Self::O2ib | Self::Kfi | Self::Efa => AddrForm::Ipv4,
            Self::Lo | Self::Gni | Self::Other(_) => AddrForm::Decimal,
        }
    }
}

impl PartialEq<u16> for LndType {
    fn eq(&self, other: &u16) -> bool {
        self.number() == *other
    }
}

/// A network: LND type in the upper 16 bits, net number in the lower 16.
///
/// `tcp` is `tcp0`; `o2ib1` is `Net::new(LndType::O2ib, 1)` = `0x0005_0001`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Net(u32);

impl Net {
    /// The loopback net `lo` (`lo0`).
    pub const LO: Self = Self(9 << 16);
    /// `LNET_NET_ANY`: all ones, "any net".
    pub const ANY: Self = Self(u32::MAX);

    /// The net of LND type `lnd` with net number `number`.
    #[must_use]
    pub const fn new(lnd: LndType, number: u16) -> Self {
        Self(((lnd.number() as u32) << 16) | number as u32)
    }

    /// The net with the raw 32-bit value `raw`.
    #[must_use]
    pub const fn from_u32(raw: u32) -> Self {
        Self(raw)
    }

    /// The raw 32-bit value.
    #[must_use]
    pub const fn as_u32(self) -> u32 {
        self.0
    }

    /// The LND type.
    #[must_use]
    pub const fn lnd(self) -> LndType {
        LndType::from_number((self.0 >> 16) as u16)
    }

    /// The net number within the LND type.
    #[must_use]
    pub const fn number(self) -> u16 {
        (self.0 & 0xffff) as u16
    }

    /// Whether this is the loopback LND type.
    #[must_use]
    pub const fn is_lo(self) -> bool {
        matches!(self.lnd(), LndType::Lo)
    }

    /// The NID with address `addr` on this net.
    #[must_use]
    pub const fn nid(self, addr: u32) -> Nid {
        Nid::new(self, addr)
    }

    /// The NID `addr@self` for an IPv4 address.
    #[must_use]
    pub const fn nid_ipv4(self, addr: Ipv4Addr) -> Nid {
        Nid::new(self, u32::from_be_bytes(addr.octets()))
    }

    /// The "every NID on this net" wildcard `255.255.255.255@net` used by fault rules.
    #[must_use]
    pub const fn wildcard_nid(self) -> Nid {
        Nid::new(self, u32::MAX)
    }

    fn parse_addr(self, addr: &str) -> Result<u32, IdError> {
        let bad = || IdError::BadAddress {
            addr: addr.to_owned(),
            net: self,
        };
        match self.lnd().addr_form() {
            AddrForm::Ipv4 => addr
                .parse::<Ipv4Addr>()
                .map(|ip| u32::from_be_bytes(ip.octets()))
                .map_err(|_| bad()),
            AddrForm::Decimal => {
                if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                addr.parse::<u32>().map_err(|_| bad())
            }
        }
    }

    fn fmt_addr(self, addr: u32, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lnd().addr_form() {
            AddrForm::Ipv4 => write!(f, "{}", Ipv4Addr::from(addr.to_be_bytes())),
            AddrForm::Decimal => write!(f, "{addr}"),
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::ANY {
            return f.write_str("LNET_NET_ANY");
        }
        match self.lnd().name() {
            Some(name) if self.number() == 0 => f.write_str(name),
            Some(name) => write!(f, "{name}{}", self.number()),
            None => write!(f, "<{}:{}>", self.lnd().number(), self.number()),
        }
    }
}

impl fmt::Debug for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Net({self})")
    }
}

fn parse_u16_decimal(s: &str, whole: &str) -> Result<u16, IdError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdError::BadNetNumber(whole.to_owned()));
    }
    s.parse::<u16>()
        .map_err(|_| IdError::BadNetNumber(whole.to_owned()))
}

impl FromStr for Net {
    type Err = IdError;

    /// Parses `tcp`, `tcp0`, `o2ib1`, `lo`, `<99:3>` or `LNET_NET_ANY`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s == "LNET_NET_ANY" {
            return Ok(Self::ANY);
        }
        if let Some(inner) = s.strip_prefix('<').and_then(|r| r.strip_suffix('>')) {
            let (ty, num) = inner
                .split_once(':')
                .ok_or_else(|| IdError::UnknownNet(s.to_owned()))?;
            let ty = parse_u16_decimal(ty, s).map_err(|_| IdError::UnknownNet(s.to_owned()))?;
            let num = parse_u16_decimal(num, s)?;
            return Ok(Self::new(LndType::from_number(ty), num));
        }
        for lnd in NAMED_LNDS {
            let Some(name) = lnd.name() else { continue };
            if let Some(rest) = s.strip_prefix(name) {
                if rest.is_empty() {
                    return Ok(Self::new(lnd, 0));
                }
                if rest.bytes().all(|b| b.is_ascii_digit()) {
                    return Ok(Self::new(lnd, parse_u16_decimal(rest, s)?));
                }
            }
        }
        Err(IdError::UnknownNet(s.to_owned()))
    }
}

/// A network identifier: `net << 32 | address` (Lustre's 8-byte `lnet_nid_t`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nid(u64);

/// `LNET_NID_ANY`: all ones, "any NID".
pub const LNET_NID_ANY: Nid = Nid::ANY;
/// `LNET_NID_LO_0`: the loopback NID `0@lo`.
pub const LNET_NID_LO_0: Nid = Nid::LO_0;

impl Nid {
    /// `LNET_NID_ANY`: all ones.
    pub const ANY: Self = Self(u64::MAX);
    /// The loopback NID `0@lo`.
    pub const LO_0: Self = Self::new(Net::LO, 0);

    /// The NID with address `addr` on `net`.
    #[must_use]
    pub const fn new(net: Net, addr: u32) -> Self {
        Self(((net.as_u32() as u64) << 32) | addr as u64)
    }

    /// The NID with the raw 64-bit value `raw` (as carried on the wire).
    #[must_use]
    pub const fn from_u64(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw 64-bit value.
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// The net part.
    #[must_use]
    pub const fn net(self) -> Net {
        Net::from_u32((self.0 >> 32) as u32)
    }

    /// The address part.
    #[must_use]
    pub const fn addr(self) -> u32 {
        (self.0 & 0xffff_ffff) as u32
    }

    /// Whether this is [`Nid::ANY`].
    #[must_use]
    pub const fn is_any(self) -> bool {
        self.0 == u64::MAX
    }

    /// Whether this NID is on the loopback LND.
    #[must_use]
    pub const fn is_lo(self) -> bool {
        !self.is_any() && self.net().is_lo()
    }

    /// Whether this is the per-net wildcard `255.255.255.255@net` (fault rules).
    #[must_use]
    pub const fn is_net_wildcard(self) -> bool {
        !self.is_any() && self.addr() == u32::MAX
    }
}

impl fmt::Display for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            return f.write_str("LNET_NID_ANY");
        }
        let net = self.net();
        net.fmt_addr(self.addr(), f)?;
        write!(f, "@{net}")
    }
}

impl fmt::Debug for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nid({self})")
    }
}

impl FromStr for Nid {
    type Err = IdError;

    /// Parses `addr@net` (see the [module docs](self)), `LNET_NID_ANY` or `*`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s == "LNET_NID_ANY" || s == "*" {
            return Ok(Self::ANY);
        }
        let (addr, net) = s
            .rsplit_once('@')
            .ok_or_else(|| IdError::MissingNet(s.to_owned()))?;
        let net: Net = net.parse()?;
        Ok(Self::new(net, net.parse_addr(addr)?))
    }
}

/// A process id within a node (`lnet_pid_t`).
pub type Pid = u32;

/// `LNET_PID_ANY`: all ones, "any process".
pub const LNET_PID_ANY: Pid = u32::MAX;
/// `LNET_PID_LUSTRE`: the pid kernel LNet uses (12345).
pub const LNET_PID_LUSTRE: Pid = 12345;
/// `LNET_PID_USERFLAG`: marks a userspace peer.
pub const LNET_PID_USERFLAG: Pid = 0x8000_0000;

/// A process on a node: `(nid, pid)` (`lnet_process_id`).
///
/// Printed as `12345-10.0.0.1@tcp`; a pid with [`LNET_PID_USERFLAG`] set is
/// printed with a `U` prefix (`U7-…`) and [`LNET_PID_ANY`] as `LNET_PID_ANY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId {
    /// The NID.
    pub nid: Nid,
    /// The pid.
    pub pid: Pid,
}

impl ProcessId {
    /// `(LNET_NID_ANY, LNET_PID_ANY)`: matches every process.
    pub const ANY: Self = Self {
        nid: Nid::ANY,
        pid: LNET_PID_ANY,
    };

    /// A process id.
    #[must_use]
    pub const fn new(nid: Nid, pid: Pid) -> Self {
        Self { nid, pid }
    }

    /// The kernel-LNet process `(nid, 12345)`.
    #[must_use]
    pub const fn lustre(nid: Nid) -> Self {
        Self::new(nid, LNET_PID_LUSTRE)
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pid == LNET_PID_ANY {
            write!(f, "LNET_PID_ANY-{}", self.nid)
        } else if self.pid & LNET_PID_USERFLAG != 0 {
            write!(f, "U{}-{}", self.pid & !LNET_PID_USERFLAG, self.nid)
        } else {
            write!(f, "{}-{}", self.pid, self.nid)
        }
    }
}

impl FromStr for ProcessId {
    type Err = IdError;

    /// Parses `pid-nid`, `Upid-nid` or `LNET_PID_ANY-nid`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        let (pid, nid) = s
            .split_once('-')
            .ok_or_else(|| IdError::BadPid(s.to_owned()))?;
        let nid: Nid = nid.parse()?;
        let digits = |d: &str| -> Result<u32, IdError> {
            if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
                return Err(IdError::BadPid(s.to_owned()));
            }
            d.parse::<u32>().map_err(|_| IdError::BadPid(s.to_owned()))
        };
        let pid = if pid == "LNET_PID_ANY" {
            LNET_PID_ANY
        } else if let Some(user) = pid.strip_prefix('U') {
            let p = digits(user)?;
            if p & LNET_PID_USERFLAG != 0 || p | LNET_PID_USERFLAG == LNET_PID_ANY {
                return Err(IdError::BadPid(s.to_owned()));
            }
            p | LNET_PID_USERFLAG
        } else {
            let p = digits(pid)?;
            if p & LNET_PID_USERFLAG != 0 {
                return Err(IdError::BadPid(s.to_owned()));
            }
            p
        };
        Ok(Self { nid, pid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nid(s: &str) -> Nid {
        s.parse().expect("valid NID")
    }

    #[test]
    fn lustre_encodings() {
        assert_eq!(nid("192.168.1.2@o2ib1").as_u64(), 0x0005_0001_C0A8_0102);
        assert_eq!(nid("10.0.0.1@tcp").as_u64(), 0x0002_0000_0A00_0001);
        assert_eq!(nid("10.0.0.1@tcp0"), nid("10.0.0.1@tcp"));
        assert_eq!(nid("0@lo"), Nid::LO_0);
        assert_eq!(Nid::LO_0.as_u64(), 0x0009_0000_0000_0000);
        assert_eq!(LNET_NID_ANY.as_u64(), u64::MAX);
        assert_eq!(LNET_NID_LO_0, Nid::LO_0);
        assert_eq!(nid("17@gni3").net(), Net::new(LndType::Gni, 3));
        assert_eq!(nid("17@gni3").addr(), 17);
        assert_eq!(Net::new(LndType::O2ib, 1).as_u32(), 0x0005_0001);
    }

    #[test]
    fn display_omits_net_zero() {
        assert_eq!(nid("10.0.0.1@tcp0").to_string(), "10.0.0.1@tcp");
        assert_eq!(nid("10.0.0.1@tcp12").to_string(), "10.0.0.1@tcp12");
        assert_eq!(Nid::LO_0.to_string(), "0@lo");
        assert_eq!(Nid::ANY.to_string(), "LNET_NID_ANY");
        assert_eq!(Net::new(LndType::Other(99), 3).to_string(), "<99:3>");
        assert_eq!(
            Nid::new(Net::new(LndType::Other(99), 3), 7).to_string(),
            "7@<99:3>"
        );
        assert_eq!(format!("{:?}", nid("1.2.3.4@kfi")), "Nid(1.2.3.4@kfi)");
    }

    #[test]
    fn nets_and_components() {
        let n = nid("192.168.1.2@o2ib1");
        assert_eq!(n.net().lnd(), LndType::O2ib);
        assert_eq!(n.net().number(), 1);
        assert_eq!(n.addr(), 0xC0A8_0102);
        assert!(Nid::LO_0.is_lo());
        assert!(!Nid::ANY.is_lo());
        assert!(!n.is_lo());
        let tcp: Net = "tcp".parse().unwrap();
        assert_eq!(
            tcp.nid_ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            nid("10.0.0.1@tcp")
        );
        assert!(tcp.wildcard_nid().is_net_wildcard());
        assert_eq!(tcp.wildcard_nid().to_string(), "255.255.255.255@tcp");
        assert_eq!("LNET_NET_ANY".parse::<Net>().unwrap(), Net::ANY);
        assert_eq!(LndType::from_number(18), LndType::Efa);
        assert_eq!(LndType::Other(5), LndType::O2ib.number());
        assert_eq!(LndType::Other(5).name(), Some("o2ib"));
    }

    #[test]
    fn parse_errors() {
        assert_eq!("".parse::<Nid>(), Err(IdError::Empty));
        assert!(matches!(
            "10.0.0.1".parse::<Nid>(),
            Err(IdError::MissingNet(_))
        ));
        assert!(matches!(
            "10.0.0.1@foo".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
        assert!(matches!(
            "10.0.0.1@tcpx".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
        assert!(matches!(
            "10.0.0.1@tcp70000".parse::<Nid>(),
            Err(IdError::BadNetNumber(_))
        ));
        assert!(matches!(
            "10.0.0.256@tcp".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "abc@lo".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "@tcp".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "-1@lo".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "5000000000@gni".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "1@<x:1>".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
        assert!(matches!(
            "1@<7>".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
        assert!(matches!(
            "12345".parse::<ProcessId>(),
            Err(IdError::BadPid(_))
        ));
        assert!(matches!(
            "x-0@lo".parse::<ProcessId>(),
            Err(IdError::BadPid(_))
        ));
        assert!(matches!(
            "2147483648-0@lo".parse::<ProcessId>(),
            Err(IdError::BadPid(_))
        ));
        assert!(matches!(
            "12345-0@foo".parse::<ProcessId>(),
            Err(IdError::UnknownNet(_))
        ));
        // Error messages are readable.
        let e = "10.0.0.256@tcp".parse::<Nid>().unwrap_err();
        assert_eq!(e.to_string(), "bad address \"10.0.0.256\" for net tcp");
    }

    #[test]
    fn any_and_star() {
        assert_eq!("*".parse::<Nid>().unwrap(), Nid::ANY);
        assert_eq!("LNET_NID_ANY".parse::<Nid>().unwrap(), Nid::ANY);
    }

    #[test]
    fn process_ids() {
        let p = ProcessId::lustre(nid("10.0.0.1@tcp"));
        assert_eq!(p.to_string(), "12345-10.0.0.1@tcp");
        assert_eq!("12345-10.0.0.1@tcp".parse::<ProcessId>().unwrap(), p);
        let u = ProcessId::new(Nid::LO_0, 7 | LNET_PID_USERFLAG);
        assert_eq!(u.to_string(), "U7-0@lo");
        assert_eq!("U7-0@lo".parse::<ProcessId>().unwrap(), u);
        assert_eq!(ProcessId::ANY.to_string(), "LNET_PID_ANY-LNET_NID_ANY");
        assert_eq!(
            "LNET_PID_ANY-LNET_NID_ANY".parse::<ProcessId>().unwrap(),
            ProcessId::ANY
        );
    }

    fn any_net() -> impl Strategy<Value = Net> {
        (any::<u16>(), any::<u16>()).prop_map(|(t, n)| Net::new(LndType::from_number(t), n))
    }

    proptest! {
        #[test]
        fn nid_u64_string_round_trip(raw in any::<u64>()) {
            let n = Nid::from_u64(raw);
            prop_assert_eq!(n.to_string().parse::<Nid>().unwrap(), n);
        }

        #[test]
        fn nid_string_round_trip(net in any_net(), addr in any::<u32>()) {
            let n = Nid::new(net, addr);
            let s = n.to_string();
            prop_assert_eq!(s.parse::<Nid>().unwrap(), n);
            prop_assert_eq!(Nid::from_u64(n.as_u64()), n);
            prop_assert_eq!(n.net(), net);
            prop_assert_eq!(n.addr(), addr);
        }

        #[test]
        fn net_string_round_trip(net in any_net()) {
            prop_assert_eq!(net.to_string().parse::<Net>().unwrap(), net);
        }

        #[test]
        fn process_id_round_trip(net in any_net(), addr in any::<u32>(), pid in any::<u32>()) {
            let p = ProcessId::new(Nid::new(net, addr), pid);
            prop_assert_eq!(p.to_string().parse::<ProcessId>().unwrap(), p);
        }

        #[test]
        fn parsing_never_panics(s in ".{0,40}") {
            let _ = s.parse::<Nid>();
            let _ = s.parse::<Net>();
            let _ = s.parse::<ProcessId>();
        }
    }
}
