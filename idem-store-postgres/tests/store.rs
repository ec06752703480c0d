//! Behaviour specific to PostgreSQL: transactional completion, the uncommitted-inserter race,
//! byte-for-byte bodies, error classification, identifiers, Debug. Skips (or fails under `CI`)
//! without `IDEM_TEST_POSTGRES_URL`.

mod common;

use idem_core::store::CheckpointStore;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    ClaimKind, Fingerprint, IdempotencyKey, KeyStore, Maintenance, Outcome, OutcomeClass, Policy,
    RecordId, RecordState, Scope, StoreError, Timestamp,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, postgres::PgPoolOptions};

fn names(prefix: &str) -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new(common::unique(prefix)).unwrap(),
        IdempotencyKey::new("wf-1:step-1:create_ticket").unwrap(),
        Fingerprint::of("create_ticket", &serde_json::json!({"title": "x"})).unwrap(),
    )
}

fn t0() -> Timestamp {
    // Far from the wall clock on purpose: the store must only use the caller's time.
    Timestamp::from_millis(946_684_800_000) // 2000-01-01
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_complete_replay_round_trip() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "idem-test-basic").await;
    let (scope, key, fp) = names("basic");
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let now = t0();
    let ClaimAnswer::Claimed {
        token,
        attempt: 1,
        kind: ClaimKind::New,
    } = store.claim(&id, &fp, &policy, now).await.unwrap()
    else {
        panic!("first claim must win")
    };
    let body = "{ \"z\": \"\\u0000 é 😀\", \"a\": [1.50, 1e3] }";
    let outcome = Outcome::from_json_text(201, body, OutcomeClass::Definitive).unwrap();
    assert_eq!(
        store
            .complete(&id, token, &outcome, &policy, now)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    let ClaimAnswer::Replay(replayed) = store.claim(&id, &fp, &policy, now).await.unwrap() else {
        panic!("repeat must replay")
    };
    assert_eq!(replayed.body(), body, "byte for byte");
    assert_eq!(replayed.status(), 201);
    let record = store.get(&id, now).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.token, token);
    assert_eq!(record.expires_at, now + policy.ttl());
    assert_eq!(store.backend(), "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_write_nothing() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "idem-test-readonly").await;
    let (scope, key, fp) = names("readonly");
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &policy, t0()).await.unwrap()
    else {
        panic!()
    };
    let outcome = Outcome::definitive(200, &serde_json::json!({"ok": true})).unwrap();
    store
        .complete(&id, token, &outcome, &policy, t0())
        .await
        .unwrap();
    let xmin = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT xmin::text FROM idem_test.idem_records WHERE scope = $1 AND key = $2",
        )
        .bind(scope.as_str())
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
    };
    let before = xmin().await;
    for _ in 0..5 {
        assert!(matches!(
            store.claim(&id, &fp, &policy, t0()).await.unwrap(),
            ClaimAnswer::Replay(_)
        ));
    }
    assert_eq!(
        xmin().await,
        before,
        "a replay must not write a new row version"
    );
}

