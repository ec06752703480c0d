//! Batching: the writes of claims (and completions) that arrive together on one store handle
//! share one statement and one commit.
//!
//! Each kind has a lane ([`crate::lane`]): a queue of waiting writes and one turn (the batch in
//! flight).
//! A write joins the queue and waits for its answer or a turn, whichever comes first;
//! whoever gets a turn takes everything queued (up to 64) and runs it as one batch, in a
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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use idem_core::machine::{self, CompleteAnswer};
use idem_core::{Outcome, Policy, Record, RecordId, RecordState, StoreError, Timestamp, Token};
use sqlx::Row;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::PostgresStore;
use crate::conflict::retry_conflicts;
use crate::lane::{Batches, CompleteJob, InsertJob, Job, Lane};
#[cfg(test)]
use crate::lane::{MAX_BATCH, TURNS};
use crate::ops::Held;
use crate::row::{big, bind_record, bind_records, ts};

/// A batch's run, answering each of its requests.
type Batch = Pin<Box<dyn Future<Output = ()> + Send>>;

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
        let inserted = retry_conflicts(&self.mode, "claim", || async {
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
        match retry_conflicts(&self.mode, "complete", || self.complete_batch(&batch)).await {
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
        retry_conflicts(&self.mode, "complete", || {
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
mod tests;
