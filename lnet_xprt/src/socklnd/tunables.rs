//! The socket LND's module parameters, with Lustre's names, units and
//! defaults (`lnet/klnds/socklnd/socklnd_modparams.c`, `socklnd.h`,
//! `lib-lnet.h`).

use std::time::Duration;

use super::KSOCK_PROTO_V3;

/// A tunable out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TunablesError {
    /// A value outside what the protocol or Lustre accepts.
    #[error("socklnd tunable {name} = {value}: {why}")]
    Invalid {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: i64,
        /// What is wrong.
        why: &'static str,
    },
}

/// The socklnd module parameters. Field names are Lustre's; times are in
/// the units their names (or Lustre's descriptions) give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// `sock_timeout`, seconds: a connection with no progress for this long
    /// is dead (0 = use LNet's `lnd_timeout`). Default 50.
    pub sock_timeout: u32,
    /// `credits`: concurrent sends on the NI. Default 256.
    pub credits: u32,
    /// `peer_credits`: concurrent sends to one peer. Default 8.
    pub peer_credits: u32,
    /// `peer_buffer_credits`: per-peer router buffer credits. Default 0.
    pub peer_buffer_credits: u32,
    /// `peer_timeout`, seconds without news before a peer is dead (≤ 0
    /// disables). Default 180.
    pub peer_timeout: i32,
    /// `nscheds`: scheduler threads per CPU partition (0 = estimated from
    /// the CPUs). Default 0.
    pub nscheds: u32,
    /// `nconnds`: connection threads at start. Default 4.
    pub nconnds: u32,
    /// `nconnds_max`: most connection threads. Default 64.
    pub nconnds_max: u32,
    /// `min_reconnectms`: first reconnection interval. Default 1000.
    pub min_reconnectms: u32,
    /// `max_reconnectms`: largest reconnection interval. Default 60000.
    pub max_reconnectms: u32,
    /// `eager_ack`: ask TCP to acknowledge at once. Default off.
    pub eager_ack: bool,
    /// `typed_conns`: separate sockets for bulk. Default on; required for
    /// protocol V3 (an untyped V3 connection carries nothing).
    pub typed_conns: bool,
    /// `min_bulk`: bytes on the wire (headers included) from which a
    /// message prefers a bulk connection. Default 1024.
    pub min_bulk: u32,
    /// `tx_buffer_size`: socket send buffer (0 = system default).
    pub tx_buffer_size: u32,
    /// `rx_buffer_size`: socket receive buffer (0 = system default).
    pub rx_buffer_size: u32,
    /// `nagle`: leave Nagle's algorithm on. Default off (`TCP_NODELAY`).
    pub nagle: bool,
    /// `round_robin`: among equally loaded connections take the one used
    /// longest ago. Default on.
    pub round_robin: bool,
    /// `keepalive`, seconds of silence before a keepalive NOOP (0 = none).
    /// Default 30.
    pub keepalive: u32,
    /// `keepalive_idle`, seconds before TCP keepalive probes. Default 30.
    pub keepalive_idle: u32,
    /// `keepalive_count`: missed TCP probes meaning dead. Default 5.
    pub keepalive_count: u32,
    /// `keepalive_intvl`, seconds between TCP probes. Default 5.
    pub keepalive_intvl: u32,
    /// `enable_csum`: checksum what we send. Default off.
    pub enable_csum: bool,
    /// `inject_csum_error`: spoil the next checksum we send (tests).
    pub inject_csum_error: bool,
    /// `nonblk_zcack`: send zero-copy ACKs on the non-blocking (`BulkIn`)
    /// connection. Default on.
    pub nonblk_zcack: bool,
    /// `zc_min_payload`: smallest payload Lustre sends zero-copy (and asks
    /// an ACK for); at least 2048. Default 16384.
    pub zc_min_payload: u32,
    /// `zc_recv`: zero-copy receive (Chelsio). Default off.
    pub zc_recv: bool,
    /// `zc_recv_min_nfrags`. Default 16.
    pub zc_recv_min_nfrags: u32,
    /// `conns_per_peer`: bulk connections of each direction per peer
    /// (0 = from the link speed, [`Tunables::conns_per_peer_for_speed`]).
    /// Default 0.
    pub conns_per_peer: u32,
    /// `tos`: IP type of service (−1 = leave alone). Default −1.
    pub tos: i32,
    /// `protocol`: the version spoken. Always 3 here.
    pub protocol: u32,
}

