//! SQLite-specific behaviour beyond the conformance suite: completion inside the caller's
//! transaction, migrations and table names, durability settings, error classification and
//! corrupt rows. Real files in temporary directories; time is injected.

use idem_core::store::CheckpointStore;
use std::path::PathBuf;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Attempt, Executor, Fingerprint, IdempotencyKey, KeyStore, Maintenance, ManualClock, Outcome,
    Policy, RecordId, RecordState, Scope, StalePolicy, StoreError, Timestamp, Token,
};
use idem_store_sqlite::rusqlite::{Connection, TransactionBehavior, params};
use idem_store_sqlite::{SCHEMA_TABLE, SqliteStore, Synchronous, TableName, TableNameError};

const NOW: Timestamp = Timestamp::from_millis(1_234_567_890_000);

struct Db {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: SqliteStore,
}

fn db() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    Db {
        _dir: dir,
        path,
        store,
    }
}

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap()
}

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(
        "create_ticket",
        &serde_json::json!({"title": "printer on fire"}),
    )
    .unwrap()
}

fn ticket(id: &str) -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"ticket_id": id})).unwrap()
}

fn claimed(answer: ClaimAnswer) -> (Token, u32) {
    match answer {
        ClaimAnswer::Claimed { token, attempt, .. } => (token, attempt),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn effects_table(conn: &Connection) {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tickets (idem_key TEXT NOT NULL, title TEXT NOT NULL)",
    )
    .unwrap();
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The executor's handle on a claim made directly on the store, with `policy` and a clock at `now`.
fn attempt_of(
    store: &SqliteStore,
    key: &IdempotencyKey,
    claim: &ClaimAnswer,
    policy: &Policy,
    now: Timestamp,
) -> Attempt {
    Executor::new(store.clone())
        .with_policy(*policy)
        .with_clock(ManualClock::new(now))
        .attempt_for(&scope(), key, claim)
        .expect("claimed")
}

/// The effect and the completion in one transaction of the caller: `commit` decides both.
fn effect_and_complete(
    store: &SqliteStore,
    conn: &mut Connection,
    attempt: &Attempt,
    commit: bool,
) -> CompleteAnswer {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute(
        "INSERT INTO tickets (idem_key, title) VALUES (?1, 'printer on fire')",
        params![attempt.key().as_str()],
    )
    .unwrap();
    let answer = store.complete_in(&tx, attempt, &ticket("T-1")).unwrap();
    if commit {
        tx.commit().unwrap();
        attempt.mark_recorded();
    } // else dropped: rolled back
    answer
}

#[tokio::test]
async fn transactional_completion_rolled_back_leaves_nothing_and_retry_runs_once() {
    let Db { store, .. } = &db();
    let mut conn = store.connection().unwrap();
    effects_table(&conn);
    let k = key("wf-1:step-1:create_ticket");

    let claim = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
        .await
        .unwrap();
    let (token, attempt) = claimed(claim.clone());
    assert_eq!(attempt, 1);
    // The completion succeeds inside the transaction, then the transaction is rolled back
    // (a later step of the caller failed).
    let first = attempt_of(store, &k, &claim, &policy(), NOW);
    assert_eq!(
        effect_and_complete(store, &mut conn, &first, false),
        CompleteAnswer::Completed
    );
    assert_eq!(
        count(&conn, "SELECT count(*) FROM tickets"),
        0,
        "no effect row"
    );
    let record = store
        .get(&RecordId::new(scope(), k.clone()), NOW)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Processing, "no completed record");
    assert_eq!(record.outcome, None);

    // The holder gives up; the retry claims again, and its effect and completion commit.
    store
        .release(&RecordId::new(scope(), k.clone()), token, NOW)
        .await
        .unwrap();
    let claim = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
        .await
        .unwrap();
    assert_eq!(claimed(claim.clone()).1, 2);
    let second = attempt_of(store, &k, &claim, &policy(), NOW);
    assert_eq!(
        effect_and_complete(store, &mut conn, &second, true),
        CompleteAnswer::Completed
    );
    // Every later call replays; the effect happened exactly once.
    for _ in 0..3 {
        let answer = store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap();
        assert_eq!(answer, ClaimAnswer::Replay(ticket("T-1")));
    }
    assert_eq!(count(&conn, "SELECT count(*) FROM tickets"), 1);
}

#[tokio::test]
async fn transactional_completion_fenced_holder_rolls_back_its_effect() {
    let Db { store, .. } = &db();
    let mut conn = store.connection().unwrap();
    effects_table(&conn);
    let k = key("wf-2:step-1:create_ticket");
    let takeover = policy()
        .to_builder()
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap();

    let old = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &takeover, NOW)
        .await
        .unwrap();
    let later = NOW + Duration::from_secs(31);
    let new = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &takeover, later)
        .await
        .unwrap();
    let (old, new) = (
        attempt_of(store, &k, &old, &policy(), NOW),
        attempt_of(store, &k, &new, &policy(), NOW),
    );

    // The paused old holder wakes up: fenced inside its transaction, so it rolls back.
    assert_eq!(
        effect_and_complete(store, &mut conn, &old, false),
        CompleteAnswer::Fenced
    );
    assert_eq!(
        effect_and_complete(store, &mut conn, &new, true),
        CompleteAnswer::Completed
    );
    assert_eq!(count(&conn, "SELECT count(*) FROM tickets"), 1);
    let record = store
        .get(&RecordId::new(scope(), k.clone()), later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state, record.token),
        (RecordState::Completed, new.token())
    );
}

