//! Handshake decisions and a peer's connections (`ksocknal_recv_hello`,
//! `ksocknal_create_conn`, `ksocknal_connect` in `socklnd_cb.c` and
//! `socklnd.c`; `ksocknal_match_tx_v3` and `ksocknal_find_conn_locked` for
//! choosing a connection).
//!
//! * [`LocalEnd`] builds the HELLOs we send: an active one, a passive
//!   answer, a refusal, a version answer.
//! * [`check_active_reply`] and [`check_passive_hello`] judge the peer's
//!   HELLO on each side.
//! * [`PeerConns`] keeps what `ksock_peer_ni` keeps for the decisions: the
//!   peer's incarnation, its connections by type, whether we are connecting
//!   to it and whether it is connecting to us. [`PeerConns::admit`] decides
//!   whether a handshaken connection is kept (connection races, peer
//!   reboots, duplicates); [`PeerConns::choose`] picks the connection for a
//!   message.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::{ConnType, Hello, HelloError};
use crate::ids::{LNET_PID_USERFLAG, Net, Nid, Pid, ProcessId};
use crate::time::Time;

use super::acceptor::MAX_RESERVED_PORT;
use super::frame::{KSOCK_MSG_HDR_LEN, LNET_FRAME_HDR_LEN};

const TARGET: &str = "colibri_lnet::socklnd";

/// `SOCKNAL_MAX_RETRIES`: connection races an active side loses in a row
/// before it settles for the connections it has (or gives up).
pub const MAX_RACE_RETRIES: u32 = 3;

/// A HELLO that ends the handshake.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The HELLO could not be decoded.
    #[error(transparent)]
    Hello(#[from] HelloError),
    /// The HELLO's source NID is `LNET_NID_ANY`.
    #[error("HELLO without a source NID")]
    SrcNidAny,
    /// The HELLO is meant for another NID than ours.
    #[error("HELLO for {got}, but we are {expected}")]
    WrongDestination {
        /// Our NID.
        expected: Nid,
        /// The HELLO's destination.
        got: Nid,
    },
    /// We connected to one process and another answered ("they claimed
    /// they were ...; please check your Lustre configuration").
    #[error("connected to {expected}, but the peer claims to be {got}")]
    WrongPeer {
        /// Whom we connected to.
        expected: ProcessId,
        /// Who answered.
        got: ProcessId,
    },
    /// An active peer's HELLO with connection type NONE.
    #[error("HELLO without a connection type")]
    NoConnType,
    /// The passive side's answer is not the inverse of our type.
    #[error("mismatched connection types: we sent {sent}, the peer answered {answered}")]
    MismatchedType {
        /// Our type.
        sent: ConnType,
        /// Its answer.
        answered: ConnType,
    },
}

/// Our end of the connections of one NI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalEnd {
    /// The NI's NID.
    pub nid: Nid,
    /// Our pid (12345 for a kernel-compatible node).
    pub pid: Pid,
    /// The NI's incarnation: a value that changes whenever the NI restarts
    /// (Lustre uses its start time in ns), so peers notice reboots.
    pub incarnation: u64,
}

impl LocalEnd {
    /// The HELLO an active side sends for a connection of `conn_type` to
    /// `peer`. Destination pid and incarnation are 0, as Lustre sends them.
    #[must_use]
    pub const fn active_hello(&self, peer: Nid, conn_type: ConnType) -> Hello {
        Hello {
            src_nid: self.nid,
            dst_nid: peer,
            src_pid: self.pid,
            dst_pid: 0,
            src_incarnation: self.incarnation,
            dst_incarnation: 0,
            conn_type: Some(conn_type),
        }
    }

    /// The passive side's answer to `peer_hello`: our type for the
    /// connection (`Some`, the inverse of the peer's) or `None` to refuse it
    /// so the peer retries. Destination pid and incarnation echo the peer's
    /// HELLO, as Lustre's answer does.
    #[must_use]
    pub const fn passive_reply(&self, peer_hello: &Hello, conn_type: Option<ConnType>) -> Hello {
        Hello {
            src_nid: self.nid,
            dst_nid: peer_hello.src_nid,
            src_pid: self.pid,
            dst_pid: peer_hello.dst_pid,
            src_incarnation: self.incarnation,
            dst_incarnation: peer_hello.dst_incarnation,
            conn_type,
        }
    }