impl Default for Tunables {
    fn default() -> Self {
        Self {
            sock_timeout: 50,
            credits: 256,
            peer_credits: 8,
            peer_buffer_credits: 0,
            peer_timeout: 180,
            nscheds: 0,
            nconnds: 4,
            nconnds_max: 64,
            min_reconnectms: 1000,
            max_reconnectms: 60_000,
            eager_ack: false,
            typed_conns: true,
            min_bulk: 1 << 10,
            tx_buffer_size: 0,
            rx_buffer_size: 0,
            nagle: false,
            round_robin: true,
            keepalive: 30,
            keepalive_idle: 30,
            keepalive_count: 5,
            keepalive_intvl: 5,
            enable_csum: false,
            inject_csum_error: false,
            nonblk_zcack: true,
            zc_min_payload: 16 << 10,
            zc_recv: false,
            zc_recv_min_nfrags: 16,
            conns_per_peer: 0,
            tos: -1,
            protocol: KSOCK_PROTO_V3,
        }
    }
}

/// `SOCKNAL_CONN_COUNT_MAX_BITS`: `conns_per_peer` is capped at 255.
pub const MAX_CONNS_PER_PEER: u32 = (1 << 8) - 1;

impl Tunables {
    /// Checks the values the protocol depends on.
    ///
    /// # Errors
    /// [`TunablesError::Invalid`] naming the first bad parameter.
    pub fn validate(&self) -> Result<(), TunablesError> {
        let bad = |name, value: i64, why| Err(TunablesError::Invalid { name, value, why });
        if self.protocol != KSOCK_PROTO_V3 {
            return bad(
                "protocol",
                self.protocol.into(),
                "only protocol 3 is spoken",
            );
        }
        if !self.typed_conns {
            return bad("typed_conns", 0, "protocol 3 needs typed connections");
        }
        if self.min_reconnectms == 0 {
            return bad("min_reconnectms", 0, "must be positive");
        }
        if self.max_reconnectms < self.min_reconnectms {
            return bad(
                "max_reconnectms",
                self.max_reconnectms.into(),
                "must be at least min_reconnectms",
            );
        }
        if self.conns_per_peer > MAX_CONNS_PER_PEER {
            return bad("conns_per_peer", self.conns_per_peer.into(), "at most 255");
        }
        if !(-1..=0xff).contains(&self.tos) {
            return bad("tos", self.tos.into(), "must be -1..=255");
        }
        Ok(())
    }

    /// The dead-socket timeout: `sock_timeout`, or LNet's `lnd_timeout`
    /// when it is 0 (`ksocknal_timeout`).
    #[must_use]
    pub fn timeout(&self, lnd_timeout: Duration) -> Duration {
        if self.sock_timeout == 0 {
            lnd_timeout
        } else {
            Duration::from_secs(self.sock_timeout.into())
        }
    }

    /// `peer_credits` as Lustre applies it: never more than `credits`
    /// (`ksocknal_tunables_setup`).
    #[must_use]
    pub fn effective_peer_credits(&self) -> u32 {
        self.peer_credits.min(self.credits)
    }

    /// `min_reconnectms` as a duration.
    #[must_use]
    pub fn min_reconnect(&self) -> Duration {
        Duration::from_millis(self.min_reconnectms.into())
    }

    /// `max_reconnectms` as a duration.
    #[must_use]
    pub fn max_reconnect(&self) -> Duration {
        Duration::from_millis(self.max_reconnectms.into())
    }

    /// `keepalive` as a duration (zero = off).
    #[must_use]
    pub fn keepalive_after(&self) -> Duration {
        Duration::from_secs(self.keepalive.into())
    }

    /// `zc_min_payload` as Lustre uses it: never below 2048.
    #[must_use]
    pub fn effective_zc_min_payload(&self) -> u32 {
        self.zc_min_payload.max(2 << 10)
    }

