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
//! SQLite and PostgreSQL also get a row where the holder completes in a transaction of its own
//! (`complete_in`, then commit, then `Attempt::mark_recorded`, as `idem serve` does), woken by
//! notification: its wake-up is measured from the call of the transaction's commit.
//! 3. `idem serve` itself (the binary on `127.0.0.1:0`, `--tool-latency-ms 300`), per backend
//!    with tickets (SQLite, PostgreSQL): a retry sent 10 ms after the first request, from a
//!    client of its own, both with `Prefer: wait=5`; measured from the first answer to the
//!    other's. 100 pairs, 10 at a time.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem-cli --bench wake
//! ```
//! A backend whose variable is unset is left out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idemkit::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idemkit::postgres::PostgresStore;
use idemkit::sqlite::SqliteStore;
use idemkit::sqlite::rusqlite::TransactionBehavior;
use idemkit::store::ListFilter;
use idemkit::{
    Attempt, ClaimKind, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome,
    Policy, Record, RecordId, Scope, StoreError, SystemClock, Timestamp, Token, async_trait,
};
use serde_json::json;

const SAMPLES: usize = 100;
const BATCH: usize = 10;
const TOOL: Duration = Duration::from_millis(300);
const RETRY_AFTER: Duration = Duration::from_millis(10);
const HOLD: Duration = Duration::from_millis(50);

type Pair = (Arc<dyn KeyStore>, Arc<dyn KeyStore>);

/// How the holder completes: the store's own `complete`, or `complete_in` on a transaction of its
/// own on the holder's handle.
#[derive(Clone)]
enum Completion {
    Store,
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl Completion {
    fn name(&self) -> &'static str {
        match self {
            Self::Store => "complete",
            _ => "complete_in",
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rows = Vec::new();
        for (backend, notified, polled, transactional) in backends().await {
            let plain: Pair = (polled.0, Arc::new(Plain(polled.1)));
            let mut runs = vec![
                ("notification", notified.clone(), Completion::Store),
                ("polling", plain, Completion::Store),
            ];
            if let Some(completion) = transactional {
                runs.push(("notification", notified, completion));
            }
            for (how, pair, completion) in runs {
                let wake = wake_up(&pair, &completion).await;
                let retry = retry_pairs(&pair, &completion).await;
                rows.push((backend, how, completion.name(), wake, retry));
            }
        }
        let mut served = Vec::new();
        for (backend, url) in serve_urls() {
            served.push((backend, serve_pairs(&url).await));
        }
        println!("{SAMPLES} samples each, {BATCH} keys at a time; waiter on a handle of its own");
        println!(
            "{:<9} {:<13} {:<11} | wake-up from the commit's call: p50 / p99 | retry 10 ms into a 300 ms tool, gap to first answer: p50 / p99 / max",
            "backend", "woken by", "completion"
        );
        for (backend, how, completion, mut wake, mut retry) in rows {
            let (w50, w99, _) = stats(&mut wake);
            let (r50, r99, rmax) = stats(&mut retry);
            println!(
                "{backend:<9} {how:<13} {completion:<11} | {w50:>9.2?} / {w99:>9.2?} | {r50:>9.2?} / {r99:>9.2?} / {rmax:>9.2?}"
            );
        }
        println!(
            "idem serve, 300 ms tool: a retry 10 ms after the first request (Prefer: wait=5), gap between the answers: p50 / p99 / max"
        );
        for (backend, mut gaps) in served {
            let (g50, g99, gmax) = stats(&mut gaps);
            println!("{backend:<9} | {g50:>9.2?} / {g99:>9.2?} / {gmax:>9.2?}");
        }
    });
}

fn stats(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |p: usize| v[(v.len() * p).div_ceil(100).max(1) - 1];
    (at(50), at(99), v[v.len() - 1])
}

