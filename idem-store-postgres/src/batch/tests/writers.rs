//! A transaction writing a record (a `complete_in` not yet committed) holds up neither a replay
//! nor a batch of claims: shown by the server, which reports a connection waiting on a lock.

use super::*;

/// Runs `op` to its end, and fails the moment a connection tagged `app` waits on a lock instead
/// (the server's `pg_stat_activity` says so): an event either way, never a time.
async fn without_waiting_on_a_lock<T>(admin: &PgPool, app: &str, op: impl Future<Output = T>) -> T {
    let blocked = async {
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
    };
    tokio::select! {
        done = op => done,
        () = blocked => panic!("a connection of {app} waited on a lock"),
    }
}

/// A transaction of another session that has rewritten `id`'s row (an indexed column: a new
/// row version) and stays open until it is dropped or rolled back.
async fn writing(
    store: &PostgresStore,
    id: &RecordId,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut writer = store.pool.begin().await.unwrap();
    let sql = "UPDATE idem_test.idem_records SET updated_at = updated_at + 1 \
               WHERE scope = $1 AND key = $2";
    let updated = sqlx::query(sql)
        .bind(id.scope().as_str())
        .bind(id.key().as_str())
        .execute(&mut *writer)
        .await
        .unwrap();
    assert_eq!(updated.rows_affected(), 1);
    writer
}

/// With the lane idle (and with batching off) a claim reads first: a replay is one `SELECT`,
/// which a transaction writing the record does not hold up (a plain insert's unique check
/// would wait for it; idem's leaves a key its snapshot holds alone before that check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_lane_idle_a_replay_reads_and_does_not_wait_for_a_writer_of_its_record() {
    let Some(url) = postgres_url() else { return };
    let admin = pool(&url, "idem-batch-admin", 1).await;
    for batching in [true, false] {
        let app = unique("idem-batch-idle");
        let store = store_of(&url, &app, "idem_records", 4).await;
        let store = store.with_batching(batching);
        store.migrate().await.unwrap();
        let id = &ids("batch-idle", 1)[0];
        let outcome = Outcome::definitive(200, &serde_json::json!({"sent": 1})).unwrap();
        completed(&store, id, &outcome).await;
        let writer = writing(&store, id).await;
        let (fp, policy) = (fp(), Policy::default());
        let replay = store.claim(id, &fp, &policy, NOW);
        let replay = without_waiting_on_a_lock(&admin, &app, replay).await;
        writer.rollback().await.unwrap();
        assert_eq!(
            replay.unwrap(),
            ClaimAnswer::Replay(outcome),
            "batching {batching}"
        );
    }
}

/// Under load a claim inserts first, but a key that exists is left alone without the unique
/// check, which would wait for a transaction writing its row (a `complete_in` not yet
/// committed) and hold the whole batch, others' new keys too, until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_batch_does_not_wait_for_a_transaction_writing_a_key_of_it() {
    let Some(url) = postgres_url() else { return };
    let admin = pool(&url, "idem-batch-admin", 1).await;
    let app = unique("idem-batch-writer");
    let store = store_of(&url, &app, "idem_records", 4).await;
    store.migrate().await.unwrap();
    let ids = ids("batch-writer", 2);
    let outcome = Outcome::definitive(200, &serde_json::json!({"sent": 1})).unwrap();
    completed(&store, &ids[0], &outcome).await;
    let writer = writing(&store, &ids[0]).await;

    let claims = ids.iter().map(|id| (id.clone(), fp())).collect();
    let claims = claims_behind_a_batch(&store, claims).await;
    let answers = without_waiting_on_a_lock(&admin, &app, async {
        let mut answers = Vec::new();
        for claim in claims {
            answers.push(claim.await.unwrap().unwrap());
        }
        answers
    })
    .await;
    writer.rollback().await.unwrap();
    assert_eq!(answers[0], ClaimAnswer::Replay(outcome));
    assert!(
        matches!(answers[1], ClaimAnswer::Claimed { .. }),
        "{:?}",
        answers[1]
    );
}
