//! What the HTTP layer adds to a handler: a bare axum handler against the same handler behind
//! `IdempotencyLayer` on a `MemoryStore` (so the store's round trips cost next to nothing),
//! in-process through the router as a tower service (no sockets). Bare calls, first executions
//! (a new key) and replays are interleaved, and so are the store's own round trips (claim +
//! complete, and the claim that answers a replay, straight on another `MemoryStore`); p50, p99
//! and mean per kind, and the layer's overhead beyond the bare handler and beyond the bare
//! handler plus the store's round trips (issue 17's target: at most 15 % or 20 µs, whichever is
//! larger). Requests without a key under `KeySource::arguments()` (the key derived from the
//! canonical body, contract §5.1) are interleaved too, against the sent-key calls (issue 27:
//! deriving adds at most a few µs at p50).
//!
//! ```text
//! cargo bench -p idem-http --bench layer
//! ```
//!
//! `IDEM_BENCH_ITERATIONS` (default 20000) sets the calls of each kind. Under `cargo test
//! --benches` (no `--bench` argument) it runs 50 of each, as a smoke test.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idem_core::machine::ClaimAnswer;
use idem_core::{
    Executor, Fingerprint, IdempotencyKey, KeySource, KeyStore, MemoryStore, Outcome, Policy,
    RecordId, Scope, Timestamp,
};
use idem_http::IdempotencyLayer;
use serde_json::{Value, json};
use tower_service::Service;

async fn create_ticket(axum::Json(args): axum::Json<Value>) -> (StatusCode, axum::Json<Value>) {
    (
        StatusCode::CREATED,
        axum::Json(json!({"ticket_id": "T-1", "title": args["title"], "status": "open"})),
    )
}

fn request(key: Option<&str>) -> Request<Body> {
    request_titled(key, "bench")
}