#[tokio::test]
async fn transactional_completion_on_a_pooled_connection() {
    let Db { store, .. } = &db();
    effects_table(&store.connection().unwrap());
    let k = key("wf-3:step-1:create_ticket");
    let claim = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
        .await
        .unwrap();
    let (s, a) = (store.clone(), attempt_of(store, &k, &claim, &policy(), NOW));
    let answer = store
        .with_connection(move |conn| effect_and_complete(&s, conn, &a, true))
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    assert!(matches!(
        store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap(),
        ClaimAnswer::Replay(_)
    ));
}

#[tokio::test]
async fn complete_in_outside_a_transaction_is_refused() {
    let Db { store, .. } = &db();
    let k = key("wf-4:step-1:create_ticket");
    let claim = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
        .await
        .unwrap();
    let attempt = attempt_of(store, &k, &claim, &policy(), NOW);
    let conn = store.connection().unwrap();
    let err = store
        .complete_in(&conn, &attempt, &ticket("T"))
        .unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    let record = store
        .get(&RecordId::new(scope(), k.clone()), NOW)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Processing, "nothing written");
}

#[tokio::test]
async fn complete_in_refuses_an_outcome_over_the_limit() {
    let Db { store, .. } = &db();
    let small = policy().to_builder().max_outcome_bytes(8).build().unwrap();
    let k = key("wf-5:step-1:create_ticket");
    let claim = store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &small, NOW)
        .await
        .unwrap();
    let attempt = attempt_of(store, &k, &claim, &small, NOW);
    let mut conn = store.connection().unwrap();
    let tx = conn.transaction().unwrap();
    let err = store
        .complete_in(&tx, &attempt, &ticket("T-123456"))
        .unwrap_err();
    assert!(matches!(err, StoreError::OutcomeTooLarge(_)), "{err:?}");
}

