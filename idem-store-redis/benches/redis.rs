//! idem on Redis against raw Redis on the same connection: a first execution (claim +
//! complete) and a replay, next to a raw `SET NX PX` and a raw `EVALSHA` of a trivial script.
//! Sequential calls on one multiplexed connection, so the numbers are round-trip latencies.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem-store-redis --bench redis
//! ```
//!
//! `IDEM_BENCH_ITERATIONS` (default 5000) sets the calls per measurement. With
//! `IDEM_BENCH_WAIT_REPLICAS=N` (a server with N replicas) first executions and replays are
//! measured again with `with_wait_for_replicas(N, 1 s)`. Keys are unique per
//! run and expire within minutes; nothing is flushed.

use std::time::{Duration, Instant};

use idem_core::{
    ClaimAnswer, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, Scope, Timestamp,
};
use idem_store_redis::RedisStore;
use idem_store_redis::redis::{self, Script, aio::ConnectionManager};

fn per_call(total: Duration, n: usize) -> f64 {
    total.as_secs_f64() * 1e6 / n as f64
}

async fn run(url: &str, n: usize) {
    let client = redis::Client::open(url).unwrap();
    let manager = ConnectionManager::new(client).await.unwrap();
    let mut raw = manager.clone();
    let store =
        RedisStore::from_connection_manager(manager).with_gc_margin(Duration::from_secs(60));
    let run = format!("{:08x}", rand::random::<u32>());
    let scope = Scope::new(format!("idem-bench/{run}")).unwrap();
    let policy = Policy::builder()
        .ttl(Duration::from_secs(120))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let fp = Fingerprint::of("create_ticket", &serde_json::json!({"title": "bench"})).unwrap();
    let outcome = Outcome::definitive(
        201,
        &serde_json::json!({"ticket_id": "T-1", "status": "open"}),
    )
    .unwrap();
    let trivial = Script::new("return 1");
    let now = Timestamp::now();

    // Warm up: connection, script cache.
    for i in 0..200 {
        let key = IdempotencyKey::new(format!("warm-{i}")).unwrap();
        if let ClaimAnswer::Claimed { token, .. } =
            store.claim(&scope, &key, &fp, &policy, now).await.unwrap()
        {
            store
                .complete(&scope, &key, token, &outcome, &policy, now)
                .await
                .unwrap();
        }
        let _: i64 = trivial
            .key(format!("idem-bench:{run}:warm"))
            .invoke_async(&mut raw)
            .await
            .unwrap();
    }

    let started = Instant::now();
    for i in 0..n {
        let ok: Option<String> = redis::cmd("SET")
            .arg(format!("idem-bench:{run}:set:{i}"))
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(ok.is_some());
    }
    let set_nx = per_call(started.elapsed(), n);

    let started = Instant::now();
    for i in 0..n {
        let _: i64 = trivial
            .key(format!("idem-bench:{run}:eval:{i}"))
            .invoke_async(&mut raw)
            .await
            .unwrap();
    }
    let evalsha = per_call(started.elapsed(), n);

    let keys: Vec<IdempotencyKey> = (0..n)
        .map(|i| IdempotencyKey::new(format!("op-{i}")).unwrap())
        .collect();
    let started = Instant::now();
    for key in &keys {
        let ClaimAnswer::Claimed { token, .. } =
            store.claim(&scope, key, &fp, &policy, now).await.unwrap()
        else {
            panic!("fresh key")
        };
        store
            .complete(&scope, key, token, &outcome, &policy, now)
            .await
            .unwrap();
    }
    let first = per_call(started.elapsed(), n);

    let started = Instant::now();
    for key in &keys {
        let answer = store.claim(&scope, key, &fp, &policy, now).await.unwrap();
        assert!(matches!(answer, ClaimAnswer::Replay(_)));
    }
    let replay = per_call(started.elapsed(), n);

    println!(
        "redis bench: {n} sequential calls each, one multiplexed connection to {}",
        redact(url)
    );
    println!("  raw SET NX PX            {set_nx:8.1} µs/call");
    println!("  raw EVALSHA (return 1)   {evalsha:8.1} µs/call");
    println!("  idem first execution     {first:8.1} µs/call  (claim + complete: 2 round trips)");
    println!(
        "  idem replay              {replay:8.1} µs/call  (claim answering Replay: 1 round trip)"
    );
    println!("  first execution / SET NX  {:5.2}x", first / set_nx);
    println!("  first execution / EVALSHA {:5.2}x", first / evalsha);
    println!("  replay / SET NX           {:5.2}x", replay / set_nx);
    println!("  replay / EVALSHA          {:5.2}x", replay / evalsha);

    // With `with_wait_for_replicas`: the same first executions and replays, each write confirmed
    // by the replicas (the server needs that many replicas).
    let Some(replicas) = std::env::var("IDEM_BENCH_WAIT_REPLICAS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return;
    };
    let waiting = store
        .clone()
        .with_wait_for_replicas(replicas, Duration::from_secs(1))
        .unwrap();
    let started = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let key = IdempotencyKey::new(format!("{}-w{i}", key.as_str())).unwrap();
        let ClaimAnswer::Claimed { token, .. } = waiting
            .claim(&scope, &key, &fp, &policy, now)
            .await
            .unwrap()
        else {
            panic!("fresh key")
        };
        waiting
            .complete(&scope, &key, token, &outcome, &policy, now)
            .await
            .unwrap();
    }
    let first_wait = per_call(started.elapsed(), n);
    let started = Instant::now();
    for key in &keys {
        let answer = waiting.claim(&scope, key, &fp, &policy, now).await.unwrap();
        assert!(matches!(answer, ClaimAnswer::Replay(_)));
    }
    let replay_wait = per_call(started.elapsed(), n);
    println!("  with WAIT {replicas} (each write confirmed by {replicas} replica(s)):");
    println!(
        "  idem first execution     {first_wait:8.1} µs/call  (claim + confirm + complete + confirm: 4 round trips), {:5.2}x without",
        first_wait / first
    );
    println!(
        "  idem replay              {replay_wait:8.1} µs/call  (no write, no WAIT), {:5.2}x without",
        replay_wait / replay
    );
}

fn redact(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, host)) => format!("redis://…@{host}"),
        None => url.to_owned(),
    }
}

fn main() {
    let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") else {
        eprintln!("IDEM_TEST_REDIS_URL is not set: nothing to measure");
        return;
    };
    // `cargo test --benches` runs benches with --bench absent: keep that quick.
    let n = if std::env::args().any(|a| a == "--bench") {
        std::env::var("IDEM_BENCH_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000)
    } else {
        50
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(&url, n));
}
