//! Addresses of the TCP transport: the `host:port:service` 3-tuple of the other transports.

/// A TCP transport address: `a.b.c.d:port:service` (or `a.b.c.d:port`,
/// which means service 0). The IPv4 address and port name a listening
/// socket; the service id tells apart the transfer machines of one process
/// that share it. The canonical form (`Display`) always prints the three
/// parts.
pub use colibri_net::addr::InetAddr as TcpAddr;

/// Parses an end point address for the core: the canonical three-part form
/// and the parsed address as the transport's data.
pub(crate) fn ep_addr(addr: &str) -> colibri_net::Result<colibri_net::xprt::EpAddr> {
    let a = TcpAddr::parse(addr)?;
    Ok(colibri_net::xprt::EpAddr {
        addr: a.to_string(),
        data: std::sync::Arc::new(a),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_has_three_parts() {
        let a = TcpAddr::parse("127.0.0.1:5000").unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:5000:0");
        assert_eq!(a.sock(), "127.0.0.1:5000".parse().unwrap());
    }
}
