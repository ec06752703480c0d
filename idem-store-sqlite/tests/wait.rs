//! Waiting on SQLite ([contract §5.2](idem_core::contract#waiting)): a write by this process wakes
//! the waiters of its record at once, through every store opened on the file, instead of at the
//! next poll, and so does a completion in the caller's own transaction once the caller reports
//! its commit ([contract §6](idem_core::contract#transactional-completion)).
//!
//! - Every case waits on a timer whose every sleep lasts a minute, far past its hang guard: the
//!   waiter's poll never reads, so a waiter that answers was woken. The timer also reports each
//!   poll pause it is asked for, which a waiter asks for only once it has read the record and
//!   found it in flight: the holder writes after that, never before.

use std::sync::mpsc;
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Execution, Executor, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope,
    Timer,
};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::{TransactionBehavior, params};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_in_this_process_wakes_a_waiter_parked_on_another_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite3");
    let holder = SqliteStore::open(&path).unwrap();
    holder.migrate().unwrap();
    // A second store on the same file, as another component of the process would open it.
    let other = SqliteStore::open(&path).unwrap();
    let policy = policy_30s();
    let (scope, key, fp) = ids();
    let now = idem_core::Timestamp::now();
    let id = RecordId::new(scope.clone(), key.clone());
    let ClaimAnswer::Claimed { token, .. } = holder.claim(&id, &fp, &policy, now).await.unwrap()
    else {
        panic!("claimed")
    };
    let (timer, polls) = minute_timer();
    let (answered, waiter_answered) = tokio::sync::oneshot::channel();
    let waiter = waiter(&other, timer, &(scope, key, fp), answered);
    // The waiter has read the record in flight and sleeps on its poll.
    tokio::task::spawn_blocking(move || polls.recv_timeout(HANG))
        .await
        .unwrap()
        .expect("the waiter parks");
    let outcome = Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap();
    holder
        .complete(&id, token, &outcome, &policy, idem_core::Timestamp::now())
        .await
        .unwrap();
    // Its poll lasts a minute: only the completion can have woken it.
    tokio::time::timeout(HANG, waiter_answered)
        .await
        .expect("the completion woke the waiter")
        .unwrap();
    let answer = waiter.await.unwrap().unwrap();
    assert!(answer.is_replay());
    assert_eq!(answer.outcome(), &outcome);
}

/// How long a waiter may wait; every sleep of [`minute_timer`] is longer than this.
const WAIT: Duration = Duration::from_secs(10);
/// A guard against a hang, never a measure: the cases finish in milliseconds.
const HANG: Duration = Duration::from_secs(10);

/// A timer whose every sleep lasts at least a minute, which reports each sleep shorter than the
/// wait (a poll's pause: the other sleeps are the wait's bound and the holder's lease).
fn minute_timer() -> (Timer, mpsc::Receiver<()>) {
    let (polling, polls) = mpsc::channel();
    let timer = Timer::new(move |d| {
        if d < WAIT {
            let _ = polling.send(());
        }
        Box::pin(tokio::time::sleep(d.max(Duration::from_secs(60))))
    });
    (timer, polls)
}

/// A store on a fresh file with an `effects` table, the sink the cases count.
fn store_with_effects() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.sqlite3")).unwrap();
    store.migrate().unwrap();
    store
        .connection()
        .unwrap()
        .execute_batch("CREATE TABLE effects (key TEXT NOT NULL)")
        .unwrap();
    (dir, store)
}

fn effects(store: &SqliteStore) -> i64 {
    let conn = store.connection().unwrap();
    conn.query_row("SELECT count(*) FROM effects", [], |r| r.get(0))
        .unwrap()
}