/// The effect's write and `complete` share the caller's transaction: a rollback leaves neither,
/// and the retry executes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_completion_rolls_back_with_the_effect() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "idem-test-tx").await;
    common::effects_table(store.pool()).await;
    let (scope, key, fp) = names("tx");
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let now = t0();
    let outcome = Outcome::definitive(201, &serde_json::json!({"ticket": 7})).unwrap();

    let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &policy, now).await.unwrap()
    else {
        panic!()
    };
    let attempt = common::attempt(&store, &scope, &key, token, &policy, now);
    let (tx, answer) = effect_and_completion(&store, &attempt, &outcome).await;
    assert_eq!(answer, CompleteAnswer::Completed);
    tx.rollback().await.unwrap(); // forced failure after both writes

    assert_eq!(
        common::effects(store.pool(), scope.as_str(), key.as_str()).await,
        0
    );
    let record = store.get(&id, now).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Processing, "no completed record");
    assert!(record.outcome.is_none());

    // The holder retries with its token, this time committing.
    let (tx, answer) = effect_and_completion(&store, &attempt, &outcome).await;
    assert_eq!(answer, CompleteAnswer::Completed);
    tx.commit().await.unwrap();

    // Later repeats replay; the effect exists exactly once.
    for _ in 0..3 {
        let ClaimAnswer::Replay(o) = store.claim(&id, &fp, &policy, now).await.unwrap() else {
            panic!("must replay")
        };
        assert_eq!(o, outcome);
    }
    assert_eq!(
        common::effects(store.pool(), scope.as_str(), key.as_str()).await,
        1
    );

    // A stale holder completing inside a transaction is fenced, and rolls its effect back.
    let (tx, answer) = effect_and_completion(&store, &attempt, &outcome).await;
    assert_eq!(answer, CompleteAnswer::Fenced);
    tx.rollback().await.unwrap();
    assert_eq!(
        common::effects(store.pool(), scope.as_str(), key.as_str()).await,
        1,
        "the fenced holder's effect rolled back"
    );
}

