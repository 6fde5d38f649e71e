//! A file service over bulk transfers: copies a file through a server in
//! this process and checks the copy's checksum.
//!
//! ```text
//! cargo run -p colibri-examples --example bulk_file              # a generated 8 MiB file
//! cargo run -p colibri-examples --example bulk_file -- SRC DST   # copy SRC to DST
//! ```

use colibri_bulk_mem::MemTransport;
use colibri_examples::bulk_file;

fn main() -> Result<(), colibri_examples::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let work = std::env::temp_dir().join(format!("colibri-bulk-file-{}", std::process::id()));
    let xprt = MemTransport::default();
    let report = match args.as_slice() {
        [] => bulk_file::run_local(&xprt, &work, (8 << 20) + 12_345),
        [src, dst] => bulk_file::copy_through_server(&xprt, &work, src.as_ref(), dst.as_ref()),
        _ => Err("usage: bulk_file [SRC DST]".into()),
    };
    let _ = std::fs::remove_dir_all(&work);
    let r = report?;
    println!(
        "copied {} bytes through the server: source crc32c {:08x}, server's copy {:08x}, copy back {:08x}: {}",
        r.bytes,
        r.source_sum,
        r.remote_sum,
        r.copy_sum,
        if r.verified { "verified" } else { "MISMATCH" }
    );
    if r.verified {
        Ok(())
    } else {
        Err("checksum mismatch".into())
    }
}
