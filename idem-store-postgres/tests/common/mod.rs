//! Shared by the integration tests: the server URL (read at run time), and stores on their own
//! small pools in the shared test schema.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_store_postgres::sqlx::{self, PgPool};

/// The schema every test uses; isolation is by unique scope, never by wiping tables.
pub const SCHEMA: &str = "idem_test";
/// The table every test uses.
pub const TABLE: &str = "idem_records";

/// `IDEM_TEST_POSTGRES_URL`, or `None` after saying why the test skips. Under `CI` a missing URL
/// is a failure.
pub fn url() -> Option<String> {
    var(
        "IDEM_TEST_POSTGRES_URL",
        "e.g. postgres://postgres@127.0.0.1:5432/test",
    )
}

/// `IDEM_TEST_POSTGRES_TLS_URL`: a server that accepts only TLS connections, with `sslmode` and
/// `sslrootcert` in the URL (scripts/services/tls.sh). `None` after saying why; a failure under `CI`.
pub fn tls_url() -> Option<String> {
    var(
        "IDEM_TEST_POSTGRES_TLS_URL",
        "scripts/services/tls.sh starts a TLS-only server",
    )
}

/// `IDEM_TEST_TLS_CA` and `IDEM_TEST_TLS_UNTRUSTED_CA`: the CA that signed the TLS server's
/// certificate, and one that did not.
pub fn tls_cas() -> Option<(String, String)> {
    Some((
        var("IDEM_TEST_TLS_CA", "scripts/services/tls.sh makes it")?,
        var(
            "IDEM_TEST_TLS_UNTRUSTED_CA",
            "scripts/services/tls.sh makes it",
        )?,
    ))
}

fn var(name: &str, hint: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("{name} is not set, and under CI a missing server is a failure");
            }
            eprintln!("skipping: {name} is not set (scripts/test sets it; {hint})");
            None
        }
    }
}

/// Connection options for `url`, tagged with `application_name` so a test can find (and kill)
/// exactly its own connections.
pub fn options(url: &str, application_name: &str) -> PgConnectOptions {
    url.parse::<PgConnectOptions>()
        .expect("IDEM_TEST_POSTGRES_URL parses")
        .application_name(application_name)
}

/// A small pool of its own (the suite runs many cases in parallel against ~100 server slots).
pub async fn pool(url: &str, application_name: &str, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options(url, application_name))
        .await
        .expect("connect to IDEM_TEST_POSTGRES_URL")
}

/// A migrated store on a fresh pool of up to 4 connections, in the test schema.
pub async fn store(url: &str, application_name: &str) -> PostgresStore {
    let store = PostgresStore::with_table(pool(url, application_name, 4).await, SCHEMA, TABLE)
        .expect("valid names");
    store.migrate().await.expect("migrate");
    store
}

/// A name no other test, process or run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{:08x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
}

/// Creates `idem_test.effects`, the sink the tests count side effects in.
pub async fn effects_table(pool: &PgPool) {
    let mut tx = pool.begin().await.expect("begin");
    // Serialise concurrent creators (CREATE TABLE IF NOT EXISTS can still race on the catalog).
    sqlx::query("SELECT pg_advisory_xact_lock(7419001)")
        .execute(&mut *tx)
        .await
        .expect("lock");
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS idem_test; \
         CREATE TABLE IF NOT EXISTS idem_test.effects (scope TEXT NOT NULL, key TEXT NOT NULL, \
         executor TEXT NOT NULL, id BIGSERIAL PRIMARY KEY)",
    )
    .execute(&mut *tx)
    .await
    .expect("create effects table");
    tx.commit().await.expect("commit");
}

/// How many effects were recorded for (scope, key).
pub async fn effects(pool: &PgPool, scope: &str, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_test.effects WHERE scope = $1 AND key = $2")
        .bind(scope)
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("count effects")
}

/// Waits (by condition, not by time) until a backend of `app` is blocked on a lock.
pub async fn wait_until_blocked_on_a_lock(admin: &PgPool, app: &str) {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock'",
        )
        .bind(app)
        .fetch_one(admin)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// The executor's handle on the claim of `token` made directly on the store, with `policy` and a
/// clock at `now`: what `PostgresStore::complete_in` takes. (Only the token, policy and clock
/// matter to a completion; the attempt number and kind are placeholders.)
pub fn attempt(
    store: &PostgresStore,
    scope: &idem_core::Scope,
    key: &idem_core::IdempotencyKey,
    token: idem_core::Token,
    policy: &idem_core::Policy,
    now: idem_core::Timestamp,
) -> idem_core::Attempt {
    let claim = idem_core::ClaimAnswer::Claimed {
        token,
        attempt: 1,
        kind: idem_core::ClaimKind::New,
    };
    idem_core::Executor::new(store.clone())
        .with_policy(*policy)
        .with_clock(idem_core::ManualClock::new(now))
        .attempt_for(scope, key, &claim)
        .expect("claimed")
}
