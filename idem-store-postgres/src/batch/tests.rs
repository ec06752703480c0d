//! The lanes and batches of [`super`] against a real server (`IDEM_TEST_POSTGRES_URL`).

use std::time::Duration;

use idem_conformance::kit::{postgres_url, unique};
use idem_core::machine::{ClaimAnswer, ClaimRequest};
use idem_core::{Fingerprint, IdempotencyKey, KeyStore, Scope};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::*;

mod writers;

const NOW: Timestamp = Timestamp::from_millis(946_684_800_000);

/// A guard against a hang, never a measure.
const HANG: Duration = Duration::from_secs(20);

/// A pool of up to `max` connections tagged `app` (so the server can say when one of them waits
/// on a lock).
async fn pool(url: &str, app: &str, max: u32) -> PgPool {
    let options: PgConnectOptions = url.parse().expect("IDEM_TEST_POSTGRES_URL parses");
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.application_name(app))
        .await
        .expect("connect to IDEM_TEST_POSTGRES_URL")
}

/// A store on a pool of its own, its connections tagged `app`, in `idem_test.<table>`.
async fn store_of(url: &str, app: &str, table: &str, max: u32) -> PostgresStore {
    PostgresStore::with_table(pool(url, app, max).await, "idem_test", table).unwrap()
}

async fn store(url: &str, table: &str, max: u32) -> PostgresStore {
    store_of(url, &unique("idem-batch"), table, max).await
}

