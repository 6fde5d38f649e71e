//! Fuzzing entry points (feature `fuzzing`; also built for tests): the
//! node's two-step receive path fed arbitrary bytes, as a driver would
//! feed what a hostile peer sends. Not for applications.

use std::time::Duration;

use crate::ids::{Nid, ProcessId};
use crate::matching::{InsertPos, MdOptions, MdSpec, MeSpec, MemKey, MemRef, Threshold, Unlink};
use crate::node::{NiConfig, Node, NodeConfig, PayloadOutcome, RxAction};
use crate::time::Time;
use crate::wire::HEADER_LEN;

/// A router node with one NI on each of two nets, an ME/MD on portals 1-3
/// and a bound MD; then, from `data`: a sequence of 72-byte headers said
/// to arrive from a peer on either net, each followed by one control byte
/// that picks what happens to its payload (read, failed, or the
/// connection gone); parked messages are resumed, transmits completed
/// (some failed), timers run. Checks that nothing panics, that every
/// payload action names memory the driver gave the node, and that every
/// MD operation ends (the node settles with nothing in flight).
pub fn receive_path(data: &[u8]) {
    let ni0: Nid = "10.0.0.1@tcp".parse().expect("nid");
    let ni1: Nid = "10.1.0.1@tcp1".parse().expect("nid");
    let peers: [Nid; 2] = [
        "10.0.0.2@tcp".parse().expect("nid"),
        "10.1.0.2@tcp1".parse().expect("nid"),
    ];
    let mut cfg = NodeConfig::new(vec![NiConfig::new(ni0), NiConfig::new(ni1)]);
    cfg.routing = true;
    cfg.discovery = false;
    let Ok(mut node) = Node::new(cfg) else {
        return;
    };
    let mut now = Time::ZERO;
    let mem_len: u32 = 4096;
    for portal in 1..=3u32 {
        let Ok(me) = node.me_attach(MeSpec {
            portal,
            match_id: ProcessId::ANY,
            match_bits: u64::from(portal),
            ignore_bits: if portal == 3 { u64::MAX } else { 0 },
            unlink: Unlink::Retain,
            pos: InsertPos::After,
        }) else {
            return;
        };
        let spec = MdSpec::new(
            MemRef::new(MemKey(u64::from(portal)), 0, mem_len),
            MdOptions::OP_PUT | MdOptions::OP_GET | MdOptions::TRUNCATE,
        )
        .threshold(Threshold::Infinite);
        let _ = node.md_attach(now, me, spec);
    }
    let mut rest = data;
    while rest.len() > HEADER_LEN {
        let (h, tail) = rest.split_at(HEADER_LEN);
        let ctl = tail[0];
        rest = &tail[1..];
        let hdr: &[u8; HEADER_LEN] = h.try_into().expect("72 bytes");
        let side = usize::from(ctl & 1);
        let ni = if side == 0 { ni0 } else { ni1 };
        now += Duration::from_micros(u64::from(ctl >> 1));
        let Ok(action) = node.handle_header(now, ni, peers[side], hdr) else {
            continue;
        };
        if std::env::var_os("FUZZ_TRACE").is_some() {
            eprintln!(
                "hdr {:?} ctl {ctl:#x} -> {action:?}",
                crate::wire::Header::decode(hdr)
            );
        }
        settle(&mut node, now, action, ctl, mem_len);
        while let Some((_, a)) = node.poll_rx_action() {
            if std::env::var_os("FUZZ_TRACE").is_some() {
                eprintln!("  resumed -> {a:?}");
            }
            settle(&mut node, now, a, ctl, mem_len);
        }
        drain(&mut node, now, ctl);
    }
    // Every timer and every deferred action, until nothing is left.
    for _ in 0..64 {
        now += Duration::from_secs(60);
        node.handle_timeout(now);
        while let Some((_, a)) = node.poll_rx_action() {
            settle(&mut node, now, a, 0, mem_len);
        }
        drain(&mut node, now, 0);
    }
    while node.poll_rx_release().is_some() {}
    assert_eq!(node.rx_pending(), 0, "a received message never finished");
}

