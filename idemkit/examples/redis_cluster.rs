//! The executor on a Redis Cluster: many workers, each with its own cluster connection, race to
//! run the same operations; each operation runs once.
//!
//! For each of 6 keys (their records hashed over the cluster's slots and masters), 8 workers
//! call `Executor::run` at once, then one more worker calls again after they finished. The
//! example checks that each operation ran exactly once, that the late call was a replay of its
//! answer, and that every racing call either ran it, replayed it, or was told it was in flight.
//!
//! ```sh
//! IDEM_TEST_REDIS_CLUSTER_URLS=redis://127.0.0.1:7000,redis://127.0.0.1:7001 \
//!   cargo run -p idemkit --example redis_cluster --features redis
//! ```
//!
//! Its records live under a key prefix of their own (`idem-example-<unique>`), expire after 10
//! minutes and leave the servers a minute later.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemkit::redis::RedisStore;
use idemkit::{Error, Execution, Executor, Fingerprint, IdempotencyKey, Outcome, Policy, Scope};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEYS: usize = 6;
const WORKERS: usize = 8;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Ok(urls) = std::env::var("IDEM_TEST_REDIS_CLUSTER_URLS") else {
        println!("redis_cluster: skipped (IDEM_TEST_REDIS_CLUSTER_URLS is not set)");
        return Ok(());
    };
    let urls: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let prefix = format!("idem-example-{}-{nanos}", std::process::id());

    // One executor per worker, each on its own connection to the cluster, as separate processes
    // would be; they share the records (same servers, same prefix). A short ttl and
    // garbage-collection margin keep a shared cluster clean.
    let policy = Policy::builder().ttl(Duration::from_secs(600)).build()?;
    let mut executors = Vec::new();
    for _ in 0..=WORKERS {
        let store = RedisStore::connect_cluster(&urls)
            .await?
            .with_prefix(&prefix)?;
        check(store.is_cluster(), "the store runs on a cluster")?;
        let store = store.with_gc_margin(Duration::from_secs(60));
        executors.push(Executor::new(store).with_policy(policy));
    }
    let scope = Scope::from_parts(["tenant-acme", "charge"])?;
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());

    for k in 0..KEYS {
        let key = IdempotencyKey::for_step("wf-8812", &format!("step-{k}"), "charge")?;
        let fingerprint = Fingerprint::of("charge", &json!({"account": "A-7", "cents": 100 * k}))?;
        // The race: every worker at once.
        let mut racers = Vec::new();
        for executor in &executors[..WORKERS] {
            let executor = executor.clone();
            let (scope, key, fingerprint, runs) = (
                scope.clone(),
                key.clone(),
                fingerprint.clone(),
                runs.clone(),
            );
            racers.push(tokio::spawn(async move {
                executor
                    .run(&scope, &key, &fingerprint, |_attempt| async move {
                        let n = runs[k].fetch_add(1, Ordering::SeqCst) + 1; // the charge
                        Outcome::definitive_json(201, json!({"charge_id": format!("ch_{k}_{n}")}))
                    })
                    .await
            }));
        }
        let (mut executed, mut replayed, mut in_flight, mut answer) = (0, 0, 0, None);
        for racer in racers {
            match racer.await? {
                Ok(Execution::Executed { outcome, .. }) => {
                    (executed, answer) = (executed + 1, Some(outcome))
                }
                Ok(Execution::Replayed { .. }) => replayed += 1,
                Err(Error::InFlight { .. }) => in_flight += 1, // a real caller retries later
                Err(e) => return Err(e.into()),
            }
        }
        // After the race: a late caller gets the stored answer, and runs nothing.
        let late = executors[WORKERS]
            .run(&scope, &key, &fingerprint, |_| async {
                unreachable!("already ran")
            })
            .await?;
        println!(
            "{key}: {executed} ran, {replayed} replayed, {in_flight} in flight; then replayed: {}",
            late.is_replay()
        );
        check(executed == 1, "exactly one racing call ran the operation")?;
        check(
            late.is_replay() && Some(late.outcome()) == answer.as_ref(),
            "the late call replays the answer",
        )?;
    }
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    println!("runs per operation: {counts:?}");
    check(
        counts.iter().all(|&n| n == 1),
        "each operation ran exactly once",
    )?;
    println!("redis_cluster: ok");
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("redis_cluster: FAILED: {what}").into())
    }
}
