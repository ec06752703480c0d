//! Reconciliation and purge: the way out for records stuck in `processing` ([contract §6](crate::contract#beyond-one-call)), and the
//! garbage collection of expired ones.
//!
//! The seed's third case: the tool succeeded, the response write failed, the key says
//! `processing` forever. Neither "pretend it did not happen" (a retry would do it twice) nor
//! "stuck until a human reads the database". The [`Reconciler`] lists `processing` records whose
//! lease has elapsed, takes each over with a fresh token (so the original holder, if it is still
//! alive somewhere, is fenced out), asks a user-supplied [`Probe`] whether the effect happened
//! downstream, and acts:
//!
//! | probe says | action |
//! | --- | --- |
//! | [`Finding::Happened`] with the outcome | completes the record with that outcome: retries replay it |
//! | [`Finding::NotHappened`] | releases the record (`failed_retryable`): the next retry runs the operation |
//! | [`Finding::Unknown`] | leaves it `processing` (under the reconciler's token and lease) and reports it |
//!
//! A record that is no longer the stale claim that was listed (completed, released, retried,
//! taken or expired meanwhile) is skipped, not probed. The reconciler first reads it back and
//! writes nothing unless it is still `processing` under the listed token with its lease elapsed;
//! and if the record changes between that read and the takeover claim, the claim answers how it
//! was won: anything but a takeover of a stale claim (a retry of a `failed_retryable` record, a
//! new record where the old one expired or was purged) is given straight back with `release`,
//! unprobed, so the record ends `failed_retryable` (a retry runs the operation, as it would have)
//! and is never left `processing` under the old fingerprint. A probe's outcome over the size
//! limit completes the record with [`Outcome::not_kept`], as the executor does. An error on one
//! record (a store error, say) is reported in [`ReconcileReport::failed`] and the pass goes on
//! with the next record.
//!
//! **The limit, honestly:** "not found" is only safe if the original holder can no longer act
//! downstream. The store fences the *record*, not the external effect: a holder that is merely
//! slow (a GC pause, a partition) may still perform its effect after the probe looked. That is
//! what the lease must guarantee — set it above the tool's real worst case — and what holders
//! doing long work must keep true by heartbeating ([`crate::Attempt::extend`]) and stopping when a
//! heartbeat reports the claim lost. Pass the [`crate::downstream_key`] to the provider too, so
//! the provider itself refuses a second effect.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{count_reconcile, timed};

use async_trait::async_trait;

use crate::codec::OutcomeCodec;
use crate::executor::{CompletionError, Held, complete_or_not_kept};
use crate::machine::{ClaimAnswer, ClaimKind, CompleteAnswer, ReleaseAnswer};
use crate::{Clock, KeyStore, Outcome, Policy, Record, StalePolicy, StoreError, Timestamp};

/// What a probe found downstream about one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The effect happened; this is the answer to store (what the operation would have returned).
    Happened(Outcome),
    /// The effect did not happen (and, given the lease, cannot happen any more).
    NotHappened,
    /// The probe cannot tell (the downstream system is unavailable, say).
    Unknown,
}

/// Asks the downstream system whether an operation's effect happened: e.g. "is there a ticket
/// whose external id is `downstream_key(scope, key, "helpdesk")`?".
///
/// For an operation with several effects, the record's [checkpoints](crate::checkpoint) say
/// which steps were done ([`Record::last_checkpoint`], decoded by the reconciler's codec): ask
/// about the step after the last one. [`Finding::NotHappened`] then releases the record with
/// its checkpoints, and the next attempt resumes after them.
#[async_trait]
pub trait Probe: Send + Sync {
    /// Looks `record`'s operation up downstream.
    async fn probe(&self, record: &Record) -> Finding;
}

/// One record a pass could not settle, and why.
#[derive(Debug)]
pub struct ReconcileFailure {
    /// The record as it was listed.
    pub record: Record,
    /// The store's error.
    pub error: StoreError,
}

/// What one reconciliation pass did.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Stale records examined.
    pub examined: usize,
    /// Completed with the probe's outcome.
    pub completed: usize,
    /// Released for a retry.
    pub released: usize,
    /// Left for later: the probe could not tell (each with its checkpoints decoded, the last
    /// one saying which step the operation had reached).
    pub unknown: Vec<Record>,
    /// Skipped: no longer the stale claim that was listed (completed, released, retried,
    /// expired or taken meanwhile). Nothing was probed; any claim won by accident was given back.
    pub skipped: usize,
    /// Of `completed`: the probe's outcome was over the size limit, so the record holds
    /// [`Outcome::not_kept`] instead.
    pub outcome_not_kept: usize,
    /// Records a store error stopped; the pass went on with the others.
    pub failed: Vec<ReconcileFailure>,
}

