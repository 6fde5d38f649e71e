//! `colibri-lnet-node`: one LNet node as a process, to build multi-process
//! fabrics (client on `tcp`, router, server on `tcp1`, …).
//!
//! ```text
//! colibri-lnet-node --nid 127.0.0.2@tcp [--listen 127.0.0.2:988]
//!                   [--nid 127.0.0.3@tcp1 [--listen ip:port]] …
//!                   [--route tcp1:127.0.0.3@tcp[:hops]] … [--routing]
//!                   [--peer nid=ip:port] … [--accept-port PORT] [--accept secure|all|none]
//!                   [--no-discovery] [--sink PORTAL:BITS:SIZE]
//!                   [--put NID:PORTAL:BITS:SIZE [--seed N] [--timeout SECS]]
//! ```
//!
//! Once its listeners are bound it prints one line
//! `READY pid=<os pid> nids=<nid>,… listen=<nid>=<ip:port>,…` and flushes
//! stdout. With `--sink` it posts an MD of SIZE bytes on PORTAL/BITS and
//! prints `RECEIVED portal=… bits=… mlength=… crc=<hex> from=<nid>` for each
//! PUT (the checksum is `colibri_lnet::socklnd::payload_checksum`). With
//! `--put` it sends SIZE bytes of a pattern (seeded by `--seed`) with an
//! ACK, prints `PUT ok crc=<hex>` or `PUT failed: <why>`, and exits (0 on
//! success). Otherwise it runs until killed (SIGTERM, SIGKILL) or until
//! its standard input closes.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use colibri_lnet::ids::{Net, Nid, ProcessId};
use colibri_lnet::matching::{
    EventKind, InsertPos, MdOptions, MdSpec, MeSpec, MemRef, Threshold, Unlink,
};
use colibri_lnet::socklnd::{AcceptPolicy, payload_checksum};
use colibri_lnet_rt::{Lnet, LnetConfig, MemRegion, colibri_lnet};

struct Opts {
    nids: Vec<(Nid, Option<SocketAddr>)>,
    routes: Vec<(Net, Nid, Option<u32>)>,
    routing: bool,
    peers: Vec<(Nid, SocketAddr)>,
    accept_port: Option<u16>,
    accept: Option<AcceptPolicy>,
    discovery: bool,
    sink: Option<(u32, u64, u32)>,
    put: Option<(Nid, u32, u64, u32)>,
    seed: u8,
    timeout: Duration,
}

fn parse_u<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("bad {what}: {s:?}"))
}

fn parse_bits(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|_| format!("bad match bits: {s:?}")),
        None => parse_u(s, "match bits"),
    }
}

