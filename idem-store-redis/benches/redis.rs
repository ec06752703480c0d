//! idem on Redis against its peer `idempotent` 0.3 (its Valkey/Redis store) and against the
//! floor of raw Redis, on the same server, side by side in one run: a first execution (claim +
//! complete) and a replay, at p50, p99 and mean. The floor of a first execution is two trivial
//! `EVALSHA` (idem's claim and complete are one script each), of a replay one `GET`. The kinds
//! are interleaved call by call (rotating which goes first) on one multiplexed connection each,
//! so the numbers are round-trip latencies under the same conditions; sequential, or with
//! `IDEM_BENCH_CONCURRENCY=C` C callers at once, each interleaving the kinds on keys of its own.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem-store-redis --bench redis
//! ```
//!
//! `IDEM_BENCH_ITERATIONS` (default 5000) sets the calls of each kind, shared among the callers.
//! With `IDEM_BENCH_WAIT_REPLICAS=N` (a server with N replicas) first executions and replays are
//! measured again with `with_wait_for_replicas(N, 1 s)`. Keys are unique per run and expire within
//! minutes; nothing is flushed.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, Timestamp,
};
use idem_store_redis::RedisStore;
use idem_store_redis::redis::{self, Script, aio::ConnectionManager};
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, Metadata};

fn per_call(total: Duration, n: usize) -> f64 {
    total.as_secs_f64() * 1e6 / n as f64
}

/// p50, p99 and mean of `samples`, µs.
fn stats(samples: &mut [Duration]) -> [f64; 3] {
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let rank = |q: f64| us(samples[((q * samples.len() as f64).ceil() as usize).max(1) - 1]);
    let mean = samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64;
    [rank(0.50), rank(0.99), mean]
}