#[test]
fn migrate_is_idempotent_and_versioned() {
    let Db { store, path, .. } = &db();
    store.migrate().unwrap();
    SqliteStore::open(path).unwrap().migrate().unwrap();
    let conn = Connection::open(path).unwrap();
    let version: i64 = conn
        .query_row(
            &format!("SELECT version FROM {SCHEMA_TABLE} WHERE table_name = 'idem_records'"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, i64::from(store.latest_schema_version()));
    let indexes = count(
        &conn,
        "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_records' \
         AND name IN ('idem_records_in_flight', 'idem_records_expires_at')",
    );
    assert_eq!(indexes, 2, "the in-flight and expiry indexes exist");
    // The reconciliation and purge queries use them.
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT * FROM idem_records WHERE state = 'processing' \
             AND lease_until <= 5 AND expires_at > 5 ORDER BY lease_until LIMIT 10",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("idem_records_in_flight"), "{plan}");
}

/// A file made by the previous release (schema version 2: in-flight index on every record,
/// `(updated_at)` index), with records in every state, upgrades in place: the records read back
/// as they were, replay, complete and list as before, on the indexes of version 3 and with the
/// checkpoints column of version 4; the held record takes checkpoints.
#[tokio::test]
async fn a_version_2_file_upgrades_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE idem_records (
                scope TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
                state TEXT NOT NULL, token_seq INTEGER NOT NULL, token_id TEXT NOT NULL,
                attempt INTEGER NOT NULL, lease_until INTEGER NOT NULL, outcome_status INTEGER,
                outcome_body TEXT, outcome_class TEXT, created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
                PRIMARY KEY (scope, key));
             CREATE INDEX \"idem_records_in_flight\" ON idem_records (state, lease_until);
             CREATE INDEX \"idem_records_expires_at\" ON idem_records (expires_at);
             CREATE INDEX \"idem_records_state_updated\" ON idem_records (state, updated_at);
             CREATE INDEX \"idem_records_updated\" ON idem_records (updated_at);
             CREATE TABLE {SCHEMA_TABLE} (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL);
             INSERT INTO {SCHEMA_TABLE} VALUES ('idem_records', 2);"
        ))
        .unwrap();
    }
    // Records made by the rules every store runs (on a `MemoryStore`), written as version 2's
    // columns: what an existing user's file holds.
    let memory = idem_core::MemoryStore::new();
    let p = policy();
    let (done, _) = claimed(
        memory
            .claim(&RecordId::new(scope(), key("done")), &fp(), &p, NOW)
            .await
            .unwrap(),
    );
    memory
        .complete(
            &RecordId::new(scope(), key("done")),
            done,
            &ticket("T-1"),
            &p,
            NOW,
        )
        .await
        .unwrap();
    let (held, _) = claimed(
        memory
            .claim(&RecordId::new(scope(), key("held")), &fp(), &p, NOW)
            .await
            .unwrap(),
    );
    let before = memory
        .get(&RecordId::new(scope(), key("done")), NOW)
        .await
        .unwrap()
        .unwrap();
    {
        let conn = Connection::open(&path).unwrap();
        for k in ["done", "held"] {
            let record = memory
                .get(&RecordId::new(scope(), key(k)), NOW)
                .await
                .unwrap()
                .unwrap();
            let r = idem_core::store::columns::RawRecord::from_record(&record);
            conn.execute(
                "INSERT INTO idem_records VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                params![
                    r.scope,
                    r.key,
                    r.fingerprint,
                    r.state,
                    r.token_seq,
                    r.token_id,
                    r.attempt,
                    r.lease_until,
                    r.outcome_status,
                    r.outcome_body,
                    r.outcome_class,
                    r.created_at,
                    r.updated_at,
                    r.expires_at
                ],
            )
            .unwrap();
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 2);

    store.migrate().unwrap();
    SqliteStore::open(&path).unwrap().migrate().unwrap(); // idempotent
    assert_eq!(
        store.schema_version().await.unwrap(),
        store.latest_schema_version()
    );
    let conn = Connection::open(&path).unwrap();
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name || ': ' || sql FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'idem_records' AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(indexes.len(), 3, "{indexes:?}");
    assert!(
        indexes[1].starts_with("idem_records_in_flight")
            && indexes[1].contains("WHERE state = 'processing'"),
        "{indexes:?}"
    );
    assert!(
        !indexes
            .iter()
            .any(|i| i.starts_with("idem_records_updated:"))
    );

    assert_eq!(
        store
            .get(&RecordId::new(scope(), key("done")), NOW)
            .await
            .unwrap()
            .as_ref(),
        Some(&before)
    );
    assert!(matches!(
        store.claim(&RecordId::new(scope(), key("done")), &fp(), &p, NOW).await.unwrap(),
        ClaimAnswer::Replay(o) if o == ticket("T-1")
    ));
    let later = NOW + Duration::from_secs(60);
    let stale = store.list_in_flight(later, 10).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].key, key("held"));
    assert!(stale[0].checkpoints.is_empty());
    let step = idem_core::Checkpoint::new("charged", "{\"id\": 1}", later).unwrap();
    assert_eq!(
        store
            .checkpoint(&RecordId::new(scope(), key("held")), held, &step, &p)
            .await
            .unwrap(),
        idem_core::machine::CheckpointAnswer::Saved
    );
    let with_step = store
        .get(&RecordId::new(scope(), key("held")), later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(with_step.checkpoints, vec![step]);
    assert_eq!(
        store
            .complete(
                &RecordId::new(scope(), key("held")),
                held,
                &ticket("T-2"),
                &p,
                later
            )
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    assert!(store.list_in_flight(later, 10).await.unwrap().is_empty());
    let all = store
        .list(&idem_core::store::ListFilter::default(), later, 10)
        .await
        .unwrap();
    let keys: Vec<&str> = all.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["done", "held"], "least recently written first");
}

