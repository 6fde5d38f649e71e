//! The socket LND's link watch: whether the interface holding an NI's IP
//! is up, as socklnd's netdev and inetaddr notifiers tell LNet
//! (`ksocknal_handle_link_state_change`, `lnet_set_link_fatal_state`).
//!
//! A user-space LND has no notifier, but the kernel tells the same news
//! to a routing netlink socket that joins the link and IPv4 address
//! groups ([`LinkEvents`]): a thread of the LND waits on it and, at each
//! message, reads the interface table (`getifaddrs`) and reports every NI
//! whose state changed, as the notifiers do, before `ip link set ... down`
//! has returned to its shell. The reaper reads the table on each of its
//! ticks as well, which is all there is where the socket cannot be opened
//! (and catches a change whose message the socket's full buffer lost).
//! An NI's link is up when an interface that is up and running
//! holds its IP; an IP no interface holds has no link (Lustre's "no
//! matching IP"). The one exception is the loopback interface, which
//! answers for its whole prefix (the kernel delivers all of 127.0.0.0/8
//! on `lo` though only 127.0.0.1 is assigned): an IP held by no interface
//! but inside a loopback interface's prefix follows that interface.

use std::io::Read;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One IPv4 address of an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// The interface's name.
    pub(crate) name: String,
    /// The address.
    pub(crate) addr: Ipv4Addr,
    /// Its netmask.
    pub(crate) mask: Ipv4Addr,
    /// `IFF_UP` (administratively up).
    pub(crate) up: bool,
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

/// The IPv4 address an NI on interface `name` takes, as socklnd takes
/// an interface's (its first IPv4 address), or why there is none.
///
/// # Errors
/// A message naming the interface: no such interface, or none of its
/// addresses is IPv4.
pub(crate) fn interface_ip(name: &str, ifaces: &[IfAddr]) -> Result<Ipv4Addr, String> {
    ifaces
        .iter()
        .find(|i| i.name == name)
        .map(|i| i.addr)
        .ok_or_else(|| format!("no interface {name} with an IPv4 address"))
}

/// The interface that holds `ip` (an exact address), if any.
pub(crate) fn interface_of(ip: Ipv4Addr, ifaces: &[IfAddr]) -> Option<&str> {
    ifaces
        .iter()
        .find(|i| i.addr == ip)
        .map(|i| i.name.as_str())
}

/// The interface an NI takes when `net add` names none, as socklnd's
/// start-up picks one: the first interface that is up and running and
/// not a loopback.
pub(crate) fn default_interface(ifaces: &[IfAddr]) -> Option<&IfAddr> {
    ifaces.iter().find(|i| i.running && !i.loopback)
}

/// Calls `f` with each entry of the system's interface address list
/// (`getifaddrs`) that has an address: its name, flags and address.
fn walk_ifaddrs(mut f: impl FnMut(&str, u32, &libc::ifaddrs)) -> std::io::Result<()> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success it holds a list
    // that we free with `freeifaddrs` below, once.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet
        // freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        f(&name, ifa.ifa_flags, ifa);
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // `f` borrowed entries only for the length of its calls.
    unsafe { libc::freeifaddrs(head) };
    Ok(())
}

/// The system's IPv4 interface addresses.
///
/// # Errors
/// `getifaddrs` failed.
pub(crate) fn read_ifaddrs() -> std::io::Result<Vec<IfAddr>> {
    let mut out = Vec::new();
    walk_ifaddrs(|name, flags, ifa| {
        // SAFETY: `walk_ifaddrs` passes entries whose `ifa_addr` is
        // non-null; it points to a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family != libc::AF_INET {
            return;
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
            return;
        };
        let mask = v4(ifa.ifa_netmask).unwrap_or(Ipv4Addr::BROADCAST);
        let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        out.push(IfAddr {
            name: name.to_owned(),
            addr,
            mask,
            up: flags & libc::IFF_UP as u32 != 0,
            running: flags & want == want,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    })?;
    Ok(out)
}

/// The system's IPv6 interface addresses, `(interface, address)`: what
/// an `ip2nets` IPv6 range is matched against (NIDs stay IPv4).
///
/// # Errors
/// `getifaddrs` failed.
pub(crate) fn read_ipv6_addrs() -> std::io::Result<Vec<(String, std::net::Ipv6Addr)>> {
    let mut out = Vec::new();
    walk_ifaddrs(|name, _, ifa| {
        // SAFETY: as in `read_ifaddrs`.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family != libc::AF_INET6 {
            return;
        }
        // SAFETY: an AF_INET6 entry's address is a `sockaddr_in6`.
        let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
        out.push((
            name.to_owned(),
            std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr),
        ));
    })?;
    Ok(out)
}