async fn run(url: &str, n: usize, callers: usize) {
    let client = redis::Client::open(url).unwrap();
    let manager = ConnectionManager::new(client.clone()).await.unwrap();
    let mut raw = ConnectionManager::new(client.clone()).await.unwrap();
    let store =
        RedisStore::from_connection_manager(manager).with_gc_margin(Duration::from_secs(60));
    let run = format!("{:08x}", rand::random::<u32>());
    let peer = ValkeyStore::with_prefix(client, Some(&format!("idem-bench-peer:{run}")))
        .await
        .unwrap();
    let scope = Scope::new(format!("idem-bench/{run}")).unwrap();
    let policy = Policy::builder()
        .ttl(Duration::from_secs(120))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let args = serde_json::json!({"title": "bench"});
    let fp = Fingerprint::of("create_ticket", &args).unwrap();
    let answer = serde_json::json!({"ticket_id": "T-1", "status": "open"});
    let outcome = Outcome::definitive(201, &answer).unwrap();
    let peer_fp = DefaultFingerprintStrategy.compute("create_ticket", args.to_string().as_bytes());
    let peer_response = CachedResponse {
        status_code: 201,
        metadata: Metadata::default(),
        body: answer.to_string().into_bytes().into(),
    };
    let trivial = Script::new("return 1");
    let now = Timestamp::now();

    // Each returns how long its claim took (the rest of the first execution is the completion).
    let idem_first = async |key: &IdempotencyKey| {
        let t = Instant::now();
        let id = RecordId::new(scope.clone(), key.clone());
        let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &policy, now).await.unwrap()
        else {
            panic!("fresh key")
        };
        let claimed = t.elapsed();
        store
            .complete(&id, token, &outcome, &policy, now)
            .await
            .unwrap();
        claimed
    };
    let peer_first = async |key: &idempotent::IdempotencyKey| {
        let t = Instant::now();
        let entry = IdempotencyEntry::new(peer_fp, Duration::from_secs(120));
        let InsertResult::Claimed { fencing_token } =
            peer.try_insert(key, entry.clone()).await.unwrap()
        else {
            panic!("fresh key")
        };
        let claimed = t.elapsed();
        peer.complete(key, entry.complete(peer_response.clone()), fencing_token)
            .await
            .unwrap();
        claimed
    };
    let peer_replay = async |key: &idempotent::IdempotencyKey| {
        let entry = IdempotencyEntry::new(peer_fp, Duration::from_secs(120));
        let InsertResult::Exists(idempotent::entry::ExistingEntry::Completed(done)) =
            peer.try_insert(key, entry).await.unwrap()
        else {
            panic!("a completed key")
        };
        assert_eq!(done.response().status_code, 201);
    };
    let floor_first = async |conn: &mut ConnectionManager, key: &str| {
        for _ in 0..2 {
            let _: i64 = trivial.key(key).invoke_async(conn).await.unwrap();
        }
    };

    // Warm up: connections, script caches.
    for i in 0..200 {
        idem_first(&IdempotencyKey::new(format!("warm-{i}")).unwrap()).await;
        peer_first(&idempotent::IdempotencyKey::new(format!("warm-{i}")).unwrap()).await;
        floor_first(&mut raw, &format!("idem-bench:{run}:warm")).await;
    }

    let keys: Vec<IdempotencyKey> = (0..n)
        .map(|i| IdempotencyKey::new(format!("op-{i}")).unwrap())
        .collect();
    let peer_keys: Vec<idempotent::IdempotencyKey> = (0..n)
        .map(|i| idempotent::IdempotencyKey::new(format!("op-{i}")).unwrap())
        .collect();
    // Each caller takes every `callers`-th key and runs the kinds interleaved on its keys; all
    // callers share the connections (one multiplexed connection per kind, as a service would).
    // [idem, idempotent, floor] × [first, replay]
    let first_pass = async |caller: usize, mut raw: ConnectionManager| {
        let mut first: [Vec<Duration>; 3] = Default::default();
        // [idem, idempotent] × [claim, completion] of the first executions
        let mut steps: [[Vec<Duration>; 2]; 2] = Default::default();
        for i in (caller..n).step_by(callers) {
            let raw_key = format!("idem-bench:{run}:raw:{i}");
            for turn in 0..3 {
                let which = (i + turn) % 3;
                let t = Instant::now();
                let claimed = match which {
                    0 => Some(idem_first(&keys[i]).await),
                    1 => Some(peer_first(&peer_keys[i]).await),
                    _ => {
                        floor_first(&mut raw, &raw_key).await;
                        None
                    }
                };
                let took = t.elapsed();
                first[which].push(took);
                if let Some(claimed) = claimed {
                    steps[which][0].push(claimed);
                    steps[which][1].push(took.saturating_sub(claimed));
                }
                if which == 2 {
                    // The key the floor's replay reads (not timed).
                    let _: () = redis::cmd("SET")
                        .arg(&raw_key)
                        .arg(answer.to_string())
                        .arg("PX")
                        .arg(120_000)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                }
            }
        }
        (first, steps)
    };
    let replay_pass = async |caller: usize, mut raw: ConnectionManager| {
        let mut replay: [Vec<Duration>; 3] = Default::default();
        for i in (caller..n).step_by(callers) {
            for turn in 0..3 {
                let which = (i + turn) % 3;
                let t = Instant::now();
                match which {
                    0 => {
                        let answer = store
                            .claim(
                                &RecordId::new(scope.clone(), (keys[i]).clone()),
                                &fp,
                                &policy,
                                now,
                            )
                            .await
                            .unwrap();
                        assert!(matches!(answer, ClaimAnswer::Replay(_)));
                    }
                    1 => peer_replay(&peer_keys[i]).await,
                    _ => {
                        let got: Option<String> = redis::cmd("GET")
                            .arg(format!("idem-bench:{run}:raw:{i}"))
                            .query_async(&mut raw)
                            .await
                            .unwrap();
                        assert!(got.is_some());
                    }
                }
                replay[which].push(t.elapsed());
            }
        }
        replay
    };
    let mut first: [Vec<Duration>; 3] = Default::default();
    let mut steps: [[Vec<Duration>; 2]; 2] = Default::default();
    for (f, s) in join_all((0..callers).map(|c| first_pass(c, raw.clone()))).await {
        for (all, part) in first.iter_mut().zip(f) {
            all.extend(part);
        }
        for (all, part) in steps.iter_mut().flatten().zip(s.into_iter().flatten()) {
            all.extend(part);
        }
    }
    let mut replay: [Vec<Duration>; 3] = Default::default();
    for r in join_all((0..callers).map(|c| replay_pass(c, raw.clone()))).await {
        for (all, part) in replay.iter_mut().zip(r) {
            all.extend(part);
        }
    }

    let (first_mean, replay_mean) = (stats(&mut first[0])[2], stats(&mut replay[0])[2]);
    println!(
        "redis bench: {n} calls of each kind, interleaved, {callers} caller(s); one multiplexed connection each to {}",
        redact(url)
    );
    println!(
        "  {:<44}{:>9}{:>9}{:>9}{:>11}{:>11}",
        "", "p50 µs", "p99 µs", "mean µs", "p50 / idem", "p99 / idem"
    );
    for (kind, samples, names) in [
        (
            "first execution",
            &mut first,
            [
                "idem (claim + complete)",
                "idempotent 0.3 (try_insert + complete)",
                "floor: 2 × EVALSHA return 1",
            ],
        ),
        (
            "replay",
            &mut replay,
            [
                "idem (claim → Replay)",
                "idempotent 0.3 (try_insert → Exists)",
                "floor: GET",
            ],
        ),
    ] {
        println!("  {kind}");
        let s: Vec<[f64; 3]> = samples.iter_mut().map(|v| stats(v)).collect();
        for (name, st) in names.iter().zip(&s) {
            println!(
                "    {name:<42}{:>9.1}{:>9.1}{:>9.1}{:>10.2}×{:>10.2}×",
                st[0],
                st[1],
                st[2],
                st[0] / s[0][0],
                st[1] / s[0][1]
            );
        }
        println!(
            "    idem / floor: p50 {:.2}×, p99 {:.2}×",
            s[0][0] / s[2][0],
            s[0][1] / s[2][1]
        );
    }

    println!("  first execution by step (p50 / p99 µs)");
    for (name, [claim, completion]) in ["idem", "idempotent 0.3"].iter().zip(&mut steps) {
        let (c, d) = (stats(claim), stats(completion));
        println!(
            "    {name:<16} claim {:7.1} / {:7.1}   completion {:7.1} / {:7.1}",
            c[0], c[1], d[0], d[1]
        );
    }

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
        let id = RecordId::new(scope.clone(), key.clone());
        let ClaimAnswer::Claimed { token, .. } =
            waiting.claim(&id, &fp, &policy, now).await.unwrap()
        else {
            panic!("fresh key")
        };
        waiting
            .complete(&id, token, &outcome, &policy, now)
            .await
            .unwrap();
    }
    let first_wait = per_call(started.elapsed(), n);
    let started = Instant::now();
    for key in &keys {
        let answer = waiting
            .claim(
                &RecordId::new(scope.clone(), key.clone()),
                &fp,
                &policy,
                now,
            )
            .await
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Replay(_)));
    }
    let replay_wait = per_call(started.elapsed(), n);
    println!("  with WAIT {replicas} (each write confirmed by {replicas} replica(s)):");
    println!(
        "  idem first execution     {first_wait:8.1} µs/call  (claim + confirm + complete + confirm: 4 round trips), {:5.2}x without",
        first_wait / first_mean
    );
    println!(
        "  idem replay              {replay_wait:8.1} µs/call  (no write, no WAIT), {:5.2}x without",
        replay_wait / replay_mean
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
    let callers = std::env::var("IDEM_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(&url, n, callers));
}
