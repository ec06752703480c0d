//! What the executor answers when it does not return an outcome.

use std::time::Duration;

use crate::{Outcome, StoreError};

/// Why [`Executor::run`](crate::Executor::run) returned no outcome.
///
/// The variants say whether the operation ran: `InFlight`, `FingerprintMismatch` and `Store` come
/// before it (nothing happened); `Fenced`, `OutcomeTooLarge` and `NotRecorded` come after it (the
/// effect may have happened and its answer is carried here).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another attempt holds the claim. Nothing ran. Try again after `retry_after`.
    #[error("the operation is in flight in another attempt; retry after {retry_after:?}")]
    InFlight {
        /// How long to wait before asking again (never zero).
        retry_after: Duration,
        /// The holder's lease has elapsed; the record waits for reconciliation.
        stale: bool,
    },
    /// The key was already used with a different request. Nothing ran.
    #[error("the idempotency key was already used with a different request")]
    FingerprintMismatch,
    /// The operation ran, but by the time it finished a newer holder had the claim: its outcome
    /// was not stored and the newer holder's stands.
    #[error("the operation ran but lost its claim to a newer attempt; its outcome was not stored")]
    Fenced {
        /// What this attempt's operation answered.
        outcome: Box<Outcome>,
    },
    /// The operation ran, but its outcome is over the policy's size limit and was not stored:
    /// the record was completed with [`Outcome::not_kept`] instead (same status and class, a
    /// problem body of type [`crate::OUTCOME_NOT_KEPT`]), so every retry gets that final answer
    /// rather than 409 forever. This caller gets the operation's real answer here.
    #[error(
        "the operation ran but its outcome ({size} bytes) is over the limit of {limit} bytes and was not stored"
    )]
    OutcomeTooLarge {
        /// What the operation answered.
        outcome: Box<Outcome>,
        /// The body's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The operation ran, but the store failed while recording its outcome; the record may stay
    /// `processing` until reconciliation.
    #[error("the operation ran but its outcome could not be recorded")]
    NotRecorded {
        /// What the operation answered.
        outcome: Box<Outcome>,
        /// The store's failure.
        #[source]
        source: StoreError,
    },
    /// The store failed before the operation ran. Nothing ran.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// Whether the operation may have run (its effect may have happened).
    pub fn operation_ran(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. } | Self::OutcomeTooLarge { .. } | Self::NotRecorded { .. }
        )
    }
}
