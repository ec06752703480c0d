//! idem's first execution (claim + complete) and replay against the raw statements a hand-written
//! idempotency table would run, on the same pool and the same table, single task and 8 concurrent
//! tasks. Prints mean latencies and ratios (idem / raw).
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo bench -p idem-store-postgres --bench postgres
//! ```
//!
//! `IDEM_BENCH_OPS` sets the operations per batch (default 200; 20 batches per figure). Without
//! `IDEM_TEST_POSTGRES_URL` it prints why and exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, Timestamp,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, PgPool, postgres::PgPoolOptions};

const SCHEMA: &str = "idem_bench";
const TABLE: &str = "idem_records";
/// Measured batches per comparison; idem and raw alternate batch by batch (and which goes first),
/// so drift in the machine's load affects both alike.
const BATCHES: usize = 20;
const COLUMNS: &str = "scope, key, fingerprint, state, token_seq, token_id, attempt, \
     lease_until, outcome_status, outcome_body, outcome_class, created_at, updated_at, expires_at";

#[derive(Clone)]
struct Bench {
    store: PostgresStore,
    pool: PgPool,
    run: String,
    fingerprint: Fingerprint,
    outcome: Outcome,
    policy: Policy,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    IdemFirst,
    RawFirst,
    IdemReplay,
    RawReplay,
}

impl Bench {
    fn key(&self, what: &str, i: usize) -> (Scope, IdempotencyKey) {
        (
            Scope::new(format!("bench-{}-{what}", self.run)).unwrap(),
            IdempotencyKey::new(format!("k-{i}")).unwrap(),
        )
    }

    async fn one(&self, op: Op, round: usize, i: usize) {
        let now = Timestamp::now();
        match op {
            Op::IdemFirst => {
                let (scope, key) = self.key(&format!("idem-{round}"), i);
                let id = RecordId::new(scope.clone(), key.clone());
                let ClaimAnswer::Claimed { token, .. } = self
                    .store
                    .claim(&id, &self.fingerprint, &self.policy, now)
                    .await
                    .unwrap()
                else {
                    panic!("fresh key not claimed")
                };
                self.store
                    .complete(&id, token, &self.outcome, &self.policy, now)
                    .await
                    .unwrap();
            }
            Op::RawFirst => {
                let (scope, key) = self.key(&format!("raw-{round}"), i);
                let now_ms = now.as_millis() as i64;
                let inserted = sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {SCHEMA}.{TABLE} ({COLUMNS}) VALUES ($1, $2, $3, 'processing', 1, $4, 1, \
                     $5, NULL, NULL, NULL, $6, $6, $7) ON CONFLICT (scope, key) DO NOTHING"
                )))
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(self.fingerprint.as_str())
                .bind(format!("{:032x}", rand::random::<u128>()))
                .bind(now_ms + 30_000)
                .bind(now_ms)
                .bind(now_ms + 86_400_000)
                .execute(&self.pool)
                .await
                .unwrap()
                .rows_affected();
                assert_eq!(inserted, 1);
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE {SCHEMA}.{TABLE} SET state = 'completed', outcome_status = $3, \
                     outcome_body = $4, outcome_class = 'definitive', updated_at = $5, expires_at = $6 \
                     WHERE scope = $1 AND key = $2"
                )))
                .bind(scope.as_str())
                .bind(key.as_str())
                .bind(i32::from(self.outcome.status()))
                .bind(self.outcome.body())
                .bind(now_ms)
                .bind(now_ms + 86_400_000)
                .execute(&self.pool)
                .await
                .unwrap();
            }
            Op::IdemReplay => {
                let (scope, key) = self.key("idem-0", i);
                let answer = self
                    .store
                    .claim(
                        &RecordId::new(scope.clone(), key.clone()),
                        &self.fingerprint,
                        &self.policy,
                        now,
                    )
                    .await
                    .unwrap();
                assert!(matches!(answer, ClaimAnswer::Replay(_)), "{answer:?}");
            }
            Op::RawReplay => {
                let (scope, key) = self.key("raw-0", i);
                let row = sqlx::query(AssertSqlSafe(format!(
                    "SELECT {COLUMNS} FROM {SCHEMA}.{TABLE} WHERE scope = $1 AND key = $2"
                )))
                .bind(scope.as_str())
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await
                .unwrap();
                assert!(row.is_some());
            }
        }
    }

    /// Mean latency of `ops` operations spread over `tasks` concurrent tasks.
    async fn measure(&self, op: Op, round: usize, ops: usize, tasks: usize) -> Duration {
        let per_task = ops / tasks;
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let bench = self.clone();
                tokio::spawn(async move {
                    let mut total = Duration::ZERO;
                    for i in t * per_task..(t + 1) * per_task {
                        let began = Instant::now();
                        bench.one(op, round, i).await;
                        total += began.elapsed();
                    }
                    total
                })
            })
            .collect();
        let mut total = Duration::ZERO;
        for h in handles {
            total += h.await.unwrap();
        }
        let _wall = start.elapsed();
        total / u32::try_from(per_task * tasks).unwrap()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / `--list`: nothing to run
    }
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        eprintln!("skipping the benchmark: IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    let ops: usize = std::env::var("IDEM_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .min_connections(8)
        .connect(&url)
        .await
        .expect("connect");
    let store = PostgresStore::with_table(pool.clone(), SCHEMA, TABLE).unwrap();
    store.migrate().await.expect("migrate");
    let bench = Arc::new(Bench {
        store,
        pool: pool.clone(),
        run: format!("{:08x}", rand::random::<u32>()),
        fingerprint: Fingerprint::of("create_ticket", &serde_json::json!({"title": "bench"}))
            .unwrap(),
        outcome: Outcome::definitive(
            201,
            &serde_json::json!({"ticket_id": "T-1", "status": "open"}),
        )
        .unwrap(),
        policy: Policy::default(),
    });

    // Warm-up: prepared statements on every connection, and the keys the replays read.
    for op in [Op::IdemFirst, Op::RawFirst] {
        bench.measure(op, 0, ops, 8).await;
    }

    println!(
        "idem-store-postgres benchmark: mean latency per operation, median over {BATCHES} interleaved batches of {ops}"
    );
    println!(
        "{:<42} {:>10} {:>10} {:>7}",
        "", "idem µs", "raw µs", "ratio"
    );
    for tasks in [1, 8] {
        for (name, idem, raw) in [
            (
                "first execution (claim+complete)",
                Op::IdemFirst,
                Op::RawFirst,
            ),
            ("replay", Op::IdemReplay, Op::RawReplay),
        ] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for batch in 1..=BATCHES {
                let round = batch + tasks * 100;
                if batch % 2 == 0 {
                    a.push(bench.measure(idem, round, ops, tasks).await);
                    b.push(bench.measure(raw, round, ops, tasks).await);
                } else {
                    b.push(bench.measure(raw, round, ops, tasks).await);
                    a.push(bench.measure(idem, round, ops, tasks).await);
                }
            }
            let (a, b) = (median(a), median(b));
            println!(
                "{:<42} {:>10.1} {:>10.1} {:>6.2}x",
                format!("{name}, {tasks} task{}", if tasks == 1 { "" } else { "s" }),
                micros(a),
                micros(b),
                a.as_secs_f64() / b.as_secs_f64()
            );
        }
    }

    // Only this run's rows.
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {SCHEMA}.{TABLE} WHERE scope LIKE $1"
    )))
    .bind(format!("bench-{}-%", bench.run))
    .execute(&pool)
    .await
    .unwrap();
}
