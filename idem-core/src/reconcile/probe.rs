//! What a reconciliation asks and reports: the [`Probe`] and its [`Finding`], and a pass's
//! [`ReconcileReport`].

use async_trait::async_trait;

use crate::{Outcome, Record, StoreError};

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
/// For an operation with several effects, the record's [checkpoints](crate::Checkpoint) say
/// which steps were done ([`Record::last_checkpoint`], decoded by the reconciler's codec): ask
/// about the step after the last one. [`Finding::NotHappened`] then releases the record with
/// its checkpoints, and the next attempt resumes after them.
#[async_trait]
pub trait Probe: Send + Sync {
    /// Looks `record`'s operation up downstream. `record` is as the reconciler holds it: taken
    /// over from the stale holder (its `token` is the reconciler's, which the finding is written
    /// with), its checkpoints decoded.
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
    /// expired or taken meanwhile, or too close to its expiry to be taken over): nothing was
    /// probed, and any claim won by accident was given back. Also a record taken from the
    /// reconciler while its probe ran (its lease ran out): the finding was not written, and the
    /// record is left to the process that took it.
    pub skipped: usize,
    /// Of `completed`: the probe's outcome was over the size limit, so the record holds
    /// [`Outcome::not_kept`] instead.
    pub outcome_not_kept: usize,
    /// Records a store error stopped; the pass went on with the others.
    pub failed: Vec<ReconcileFailure>,
}