/// Settles stale `processing` records with a [`Probe`]; see the module docs.
pub struct Reconciler<P> {
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    policy: Policy,
    probe: P,
    batch: usize,
    stale_for: Duration,
    codec: Option<Arc<dyn OutcomeCodec>>,
}

impl<P: Probe> Reconciler<P> {
    /// A reconciler over `store` with `probe`. `policy` is the one the records were written with
    /// (its lease is the reconciler's own lease while it probes; its ttl and cache policy apply
    /// to the completion).
    pub fn new(store: Arc<dyn KeyStore>, clock: Arc<dyn Clock>, policy: Policy, probe: P) -> Self {
        Self {
            store,
            clock,
            policy,
            probe,
            batch: 100,
            stale_for: Duration::ZERO,
            codec: None,
        }
    }

    /// How many records one pass examines at most (default 100).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Only records whose lease ended at least this long ago (default: any elapsed lease).
    pub fn stale_for(mut self, stale_for: Duration) -> Self {
        self.stale_for = stale_for;
        self
    }

    /// Encodes the probe's outcomes with `codec` before storing them: give it the executor's
    /// codec ([`Executor::codec`](crate::Executor::codec)), or records completed here would be
    /// stored in clear (and refused on replay by an encrypting codec). A failure to encode is
    /// reported in [`ReconcileReport::failed`] as a [`StoreError::Backend`] keeping the codec's
    /// error as its source; the record stays `processing`.
    pub fn codec(mut self, codec: Arc<dyn OutcomeCodec>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// One pass: lists stale records and settles each.
    pub async fn run_once(&self) -> Result<ReconcileReport, StoreError> {
        let now = self.clock.now();
        let store = &*self.store;
        let stale = timed(
            store.backend(),
            "list_in_flight",
            store.list_in_flight(now - self.stale_for, self.batch),
        )
        .await?;
        let mut report = ReconcileReport::default();
        for record in stale {
            report.examined += 1;
            if let Err(error) = self.settle(&record, &mut report).await {
                tracing::warn!(scope = %record.scope, key = %record.key, %error, "reconciliation of this record failed; going on with the next");
                count_reconcile("failed");
                report.failed.push(ReconcileFailure { record, error });
            }
        }
        Ok(report)
    }

    async fn settle(
        &self,
        record: &Record,
        report: &mut ReconcileReport,
    ) -> Result<(), StoreError> {
        let takeover = self
            .policy
            .to_builder()
            .stale(StalePolicy::Takeover)
            .build()
            .expect("the same policy with another stale policy is valid");
        let now = self.clock.now();
        // Still the stale claim that was listed? If not, skip it without writing anything.
        let store = &*self.store;
        let current = timed(
            store.backend(),
            "get",
            store.get(&record.scope, &record.key, now),
        )
        .await?;
        let still_stale = current.as_ref().is_some_and(|r| {
            r.token == record.token
                && r.fingerprint == record.fingerprint
                && r.is_stale_processing(now)
        });
        if !still_stale {
            transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, state = current.as_ref().map(|r| r.state.as_str()), "no longer the stale claim that was listed");
            count_reconcile("skipped");
            report.skipped += 1;
            return Ok(());
        }
        // Take the record over: from here on the original holder is fenced out.
        let answer = timed(
            store.backend(),
            "claim",
            store.claim(
                &record.scope,
                &record.key,
                &record.fingerprint,
                &takeover,
                now,
            ),
        )
        .await?;
        let token = match answer {
            ClaimAnswer::Claimed {
                token,
                kind: ClaimKind::TakenOver,
                ..
            } => token,
            ClaimAnswer::Claimed { token, kind, .. } => {
                // Changed since the read: released or retried (now `failed_retryable`), expired
                // or purged. The claim was not won from a stale holder; give it straight back.
                let given_back = timed(
                    store.backend(),
                    "release",
                    store.release(&record.scope, &record.key, token, self.clock.now()),
                )
                .await?;
                transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, ?kind, ?given_back, "no longer stale; the claim was given back unprobed");
                count_reconcile("skipped");
                report.skipped += 1;
                return Ok(());
            }
            answer => {
                transition!(INFO, "reconcile_skipped", scope = %record.scope, key = %record.key, ?answer, "no longer stale");
                count_reconcile("skipped");
                report.skipped += 1;
                return Ok(());
            }
        };
        // The steps the operation saved, as they stand now that the old holder is fenced out,
        // decoded: the probe is asked about the step after the last one (contract §6.1).
        let after = timed(
            store.backend(),
            "get",
            store.get(&record.scope, &record.key, self.clock.now()),
        )
        .await?;
        let saved = after
            .filter(|r| r.token == token)
            .map_or_else(|| record.checkpoints.clone(), |r| r.checkpoints);
        let cx = crate::codec::CodecContext::new(&record.scope, &record.key);
        let decoded: Result<Vec<_>, _> = saved
            .iter()
            .map(|c| crate::checkpoint::decode_checkpoint(self.codec.as_deref(), &cx, c))
            .collect();
        let (checkpoints, finding) = match decoded {
            Ok(checkpoints) => (checkpoints, None),
            Err(e) => {
                tracing::error!(scope = %record.scope, key = %record.key, error = %e, "the record's checkpoints could not be decoded; not probed, left processing");
                (saved, Some(Finding::Unknown))
            }
        };
        let taken = Record {
            token,
            checkpoints,
            ..record.clone()
        };
        let finding = match finding {
            Some(finding) => finding,
            None => self.probe.probe(&taken).await,
        };
        match finding {
            Finding::Happened(outcome) => {
                let now = self.clock.now();
                let held = Held {
                    store: &*self.store,
                    codec: self.codec.as_deref(),
                    scope: &taken.scope,
                    key: &taken.key,
                    token,
                };
                let completion = complete_or_not_kept(held, &outcome, &self.policy, now)
                    .await
                    .map_err(|e| match e {
                        CompletionError::Store(e) => e,
                        CompletionError::Encode(e) => {
                            StoreError::backend("the probe's outcome could not be encoded", e)
                        }
                    })?;
                match completion.answer {
                    CompleteAnswer::Fenced => {
                        count_reconcile("skipped");
                        report.skipped += 1;
                    }
                    _ => {
                        if let Some(e) = completion.not_kept {
                            transition!(WARN, "completed", scope = %taken.scope, key = %taken.key, status = outcome.status(), outcome_not_kept = true, size = e.size, limit = e.limit, "reconciled: the effect happened; its outcome is over the size limit, recorded as 'ran, response not kept'");
                            report.outcome_not_kept += 1;
                        } else {
                            transition!(INFO, "completed", scope = %taken.scope, key = %taken.key, status = outcome.status(), "reconciled: the effect happened; outcome stored");
                        }
                        count_reconcile("completed");
                        report.completed += 1;
                    }
                }
            }
            Finding::NotHappened => {
                let now = self.clock.now();
                match timed(
                    store.backend(),
                    "release",
                    store.release(&taken.scope, &taken.key, token, now),
                )
                .await?
                {
                    ReleaseAnswer::Released => {
                        transition!(INFO, "released", scope = %taken.scope, key = %taken.key, "reconciled: the effect did not happen; released for a retry");
                        count_reconcile("released");
                        report.released += 1;
                    }
                    ReleaseAnswer::Fenced => {
                        count_reconcile("skipped");
                        report.skipped += 1;
                    }
                }
            }
            Finding::Unknown => {
                transition!(WARN, "reconcile_unknown", scope = %taken.scope, key = %taken.key, "reconciliation: the probe cannot tell; left processing");
                count_reconcile("unknown");
                report.unknown.push(taken);
            }
        }
        Ok(())
    }

    /// Runs a pass every `interval` until the returned future is dropped. `sleep` is the
    /// runtime's sleep (e.g. `tokio::time::sleep`); spawn the future as a task. A failed pass is
    /// logged and the next one runs on schedule.
    pub async fn run_periodically<S, F>(&self, interval: Duration, sleep: S)
    where
        S: Fn(Duration) -> F,
        F: Future<Output = ()>,
    {
        loop {
            match self.run_once().await {
                Ok(report) if report.examined > 0 => tracing::info!(
                    examined = report.examined,
                    completed = report.completed,
                    released = report.released,
                    unknown = report.unknown.len(),
                    skipped = report.skipped,
                    outcome_not_kept = report.outcome_not_kept,
                    failed = report.failed.len(),
                    "reconciliation pass"
                ),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "reconciliation pass failed"),
            }
            sleep(interval).await;
        }
    }
}

