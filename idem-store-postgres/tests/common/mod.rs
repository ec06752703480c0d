//! Shared by the integration tests: stores on their own small pools in the shared test schema
//! (the server URLs are read and unique names made with `idem_conformance::kit`).
#![allow(dead_code)] // each test binary uses a different part

use std::pin::Pin;
use std::time::Duration;

use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_store_postgres::sqlx::{self, PgPool};

/// The schema every test uses; isolation is by unique scope, never by wiping tables.
pub const SCHEMA: &str = "idem_test";
/// The table every test uses.
pub const TABLE: &str = "idem_records";

use idem_conformance::kit::env_url;
#[allow(unused_imports)] // each test binary uses a different part
pub use idem_conformance::kit::{postgres_url as url, unique};

/// `IDEM_TEST_POSTGRES_TLS_URL`: a server that accepts only TLS connections, with `sslmode` and
/// `sslrootcert` in the URL (scripts/services/tls.sh).
pub fn tls_url() -> Option<String> {
    env_url(
        "IDEM_TEST_POSTGRES_TLS_URL",
        "scripts/services/tls.sh starts a TLS-only server",
    )
}

/// `IDEM_TEST_TLS_CA` and `IDEM_TEST_TLS_UNTRUSTED_CA`: the file of the CA that signed the TLS
/// servers' certificates, and of one that signed nothing there (scripts/services/tls.sh).
pub fn tls_cas() -> Option<(String, String)> {
    let hint = "scripts/services/tls.sh makes it";
    Some((
        env_url("IDEM_TEST_TLS_CA", hint)?,
        env_url("IDEM_TEST_TLS_UNTRUSTED_CA", hint)?,
    ))
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

/// What `conformance_tests!` builds a store with.
pub type Factory =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = PostgresStore> + Send>> + Send + Sync + 'static>;

/// How the stores under test reach the database: `IDEM_TEST_POSTGRES_STORE_URL` when it is set
/// (scripts/test sets it for a second run of the conformance, race, batch and wait tests: the same
/// database through PgBouncer in transaction mode, as a user's plain URL, with `listen_url` for
/// the wait tests), else `url`. The tests' own statements (effects, locks, `pg_stat_activity`)
/// stay on `url`, a direct connection.
struct StoreTarget {
    url: String,
    /// The URL's `pooler`, when it says one (`transaction`: `Some(true)`); else the store probes.
    pooler: Option<bool>,
    listen: Option<String>,
}

impl StoreTarget {
    fn of(url: &str) -> Self {
        let text = std::env::var("IDEM_TEST_POSTGRES_STORE_URL").unwrap_or_else(|_| url.to_owned());
        let mut parsed = url::Url::parse(&text).expect("IDEM_TEST_POSTGRES_STORE_URL parses");
        let (mut pooler, mut listen, mut rest) = (None, None, Vec::new());
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "pooler" => pooler = Some(value == "transaction"),
                "listen_url" => listen = Some(value.into_owned()),
                _ => rest.push((name.into_owned(), value.into_owned())),
            }
        }
        parsed.set_query(None);
        if !rest.is_empty() {
            parsed.query_pairs_mut().extend_pairs(rest);
        }
        Self {
            url: parsed.into(),
            pooler,
            listen,
        }
    }

    /// A store on a new pool of up to `max` connections tagged `app`, in the test table. The pool
    /// connects lazily, as a user's pool behind a pooler must: the store's first operation probes
    /// the server (and leaves out the startup parameter PgBouncer refuses) before the pool's
    /// first connection.
    async fn store(&self, app: &str, max: u32) -> PostgresStore {
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(options(&self.url, app));
        let store = PostgresStore::with_table(pool, SCHEMA, TABLE).expect("valid names");
        let store = match self.pooler {
            Some(told) => store.with_transaction_pooler(told),
            None => store,
        };
        match &self.listen {
            Some(listen) => store.with_listen_options(options(listen, app)),
            None => store,
        }
    }
}

/// The conformance suite's factory for the server at `url` (`None`: skipped, already explained):
/// every call is a new handle with its own small pool (up to 4 connections, tagged `app`) on the
/// shared test table, migrated once.
pub fn conformance_factory(url: Option<String>, app: &'static str) -> Option<Factory> {
    static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let url = url?;
    Some(Box::new(move || {
        let url = url.clone();
        Box::pin(async move {
            let store = StoreTarget::of(&url).store(app, 4).await;
            MIGRATED
                .get_or_try_init(|| store.migrate())
                .await
                .expect("migrate the test table");
            store
        })
    }))
}

/// A migrated store on a fresh pool of up to 4 connections, in the test schema, on `url` or on
/// `IDEM_TEST_POSTGRES_STORE_URL` when set (see `StoreTarget`).
pub async fn store(url: &str, application_name: &str) -> PostgresStore {
    sized_store(url, application_name, 4).await
}

/// [`store`] on a pool of up to `max` connections.
pub async fn sized_store(url: &str, application_name: &str, max: u32) -> PostgresStore {
    let store = StoreTarget::of(url).store(application_name, max).await;
    store.migrate().await.expect("migrate");
    store
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
    let claim = idem_core::machine::ClaimAnswer::Claimed {
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
