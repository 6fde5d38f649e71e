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
//! `10.0.0.1@tcp` (net `tcp0`), `192.168.1.2@o2ib1`, `0@lo`. The rules are
//! those of Lustre's libcfs (`lnet/lnet/nidstrings.c`):
//!
//! * Addresses of IP based LNDs (`tcp`, `o2ib`, `gip`, `efa`) are dotted IPv4
//!   quads (each part a decimal number up to 255; leading zeros are allowed,
//!   as `sscanf("%u.%u.%u.%u")` allows them).
//! * The numeric LNDs (`gni`, `ptlf`, `kfi`, `bxi3f`) print a decimal number
//!   and parse a decimal number or `0x`/`0X` hexadecimal.
//! * `lo` takes no net number (`0@lo1` and `0@lo0` are errors) and any
//!   address text on `lo` means address 0: `5@lo` is `0@lo`.
//! * An LND type without a known name is written `<type:number>` and its
//!   address in hexadecimal without prefix: `11@<99:3>` is address 17 on net
//!   99/3. Lustre prints this form but cannot parse it back; we do, and we
//!   also print the loopback NIDs that Lustre's strings cannot express (an
//!   address or net number other than 0 on `lo`) in this form (`5@<9:0>`),
//!   so that every 64-bit value round-trips.
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
    /// The loopback net was given a net number (`lo1`, `lo0`); libcfs
    /// allows only `lo`.
    #[error("the loopback net takes no number: {0:?}")]
    LoopbackNumber(String),
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
    /// Cray Gemini IP LND (`gip`, 14).
    Gip,
    /// Bull Portals 4 LND (`ptlf`, 15).
    Ptl4,
    /// AWS EFA LND (`efa`, 18).
    Efa,
    /// Bull BXIv3 LND (`bxi3f`, 19).
    Bxi3,
    /// Any other type number; printed as `<type:num>`.
    Other(u16),
}

/// How the address part of a NID is written for a given LND type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AddrForm {
    /// Dotted quad (`libcfs_ip_addr2str` / `libcfs_ip_str2addr`).
    Ipv4,
    /// Decimal, parsed as decimal or `0x` hex (`libcfs_num_str2addr`).
    Number,
    /// `lo`: printed as a number, any text parses as 0 (`libcfs_lo_str2addr`).
    Loopback,
    /// No known name: hexadecimal, as in `11@<99:3>`.
    Hex,
}

