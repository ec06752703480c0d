//! Batching: the writes of claims (and completions) that arrive together on one store handle
//! share one statement and one commit.
//!
//! Each kind has a lane: a queue of waiting writes and one turn ([`TURNS`], the batch in flight).
//! A write joins the queue and waits for its answer or a turn, whichever comes first;
//! whoever gets a turn takes everything queued (up to [`MAX_BATCH`]) and runs it as one batch, in a
//! task of its own. A lone write (nothing queued, a turn free) runs at once, alone and in its
//! caller's task, with the statement it would run unbatched: nothing waits for company.
//!
//! A claim whose lane is idle reads on its own, as unbatched (a replay, an in-flight or a
//! mismatched request is that one read, and reads need no commit); only the insert of a key it
//! found absent goes into the lane. Under load (inserts queued or a batch running), a claim
//! inserts first, without reading: a new key is then its share of one batch, and a key that
//! exists comes back not inserted and is read, as after a lost race. An insert batch is one
//! `INSERT … SELECT FROM unnest(…) WHERE NOT EXISTS … ON CONFLICT DO NOTHING RETURNING`,
//! answered once it has committed, so a claim still commits before its operation runs (contract
//! §2); a key not inserted (a concurrent claim inserted it first) is read again by its claim, as
//! unbatched. Two inserts of one key in a batch: the first goes into the statement, the other is
//! answered "not inserted" and reads the record the first left. A completion batch is one fenced
//! `UPDATE … FROM unnest(…)`: a key updated is completed, one not updated is `Fenced`, as
//! unbatched; two completions of one key in a batch: the second runs alone after it.
//!
//! Rows are written in key order, so two batches cannot deadlock on each other's keys; a
//! serialization failure or deadlock runs the batch's statement again, as every write is. A write
//! whose caller went away before a batch took it is not run; once taken, it runs to the end in a
//! task of its own (a caller that leaves while its batch runs cancels nothing of the others').

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use idem_core::machine::{self, CompleteAnswer};
use idem_core::{Outcome, Policy, Record, RecordId, RecordState, StoreError, Timestamp, Token};
use sqlx::Row;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::PostgresStore;
use crate::conflict::retry_conflicts;
use crate::ops::Held;
use crate::row::{big, bind_record, bind_records, ts};

/// The most requests one batch takes; the rest wait for the next turn.
pub(crate) const MAX_BATCH: usize = 64;

/// How many batches of one kind run at once: one. While it runs, the next requests queue and go
/// together in the next batch (two turns made batches half the size, and each claim and
/// completion cost the server about twice the CPU at 32 callers: docs/bench.md).
pub(crate) const TURNS: usize = 1;

/// The two lanes of a store handle (shared by its clones).
#[derive(Default)]
pub(crate) struct Batches {
    inserts: Lane<InsertJob>,
    completions: Lane<CompleteJob>,
    /// Requests that ran in a batch with others (for tests).
    pub(crate) shared: AtomicU64,
}

/// Requests of one kind waiting for a batch, and the turns to run one.
struct Lane<J> {
    queue: Mutex<VecDeque<J>>,
    turns: Arc<Semaphore>,
}

impl<J> Default for Lane<J> {
    fn default() -> Self {
        Self {
            queue: Mutex::default(),
            turns: Arc::new(Semaphore::new(TURNS)),
        }
    }
}

impl<J: Job> Lane<J> {
    fn push(&self, job: J) {
        self.lock().push_back(job);
    }

    /// Up to [`MAX_BATCH`] requests whose callers still wait; empty only if none is queued.
    fn take(&self) -> Vec<J> {
        let mut queue = self.lock();
        let mut jobs = Vec::new();
        while jobs.len() < MAX_BATCH {
            match queue.pop_front() {
                Some(job) if job.abandoned() => {} // its caller left: not run
                Some(job) => jobs.push(job),
                None => break,
            }
        }
        jobs
    }