impl<P> std::fmt::Debug for Reconciler<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("store", &self.store)
            .field("batch", &self.batch)
            .field("stale_for", &self.stale_for)
            .finish_non_exhaustive()
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted.
    pub deleted: usize,
    /// Batches run.
    pub batches: usize,
    /// Whether it stopped at the deadline with expired records possibly left.
    pub stopped_at_deadline: bool,
}

/// Deletes the records expired at `now` in batches of `batch` until a batch comes back short or
/// `deadline` (on `clock`) passes; `on_batch` sees the running total after each batch (for a
/// progress bar). Runs flat out: one batch straight after the other. Usable as a periodic task;
/// where claims run at the same time, [`purge_expired_paced`] leaves them room.
pub async fn purge_expired_all(
    store: &dyn KeyStore,
    clock: &dyn Clock,
    batch: usize,
    deadline: Option<Timestamp>,
    on_batch: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, StoreError> {
    let mut pace = PurgePace::new(batch);
    if let Some(deadline) = deadline {
        pace = pace.deadline(deadline);
    }
    purge_expired_paced(store, clock, pace, |_| std::future::ready(()), on_batch).await
}

/// How [`purge_expired_paced`] goes: batch size, share of the time spent in the store, deadline.
///
/// A batch holds what the engine holds while it deletes: SQLite's one write lock for the whole
/// batch, Redis's one thread for each script, PostgreSQL only the rows. A claim that arrives
/// meanwhile waits for the rest of the batch, so on SQLite and Redis a purge running flat out
/// stretches the claims' tail. Small batches keep each wait short; a duty cycle below 1 keeps
/// most claims from meeting a batch at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PurgePace {
    batch: usize,
    duty: f64,
    deadline: Option<Timestamp>,
}

