//! [`CheckpointStore`]: the capability of a store that keeps checkpoints.

use async_trait::async_trait;

use crate::machine::CheckpointAnswer;
use crate::store::{KeyStore, StoreError};
use crate::{Checkpoint, Policy, RecordId, Token};

/// A [`KeyStore`] that keeps the steps of an operation ([contract §6.1](crate::contract#checkpoints)).
///
/// A capability of its own, not a method of [`KeyStore`] with a refusing default: a store that
/// cannot keep checkpoints does not implement it, and so is never asked for one. A store that
/// does implements it and returns `Some(self)` from [`KeyStore::as_checkpoint_store`], through
/// which the executor (holding `Arc<dyn KeyStore>`) reaches it:
///
/// ```
/// # use std::time::Duration;
/// use idem_core::{async_trait, Checkpoint, KeyStore, MemoryStore, Policy, RecordId, StoreError,
///     Token};
/// use idem_core::machine::CheckpointAnswer;
/// use idem_core::store::CheckpointStore;
/// # use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
/// # use idem_core::store::ListFilter;
/// # use idem_core::{Fingerprint, Outcome, Record, Timestamp};
///
/// /// A store in front of a `MemoryStore` (a stand-in for your engine).
/// #[derive(Debug, Default)]
/// struct MyStore(MemoryStore);
///
/// #[async_trait]
/// impl KeyStore for MyStore {
///     // … the required methods, then:
/// #   async fn claim(&self, id: &RecordId, f: &Fingerprint, p: &Policy, now: Timestamp)
/// #       -> Result<ClaimAnswer, StoreError> { self.0.claim(id, f, p, now).await }
/// #   async fn complete(&self, id: &RecordId, t: Token, o: &Outcome, p: &Policy, now: Timestamp)
/// #       -> Result<CompleteAnswer, StoreError> { self.0.complete(id, t, o, p, now).await }
/// #   async fn release(&self, id: &RecordId, t: Token, now: Timestamp)
/// #       -> Result<ReleaseAnswer, StoreError> { self.0.release(id, t, now).await }
/// #   async fn extend(&self, id: &RecordId, t: Token, l: Duration, now: Timestamp)
/// #       -> Result<ExtendAnswer, StoreError> { self.0.extend(id, t, l, now).await }
/// #   async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
/// #       self.0.get(id, now).await }
/// #   async fn list_in_flight(&self, o: Timestamp, l: usize) -> Result<Vec<Record>, StoreError> {
/// #       self.0.list_in_flight(o, l).await }
/// #   async fn list(&self, f: &ListFilter, now: Timestamp, l: usize)
/// #       -> Result<Vec<Record>, StoreError> { self.0.list(f, now, l).await }
/// #   async fn purge_expired(&self, now: Timestamp, l: usize) -> Result<usize, StoreError> {
/// #       self.0.purge_expired(now, l).await }
///     fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
///         Some(self)
///     }
/// }
///
/// #[async_trait]
/// impl CheckpointStore for MyStore {
///     async fn checkpoint(&self, id: &RecordId, token: Token, checkpoint: &Checkpoint,
///                         policy: &Policy) -> Result<CheckpointAnswer, StoreError> {
///         // read, decide with `machine::checkpoint`, write: in one atomic step, as `complete`
///         self.0.checkpoint(id, token, checkpoint, policy).await
///     }
/// }
///
/// let store: Box<dyn KeyStore> = Box::new(MyStore::default());
/// assert!(store.as_checkpoint_store().is_some());
/// ```
///
/// Only the accessor leads from a store to its checkpoints; a store is not one by being a
/// [`KeyStore`]:
///
/// ```compile_fail
/// use idem_core::KeyStore;
/// use idem_core::store::CheckpointStore;
/// fn checkpoints_of(store: &dyn KeyStore) -> &dyn CheckpointStore {
///     store // error: `dyn KeyStore` is not a `CheckpointStore`; use `as_checkpoint_store()`
/// }
/// ```
#[async_trait]
pub trait CheckpointStore: KeyStore {
    /// Saves `checkpoint` for the holder of `token` on the record `id`, per
    /// [`crate::machine::checkpoint`]; `checkpoint.saved_at()` is the caller's `now`, against which
    /// expiry is decided.
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
    ///   expired one. [`KeyStore::get`] returns them in
    ///   [`Record::checkpoints`](crate::Record::checkpoints).
    /// - Return `Some(self)` from [`KeyStore::as_checkpoint_store`], or nobody calls this.
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError>;
}