    /// A turn for a write that is alone: nothing queued and a turn free.
    fn lone_turn(&self) -> Option<OwnedSemaphorePermit> {
        if !self.lock().is_empty() {
            return None;
        }
        self.turns.clone().try_acquire_owned().ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<J>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queued request.
trait Job: Send + 'static {
    /// Its caller went away before a batch took it.
    fn abandoned(&self) -> bool;
}

type Answer<T> = oneshot::Sender<Result<T, StoreError>>;

/// A batch's run, answering each of its requests.
type Batch = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A claim's insert of a key it found absent, waiting for a batch: answered whether it inserted.
pub(crate) struct InsertJob {
    record: Record,
    answer: Answer<bool>,
}

impl Job for InsertJob {
    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}

/// A completion waiting for a batch.
pub(crate) struct CompleteJob {
    id: RecordId,
    token: Token,
    outcome: Outcome,
    policy: Policy,
    now: Timestamp,
    answer: Answer<CompleteAnswer>,
}

impl Job for CompleteJob {
    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}

/// A record's address, as the table keys it.
fn key_of(record: &Record) -> (String, String) {
    (
        record.scope.as_str().to_owned(),
        record.key.as_str().to_owned(),
    )
}

/// The first request of each key, in key order (the rows of one statement, locked in that order,
/// so two batches cannot deadlock on each other's keys), and the requests repeating a key of
/// theirs, in the order they came.
fn firsts_and_repeats<J>(jobs: Vec<J>, id: impl Fn(&J) -> RecordId) -> (Vec<J>, Vec<J>) {
    let mut firsts: Vec<(RecordId, J)> = Vec::with_capacity(jobs.len());
    let mut repeats = Vec::new();
    for job in jobs {
        let key = id(&job);
        if firsts.iter().any(|(first, _)| *first == key) {
            repeats.push(job);
        } else {
            firsts.push((key, job));
        }
    }
    firsts.sort_by(|a, b| a.0.cmp(&b.0));
    (firsts.into_iter().map(|(_, job)| job).collect(), repeats)
}

/// The error of a batch's statement, for each of its requests (a [`StoreError`] has one owner).
fn shared(e: &StoreError) -> StoreError {
    let text = e.to_string();
    match e {
        StoreError::Unavailable { .. } => StoreError::unavailable(text.clone(), text),
        StoreError::Misconfigured { .. } => StoreError::Misconfigured { message: text },
        _ => StoreError::backend(text.clone(), text),
    }
}

fn gone() -> StoreError {
    StoreError::unavailable(
        "postgres: the request's batch ended without an answer",
        "its task was cancelled or panicked",
    )
}

impl PostgresStore {
    /// Queues `job` on `lane` and waits for its answer, running a batch when a turn comes first.
    async fn submit<J, T>(
        &self,
        lane: impl Fn(&Batches) -> &Lane<J>,
        job: J,
        mut answer: oneshot::Receiver<Result<T, StoreError>>,
        run: fn(PostgresStore, Vec<J>) -> Batch,
    ) -> Result<T, StoreError>
    where
        J: Job,
    {
        // A lone write (nothing queued, a turn free) runs here, in its caller's task, as an
        // unbatched one would: no queue, no task of its own.
        if let Some(turn) = lane(&self.batches).lone_turn() {
            run(self.clone(), vec![job]).await;
            drop(turn);
            return answer.await.unwrap_or_else(|_| Err(gone()));
        }
        lane(&self.batches).push(job);
        loop {
            let turns = lane(&self.batches).turns.clone();
            tokio::select! {
                biased;
                answer = &mut answer => return answer.unwrap_or_else(|_| Err(gone())),
                turn = turns.acquire_owned() => {
                    let Ok(turn) = turn else { return Err(gone()) }; // never closed
                    let jobs = lane(&self.batches).take();
                    if jobs.is_empty() {
                        // Nothing queued: a batch took ours, and answers it.
                        drop(turn);
                        return answer.await.unwrap_or_else(|_| Err(gone()));
                    }
                    if jobs.len() > 1 {
                        let n = jobs.len() as u64;
                        self.batches.shared.fetch_add(n, Ordering::Relaxed);
                    }
                    // In a task of its own, holding the turn, which runs to the end whether or
                    // not this caller stays (the batch may hold others' requests; ours among
                    // them, or still queued after them).
                    let batch = run(self.clone(), jobs);
                    tokio::spawn(async move {
                        batch.await;
                        drop(turn);
                    });
                }
            }
        }
    }

    /// A turn of the insert lane for a claim's insert that is alone (nothing queued, a turn
    /// free): the claim runs the unbatched insert on its own connection while it holds it.
    pub(crate) fn lone_insert_turn(&self) -> Option<OwnedSemaphorePermit> {
        self.batches.inserts.lone_turn()
    }

    /// Whether claims' inserts are queued or a batch of them runs: a claim then inserts first
    /// (`claim_round`), without reading.
    pub(crate) fn inserts_busy(&self) -> bool {
        let lane = &self.batches.inserts;
        !lane.lock().is_empty() || lane.turns.available_permits() == 0
    }

    /// A claim's insert of `record` (a key found absent, or under load not read) through the
    /// insert lane: whether it inserted (`false`: the key exists).
    pub(crate) async fn insert_batched(&self, record: &Record) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        let job = InsertJob {
            record: record.clone(),
            answer: tx,
        };
        self.submit(
            |b| &b.inserts,
            job,
            rx,
            |store, jobs| Box::pin(async move { store.run_inserts(jobs).await }),
        )
        .await
    }