fn request_titled(key: Option<&str>, title: &str) -> Request<Body> {
    let mut req = Request::builder()
        .method("POST")
        .uri("/tools/create_ticket")
        .header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(format!(r#"{{"title":"{title}","priority":2}}"#)))
        .unwrap()
}

/// One call through `app`, answered and its body read to the end.
async fn call(app: &mut Router, req: Request<Body>) -> Duration {
    let t = Instant::now();
    let res = app.call(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let took = t.elapsed();
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    took
}

/// The store's own round trips for one first execution (claim + complete of a new key) or one
/// replay (the claim of a completed key), straight through `KeyStore`.
async fn store_round_trips(store: &MemoryStore, key: &str, replay: bool) -> Duration {
    let scope = Scope::new("bench//tools/create_ticket").unwrap();
    let key = IdempotencyKey::new(key).unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let fingerprint = Fingerprint::of_bytes(b"request");
    let policy = Policy::default();
    let outcome = Outcome::from_json_text(
        201,
        r#"{"ticket_id":"T-1","title":"bench","status":"open"}"#,
        idem_core::OutcomeClass::Definitive,
    )
    .unwrap();
    let t = Instant::now();
    let answer = store
        .claim(&id, &fingerprint, &policy, Timestamp::now())
        .await
        .unwrap();
    match answer {
        ClaimAnswer::Claimed { token, .. } if !replay => {
            store
                .complete(&id, token, &outcome, &policy, Timestamp::now())
                .await
                .unwrap();
        }
        ClaimAnswer::Replay(_) if replay => {}
        other => panic!("unexpected claim answer {other:?}"),
    }
    t.elapsed()
}

struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    mean: f64,
}

fn stats(samples: &mut [Duration]) -> Stats {
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let rank = |q: f64| us(samples[((q * samples.len() as f64).ceil() as usize).max(1) - 1]);
    Stats {
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        p999: rank(0.999),
        mean: samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64,
    }
}

async fn run(n: usize) {
    let mut bare = Router::new().route("/tools/create_ticket", post(create_ticket));
    let executor = Executor::new(MemoryStore::new());
    let mut layered = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(IdempotencyLayer::new(executor.clone(), |_| {
            Ok("bench".to_owned())
        }));
    let mut derived = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(
            IdempotencyLayer::new(executor, |_| Ok("bench-derived".to_owned())).tool(
                idem_core::Tool::builder()
                    .key_source(KeySource::arguments())
                    .build()
                    .expect("a valid tool"),
            ),
        );

    let store = MemoryStore::new();
    for i in 0..200 {
        call(&mut bare, request(None)).await;
        call(&mut layered, request(Some(&format!("warm-{i}")))).await;
        store_round_trips(&store, &format!("warm-{i}"), false).await;
        call(&mut derived, request_titled(None, &format!("warm-{i}"))).await;
    }
    let (mut b, mut first, mut replay) = (Vec::new(), Vec::new(), Vec::new());
    let (mut derived_first, mut derived_replay) = (Vec::new(), Vec::new());
    let (mut store_first, mut store_replay) = (Vec::new(), Vec::new());
    for i in 0..n {
        let key = format!("op-{i}");
        b.push(call(&mut bare, request(None)).await);
        store_first.push(store_round_trips(&store, &key, false).await);
        first.push(call(&mut layered, request(Some(&key))).await);
        // The replay of the key before, so the record is settled (the completion ran).
        if i > 0 {
            let before = format!("op-{}", i - 1);
            store_replay.push(store_round_trips(&store, &before, true).await);
            replay.push(call(&mut layered, request(Some(&before))).await);
        }
        derived_first.push(call(&mut derived, request_titled(None, &key)).await);
        if i > 0 {
            let before = format!("op-{}", i - 1);
            derived_replay.push(call(&mut derived, request_titled(None, &before)).await);
        }
    }
    let (derived_first, derived_replay) = (stats(&mut derived_first), stats(&mut derived_replay));
    let (b, first, replay) = (stats(&mut b), stats(&mut first), stats(&mut replay));
    let (store_first, store_replay) = (stats(&mut store_first), stats(&mut store_replay));
    println!(
        "idem-http layer bench: {n} calls of each kind, in-process (tower Service::call), MemoryStore"
    );
    println!(
        "  {:<40}{:>9}{:>9}{:>9}{:>9}{:>9}",
        "", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "mean µs"
    );
    for (name, s) in [
        ("bare axum handler", &b),
        ("layer, first execution", &first),
        ("layer, replay", &replay),
        ("layer, derived key, first execution", &derived_first),
        ("layer, derived key, replay", &derived_replay),
        ("store alone: claim + complete", &store_first),
        ("store alone: claim → replay", &store_replay),
    ] {
        println!(
            "  {name:<40}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}",
            s.p50, s.p90, s.p99, s.p999, s.mean
        );
    }
    for (name, s) in [("first execution", &first), ("replay", &replay)] {
        println!(
            "  layer overhead, {name:<16} p50 +{:.1} µs ({:.2}×)  p99 +{:.1} µs ({:.2}×)",
            s.p50 - b.p50,
            s.p50 / b.p50,
            s.p99 - b.p99,
            s.p99 / b.p99
        );
    }
    for (name, d, s) in [
        ("first execution", &derived_first, &first),
        ("replay", &derived_replay, &replay),
    ] {
        println!(
            "  derived key vs sent, {name:<16} p50 +{:.1} µs ({:.2}×)  p99 +{:.1} µs ({:.2}×)",
            d.p50 - s.p50,
            d.p50 / s.p50,
            d.p99 - s.p99,
            d.p99 / s.p99
        );
    }
    for (name, s, st) in [
        ("first execution", &first, &store_first),
        ("replay", &replay, &store_replay),
    ] {
        println!(
            "  beyond bare + store, {name:<16} p50 +{:.1} µs ({:.2}×)  p99 +{:.1} µs ({:.2}×)",
            s.p50 - b.p50 - st.p50,
            s.p50 / (b.p50 + st.p50),
            s.p99 - b.p99 - st.p99,
            s.p99 / (b.p99 + st.p99)
        );
    }
}

fn main() {
    // `cargo test --benches` runs benches with --bench absent: keep that quick.
    let n = if std::env::args().any(|a| a == "--bench") {
        std::env::var("IDEM_BENCH_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000)
    } else {
        50
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(n));
}
