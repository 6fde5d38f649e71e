//! Runs every example's code, so that none of them rots.

use colibri_bulk_mem::MemTransport;
use colibri_examples::{bulk_file, echo, ping};

#[test]
fn ping_runs() {
    let r = ping::run_local(&MemTransport::default(), 20, 100).unwrap();
    assert_eq!((r.sent, r.received), (20, 20));
    assert!(r.min_us > 0.0 && r.min_us <= r.avg_us && r.avg_us <= r.max_us);
}

#[test]
fn rpc_echo_runs() {
    let r = echo::run_local(&MemTransport::default(), &["a", "Bc"]).unwrap();
    assert_eq!(r[0].text, "A A");
    assert_eq!(r[1].text, "BC BC");
    assert_eq!(r[1].served, 2);
}

#[test]
fn bulk_file_copies_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    // Not a multiple of the chunk size: the last chunk is short.
    let r = bulk_file::run_local(&MemTransport::default(), dir.path(), (5 << 20) + 777).unwrap();
    assert!(r.verified, "{r:?}");
    assert_eq!(r.bytes, (5 << 20) + 777);
}

#[test]
fn bulk_file_refuses_bad_names() {
    use colibri_rpc::{RpcConfig, RpcMachine};
    let dir = tempfile::tempdir().unwrap();
    let xprt = MemTransport::default();
    let server = RpcMachine::start_on(&xprt, "127.0.0.1:0:71", RpcConfig::default()).unwrap();
    let files = bulk_file::FileServer::start(&server, dir.path(), 1).unwrap();
    let client = RpcMachine::start_on(&xprt, "127.0.0.1:0:72", RpcConfig::default()).unwrap();
    let fc = bulk_file::FileClient::new(
        client.handle(),
        client.session(server.addr()).unwrap(),
        4096,
    );
    for bad in ["../etc/passwd", "", "a/b", ".."] {
        assert!(fc.stat(bad).is_err(), "{bad:?}");
    }
    assert!(fc.stat("missing").unwrap_err().to_string().contains("-2"));
    drop(fc);
    let d = client.shutdown().unwrap();
    assert_eq!(d.buffer_count(), 0);
    let d = server.shutdown().unwrap();
    assert_eq!(d.buffer_count(), 0);
    files.stop();
}

#[test]
fn examples_build_and_run_as_programs() {
    // The example binaries are built by `cargo test` (examples are
    // compiled for tests); run the cheap ones to check their exit codes.
    let exe = std::env::current_exe().unwrap();
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples");
    for (name, args) in [
        ("ping", vec!["3", "8"]),
        ("rpc_echo", vec!["x"]),
        ("bulk_file", vec![]),
    ] {
        let bin = dir.join(name);
        if !bin.exists() {
            // Built only when cargo builds the examples (cargo test does).
            continue;
        }
        let out = std::process::Command::new(&bin)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