/// What [`backends`] gives per backend: its name, the two handles for notification, two more
/// for polling, and the transactional completion on the first notification handle, if any.
type Configured = (&'static str, Pair, Pair, Option<Completion>);

/// Every backend configured.
async fn backends() -> Vec<Configured> {
    let mut out: Vec<Configured> = Vec::new();
    let memory = MemoryStore::new();
    out.push((
        "memory",
        (Arc::new(memory.clone()), Arc::new(memory.clone())),
        (Arc::new(memory.clone()), Arc::new(memory)),
        None,
    ));
    let dir = std::env::temp_dir().join(format!("idem-wake-bench-{}.db", std::process::id()));
    let sqlite = || {
        let s = SqliteStore::open(&dir).unwrap();
        s.migrate().unwrap();
        s
    };
    let holder = sqlite();
    out.push((
        "sqlite",
        (Arc::new(holder.clone()), Arc::new(sqlite())),
        (Arc::new(sqlite()), Arc::new(sqlite())),
        Some(Completion::Sqlite(holder)),
    ));
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        let pg = || async {
            let s = PostgresStore::connect(&url).await.unwrap();
            s.migrate().await.unwrap();
            s
        };
        let holder = pg().await;
        let dyn_pg = |s: PostgresStore| Arc::new(s) as Arc<dyn KeyStore>;
        out.push((
            "postgres",
            (dyn_pg(holder.clone()), dyn_pg(pg().await)),
            (dyn_pg(pg().await), dyn_pg(pg().await)),
            Some(Completion::Postgres(holder)),
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
        out.push((
            "redis",
            (r().await, r().await),
            (r().await, r().await),
            None,
        ));
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

/// Completes the claim `token` of (scope, key) on A as `completion` says; returns when the
/// completion's commit was called (`complete`'s call: its commit is inside it).
async fn complete(
    a: &Arc<dyn KeyStore>,
    completion: &Completion,
    (scope, key): (&Scope, &IdempotencyKey),
    token: Token,
) -> Instant {
    let p = policy();
    let claim = ClaimAnswer::Claimed {
        token,
        attempt: 1,
        kind: ClaimKind::New,
    };
    let attempt = || {
        Executor::from_arc(a.clone())
            .with_policy(p)
            .attempt_for(scope, key, &claim)
            .unwrap()
    };
    match completion {
        Completion::Store => {
            let called = Instant::now();
            let now = idemkit::Clock::now(&SystemClock);
            let id = RecordId::new(scope.clone(), key.clone());
            a.complete(&id, token, &ticket(), &p, now).await.unwrap();
            called
        }
        Completion::Sqlite(store) => {
            let (store, attempt) = (store.clone(), attempt());
            let holder = store.clone();
            holder
                .with_connection(move |conn| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .unwrap();
                    let done = store.complete_in(&tx, &attempt, &ticket()).unwrap();
                    assert_eq!(done, CompleteAnswer::Completed);
                    let called = Instant::now();
                    tx.commit().unwrap();
                    attempt.mark_recorded();
                    called
                })
                .await
                .unwrap()
        }
        Completion::Postgres(store) => {
            let attempt = attempt();
            let mut tx = store.pool().begin().await.unwrap();
            let done = store
                .complete_in(&mut tx, &attempt, &ticket())
                .await
                .unwrap();
            assert_eq!(done, CompleteAnswer::Completed);
            let called = Instant::now();
            tx.commit().await.unwrap();
            attempt.mark_recorded();
            called
        }
    }
}

/// From the call of the completion's commit on A to the replay of a request waiting on B.
async fn wake_up((a, b): &Pair, completion: &Completion) -> Vec<Duration> {
    let p = policy();
    let waiting = Executor::from_arc(b.clone())
        .with_policy(p)
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (a, waiting, completion) = (a.clone(), waiting.clone(), completion.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("wake", batch * BATCH + i);
                    let now = idemkit::Clock::now(&SystemClock);
                    let token = match a
                        .claim(&RecordId::new(scope.clone(), key.clone()), &fp, &p, now)
                        .await
                        .unwrap()
                    {
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
                    let called = complete(&a, &completion, (&scope, &key), token).await;
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

/// The first request's operation: the tool's 300 ms, then its answer, recorded by the executor
/// or, with a transactional completion, in a transaction of the operation's own.
async fn tool(attempt: Attempt, completion: Completion) -> Outcome {
    tokio::time::sleep(TOOL).await;
    match completion {
        Completion::Store => {}
        Completion::Sqlite(store) => {
            store
                .clone()
                .with_connection(move |conn| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .unwrap();
                    store.complete_in(&tx, &attempt, &ticket()).unwrap();
                    tx.commit().unwrap();
                    attempt.mark_recorded();
                })
                .await
                .unwrap();
        }
        Completion::Postgres(store) => {
            let mut tx = store.pool().begin().await.unwrap();
            store
                .complete_in(&mut tx, &attempt, &ticket())
                .await
                .unwrap();
            tx.commit().await.unwrap();
            attempt.mark_recorded();
        }
    }
    ticket()
}

/// A retry sent 10 ms after the first request of a 300 ms tool: from the first answer to the
/// retry's replay.
async fn retry_pairs((a, b): &Pair, completion: &Completion) -> Vec<Duration> {
    let first = Executor::from_arc(a.clone()).with_policy(policy());
    let retry = Executor::from_arc(b.clone())
        .with_policy(policy())
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (first, retry, completion) = (first.clone(), retry.clone(), completion.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("retry", batch * BATCH + i);
                    let (started, running) = tokio::sync::oneshot::channel();
                    let holder = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            first
                                .run(&scope, &key, &fp, |attempt| async {
                                    let _ = started.send(());
                                    tool(attempt, completion).await
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

/// The store URLs `idem serve` is measured on: a fresh SQLite file, and PostgreSQL if configured.
fn serve_urls() -> Vec<(&'static str, String)> {
    let file = std::env::temp_dir().join(format!("idem-wake-serve-{}.db", std::process::id()));
    let mut out = vec![("sqlite", format!("sqlite://{}", file.display()))];
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        out.push(("postgres", url));
    }
    out
}

/// A running `idem serve` child process, killed on drop.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `idem serve` on `url` with a 300 ms tool, the binary itself: the first request, and 10 ms
/// later a retry from a client of its own, both with `Prefer: wait=5`; the gap between their
/// answers.
async fn serve_pairs(url: &str) -> Vec<Duration> {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--addr", "127.0.0.1:0", "--store", url])
        .args(["--tool-latency-ms", &TOOL.as_millis().to_string()])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _served = Served(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("idem: serving POST ") {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("idem serve prints its address");
    let client = || reqwest::Client::builder().build().unwrap();
    let (first, retry) = (client(), client());
    let run = format!("{:x}", std::process::id());
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (first, retry, base) = (first.clone(), retry.clone(), base.clone());
                let (_, key, _) = ids(&format!("serve-{run}"), batch * BATCH + i);
                tokio::spawn(async move {
                    // Both ask to wait: on a busy machine the retry can come first.
                    let send = |client: reqwest::Client| {
                        let (base, key) = (base.clone(), key.clone());
                        async move {
                            let answer = client
                                .post(base)
                                .header("content-type", "application/json")
                                .header("x-tenant-id", "bench")
                                .header("idempotency-key", key.as_str())
                                .header("prefer", "wait=5")
                                .body(r#"{"title": "Printer on fire", "account_id": "A-7"}"#)
                                .send()
                                .await
                                .unwrap();
                            assert_eq!(answer.status(), 201);
                            let replayed = answer.headers().contains_key("idempotency-replayed");
                            answer.bytes().await.unwrap();
                            (replayed, Instant::now())
                        }
                    };
                    let first = tokio::spawn(send(first));
                    tokio::time::sleep(RETRY_AFTER).await;
                    let (again, again_at) = send(retry).await;
                    let (first, first_at) = first.await.unwrap();
                    assert!(first != again, "one execution and one replay");
                    if again {
                        again_at.saturating_duration_since(first_at)
                    } else {
                        first_at.saturating_duration_since(again_at)
                    }
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
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.0.claim(id, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.0.complete(id, token, outcome, policy, now).await
    }
    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.0.release(id, token, now).await
    }
    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.0.extend(id, token, lease, now).await
    }
    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.0.get(id, now).await
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
