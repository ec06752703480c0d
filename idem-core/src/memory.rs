//! [`MemoryStore`]: the reference store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::machine::{
    self, CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
    Transition,
};
use crate::store::CheckpointStore;
use crate::store::ListFilter;
use crate::wait::{Timer, Waiters, changed};
use crate::{
    Checkpoint, Clock, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, StoreError,
    Timestamp, Token,
};

type Map = HashMap<RecordId, Record>;

/// The reference store: records in a mutex, every method one critical section running the pure
/// rules of [`crate::machine`]. Clones share the same records.
///
/// For tests, demos and single-process services that accept losing their records on restart
/// (which turns a replay after a restart into a re-execution).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<Map>>,
    /// Wakes the waiters of a key after each write ([contract §5.2](crate::contract#waiting)).
    waiters: Waiters,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records it holds, expired or not.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic while the lock was held cannot leave a half-written record: writes are single
        // inserts of a record built beforehand.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply<A>(
        &self,
        id: &RecordId,
        rule: impl FnOnce(Option<&Record>) -> Result<Transition<A>, StoreError>,
    ) -> Result<A, StoreError> {
        let mut map = self.lock();
        let transition = rule(map.get(id))?;
        let wrote = transition.write.is_some();
        if let Some(record) = transition.write {
            map.insert(id.clone(), record);
        }
        drop(map);
        if wrote {
            self.waiters.wake(id);
        }
        Ok(transition.answer)
    }

    /// How many waits on its records are subscribed right now (one per waited key, however many
    /// requests wait on it).
    pub fn wait_subscriptions(&self) -> usize {
        self.waiters.waiting()
    }
}

#[async_trait]
impl KeyStore for MemoryStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let req = ClaimRequest::new(id, fingerprint);
        self.apply(id, |found| Ok(machine::claim(found, req, now, policy)))
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.apply(id, |found| {
            Ok(machine::complete(found, token, outcome, now, policy)?)
        })
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.apply(id, |found| Ok(machine::release(found, token, now)))
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.apply(id, |found| Ok(machine::extend(found, token, lease, now)?))
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        let map = self.lock();
        Ok(map.get(id).filter(|r| !r.is_expired(now)).cloned())
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let map = self.lock();
        let mut stale: Vec<Record> = map
            .values()
            .filter(|r| r.is_stale_processing(older_than))
            .cloned()
            .collect();
        stale.sort_by(|a, b| {
            (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
        });
        stale.truncate(limit);
        Ok(stale)
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let map = self.lock();
        let mut found: Vec<Record> = map
            .values()
            .filter(|r| filter.matches(r, now))
            .cloned()
            .collect();
        ListFilter::order_and_truncate(&mut found, limit);
        Ok(found)
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut map = self.lock();
        let expired: Vec<_> = map
            .iter()
            .filter(|(_, r)| r.is_expired(now))
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect();
        for id in &expired {
            map.remove(id);
        }
        Ok(expired.len())
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        _timer: &Timer,
    ) -> Result<(), StoreError> {
        let id = seen.id();
        let mut waiter = self.waiters.register(id.clone());
        if changed(seen, self.get(&id, clock.now()).await?.as_ref()) {
            return Ok(());
        }
        waiter.woken().await;
        Ok(())
    }
}

#[async_trait]
impl CheckpointStore for MemoryStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        self.apply(id, |found| {
            Ok(machine::checkpoint(found, token, checkpoint, policy)?)
        })
    }
}
