//! Criterion benchmarks of the TCP transport (written next).

fn main() {}
