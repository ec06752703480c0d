//! Waiting on SQLite ([contract §5.2](idem_core::contract#waiting)): a write by this process wakes
//! the waiters of its record at once, through every store opened on the file, instead of at the
//! next poll. Real file, real time: the waiter is parked 1.2 s (a short real wait), long enough
//! that the portable poll reads only every 250 ms, so an answer within 40 ms is a wake-up.

use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::{Executor, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, Scope};
use idem_store_sqlite::SqliteStore;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_in_this_process_wakes_a_waiter_parked_1200ms_on_another_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let holder = SqliteStore::open(&path).unwrap();
    holder.migrate().unwrap();
    // A second store on the same file, as another component of the process would open it.
    let other = SqliteStore::open(&path).unwrap();
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let (scope, key) = (
        Scope::new("tenant/create_ticket").unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
    );
    let fp = Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap();
    let now = idem_core::Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } =
        holder.claim(&scope, &key, &fp, &policy, now).await.unwrap()
    else {
        panic!("claimed")
    };
    let waiter = {
        let exec = Executor::new(other)
            .with_policy(policy)
            .waiting(Duration::from_secs(10));
        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
        tokio::spawn(async move {
            let answer = exec
                .run(&scope, &key, &fp, |_| async {
                    unreachable!("the waiter replays")
                })
                .await;
            (answer, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let outcome = Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap();
    holder
        .complete(
            &scope,
            &key,
            token,
            &outcome,
            &policy,
            idem_core::Timestamp::now(),
        )
        .await
        .unwrap();
    let completed = Instant::now();
    let (answer, answered) = waiter.await.unwrap();
    let answer = answer.unwrap();
    assert!(answer.is_replay());
    assert_eq!(answer.outcome(), &outcome);
    let gap = answered.saturating_duration_since(completed);
    assert!(
        gap < Duration::from_millis(40),
        "woken {gap:?} after the completion"
    );
}
