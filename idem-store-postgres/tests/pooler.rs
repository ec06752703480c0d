//! Behind PgBouncer in transaction pooling mode (`IDEM_TEST_PGBOUNCER_URL`, which
//! scripts/services/pgbouncer.sh starts in front of the test database): what only this file can
//! show. The whole conformance suite, the race and the wait tests run through the pooler too
//! (scripts/test runs them again with `IDEM_TEST_POSTGRES_STORE_URL`).

mod common;

use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Maintenance, Outcome, Policy, RecordId, Scope,
    StoreError, SystemClock, Timer, Timestamp,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use serde_json::json;

/// A guard against a hang, never a measure.
const HANG: Duration = Duration::from_secs(20);

fn pooler_url() -> Option<String> {
    idem_conformance::kit::env_url(
        "IDEM_TEST_PGBOUNCER_URL",
        "scripts/services/pgbouncer.sh starts PgBouncer in transaction mode",
    )
}

/// A pool of `max` connections to the pooler, without the startup parameter it refuses.
async fn pooled(url: &str, app: &str, max: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_with(common::options(url, app).extra_float_digits(None))
        .await
        .expect("connect to IDEM_TEST_PGBOUNCER_URL")
}

fn ids(test: &str) -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new(common::unique(test)).unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

/// `migrate` (a transaction with a transaction-scoped advisory lock), the version and the
/// configuration check through the pooler, on a table of its own, from the URL as a user gives
/// it; then a claim and a completion that a second claim replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_and_claim_through_the_pooler_url() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    let table = common::unique("pooler").replace('-', "_");
    let connected = PostgresStore::connect(&format!("{pooler}?pooler=transaction"))
        .await
        .unwrap();
    let store =
        PostgresStore::with_table(connected.pool().clone(), common::SCHEMA, &table).unwrap();
    let store = store.with_transaction_pooler(true);
    let m: &dyn Maintenance = &store;
    assert_eq!(m.schema_version().await.unwrap(), 0);
    m.migrate().await.unwrap();
    m.migrate().await.unwrap();
    assert_eq!(m.schema_version().await.unwrap(), m.latest_schema_version());
    m.check_config().await.unwrap();

    let (scope, key, fp) = ids("pooler-claim");
    let id = RecordId::new(scope.clone(), key.clone());
    let p = Policy::default();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &p, now).await.unwrap() else {
        panic!("expected a claim")
    };
    let body = json!({"ticket": "T-1", "quote": "it's \\ \"fine\" 🎫"});
    let outcome = Outcome::definitive(201, &body).unwrap();
    store.complete(&id, token, &outcome, &p, now).await.unwrap();
    match store.claim(&id, &fp, &p, now).await.unwrap() {
        ClaimAnswer::Replay(replayed) => assert_eq!(replayed.body(), outcome.body()),
        other => panic!("expected the replay, got {other:?}"),
    }
    let admin = common::pool(&direct, "idem-test-pooler-admin", 1).await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {schema}.\"{table}\"; DROP TABLE {schema}.\"{table}_migrations\"",
        schema = common::SCHEMA
    )))
    .execute(&admin)
    .await
    .unwrap();
}

/// Without `listen_url`, a wait behind the pooler polls the record (no `LISTEN`, which the pooler
/// would leave deaf) and ends as soon as the holder completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listen_url_a_waiter_behind_the_pooler_polls() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    let a = common::store(&direct, "idem-test-pooler-wait-a").await;
    let b = PostgresStore::with_table(
        pooled(&pooler, "idem-test-pooler-wait-b", 2).await,
        common::SCHEMA,
        common::TABLE,
    )
    .unwrap()
    .with_transaction_pooler(true);
    let (scope, key, fp) = ids("pooler-wait");
    let id = RecordId::new(scope.clone(), key.clone());
    let p = Policy::default();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = a.claim(&id, &fp, &p, now).await.unwrap() else {
        panic!("expected a claim")
    };
    let seen = b.get(&id, now).await.unwrap().unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.wait_for_change(&seen, &SystemClock, &Timer::tokio())
                .await
                .unwrap()
        })
    };
    let outcome = Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap();
    a.complete(&id, token, &outcome, &p, now).await.unwrap();
    tokio::time::timeout(HANG, waiter).await.unwrap().unwrap();
    assert_eq!(
        b.listen_connections_opened(),
        0,
        "no LISTEN behind the pooler"
    );
    assert_eq!(b.wait_subscriptions(), 0);
}

/// A store that is not told it is behind a transaction pooler runs into another client's named
/// statements on the pooler's server connections: its error says so and names the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unflagged_store_behind_the_pooler_says_the_url_points_at_a_pooler() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    common::store(&direct, "idem-test-pooler-unflagged").await; // migrated
    let mut stores = Vec::new();
    for i in 0..4 {
        let name = format!("idem-test-pooler-unflagged-{i}");
        let store = PostgresStore::with_table(
            pooled(&pooler, &name, 1).await,
            common::SCHEMA,
            common::TABLE,
        )
        .unwrap();
        stores.push(std::sync::Arc::new(store));
    }
    let (scope, key, _) = ids("pooler-unflagged");
    // sqlx names a connection's statements `sqlx_s_1`, `sqlx_s_2`, … in the order it first runs
    // them: the even clients run `get` (three parameters) first, the odd ones `list_in_flight`
    // (two), so the same name means another statement on the server connections the two kinds
    // prepared on. Four clients at once: the pooler hands its server connections to whichever
    // client asks, so a client meets a name that is missing, already there, or another
    // statement (every one of which fails), not only server connections of its own kind.
    let mut error = None;
    'rounds: for _ in 0..200 {
        let calls: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
                let id = RecordId::new(scope.clone(), key.clone());
                tokio::spawn(async move {
                    let now = Timestamp::now();
                    if i % 2 == 0 {
                        store.get(&id, now).await?;
                        store.list_in_flight(now, 1).await?;
                    } else {
                        store.list_in_flight(now, 1).await?;
                        store.get(&id, now).await?;
                    }
                    Ok::<_, StoreError>(())
                })
            })
            .collect();
        for call in calls {
            if let Err(e) = call.await.unwrap() {
                error = Some(e);
                break 'rounds;
            }
        }
    }
    let error = error.expect("an unflagged store behind a transaction pooler fails");
    assert!(
        matches!(error, StoreError::Misconfigured { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("the URL points at a transaction pooler")
            && message.contains("pooler=transaction"),
        "{message}"
    );
}