fn parse_nid(s: &str) -> Result<Nid, String> {
    s.parse().map_err(|e| format!("bad NID {s:?}: {e}"))
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        nids: Vec::new(),
        routes: Vec::new(),
        routing: false,
        peers: Vec::new(),
        accept_port: None,
        accept: None,
        discovery: true,
        sink: None,
        put: None,
        seed: 0,
        timeout: Duration::from_secs(30),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--nid" => o.nids.push((parse_nid(val()?)?, None)),
            "--listen" => {
                let v = val()?;
                let addr = parse_u(v, "listen address")?;
                match o.nids.last_mut() {
                    Some(last) => last.1 = Some(addr),
                    None => return Err("--listen must follow a --nid".into()),
                }
            }
            "--route" => {
                let v = val()?;
                let parts: Vec<&str> = v.split(':').collect();
                let (net, gw, hops) = match parts.as_slice() {
                    [n, g] => (n, g, None),
                    [n, g, h] => (n, g, Some(parse_u(h, "hop count")?)),
                    _ => return Err(format!("bad route {v:?} (net:gateway[:hops])")),
                };
                let net: Net = net.parse().map_err(|e| format!("bad net {net:?}: {e}"))?;
                o.routes.push((net, parse_nid(gw)?, hops));
            }
            "--routing" => o.routing = true,
            "--peer" => {
                let v = val()?;
                let (n, a) = v
                    .split_once('=')
                    .ok_or_else(|| format!("bad peer {v:?} (nid=ip:port)"))?;
                o.peers.push((parse_nid(n)?, parse_u(a, "peer address")?));
            }
            "--accept-port" => o.accept_port = Some(parse_u(val()?, "port")?),
            "--accept" => {
                let v = val()?;
                o.accept = Some(v.parse().map_err(|_| format!("bad accept policy {v:?}"))?);
            }
            "--no-discovery" => o.discovery = false,
            "--sink" => {
                let v = val()?;
                let p: Vec<&str> = v.split(':').collect();
                let [portal, bits, size] = p.as_slice() else {
                    return Err(format!("bad sink {v:?} (portal:bits:size)"));
                };
                o.sink = Some((
                    parse_u(portal, "portal")?,
                    parse_bits(bits)?,
                    parse_u(size, "size")?,
                ));
            }
            "--put" => {
                let v = val()?;
                let p: Vec<&str> = v.rsplitn(4, ':').collect();
                let [size, bits, portal, n] = p.as_slice() else {
                    return Err(format!("bad put {v:?} (nid:portal:bits:size)"));
                };
                o.put = Some((
                    parse_nid(n)?,
                    parse_u(portal, "portal")?,
                    parse_bits(bits)?,
                    parse_u(size, "size")?,
                ));
            }
            "--seed" => o.seed = parse_u(val()?, "seed")?,
            "--timeout" => o.timeout = Duration::from_secs(parse_u(val()?, "timeout")?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if o.nids.is_empty() {
        return Err("at least one --nid is needed".into());
    }
    Ok(o)
}

/// The bytes `--put` sends (and a test can recompute).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("colibri-lnet-node: {e}");
            }
            eprintln!(
                "usage: colibri-lnet-node --nid NID [--listen IP:PORT] ... [--route NET:GW[:HOPS]] ... \
                 [--routing] [--peer NID=IP:PORT] ... [--accept-port PORT] [--accept secure|all|none] \
                 [--no-discovery] [--sink PORTAL:BITS:SIZE] [--put NID:PORTAL:BITS:SIZE [--seed N] \
                 [--timeout SECS]]"
            );
            return ExitCode::from(2);
        }
    };
    tracing_init();
    match run(opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("colibri-lnet-node: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Diagnostics to stderr, filtered by `RUST_LOG` (default: warnings).
fn tracing_init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run(o: Opts) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let nids: Vec<Nid> = o.nids.iter().map(|n| n.0).collect();
    let mut cfg = LnetConfig::new(&nids);
    for (n, l) in &o.nids {
        if let Some(l) = l {
            cfg = cfg.listen_on(*n, *l);
        }
    }
    for (n, a) in &o.peers {
        cfg = cfg.peer_addr(*n, *a);
    }
    if let Some(p) = o.accept_port {
        cfg.accept_port = p;
    }
    if let Some(a) = o.accept {
        cfg.accept = a;
    }
    cfg.node.routing = o.routing;
    cfg.node.discovery = o.discovery;
    let lnet = Lnet::start(cfg)?;
    for (net, gw, hops) in &o.routes {
        lnet.add_route(*net, *gw, *hops, 0)?;
    }
    let sink = match o.sink {
        Some((portal, bits, size)) => {
            let region = MemRegion::zeroed(size as usize);
            let key = lnet.register(&region);
            let me = lnet.me_attach(MeSpec {
                portal,
                match_id: ProcessId::ANY,
                match_bits: bits,
                ignore_bits: 0,
                unlink: Unlink::Retain,
                pos: InsertPos::After,
            })?;
            lnet.md_attach(
                me,
                MdSpec::new(MemRef::new(key, 0, size), MdOptions::OP_PUT)
                    .threshold(Threshold::Infinite),
            )?;
            Some(region)
        }
        None => None,
    };
    let listen: Vec<String> = nids
        .iter()
        .filter_map(|n| lnet.listen_addr(*n).map(|a| format!("{n}={a}")))
        .collect();
    let ids: Vec<String> = nids.iter().map(ToString::to_string).collect();
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "READY pid={} nids={} listen={}",
            std::process::id(),
            ids.join(","),
            listen.join(",")
        )?;
        out.flush()?;
    }
    if let Some((target, portal, bits, size)) = o.put {
        let code = do_put(&lnet, target, portal, bits, size, o.seed, o.timeout);
        lnet.shutdown();
        return Ok(code);
    }
    // Serve: print received PUTs; stop when stdin closes.
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            if line.is_err() {
                break;
            }
        }
        let _ = stop_tx.send(());
    });
    loop {
        if stop_rx.try_recv().is_ok() {
            break;
        }
        let Ok(ev) = lnet.next_event(Duration::from_millis(200)) else {
            continue;
        };
        if ev.kind() == EventKind::Put
            && let Some(region) = &sink
        {
            let start = ev.info.offset as usize;
            let len = ev.info.mlength as usize;
            let crc = region.read(|b| b.get(start..start + len).map_or(0, payload_checksum));
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "RECEIVED portal={} bits={:#x} mlength={} crc={crc:08x} from={} status={}",
                ev.info.portal,
                ev.info.match_bits,
                ev.info.mlength,
                ev.info.initiator.nid,
                if ev.status().is_ok() { "ok" } else { "error" }
            )?;
            out.flush()?;
        }
    }
    lnet.shutdown();
    Ok(ExitCode::SUCCESS)
}

fn do_put(
    lnet: &Lnet,
    target: Nid,
    portal: u32,
    bits: u64,
    size: u32,
    seed: u8,
    timeout: Duration,
) -> ExitCode {
    let data = pattern(size as usize, seed);
    let crc = payload_checksum(&data);
    let region = MemRegion::from_vec(data);
    let key = lnet.register(&region);
    let md = match lnet.md_bind(
        MdSpec::new(MemRef::new(key, 0, size), MdOptions::empty())
            .threshold(Threshold::Count(2))
            .unlink(Unlink::Unlink),
    ) {
        Ok(md) => md,
        Err(e) => {
            println!("PUT failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = lnet.put(md, true, ProcessId::lustre(target), portal, bits, 0, 0) {
        println!("PUT failed: {e}");
        return ExitCode::FAILURE;
    }
    let start = Instant::now();
    let mut acked = false;
    let mut sent = false;
    while start.elapsed() < timeout {
        let Ok(ev) = lnet.next_event(Duration::from_millis(200)) else {
            continue;
        };
        if ev.md != md {
            continue;
        }
        if let Err(e) = ev.status() {
            println!("PUT failed: {:?} {e}", ev.kind());
            return ExitCode::FAILURE;
        }
        match ev.kind() {
            EventKind::Send => sent = true,
            EventKind::Ack => acked = true,
            _ => {}
        }
        if sent && acked {
            println!("PUT ok crc={crc:08x}");
            return ExitCode::SUCCESS;
        }
    }
    println!("PUT failed: no ACK in {timeout:?}");
    ExitCode::FAILURE
}