/// Waits until `lane` holds `n` queued requests (a hang guard, not a measure).
async fn queued<J: Job>(lane: &Lane<J>, n: usize) {
    let queued = async {
        while lane.lock().len() < n {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(HANG, queued)
        .await
        .expect("the requests queue");
}

fn ids(prefix: &str, n: usize) -> Vec<RecordId> {
    let scope = Scope::new(unique(prefix)).unwrap();
    (0..n)
        .map(|i| RecordId::new(scope.clone(), IdempotencyKey::new(format!("k{i}")).unwrap()))
        .collect()
}

fn fp() -> Fingerprint {
    Fingerprint::of("tool", &serde_json::json!({})).unwrap()
}

/// A queued request whose caller is there or not.
struct Queued(bool);

impl Job for Queued {
    fn abandoned(&self) -> bool {
        !self.0
    }
}

#[test]
fn a_batch_takes_at_most_max_batch_requests_and_never_an_abandoned_one() {
    let lane = Lane::<Queued>::default();
    lane.push(Queued(false));
    for _ in 0..MAX_BATCH + 6 {
        lane.push(Queued(true));
    }
    lane.push(Queued(false));
    let first = lane.take();
    assert_eq!(first.len(), MAX_BATCH);
    assert!(
        first.iter().all(|job| job.0),
        "the abandoned one is not taken"
    );
    assert_eq!(lane.take().len(), 6);
    assert!(
        lane.take().is_empty(),
        "only an abandoned one was left, and it is dropped"
    );
    assert!(lane.lock().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_whose_caller_left_before_its_batch_is_not_run() {
    let Some(url) = postgres_url() else { return };
    let store = store(&url, "idem_records", 4).await;
    store.migrate().await.unwrap();
    let ids = ids("batch-left", 2);
    let (left, next) = (&ids[0], &ids[1]);
    let policy = Policy::default();

    // Every turn is taken: the claim's insert queues (it cannot run without a turn), and its
    // caller gives up.
    let lane = &store.batches.inserts;
    let turns = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
    let caller = {
        let (store, left) = (store.clone(), left.clone());
        tokio::spawn(async move { store.claim(&left, &fp(), &policy, NOW).await })
    };
    queued(lane, 1).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    assert_eq!(lane.lock().len(), 1, "still queued, its caller gone");
    drop(turns);

    // The next claim takes the queue: the abandoned insert is dropped, not run.
    let answer = store.claim(next, &fp(), &policy, NOW).await.unwrap();
    assert!(matches!(answer, ClaimAnswer::Claimed { .. }), "{answer:?}");
    assert!(lane.lock().is_empty());
    assert!(store.get(left, NOW).await.unwrap().is_none());
    assert!(store.get(next, NOW).await.unwrap().is_some());
}

/// Claims `id` (a new key) with the default policy: the claim's token.
async fn claimed(store: &PostgresStore, id: &RecordId) -> Token {
    match store
        .claim(id, &fp(), &Policy::default(), NOW)
        .await
        .unwrap()
    {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("a new key is claimed: {other:?}"),
    }
}

/// Claims and completes `id` with `outcome`: the claim's token.
async fn completed(store: &PostgresStore, id: &RecordId, outcome: &Outcome) -> Token {
    let token = claimed(store, id).await;
    let done = store
        .complete(id, token, outcome, &Policy::default(), NOW)
        .await;
    assert_eq!(done.unwrap(), CompleteAnswer::Completed);
    token
}

/// Spawns a claim of each `(id, fingerprint)` while the insert lane's turn is taken, waits
/// until every one has queued its insert, then gives the turn back: the claims' tasks.
async fn claims_behind_a_batch(
    store: &PostgresStore,
    claims: Vec<(RecordId, Fingerprint)>,
) -> Vec<tokio::task::JoinHandle<Result<ClaimAnswer, StoreError>>> {
    let lane = &store.batches.inserts;
    let turn = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
    let n = claims.len();
    let tasks = claims
        .into_iter()
        .map(|(id, fingerprint)| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .claim(&id, &fingerprint, &Policy::default(), NOW)
                    .await
            })
        })
        .collect();
    queued(lane, n).await;
    drop(turn);
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_claim_inserts_first_and_a_key_that_exists_is_read() {
    let Some(url) = postgres_url() else { return };
    let store = store(&url, "idem_records", 4).await;
    store.migrate().await.unwrap();
    let ids = ids("batch-first", 3);
    // With the lane idle: `k0` completed, `k1` in flight.
    let outcome = Outcome::definitive(201, &serde_json::json!({"paid": 1})).unwrap();
    let done = completed(&store, &ids[0], &outcome).await;
    let held = claimed(&store, &ids[1]).await;

    // A batch runs (the turn is taken): each claim queues an insert without reading, even
    // of a key that exists: a replay, an in-flight request, a new key and a mismatch.
    let other = Fingerprint::of("tool", &serde_json::json!({"other": 1})).unwrap();
    let claims = [(0, fp()), (1, fp()), (2, fp()), (0, other)]
        .into_iter()
        .map(|(i, fingerprint)| (ids[i].clone(), fingerprint))
        .collect();
    let mut answers = Vec::new();
    for claim in claims_behind_a_batch(&store, claims).await {
        answers.push(claim.await.unwrap().unwrap());
    }
    assert_eq!(
        answers[0],
        ClaimAnswer::Replay(outcome),
        "the completed key replays"
    );
    assert!(
        matches!(answers[1], ClaimAnswer::InFlight { .. }),
        "{:?}",
        answers[1]
    );
    let ClaimAnswer::Claimed { token: new, .. } = answers[2] else {
        panic!("the new key is claimed: {:?}", answers[2])
    };
    assert_eq!(answers[3], ClaimAnswer::FingerprintMismatch);
    assert!(
        store.batches.shared.load(Ordering::Relaxed) >= 4,
        "one batch took them"
    );

    // The keys that existed are as they were; the new key holds its claim.
    let record = |i: usize| {
        let (store, id) = (store.clone(), ids[i].clone());
        async move { store.get(&id, NOW).await.unwrap().unwrap() }
    };
    let (r0, r1) = (record(0).await, record(1).await);
    assert_eq!((r0.state, r0.token), (RecordState::Completed, done));
    assert_eq!((r1.state, r1.token), (RecordState::Processing, held));
    assert_eq!(record(2).await.token, new);
}

/// Runs `records` as one insert batch: whether each was inserted.
async fn insert_batch(store: &PostgresStore, records: &[Record]) -> Vec<bool> {
    let (mut jobs, mut answers) = (Vec::new(), Vec::new());
    for record in records {
        let (answer, rx) = oneshot::channel();
        let record = record.clone();
        jobs.push(InsertJob { record, answer });
        answers.push(rx);
    }
    store.clone().run_inserts(jobs).await;
    let mut inserted = Vec::new();
    for rx in answers {
        inserted.push(rx.await.unwrap().unwrap());
    }
    inserted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_batch_answers_for_each_key_whether_it_inserted_it() {
    let Some(url) = postgres_url() else { return };
    let store = store(&url, "idem_records", 4).await;
    store.migrate().await.unwrap();
    let ids = ids("batch-inserts", 3);
    let policy = Policy::default();
    let claim = |id: &RecordId| {
        let t = machine::claim(None, ClaimRequest::new(id, &fp()), NOW, &policy);
        t.write.expect("a new key's claim writes")
    };
    let mut records: Vec<Record> = ids.iter().map(claim).collect();
    // The first key again, with another token: the batch's second insert of one key.
    records.push(claim(&ids[0]));
    assert_eq!(
        insert_batch(&store, &records).await,
        [true, true, true, false]
    );
    let stored = store.get(&ids[0], NOW).await.unwrap().unwrap();
    assert_eq!(
        stored.token, records[0].token,
        "the first insert of the key is stored"
    );
    // Every key exists now: nothing is inserted again.
    assert_eq!(
        insert_batch(&store, &records[..3]).await,
        [false, false, false]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_caller_left_before_its_batch_is_not_run() {
    let Some(url) = postgres_url() else { return };
    let store = store(&url, "idem_records", 4).await;
    store.migrate().await.unwrap();
    let ids = ids("batch-left-complete", 2);
    let policy = Policy::default();
    let mut tokens = Vec::new();
    for id in &ids {
        match store.claim(id, &fp(), &policy, NOW).await.unwrap() {
            ClaimAnswer::Claimed { token, .. } => tokens.push(token),
            other => panic!("{other:?}"),
        }
    }
    let outcome = Outcome::definitive(200, &serde_json::json!({})).unwrap();

    // Every turn is taken: the completion queues (it cannot run without a turn), and its caller
    // gives up.
    let lane = &store.batches.completions;
    let turns = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
    let caller = {
        let (store, id, token, outcome) =
            (store.clone(), ids[0].clone(), tokens[0], outcome.clone());
        tokio::spawn(async move { store.complete(&id, token, &outcome, &policy, NOW).await })
    };
    queued(lane, 1).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    assert_eq!(lane.lock().len(), 1, "still queued, its caller gone");
    drop(turns);

    // The next completion takes the queue: the abandoned one is dropped, not run.
    let answer = store.complete(&ids[1], tokens[1], &outcome, &policy, NOW);
    assert_eq!(answer.await.unwrap(), CompleteAnswer::Completed);
    assert!(lane.lock().is_empty());
    let left = store.get(&ids[0], NOW).await.unwrap().unwrap();
    assert_eq!(left.state, RecordState::Processing, "nothing written");
    assert!(left.outcome.is_none());
}

/// Completes every record of `ids` in one batch, each with a fresh token: the answers. Every
/// turn is held until all of them are queued, so the first turn given back takes them all.
async fn complete_at_once(
    store: &PostgresStore,
    ids: &[RecordId],
) -> Vec<Result<CompleteAnswer, StoreError>> {
    let lane = &store.batches.completions;
    let turns = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
    let outcome = Outcome::definitive(200, &serde_json::json!({})).unwrap();
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (store, id, outcome) = (store.clone(), id.clone(), outcome.clone());
            tokio::spawn(async move {
                let policy = Policy::default();
                store
                    .complete(&id, Token::new(1), &outcome, &policy, NOW)
                    .await
            })
        })
        .collect();
    queued(lane, ids.len()).await;
    drop(turns);
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_answers_each_of_its_writes_with_its_error() {
    let Some(url) = postgres_url() else { return };
    // The pool is closed: every batch's statement finds no connection to run on.
    let closed = store(&url, "idem_records", 1).await;
    closed.pool().close().await;
    let answers = complete_at_once(&closed, &ids("batch-unavailable", 8)).await;
    assert!(
        closed.batched_requests() == 8,
        "the eight completions shared one batch"
    );
    for answer in &answers {
        assert!(
            matches!(answer, Err(StoreError::Unavailable { .. })),
            "{answer:?}"
        );
    }

    // A table that does not exist: each write of the batch is told to migrate.
    let unmigrated = store(&url, "idem_no_such_table", 4).await;
    let answers = complete_at_once(&unmigrated, &ids("batch-misconfigured", 8)).await;
    assert!(
        unmigrated.batched_requests() == 8,
        "the eight completions shared one batch"
    );
    for answer in &answers {
        assert!(
            matches!(answer, Err(StoreError::Misconfigured { .. })),
            "{answer:?}"
        );
    }
}
