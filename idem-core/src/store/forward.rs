//! The stores that forward to another: `Arc<S>` and `Box<S>` are stores wherever `S` is.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::machine::{CheckpointAnswer, ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use crate::store::{CheckpointStore, KeyStore, ListFilter, StoreError};
use crate::timer::Timer;
use crate::{Checkpoint, Clock, Fingerprint, Outcome, Policy, Record, RecordId, Timestamp, Token};

/// Implements [`KeyStore`] and [`CheckpointStore`] for each pointer named, every method
/// forwarding to the store pointed to, the provided ones included. Under
/// `#[deny(clippy::missing_trait_methods)]`: a method added to either trait and not added here
/// fails the build instead of being left to its default (which would bypass the store).
macro_rules! forward_store {
    ($($pointer:ident),+ $(,)?) => {$(
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<S: KeyStore + ?Sized> KeyStore for $pointer<S> {
            async fn claim(
                &self,
                id: &RecordId,
                fingerprint: &Fingerprint,
                policy: &Policy,
                now: Timestamp,
            ) -> Result<ClaimAnswer, StoreError> {
                (**self).claim(id, fingerprint, policy, now).await
            }

            async fn complete(
                &self,
                id: &RecordId,
                token: Token,
                outcome: &Outcome,
                policy: &Policy,
                now: Timestamp,
            ) -> Result<CompleteAnswer, StoreError> {
                (**self).complete(id, token, outcome, policy, now).await
            }

            async fn release(
                &self,
                id: &RecordId,
                token: Token,
                now: Timestamp,
            ) -> Result<ReleaseAnswer, StoreError> {
                (**self).release(id, token, now).await
            }

            async fn extend(
                &self,
                id: &RecordId,
                token: Token,
                lease: Duration,
                now: Timestamp,
            ) -> Result<ExtendAnswer, StoreError> {
                (**self).extend(id, token, lease, now).await
            }

            async fn get(
                &self,
                id: &RecordId,
                now: Timestamp,
            ) -> Result<Option<Record>, StoreError> {
                (**self).get(id, now).await
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

            async fn purge_expired(
                &self,
                now: Timestamp,
                limit: usize,
            ) -> Result<usize, StoreError> {
                (**self).purge_expired(now, limit).await
            }

            fn backend(&self) -> &'static str {
                (**self).backend()
            }

            fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
                (**self).as_checkpoint_store()
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

        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<S: CheckpointStore + ?Sized> CheckpointStore for $pointer<S> {
            async fn checkpoint(
                &self,
                id: &RecordId,
                token: Token,
                checkpoint: &Checkpoint,
                policy: &Policy,
            ) -> Result<CheckpointAnswer, StoreError> {
                (**self).checkpoint(id, token, checkpoint, policy).await
            }
        }
    )+};
}

forward_store!(Arc, Box);
