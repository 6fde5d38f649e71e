//! The socklnd two-step frame receiver fed byte streams: raw arbitrary
//! bytes, or frames built by the encoders from the input (keepalives,
//! zero-copy ACKs, LNet messages with or without checksums, some
//! corrupted) with raw bytes mixed in. It must never panic, ask for
//! exactly what it then gets, yield only headers that re-encode to the
//! bytes it was given, and stay closed after an error.
#![no_main]

use colibri_lnet::ids::Nid;
use colibri_lnet::socklnd::frame::{KSOCK_MSG_HDR_LEN, KsockMsgType};
use colibri_lnet::socklnd::{
    Crc32, Endian, Frame, FrameError, FrameReceiver, KsockMsgHeader, LnetFrame, Want,
    payload_checksum,
};
use colibri_lnet::wire::{Body, HEADER_LEN, Header, LNET_MTU, WireHandle};
use libfuzzer_sys::fuzz_target;

fn put(len: u32) -> Header {
    Header {
        dest_nid: Nid::from_u64(0x0002_0000_7f00_0001),
        src_nid: Nid::from_u64(0x0002_0000_7f00_0002),
        dest_pid: 12345,
        src_pid: 12345,
        payload_length: len,
        body: Body::Put {
            ack_wmd: WireHandle::NONE,
            match_bits: 1,
            hdr_data: 2,
            ptl_index: 4,
            offset: 0,
        },
    }
}

/// Builds a stream of frames from the input, 4 bytes per step.
fn build(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in input.chunks(4) {
        let k = c[0];
        let arg = u16::from_le_bytes([c.get(1).copied().unwrap_or(0), c.get(2).copied().unwrap_or(0)]);
        match k % 6 {
            0 => out.extend_from_slice(&KsockMsgHeader::keepalive().encode()),
            1 => out.extend_from_slice(&KsockMsgHeader::zc_ack(u64::from(arg)).encode()),
            2 | 3 => {
                let len = u32::from(arg % 3000);
                let payload: Vec<u8> = (0..len).map(|i| (i as u8) ^ k).collect();
                let mut f = LnetFrame::new(put(len));
                if k % 6 == 3 {
                    f = f.with_checksum(payload_checksum(&payload));
                }
                if k & 0x80 != 0 {
                    f.ksock.zc_cookies[0] = u64::from(arg) + 1;
                }
                let mut bytes = f.encode().to_vec();
                if k & 0x40 != 0 {
                    // Corrupt one header byte.
                    let at = usize::from(arg) % bytes.len();
                    bytes[at] ^= c.get(3).copied().unwrap_or(1) | 1;
                }
                out.extend_from_slice(&bytes);
                out.extend_from_slice(&payload);
            }
            4 => out.extend_from_slice(&c[1..]),
            _ => {
                let mut h = KsockMsgHeader::keepalive();
                h.csum = u32::from(arg);
                out.extend_from_slice(&h.encode());
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let order = if flags & 1 != 0 { Endian::Big } else { Endian::Little };
    let built;
    let stream: &[u8] = if flags & 2 != 0 {
        built = build(rest);
        &built
    } else {
        rest
    };
    let mut rx = FrameReceiver::new(order);
    let mut at = 0;
    let mut steps = 0;
    loop {
        steps += 1;
        assert!(steps < 1_000_000);
        match rx.want() {
            Want::Header(n) => {
                assert!(n == KSOCK_MSG_HDR_LEN || n == HEADER_LEN);
                let Some(bytes) = stream.get(at..at + n) else {
                    break;
                };
                at += n;
                match rx.handle_header(bytes) {
                    Ok(Some(Frame::Noop(noop))) => {
                        assert_eq!(noop.ksock.msg_type, KsockMsgType::Noop);
                        if order == Endian::Little {
                            assert_eq!(&noop.ksock.encode()[..], bytes);
                        }
                        assert_eq!(rx.want(), Want::Header(KSOCK_MSG_HDR_LEN));
                    }
                    Ok(Some(Frame::Lnet(f))) => {
                        assert!(f.header.payload_length <= LNET_MTU);
                        assert_eq!(rx.want(), Want::Payload(f.header.payload_length));
                    }
                    Ok(None) => assert_eq!(rx.want(), Want::Header(HEADER_LEN)),
                    Err(_) => {
                        assert_eq!(rx.want(), Want::Done);
                        assert_eq!(rx.handle_header(bytes), Err(FrameError::Closed));
                        break;
                    }
                }
            }
            Want::Payload(n) => {
                let n = n as usize;
                let Some(payload) = stream.get(at..at + n) else {
                    break;
                };
                at += n;
                // The driver reads the payload elsewhere; it checksums it
                // on odd steps only.
                let csum = (steps % 2 == 1).then(|| {
                    let mut c = Crc32::new();
                    c.update(payload);
                    c.value()
                });
                match rx.payload_received(csum) {
                    Ok(_) => assert_eq!(rx.want(), Want::Header(KSOCK_MSG_HDR_LEN)),
                    Err(e) => {
                        assert!(matches!(e, FrameError::ChecksumMismatch { .. }));
                        assert_eq!(rx.want(), Want::Done);
                        break;
                    }
                }
            }
            Want::Done => unreachable!("handled where the error happens"),
        }
    }
});
