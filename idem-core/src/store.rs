//! The storage contract: [`KeyStore`].
//!
//! # Implementing a custom store
//!
//! A store keeps one [`Record`] per (scope, key) and makes each method below one atomic step in
//! its engine. The rules themselves live in [`crate::machine`]; a store that can hold a lock or a
//! transaction around "read the record, decide, write" simply calls them. The
//! `idem-conformance` crate then proves the store keeps every promise.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use idem_core::machine::{self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
//! use idem_core::{async_trait, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, Record,
//!     Scope, StoreError, Timestamp, Token};
//! use idem_core::store::ListFilter;
//!
//! /// A store in a mutex: each method reads, decides with the pure rules and writes, under one lock.
//! #[derive(Debug, Default)]
//! struct MyStore(Mutex<HashMap<(Scope, IdempotencyKey), Record>>);
//!
//! impl MyStore {
//!     fn apply<A>(&self, scope: &Scope, key: &IdempotencyKey,
//!                 rule: impl FnOnce(Option<&Record>) -> machine::Transition<A>) -> A {
//!         let mut map = self.0.lock().unwrap();
//!         let id = (scope.clone(), key.clone());
//!         let t = rule(map.get(&id));
//!         if let Some(record) = t.write { map.insert(id, record); }
//!         t.answer
//!     }
//! }
//!
//! #[async_trait]
//! impl KeyStore for MyStore {
//!     async fn claim(&self, scope: &Scope, key: &IdempotencyKey, fingerprint: &Fingerprint,
//!                    policy: &Policy, now: Timestamp) -> Result<ClaimAnswer, StoreError> {
//!         let req = ClaimRequest::new(scope, key, fingerprint);
//!         Ok(self.apply(scope, key, |found| machine::claim(found, req, now, policy)))
//!     }
//!     async fn complete(&self, scope: &Scope, key: &IdempotencyKey, token: Token, outcome: &Outcome,
//!                       policy: &Policy, now: Timestamp) -> Result<CompleteAnswer, StoreError> {
//!         machine::check_outcome_size(outcome, policy)?;
//!         Ok(self.apply(scope, key, |found| {
//!             machine::complete(found, token, outcome, now, policy).expect("size checked")
//!         }))
//!     }
//!     async fn release(&self, scope: &Scope, key: &IdempotencyKey, token: Token, now: Timestamp)
//!                      -> Result<ReleaseAnswer, StoreError> {
//!         Ok(self.apply(scope, key, |found| machine::release(found, token, now)))
//!     }
//!     async fn extend(&self, scope: &Scope, key: &IdempotencyKey, token: Token, lease: Duration,
//!                     now: Timestamp) -> Result<ExtendAnswer, StoreError> {
//!         machine::check_lease(lease)?;
//!         Ok(self.apply(scope, key, |found| machine::extend(found, token, lease, now).expect("checked")))
//!     }
//!     async fn get(&self, scope: &Scope, key: &IdempotencyKey, now: Timestamp)
//!                  -> Result<Option<Record>, StoreError> {
//!         let map = self.0.lock().unwrap();
//!         Ok(map.get(&(scope.clone(), key.clone())).filter(|r| !r.is_expired(now)).cloned())
//!     }
//!     async fn list_in_flight(&self, older_than: Timestamp, limit: usize)
//!                             -> Result<Vec<Record>, StoreError> {
//!         let map = self.0.lock().unwrap();
//!         let mut stale: Vec<Record> = map.values()
//!             .filter(|r| r.is_stale_processing(older_than))
//!             .cloned().collect();
//!         stale.sort_by_key(|r| r.lease_until);
//!         stale.truncate(limit);
//!         Ok(stale)
//!     }
//!     async fn list(&self, filter: &ListFilter, now: Timestamp, limit: usize)
//!                   -> Result<Vec<Record>, StoreError> {
//!         let map = self.0.lock().unwrap();
//!         let mut found: Vec<Record> = map.values().filter(|r| filter.matches(r, now)).cloned().collect();
//!         ListFilter::order_and_truncate(&mut found, limit);
//!         Ok(found)
//!     }
//!     async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         let expired: Vec<_> = map.iter().filter(|(_, r)| r.is_expired(now))
//!             .map(|(id, _)| id.clone()).take(limit).collect();
//!         for id in &expired { map.remove(id); }
//!         Ok(expired.len())
//!     }
//! }
//!
//! // Then, in the store's tests/conformance.rs:
//! // idem_conformance::conformance_tests!(|| async { MyStore::default() });
//! # let _ = std::sync::Arc::new(MyStore::default()) as Arc<dyn KeyStore>;
//! ```

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::machine::{CheckpointAnswer, ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use crate::timer::Timer;
use crate::{
    Checkpoint, Clock, Fingerprint, IdempotencyKey, Outcome, Policy, Record, RecordState, Scope,
    Timestamp, Token,
};

mod cache;
pub mod columns;
pub(crate) mod error;
pub(crate) mod poll;

pub use cache::ReplayCache;
pub use error::{BoxError, StoreError};

/// What [`KeyStore::list`] selects; each field that is set narrows the selection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records of this scope.
    pub scope: Option<Scope>,
    /// Only records last written at or before this instant (`idem keys ls --older-than 10m`).
    pub updated_before: Option<Timestamp>,
}

