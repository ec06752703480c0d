//! A server whose sessions default to SERIALIZABLE (`default_transaction_isolation`, set here on
//! the store's own connections only, never on the shared database): `complete`, `release` and
//! `extend` run their statement again after a serialization failure (SQLSTATE 40001) instead of
//! losing the outcome, as `claim` does.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope,
    Timestamp, Token,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, postgres::PgPoolOptions};
use tokio::sync::Barrier;

/// A migrated store whose every connection runs its transactions SERIALIZABLE.
async fn serializable_store(url: &str, app: &str, max: u32) -> PostgresStore {
    common::store(url, app).await; // migrated
    let options =
        common::options(url, app).options([("default_transaction_isolation", "serializable")]);
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap();
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(level, "serializable");
    PostgresStore::with_table(pool, common::SCHEMA, common::TABLE).unwrap()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap()
}

fn outcome(i: usize) -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"charge": i})).unwrap()
}

async fn claim(store: &PostgresStore, id: &RecordId, now: Timestamp) -> Token {
    match store
        .claim(id, &fingerprint(), &Policy::default(), now)
        .await
        .unwrap()
    {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Which fenced operation the deterministic test drives.
#[derive(Clone, Copy, Debug)]
enum Op {
    Complete,
    Release,
    Extend,
}

/// Another transaction holds the record's row lock while the store's statement waits on it, then
/// commits a write to the row: under SERIALIZABLE the waiting statement fails with 40001. The
/// store must run it again and answer as if there had been no conflict.
async fn conflict_then_right_answer(op: Op) {
    let Some(url) = common::url() else { return };
    let scope = Scope::new(common::unique("serializable")).unwrap();
    let app = format!("idem-ser-{}", common::unique("op"));
    let store = serializable_store(&url, &app, 2).await;
    let admin = common::pool(&url, "idem-ser-admin", 2).await;
    let key = IdempotencyKey::new("k-1").unwrap();
    let now = Timestamp::from_millis(1_700_000_000_000);
    let id = RecordId::new(scope.clone(), key.clone());
    let token = claim(&store, &id, now).await;

    let mut blocker = admin.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET updated_at = updated_at WHERE scope = $1 AND key = $2",
        store.qualified_table()
    )))
    .bind(scope.as_str())
    .bind(key.as_str())
    .execute(&mut *blocker)
    .await
    .unwrap();

    let task = {
        let (store, id) = (store.clone(), id.clone());
        tokio::spawn(async move {
            let later = now + Duration::from_secs(1);
            match op {
                Op::Complete => store
                    .complete(&id, token, &outcome(7), &Policy::default(), later)
                    .await
                    .map(|a| format!("{a:?}")),
                Op::Release => store
                    .release(&id, token, later)
                    .await
                    .map(|a| format!("{a:?}")),
                Op::Extend => store
                    .extend(&id, token, Duration::from_secs(600), later)
                    .await
                    .map(|a| format!("{a:?}")),
            }
        })
    };
    common::wait_until_blocked_on_a_lock(&admin, &app).await;
    blocker.commit().await.unwrap();
    let answer = task.await.unwrap();
    let record = store
        .get(&id, now + Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    match op {
        Op::Complete => {
            assert_eq!(answer.unwrap(), format!("{:?}", CompleteAnswer::Completed));
            assert_eq!(record.state, RecordState::Completed);
            assert_eq!(record.outcome.unwrap().body(), outcome(7).body());
        }
        Op::Release => {
            assert_eq!(answer.unwrap(), format!("{:?}", ReleaseAnswer::Released));
            assert_eq!(record.state, RecordState::FailedRetryable);
        }
        Op::Extend => {
            let answer = answer.unwrap();
            assert!(answer.starts_with("Extended"), "{answer}");
            assert_eq!(record.state, RecordState::Processing);
            assert!(record.lease_until >= now + Duration::from_secs(600));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_runs_again_after_a_serialization_failure() {
    conflict_then_right_answer(Op::Complete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_runs_again_after_a_serialization_failure() {
    conflict_then_right_answer(Op::Release).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_runs_again_after_a_serialization_failure() {
    conflict_then_right_answer(Op::Extend).await;
}

/// Many keys at once: for each, a `complete`, an `extend` with the same token and a repeat
/// `claim`, all released together, so statements on one row queue behind each other and the
/// losers hit 40001. Every operation answers (no error), no outcome is lost: every record ends
/// `completed` with its own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_completes_extends_and_claims_lose_no_outcome() {
    const KEYS: usize = 60;
    let Some(url) = common::url() else { return };
    let scope = Scope::new(common::unique("serializable-many")).unwrap();
    let store = serializable_store(&url, "idem-ser-many", 8).await;
    let now = Timestamp::from_millis(1_700_000_000_000);
    let mut tokens = Vec::new();
    for i in 0..KEYS {
        let id = RecordId::new(
            scope.clone(),
            IdempotencyKey::new(format!("k-{i}")).unwrap(),
        );
        let token = claim(&store, &id, now).await;
        tokens.push((id, token));
    }
    let gate = Arc::new(Barrier::new(KEYS * 3));
    let later = now + Duration::from_secs(1);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (id, token)) in tokens.iter().cloned().enumerate() {
        for role in 0..3 {
            let (store, id, gate) = (store.clone(), id.clone(), gate.clone());
            tasks.spawn(async move {
                gate.wait().await;
                let answer = match role {
                    0 => store
                        .complete(&id, token, &outcome(i), &Policy::default(), later)
                        .await
                        .map(|a| format!("{a:?}")),
                    1 => store
                        .extend(&id, token, Duration::from_secs(60), later)
                        .await
                        .map(|a| match a {
                            ExtendAnswer::Extended { .. } => "Extended".to_owned(),
                            other => format!("{other:?}"),
                        }),
                    _ => store
                        .claim(&id, &fingerprint(), &Policy::default(), later)
                        .await
                        .map(|a| match a {
                            ClaimAnswer::InFlight { .. } => "InFlight".to_owned(),
                            ClaimAnswer::Replay(o) if o.body() == outcome(i).body() => {
                                "Replay".to_owned()
                            }
                            other => format!("{other:?}"),
                        }),
                };
                (i, role, answer)
            });
        }
    }
    let mut errors = Vec::new();
    for (i, role, answer) in tasks.join_all().await {
        match (role, answer) {
            (0, Ok(a)) => assert_eq!(a, "Completed", "key {i}"),
            (1, Ok(a)) => assert!(a == "Extended" || a == "Fenced", "key {i}: {a}"),
            (2, Ok(a)) => assert!(a == "InFlight" || a == "Replay", "key {i}: {a}"),
            (_, Ok(_)) => unreachable!(),
            (_, Err(e)) => errors.push(format!("key {i} role {role}: {e}")),
        }
    }
    assert!(
        errors.is_empty(),
        "{} operations failed: {errors:?}",
        errors.len()
    );
    for (i, (id, _)) in tokens.iter().enumerate() {
        let record = store.get(id, later).await.unwrap().expect("the record");
        assert_eq!(record.state, RecordState::Completed, "key {i}");
        assert_eq!(record.outcome.unwrap().body(), outcome(i).body(), "key {i}");
    }
}