#[tokio::test]
async fn schema_version_reads_without_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 0);
    let conn = Connection::open(&path).unwrap();
    assert_eq!(
        count(&conn, "SELECT count(*) FROM sqlite_master"),
        0,
        "no table, no index"
    );
    store.migrate().unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        store.latest_schema_version()
    );
}

#[test]
fn migrate_refuses_a_newer_schema() {
    let Db { store, path, .. } = &db();
    Connection::open(path)
        .unwrap()
        .execute(&format!("UPDATE {SCHEMA_TABLE} SET version = 99"), [])
        .unwrap();
    let err = store.migrate().unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
}

#[tokio::test]
async fn custom_tables_are_independent_in_one_file() {
    let Db { store, path, .. } = &db();
    let other = SqliteStore::builder(path)
        .table_name("agent_tool_calls")
        .unwrap()
        .open()
        .unwrap();
    other.migrate().unwrap();
    assert_eq!(other.table().as_str(), "agent_tool_calls");
    let k = key("wf-6:step-1:create_ticket");
    claimed(
        store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap(),
    );
    claimed(
        other
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap(),
    );
    let conn = store.connection().unwrap();
    assert_eq!(count(&conn, "SELECT count(*) FROM agent_tool_calls"), 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM idem_records"), 1);
}

#[test]
fn bad_table_names_are_refused_with_a_typed_error() {
    let builder = SqliteStore::builder("unused.sqlite3");
    assert_eq!(
        builder.clone().table_name("").unwrap_err(),
        TableNameError::Empty
    );
    assert!(matches!(
        builder.clone().table_name("x\"; DROP TABLE y; --"),
        Err(TableNameError::InvalidCharacter { index: 1, ch: '"' })
    ));
    assert!(matches!(
        builder.table_name("sqlite_schema"),
        Err(TableNameError::Reserved { .. })
    ));
    assert!("ok_name".parse::<TableName>().is_ok());
}

#[tokio::test]
async fn durability_is_full_by_default_and_normal_on_request() {
    let Db { store, path, .. } = &db();
    let pragma = |s: &SqliteStore| -> (i64, String) {
        let conn = s.connection().unwrap();
        (
            conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap(),
            conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap(),
        )
    };
    assert_eq!(pragma(store), (2, "wal".to_owned()), "FULL and WAL");
    // The pooled connections too.
    let pooled: i64 = store
        .with_connection(|c| c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap())
        .await
        .unwrap();
    assert_eq!(pooled, 2);
    let normal = SqliteStore::builder(path)
        .synchronous(Synchronous::Normal)
        .open()
        .unwrap();
    assert_eq!(pragma(&normal).0, 1, "NORMAL");
}

#[tokio::test]
async fn a_write_lock_held_past_the_busy_timeout_is_unavailable() {
    let Db { path, .. } = &db();
    // Short busy timeout on purpose: this test waits for it (50 ms of real time).
    let store = SqliteStore::builder(path)
        .busy_timeout(Duration::from_millis(50))
        .open()
        .unwrap();
    let blocker = Connection::open(path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = store
        .claim(
            &RecordId::new(scope(), key("wf-7:step-1:x")),
            &fp(),
            &policy(),
            NOW,
        )
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    blocker.execute_batch("ROLLBACK").unwrap();
    // The store recovers once the lock is gone.
    claimed(
        store
            .claim(
                &RecordId::new(scope(), key("wf-7:step-1:x")),
                &fp(),
                &policy(),
                NOW,
            )
            .await
            .unwrap(),
    );
}

#[test]
fn a_file_that_cannot_be_opened_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let err = SqliteStore::open(dir.path().join("missing-dir/idem.sqlite3")).unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}

#[tokio::test]
async fn before_migrate_operations_fail_as_backend_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("fresh.sqlite3")).unwrap();
    let err = store
        .claim(&RecordId::new(scope(), key("k")), &fp(), &policy(), NOW)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
}

