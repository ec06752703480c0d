//! What the executor answers when it does not return an outcome.

use std::time::Duration;

use crate::codec::CodecError;
use crate::{Outcome, StoreError};

/// Why [`Executor::run`](crate::Executor::run) returned no outcome.
///
/// The variants say whether the operation ran: `InFlight`, `FingerprintMismatch`, `Store`,
/// `Decode`, `Deserialize` and `NotKept` come before it (nothing happened in this call); `Fenced`,
/// `OutcomeTooLarge`, `NotRecorded`, `Encode` and `Serialize` come after it (the effect may have
/// happened; the answer is carried here where there is one). [`Error::operation_ran`] tells them
/// apart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another attempt holds the claim. Nothing ran. Try again after `retry_after`.
    #[error("the operation is in flight in another attempt; retry after {retry_after:?}")]
    InFlight {
        /// How long to wait before asking again (never zero): when the answer is likely ready,
        /// what is left of the tool's processing window since the holder's claim, within the
        /// holder's lease ([`Executor::with_processing_window`](crate::Executor::with_processing_window));
        /// for a stale record, the policy's lease.
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
    /// The record is completed, but the executor's [codec](crate::codec) could not decode its
    /// stored outcome: an unknown key id, a wrong key, a body tampered with or stored without the
    /// codec. Nothing ran and nothing is replayed (never a replay of garbage); the record is left
    /// as it is. Also a resumed attempt whose [checkpoints](crate::Checkpoint) do not decode:
    /// nothing ran, and the claim was released. Over HTTP and MCP it is an internal error (500).
    /// Fix the codec's keys; the next call replays.
    #[error("the stored outcome could not be decoded; nothing ran and nothing was replayed")]
    Decode(#[source] CodecError),
    /// The operation ran, but the executor's [codec](crate::codec) could not encode its outcome,
    /// so nothing was stored: the record stays `processing`, for the lease and reconciliation, as
    /// with [`Error::NotRecorded`].
    #[error("the operation ran but its outcome could not be encoded, so it was not stored")]
    Encode {
        /// What the operation answered.
        outcome: Box<Outcome>,
        /// The codec's failure.
        #[source]
        source: CodecError,
    },
    /// [`Executor::run_typed`](crate::Executor::run_typed): the operation ran, but its value
    /// could not be serialised as JSON. The record was completed with a "ran, answer not kept"
    /// outcome ([`Outcome::is_not_kept`]) so retries do not run it again, with the status and
    /// class the value would have had.
    #[error("the operation ran but its answer could not be serialised as JSON; it was not kept")]
    Serialize(#[source] serde_json::Error),
    /// [`Executor::run_typed`](crate::Executor::run_typed): the stored outcome does not read back
    /// as the operation's value or error type (the type changed since it was stored). Nothing ran.
    #[error(
        "the stored outcome (status {}) does not read back as the expected type; nothing ran",
        outcome.status()
    )]
    Deserialize {
        /// The stored outcome.
        outcome: Box<Outcome>,
        /// The deserialiser's failure.
        #[source]
        source: serde_json::Error,
    },
    /// [`Executor::run_typed`](crate::Executor::run_typed): the operation ran earlier, but its
    /// answer was not kept (too large, or not serialisable): the record holds a problem of type
    /// [`crate::OUTCOME_NOT_KEPT`], not a value. Nothing ran in this call.
    #[error(
        "the operation ran earlier (status {}) but its answer was not kept; nothing ran",
        outcome.status()
    )]
    NotKept {
        /// The stored outcome (the problem document).
        outcome: Box<Outcome>,
    },
}

impl Error {
    /// Whether the operation may have run (its effect may have happened).
    pub fn operation_ran(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. }
                | Self::OutcomeTooLarge { .. }
                | Self::NotRecorded { .. }
                | Self::Encode { .. }
                | Self::Serialize(_)
        )
    }
}
