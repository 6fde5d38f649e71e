//! Foreign (scatter-gather) memory as MD memory: PUTs and GETs between
//! segmented buffers over the loopback LND and the socket LND, bytes
//! verified, no user copy; memory that went away fails the operation with
//! its one event.

mod common;

use std::sync::Arc;
use std::time::Duration;

use colibri_lnet_rt::colibri_lnet::ids::ProcessId;
use colibri_lnet_rt::colibri_lnet::matching::{
    EventKind, InsertPos, MdHandle, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use colibri_lnet_rt::colibri_lnet::socklnd::AcceptPolicy;
use colibri_lnet_rt::{ForeignMemory, Lnet, LnetConfig};
use common::*;
use parking_lot::Mutex;

/// Segments behind a mutex; `None` once taken away.
struct Segs(Mutex<Option<Vec<Vec<u8>>>>, usize);

impl Segs {
    fn new(shape: &[usize]) -> Arc<Self> {
        let total = shape.iter().sum();
        Arc::new(Self(
            Mutex::new(Some(shape.iter().map(|&n| vec![0; n]).collect())),
            total,
        ))
    }
    fn fill(&self, data: &[u8]) {
        let mut g = self.0.lock();
        let mut off = 0;
        for s in g.as_mut().unwrap().iter_mut() {
            let n = s.len();
            s.copy_from_slice(&data[off..off + n]);
            off += n;
        }
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().as_ref().unwrap().concat()
    }
}

impl ForeignMemory for Segs {
    fn len(&self) -> usize {
        self.1
    }
    fn read(&self, f: &mut dyn FnMut(&[&[u8]])) -> bool {
        let g = self.0.lock();
        let Some(v) = g.as_ref() else { return false };
        let s: Vec<&[u8]> = v.iter().map(Vec::as_slice).collect();
        f(&s);
        true
    }
    fn write(&self, f: &mut dyn FnMut(&mut [&mut [u8]])) -> bool {
        let mut g = self.0.lock();
        let Some(v) = g.as_mut() else { return false };
        let mut s: Vec<&mut [u8]> = v.iter_mut().map(Vec::as_mut_slice).collect();
        f(&mut s);
        true
    }
}

fn start(nid_s: &str) -> Lnet {
    init_tracing();
    let mut cfg = LnetConfig::new(&[nid(nid_s)]);
    cfg.accept_port = 0;
    cfg.accept = AcceptPolicy::All;
    Lnet::start(cfg).unwrap()
}

fn post_foreign(l: &Lnet, m: &Arc<Segs>, portal: u32, bits: u64, opts: MdOptions) -> MdHandle {
    let key = l.register_foreign(m.clone());
    let me = l
        .me_attach(MeSpec {
            portal,
            match_id: ProcessId::ANY,
            match_bits: bits,
            ignore_bits: 0,
            unlink: Unlink::Unlink,
            pos: InsertPos::After,
        })
        .unwrap();
    let len = u32::try_from(m.len()).unwrap();
    l.md_attach(
        me,
        MdSpec::new(MemRef::new(key, 0, len), opts)
            .threshold(Threshold::Count(1))
            .unlink(Unlink::Unlink),
    )
    .unwrap()
}

fn bind_foreign(l: &Lnet, m: &Arc<Segs>, len: u32) -> MdHandle {
    let key = l.register_foreign(m.clone());
    l.md_bind(
        MdSpec::new(MemRef::new(key, 0, len), MdOptions::empty())
            .threshold(Threshold::Count(2))
            .unlink(Unlink::Unlink),
    )
    .unwrap()
}

fn put_and_get(a: &Lnet, b: &Lnet, target: ProcessId) {
    let len = 300_000;
    let data = pattern(len, 7);
    // PUT from 5 odd segments into 3 others.
    let src = Segs::new(&[1, 0, 4095, 100_000, 195_904]);
    src.fill(&data);
    let dst = Segs::new(&[70_000, 0, 230_000]);
    let t = post_foreign(b, &dst, 21, 5, MdOptions::OP_PUT);
    let md = bind_foreign(a, &src, len as u32);
    a.put(md, true, target, 21, 5, 0, 0).unwrap();
    let evs = until_final(a, md);
    assert!(kinds(&evs, md).contains(&EventKind::Ack), "{evs:?}");
    if !std::ptr::eq(a, b) {
        let evs = until_final(b, t);
        assert!(
            evs.iter()
                .any(|e| e.md == t && e.info.mlength == len as u32)
        );
    }
    assert_eq!(dst.bytes(), data);
    // GET it back into a third shape.
    let back = Segs::new(&[3, 299_997]);
    let md = bind_foreign(a, &back, len as u32);
    let served = post_foreign(b, &dst, 22, 6, MdOptions::OP_GET);
    a.get(md, target, 22, 6, 0).unwrap();
    let evs = until_final(a, md);
    assert!(kinds(&evs, md).contains(&EventKind::Reply), "{evs:?}");
    assert_eq!(back.bytes(), data);
    let _ = served;
    assert_eq!(a.runtime_stats().user_copy_bytes, 0);
}

#[test]
fn segmented_memory_over_loopback() {
    let l = start("127.0.31.1@tcp");
    put_and_get(&l, &l, ProcessId::lustre(nid("127.0.31.1@tcp")));
    l.shutdown();
}

#[test]
fn segmented_memory_over_tcp() {
    let (na, nb) = (nid("127.0.31.2@tcp"), nid("127.0.31.3@tcp"));
    let a = start("127.0.31.2@tcp");
    let b = start("127.0.31.3@tcp");
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    put_and_get(&a, &b, ProcessId::lustre(nb));
    let rs = b.runtime_stats();
    assert_eq!(rs.user_copy_bytes, 0);
    a.shutdown();
    b.shutdown();
}

#[test]
fn memory_gone_fails_the_send_once() {
    let (na, nb) = (nid("127.0.31.4@tcp"), nid("127.0.31.5@tcp"));
    let a = start("127.0.31.4@tcp");
    let b = start("127.0.31.5@tcp");
    a.set_peer_addr(nb, b.listen_addr(nb).unwrap());
    b.set_peer_addr(na, a.listen_addr(na).unwrap());
    let src = Segs::new(&[10, 10]);
    let md = bind_foreign(&a, &src, 20);
    *src.0.lock() = None;
    a.put(md, true, ProcessId::lustre(nb), 23, 1, 0, 0).unwrap();
    // The SEND fails (the ACK it waited for will never come: the MD
    // keeps its last threshold until unlinked, as Lustre's).
    let evs = events_until(&a, |e| e.iter().any(|e| e.md == md));
    let mine: Vec<_> = evs.iter().filter(|e| e.md == md).collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0].kind(), EventKind::Send);
    assert!(mine[0].status().is_err());
    a.md_unlink(md).unwrap();
    let evs = until_final(&a, md);
    assert_eq!(evs.iter().filter(|e| e.md == md).count(), 1, "{evs:?}");
    assert!(a.next_event(Duration::from_millis(200)).is_err());
    a.shutdown();
    b.shutdown();
}