/// A request that waits (on `timer`) for the answer of `ids`, spawned once the holder's
/// operation runs; sends on `answered` when it has its answer.
fn waiter(
    store: &SqliteStore,
    timer: Timer,
    ids: &(Scope, IdempotencyKey, Fingerprint),
    answered: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<Result<Execution, idem_core::Error>> {
    let exec = Executor::new(store.clone())
        .with_policy(policy_30s())
        .with_timer(timer)
        .waiting(WAIT);
    let (scope, key, fp) = ids.clone();
    tokio::spawn(async move {
        let answer = exec
            .run(&scope, &key, &fp, |_| async {
                unreachable!("the waiter replays")
            })
            .await;
        let _ = answered.send(());
        answer
    })
}

fn policy_30s() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn ids() -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new("tenant/create_ticket").unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_in_the_callers_transaction_wakes_a_waiter_at_the_commit_not_at_its_poll() {
    let (_dir, store) = store_with_effects();
    let ids = ids();
    let (timer, polls) = minute_timer();
    let (started, running) = tokio::sync::oneshot::channel();
    let (answered, waiter_answered) = tokio::sync::oneshot::channel();
    let holder = {
        let (store, (scope, key, fp)) = (store.clone(), ids.clone());
        let exec = Executor::new(store.clone()).with_policy(policy_30s());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |attempt| async move {
                started.send(()).unwrap();
                let outcome = Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap();
                let committed = outcome.clone();
                let holder = store.clone();
                holder
                    .with_connection(move |conn| {
                        // The waiter has read the record in flight and sleeps on its poll.
                        polls.recv_timeout(HANG).expect("the waiter parks");
                        let tx = conn
                            .transaction_with_behavior(TransactionBehavior::Immediate)
                            .unwrap();
                        tx.execute(
                            "INSERT INTO effects (key) VALUES (?1)",
                            params![attempt.key().as_str()],
                        )
                        .unwrap();
                        let answer = store.complete_in(&tx, &attempt, &committed).unwrap();
                        assert_eq!(answer, CompleteAnswer::Completed);
                        tx.commit().unwrap();
                        attempt.mark_recorded();
                    })
                    .await
                    .unwrap();
                // Still running: only the commit can have woken the waiter.
                tokio::time::timeout(HANG, waiter_answered)
                    .await
                    .expect("the waiter answered while the holder still ran")
                    .unwrap();
                outcome
            })
            .await
        })
    };
    running.await.unwrap();
    let waiter = waiter(&store, timer, &ids, answered);
    let again = tokio::time::timeout(HANG, waiter)
        .await
        .expect("the waiter was woken by the commit")
        .unwrap()
        .unwrap();
    let first = holder.await.unwrap().unwrap();
    assert!(!first.is_replay());
    assert!(again.is_replay(), "the waiter replays");
    assert_eq!(again.outcome(), first.outcome());
    assert_eq!(effects(&store), 1, "one effect for two requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_before_the_commit_leaves_the_waiter_waiting_until_the_operation_returns() {
    let (_dir, store) = store_with_effects();
    let ids = ids();
    let (timer, polls) = minute_timer();
    let (started, running) = tokio::sync::oneshot::channel();
    let (answered, _) = tokio::sync::oneshot::channel();
    let holder = {
        let (store, (scope, key, fp)) = (store.clone(), ids.clone());
        let exec = Executor::new(store.clone()).with_policy(policy_30s());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |attempt| async move {
                started.send(()).unwrap();
                let outcome = Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap();
                let committed = outcome.clone();
                let holder = store.clone();
                holder
                    .with_connection(move |conn| {
                        polls.recv_timeout(HANG).expect("the waiter parks");
                        let tx = conn
                            .transaction_with_behavior(TransactionBehavior::Immediate)
                            .unwrap();
                        tx.execute(
                            "INSERT INTO effects (key) VALUES (?1)",
                            params![attempt.key().as_str()],
                        )
                        .unwrap();
                        store.complete_in(&tx, &attempt, &committed).unwrap();
                        // Too early: the waiter wakes, reads the record still in flight, and
                        // parks again on its poll.
                        attempt.mark_recorded();
                        polls.recv_timeout(HANG).expect("the waiter parks again");
                        tx.commit().unwrap();
                    })
                    .await
                    .unwrap();
                outcome
            })
            .await
        })
    };
    running.await.unwrap();
    let waiter = waiter(&store, timer, &ids, answered);
    let first = tokio::time::timeout(HANG, holder)
        .await
        .expect("the holder finished")
        .unwrap()
        .unwrap();
    let again = tokio::time::timeout(HANG, waiter)
        .await
        .expect("the waiter was woken when the operation returned")
        .unwrap()
        .unwrap();
    assert!(again.is_replay(), "the waiter did not give up: it replays");
    assert_eq!(again.outcome(), first.outcome());
    assert_eq!(effects(&store), 1);
}