impl ListFilter {
    /// Whether `record` is selected at `now` (expired records never are).
    pub fn matches(&self, record: &Record, now: Timestamp) -> bool {
        !record.is_expired(now)
            && self.state.is_none_or(|s| record.state == s)
            && self.scope.as_ref().is_none_or(|s| &record.scope == s)
            && self.updated_before.is_none_or(|t| record.updated_at <= t)
    }

    /// Sorts records as [`KeyStore::list`] returns them and keeps the first `limit`.
    pub fn order_and_truncate(records: &mut Vec<Record>, limit: usize) {
        records.sort_by(|a, b| {
            (a.updated_at, &a.scope, &a.key).cmp(&(b.updated_at, &b.scope, &b.key))
        });
        records.truncate(limit);
    }
}

/// Where records live. Small and dyn-safe: `Arc<dyn KeyStore>` is how the executor holds one.
///
/// Every method takes `now` from the caller and decides expiry and leases against it, never
/// against a clock of the store's own; a record whose `expires_at` is at or before `now` is treated
/// exactly as absent. Every method is one atomic step: no interleaving of calls from any number of
/// connections or processes may produce an outcome that some serial order of the same calls would
/// not. The rules are those of [`crate::machine`]; see the module docs for a complete example.
#[async_trait]
pub trait KeyStore: Send + Sync + fmt::Debug + 'static {
    /// Claims (scope, key) for a request with `fingerprint`, per [`crate::machine::claim`].
    ///
    /// Must be atomic against every other call on the same (scope, key): of any number of
    /// concurrent claims of an absent key, exactly one is `Claimed`. The claim is durable (its own
    /// commit) before this returns. A fresh token id is random (128 bits); its `seq` continues
    /// from an expired record that is replaced.
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError>;

    /// Stores `outcome` for the holder of `token`, per [`crate::machine::complete`].
    ///
    /// Refuses an outcome over `policy.max_outcome_bytes()` with
    /// [`StoreError::OutcomeTooLarge`] before writing anything. Writes only if the record is live,
    /// `processing` and holds exactly `token` (checked in the same atomic step as the write);
    /// otherwise answers `Fenced` and writes nothing. The stored body must read back byte for byte.
    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError>;

    /// Gives the claim of `token` up without an outcome, per [`crate::machine::release`]:
    /// `processing` → `failed_retryable`. Same fencing as [`KeyStore::complete`].
    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError>;

    /// Renews the lease of `token` to `now + lease`, per [`crate::machine::extend`]. Same fencing
    /// as [`KeyStore::complete`].
    ///
    /// Never shortens a lease: the stored deadline becomes the later of the current one and
    /// `now + lease` (decided in the same atomic step as the fencing check), and
    /// [`ExtendAnswer::Extended`] carries the deadline now stored. Refuses a `lease` of zero
    /// whole milliseconds with [`StoreError::ZeroLease`] before reading or writing anything
    /// ([`crate::machine::check_lease`]), whatever the record.
    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError>;

    /// The record for (scope, key), or `None` if there is none or it has expired at `now`.
    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError>;

    /// Up to `limit` records, in every scope, that are `processing`, whose lease ended at or
    /// before `older_than` and that have not expired at `older_than`, earliest lease first: the
    /// work list of reconciliation. Pass `now` for every stale claim, `now - 10 min` for claims
    /// stale for ten minutes or more.
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// Up to `limit` records, live at `now`, that `filter` selects, least recently written first
    /// (then by scope and key): what an operator lists (`idem keys ls`). Each filter should be
    /// served by an index of the store, not a scan of all its records.
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// Deletes up to `limit` records that have expired at `now` and returns how many it deleted.
    /// Live records are never touched. Call it again until it returns less than `limit`.
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError>;

    /// A short name for metrics and logs (`memory`, `sqlite`, `postgres`, `redis`).
    fn backend(&self) -> &'static str {
        "custom"
    }

    /// Saves `checkpoint` for the holder of `token`, per [`crate::machine::checkpoint`]
    /// ([contract §6.1](crate::contract#checkpoints)); `checkpoint.saved_at()` is the caller's
    /// `now`, against which expiry is decided.
    ///
    /// The default answers [`StoreError::CheckpointsUnsupported`] and writes nothing: a store
    /// that keeps checkpoints overrides both this and [`KeyStore::supports_checkpoints`].
    ///
    /// ### To ensure correctness:
    ///
    /// - Refuse a checkpoint over `policy.max_checkpoint_bytes()`
    ///   ([`crate::machine::check_checkpoint_size`]) with [`StoreError::CheckpointTooLarge`]
    ///   before writing anything.
    /// - Fence exactly like [`KeyStore::complete`]: append only if the record is live,
    ///   `processing` and holds exactly `token`, checked in the same atomic step as the write;
    ///   otherwise answer `Fenced` and write nothing.
    /// - Keep the checkpoints in order, the value byte for byte, through a release, a retryable
    ///   outcome kept as `failed_retryable`, an extend, a retry and a takeover; drop them when
    ///   the record becomes `completed`, and never carry them into a record that replaces an
    ///   expired one. [`KeyStore::get`] returns them in [`Record::checkpoints`].
    async fn checkpoint(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        let _ = (scope, key, token, checkpoint, policy);
        Err(StoreError::CheckpointsUnsupported {
            backend: self.backend(),
        })
    }

    /// Whether this store keeps checkpoints ([`KeyStore::checkpoint`]). The default is `false`;
    /// the conformance suite checks every checkpoint rule of a store that answers `true`, and
    /// reports a store that answers `false` as not supporting them.
    fn supports_checkpoints(&self) -> bool {
        false
    }

    /// Resolves when the record of `seen.scope` and `seen.key` may no longer be `seen` (the record
    /// a waiting request read: `processing`): completed, released, taken over, extended, expired or
    /// gone ([contract §5.2](crate::contract#waiting)). Time is `clock`'s; sleep only on `timer`.
    ///
    /// The default polls [`KeyStore::get`] with backoff
    /// ([`wait::poll_for_change`](crate::wait::poll_for_change)), so every store can be waited
    /// on. A store whose engine can notify overrides it.
    ///
    /// ### To ensure correctness:
    /// - Subscribe before reading the record, and return at once if that read already differs
    ///   from `seen` ([`wait::changed`](crate::wait::changed)): a change between the waiter's
    ///   read and the subscription is then never lost.
    /// - Notify after the write is committed (PostgreSQL: `pg_notify` in the writing
    ///   transaction), on completion, release and takeover, from every process that writes.
    /// - Write nothing and hold nothing once the future is dropped (unsubscribe on drop).
    /// - A spurious return is allowed; the executor reads the record again.
    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        poll::poll_for_change(self, seen, clock, timer).await
    }
}

/// A shared store is a store: `Arc<dyn KeyStore>` (or `Arc<S>`) goes wherever a `KeyStore` does.
/// Every method forwards, the provided ones included: a method added to the trait cannot be left
/// to its default here (the lint fails the build).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: KeyStore + ?Sized> KeyStore for std::sync::Arc<S> {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        (**self).claim(scope, key, fingerprint, policy, now).await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        (**self)
            .complete(scope, key, token, outcome, policy, now)
            .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        (**self).release(scope, key, token, now).await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        (**self).extend(scope, key, token, lease, now).await
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        (**self).get(scope, key, now).await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        (**self).list_in_flight(older_than, limit).await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        (**self).list(filter, now, limit).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        (**self).purge_expired(now, limit).await
    }

    fn backend(&self) -> &'static str {
        (**self).backend()
    }

    async fn checkpoint(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        (**self)
            .checkpoint(scope, key, token, checkpoint, policy)
            .await
    }

    fn supports_checkpoints(&self) -> bool {
        (**self).supports_checkpoints()
    }
    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        (**self).wait_for_change(seen, clock, timer).await
    }
}