    /// What a passive side sends before closing when the peer's HELLO has a
    /// version we do not speak: our V3 HELLO, type NONE, destination our own
    /// NID (as `ksocknal_recv_hello` sends it).
    #[must_use]
    pub const fn version_reply(&self) -> Hello {
        Hello {
            src_nid: self.nid,
            dst_nid: self.nid,
            src_pid: self.pid,
            dst_pid: 0,
            src_incarnation: self.incarnation,
            dst_incarnation: 0,
            conn_type: None,
        }
    }
}

/// The active side's reading of the passive side's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveReply {
    /// The connection is up; admit it with [`PeerConns::admit`].
    Accepted {
        /// The peer's incarnation.
        incarnation: u64,
    },
    /// The peer refused (type NONE): it won a connection race, already has
    /// enough connections of the type, or saw us reboot. Close, note the
    /// incarnation ([`PeerConns::observe_incarnation`]) and retry after
    /// [`super::Reconnect::on_lost_race`].
    Retry {
        /// The peer's incarnation.
        incarnation: u64,
    },
}

/// Judges the answer to our HELLO on a connection of type `sent` to `peer`
/// (`ksocknal_recv_hello`, active side).
///
/// # Errors
/// [`HandshakeError`]: close the connection and count a failure
/// ([`super::Reconnect::on_failure`]).
pub fn check_active_reply(
    local: &LocalEnd,
    peer: ProcessId,
    sent: ConnType,
    reply: &Hello,
) -> Result<ActiveReply, HandshakeError> {
    if reply.src_nid.is_any() {
        return Err(HandshakeError::SrcNidAny);
    }
    let got = ProcessId::new(reply.src_nid, reply.src_pid);
    if got != peer {
        return Err(HandshakeError::WrongPeer {
            expected: peer,
            got,
        });
    }
    let incarnation = reply.src_incarnation;
    let Some(answered) = reply.conn_type else {
        return Ok(ActiveReply::Retry { incarnation });
    };
    if answered.invert() != sent {
        return Err(HandshakeError::MismatchedType { sent, answered });
    }
    // Lustre does not look at the answer's destination; a peer that
    // answers for someone else is misconfigured all the same.
    if reply.dst_nid != local.nid {
        return Err(HandshakeError::WrongDestination {
            expected: local.nid,
            got: reply.dst_nid,
        });
    }
    Ok(ActiveReply::Accepted { incarnation })
}

/// A passive side's reading of an active peer's HELLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassiveHello {
    /// Who the peer is.
    pub peer: ProcessId,
    /// The connection's type on our side (the inverse of the peer's).
    pub conn_type: ConnType,
    /// The peer's incarnation.
    pub incarnation: u64,
}

/// The process id Lustre gives a peer that connects from an unprivileged
/// port (only possible with `accept=all`): pid = port with
/// `LNET_PID_USERFLAG`, NID = the peer's IP on our net.
#[must_use]
pub fn userspace_peer(net: Net, ip: Ipv4Addr, port: u16) -> ProcessId {
    ProcessId::new(net.nid_ipv4(ip), u32::from(port) | LNET_PID_USERFLAG)
}

/// Judges an active peer's HELLO that arrived from `peer_ip:peer_port`
/// (`ksocknal_recv_hello`, passive side).
///
/// # Errors
/// [`HandshakeError`]: close the connection without answering.
pub fn check_passive_hello(
    local: &LocalEnd,
    hello: &Hello,
    peer_ip: Ipv4Addr,
    peer_port: u16,
) -> Result<PassiveHello, HandshakeError> {
    if hello.src_nid.is_any() {
        return Err(HandshakeError::SrcNidAny);
    }
    // Lustre trusts the acceptor's check of the request's NID and ignores
    // the HELLO's destination; we check it as well.
    if hello.dst_nid != local.nid {
        return Err(HandshakeError::WrongDestination {
            expected: local.nid,
            got: hello.dst_nid,
        });
    }
    let peer = if peer_port > MAX_RESERVED_PORT {
        userspace_peer(local.nid.net(), peer_ip, peer_port)
    } else {
        ProcessId::new(hello.src_nid, hello.src_pid)
    };
    let conn_type = hello.conn_type.ok_or(HandshakeError::NoConnType)?.invert();
    Ok(PassiveHello {
        peer,
        conn_type,
        incarnation: hello.src_incarnation,
    })
}