    /// [`KeyStore::complete`](idem_core::KeyStore::complete) through the completion lane (the
    /// outcome's size already checked).
    pub(crate) async fn complete_batched(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        let (tx, rx) = oneshot::channel();
        let job = CompleteJob {
            id: id.clone(),
            token,
            outcome: outcome.clone(),
            policy: *policy,
            now,
            answer: tx,
        };
        self.submit(
            |b| &b.completions,
            job,
            rx,
            |store, jobs| Box::pin(async move { store.run_completions(jobs).await }),
        )
        .await
    }

    async fn run_inserts(self, jobs: Vec<InsertJob>) {
        let (batch, repeats) = firsts_and_repeats(jobs, |job| job.record.id());
        let records: Vec<&Record> = batch.iter().map(|job| &job.record).collect();
        let inserted = retry_conflicts("claim", || async {
            if let [record] = records.as_slice() {
                let n = bind_record(self.statement(&self.sql.insert), record)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
                return Ok(if n == 1 { vec![key_of(record)] } else { vec![] });
            }
            let rows = bind_records(self.statement(&self.sql.insert_many), &records)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|row| Ok((row.try_get("scope")?, row.try_get("key")?)))
                .collect::<Result<Vec<(String, String)>, sqlx::Error>>()
        })
        .await;
        match inserted {
            Ok(inserted) => {
                for job in batch {
                    let done = inserted.contains(&key_of(&job.record));
                    let _ = job.answer.send(Ok(done));
                }
                // The key's first insert in the batch is committed (or lost to another claim):
                // either way this one inserts nothing, and its claim reads what is there.
                for job in repeats {
                    let _ = job.answer.send(Ok(false));
                }
            }
            Err(e) => {
                for job in batch.into_iter().chain(repeats) {
                    let _ = job.answer.send(Err(shared(&e)));
                }
            }
        }
    }

    async fn run_completions(self, jobs: Vec<CompleteJob>) {
        if let [job] = jobs.as_slice() {
            let answer = self.complete_alone(job).await;
            let _ = jobs.into_iter().next().map(|job| job.answer.send(answer));
            return;
        }
        let (batch, alone) = firsts_and_repeats(jobs, |job| job.id.clone());
        match retry_conflicts("complete", || self.complete_batch(&batch)).await {
            Ok(updated) => {
                for job in batch {
                    let id = (job.id.scope().as_str(), job.id.key().as_str());
                    let done = updated.iter().any(|(s, k)| (s.as_str(), k.as_str()) == id);
                    let state = machine::completed_state(&job.outcome, &job.policy);
                    let answer = match (done, state) {
                        (false, _) => CompleteAnswer::Fenced,
                        (true, RecordState::Completed) => CompleteAnswer::Completed,
                        (true, _) => CompleteAnswer::MarkedRetryable,
                    };
                    let _ = job.answer.send(Ok(answer));
                }
            }
            Err(e) => {
                for job in batch {
                    let _ = job.answer.send(Err(shared(&e)));
                }
            }
        }
        for job in alone {
            let answer = self.complete_alone(&job).await;
            let _ = job.answer.send(answer);
        }
    }

    /// One fenced `UPDATE` of every record of `jobs` (one per key, in key order): the keys it
    /// updated.
    async fn complete_batch(
        &self,
        jobs: &[CompleteJob],
    ) -> Result<Vec<(String, String)>, sqlx::Error> {
        fn column<T>(jobs: &[CompleteJob], f: impl Fn(&CompleteJob) -> T) -> Vec<T> {
            jobs.iter().map(f).collect()
        }
        let state = |j: &CompleteJob| machine::completed_state(&j.outcome, &j.policy);
        let rows = self
            .statement(&self.sql.complete_many)
            .bind(column(jobs, |j| j.id.scope().as_str().to_owned()))
            .bind(column(jobs, |j| j.id.key().as_str().to_owned()))
            .bind(column(jobs, |j| big(j.token.seq)))
            .bind(column(jobs, |j| j.token.id_hex()))
            .bind(column(jobs, |j| ts(j.now)))
            .bind(column(jobs, |j| state(j).as_str().to_owned()))
            .bind(column(jobs, |j| i32::from(j.outcome.status())))
            .bind(column(jobs, |j| j.outcome.body().to_owned()))
            .bind(column(jobs, |j| j.outcome.class().as_str().to_owned()))
            .bind(column(jobs, |j| ts(j.now + j.policy.ttl())))
            .bind(column(jobs, |j| self.payload(&j.id)))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("scope")?, row.try_get("key")?)))
            .collect()
    }

    /// One completion, unbatched.
    async fn complete_alone(&self, job: &CompleteJob) -> Result<CompleteAnswer, StoreError> {
        retry_conflicts("complete", || {
            let held = Held {
                id: &job.id,
                token: job.token,
            };
            self.complete_on(&self.pool, held, &job.outcome, &job.policy, job.now)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idem_conformance::kit::{postgres_url, unique};
    use idem_core::machine::{ClaimAnswer, ClaimRequest};
    use idem_core::{Fingerprint, IdempotencyKey, KeyStore, Scope};
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    const NOW: Timestamp = Timestamp::from_millis(946_684_800_000);

    async fn store(url: &str, table: &str, max: u32) -> PostgresStore {
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_millis(300))
            .connect(url)
            .await
            .expect("connect to IDEM_TEST_POSTGRES_URL");
        PostgresStore::with_table(pool, "idem_test", table).unwrap()
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

        // Every turn is taken: the claim's insert queues, and its caller gives up.
        let lane = &store.batches.inserts;
        let turns = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
        let waited = tokio::time::timeout(
            Duration::from_millis(200),
            store.claim(left, &fp(), &policy, NOW),
        )
        .await;
        assert!(
            waited.is_err(),
            "the claim inserted while every turn was taken"
        );
        assert_eq!(lane.lock().len(), 1);
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
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lane.lock().len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the claims did not queue"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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

    /// With the lane idle (and with batching off) a claim reads first: a replay is one `SELECT`,
    /// which a transaction writing the record does not hold up (a plain insert's unique check
    /// would wait for it; idem's leaves a key its snapshot holds alone before that check).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_the_lane_idle_a_replay_reads_and_does_not_wait_for_a_writer_of_its_record() {
        let Some(url) = postgres_url() else { return };
        for batching in [true, false] {
            let store = store(&url, "idem_records", 4).await.with_batching(batching);
            store.migrate().await.unwrap();
            let id = &ids("batch-idle", 1)[0];
            let outcome = Outcome::definitive(200, &serde_json::json!({"sent": 1})).unwrap();
            completed(&store, id, &outcome).await;
            let writer = writing(&store, id).await;
            let replay = tokio::time::timeout(
                Duration::from_secs(2),
                store.claim(id, &fp(), &Policy::default(), NOW),
            )
            .await;
            writer.rollback().await.unwrap();
            let replay = replay.unwrap_or_else(|_| {
                panic!("batching {batching}: the replay waited for the writer")
            });
            assert_eq!(replay.unwrap(), ClaimAnswer::Replay(outcome));
        }
    }

    /// Under load a claim inserts first, but a key that exists is left alone without the unique
    /// check, which would wait for a transaction writing its row (a `complete_in` not yet
    /// committed) and hold the whole batch, others' new keys too, until it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_load_a_batch_does_not_wait_for_a_transaction_writing_a_key_of_it() {
        let Some(url) = postgres_url() else { return };
        let store = store(&url, "idem_records", 4).await;
        store.migrate().await.unwrap();
        let ids = ids("batch-writer", 2);
        let outcome = Outcome::definitive(200, &serde_json::json!({"sent": 1})).unwrap();
        completed(&store, &ids[0], &outcome).await;
        let writer = writing(&store, &ids[0]).await;

        let claims = ids.iter().map(|id| (id.clone(), fp())).collect();
        let claims = claims_behind_a_batch(&store, claims).await;
        let answers = tokio::time::timeout(Duration::from_secs(2), async {
            let mut answers = Vec::new();
            for claim in claims {
                answers.push(claim.await.unwrap().unwrap());
            }
            answers
        })
        .await;
        writer.rollback().await.unwrap();
        let answers = answers.expect("the batch waited for the writer's transaction");
        assert_eq!(answers[0], ClaimAnswer::Replay(outcome));
        assert!(
            matches!(answers[1], ClaimAnswer::Claimed { .. }),
            "{:?}",
            answers[1]
        );
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

        // Every turn is taken: the completion queues, and its caller gives up.
        let lane = &store.batches.completions;
        let turns = lane.turns.clone().acquire_many_owned(TURNS as u32).await;
        let left = store.complete(&ids[0], tokens[0], &outcome, &policy, NOW);
        let waited = tokio::time::timeout(Duration::from_millis(200), left).await;
        assert!(
            waited.is_err(),
            "the completion ran while every turn was taken"
        );
        assert_eq!(lane.lock().len(), 1);
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
        while lane.lock().len() < ids.len() {
            tokio::task::yield_now().await;
        }
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
        // The pool's one connection is held: every batch's statement times out waiting for it.
        let starved = store(&url, "idem_records", 1).await;
        let held = starved.pool().acquire().await.unwrap();
        let answers = complete_at_once(&starved, &ids("batch-unavailable", 8)).await;
        assert!(
            starved.batched_requests() == 8,
            "the eight completions shared one batch"
        );
        for answer in &answers {
            assert!(
                matches!(answer, Err(StoreError::Unavailable { .. })),
                "{answer:?}"
            );
        }
        drop(held);

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
}