/// In one transaction: the effect's row, then `complete_in` for `attempt`; the transaction is
/// left open for the caller to commit or roll back.
async fn effect_and_completion(
    store: &PostgresStore,
    attempt: &idem_core::Attempt,
    outcome: &Outcome,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, CompleteAnswer) {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO idem_test.effects (scope, key, executor) VALUES ($1, $2, 'tx-test')")
        .bind(attempt.scope().as_str())
        .bind(attempt.key().as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let answer = store.complete_in(&mut tx, attempt, outcome).await.unwrap();
    (tx, answer)
}

/// [contract §7](idem_core::contract#traps): a claim whose INSERT waits on another transaction's
/// uncommitted insert of the same key must answer from that row once it commits (not "no row", not
/// a second claim), and must win if it rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_waiting_on_an_uncommitted_inserter() {
    let Some(url) = common::url() else { return };
    let app = common::unique("idem-test-uncommitted");
    let store = common::store(&url, &app).await;
    let policy = Policy::default();
    let now = t0();
    for commit in [true, false] {
        let (scope, key, fp) = names("uncommitted");
        // The other inserter: a store claim made inside an open transaction on its own connection.
        let mut blocker = store.pool().acquire().await.unwrap();
        sqlx::query("BEGIN").execute(&mut *blocker).await.unwrap();
        sqlx::query(
            "INSERT INTO idem_test.idem_records (scope, key, fingerprint, state, token_seq, token_id, \
             attempt, lease_until, created_at, updated_at, expires_at) \
             VALUES ($1, $2, $3, 'processing', 1, $4, 1, $5, $6, $6, $7)",
        )
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(fp.as_str())
        .bind(format!("{:032x}", 42u128))
        .bind(i64::try_from((now + policy.lease()).as_millis()).unwrap())
        .bind(i64::try_from(now.as_millis()).unwrap())
        .bind(i64::try_from((now + policy.ttl()).as_millis()).unwrap())
        .execute(&mut *blocker)
        .await
        .unwrap();

        let claimer = {
            let store = store.clone();
            let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
            tokio::spawn(async move {
                store
                    .claim(
                        &RecordId::new(scope.clone(), key.clone()),
                        &fp,
                        &policy,
                        now,
                    )
                    .await
            })
        };
        // Wait (by condition, not by time) until the claim's INSERT is blocked on our row.
        let admin = common::pool(&url, "idem-test-admin", 1).await;
        common::wait_until_blocked_on_a_lock(&admin, &app).await;
        let finish = if commit { "COMMIT" } else { "ROLLBACK" };
        sqlx::query(finish).execute(&mut *blocker).await.unwrap();
        let answer = claimer.await.unwrap().unwrap();
        if commit {
            assert!(
                matches!(answer, ClaimAnswer::InFlight { stale: false, .. }),
                "after the other inserter commits: {answer:?}"
            );
        } else {
            assert!(
                matches!(
                    answer,
                    ClaimAnswer::Claimed {
                        kind: ClaimKind::New,
                        ..
                    }
                ),
                "after the other inserter rolls back: {answer:?}"
            );
        }
        admin.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_answer_is_unavailable() {
    // Nothing listens on port 1: every call is Unavailable, never a silent proceed.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres:s3cr3t-pw@127.0.0.1:1/test")
        .unwrap();
    let store = PostgresStore::new(pool);
    let (scope, key, fp) = names("down");
    let id = RecordId::new(scope.clone(), key.clone());
    let err = store
        .claim(&id, &fp, &Policy::default(), t0())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(store.migrate().await.unwrap_err().is_unavailable());
    assert!(store.get(&id, t0()).await.unwrap_err().is_unavailable());
    let debug = format!("{store:?} {err:?} {err}");
    assert!(!debug.contains("s3cr3t-pw"), "{debug}");
}

/// A server that accepts connections and never answers: the pooler check before the first
/// statement gives up when the pool would (real time: the pool's own acquire timeout is what is
/// under test), and the call is Unavailable instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_accepts_and_never_answers_is_unavailable() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/test"))
        .unwrap();
    let store = PostgresStore::new(pool);
    let (scope, key, _) = names("silent");
    let err = store
        .get(&RecordId::new(scope, key), t0())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    drop(silent);
}

/// A direct connection is not taken for a transaction pooler: `connect` and the first operation
/// of a store on a lazy pool both probe and keep prepared statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_connection_is_not_taken_for_a_pooler() {
    let Some(url) = common::url() else { return };
    common::store(&url, "idem-test-direct-probe").await; // migrated
    let connected = PostgresStore::connect(&url).await.unwrap();
    assert!(!connected.sends_inline(), "connect saw no pooler");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(common::options(&url, "idem-test-direct-probe"));
    let store = PostgresStore::with_table(pool, common::SCHEMA, common::TABLE).unwrap();
    assert!(store.sends_inline(), "inline until the probe has run");
    let (scope, key, _) = names("direct-probe");
    let id = RecordId::new(scope, key);
    assert_eq!(store.get(&id, t0()).await.unwrap(), None);
    assert!(
        !store.sends_inline(),
        "the first operation's probe saw no pooler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_never_shows_the_password() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "idem-test-debug").await;
    let debug = format!("{store:?}");
    assert!(debug.contains("idem_test"), "{debug}");
    assert!(!debug.contains("postgres://"), "{debug}");
    assert!(!debug.contains(&url), "{debug}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmigrated_table_is_misconfigured_and_bad_names_are_refused() {
    let Some(url) = common::url() else { return };
    let pool = common::pool(&url, "idem-test-names", 2).await;
    for (schema, table) in [
        ("idem_test", "Bad"),
        ("1x", "t"),
        ("a\"; drop", "t"),
        ("s", ""),
    ] {
        let err = PostgresStore::with_table(pool.clone(), schema, table).unwrap_err();
        assert!(StoreError::from(err).kind() == "misconfigured");
    }
    let store = PostgresStore::with_table(pool, "idem_test", "never_migrated_here").unwrap();
    let (scope, key, fp) = names("unmigrated");
    let err = store
        .claim(
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            &Policy::default(),
            t0(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "misconfigured", "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_concurrent_safe() {
    let Some(url) = common::url() else { return };
    let pool = common::pool(&url, "idem-test-migrate", 4).await;
    let table = common::unique("mig").replace('-', "_");
    let store = PostgresStore::with_table(pool, "idem_test", &table).unwrap();
    // Reading the version changes nothing: still no table afterwards.
    assert_eq!(store.schema_version().await.unwrap(), 0);
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'idem_test' AND tablename LIKE $1",
    )
    .bind(format!("{table}%"))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(tables, 0, "schema_version created nothing");
    let runs = (0..4).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.migrate().await })
    });
    for run in runs {
        run.await.unwrap().unwrap();
    }
    store.migrate().await.unwrap();
    let versions: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM idem_test.\"{table}_migrations\""
    )))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        versions,
        i64::from(store.latest_schema_version()),
        "each migration recorded once"
    );
    assert_eq!(
        store.schema_version().await.unwrap(),
        store.latest_schema_version()
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE idem_test.\"{table}\"; DROP TABLE idem_test.\"{table}_migrations\""
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

/// The indexes of `schema.table`, by name, with their definitions.
async fn indexes(pool: &sqlx::PgPool, schema: &str, table: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 \
         ORDER BY indexname",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A table made by the previous release (schema version 2, with its `(updated_at)` index) and
/// holding records upgrades in place: `migrate` drops that index and adds the checkpoints
/// column only, concurrently safe and idempotent, and every record reads, replays, completes and
/// lists as before; the held record takes checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_table_upgrades_in_place() {
    let Some(url) = common::url() else { return };
    let pool = common::pool(&url, "idem-test-upgrade", 4).await;
    let table = common::unique("up").replace('-', "_");
    let store = PostgresStore::with_table(pool.clone(), "idem_test", &table).unwrap();
    // Version 2 exactly as the previous release's migrations 1 and 2 made it.
    sqlx::raw_sql(AssertSqlSafe(format!(
        r#"CREATE SCHEMA IF NOT EXISTS idem_test;
        CREATE TABLE idem_test."{table}_migrations" (version INTEGER PRIMARY KEY,
            description TEXT NOT NULL, applied_at_ms BIGINT NOT NULL);
        INSERT INTO idem_test."{table}_migrations" VALUES (1, 'v1', 0), (2, 'v2', 0);
        CREATE TABLE idem_test."{table}" (
            scope TEXT COLLATE "C" NOT NULL, key TEXT COLLATE "C" NOT NULL,
            fingerprint TEXT NOT NULL, state TEXT NOT NULL, token_seq BIGINT NOT NULL,
            token_id TEXT NOT NULL, attempt BIGINT NOT NULL, lease_until BIGINT NOT NULL,
            outcome_status INTEGER, outcome_body TEXT, outcome_class TEXT,
            created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, expires_at BIGINT NOT NULL,
            CONSTRAINT {table}_pkey PRIMARY KEY (scope, key),
            CONSTRAINT {table}_state_check
                CHECK (state IN ('processing', 'completed', 'failed_retryable')));
        CREATE INDEX {table}_in_flight_idx ON idem_test."{table}" (lease_until, scope, key)
            WHERE state = 'processing';
        CREATE INDEX {table}_expires_idx ON idem_test."{table}" (expires_at);
        CREATE INDEX {table}_state_updated_idx ON idem_test."{table}" (state, updated_at);
        CREATE INDEX {table}_updated_idx ON idem_test."{table}" (updated_at);"#
    )))
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 2);
    let (scope, _, fp) = names("upgrade");
    let (done, held) = (
        RecordId::new(scope.clone(), IdempotencyKey::new("done").unwrap()),
        RecordId::new(scope.clone(), IdempotencyKey::new("held").unwrap()),
    );
    let policy = Policy::default();
    let now = t0();
    // Records made by the rules every store runs (on a `MemoryStore`), written as version 2's
    // columns: what an existing user's table holds.
    let memory = idem_core::MemoryStore::new();
    let ClaimAnswer::Claimed { token, .. } = memory.claim(&done, &fp, &policy, now).await.unwrap()
    else {
        panic!()
    };
    let outcome = Outcome::definitive(201, &serde_json::json!({"ticket": 7})).unwrap();
    memory
        .complete(&done, token, &outcome, &policy, now)
        .await
        .unwrap();
    let ClaimAnswer::Claimed {
        token: held_token, ..
    } = memory.claim(&held, &fp, &policy, now).await.unwrap()
    else {
        panic!()
    };
    let before = memory.get(&done, now).await.unwrap().unwrap();
    for id in [&done, &held] {
        let record = memory.get(id, now).await.unwrap().unwrap();
        let r = idem_core::store::columns::RawRecord::from_record(&record);
        sqlx::query(AssertSqlSafe(format!(
            r#"INSERT INTO idem_test."{table}" VALUES
               ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"#
        )))
        .bind(r.scope)
        .bind(r.key)
        .bind(r.fingerprint)
        .bind(r.state)
        .bind(r.token_seq)
        .bind(r.token_id)
        .bind(r.attempt)
        .bind(r.lease_until)
        .bind(r.outcome_status.map(|s| s as i32))
        .bind(r.outcome_body)
        .bind(r.outcome_class)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.expires_at)
        .execute(&pool)
        .await
        .unwrap();
    }

    let runs = (0..3).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.migrate().await })
    });
    for run in runs {
        run.await.unwrap().unwrap();
    }
    store.migrate().await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        store.latest_schema_version()
    );
    let names: Vec<String> = indexes(&pool, "idem_test", &table)
        .await
        .into_iter()
        .map(|(name, _)| name.trim_start_matches(table.as_str()).to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "_expires_idx",
            "_in_flight_idx",
            "_pkey",
            "_state_updated_idx"
        ]
    );

    assert_eq!(store.get(&done, now).await.unwrap(), Some(before));
    assert_eq!(
        store.claim(&done, &fp, &policy, now).await.unwrap(),
        ClaimAnswer::Replay(outcome.clone())
    );
    let later = now + policy.lease();
    let stale = store.list_in_flight(later, 10).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].id(), held);
    assert!(stale[0].checkpoints.is_empty());
    let step = idem_core::Checkpoint::new("charged", "{\"id\": 1}", later).unwrap();
    assert_eq!(
        store
            .checkpoint(&held, held_token, &step, &policy)
            .await
            .unwrap(),
        idem_core::machine::CheckpointAnswer::Saved
    );
    assert_eq!(
        store.get(&held, later).await.unwrap().unwrap().checkpoints,
        vec![step]
    );
    assert_eq!(
        store
            .complete(&held, held_token, &outcome, &policy, later)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    let listed = store
        .list(&idem_core::store::ListFilter::default(), later, 10)
        .await
        .unwrap();
    let keys: Vec<&str> = listed.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["done", "held"], "least recently written first");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE idem_test.\"{table}\"; DROP TABLE idem_test.\"{table}_migrations\""
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// Every operation an operator or the reconciler runs is served by an index on a table of
/// 100 000 records with fresh statistics: no plan reads the table sequentially, and the list
/// without a state filter merges the per-state reads of `(state, updated_at)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_operations_are_index_served() {
    let Some(url) = common::url() else { return };
    let pool = common::pool(&url, "idem-test-plans", 2).await;
    let table = common::unique("plan").replace('-', "_");
    let store = PostgresStore::with_table(pool.clone(), "idem_test", &table).unwrap();
    store.migrate().await.unwrap();
    let t = format!("idem_test.\"{table}\"");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO {t} SELECT 's' || (i % 50), 'k' || i, 'f', \
         CASE i % 20 WHEN 0 THEN 'processing' WHEN 1 THEN 'failed_retryable' ELSE 'completed' END, \
         1, md5(i::text), 1, i, 200, '{{}}', 'definitive', i, i, i + 1000 \
         FROM generate_series(1, 100000) AS i; ANALYZE {t};"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let cols = "scope, key, fingerprint, state, token_seq, token_id, attempt, lease_until, \
                outcome_status, outcome_body, outcome_class, created_at, updated_at, expires_at";
    let per_state = |extra: &str| {
        ["processing", "completed", "failed_retryable"]
            .iter()
            .map(|s| {
                format!(
                    "(SELECT {cols} FROM {t} WHERE state = '{s}' AND expires_at > 5000{extra} \
                     ORDER BY updated_at, scope, key LIMIT 10)"
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    };
    let queries = [
        // list: no filter; older than; state; scope; all three.
        format!(
            "SELECT * FROM ({}) AS u ORDER BY updated_at, scope, key LIMIT 10",
            per_state("")
        ),
        format!(
            "SELECT * FROM ({}) AS u ORDER BY updated_at, scope, key LIMIT 10",
            per_state(" AND updated_at <= 90000")
        ),
        format!(
            "SELECT {cols} FROM {t} WHERE expires_at > 5000 AND state = 'completed' \
             ORDER BY updated_at, scope, key LIMIT 10"
        ),
        format!(
            "SELECT {cols} FROM {t} WHERE expires_at > 5000 AND scope = 's7' \
             ORDER BY updated_at, scope, key LIMIT 10"
        ),
        format!(
            "SELECT {cols} FROM {t} WHERE expires_at > 5000 AND state = 'processing' \
             AND scope = 's7' AND updated_at <= 90000 ORDER BY updated_at, scope, key LIMIT 10"
        ),
        // list_in_flight, purge's batch, a claim's read, a completion.
        format!(
            "SELECT {cols} FROM {t} WHERE state = 'processing' AND lease_until <= 90000 \
             AND expires_at > 90000 ORDER BY lease_until, scope, key LIMIT 10"
        ),
        format!(
            "DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t} WHERE expires_at <= 5000 \
             ORDER BY expires_at LIMIT 10)) AND expires_at <= 5000"
        ),
        format!("SELECT {cols} FROM {t} WHERE scope = 's7' AND key = 'k7'"),
        format!(
            "UPDATE {t} SET state = 'completed', updated_at = 9 WHERE scope = 's7' AND key = 'k7' \
             AND state = 'processing' AND token_seq = 1 AND token_id = 'x' AND expires_at > 9"
        ),
    ];
    for query in &queries {
        let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!("EXPLAIN {query}")))
            .fetch_all(&pool)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{query}\n{plan}");
        if query.contains("UNION ALL") {
            assert!(plan.contains("Merge Append"), "{query}\n{plan}");
        }
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {t}; DROP TABLE idem_test.\"{table}_migrations\""
    )))
    .execute(&pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_are_reported_not_guessed() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "idem-test-corrupt").await;
    let (scope, key, fp) = names("corrupt");
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let ClaimAnswer::Claimed { .. } = store.claim(&id, &fp, &policy, t0()).await.unwrap() else {
        panic!()
    };
    sqlx::query(
        "UPDATE idem_test.idem_records SET token_id = 'nothex' WHERE scope = $1 AND key = $2",
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .execute(store.pool())
    .await
    .unwrap();
    let err = store.get(&id, t0()).await.unwrap_err();
    assert_eq!(err.kind(), "corrupt", "{err:?}");
    let err = store.claim(&id, &fp, &policy, t0()).await.unwrap_err();
    assert_eq!(err.kind(), "corrupt", "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_outcome_is_refused_before_sql() {
    // No server needed: the check comes before any statement (the pool points nowhere).
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(200))
        .connect_lazy("postgres://postgres@127.0.0.1:1/test")
        .unwrap();
    let store = PostgresStore::new(pool);
    let (scope, key, _) = names("big");
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::builder().max_outcome_bytes(8).build().unwrap();
    let outcome = Outcome::definitive(200, &serde_json::json!({"long": "0123456789"})).unwrap();
    let token = idem_core::Token::new(1);
    let err = store
        .complete(&id, token, &outcome, &policy, t0())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::OutcomeTooLarge(_)), "{err:?}");
}