/// A connection, named by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A handshaken connection waiting for [`PeerConns::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its id.
    pub id: ConnId,
    /// Its type on our side.
    pub conn_type: ConnType,
    /// The peer's incarnation from its HELLO.
    pub incarnation: u64,
    /// Whether we connected (active) or accepted it (passive).
    pub active: bool,
    /// Whether both ends have the same address (a node connected to
    /// itself); such connections are never duplicates.
    pub loopback: bool,
}

/// Why a connection was not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Both sides connected at once and the peer's NID is lower than ours
    /// while we are connecting: the connection initiated by the higher NID
    /// wins (Lustre's `EALREADY`, "connection race resolution").
    LostRace,
    /// The peer's incarnation changed: it restarted. Its old connections
    /// are closed and this one refused too; the next attempt starts afresh
    /// (`ESTALE`, "peer_ni rebooted").
    PeerRebooted,
    /// Already `conns_per_peer` connections of this type ("duplicate").
    Duplicate,
}

impl Refusal {
    /// Whether a passive side answers with a HELLO of type NONE (so the
    /// peer retries later) rather than just closing. Lustre answers all
    /// three.
    #[must_use]
    pub const fn reply_none(self) -> bool {
        true
    }
}

/// The decision on a handshaken connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Keep it (a passive side now sends [`LocalEnd::passive_reply`] with the
    /// type).
    Accepted,
    /// Do not keep it: close it (a passive side first answers with
    /// [`LocalEnd::passive_reply`] of type NONE), and close the connections
    /// in `close`.
    Refused {
        /// Why.
        reason: Refusal,
        /// Existing connections to close (the peer restarted).
        close: Vec<ConnId>,
    },
}

/// How well a message fits a connection (`SOCKNAL_MATCH_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Match {
    /// Never on this connection.
    No,
    /// Allowed if no better connection exists.
    May,
    /// The connection meant for it.
    Yes,
}

/// What is to be sent, for choosing a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxKind {
    /// An LNet message with this many payload bytes.
    Lnet {
        /// `payload_length`.
        payload_len: u32,
    },
    /// A NOOP; `nonblk` for keepalives and zero-copy ACKs sent with
    /// `nonblk_zcack` (the default), which travel on the `BulkIn`
    /// connection.
    Noop {
        /// Non-blocking NOOP.
        nonblk: bool,
    },
}

impl TxKind {
    /// Bytes on the wire, headers included (what `min_bulk` is compared
    /// with).
    #[must_use]
    pub const fn wire_len(self) -> u64 {
        match self {
            Self::Lnet { payload_len } => LNET_FRAME_HDR_LEN as u64 + payload_len as u64,
            Self::Noop { .. } => KSOCK_MSG_HDR_LEN as u64,
        }
    }

    /// How well this message fits a protocol V3 connection of type `conn`
    /// (`ksocknal_match_tx_v3`): below `min_bulk` bytes (headers included)
    /// `Control`, from `min_bulk` on `BulkOut`, each allowing the other;
    /// `BulkIn` carries only NOOPs; `Any` nothing.
    #[must_use]
    pub const fn fit(self, conn: ConnType, min_bulk: u32) -> Match {
        let nonblk = matches!(self, Self::Noop { nonblk: true });
        let small = self.wire_len() < min_bulk as u64;
        match conn {
            ConnType::Any => Match::No,
            ConnType::BulkIn => match self {
                Self::Noop { nonblk: true } => Match::Yes,
                Self::Noop { nonblk: false } => Match::May,
                Self::Lnet { .. } => Match::No,
            },
            ConnType::BulkOut if nonblk => Match::No,
            ConnType::BulkOut if small => Match::May,
            ConnType::BulkOut => Match::Yes,
            ConnType::Control if nonblk => Match::No,
            ConnType::Control if small => Match::Yes,
            ConnType::Control => Match::May,
        }
    }
}

