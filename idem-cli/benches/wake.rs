//! How fast a waiting request is woken, per backend, by notification and by polling, side by
//! side in one run. Every waiter uses a store handle of its own (its own connections: another
//! process, as far as the store can tell); "polling" is the same store behind a wrapper that
//! forwards only the required methods, so it is waited on by the portable `get` with backoff.
//!
//! 1. Wake-up: the holder claims on handle A, the waiter waits on handle B; 50 ms later the
//!    holder completes. Measured: from the call of `complete` (its commit is inside it) to the
//!    waiter's replay. 100 samples, 10 keys at a time.
//! 2. The issue's target: a retry sent 10 ms after the first request of a 300 ms tool began to
//!    run; measured
//!    from the first request's answer to the retry's replay. 100 pairs, 10 at a time.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem-cli --bench wake
//! ```
//! A backend whose variable is unset is left out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemkit::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idemkit::store::ListFilter;
use idemkit::{
    Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome, Policy, Record, Scope,
    StoreError, SystemClock, Timestamp, Token, async_trait,
};
use serde_json::json;

const SAMPLES: usize = 100;
const BATCH: usize = 10;
const TOOL: Duration = Duration::from_millis(300);
const RETRY_AFTER: Duration = Duration::from_millis(10);
const HOLD: Duration = Duration::from_millis(50);

type Pair = (Arc<dyn KeyStore>, Arc<dyn KeyStore>);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rows = Vec::new();
        for (backend, notified, polled) in backends().await {
            let plain: Pair = (polled.0, Arc::new(Plain(polled.1)));
            for (how, pair) in [("notification", notified), ("polling", plain)] {
                let wake = wake_up(&pair).await;
                let retry = retry_pairs(&pair).await;
                rows.push((backend, how, wake, retry));
            }
        }
        println!("{SAMPLES} samples each, {BATCH} keys at a time; waiter on a handle of its own");
        println!(
            "{:<9} {:<13} | wake-up from complete: p50 / p99 | retry 10 ms into a 300 ms tool, gap to first answer: p50 / p99 / max",
            "backend", "woken by"
        );
        for (backend, how, mut wake, mut retry) in rows {
            let (w50, w99, _) = stats(&mut wake);
            let (r50, r99, rmax) = stats(&mut retry);
            println!(
                "{backend:<9} {how:<13} | {w50:>9.2?} / {w99:>9.2?} | {r50:>9.2?} / {r99:>9.2?} / {rmax:>9.2?}"
            );
        }
    });
}

fn stats(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |p: usize| v[(v.len() * p).div_ceil(100).max(1) - 1];
    (at(50), at(99), v[v.len() - 1])
}

/// (name, the two handles for notification, two more for polling) per backend configured.
async fn backends() -> Vec<(&'static str, Pair, Pair)> {
    let mut out: Vec<(&'static str, Pair, Pair)> = Vec::new();
    let memory = MemoryStore::new();
    out.push((
        "memory",
        (Arc::new(memory.clone()), Arc::new(memory.clone())),
        (Arc::new(memory.clone()), Arc::new(memory)),
    ));
    let dir = std::env::temp_dir().join(format!("idem-wake-bench-{}.db", std::process::id()));
    let sqlite = || {
        use idemkit::sqlite::SqliteStore;
        let s = SqliteStore::open(&dir).unwrap();
        s.migrate().unwrap();
        Arc::new(s) as Arc<dyn KeyStore>
    };
    out.push(("sqlite", (sqlite(), sqlite()), (sqlite(), sqlite())));
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        use idemkit::postgres::PostgresStore;
        let pg = || async {
            let s = PostgresStore::connect(&url).await.unwrap();
            s.migrate().await.unwrap();
            Arc::new(s) as Arc<dyn KeyStore>
        };
        out.push((
            "postgres",
            (pg().await, pg().await),
            (pg().await, pg().await),
        ));
    }
    if let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") {
        use idemkit::redis::RedisStore;
        let prefix = format!("idem-wake-bench-{}", std::process::id());
        let r = || async {
            let s = RedisStore::connect(&url)
                .await
                .unwrap()
                .with_prefix(&prefix)
                .unwrap();
            Arc::new(s) as Arc<dyn KeyStore>
        };
        out.push(("redis", (r().await, r().await), (r().await, r().await)));
    }
    out
}

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn ids(run: &str, i: usize) -> (Scope, IdempotencyKey, Fingerprint) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    (
        Scope::new("bench/create_ticket").unwrap(),
        IdempotencyKey::new(format!("{run}:{nanos}:{i}")).unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

fn ticket() -> Outcome {
    Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap()
}

/// From the call of `complete` on A to the replay of a request waiting on B.
async fn wake_up((a, b): &Pair) -> Vec<Duration> {
    let p = policy();
    let waiting = Executor::from_arc(b.clone())
        .with_policy(p)
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (a, waiting) = (a.clone(), waiting.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("wake", batch * BATCH + i);
                    let now = idemkit::Clock::now(&SystemClock);
                    let token = match a.claim(&scope, &key, &fp, &p, now).await.unwrap() {
                        ClaimAnswer::Claimed { token, .. } => token,
                        other => panic!("{other:?}"),
                    };
                    let waiter = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            let again = waiting
                                .run(&scope, &key, &fp, |_| async { unreachable!() })
                                .await
                                .unwrap();
                            assert!(again.is_replay());
                            Instant::now()
                        })
                    };
                    tokio::time::sleep(HOLD).await;
                    let called = Instant::now();
                    let now = idemkit::Clock::now(&SystemClock);
                    a.complete(&scope, &key, token, &ticket(), &p, now)
                        .await
                        .unwrap();
                    waiter.await.unwrap().saturating_duration_since(called)
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.unwrap());
        }
    }
    out
}

/// A retry sent 10 ms after the first request of a 300 ms tool: from the first answer to the
/// retry's replay.
async fn retry_pairs((a, b): &Pair) -> Vec<Duration> {
    let first = Executor::from_arc(a.clone()).with_policy(policy());
    let retry = Executor::from_arc(b.clone())
        .with_policy(policy())
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (first, retry) = (first.clone(), retry.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("retry", batch * BATCH + i);
                    let (started, running) = tokio::sync::oneshot::channel();
                    let holder = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            first
                                .run(&scope, &key, &fp, |_| async {
                                    let _ = started.send(());
                                    tokio::time::sleep(TOOL).await;
                                    ticket()
                                })
                                .await
                                .unwrap();
                            Instant::now()
                        })
                    };
                    // 10 ms after the first request began to run (on a busy machine a fixed
                    // 10 ms from its spawn could come before its claim).
                    running.await.unwrap();
                    tokio::time::sleep(RETRY_AFTER).await;
                    let again = retry
                        .run(&scope, &key, &fp, |_| async { unreachable!() })
                        .await
                        .unwrap();
                    let answered = Instant::now();
                    assert!(again.is_replay());
                    answered.saturating_duration_since(holder.await.unwrap())
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.unwrap());
        }
    }
    out
}

/// A store behind a wrapper that forwards only the required methods: waited on by polling.
#[derive(Debug)]
struct Plain(Arc<dyn KeyStore>);

#[async_trait]
impl KeyStore for Plain {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.0.claim(scope, key, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.0
            .complete(scope, key, token, outcome, policy, now)
            .await
    }
    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.0.release(scope, key, token, now).await
    }
    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.0.extend(scope, key, token, lease, now).await
    }
    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        self.0.get(scope, key, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list(filter, now, limit).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(now, limit).await
    }
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
}