/// The named LND types in libcfs's table order (names are matched as
/// prefixes in this order, as `libcfs_str2net_internal` does).
const NAMED_LNDS: [LndType; 9] = [
    LndType::Lo,
    LndType::Tcp,
    LndType::O2ib,
    LndType::Gni,
    LndType::Gip,
    LndType::Ptl4,
    LndType::Kfi,
    LndType::Efa,
    LndType::Bxi3,
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
            Self::Gip => 14,
            Self::Ptl4 => 15,
            Self::Kfi => 16,
            Self::Efa => 18,
            Self::Bxi3 => 19,
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
            14 => Self::Gip,
            15 => Self::Ptl4,
            16 => Self::Kfi,
            18 => Self::Efa,
            19 => Self::Bxi3,
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
            Self::Gip => Some("gip"),
            Self::Ptl4 => Some("ptlf"),
            Self::Kfi => Some("kfi"),
            Self::Efa => Some("efa"),
            Self::Bxi3 => Some("bxi3f"),
            Self::Other(_) => None,
        }
    }

    const fn addr_form(self) -> AddrForm {
        match Self::from_number(self.number()) {
            Self::Tcp | Self::O2ib | Self::Gip | Self::Efa => AddrForm::Ipv4,
            Self::Gni | Self::Ptl4 | Self::Kfi | Self::Bxi3 => AddrForm::Number,
            Self::Lo => AddrForm::Loopback,
            Self::Other(_) => AddrForm::Hex,
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

    /// Parses the address text of a NID on this net. `form` is how the
    /// address is written: the LND's own form, or [`AddrForm::Hex`] when the
    /// net was written as `<type:num>`.
    fn parse_addr(self, addr: &str, form: AddrForm) -> Result<u32, IdError> {
        let bad = || IdError::BadAddress {
            addr: addr.to_owned(),
            net: self,
        };
        match form {
            AddrForm::Ipv4 => parse_dotted_quad(addr).ok_or_else(bad),
            AddrForm::Number => parse_number(addr).ok_or_else(bad),
            AddrForm::Loopback => Ok(0),
            AddrForm::Hex => parse_hex(addr).ok_or_else(bad),
        }
    }

    /// Whether libcfs can name this net (`tcp`, `o2ib1`, `lo`): a known LND
    /// type, and for `lo` no net number.
    pub(crate) fn has_name(self) -> bool {
        match self.lnd().name() {
            None => false,
            Some(_) => !(self.is_lo() && self.number() != 0),
        }
    }
}

/// Parses a dotted quad as `sscanf("%u.%u.%u.%u")` with every part at most
/// 255 does (leading zeros allowed; no signs or spaces).
fn parse_dotted_quad(s: &str) -> Option<u32> {
    let mut parts = s.split('.');
    let mut addr = 0u32;
    for _ in 0..4 {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let v: u32 = p.trim_start_matches('0').parse().unwrap_or(0);
        if p.trim_start_matches('0').len() > 3 || v > 255 {
            return None;
        }
        addr = (addr << 8) | v;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(addr)
}

/// Parses a numeric address as `libcfs_num_str2addr` does: `0x`/`0X`
/// hexadecimal or decimal, fitting 32 bits.
fn parse_number(s: &str) -> Option<u32> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return parse_hex(hex);
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok()
}

/// Parses hexadecimal digits (no prefix, no sign) fitting 32 bits.
fn parse_hex(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::ANY {
            return f.write_str("LNET_NET_ANY");
        }
        match self.lnd().name() {
            Some(name) if self.has_name() && self.number() == 0 => f.write_str(name),
            Some(name) if self.has_name() => write!(f, "{name}{}", self.number()),
            _ => write!(f, "<{}:{}>", self.lnd().number(), self.number()),
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

impl Net {
    /// Parses a net string and tells how addresses on it are written.
    fn parse_with_form(s: &str) -> Result<(Self, AddrForm), IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s == "LNET_NET_ANY" {
            return Ok((Self::ANY, AddrForm::Hex));
        }
        if let Some(inner) = s.strip_prefix('<').and_then(|r| r.strip_suffix('>')) {
            let (ty, num) = inner
                .split_once(':')
                .ok_or_else(|| IdError::UnknownNet(s.to_owned()))?;
            let ty = parse_u16_decimal(ty, s).map_err(|_| IdError::UnknownNet(s.to_owned()))?;
            let num = parse_u16_decimal(num, s)?;
            return Ok((Self::new(LndType::from_number(ty), num), AddrForm::Hex));
        }
        // libcfs matches the names as prefixes, in table order.
        for lnd in NAMED_LNDS {
            let Some(name) = lnd.name() else { continue };
            let Some(rest) = s.strip_prefix(name) else {
                continue;
            };
            if rest.is_empty() {
                return Ok((Self::new(lnd, 0), lnd.addr_form()));
            }
            if lnd == LndType::Lo {
                return Err(IdError::LoopbackNumber(s.to_owned()));
            }
            if rest.bytes().all(|b| b.is_ascii_digit()) {
                return Ok((Self::new(lnd, parse_u16_decimal(rest, s)?), lnd.addr_form()));
            }
            return Err(IdError::UnknownNet(s.to_owned()));
        }
        Err(IdError::UnknownNet(s.to_owned()))
    }
}

impl FromStr for Net {
    type Err = IdError;

    /// Parses `tcp`, `tcp0`, `o2ib1`, `lo`, `<99:3>` or `LNET_NET_ANY`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse_with_form(s).map(|(net, _)| net)
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
        let addr = self.addr();
        let form = if net.has_name() {
            net.lnd().addr_form()
        } else {
            AddrForm::Hex
        };
        match form {
            AddrForm::Ipv4 => write!(f, "{}@{net}", Ipv4Addr::from(addr.to_be_bytes())),
            AddrForm::Number => write!(f, "{addr}@{net}"),
            // Lustre prints any lo address in decimal; only 0 parses back
            // to itself, so the others take the generic form.
            AddrForm::Loopback if addr == 0 => write!(f, "0@{net}"),
            AddrForm::Loopback | AddrForm::Hex => {
                write!(f, "{addr:x}@<{}:{}>", net.lnd().number(), net.number())
            }
        }
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
        // The first '@' separates address and net, as libcfs's strchr.
        let (addr, net) = s
            .split_once('@')
            .ok_or_else(|| IdError::MissingNet(s.to_owned()))?;
        let (net, form) = Net::parse_with_form(net)?;
        if net == Net::ANY {
            return Err(IdError::UnknownNet(s.to_owned()));
        }
        Ok(Self::new(net, net.parse_addr(addr, form)?))
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
        assert_eq!(format!("{:?}", nid("1.2.3.4@tcp")), "Nid(1.2.3.4@tcp)");
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
            "@tcp".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "-1@gni".parse::<Nid>(),
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
    fn kfi_and_other_numeric_lnds_use_numbers() {
        // libcfs: kfi, gni, ptlf and bxi3f use libcfs_decnum_addr2str and
        // libcfs_num_str2addr (decimal, or 0x/0X hexadecimal).
        let k = nid("17@kfi");
        assert_eq!(k.as_u64(), 0x0010_0000_0000_0011);
        assert_eq!(k.to_string(), "17@kfi");
        assert_eq!(nid("0x11@kfi"), k);
        assert_eq!(nid("0X11@kfi"), k);
        assert_eq!(nid("4294967295@kfi2").addr(), u32::MAX);
        assert!(matches!(
            "1.2.3.4@kfi".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "4294967296@kfi".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "0x@kfi".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "+5@kfi".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert_eq!(nid("12@ptlf").net().lnd(), LndType::Ptl4);
        assert_eq!(nid("12@ptlf").net().lnd().number(), 15);
        assert_eq!(nid("12@bxi3f1").to_string(), "12@bxi3f1");
        assert_eq!(nid("12@bxi3f1").net(), Net::new(LndType::Bxi3, 1));
        assert_eq!(nid("10.1.2.3@gip").as_u64(), 0x000E_0000_0A01_0203);
        assert_eq!(nid("10.1.2.3@gip").to_string(), "10.1.2.3@gip");
        assert_eq!(nid("0x10@gni").to_string(), "16@gni");
    }

    #[test]
    fn dotted_quads_as_sscanf_reads_them() {
        assert_eq!(nid("010.000.0.01@tcp"), nid("10.0.0.1@tcp"));
        assert_eq!(nid("10.0.0.1@tcp").to_string(), "10.0.0.1@tcp");
        for bad in [
            "10.0.0@tcp",
            "10.0.0.1.2@tcp",
            "10..0.1@tcp",
            "10.0.0.0256@tcp",
            "10.0.0.+1@tcp",
            "10.0.0.99999999999@tcp",
            " 10.0.0.1@tcp",
        ] {
            assert!(
                matches!(bad.parse::<Nid>(), Err(IdError::BadAddress { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_lnd_types_use_hex_addresses() {
        // libcfs_nid2str: "%x@<%u:%u>".
        let n = Nid::new(Net::new(LndType::Other(99), 3), 17);
        assert_eq!(n.to_string(), "11@<99:3>");
        assert_eq!(nid("11@<99:3>"), n);
        assert_eq!(
            Nid::new(Net::new(LndType::Other(17), 0), 0xdead_beef).to_string(),
            "deadbeef@<17:0>"
        );
        assert_eq!(nid("DEADBEEF@<17:0>").addr(), 0xdead_beef);
        assert!(matches!(
            "0x11@<99:3>".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        assert!(matches!(
            "123456789@<99:3>".parse::<Nid>(),
            Err(IdError::BadAddress { .. })
        ));
        // A known type written the generic way parses too (hex address).
        assert_eq!(nid("a000001@<2:0>"), nid("10.0.0.1@tcp"));
    }

    #[test]
    fn loopback_is_strict_about_its_net_and_lax_about_its_address() {
        // libcfs_str2net_internal: "net number not allowed" for lo.
        assert!(matches!(
            "0@lo1".parse::<Nid>(),
            Err(IdError::LoopbackNumber(_))
        ));
        assert!(matches!(
            "0@lo0".parse::<Nid>(),
            Err(IdError::LoopbackNumber(_))
        ));
        assert!(matches!(
            "lo1".parse::<Net>(),
            Err(IdError::LoopbackNumber(_))
        ));
        // libcfs_lo_str2addr: any address text means 0.
        assert_eq!(nid("5@lo"), Nid::LO_0);
        assert_eq!(nid("abc@lo"), Nid::LO_0);
        assert_eq!(nid("@lo"), Nid::LO_0);
        // NIDs Lustre's strings cannot express take the generic form.
        let five = Nid::new(Net::LO, 5);
        assert_eq!(five.to_string(), "5@<9:0>");
        assert_eq!(nid("5@<9:0>"), five);
        let lo1 = Net::new(LndType::Lo, 1);
        assert_eq!(lo1.to_string(), "<9:1>");
        assert_eq!("<9:1>".parse::<Net>().unwrap(), lo1);
        assert_eq!(Nid::new(lo1, 0).to_string(), "0@<9:1>");
        assert_eq!(Net::LO.to_string(), "lo");
    }

    #[test]
    fn first_at_sign_separates_the_net() {
        assert!(matches!(
            "a@b@lo".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
        assert!(matches!(
            "1@LNET_NET_ANY".parse::<Nid>(),
            Err(IdError::UnknownNet(_))
        ));
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
        fn named_and_loopback_nids_round_trip(
            ty in prop_oneof![Just(9u16), 0u16..24],
            num in prop_oneof![Just(0u16), any::<u16>()],
            addr in prop_oneof![Just(0u32), any::<u32>()],
        ) {
            let n = Nid::new(Net::new(LndType::from_number(ty), num), addr);
            let s = n.to_string();
            prop_assert_eq!(s.parse::<Nid>().unwrap(), n, "{}", s);
            prop_assert_eq!(n.net().to_string().parse::<Net>().unwrap(), n.net());
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
