//! CPU cost of one fingerprint (canonical JSON per RFC 8785 + SHA-256), in ns per call, for
//! request bodies of a few shapes: what the HTTP layer and the MCP wrapper pay on every call.
//!
//! ```text
//! cargo bench -p idem-core --bench fingerprint
//! ```
//!
//! Each case runs `IDEM_BENCH_ITERATIONS` calls (default 200000) in 20 rounds and reports the
//! median and the fastest round's ns per call. Under `cargo test --benches` (no `--bench`
//! argument) it runs 100 calls of each, as a smoke test.

use std::hint::black_box;
use std::time::Instant;

use idem_core::{Fingerprint, canonical_json};
use serde_json::{Value, json};

fn cases() -> Vec<(&'static str, &'static str, Value)> {
    let items: Vec<Value> = (0..20)
        .map(|i| json!({"sku": format!("SKU-{i:04}"), "qty": i % 7 + 1, "price": 9.99 + i as f64, "note": "fragile \"glass\" ✓"}))
        .collect();
    vec![
        (
            "small (the layer bench's body)",
            "POST /tools/create_ticket",
            json!({"title": "bench", "priority": 2}),
        ),
        (
            "typical tool call (8 fields)",
            "create_ticket",
            json!({
                "title": "Printer on fire", "account_id": "A-7", "priority": 2, "tags": ["hw", "urgent"],
                "assignee": null, "due": "2026-12-01T10:00:00Z", "estimate_h": 1.5, "notify": true
            }),
        ),
        (
            "1.6 KB order (20 line items)",
            "POST /tools/place_order",
            json!({"customer": {"id": 9_007_199_254_740_993u64, "name": "Zoë Ünal"}, "items": items, "currency": "EUR"}),
        ),
    ]
}

fn main() {
    let n: u32 = if std::env::args().any(|a| a == "--bench") {
        std::env::var("IDEM_BENCH_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000)
    } else {
        100
    };
    let rounds = 20;
    let per_round = (n / rounds).max(1);
    println!(
        "fingerprint bench: ns per call, median (fastest) of {rounds} rounds of {per_round} calls"
    );
    for (name, operation, arguments) in cases() {
        let bytes = canonical_json(&arguments).unwrap().len();
        let mut line = format!("  {name:<34}{bytes:>6} B canonical");
        let kinds: [(&str, &dyn Fn() -> Fingerprint); 2] = [
            ("of_value", &|| {
                Fingerprint::of_value(black_box(operation), black_box(&arguments)).unwrap()
            }),
            ("of", &|| {
                Fingerprint::of(black_box(operation), black_box(&arguments)).unwrap()
            }),
        ];
        for (kind, f) in kinds {
            let mut ns: Vec<f64> = (0..rounds)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..per_round {
                        black_box(f());
                    }
                    t.elapsed().as_nanos() as f64 / f64::from(per_round)
                })
                .collect();
            ns.sort_by(f64::total_cmp);
            line += &format!("   {kind} {:>7.0} ({:.0})", ns[ns.len() / 2], ns[0]);
        }
        println!("{line}");
    }
}
