//! [`ReplayCache`]: replays of completed records answered from this process's memory.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::machine::{
    self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use crate::store::{CheckpointStore, KeyStore, ListFilter, StoreError};
use crate::timer::Timer;
use crate::{Clock, Fingerprint, Outcome, Policy, Record, RecordId, RecordState, Timestamp, Token};

/// A store whose replays of completed records are answered from memory, without a round trip
/// ([contract §2](crate::contract#states): a `completed` record does not change until it expires).
///
/// Wraps any [`KeyStore`]. The first replay of a key that reaches the store reads the record
/// once more ([`KeyStore::get`]) and keeps it if it is `completed`; later claims of that key are
/// decided by the same rules ([`machine::claim`]) on the kept record: the same fingerprint gets
/// the outcome, another gets `FingerprintMismatch`, and once the record has expired the claim goes
/// to the store as any other. Everything else is the store's.
///
/// Bounded by entries and by outcome bytes (the oldest kept record goes first); clones share
/// one cache.
///
/// **Off unless you wrap a store in it**, because what it keeps is this process's: a record that
/// is deleted or rewritten by hand elsewhere (an operator's `idem keys delete`, a restore) is
/// still replayed here until it expires or is evicted. Records this handle purges leave the cache
/// with them. Use it where records are changed only through idem.
///
/// ```
/// use idem_core::{Executor, MemoryStore};
/// use idem_core::store::ReplayCache;
///
/// let store = ReplayCache::new(MemoryStore::new()).max_entries(10_000).max_bytes(64 << 20);
/// let executor = Executor::new(store);
/// # drop(executor);
/// ```
#[derive(Clone)]
pub struct ReplayCache<S> {
    store: S,
    kept: Arc<Mutex<Kept>>,
}

#[derive(Default)]
struct Kept {
    records: HashMap<RecordId, Record>,
    /// Records in the order they were kept: the front is evicted first.
    order: VecDeque<RecordId>,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl<S: KeyStore> ReplayCache<S> {
    /// Default bound on kept records.
    pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
    /// Default bound on the outcome bytes of kept records: 64 MiB.
    pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

    /// `store`, with replays of its completed records answered from memory.
    pub fn new(store: S) -> Self {
        Self {
            store,
            kept: Arc::new(Mutex::new(Kept {
                max_entries: Self::DEFAULT_MAX_ENTRIES,
                max_bytes: Self::DEFAULT_MAX_BYTES,
                ..Kept::default()
            })),
        }
    }

    /// Keeps at most `n` records (0 keeps none).
    pub fn max_entries(self, n: usize) -> Self {
        self.lock().max_entries = n;
        self
    }

    /// Keeps records whose outcomes total at most `bytes`.
    pub fn max_bytes(self, bytes: usize) -> Self {
        self.lock().max_bytes = bytes;
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        // Every change keeps the map, the order and the byte count consistent before it can panic.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Kept {
    fn insert(&mut self, record: Record) {
        let size = size_of(&record);
        if size > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let id = record.id();
        if let Some(old) = self.records.insert(id.clone(), record) {
            self.bytes -= size_of(&old);
        } else {
            self.order.push_back(id);
        }
        self.bytes += size;
        while self.records.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.records.remove(&oldest) {
                self.bytes -= size_of(&gone);
            }
        }
    }

    fn remove_expired(&mut self, now: Timestamp) {
        let records = &mut self.records;
        let mut freed = 0;
        records.retain(|_, r| {
            let keep = !r.is_expired(now);
            if !keep {
                freed += size_of(r);
            }
            keep
        });
        self.bytes -= freed;
        self.order.retain(|id| records.contains_key(id));
    }
}

fn size_of(record: &Record) -> usize {
    record.outcome.as_ref().map_or(0, Outcome::size)
}

impl<S> fmt::Debug for ReplayCache<S>
where
    S: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("ReplayCache")
            .field("store", &self.store)
            .field("kept", &kept.records.len())
            .field("bytes", &kept.bytes)
            .field("max_entries", &kept.max_entries)
            .field("max_bytes", &kept.max_bytes)
            .finish()
    }
}

// Every method is forwarded or decided here: none left to a default that would bypass the store.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: KeyStore> KeyStore for ReplayCache<S> {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        {
            let kept = self.lock();
            if let Some(record) = kept.records.get(id) {
                let req = ClaimRequest::new(id, fingerprint);
                let decided = machine::claim(Some(record), req, now, policy);
                if decided.write.is_none() {
                    return Ok(decided.answer);
                }
            }
        }
        let answer = self.store.claim(id, fingerprint, policy, now).await?;
        if matches!(answer, ClaimAnswer::Replay(_))
            && let Some(record) = self.store.get(id, now).await?
            && record.state == RecordState::Completed
        {
            self.lock().insert(record);
        }
        Ok(answer)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.store.complete(id, token, outcome, policy, now).await
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.store.release(id, token, now).await
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.store.extend(id, token, lease, now).await
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.store.get(id, now).await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.store.list_in_flight(older_than, limit).await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.store.list(filter, now, limit).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.lock().remove_expired(now);
        self.store.purge_expired(now, limit).await
    }

    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    // Checkpoints go to the wrapped store: the cache keeps only completed records, which have
    // none.
    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        self.store.as_checkpoint_store()
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        self.store.wait_for_change(seen, clock, timer).await
    }
}