    /// The `conns_per_peer` in force for an interface of `speed_mbps`
    /// (`None` when unknown): the configured value, or when it is 0
    /// `⌊log2(Gbit/s)⌋ / 2 + 1` with at least 1 Gbit/s
    /// (`ksocklnd_speed2cpp`): 1 for 1G, 2 for 10G, 3 for 25G, 4 for 100G;
    /// 1 when the speed is unknown.
    #[must_use]
    pub fn conns_per_peer_for_speed(&self, speed_mbps: Option<u32>) -> u32 {
        if self.conns_per_peer != 0 {
            return self.conns_per_peer;
        }
        match speed_mbps {
            Some(mbps) if mbps > 0 => {
                let gbps = (mbps.max(1000) / 1000).max(1);
                gbps.ilog2() / 2 + 1
            }
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_lustres() {
        let t = Tunables::default();
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(t.sock_timeout, 50);
        assert_eq!((t.credits, t.peer_credits, t.peer_timeout), (256, 8, 180));
        assert_eq!((t.nconnds, t.nconnds_max, t.nscheds), (4, 64, 0));
        assert_eq!((t.min_reconnectms, t.max_reconnectms), (1000, 60_000));
        assert_eq!(t.min_bulk, 1024);
        assert_eq!((t.tx_buffer_size, t.rx_buffer_size), (0, 0));
        assert!(!t.nagle && t.typed_conns && t.round_robin && t.nonblk_zcack);
        assert_eq!(
            (
                t.keepalive,
                t.keepalive_idle,
                t.keepalive_count,
                t.keepalive_intvl
            ),
            (30, 30, 5, 5)
        );
        assert!(!t.enable_csum && !t.inject_csum_error);
        assert_eq!((t.zc_min_payload, t.conns_per_peer, t.tos), (16384, 0, -1));
        assert_eq!(t.timeout(Duration::from_secs(49)), Duration::from_secs(50));
        assert_eq!(t.min_reconnect(), Duration::from_secs(1));
        assert_eq!(t.max_reconnect(), Duration::from_secs(60));
        assert_eq!(t.keepalive_after(), Duration::from_secs(30));
        let zero = Tunables {
            sock_timeout: 0,
            zc_min_payload: 100,
            ..Tunables::default()
        };
        assert_eq!(
            zero.timeout(Duration::from_secs(49)),
            Duration::from_secs(49)
        );
        assert_eq!(zero.effective_zc_min_payload(), 2048);
        let greedy = Tunables {
            peer_credits: 300,
            ..Tunables::default()
        };
        assert_eq!(greedy.validate(), Ok(()));
        assert_eq!(greedy.effective_peer_credits(), 256);
    }

    #[test]
    fn conns_per_peer_from_link_speed() {
        let t = Tunables::default();
        assert_eq!(t.conns_per_peer_for_speed(None), 1);
        assert_eq!(t.conns_per_peer_for_speed(Some(100)), 1);
        assert_eq!(t.conns_per_peer_for_speed(Some(1000)), 1);
        assert_eq!(t.conns_per_peer_for_speed(Some(10_000)), 2);
        assert_eq!(t.conns_per_peer_for_speed(Some(25_000)), 3);
        assert_eq!(t.conns_per_peer_for_speed(Some(100_000)), 4);
        assert_eq!(t.conns_per_peer_for_speed(Some(400_000)), 5);
        let fixed = Tunables {
            conns_per_peer: 3,
            ..Tunables::default()
        };
        assert_eq!(fixed.conns_per_peer_for_speed(Some(100_000)), 3);
    }

    #[test]
    fn validation() {
        let bad = [
            Tunables {
                protocol: 2,
                ..Tunables::default()
            },
            Tunables {
                typed_conns: false,
                ..Tunables::default()
            },
            Tunables {
                min_reconnectms: 0,
                ..Tunables::default()
            },
            Tunables {
                max_reconnectms: 10,
                ..Tunables::default()
            },
            Tunables {
                conns_per_peer: 256,
                ..Tunables::default()
            },
            Tunables {
                tos: 256,
                ..Tunables::default()
            },
        ];
        for t in bad {
            let e = t.validate().unwrap_err();
            assert!(e.to_string().starts_with("socklnd tunable "), "{e}");
        }
    }
}