/// A routing netlink socket (`NETLINK_ROUTE`) joined to the groups of
/// link changes (`RTMGRP_LINK`: an interface up, down, carrier on or
/// off) and IPv4 address changes (`RTMGRP_IPV4_IFADDR`), non-blocking.
/// What a message says is not parsed: any message means "read the
/// interface table again".
pub(crate) struct LinkEvents {
    fd: std::fs::File,
}

impl LinkEvents {
    /// Opens and binds the socket.
    ///
    /// # Errors
    /// `socket` or `bind` failed (a kernel without netlink, a sandbox that
    /// forbids it): the tick's reading of the table is then all there is.
    pub(crate) fn open() -> std::io::Result<Self> {
        // SAFETY: plain system call with constant arguments; the result
        // is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor socket() just returned, owned by
        // nothing else: `OwnedFd` closes it once, on every path below.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero `sockaddr_nl` is valid (a plain C struct);
        // the fields that matter are set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // nl_pid 0: the kernel assigns the port.
        sa.nl_groups = (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR) as u32;
        // SAFETY: `sa` is a valid sockaddr_nl for the length given, and
        // `fd` an open socket.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sa).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            fd: std::fs::File::from(fd),
        })
    }

    /// The descriptor, for a poll to wait on.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads every message waiting; returns whether there was any (or
    /// the socket overflowed, `ENOBUFS`: messages were lost, so the
    /// table must be read too).
    pub(crate) fn drain(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            match self.fd.read(&mut buf) {
                Ok(0) => return any,
                Ok(_) => any = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => any = true,
                Err(e) => {
                    tracing::debug!(target: "colibri_lnet_rt::sock", error = %e, "reading link events");
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ifa(name: &str, addr: &str, mask: &str, running: bool, loopback: bool) -> IfAddr {
        IfAddr {
            name: name.into(),
            addr: addr.parse().unwrap(),
            mask: mask.parse().unwrap(),
            up: running,
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
    fn interfaces_are_found_by_name_and_address() {
        let set = [
            ifa("lo", "127.0.0.1", "255.0.0.0", true, true),
            ifa("eth0", "10.1.0.5", "255.255.0.0", false, false),
            ifa("eth1", "10.2.0.5", "255.255.0.0", true, false),
            ifa("eth1", "10.3.0.5", "255.255.0.0", true, false),
        ];
        assert_eq!(interface_ip("eth1", &set), Ok("10.2.0.5".parse().unwrap()));
        assert_eq!(interface_ip("lo", &set), Ok(Ipv4Addr::LOCALHOST));
        assert_eq!(
            interface_ip("eth9", &set),
            Err("no interface eth9 with an IPv4 address".into())
        );
        assert_eq!(
            interface_of("10.3.0.5".parse().unwrap(), &set),
            Some("eth1")
        );
        assert_eq!(interface_of("127.0.5.5".parse().unwrap(), &set), None);
        // eth0 is down, lo a loopback: eth1.
        assert_eq!(
            default_interface(&set).map(|i| i.name.as_str()),
            Some("eth1")
        );
        assert_eq!(default_interface(&set[..2]), None);
    }

    #[test]
    fn link_events_open_and_start_empty() {
        // Opening needs no privilege. Draining a socket with nothing
        // waiting returns at once (non-blocking) instead of waiting for
        // an interface to change; whether anything was there depends on
        // what other processes do meanwhile, so only the return counts.
        let mut ev = LinkEvents::open().expect("a routing netlink socket");
        assert!(ev.raw_fd() >= 0);
        let t = std::time::Instant::now();
        let _ = ev.drain();
        let _ = ev.drain();
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
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
