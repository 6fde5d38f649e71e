//! `colibri-rdma-peer`: a peer process for the RDMA transport's
//! process-death tests (run inside the Soft-RoCE VM).
//!
//! ```text
//! colibri-rdma-peer passive-send SIZE   offer SIZE bytes of pattern(1) to read
//! colibri-rdma-peer passive-recv SIZE   offer a SIZE-byte buffer to write into
//! colibri-rdma-peer recv SIZE           post a SIZE-byte message receive buffer
//! colibri-rdma-peer get HEX SIZE        read SIZE bytes from the passive buffer HEX names
//! colibri-rdma-peer put HEX SIZE        write SIZE bytes into the passive buffer HEX names
//! colibri-rdma-peer register SIZE       register a SIZE-byte buffer, print the outcome, exit
//! ```
//!
//! The first three print `ADDR <address>` and `DESC <hex descriptor>` (the
//! descriptor is empty for `recv`); the last two print `ADDED`. Then the
//! process waits (at most 120 s) to be killed, printing `EVENT <status>`
//! for each buffer event.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use colibri_bulk_rdma::{RdmaConfig, RdmaTransport};
use colibri_net::{
    BufVec, Domain, NetBufDesc, RecvParams, TmState, event_channel, ignore_tm_events,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Res<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return Err("odd hex length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}

fn run(args: &[String]) -> Res<()> {
    let role = args.first().ok_or("usage: see the source")?.as_str();
    let num = |i: usize| -> Res<usize> { Ok(args.get(i).ok_or("missing size")?.parse::<usize>()?) };
    let xprt = RdmaTransport::new(RdmaConfig::default());
    let dom = Domain::new(&xprt)?;
    if role == "register" {
        match dom.register(BufVec::new(1, num(1)?)) {
            Ok(b) => {
                println!("REGISTERED");
                drop(b);
            }
            Err(e) => println!("ERROR {}", e.error),
        }
        dom.fini()?;
        return Ok(());
    }
    let tm = dom.tm_init(ignore_tm_events())?;
    let (cbs, events) = event_channel(64);
    tm.start("127.0.0.1:0:1")?;
    tm.wait_for_state(TmState::Started, Duration::from_secs(30))?;
    let me = tm.ep().ok_or("no end point")?.addr().to_string();
    let buf = |size: usize, fill: bool| -> Res<colibri_net::NetBuffer> {
        let mut bv = BufVec::with_len(size.max(1), 1 << 20);
        if fill {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            bv.copy_in(0, &data)?;
        }
        Ok(dom.register(bv)?.with_callbacks(cbs.clone()))
    };
    let mut out = std::io::stdout();
    match role {
        "passive-send" | "passive-recv" | "recv" => {
            let size = num(1)?;
            let desc = match role {
                "passive-send" => {
                    tm.add_passive_send(buf(size, true)?, size, None)
                        .map_err(|e| e.error)?
                        .1
                }
                "passive-recv" => {
                    tm.add_passive_recv(buf(size, false)?, None)
                        .map_err(|e| e.error)?
                        .1
                }
                _ => {
                    tm.add_msg_recv(buf(size, false)?, RecvParams::default())
                        .map_err(|e| e.error)?;
                    NetBufDesc::default()
                }
            };
            writeln!(out, "ADDR {me}")?;
            writeln!(out, "DESC {}", hex(desc.as_bytes()))?;
        }
        "get" | "put" => {
            let desc = NetBufDesc::from_bytes(unhex(args.get(1).ok_or("missing descriptor")?)?);
            let size = num(2)?;
            if role == "get" {
                tm.add_active_recv(buf(size, false)?, &desc)
                    .map_err(|e| e.error)?;
            } else {
                tm.add_active_send(buf(size, true)?, &desc, size)
                    .map_err(|e| e.error)?;
            }
            writeln!(out, "ADDED")?;
        }
        other => return Err(format!("unknown role {other}").into()),
    }
    out.flush()?;
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        if let Ok(ev) = events.recv_timeout(Duration::from_millis(200)) {
            writeln!(out, "EVENT {:?}", ev.status())?;
            out.flush()?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("colibri-rdma-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
