//! [`StoreError`], what a store answers when it cannot do what was asked, and the limits of the
//! rules it carries ([`OutcomeTooLarge`], [`ZeroLease`], [`CheckpointTooLarge`], re-exported by
//! [`crate::machine`]).

use std::time::Duration;

/// A boxed error kept as the source of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A store could not do what was asked. Domain answers (replay, in flight, fenced…) are never
/// errors; this is for the store itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached or is overloaded right now (connection lost, pool timed out,
    /// server restarting): try again later. Never a reason to run the operation without a claim.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed, for people.
        message: String,
        /// The engine's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The engine refused or failed the operation for another reason (a constraint, a syntax
    /// error, a permission).
    #[error("store error: {message}")]
    Backend {
        /// What failed, for people.
        message: String,
        /// The engine's error.
        #[source]
        source: Option<BoxError>,
    },
    /// A stored record could not be read back (a value out of range, a missing field).
    #[error("corrupt record: {message}")]
    Corrupt {
        /// What was wrong.
        message: String,
        /// Why it does not parse, when a parser said so.
        #[source]
        source: Option<BoxError>,
    },
    /// The store is not set up as it must be (a schema missing, an unsafe server setting).
    #[error("store misconfigured: {message}")]
    Misconfigured {
        /// What is wrong.
        message: String,
    },
    /// The outcome is over the policy's size limit; nothing was stored.
    #[error(transparent)]
    OutcomeTooLarge(#[from] OutcomeTooLarge),
    /// `extend` was given a lease of zero whole milliseconds; nothing was written.
    #[error(transparent)]
    ZeroLease(#[from] ZeroLease),
    /// The checkpoint is over the policy's size limit; nothing was written.
    #[error(transparent)]
    CheckpointTooLarge(#[from] CheckpointTooLarge),
}

impl StoreError {
    /// An [`StoreError::Unavailable`] keeping `source`.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`StoreError::Backend`] keeping `source`.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`StoreError::Corrupt`] without a source.
    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    /// A [`StoreError::Corrupt`] keeping `source` (the parser's or the driver's error).
    pub fn corrupt_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Corrupt {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether this is "unavailable, try later" (HTTP 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// A short label for metrics: `unavailable`, `backend`, `corrupt`, `misconfigured`,
    /// `outcome_too_large`, `zero_lease`, `checkpoint_too_large`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable { .. } => "unavailable",
            Self::Backend { .. } => "backend",
            Self::Corrupt { .. } => "corrupt",
            Self::Misconfigured { .. } => "misconfigured",
            Self::OutcomeTooLarge(_) => "outcome_too_large",
            Self::ZeroLease(_) => "zero_lease",
            Self::CheckpointTooLarge(_) => "checkpoint_too_large",
        }
    }
}

/// An outcome over [`Policy::max_outcome_bytes`](crate::Policy::max_outcome_bytes): refused,
/// nothing written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("outcome body is {size} bytes, over the limit of {limit} bytes; nothing was stored")]
pub struct OutcomeTooLarge {
    /// The body's size in bytes.
    pub size: usize,
    /// The limit in bytes.
    pub limit: usize,
}

/// A lease of zero whole milliseconds given to `extend`: refused, nothing written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a lease of {lease:?} is zero in whole milliseconds (leases are stored in milliseconds); extend needs at least 1 ms; nothing was written"
)]
pub struct ZeroLease {
    /// The lease given.
    pub lease: Duration,
}

/// A checkpoint over [`Policy::max_checkpoint_bytes`](crate::Policy::max_checkpoint_bytes):
/// refused, nothing written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "checkpoint is {size} bytes (name and value), over the limit of {limit} bytes; nothing was saved"
)]
pub struct CheckpointTooLarge {
    /// The checkpoint's size in bytes ([`Checkpoint::size`](crate::Checkpoint::size)).
    pub size: usize,
    /// The limit in bytes.
    pub limit: usize,
}
