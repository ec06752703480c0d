//! What running behind a transaction pooler costs: the store's first execution (claim +
//! complete) and replay in three set-ups on the same table, batches interleaved:
//!
//! - `direct`: a direct connection, prepared statements (the default);
//! - `inline`: the same direct connection with `with_transaction_pooler(true)`, every statement
//!   sent as one simple-protocol query with its values as literals (the price of the statements
//!   alone);
//! - `pgbouncer`: the same through PgBouncer in transaction mode (what a user behind it gets).
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_PGBOUNCER_URL=postgres://postgres@127.0.0.1:56432/test \
//!     cargo bench -p idem-store-postgres --bench pooler
//! ```
//!
//! `IDEM_BENCH_OPS` sets the operations per batch (default 200; 20 batches per figure).

use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, Timestamp,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{
    AssertSqlSafe, postgres::PgConnectOptions, postgres::PgPoolOptions,
};

const SCHEMA: &str = "idem_bench";
const TABLE: &str = "idem_records";
const BATCHES: usize = 20;

async fn store(url: &str, pooler: bool) -> PostgresStore {
    let options: PgConnectOptions = url.parse().expect("URL");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .min_connections(8)
        .connect_with(options.extra_float_digits(None))
        .await
        .expect("connect");
    PostgresStore::with_table(pool, SCHEMA, TABLE)
        .unwrap()
        .with_transaction_pooler(pooler)
}

struct Run {
    id: String,
    fingerprint: Fingerprint,
    outcome: Outcome,
    policy: Policy,
}

impl Run {
    fn key(&self, setup: usize, round: usize, i: usize) -> (Scope, IdempotencyKey) {
        (
            Scope::new(format!("bench-{}-{setup}-{round}", self.id)).unwrap(),
            IdempotencyKey::new(format!("k-{i}")).unwrap(),
        )
    }

    /// Mean latency of `ops` first executions (`replay`: claims of the keys of round 0) spread
    /// over `tasks` tasks.
    async fn measure(
        &self,
        store: &PostgresStore,
        setup: usize,
        replay: bool,
        round: usize,
        ops: usize,
        tasks: usize,
    ) -> Duration {
        let per_task = ops / tasks;
        let started = Instant::now();
        let work = (0..tasks).map(|t| async move {
            for i in t * per_task..(t + 1) * per_task {
                let now = Timestamp::now();
                let (scope, key) = self.key(setup, if replay { 0 } else { round }, i);
                let id = RecordId::new(scope.clone(), key.clone());
                let answer = store
                    .claim(&id, &self.fingerprint, &self.policy, now)
                    .await
                    .unwrap();
                match (replay, answer) {
                    (true, ClaimAnswer::Replay(_)) => {}
                    (false, ClaimAnswer::Claimed { token, .. }) => {
                        store
                            .complete(&id, token, &self.outcome, &self.policy, now)
                            .await
                            .unwrap();
                    }
                    (_, other) => panic!("unexpected {other:?}"),
                }
            }
        });
        futures_join(work).await;
        started.elapsed() * u32::try_from(tasks).unwrap() / u32::try_from(per_task * tasks).unwrap()
    }
}

/// Runs the futures concurrently on this task.
async fn futures_join<F: std::future::Future<Output = ()>>(work: impl Iterator<Item = F>) {
    let mut set = Vec::new();
    for f in work {
        set.push(Box::pin(f));
    }
    let mut pending: Vec<_> = set.into_iter().collect();
    std::future::poll_fn(|cx| {
        pending.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let (Ok(direct), Ok(pgbouncer)) = (
        std::env::var("IDEM_TEST_POSTGRES_URL"),
        std::env::var("IDEM_TEST_PGBOUNCER_URL"),
    ) else {
        eprintln!(
            "skipping the benchmark: IDEM_TEST_POSTGRES_URL and IDEM_TEST_PGBOUNCER_URL must be set"
        );
        return;
    };
    let ops: usize = std::env::var("IDEM_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let setups = [
        ("direct", store(&direct, false).await),
        ("inline", store(&direct, true).await),
        ("pgbouncer", store(&pgbouncer, true).await),
    ];
    setups[0].1.migrate().await.expect("migrate");
    let run = Run {
        id: format!("{:08x}", rand::random::<u32>()),
        fingerprint: Fingerprint::of("create_ticket", &serde_json::json!({"title": "bench"}))
            .unwrap(),
        outcome: Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap(),
        policy: Policy::default(),
    };
    // Warm-up, and the keys the replays read (round 0).
    for (n, (_, s)) in setups.iter().enumerate() {
        run.measure(s, n, false, 0, ops, 8).await;
    }
    println!(
        "mean latency per operation (µs), median over {BATCHES} interleaved batches of {ops}; ratio to direct"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>7} {:>9} {:>7}",
        "", "direct", "inline", "ratio", "pgbouncer", "ratio"
    );
    for tasks in [1, 8] {
        for (name, replay) in [("first execution", false), ("replay", true)] {
            let mut m = vec![Vec::new(); setups.len()];
            for batch in 1..=BATCHES {
                let round = batch + tasks * 100;
                for k in 0..setups.len() {
                    let n = (k + batch) % setups.len();
                    m[n].push(
                        run.measure(&setups[n].1, n, replay, round, ops, tasks)
                            .await,
                    );
                }
            }
            let m: Vec<Duration> = m.into_iter().map(median).collect();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let ratio = |d: Duration| d.as_secs_f64() / m[0].as_secs_f64();
            println!(
                "{:<28} {:>9.1} {:>9.1} {:>6.2}x {:>9.1} {:>6.2}x",
                format!("{name}, {tasks} task{}", if tasks == 1 { "" } else { "s" }),
                us(m[0]),
                us(m[1]),
                ratio(m[1]),
                us(m[2]),
                ratio(m[2])
            );
        }
    }
    idem_store_postgres::sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {SCHEMA}.{TABLE} WHERE scope LIKE $1"
    )))
    .bind(format!("bench-{}-%", run.id))
    .execute(setups[0].1.pool())
    .await
    .unwrap();
}