/// A duty cycle outside `(0, 1]` (or not a number).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("purge duty cycle must be greater than 0 and at most 1, got {0}")]
pub struct InvalidDuty(pub f64);

impl PurgePace {
    /// Batches of `batch` records (at least 1), flat out (duty cycle 1), no deadline.
    pub fn new(batch: usize) -> Self {
        PurgePace {
            batch: batch.max(1),
            duty: 1.0,
            deadline: None,
        }
    }

    /// The share of wall-clock time the purge may spend in `purge_expired`: after a batch that
    /// took `t`, it rests `t × (1 − duty) / duty` before the next. `0.5` rests as long as each
    /// batch took; `1.0` does not rest. Refuses anything outside `(0, 1]`.
    pub fn duty(self, duty: f64) -> Result<Self, InvalidDuty> {
        if duty > 0.0 && duty <= 1.0 {
            Ok(PurgePace { duty, ..self })
        } else {
            Err(InvalidDuty(duty))
        }
    }

    /// Stops once `deadline` (on the purge's clock) has passed, checked before each batch.
    pub fn deadline(self, deadline: Timestamp) -> Self {
        PurgePace {
            deadline: Some(deadline),
            ..self
        }
    }

    /// Records per batch.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// The duty cycle, in `(0, 1]`.
    pub fn duty_cycle(&self) -> f64 {
        self.duty
    }

    /// How long to rest after a batch that took `took`.
    fn rest_after(&self, took: Duration) -> Duration {
        if self.duty >= 1.0 {
            Duration::ZERO
        } else {
            took.mul_f64((1.0 - self.duty) / self.duty)
        }
    }
}

/// Deletes the records expired at `now` as [`purge_expired_all`] does, paced by `pace`: after
/// each batch it rests (with `sleep`, the runtime's sleep, e.g. `tokio::time::sleep`) in
/// proportion to the time the batch took, so the purge holds the store at most `pace`'s duty
/// cycle of the time. The batch time is measured on the monotonic clock, not on `clock` (whose
/// milliseconds are too coarse for batches of a few records); `clock` gives `now` and the
/// deadline. `on_batch` sees the running total after each batch. A short batch ends it without a
/// rest.
///
/// ```
/// use idem_core::{KeyStore, PurgePace, StoreError, SystemClock, purge_expired_paced};
///
/// /// What `idem purge` does: 250 records a batch, deleting at most a quarter of the time.
/// async fn purge(store: &dyn KeyStore) -> Result<usize, StoreError> {
///     let pace = PurgePace::new(250).duty(0.25).expect("a duty cycle in (0, 1]");
///     let report =
///         purge_expired_paced(store, &SystemClock, pace, tokio::time::sleep, |_| {}).await?;
///     Ok(report.deleted)
/// }
/// # let store = idem_core::MemoryStore::new();
/// # let deleted = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
/// #     .block_on(purge(&store)).unwrap();
/// # assert_eq!(deleted, 0);
/// ```
pub async fn purge_expired_paced<S, F>(
    store: &dyn KeyStore,
    clock: &dyn Clock,
    pace: PurgePace,
    sleep: S,
    mut on_batch: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, StoreError>
where
    S: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let batch = pace.batch;
    let now = clock.now();
    let mut report = PurgeReport::default();
    loop {
        if pace.deadline.is_some_and(|d| clock.now() >= d) {
            report.stopped_at_deadline = true;
            return Ok(report);
        }
        let started = std::time::Instant::now();
        let n = timed(
            store.backend(),
            "purge_expired",
            store.purge_expired(now, batch),
        )
        .await?;
        let took = started.elapsed();
        report.deleted += n;
        report.batches += 1;
        on_batch(&report);
        if n < batch {
            return Ok(report);
        }
        let rest = pace.rest_after(took);
        if !rest.is_zero() {
            sleep(rest).await;
        }
    }
}
