//! A busy database answers `StoreError::Unavailable` (HTTP 503), never another error (HTTP 500):
//! another connection holds the write lock (`BEGIN IMMEDIATE`) or the whole file
//! (`locking_mode=EXCLUSIVE`) past the store's (tiny) busy timeout, for every operation and for a
//! connection opened while the file is locked. Each case waits for the busy timeout: 20 ms of
//! real time, on purpose.
//!
//! And a write waiting for its turn at the file's write lock holds none of the handle's
//! connections: while another connection holds the lock, the writes of a two-connection handle
//! queue and its reads still answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope,
    StoreError, Timestamp, Token,
};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::Connection;

const NOW: Timestamp = Timestamp::from_millis(1_234_567_890_000);
const BUSY: Duration = Duration::from_millis(20);

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({"title": "x"})).unwrap()
}

fn outcome() -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap()
}

/// A migrated file with one `processing` record (`k-held`, its token returned) and one
/// completed record (`k-done`).
async fn setup(dir: &Path) -> (PathBuf, Token) {
    let path = dir.join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    let policy = Policy::default();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope(), key("k-done")), &fp(), &policy, NOW)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    store
        .complete(
            &RecordId::new(scope(), key("k-done")),
            token,
            &outcome(),
            &policy,
            NOW,
        )
        .await
        .unwrap();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope(), key("k-held")), &fp(), &policy, NOW)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    (path, token)
}

fn busy_store(path: &Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::builder(path)
        .busy_timeout(BUSY)
        .max_connections(2)
        .open()
}

#[track_caller]
fn unavailable<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(e) if e.is_unavailable() => {}
        other => panic!("{what}: expected StoreError::Unavailable, got {other:?}"),
    }
}

/// Every write answers `Unavailable` while another connection holds the write lock; a replay
/// (a read) still answers; nothing was written.
#[tokio::test]
async fn writes_under_a_foreign_write_lock_are_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = setup(dir.path()).await;
    let store = busy_store(&path).unwrap();
    let policy = Policy::default();
    let blocker = Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    unavailable(
        "claim",
        store
            .claim(&RecordId::new(scope(), key("k-new")), &fp(), &policy, NOW)
            .await,
    );
    let later = NOW + Duration::from_secs(1);
    unavailable(
        "complete",
        store
            .complete(
                &RecordId::new(scope(), key("k-held")),
                token,
                &outcome(),
                &policy,
                later,
            )
            .await,
    );
    unavailable(
        "release",
        store
            .release(&RecordId::new(scope(), key("k-held")), token, later)
            .await,
    );
    unavailable(
        "extend",
        store
            .extend(
                &RecordId::new(scope(), key("k-held")),
                token,
                Duration::from_secs(60),
                later,
            )
            .await,
    );
    unavailable(
        "purge",
        store
            .purge_expired(NOW + Duration::from_secs(365 * 24 * 3600), 10)
            .await,
    );
    unavailable("migrate", store.migrate());
    // WAL: readers are not blocked by a writer.
    assert!(matches!(
        store
            .claim(&RecordId::new(scope(), key("k-done")), &fp(), &policy, NOW)
            .await
            .unwrap(),
        ClaimAnswer::Replay(_)
    ));

    blocker.execute_batch("ROLLBACK").unwrap();
    let record = store
        .get(&RecordId::new(scope(), key("k-held")), later)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Processing, "nothing was written");
    assert_eq!(record.token, token);
    assert!(
        store
            .get(&RecordId::new(scope(), key("k-new")), NOW)
            .await
            .unwrap()
            .is_none()
    );
}

/// A connection in `locking_mode=EXCLUSIVE` that has written keeps every other connection out,
/// readers included: opening a store handle then (its first connection sets WAL and reads the
/// file) answers `Unavailable`, not `Misconfigured` or `Backend`. (While a handle holds a
/// connection, no other connection can take that lock in WAL mode, so the other operations are
/// covered by the write-lock test above.)
#[tokio::test]
async fn opening_under_an_exclusive_file_lock_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (path, token) = setup(dir.path()).await;
    let blocker = Connection::open(&path).unwrap();
    blocker
        .execute_batch(
            "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; \
             UPDATE idem_records SET updated_at = updated_at; COMMIT;",
        )
        .unwrap();
    // The exclusive lock is kept after the commit.
    unavailable("open", busy_store(&path));
    drop(blocker);
    // Once the lock is gone the store opens and answers, and nothing was written.
    let store = busy_store(&path).unwrap();
    let record = store
        .get(&RecordId::new(scope(), key("k-held")), NOW)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state, record.token),
        (RecordState::Processing, token)
    );
}

/// Long enough that no write gives up while the test holds the lock.
const PATIENT: Duration = Duration::from_secs(30);
/// A hang detector, not a measurement: a read that waits for the lock waits for `PATIENT`.
const HANG: Duration = Duration::from_secs(10);

fn rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
        .unwrap()
}

/// Before, each waiting write kept a connection, so the reads waited for the lock too (here
/// until the writes' busy timeout).
#[tokio::test]
async fn reads_answer_while_writes_wait_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = setup(dir.path()).await;
    let store = SqliteStore::builder(&path)
        .busy_timeout(PATIENT)
        .max_connections(2)
        .open()
        .unwrap();
    let policy = Policy::default();
    let blocker = Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Four claims of new keys: the first waits in SQLite's busy handler (its turn taken, one
    // connection held), the other three wait for their turn.
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let policy = Policy::default();
                store
                    .claim(
                        &RecordId::new(scope(), key(&format!("k-new-{i}"))),
                        &fp(),
                        &policy,
                        NOW,
                    )
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let found = tokio::time::timeout(HANG, store.get(&RecordId::new(scope(), key("k-done")), NOW))
        .await
        .expect("a read queued behind the writes waiting for the lock")
        .unwrap()
        .expect("the completed record");
    assert_eq!(found.state, RecordState::Completed);
    let replay = tokio::time::timeout(
        HANG,
        store.claim(&RecordId::new(scope(), key("k-done")), &fp(), &policy, NOW),
    )
    .await
    .expect("a replay queued behind the writes waiting for the lock")
    .unwrap();
    assert!(matches!(replay, ClaimAnswer::Replay(_)), "{replay:?}");
    // The reads answered while the writes still waited: nothing was written meanwhile.
    assert!(writers.iter().all(|w| !w.is_finished()));
    assert_eq!(rows(&blocker), 2);

    blocker.execute_batch("ROLLBACK").unwrap();
    for writer in writers {
        let answer = tokio::time::timeout(HANG, writer)
            .await
            .expect("a write did not finish after the lock was released")
            .unwrap()
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }), "{answer:?}");
    }
    assert_eq!(rows(&blocker), 6);
}