/// Does what a driver does with the payload `action` describes.
fn settle(node: &mut Node, now: Time, action: RxAction, ctl: u8, mem_len: u32) {
    let failed = ctl & 0x0c == 0x0c;
    let outcome = |n: u32| {
        if failed {
            PayloadOutcome::Failed
        } else {
            PayloadOutcome::Inline(vec![0x5a; n as usize])
        }
    };
    match action {
        RxAction::None | RxAction::Discard { .. } | RxAction::Wait { .. } => {}
        RxAction::Deliver { rx, mem, .. } => {
            assert!(
                (1..=3).contains(&mem.key.0)
                    && mem.offset + u64::from(mem.len) <= u64::from(mem_len),
                "payload placed outside the memory given: {mem:?}"
            );
            let o = if failed {
                PayloadOutcome::Failed
            } else {
                PayloadOutcome::Received
            };
            let _ = node.handle_payload(now, rx, o);
        }
        RxAction::Forward { rx, .. } => {
            let o = if failed {
                PayloadOutcome::Failed
            } else {
                PayloadOutcome::Received
            };
            let _ = node.handle_payload(now, rx, o);
        }
        RxAction::Inline { rx, len, .. } => {
            let _ = node.handle_payload(now, rx, outcome(len));
        }
    }
}

/// Completes every transmit (failing some) and takes every event.
fn drain(node: &mut Node, now: Time, ctl: u8) {
    for _ in 0..1024 {
        let Some(t) = node.poll_transmit() else {
            break;
        };
        let r = if ctl & 0x30 == 0x30 {
            Err(crate::fault::HealthError::RemoteDropped)
        } else {
            Ok(())
        };
        let _ = node.handle_tx_done(now, t.id, r);
    }
    while node.poll_event().is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LNET_PID_LUSTRE;
    use crate::rng::Rng;
    use crate::wire::{Body, Header, WireHandle};

    #[test]
    fn random_streams() {
        let mut r = Rng::new(0xf022);
        for _ in 0..300 {
            let n = r.below(2000) as usize;
            let data: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
            receive_path(&data);
        }
    }

    #[test]
    fn well_formed_headers_with_random_fields() {
        // Mostly valid headers (so that matching, forwarding and replies
        // run), with random types, portals, lengths and destinations.
        let mut r = Rng::new(
            std::env::var("FUZZ_SEED")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(7),
        );
        let dests = [
            "10.0.0.1@tcp",
            "10.1.0.1@tcp1",
            "10.1.0.2@tcp1",
            "10.9.9.9@tcp9",
        ];
        let src: Nid = "10.0.0.2@tcp".parse().unwrap();
        let rounds: usize = std::env::var("FUZZ_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        for _ in 0..rounds {
            let mut data = Vec::new();
            for _ in 0..(1 + r.below(12)) {
                let dest: Nid = dests[r.below(dests.len() as u64) as usize].parse().unwrap();
                let portal = r.below(5) as u32;
                let bits = r.below(4);
                let h = WireHandle {
                    interface_cookie: r.next_u64(),
                    object_cookie: r.next_u64(),
                };
                let body = match r.below(4) {
                    0 => Body::Put {
                        ack_wmd: if r.chance(1, 2) { WireHandle::NONE } else { h },
                        match_bits: bits,
                        hdr_data: 0,
                        ptl_index: portal,
                        offset: 0,
                    },
                    1 => Body::Get {
                        return_wmd: h,
                        match_bits: bits,
                        ptl_index: portal,
                        src_offset: 0,
                        sink_length: r.below(6000) as u32,
                    },
                    2 => Body::Ack {
                        dst_wmd: h,
                        match_bits: bits,
                        mlength: r.below(6000) as u32,
                    },
                    _ => Body::Reply { dst_wmd: h },
                };
                let payload_length = match body {
                    Body::Put { .. } | Body::Reply { .. } => r.below(6000) as u32,
                    _ => 0,
                };
                let hdr = Header {
                    dest_nid: dest,
                    src_nid: src,
                    dest_pid: LNET_PID_LUSTRE,
                    src_pid: LNET_PID_LUSTRE,
                    payload_length,
                    body,
                };
                data.extend_from_slice(&hdr.encode());
                data.push(r.next_u64() as u8);
            }
            receive_path(&data);
        }
    }
}
