//! The deeper run: `scripts/model-check [callers] [calls] [crashes] [failovers]` (see
//! `docs/model-check.md`).

fn main() {
    println!("todo");
}
