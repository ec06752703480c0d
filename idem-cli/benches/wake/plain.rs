//! The same store behind a wrapper that forwards only the required methods, so a waiter polls.

use super::*;

/// A store behind a wrapper that forwards only the required methods: waited on by polling.
#[derive(Debug)]
pub(super) struct Plain(pub(super) Arc<dyn KeyStore>);

#[async_trait]
impl KeyStore for Plain {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.0.claim(id, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.0.complete(id, token, outcome, policy, now).await
    }
    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.0.release(id, token, now).await
    }
    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.0.extend(id, token, lease, now).await
    }
    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.0.get(id, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list(filter, now, limit).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(now, limit).await
    }
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
}
