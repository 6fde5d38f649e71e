//! The socket LND's link watch: whether the interface holding an NI's IP
//! is up, as socklnd's netdev and inetaddr notifiers tell LNet
//! (`ksocknal_handle_link_state_change`, `lnet_set_link_fatal_state`).
//!
//! A user-space LND has no notifier: the reaper reads the interface table
//! (`getifaddrs`) on each of its ticks and reports an NI whose state
//! changed. An NI's link is up when an interface that is up and running
//! holds its IP; an IP no interface holds has no link (Lustre's "no
//! matching IP"). The one exception is the loopback interface, which
//! answers for its whole prefix (the kernel delivers all of 127.0.0.0/8
//! on `lo` though only 127.0.0.1 is assigned): an IP held by no interface
//! but inside a loopback interface's prefix follows that interface.

use std::net::Ipv4Addr;

/// One IPv4 address of an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// The interface's name.
    pub(crate) name: String,
    /// The address.
    pub(crate) addr: Ipv4Addr,
    /// Its netmask.
    pub(crate) mask: Ipv4Addr,
    /// `IFF_UP` and `IFF_RUNNING` (administratively up, carrier on).
    pub(crate) running: bool,
    /// `IFF_LOOPBACK`.
    pub(crate) loopback: bool,
}

/// Whether `ip`'s link is up among `ifaces` (module docs).
pub(crate) fn link_up(ip: Ipv4Addr, ifaces: &[IfAddr]) -> bool {
    let exact: Vec<&IfAddr> = ifaces.iter().filter(|i| i.addr == ip).collect();
    if !exact.is_empty() {
        return exact.iter().any(|i| i.running);
    }
    let prefix =
        |i: &IfAddr| u32::from(i.addr) & u32::from(i.mask) == u32::from(ip) & u32::from(i.mask);
    ifaces
        .iter()
        .filter(|i| i.loopback && prefix(i))
        .any(|i| i.running)
}

/// The system's IPv4 interface addresses.
///
/// # Errors
/// `getifaddrs` failed.
pub(crate) fn read_ifaddrs() -> std::io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success it holds a list
    // that we free with `freeifaddrs` below, once.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet
        // freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr of the
        // family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family != libc::AF_INET {
            continue;
        }
        let v4 = |p: *const libc::sockaddr| -> Option<Ipv4Addr> {
            if p.is_null() {
                return None;
            }
            // SAFETY: an AF_INET entry's address and netmask are
            // `sockaddr_in`s (the netmask may be absent: checked above).
            let sin = unsafe { &*p.cast::<libc::sockaddr_in>() };
            Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        };
        let Some(addr) = v4(ifa.ifa_addr) else {
            continue;
        };
        let mask = v4(ifa.ifa_netmask).unwrap_or(Ipv4Addr::BROADCAST);
        // SAFETY: `ifa_name` is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        out.push(IfAddr {
            name,
            addr,
            mask,
            running: flags & want == want,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // nothing borrowed from it is kept (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, addr: &str, mask: &str, running: bool, loopback: bool) -> IfAddr {
        IfAddr {
            name: name.into(),
            addr: addr.parse().unwrap(),
            mask: mask.parse().unwrap(),
            running,
            loopback,
        }
    }

    #[test]
    fn an_exact_address_decides_then_a_loopback_prefix() {
        let lo = ifa("lo", "127.0.0.1", "255.0.0.0", true, true);
        let eth = ifa("eth0", "10.1.0.5", "255.255.0.0", true, false);
        let v0 = ifa("v0", "127.0.99.1", "255.255.255.255", false, false);
        let set = [lo.clone(), eth.clone(), v0];
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert!(link_up(ip("127.0.0.1"), &set));
        // Any 127.x is delivered on lo.
        assert!(link_up(ip("127.0.85.1"), &set));
        // Held by an interface that is down: no link, lo or not.
        assert!(!link_up(ip("127.0.99.1"), &set));
        assert!(link_up(ip("10.1.0.5"), &set));
        // In eth0's subnet but not its address: no link.
        assert!(!link_up(ip("10.1.0.6"), &set));
        let down = [ifa("lo", "127.0.0.1", "255.0.0.0", false, true), eth];
        assert!(!link_up(ip("127.0.85.1"), &down));
        assert!(!link_up(ip("192.0.2.7"), &[lo]));
    }

    #[test]
    fn the_machines_loopback_is_read_up() {
        let set = read_ifaddrs().unwrap();
        let lo = set
            .iter()
            .find(|i| i.loopback)
            .expect("a loopback interface");
        assert!(lo.running, "{set:?}");
        assert!(link_up(Ipv4Addr::LOCALHOST, &set));
        assert!(link_up(Ipv4Addr::new(127, 0, 85, 1), &set));
        // TEST-NET-1: held by no interface here.
        assert!(!link_up(Ipv4Addr::new(192, 0, 2, 77), &set), "{set:?}");
    }
}
