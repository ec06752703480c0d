//! Benchmark: written next.
fn main() {}