/// A connection's current load, for breaking ties between connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnLoad {
    /// Bytes queued on it, in our queue and the socket's send buffer.
    pub queued_bytes: u64,
    /// When a message was last given to it.
    pub last_post: Time,
}

/// One peer's connections and handshake state (the decision-relevant part
/// of Lustre's `ksock_peer_ni` and `ksock_conn_cb`).
#[derive(Clone, Debug)]
pub struct PeerConns {
    peer: Nid,
    max_conns: u32,
    incarnation: Option<u64>,
    conns: BTreeMap<ConnId, ConnType>,
    connecting: bool,
    accepting: u32,
}

impl PeerConns {
    /// No connections yet to `peer`; at most `max_conns` (the NI's
    /// `conns_per_peer`, at least 1) connections of each type.
    #[must_use]
    pub fn new(peer: Nid, max_conns: u32) -> Self {
        Self {
            peer,
            max_conns: max_conns.max(1),
            incarnation: None,
            conns: BTreeMap::new(),
            connecting: false,
            accepting: 0,
        }
    }

    /// The peer's NID.
    #[must_use]
    pub const fn peer(&self) -> Nid {
        self.peer
    }

    /// The peer's incarnation, once a connection has been made since the
    /// last reset.
    #[must_use]
    pub const fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// The connections and their types.
    pub fn conns(&self) -> impl Iterator<Item = (ConnId, ConnType)> + '_ {
        self.conns.iter().map(|(id, t)| (*id, *t))
    }

    /// How many connections of `conn_type` there are.
    #[must_use]
    pub fn count(&self, conn_type: ConnType) -> u32 {
        let n = self.conns.values().filter(|t| **t == conn_type).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether there is no connection.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Marks an active connection attempt as in progress or over
    /// (`ksnr_connecting`); it decides connection races.
    pub fn set_connecting(&mut self, connecting: bool) {
        self.connecting = connecting;
    }

    /// A passive handshake with this peer starts (`ksnp_accepting++`).
    pub fn begin_accept(&mut self) {
        self.accepting = self.accepting.saturating_add(1);
    }

    /// A passive handshake with this peer is over.
    pub fn end_accept(&mut self) {
        self.accepting = self.accepting.saturating_sub(1);
    }

    /// Whether an active attempt may start now: not while the peer is
    /// connecting to us (Lustre reschedules, "already connecting to me").
    #[must_use]
    pub const fn may_connect(&self) -> bool {
        self.accepting == 0
    }

    /// The type the active side should open next, `None` when the set is
    /// complete: one `Control`, then `BulkIn` and `BulkOut` alternately up
    /// to `conns_per_peer` each (`ksocknal_connect`).
    #[must_use]
    pub fn next_conn_type(&self) -> Option<ConnType> {
        let ctrl = self.count(ConnType::Control);
        let bulk_in = self.count(ConnType::BulkIn);
        let bulk_out = self.count(ConnType::BulkOut);
        let want_in = bulk_in < self.max_conns;
        let want_out = bulk_out < self.max_conns;
        if ctrl == 0 {
            Some(ConnType::Control)
        } else if want_in && (bulk_in <= bulk_out || !want_out) {
            Some(ConnType::BulkIn)
        } else if want_out {
            Some(ConnType::BulkOut)
        } else {
            None
        }
    }

    /// Notes the peer's incarnation from a HELLO. A new one means the peer
    /// restarted: every connection is forgotten and returned for closing,
    /// and the incarnation is reset so the next connection starts afresh.
    ///
    /// # Errors
    /// The connections to close when the incarnation changed.
    pub fn observe_incarnation(&mut self, incarnation: u64) -> Result<(), Vec<ConnId>> {
        match self.incarnation {
            None => {
                self.incarnation = Some(incarnation);
                Ok(())
            }
            Some(i) if i == incarnation => Ok(()),
            Some(old) => {
                tracing::info!(target: TARGET, peer = %self.peer, old, new = incarnation,
                    "socklnd peer rebooted; closing its connections");
                self.incarnation = None;
                let close = std::mem::take(&mut self.conns).into_keys().collect();
                Err(close)
            }
        }
    }

    /// Decides whether a handshaken connection is kept, in Lustre's order:
    /// connection race (passive side only), peer restart, duplicate.
    pub fn admit(&mut self, local_nid: Nid, c: Candidate) -> Admission {
        if !c.active && self.peer < local_nid && self.connecting {
            tracing::debug!(target: TARGET, peer = %self.peer, "connection race resolution");
            return Admission::Refused {
                reason: Refusal::LostRace,
                close: Vec::new(),
            };
        }
        if let Err(close) = self.observe_incarnation(c.incarnation) {
            return Admission::Refused {
                reason: Refusal::PeerRebooted,
                close,
            };
        }
        if !c.loopback && self.count(c.conn_type) >= self.max_conns {
            tracing::debug!(target: TARGET, peer = %self.peer, conn_type = %c.conn_type,
                "duplicate connection refused");
            return Admission::Refused {
                reason: Refusal::Duplicate,
                close: Vec::new(),
            };
        }
        self.conns.insert(c.id, c.conn_type);
        Admission::Accepted
    }

    /// Forgets a closed connection; returns its type if it was known.
    ///
    /// When the last connection goes, the peer's incarnation is forgotten
    /// too (Lustre clears `ksnp_proto` then, and the next connection sets
    /// protocol and incarnation afresh): a peer that exited cleanly and
    /// started again is admitted at its first connection, not refused as
    /// rebooted and made to retry a reconnection interval later.
    pub fn remove(&mut self, id: ConnId) -> Option<ConnType> {
        let t = self.conns.remove(&id);
        if t.is_some() && self.conns.is_empty() {
            self.incarnation = None;
        }
        t
    }

    /// The connection for `tx` (`ksocknal_find_conn_locked`): the least
    /// loaded among those it fits best ([`Match::Yes`]), else among those it
    /// may use, ties going to the one posted to longest ago. `None` when no
    /// connection may carry it (queue it until one is made).
    pub fn choose(
        &self,
        tx: TxKind,
        min_bulk: u32,
        load: impl Fn(ConnId) -> ConnLoad,
    ) -> Option<ConnId> {
        let mut best: Option<(Match, u64, Time, ConnId)> = None;
        for (id, t) in self.conns() {
            let m = tx.fit(t, min_bulk);
            if m == Match::No {
                continue;
            }
            let l = load(id);
            let better = match best {
                None => true,
                Some((bm, bq, bt, _)) => {
                    m > bm
                        || (m == bm
                            && (l.queued_bytes < bq || (l.queued_bytes == bq && l.last_post < bt)))
                }
            };
            if better {
                best = Some((m, l.queued_bytes, l.last_post, id));
            }
        }
        best.map(|(.., id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LNET_PID_LUSTRE;
    use crate::socklnd::CONN_NONE;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    fn local(s: &str) -> LocalEnd {
        LocalEnd {
            nid: nid(s),
            pid: LNET_PID_LUSTRE,
            incarnation: 1000,
        }
    }

    #[test]
    fn active_handshake() {
        let a = local("10.0.0.1@tcp");
        let b = LocalEnd {
            incarnation: 2000,
            ..local("10.0.0.2@tcp")
        };
        let hello = a.active_hello(b.nid, ConnType::BulkOut);
        assert_eq!(hello.dst_pid, 0);
        assert_eq!(hello.dst_incarnation, 0);
        // b accepts: its side of a BULK_OUT is a BULK_IN.
        let seen = check_passive_hello(&b, &hello, Ipv4Addr::new(10, 0, 0, 1), 1023).unwrap();
        assert_eq!(seen.peer, ProcessId::lustre(a.nid));
        assert_eq!(seen.conn_type, ConnType::BulkIn);
        assert_eq!(seen.incarnation, 1000);
        let reply = b.passive_reply(&hello, Some(seen.conn_type));
        assert_eq!(reply.dst_nid, a.nid);
        assert_eq!(
            check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::BulkOut, &reply),
            Ok(ActiveReply::Accepted { incarnation: 2000 })
        );
        // A refusal asks for a retry.
        let none = b.passive_reply(&hello, None);
        assert_eq!(none.encode()[48..52], CONN_NONE.to_le_bytes());
        assert_eq!(
            check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::BulkOut, &none),
            Ok(ActiveReply::Retry { incarnation: 2000 })
        );
        // The inverted type check: BULK_OUT answered by BULK_OUT is wrong.
        let wrong = b.passive_reply(&hello, Some(ConnType::BulkOut));
        assert_eq!(
            check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::BulkOut, &wrong),
            Err(HandshakeError::MismatchedType {
                sent: ConnType::BulkOut,
                answered: ConnType::BulkOut
            })
        );
        // Someone else answered.
        let c = local("10.0.0.3@tcp");
        let other = c.passive_reply(&hello, Some(ConnType::BulkIn));
        assert!(matches!(
            check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::BulkOut, &other),
            Err(HandshakeError::WrongPeer { .. })
        ));
        let mut anon = reply;
        anon.src_nid = Nid::ANY;
        assert_eq!(
            check_active_reply(&a, ProcessId::lustre(b.nid), ConnType::BulkOut, &anon),
            Err(HandshakeError::SrcNidAny)
        );
        let mut misdirected = reply;
        misdirected.dst_nid = c.nid;
        assert!(matches!(
            check_active_reply(
                &a,
                ProcessId::lustre(b.nid),
                ConnType::BulkOut,
                &misdirected
            ),
            Err(HandshakeError::WrongDestination { .. })
        ));
    }

    #[test]
    fn passive_checks() {
        let a = local("10.0.0.1@tcp");
        let b = local("10.0.0.2@tcp");
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        // A HELLO for another NID.
        let hello = a.active_hello(nid("10.0.0.3@tcp"), ConnType::Control);
        assert_eq!(
            check_passive_hello(&b, &hello, ip, 1000),
            Err(HandshakeError::WrongDestination {
                expected: b.nid,
                got: nid("10.0.0.3@tcp")
            })
        );
        let mut none = a.active_hello(b.nid, ConnType::Control);
        none.conn_type = None;
        assert_eq!(
            check_passive_hello(&b, &none, ip, 1000),
            Err(HandshakeError::NoConnType)
        );
        let mut anon = a.active_hello(b.nid, ConnType::Control);
        anon.src_nid = Nid::ANY;
        assert_eq!(
            check_passive_hello(&b, &anon, ip, 1000),
            Err(HandshakeError::SrcNidAny)
        );
        // From an unprivileged port: a userspace peer named by its address.
        let seen =
            check_passive_hello(&b, &a.active_hello(b.nid, ConnType::Control), ip, 40000).unwrap();
        assert_eq!(seen.peer.nid, nid("10.0.0.1@tcp"));
        assert_eq!(seen.peer.pid, 40000 | LNET_PID_USERFLAG);
        assert_eq!(seen.peer.to_string(), "U40000-10.0.0.1@tcp");
        // The version answer.
        let v = b.version_reply();
        assert_eq!((v.dst_nid, v.conn_type), (b.nid, None));
    }

    fn cand(id: u64, t: ConnType, inc: u64, active: bool) -> Candidate {
        Candidate {
            id: ConnId(id),
            conn_type: t,
            incarnation: inc,
            active,
            loopback: false,
        }
    }

    #[test]
    fn connection_race_goes_to_the_higher_nid() {
        let low = nid("10.0.0.1@tcp");
        let high = nid("10.0.0.2@tcp");
        // On the high node: the low peer connects while we connect to it.
        let mut p = PeerConns::new(low, 1);
        p.set_connecting(true);
        assert_eq!(
            p.admit(high, cand(1, ConnType::Control, 5, false)),
            Admission::Refused {
                reason: Refusal::LostRace,
                close: vec![]
            }
        );
        // Our own (active) connection to it is kept.
        assert_eq!(
            p.admit(high, cand(2, ConnType::Control, 5, true)),
            Admission::Accepted
        );
        // On the low node: the high peer's connection wins even while we
        // are connecting.
        let mut q = PeerConns::new(high, 1);
        q.set_connecting(true);
        assert_eq!(
            q.admit(low, cand(1, ConnType::Control, 7, false)),
            Admission::Accepted
        );
        // Not connecting: no race.
        let mut r = PeerConns::new(low, 1);
        assert_eq!(
            r.admit(high, cand(1, ConnType::Control, 5, false)),
            Admission::Accepted
        );
        // While the peer is connecting to us we do not start.
        r.begin_accept();
        assert!(!r.may_connect());
        r.end_accept();
        assert!(r.may_connect());
    }

    #[test]
    fn a_new_incarnation_closes_the_old_connections() {
        let me = nid("10.0.0.2@tcp");
        let mut p = PeerConns::new(nid("10.0.0.1@tcp"), 2);
        assert_eq!(
            p.admit(me, cand(1, ConnType::Control, 5, true)),
            Admission::Accepted
        );
        assert_eq!(
            p.admit(me, cand(2, ConnType::BulkIn, 5, true)),
            Admission::Accepted
        );
        assert_eq!(p.incarnation(), Some(5));
        assert_eq!(
            p.admit(me, cand(3, ConnType::BulkOut, 6, true)),
            Admission::Refused {
                reason: Refusal::PeerRebooted,
                close: vec![ConnId(1), ConnId(2)]
            }
        );
        assert!(p.is_empty());
        assert_eq!(p.incarnation(), None);
        // The next attempt starts afresh.
        assert_eq!(
            p.admit(me, cand(4, ConnType::Control, 6, true)),
            Admission::Accepted
        );
        assert_eq!(p.incarnation(), Some(6));
        assert_eq!(p.observe_incarnation(6), Ok(()));
        assert_eq!(p.observe_incarnation(7), Err(vec![ConnId(4)]));
    }

    #[test]
    fn a_peer_whose_connections_all_closed_is_admitted_with_a_new_incarnation() {
        let me = nid("10.0.0.2@tcp");
        let mut p = PeerConns::new(nid("10.0.0.1@tcp"), 1);
        for (id, t) in [(1, ConnType::Control), (2, ConnType::BulkIn)] {
            assert_eq!(p.admit(me, cand(id, t, 5, false)), Admission::Accepted);
        }
        // One connection left: a new incarnation is a reboot.
        assert_eq!(p.remove(ConnId(1)), Some(ConnType::Control));
        assert_eq!(p.incarnation(), Some(5));
        // The last one closed (the peer exited): its next start is
        // admitted at once, as Lustre does once `ksnp_proto` is cleared.
        assert_eq!(p.remove(ConnId(2)), Some(ConnType::BulkIn));
        assert_eq!(p.incarnation(), None);
        assert_eq!(p.remove(ConnId(2)), None);
        assert_eq!(
            p.admit(me, cand(3, ConnType::Control, 6, false)),
            Admission::Accepted
        );
        assert_eq!(p.incarnation(), Some(6));
        assert_eq!(
            p.admit(me, cand(4, ConnType::BulkOut, 7, false)),
            Admission::Refused {
                reason: Refusal::PeerRebooted,
                close: vec![ConnId(3)]
            }
        );
    }

    #[test]
    fn duplicates_beyond_conns_per_peer_are_refused() {
        let me = nid("10.0.0.2@tcp");
        let mut p = PeerConns::new(nid("10.0.0.1@tcp"), 2);
        assert_eq!(
            p.admit(me, cand(1, ConnType::BulkIn, 5, false)),
            Admission::Accepted
        );
        assert_eq!(
            p.admit(me, cand(2, ConnType::BulkIn, 5, false)),
            Admission::Accepted
        );
        assert_eq!(
            p.admit(me, cand(3, ConnType::BulkIn, 5, false)),
            Admission::Refused {
                reason: Refusal::Duplicate,
                close: vec![]
            }
        );
        assert!(Refusal::Duplicate.reply_none());
        // Loopback connections are never duplicates.
        let c = Candidate {
            loopback: true,
            ..cand(4, ConnType::BulkIn, 5, false)
        };
        assert_eq!(p.admit(me, c), Admission::Accepted);
        assert_eq!(p.count(ConnType::BulkIn), 3);
        assert_eq!(p.remove(ConnId(4)), Some(ConnType::BulkIn));
        assert_eq!(p.remove(ConnId(4)), None);
        // conns_per_peer 0 counts as 1.
        let mut one = PeerConns::new(nid("10.0.0.1@tcp"), 0);
        assert_eq!(
            one.admit(me, cand(1, ConnType::Control, 5, true)),
            Admission::Accepted
        );
        assert!(matches!(
            one.admit(me, cand(2, ConnType::Control, 5, true)),
            Admission::Refused {
                reason: Refusal::Duplicate,
                ..
            }
        ));
    }

    #[test]
    fn next_conn_type_builds_the_typed_set() {
        let me = nid("10.0.0.2@tcp");
        let mut p = PeerConns::new(nid("10.0.0.1@tcp"), 2);
        let mut order = Vec::new();
        let mut id = 0;
        while let Some(t) = p.next_conn_type() {
            order.push(t);
            id += 1;
            assert_eq!(p.admit(me, cand(id, t, 5, true)), Admission::Accepted);
        }
        use ConnType::{BulkIn, BulkOut, Control};
        assert_eq!(order, vec![Control, BulkIn, BulkOut, BulkIn, BulkOut]);
    }

    #[test]
    fn match_table_v3() {
        use ConnType::{Any, BulkIn, BulkOut, Control};
        let small = TxKind::Lnet { payload_len: 100 };
        // 96 + 928 = 1024 = min_bulk: bulk.
        let edge = TxKind::Lnet { payload_len: 928 };
        let below = TxKind::Lnet { payload_len: 927 };
        let keepalive = TxKind::Noop { nonblk: true };
        let noop = TxKind::Noop { nonblk: false };
        assert_eq!(edge.wire_len(), 1024);
        let rows = [
            (small, [Match::No, Match::Yes, Match::No, Match::May]),
            (below, [Match::No, Match::Yes, Match::No, Match::May]),
            (edge, [Match::No, Match::May, Match::No, Match::Yes]),
            (keepalive, [Match::No, Match::No, Match::Yes, Match::No]),
            (noop, [Match::No, Match::Yes, Match::May, Match::May]),
        ];
        for (tx, expected) in rows {
            let got = [Any, Control, BulkIn, BulkOut].map(|t| tx.fit(t, 1024));
            assert_eq!(got, expected, "{tx:?}");
        }
    }

    #[test]
    fn choose_prefers_typed_then_least_loaded_then_oldest() {
        let me = nid("10.0.0.2@tcp");
        let mut p = PeerConns::new(nid("10.0.0.1@tcp"), 2);
        for (id, t) in [
            (1, ConnType::Control),
            (2, ConnType::BulkIn),
            (3, ConnType::BulkOut),
            (4, ConnType::BulkOut),
        ] {
            assert_eq!(p.admit(me, cand(id, t, 5, true)), Admission::Accepted);
        }
        let idle = |_| ConnLoad::default();
        assert_eq!(
            p.choose(TxKind::Lnet { payload_len: 10 }, 1024, idle),
            Some(ConnId(1))
        );
        assert_eq!(
            p.choose(TxKind::Noop { nonblk: true }, 1024, idle),
            Some(ConnId(2))
        );
        let load = |id: ConnId| ConnLoad {
            queued_bytes: if id == ConnId(3) { 5000 } else { 0 },
            last_post: Time::ZERO,
        };
        assert_eq!(
            p.choose(TxKind::Lnet { payload_len: 4096 }, 1024, load),
            Some(ConnId(4))
        );
        let rr = |id: ConnId| ConnLoad {
            queued_bytes: 0,
            last_post: Time::from_secs(if id == ConnId(3) { 9 } else { 10 }),
        };
        assert_eq!(
            p.choose(TxKind::Lnet { payload_len: 4096 }, 1024, rr),
            Some(ConnId(3))
        );
        // Without a BULK_OUT a large message falls back to CONTROL.
        p.remove(ConnId(3));
        p.remove(ConnId(4));
        assert_eq!(
            p.choose(
                TxKind::Lnet {
                    payload_len: 1 << 20
                },
                1024,
                idle
            ),
            Some(ConnId(1))
        );
        // Nothing carries an LNet message on BULK_IN alone.
        p.remove(ConnId(1));
        assert_eq!(p.choose(TxKind::Lnet { payload_len: 1 }, 1024, idle), None);
    }
}
