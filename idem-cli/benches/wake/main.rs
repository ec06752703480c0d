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

mod plain;
mod serve;
mod store;

use plain::Plain;
use serve::{serve_pairs, serve_urls};
use store::{retry_pairs, wake_up};
