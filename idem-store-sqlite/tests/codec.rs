//! Encrypted outcomes on a real SQLite file: the bytes at rest (the `outcome_body` column, and
//! the database and WAL files themselves) never hold the response, key rotation works across
//! executors, and a wrong key is an error that never runs the effect again. Runs are counted at
//! the sink.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::codec::{AesGcmCodec, CodecError, sealed_info};
use idem_core::{Error, Execution, Executor, Fingerprint, IdempotencyKey, Outcome, Scope};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::{Connection, TransactionBehavior};
use serde_json::json;

const SECRET: &str = "SECRET-MARKER-4242";

fn scope() -> Scope {
    Scope::new("tenant-a/charge").unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("charge", &json!({"cents": 500})).unwrap()
}

fn outcome() -> Outcome {
    Outcome::definitive(201, &json!({"charge_id": "ch_1", "card": SECRET})).unwrap()
}

async fn charge(executor: &Executor, k: &str, runs: &Arc<AtomicUsize>) -> Result<Execution, Error> {
    let runs = runs.clone();
    executor
        .run(
            &scope(),
            &IdempotencyKey::new(k).unwrap(),
            &fp(),
            |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                outcome()
            },
        )
        .await
}

/// The body column as SQLite holds it, read with plain SQL.
fn body_at_rest(path: &Path, k: &str) -> String {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT outcome_status, outcome_body FROM idem_records WHERE key = ?1",
            [k],
            |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
        )
        .map(|(status, body)| {
            assert_eq!(status, 201, "the status stays clear");
            body
        })
        .unwrap()
}

/// Every byte of the database and its WAL.
fn file_bytes(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    let wal = path.with_extension("sqlite3-wal");
    if let Ok(more) = std::fs::read(wal) {
        bytes.extend(more);
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn aes(kid: &str, key: u8) -> AesGcmCodec {
    AesGcmCodec::new(kid, [key; 32]).unwrap()
}

#[tokio::test]
async fn the_file_never_holds_the_response() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));

    // The control: without a codec the secret is on disk, so the check below can fail.
    let clear = Executor::new(store.clone());
    charge(&clear, "clear", &runs).await.unwrap();
    assert!(body_at_rest(&path, "clear").contains(SECRET));
    assert!(contains(&file_bytes(&path), SECRET));

    let dir2 = tempfile::tempdir().unwrap();
    let path = dir2.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    let executor = Executor::new(store.clone()).with_codec(aes("2026-01", 1));
    charge(&executor, "k-1", &runs).await.unwrap();
    let body = body_at_rest(&path, "k-1");
    assert!(!body.contains(SECRET) && !body.contains("ch_1"), "{body}");
    assert_eq!(sealed_info(&body).unwrap().key_id, "2026-01");
    assert!(!contains(&file_bytes(&path), SECRET));

    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert!(replay.is_replay());
    assert_eq!(replay.outcome(), &outcome());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one run per database");
}

#[tokio::test]
async fn rotation_and_a_wrong_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));

    charge(
        &Executor::new(store.clone()).with_codec(aes("k1", 1)),
        "old",
        &runs,
    )
    .await
    .unwrap();
    let rotated =
        Executor::new(store.clone()).with_codec(aes("k2", 2).with_old_key("k1", [1; 32]).unwrap());
    assert_eq!(
        charge(&rotated, "old", &runs).await.unwrap().outcome(),
        &outcome()
    );
    charge(&rotated, "new", &runs).await.unwrap();
    assert_eq!(
        sealed_info(&body_at_rest(&path, "old")).unwrap().key_id,
        "k1"
    );
    assert_eq!(
        sealed_info(&body_at_rest(&path, "new")).unwrap().key_id,
        "k2"
    );

    let before = body_at_rest(&path, "new");
    let wrong = Executor::new(store.clone()).with_codec(aes("k2", 7));
    let err = charge(&wrong, "new", &runs).await.unwrap_err();
    assert!(
        matches!(err, Error::Decode(CodecError::Decrypt { .. })),
        "{err:?}"
    );
    let unknown = charge(&wrong, "old", &runs).await.unwrap_err();
    assert!(
        matches!(unknown, Error::Decode(CodecError::UnknownKey { .. })),
        "{unknown:?}"
    );
    assert_eq!(body_at_rest(&path, "new"), before, "nothing written");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "a wrong key never runs the effect again"
    );
}

/// Transactional completion (`complete_in`) with the attempt's policy and encoding: the effect
/// row and the sealed record commit together.
#[tokio::test]
async fn complete_in_stores_the_sealed_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    store
        .with_connection(|c| c.execute_batch("CREATE TABLE charges (id TEXT PRIMARY KEY)"))
        .await
        .unwrap()
        .unwrap();
    let executor = Executor::new(store.clone()).with_codec(aes("k1", 1));
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let (store2, runs) = (store.clone(), runs.clone());
        let got = executor
            .run(
                &scope(),
                &IdempotencyKey::new("tx").unwrap(),
                &fp(),
                |attempt| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let answer = outcome();
                    let stored = attempt.encode(&answer).unwrap();
                    let a = attempt.clone();
                    store2
                        .clone()
                        .with_connection(move |conn| {
                            let tx = conn
                                .transaction_with_behavior(TransactionBehavior::Immediate)
                                .unwrap();
                            tx.execute("INSERT INTO charges (id) VALUES ('ch_1')", [])
                                .unwrap();
                            store2.complete_in(&tx, &a, &stored).unwrap();
                            tx.commit().unwrap();
                            a.mark_recorded();
                        })
                        .await
                        .unwrap();
                    answer
                },
            )
            .await
            .unwrap();
        assert_eq!(got.outcome(), &outcome());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let body = body_at_rest(&path, "tx");
    assert!(sealed_info(&body).is_some() && !body.contains(SECRET));
}
