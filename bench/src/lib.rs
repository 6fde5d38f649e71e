//! # colibri-bench: benchmark workloads and their baselines
//!
//! The measurements behind `colibri bench` and the criterion benches, written
//! once and run over any transport:
//!
//! * [`RoundTrip`]: a client sends a message, the server's receive callback
//!   sends it back from the same buffer; one message in flight.
//! * [`OneWay`]: a client streams small messages into the server's
//!   multi-message receive buffers, with a window of sends in flight.
//! * [`Bulk`]: the client reads (active bulk receive) or writes (active bulk
//!   send) passive buffers offered by the server, two transfers in flight.
//!
//! * [`RpcRoundTrip`], [`RpcBulk`], [`RpcOneWay`]: the same one layer up,
//!   through [`colibri_rpc`] (see the [`rpc`] module).
//!
//! Every workload is driven from the transports' own callbacks: the thread
//! that measures only starts a run and waits for its end, so a run of `n`
//! iterations pays one thread wake-up, not `n`.
//!
//! The [`baseline`] module holds what they are compared with, measured in the
//! same process: a crossbeam channel ping-pong and stream between two pinned
//! threads, and single-thread `memcpy`.
//!
//! ```
//! use colibri_bench::{PairConfig, RoundTrip};
//! use colibri_bulk_mem::MemTransport;
//!
//! let xprt = MemTransport::default();
//! let mut rt = RoundTrip::new(&xprt, &PairConfig::mem(), 64).unwrap();
//! let t = rt.run(1000).unwrap();
//! assert!(t.as_nanos() > 0);
//! rt.finish();
//! ```

#![forbid(unsafe_code)]

pub mod baseline;
mod pair;
pub mod ratios;
pub mod report;
pub mod rpc;
pub mod scale;
mod workloads;

pub use pair::{BenchPair, PairConfig};
pub use rpc::{RpcBulk, RpcOneWay, RpcRoundTrip};
pub use workloads::{Bulk, BulkDir, OneWay, RoundTrip};

/// A failed benchmark run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "benchmark failed: {}", self.0)
    }
}

impl std::error::Error for BenchError {}

impl From<colibri_net::NetError> for BenchError {
    fn from(e: colibri_net::NetError) -> Self {
        Self(e.to_string())
    }
}

impl From<colibri_net::AddError> for BenchError {
    fn from(e: colibri_net::AddError) -> Self {
        Self(e.error.to_string())
    }
}

impl From<colibri_net::RegisterError> for BenchError {
    fn from(e: colibri_net::RegisterError) -> Self {
        Self(e.error.to_string())
    }
}

/// Result alias of this crate.
pub type BenchResult<T> = Result<T, BenchError>;

/// Parses a size like `64`, `4K`, `4KiB`, `1M`, `16MiB` (powers of 1024).
///
/// # Errors
/// A message naming the bad input.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.find(|c: char| !c.is_ascii_digit()) {
        None => (t, 1usize),
        Some(i) => {
            let unit = t[i..].to_ascii_lowercase();
            let m = match unit.as_str() {
                "b" => 1,
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                _ => return Err(format!("unknown size unit in {s:?}")),
            };
            (&t[..i], m)
        }
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

/// Formats a byte count with a binary unit (`64B`, `4KiB`, `16MiB`).
pub fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}KiB", n >> 10)
    } else {
        format!("{n}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("4Q").is_err());
        assert_eq!(fmt_size(64), "64B");
        assert_eq!(fmt_size(4096), "4KiB");
        assert_eq!(fmt_size(16 << 20), "16MiB");
        assert_eq!(fmt_size(1000), "1000B");
    }
}
