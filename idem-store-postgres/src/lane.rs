//! The lanes of batching ([`crate::batch`] runs them): for each kind of write, a queue of
//! requests waiting for a batch and the turns to run one.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use idem_core::machine::CompleteAnswer;
use idem_core::{Outcome, Policy, Record, RecordId, StoreError, Timestamp, Token};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// The most requests one batch takes; the rest wait for the next turn.
pub(crate) const MAX_BATCH: usize = 64;

/// How many batches of one kind run at once: one. While it runs, the next requests queue and go
/// together in the next batch (two turns made batches half the size, and each claim and
/// completion cost the server about twice the CPU at 32 callers: docs/bench.md).
pub(crate) const TURNS: usize = 1;

/// The two lanes of a store handle (shared by its clones).
#[derive(Default)]
pub(crate) struct Batches {
    pub(crate) inserts: Lane<InsertJob>,
    pub(crate) completions: Lane<CompleteJob>,
    /// Requests that ran in a batch with others (for tests).
    pub(crate) shared: AtomicU64,
}

/// Requests of one kind waiting for a batch, and the turns to run one.
pub(crate) struct Lane<J> {
    queue: Mutex<VecDeque<J>>,
    pub(crate) turns: Arc<Semaphore>,
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
    pub(crate) fn push(&self, job: J) {
        self.lock().push_back(job);
    }

    /// Up to [`MAX_BATCH`] requests whose callers still wait; empty only if none is queued.
    pub(crate) fn take(&self) -> Vec<J> {
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
    pub(crate) fn lone_turn(&self) -> Option<OwnedSemaphorePermit> {
        if !self.lock().is_empty() {
            return None;
        }
        self.turns.clone().try_acquire_owned().ok()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<J>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queued request.
pub(crate) trait Job: Send + 'static {
    /// Its caller went away before a batch took it.
    fn abandoned(&self) -> bool;
}

pub(crate) type Answer<T> = oneshot::Sender<Result<T, StoreError>>;

/// A claim's insert of a key it found absent, waiting for a batch: answered whether it inserted.
pub(crate) struct InsertJob {
    pub(crate) record: Record,
    pub(crate) answer: Answer<bool>,
}

impl Job for InsertJob {
    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}

/// A completion waiting for a batch.
pub(crate) struct CompleteJob {
    pub(crate) id: RecordId,
    pub(crate) token: Token,
    pub(crate) outcome: Outcome,
    pub(crate) policy: Policy,
    pub(crate) now: Timestamp,
    pub(crate) answer: Answer<CompleteAnswer>,
}

impl Job for CompleteJob {
    fn abandoned(&self) -> bool {
        self.answer.is_closed()
    }
}