#[tokio::test]
async fn rows_that_do_not_parse_are_corrupt() {
    let Db { store, .. } = &db();
    let conn = store.connection().unwrap();
    let cases = [
        ("token_id", "'not-hex'"),
        ("state", "'done'"),
        ("fingerprint", "'ABC'"),
        ("lease_until", "-5"),
        ("lease_until", "'soon'"),
        ("outcome_body", "'{not json'"),
        ("attempt", "5000000000"),
    ];
    for (i, (column, value)) in cases.iter().enumerate() {
        let k = key(&format!("wf-8:step-{i}"));
        let (token, _) = claimed(
            store
                .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
                .await
                .unwrap(),
        );
        store
            .complete(
                &RecordId::new(scope(), k.clone()),
                token,
                &ticket("T"),
                &policy(),
                NOW,
            )
            .await
            .unwrap();
        conn.execute(
            &format!("UPDATE idem_records SET {column} = {value} WHERE key = ?1"),
            [k.as_str()],
        )
        .unwrap();
        let err = store
            .get(&RecordId::new(scope(), k.clone()), NOW)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "{column}: {err:?}"
        );
        let err = store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "{column}: {err:?}"
        );
    }
}

#[tokio::test]
async fn the_outcome_body_is_stored_as_the_exact_text() {
    let Db { store, .. } = &db();
    let k = key("wf-9:step-1:create_ticket");
    let text = "{ \"z\" : \"\\u00e9 😀\",\n  \"a\":[1.50, 1e2] }";
    let outcome = Outcome::from_json_text(200, text, idem_core::OutcomeClass::Definitive).unwrap();
    let (token, _) = claimed(
        store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
            .await
            .unwrap(),
    );
    store
        .complete(
            &RecordId::new(scope(), k.clone()),
            token,
            &outcome,
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    let stored: String = store
        .connection()
        .unwrap()
        .query_row(
            "SELECT outcome_body FROM idem_records WHERE key = ?1",
            [k.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, text, "the column holds the body as given");
    match store
        .claim(&RecordId::new(scope(), k.clone()), &fp(), &policy(), NOW)
        .await
        .unwrap()
    {
        ClaimAnswer::Replay(o) => assert_eq!(o.body(), text),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn timestamps_at_the_far_end_of_time_round_trip() {
    let Db { store, .. } = &db();
    let forever = Policy::builder()
        .lease(Duration::from_secs(30))
        .ttl(Duration::MAX)
        .build()
        .unwrap();
    let k = key("wf-10:step-1:create_ticket");
    claimed(
        store
            .claim(&RecordId::new(scope(), k.clone()), &fp(), &forever, NOW)
            .await
            .unwrap(),
    );
    let record = store
        .get(&RecordId::new(scope(), k.clone()), NOW)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.expires_at, Timestamp::from_millis(u64::MAX));
    assert_eq!(record.lease_until, NOW + Duration::from_secs(30));
    assert_eq!(record.created_at, NOW);
}

#[test]
fn debug_shows_settings_and_backend_is_sqlite() {
    let Db { store, .. } = &db();
    let text = format!("{store:?}");
    assert!(
        text.contains("idem_records") && text.contains("Full"),
        "{text}"
    );
    assert_eq!(store.backend(), "sqlite");
}
