//! Benchmark: idem on SQLite against the raw statements (written next).

fn main() {}
