//! Reconciliation and purge: the way out for records stuck in `processing` ([contract
//! §6](crate::contract#beyond-one-call)), and the garbage collection of expired ones.
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
//! limit completes the record with [`Outcome::not_kept`](crate::Outcome::not_kept), as the
//! executor does. An error on one record (a store error, say) is reported in
//! [`ReconcileReport::failed`] and the pass goes on with the next record.
//!
//! **The takeover keeps the record's own expiry** ([`takeover_policy`]). The claim's ttl is what
//! the record read back has left (and its lease ends before that), so reconciliation never
//! writes an expired operation back: a record that expires between the read and the claim is
//! not claimed, and one purged meanwhile that the claim creates anew expires when the listed one
//! did, instead of refusing another request on the key for a whole ttl
//! ([contract §6](crate::contract#reconciliation)). A read a lease old or older is not acted on
//! (the next pass reads again). Reconciliation never prolongs a record either: a record the
//! probe cannot tell about expires at its ttl like any other; a completion gets the full ttl, as
//! the executor's does.
//!
//! **The limit, honestly:** "not found" is only safe if the original holder can no longer act
//! downstream. The store fences the *record*, not the external effect: a holder that is merely
//! slow (a GC pause, a partition) may still perform its effect after the probe looked. That is
//! what the lease must guarantee — set it above the tool's real worst case — and what holders
//! doing long work must keep true by heartbeating ([`crate::Attempt::extend`]) and stopping when a
//! heartbeat reports the claim lost. Pass the [`crate::downstream_key`] to the provider too, so
//! the provider itself refuses a second effect.
//!
//! **A reconciler settles every stale record of its store**, whatever tool wrote it: a pass
//! lists the store's stale records oldest first (the whole table, the whole key prefix), and its
//! probe's [`Finding::NotHappened`] releases a record for a retry. Give a store one reconciler
//! whose probe knows every tool that writes to it; services that each bring their own probe keep
//! their records apart, a table or key prefix each (a probe that does not know a record's tool
//! must answer [`Finding::Unknown`], and a pass of `batch` such records leaves the rest unseen).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::OutcomeCodec;
use crate::metrics::{count_reconcile, timed};
use crate::{Clock, KeyStore, Policy, StoreError};

mod probe;
mod purge;
mod settle;

pub use probe::{Finding, Probe, ReconcileFailure, ReconcileReport};
pub use purge::{InvalidDuty, PurgePace, PurgeReport, purge_expired_all, purge_expired_paced};

pub use settle::takeover_policy;

use settle::Settler;

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
    /// (its lease is the reconciler's own lease while it probes, cut short where the record
    /// expires sooner: a takeover keeps the record's expiry, [`takeover_policy`]; its ttl and
    /// cache policy apply to the completion).
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

    /// Encodes the probe's outcomes with `codec` before storing them: give it the executor's codec
    /// (the one given to [`Executor::with_codec`](crate::Executor::with_codec)), or records
    /// completed here would be stored in clear (and refused on replay by an encrypting codec). A
    /// failure to encode is reported in [`ReconcileReport::failed`] as a [`StoreError::Backend`]
    /// keeping the codec's error as its source; the record stays `processing`.
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
        let settler = Settler {
            store,
            clock: &*self.clock,
            policy: &self.policy,
            probe: &self.probe,
            codec: self.codec.as_deref(),
        };
        let mut report = ReconcileReport::default();
        for record in stale {
            report.examined += 1;
            if let Err(error) = settler.settle(&record, &mut report).await {
                tracing::warn!(scope = %record.scope, key = %record.key, %error, "reconciliation of this record failed; going on with the next");
                count_reconcile("failed");
                report.failed.push(ReconcileFailure { record, error });
            }
        }
        Ok(report)
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
