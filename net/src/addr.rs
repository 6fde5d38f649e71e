//! Internet-style addresses shared by the transports that use them:
//! `a.b.c.d:port[:service]`, a 3-tuple (host, port, service id).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::error::NetError;

/// An address `a.b.c.d:port:service` (or `a.b.c.d:port`, meaning service 0).
///
/// The IPv4 address and port name a listening point; the service id tells
/// apart the transfer machines of one process that share it. `Display`
/// prints all three parts; [`InetAddr::compact`] omits a zero service.
/// Either way, two strings naming the same end point print the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InetAddr {
    /// IPv4 address.
    pub ip: Ipv4Addr,
    /// Port; 0 at start means "pick a free one".
    pub port: u16,
    /// Service id (the tuple's third part).
    pub service: u32,
}

impl InetAddr {
    /// Parses an address.
    ///
    /// # Errors
    /// `InvalidAddress` naming what is wrong.
    pub fn parse(s: &str) -> Result<Self, NetError> {
        let bad = |reason: &str| NetError::InvalidAddress {
            addr: s.to_string(),
            reason: reason.to_string(),
        };
        let mut parts = s.split(':');
        let ip = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| bad("missing IPv4 address"))?
            .parse::<Ipv4Addr>()
            .map_err(|_| bad("not a dotted IPv4 address"))?;
        let port = parts
            .next()
            .ok_or_else(|| bad("missing port"))?
            .parse::<u16>()
            .map_err(|_| bad("port is not a number in 0..=65535"))?;
        let service = match parts.next() {
            None => 0,
            Some(p) => p
                .parse::<u32>()
                .map_err(|_| bad("service id is not a 32-bit number"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many ':'-separated parts"));
        }
        Ok(Self { ip, port, service })
    }

    /// The socket address (IP and port).
    pub fn sock(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, self.port)
    }

    /// The printable form without a zero service: `a.b.c.d:port`, or
    /// `a.b.c.d:port:service` when the service is not 0.
    pub fn compact(&self) -> String {
        if self.service == 0 {
            format!("{}:{}", self.ip, self.port)
        } else {
            self.to_string()
        }
    }
}

impl fmt::Display for InetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.ip, self.port, self.service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_print() {
        let a = InetAddr::parse("127.0.0.1:5000").unwrap();
        assert_eq!((a.port, a.service), (5000, 0));
        assert_eq!(a.to_string(), "127.0.0.1:5000:0");
        assert_eq!(a.compact(), "127.0.0.1:5000");
        assert_eq!(InetAddr::parse("127.0.0.1:5000:0").unwrap(), a);
        let b = InetAddr::parse("10.1.2.3:7:42").unwrap();
        assert_eq!(b.to_string(), "10.1.2.3:7:42");
        assert_eq!(b.compact(), "10.1.2.3:7:42");
        assert_eq!(b.sock().to_string(), "10.1.2.3:7");
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:",
            "256.0.0.1:1",
            "127.0.0.1:65536",
            "127.0.0.1:1:x",
            "127.0.0.1:1:2:3",
            "host:1",
            " 127.0.0.1:1",
            "127.0.0.1:-1",
        ] {
            assert!(
                matches!(InetAddr::parse(bad), Err(NetError::InvalidAddress { .. })),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn any_string_parses_or_errs(s in ".{0,40}") {
            let _ = InetAddr::parse(&s);
        }

        #[test]
        fn round_trips(ip in any::<u32>(), port in any::<u16>(), service in any::<u32>()) {
            let a = InetAddr { ip: Ipv4Addr::from(ip), port, service };
            prop_assert_eq!(InetAddr::parse(&a.to_string()).unwrap(), a);
            prop_assert_eq!(InetAddr::parse(&a.compact()).unwrap(), a);
        }
    }
}
