//! Typed request/reply with serde, client and server in one process.
//!
//! ```text
//! cargo run -p colibri-examples --example rpc_echo [-- TEXT...]
//! ```

use colibri_bulk_mem::MemTransport;
use colibri_examples::echo;

fn main() -> Result<(), colibri_examples::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let texts: Vec<&str> = if args.is_empty() {
        vec!["hello", "colibri"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    for (t, r) in texts
        .iter()
        .zip(echo::run_local(&MemTransport::default(), &texts)?)
    {
        println!(
            "{t:?} -> {:?} (request #{} at the server)",
            r.text, r.served
        );
    }
    Ok(())
}
