//! Behind PgBouncer in transaction pooling mode (`IDEM_TEST_PGBOUNCER_URL`, which
//! scripts/services/pgbouncer.sh starts in front of the test database, with its default settings):
//! what only this file can show. Every store here is given the pooler's plain URL, as a user
//! would, without `pooler=transaction`. The whole conformance suite, the race, batch and wait
//! tests run through the pooler too (scripts/test runs them again with
//! `IDEM_TEST_POSTGRES_STORE_URL`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Maintenance, Outcome, Policy, RecordId, Scope,
    StoreError, SystemClock, Timer, Timestamp, Token,
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

/// A pool of `max` connections to the pooler's plain URL, as a user builds one: the driver's
/// default options (with the `extra_float_digits` startup parameter PgBouncer refuses), connected
/// lazily, so the store's probe decides before the first connection.
fn lazy_pool(url: &str, app: &str, max: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .connect_lazy_with(common::options(url, app))
}

fn ids(test: &str) -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new(common::unique(test)).unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

/// The rows of `scope` in `table` (of the test schema): (key, state, token id, body).
async fn rows(
    admin: &PgPool,
    table: &str,
    scope: &Scope,
) -> Vec<(String, String, String, Option<String>)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT key, state, token_id, outcome_body FROM {}.\"{table}\" WHERE scope = $1 \
         ORDER BY key",
        common::SCHEMA
    )))
    .bind(scope.as_str())
    .fetch_all(admin)
    .await
    .unwrap()
}

/// `migrate` (a transaction with a transaction-scoped advisory lock), the version and the
/// configuration check through the pooler, on a table of its own, from the plain URL as the
/// provider hands it out (`PostgresStore::connect` probes and finds the pooler); then a claim and
/// a completion that a second claim replays, counted at the sink: one row, completed, with the
/// claim's token and the body byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_check_and_claim_through_the_plain_pooler_url() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    let table = common::unique("pooler").replace('-', "_");
    let connected = PostgresStore::connect(&pooler).await.unwrap();
    assert!(connected.sends_inline(), "connect found the pooler");
    let store =
        PostgresStore::with_table(connected.pool().clone(), common::SCHEMA, &table).unwrap();
    let m: &dyn Maintenance = &store;
    assert_eq!(m.schema_version().await.unwrap(), 0);
    assert!(store.sends_inline(), "the first operation found the pooler");
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
    let done = store.complete(&id, token, &outcome, &p, now).await.unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
    match store.claim(&id, &fp, &p, now).await.unwrap() {
        ClaimAnswer::Replay(replayed) => assert_eq!(replayed.body(), outcome.body()),
        other => panic!("expected the replay, got {other:?}"),
    }
    let admin = common::pool(&direct, "idem-test-pooler-admin", 1).await;
    let stored = rows(&admin, &table, &scope).await;
    let expected = (
        key.as_str().to_owned(),
        "completed".to_owned(),
        token.id_hex(),
        Some(outcome.body().to_owned()),
    );
    assert_eq!(
        stored,
        [expected],
        "one row, completed by the claim's holder"
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {schema}.\"{table}\"; DROP TABLE {schema}.\"{table}_migrations\"",
        schema = common::SCHEMA
    )))
    .execute(&admin)
    .await
    .unwrap();
}

/// Without `listen_url`, a wait behind the pooler polls the record (no `LISTEN`, which the pooler
/// would leave deaf) and ends when the holder completes. The waiter's store is a user's lazy pool
/// on the plain URL: its first operation finds the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listen_url_a_waiter_behind_the_pooler_polls() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    let a = common::store(&direct, "idem-test-pooler-wait-a").await;
    let b = PostgresStore::with_table(
        lazy_pool(&pooler, "idem-test-pooler-wait-b", 2),
        common::SCHEMA,
        common::TABLE,
    )
    .unwrap();
    let (scope, key, fp) = ids("pooler-wait");
    let id = RecordId::new(scope.clone(), key.clone());
    let p = Policy::default();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = a.claim(&id, &fp, &p, now).await.unwrap() else {
        panic!("expected a claim")
    };
    let seen = b.get(&id, now).await.unwrap().unwrap();
    assert!(b.sends_inline(), "the store found the pooler");
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

/// A store told there is no pooler (`with_transaction_pooler(false)`: no probe, prepared
/// statements) runs into other clients' named statements on the pooler's server connections. Each
/// collision (a statement missing, already there, or another one: it did not run) switches the
/// store to inline statements and runs the statement once more, so no caller sees an error: every
/// claim is answered `Claimed` and leaves exactly its row, with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_statement_collision_switches_to_inline_and_runs_the_statement_again() {
    let (Some(direct), Some(pooler)) = (common::url(), pooler_url()) else {
        return;
    };
    common::store(&direct, "idem-test-pooler-collide").await; // migrated
    let mut stores = Vec::new();
    for i in 0..4 {
        let name = format!("idem-test-pooler-collide-{i}");
        let options = common::options(&pooler, &name).extra_float_digits(None);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("connect to IDEM_TEST_PGBOUNCER_URL");
        let store = PostgresStore::with_table(pool, common::SCHEMA, common::TABLE)
            .unwrap()
            .with_transaction_pooler(false);
        stores.push(Arc::new(store));
    }
    let (scope, _, fp) = ids("pooler-collide");
    let p = Policy::default();
    // sqlx names a connection's statements `sqlx_s_1`, `sqlx_s_2`, … in the order it first runs
    // them: the even clients claim new keys (a read of two parameters, then an insert of
    // fifteen), the odd ones run `get` (three) and `list_in_flight` (two), so a name holds
    // statements of different parameter counts on the server connections the two kinds prepared
    // on. Four clients at once: the pooler hands its server connections to whichever client
    // asks, so each meets a name that is missing, already there, or another statement.
    let mut claimed: Vec<(String, Token)> = Vec::new();
    for round in 0..500 {
        if stores.iter().all(|s| s.sends_inline()) {
            break;
        }
        let calls: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, scope, fp) = (store.clone(), scope.clone(), fp.clone());
                let key = format!("k{round}-{i}");
                let id = RecordId::new(scope, IdempotencyKey::new(key.clone()).unwrap());
                tokio::spawn(async move {
                    let now = Timestamp::now();
                    if i % 2 == 1 {
                        store.get(&id, now).await?;
                        store.list_in_flight(now, 1).await?;
                        return Ok::<_, StoreError>(None);
                    }
                    match store.claim(&id, &fp, &p, now).await? {
                        ClaimAnswer::Claimed { token, .. } => Ok(Some((key, token))),
                        other => panic!("a new key is claimed: {other:?}"),
                    }
                })
            })
            .collect();
        for call in calls {
            let answer = call.await.unwrap();
            let answer = answer.expect("no caller sees a collision");
            claimed.extend(answer);
        }
    }
    assert!(
        stores.iter().all(|s| s.sends_inline()),
        "every store met a collision and switched"
    );
    let admin = common::pool(&direct, "idem-test-pooler-collide-admin", 1).await;
    let mut expected: Vec<_> = claimed
        .iter()
        .map(|(key, token)| (key.clone(), "processing".to_owned(), token.id_hex(), None))
        .collect();
    expected.sort();
    assert_eq!(
        rows(&admin, common::TABLE, &scope).await,
        expected,
        "one row per claim, with its token"
    );
}
