//! What `NOTIFY` costs first executions (claim + complete of distinct keys). A completion
//! notifies the waiters of a record one of them marked (`waited`) in its own statement
//! (`pg_notify`), and PostgreSQL serialises the commits of notifying transactions on one
//! database-wide lock, held through the commit's WAL flush. Three ways to complete, interleaved
//! batch by batch on one pool and one table, at 1, 8 and 32 concurrent callers:
//!
//! - `no NOTIFY`: the completion statement without its `pg_notify` (the floor);
//! - `nobody waits`: the store as shipped, its `LISTEN` session open, on records nobody waited
//!   on (what most first executions are): the completion calls no `pg_notify`;
//! - `every record waited`: the same store, each record marked as a waiter marks it (one more
//!   `UPDATE` per operation, as a waiter's first wait makes) before the completion, which then
//!   notifies, delivered to the store's listener.
//!
//! Printed per variant: completions per second (median over batches) and latency of one claim +
//! complete (p50, p99 over every operation of every batch), with ratios to the floor.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo bench -p idem-store-postgres --bench notify
//! ```
//!
//! `IDEM_BENCH_OPS` sets the operations per batch (default 640, rounded up to a multiple of 32;
//! 6 batches per variant and concurrency). Without `IDEM_TEST_POSTGRES_URL` it prints why and
//! exits; without `--bench` (`cargo test --benches`) it does nothing.

use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::store::columns::{timestamp_to_column, to_column};
use idem_core::wait::Timer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, SystemClock, Timestamp,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, postgres::PgPoolOptions};

const SCHEMA: &str = "idem_bench";
const TABLE: &str = "idem_notify";
const BATCHES: usize = 6;
const CALLERS: [usize; 3] = [1, 8, 32];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Plain,
    Quiet,
    Marked,
}

const VARIANTS: [(Variant, &str); 3] = [
    (Variant::Plain, "no NOTIFY"),
    (Variant::Quiet, "nobody waits"),
    (Variant::Marked, "every record waited"),
];

#[derive(Clone)]
struct Bench {
    store: PostgresStore,
    /// The store's completion statement without `pg_notify`.
    plain_complete: String,
    /// What a waiter's first wait writes.
    mark: String,
    run: String,
    fingerprint: Fingerprint,
    outcome: Outcome,
    policy: Policy,
}

impl Bench {
    /// One first execution: claim a fresh key, then complete it as `variant` does.
    async fn one(&self, variant: Variant, round: usize, i: usize) -> Duration {
        let began = Instant::now();
        let store = &self.store;
        let scope = Scope::new(format!("bench-{}-{variant:?}-{round}", self.run)).unwrap();
        let key = IdempotencyKey::new(format!("k-{i}")).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        let now = Timestamp::now();
        let ClaimAnswer::Claimed { token, .. } = store
            .claim(&id, &self.fingerprint, &self.policy, now)
            .await
            .unwrap()
        else {
            panic!("fresh key not claimed")
        };
        if variant == Variant::Marked {
            sqlx::query(AssertSqlSafe(self.mark.clone()))
                .bind(scope.as_str())
                .bind(key.as_str())
                .execute(store.pool())
                .await
                .unwrap();
        }
        if variant == Variant::Plain {
            let updated = sqlx::query(AssertSqlSafe(self.plain_complete.clone()))
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(to_column(token.seq))
                .bind(token.id_hex())
                .bind(timestamp_to_column(now))
                .bind("completed")
                .bind(i32::from(self.outcome.status()))
                .bind(self.outcome.body())
                .bind(self.outcome.class().as_str())
                .bind(timestamp_to_column(now + self.policy.ttl()))
                .execute(store.pool())
                .await
                .unwrap()
                .rows_affected();
            assert_eq!(updated, 1);
        } else {
            store
                .complete(&id, token, &self.outcome, &self.policy, now)
                .await
                .unwrap();
        }
        began.elapsed()
    }

    /// `ops` first executions over `callers` concurrent tasks: the wall time and each latency.
    async fn batch(
        &self,
        variant: Variant,
        round: usize,
        ops: usize,
        callers: usize,
    ) -> (Duration, Vec<Duration>) {
        let per_caller = ops / callers;
        let start = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|c| {
                let bench = self.clone();
                tokio::spawn(async move {
                    let mut took = Vec::with_capacity(per_caller);
                    for i in c * per_caller..(c + 1) * per_caller {
                        took.push(bench.one(variant, round, i).await);
                    }
                    took
                })
            })
            .collect();
        let mut all = Vec::with_capacity(ops);
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        (start.elapsed(), all)
    }
}

