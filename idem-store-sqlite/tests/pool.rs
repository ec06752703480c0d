//! A write waiting for its turn at the file's write lock holds none of the handle's connections:
//! while another connection holds the lock, the writes of a two-connection handle queue and its
//! reads (a get, a replay) still answer. Before, each waiting write kept a connection, so the
//! reads waited for the lock too (here until the writes' busy timeout, 30 s).

use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordState, Scope, Timestamp,
};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::Connection;

const NOW: Timestamp = Timestamp::from_millis(1_234_567_890_000);
/// Long enough that no write gives up while the test holds the lock.
const BUSY: Duration = Duration::from_secs(30);
/// A hang detector, not a measurement: a read that waits for the lock waits for `BUSY`.
const HANG: Duration = Duration::from_secs(10);

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({"title": "x"})).unwrap()
}

fn rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
        .unwrap()
}

#[tokio::test]
async fn reads_answer_while_writes_wait_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::builder(&path)
        .busy_timeout(BUSY)
        .max_connections(2)
        .open()
        .unwrap();
    store.migrate().unwrap();
    let policy = Policy::default();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&scope(), &key("k-done"), &fp(), &policy, NOW)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let outcome = Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap();
    store
        .complete(&scope(), &key("k-done"), token, &outcome, &policy, NOW)
        .await
        .unwrap();

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
                    .claim(&scope(), &key(&format!("k-new-{i}")), &fp(), &policy, NOW)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let found = tokio::time::timeout(HANG, store.get(&scope(), &key("k-done"), NOW))
        .await
        .expect("a read queued behind the writes waiting for the lock")
        .unwrap()
        .expect("the completed record");
    assert_eq!(found.state, RecordState::Completed);
    let replay = tokio::time::timeout(
        HANG,
        store.claim(&scope(), &key("k-done"), &fp(), &policy, NOW),
    )
    .await
    .expect("a replay queued behind the writes waiting for the lock")
    .unwrap();
    assert!(matches!(replay, ClaimAnswer::Replay(_)), "{replay:?}");
    // The reads answered while the writes still waited: nothing was written meanwhile.
    assert!(writers.iter().all(|w| !w.is_finished()));
    assert_eq!(rows(&blocker), 1);

    blocker.execute_batch("ROLLBACK").unwrap();
    for writer in writers {
        let answer = tokio::time::timeout(HANG, writer)
            .await
            .expect("a write did not finish after the lock was released")
            .unwrap()
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }), "{answer:?}");
    }
    assert_eq!(rows(&blocker), 5);
}
