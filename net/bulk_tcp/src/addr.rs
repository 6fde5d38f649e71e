//! Addresses of the TCP transport: the seed's `host:port:service` 3-tuple.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use colibri_net::NetError;

/// A TCP transport address: `a.b.c.d:port:service` (or `a.b.c.d:port`,
/// which means service 0).
///
/// The IPv4 address and port name a listening socket; the service id tells
/// apart the transfer machines of one process that share it. The canonical
/// form always prints the three parts, so `127.0.0.1:5000` and
/// `127.0.0.1:5000:0` name the same end point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpAddr {
    /// IPv4 address of the listening socket.
    pub ip: Ipv4Addr,
    /// TCP port; 0 at start means "pick a free one".
    pub port: u16,
    /// Service id (the seed's third tuple).
    pub service: u32,
}

impl TcpAddr {
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

    /// The socket address (IP and port) of the listener.
    pub fn sock(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, self.port)
    }
}

impl fmt::Display for TcpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.ip, self.port, self.service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let a = TcpAddr::parse("127.0.0.1:5000").unwrap();
        assert_eq!((a.port, a.service), (5000, 0));
        assert_eq!(a.to_string(), "127.0.0.1:5000:0");
        let b = TcpAddr::parse("10.1.2.3:7:42").unwrap();
        assert_eq!(b.to_string(), "10.1.2.3:7:42");
        assert_eq!(TcpAddr::parse("127.0.0.1:5000:0").unwrap(), a);
        assert_eq!(b.sock(), "10.1.2.3:7".parse().unwrap());
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
            "not an address",
        ] {
            assert!(
                matches!(TcpAddr::parse(bad), Err(NetError::InvalidAddress { .. })),
                "{bad:?}"
            );
        }
    }
}