/// The `p`-th percentile (nearest rank) of sorted `v`.
fn percentile(v: &[Duration], p: usize) -> Duration {
    v[(v.len() * p).div_ceil(100).max(1) - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Opens `store`'s `LISTEN` session: a wait on a record in flight, then its completion.
async fn listen(store: &PostgresStore, bench: &Bench) {
    let id = RecordId::new(
        Scope::new(format!("bench-{}-listen", bench.run)).unwrap(),
        IdempotencyKey::new("k").unwrap(),
    );
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&id, &bench.fingerprint, &bench.policy, now)
        .await
        .unwrap()
    else {
        panic!("fresh key not claimed")
    };
    let seen = store.get(&id, now).await.unwrap().unwrap();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_for_change(&seen, &SystemClock, &Timer::tokio())
                .await
                .unwrap();
        })
    };
    while store.wait_subscriptions() == 0 {
        tokio::task::yield_now().await;
    }
    store
        .complete(&id, token, &bench.outcome, &bench.policy, now)
        .await
        .unwrap();
    waiting.await.unwrap();
    assert_eq!(store.listen_connections_opened(), 1);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches` / `--list`: minutes of commits are not a test
    }
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        eprintln!("skipping the benchmark: IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    let ops = std::env::var("IDEM_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(640)
        .div_ceil(32)
        * 32;
    let pool = PgPoolOptions::new()
        .max_connections(32)
        .min_connections(32)
        .connect(&url)
        .await
        .expect("connect");
    let store = PostgresStore::with_table(pool.clone(), SCHEMA, TABLE).unwrap();
    store.migrate().await.expect("migrate");
    let table = store.qualified_table().to_owned();
    let bench = Bench {
        store: store.with_notifications(true),
        mark: format!(
            "UPDATE {table} SET waited = true WHERE scope = $1 AND key = $2 AND NOT waited"
        ),
        plain_complete: format!(
            "UPDATE {table} SET state = $6, outcome_status = $7, outcome_body = $8, \
             outcome_class = $9, updated_at = $5, expires_at = $10, \
             checkpoints = CASE WHEN $6 = 'completed' THEN NULL ELSE checkpoints END \
             WHERE scope = $1 AND key = $2 AND state = 'processing' AND token_seq = $3 \
             AND token_id = $4 AND expires_at > $5"
        ),
        run: format!("{:08x}", rand::random::<u32>()),
        fingerprint: Fingerprint::of("create_ticket", &serde_json::json!({"title": "bench"}))
            .unwrap(),
        outcome: Outcome::definitive(
            201,
            &serde_json::json!({"ticket_id": "T-1", "status": "open"}),
        )
        .unwrap(),
        policy: Policy::default(),
    };
    listen(&bench.store, &bench).await;

    // Warm-up: prepared statements on every connection.
    for (variant, _) in VARIANTS {
        bench.batch(variant, 0, ops, 32).await;
    }

    println!(
        "NOTIFY's cost on first executions (claim + complete, distinct keys): {BATCHES} interleaved batches of {ops} per variant"
    );
    println!(
        "{:<8} {:<22} | {:>9} {:>9} {:>9} | ratio to no NOTIFY: ops/s, p50, p99",
        "callers", "completion", "ops/s", "p50 µs", "p99 µs"
    );
    for (n, callers) in CALLERS.into_iter().enumerate() {
        let mut walls = vec![Vec::new(); VARIANTS.len()];
        let mut took = vec![Vec::new(); VARIANTS.len()];
        for batch in 1..=BATCHES {
            let round = n * 100 + batch;
            // Each variant goes first in turn, so drift in the machine's load hits all alike.
            for k in 0..VARIANTS.len() {
                let v = (batch + k) % VARIANTS.len();
                let (wall, all) = bench.batch(VARIANTS[v].0, round, ops, callers).await;
                walls[v].push(ops as f64 / wall.as_secs_f64());
                took[v].extend(all);
            }
        }
        let mut rows = Vec::new();
        for v in 0..VARIANTS.len() {
            walls[v].sort_by(f64::total_cmp);
            took[v].sort();
            rows.push((
                walls[v][walls[v].len() / 2],
                percentile(&took[v], 50),
                percentile(&took[v], 99),
            ));
        }
        let (base_rate, base_50, base_99) = rows[0];
        for (v, (rate, p50, p99)) in rows.into_iter().enumerate() {
            println!(
                "{callers:<8} {:<22} | {rate:>9.0} {:>9.0} {:>9.0} | ×{:.2} ×{:.2} ×{:.2}",
                VARIANTS[v].1,
                micros(p50),
                micros(p99),
                rate / base_rate,
                p50.as_secs_f64() / base_50.as_secs_f64(),
                p99.as_secs_f64() / base_99.as_secs_f64(),
            );
        }
    }

    // Only this run's rows.
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE scope LIKE $1"
    )))
    .bind(format!("bench-{}-%", bench.run))
    .execute(bench.store.pool())
    .await
    .unwrap();
}