/// Many concurrent claims that all find a record the rules rewrite (a stale claim under
/// `Takeover`, a `failed_retryable` record, an expired record): the compare-and-set lets exactly
/// one of them win; the others see the winner's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rewrites_have_one_winner() {
    let Some(url) = common::url() else { return };
    let handles = [
        common::store(&url, "idem-test-cas").await,
        common::store(&url, "idem-test-cas").await,
        common::store(&url, "idem-test-cas").await,
    ];
    let policy = Policy::builder()
        .stale(idem_core::StalePolicy::Takeover)
        .build()
        .unwrap();
    let t = t0();
    for (case, later, expected) in [
        ("takeover", t + policy.lease(), ClaimKind::TakenOver),
        ("retry", t, ClaimKind::Retry),
        ("expired", t + policy.ttl(), ClaimKind::ExpiredReplaced),
    ] {
        let (scope, key, fp) = names(case);
        let id = RecordId::new(scope.clone(), key.clone());
        let ClaimAnswer::Claimed { token, .. } =
            handles[0].claim(&id, &fp, &policy, t).await.unwrap()
        else {
            panic!()
        };
        if case == "retry" {
            handles[0].release(&id, token, t).await.unwrap();
        }
        let claims: Vec<_> = (0..24)
            .map(|i| {
                let store = handles[i % handles.len()].clone();
                let (id, fp) = (id.clone(), fp.clone());
                tokio::spawn(async move { store.claim(&id, &fp, &policy, later).await })
            })
            .collect();
        let mut winners = Vec::new();
        for c in claims {
            match c.await.unwrap().unwrap() {
                ClaimAnswer::Claimed {
                    token,
                    attempt,
                    kind,
                } => winners.push((token, attempt, kind)),
                ClaimAnswer::InFlight { stale: false, .. } => {}
                other => panic!("{case}: unexpected {other:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "{case}: exactly one winner, got {winners:?}"
        );
        let (won, attempt, kind) = winners[0];
        assert_eq!(kind, expected, "{case}");
        assert_eq!(won.seq, token.seq + 1, "{case}: the token continues upward");
        assert_eq!(attempt, if case == "expired" { 1 } else { 2 }, "{case}");
        let record = handles[1].get(&id, later).await.unwrap().unwrap();
        assert_eq!((record.state, record.token), (RecordState::Processing, won));
    }
}

/// A purge that meets an expired record while a claim is replacing it (row locked, not yet
/// committed) waits, then re-checks the new version and leaves it: the new claim survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_spares_a_record_replaced_while_it_waited() {
    let Some(url) = common::url() else { return };
    let app = common::unique("idem-test-purge");
    let store = common::store(&url, &app).await;
    let (scope, key, fp) = names("purge-race");
    let id = RecordId::new(scope.clone(), key.clone());
    // 1971, a few seconds of ttl: no other test has records that expire this early.
    let t = Timestamp::from_millis(40_000_000_000 + u64::from(rand::random::<u16>()) * 1000);
    let policy = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let ClaimAnswer::Claimed { .. } = store.claim(&id, &fp, &policy, t).await.unwrap() else {
        panic!()
    };
    let later = t + Duration::from_secs(5); // expired at `later`

    // A claim replacing the expired record, held open in a transaction.
    let mut replacer = store.pool().acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *replacer).await.unwrap();
    let replaced = sqlx::query(
        "UPDATE idem_test.idem_records SET expires_at = $3, lease_until = $3, token_seq = token_seq + 1 \
         WHERE scope = $1 AND key = $2",
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .bind(i64::try_from((later + Duration::from_secs(3600)).as_millis()).unwrap())
    .execute(&mut *replacer)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(replaced, 1);

    let purge = {
        let store = store.clone();
        tokio::spawn(async move { store.purge_expired(later, 10).await })
    };
    let admin = common::pool(&url, "idem-test-admin", 1).await;
    common::wait_until_blocked_on_a_lock(&admin, &app).await;
    sqlx::query("COMMIT").execute(&mut *replacer).await.unwrap();
    purge.await.unwrap().unwrap();
    let record = store.get(&id, later).await.unwrap();
    assert!(
        record.is_some_and(|r| r.token.seq == 2),
        "the replaced record must survive the purge"
    );
}
