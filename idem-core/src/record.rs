//! What a store keeps for one (scope, key), and [`RecordId`], the (scope, key) that names it.

use serde::{Deserialize, Serialize};

use crate::{Checkpoint, Fingerprint, IdempotencyKey, Outcome, Scope, Timestamp, Token};

/// The state of a record ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// A holder has claimed the operation and has not finished it.
    Processing,
    /// The operation finished; its outcome is the answer to every repeat.
    Completed,
    /// The last attempt failed retryably or was released; the next claim runs it again.
    FailedRetryable,
}

impl RecordState {
    /// Every state, in the order of the contract's table (for a store that reads an index once
    /// per state, e.g. `list` without a state filter).
    pub const ALL: [RecordState; 3] = [
        RecordState::Processing,
        RecordState::Completed,
        RecordState::FailedRetryable,
    ];

    /// `"processing"`, `"completed"` or `"failed_retryable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::FailedRetryable => "failed_retryable",
        }
    }

    /// Parses [`RecordState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "processing" => Some(Self::Processing),
            "completed" => Some(Self::Completed),
            "failed_retryable" => Some(Self::FailedRetryable),
            _ => None,
        }
    }
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The address of one record: a [`Scope`] and an [`IdempotencyKey`] together, compared byte for
/// byte ([contract §1](crate::contract#words)). The same key in two scopes is two records.
///
/// Every [`KeyStore`](crate::KeyStore) method that reads or writes one record takes one.
///
/// ```
/// use idem_core::{IdempotencyKey, RecordId, Scope};
/// let id = RecordId::new(Scope::new("tenant-a/create_ticket")?, IdempotencyKey::new("wf-1:step-3")?);
/// assert_eq!((id.scope().as_str(), id.key().as_str()), ("tenant-a/create_ticket", "wf-1:step-3"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    scope: Scope,
    key: IdempotencyKey,
}

impl RecordId {
    /// The record of `key` in `scope`.
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self { scope, key }
    }

    /// Who owns the key.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The scope and the key.
    pub fn into_parts(self) -> (Scope, IdempotencyKey) {
        (self.scope, self.key)
    }
}

/// What a store keeps for (scope, key) ([contract §1](crate::contract#words)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Who owns the key.
    pub scope: Scope,
    /// The key.
    pub key: IdempotencyKey,
    /// The fingerprint of the request that first claimed the key; never changes while the record
    /// lives.
    pub fingerprint: Fingerprint,
    /// Where the record is in its life.
    pub state: RecordState,
    /// The token of the latest claim.
    pub token: Token,
    /// Which attempt the latest claim was, from 1.
    pub attempt: u32,
    /// Until when the latest claim is presumed alive.
    pub lease_until: Timestamp,
    /// The stored outcome: the answer when `completed`; the last retryable answer, if any, when
    /// `failed_retryable`; none while `processing`.
    pub outcome: Option<Outcome>,
    /// When the record was first written.
    pub created_at: Timestamp,
    /// When the record was last written.
    pub updated_at: Timestamp,
    /// From this instant on the record is treated exactly as if it did not exist.
    pub expires_at: Timestamp,
    /// The steps the operation saved so far, in order ([contract
    /// §6.1](crate::contract#checkpoints)): kept through a release, a retryable outcome and a
    /// takeover; none once `completed`.
    #[serde(default)]
    pub checkpoints: Vec<Checkpoint>,
}

impl Record {
    /// The record's address: its scope and key.
    pub fn id(&self) -> RecordId {
        RecordId::new(self.scope.clone(), self.key.clone())
    }

    /// Where the record's key came from: sent by the caller or derived by the tool
    /// ([contract §5.1](crate::contract#keyless)), as [`IdempotencyKey::origin`] reads it.
    pub fn key_origin(&self) -> crate::KeyOrigin {
        self.key.origin()
    }

    /// Whether the record has expired at `now` (`now >= expires_at`): an expired record is absent.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether the lease of a `processing` record has run out at `now` (`now >= lease_until`).
    pub fn lease_elapsed(&self, now: Timestamp) -> bool {
        now >= self.lease_until
    }

    /// The last step the operation saved ([contract §6.1](crate::contract#checkpoints)): the
    /// step a resumed attempt or a reconciliation probe continues after.
    pub fn last_checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoints.last()
    }

    /// Whether `list_in_flight(at, …)` lists it: `processing`, lease elapsed and not expired at
    /// `at`.
    pub fn is_stale_processing(&self, at: Timestamp) -> bool {
        self.state == RecordState::Processing && self.lease_elapsed(at) && !self.is_expired(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        for s in [
            RecordState::Processing,
            RecordState::Completed,
            RecordState::FailedRetryable,
        ] {
            assert_eq!(RecordState::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(RecordState::parse("done"), None);
    }
}
