//! Deliberately broken stores, one per class of defect, shared by the test binaries that prove
//! the suite (and the model-based test) can fail.
//!
//! Each store is [`idem_core::machine`] over a map, like `MemoryStore`, with exactly one flaw
//! that users really write. [`factory`] makes a suite factory for one [`Defect`]; [`ALL`] lists
//! every defect.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::CheckpointStore;
use idem_core::{
    Checkpoint, Clock, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, RecordState,
    StoreError, Timer, Timestamp, Token, async_trait,
};

/// How a record is addressed in the map: a pair of strings the defect may have mangled.
type Address = (String, String);
type Map = Arc<Mutex<HashMap<Address, Record>>>;

/// How each store is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Defect {
    /// Every claim reads, awaits, then writes: not atomic even for an absent key.
    ReadThenWriteClaim,
    /// A claim is atomic for an absent key (an `INSERT … ON CONFLICT DO NOTHING`), but rewrites
    /// an existing record (expired, `failed_retryable`, stale under takeover) by read, await,
    /// then write: N retries of a `failed_retryable` record all win.
    ReadThenWriteRewrite,
    /// A claim is atomic for an absent key, but rewrites an existing record by read, await, then
    /// a compare-and-set on token, state, lease and expiry that writes back the checkpoints it
    /// read: a checkpoint the holder saves in between changes none of those, and is lost.
    RewriteWritesStaleCheckpoints,
    /// A claim is atomic for an absent key, but rewrites an existing record by read, await, then
    /// a compare-and-set on the token only: the holder's completion, release or extension in
    /// between keeps the token, and is overwritten.
    RewriteComparesTokenOnly,
    /// complete / release / extend write to any live record, whatever its token or state (an
    /// `UPDATE … WHERE scope = ? AND key = ?` without the fencing condition).
    NoFencing,
    /// complete / release / extend refuse a holder whose lease has elapsed although nobody took
    /// over (a fenced `UPDATE … AND lease_until > now`).
    LeaseEndsHolder,
    /// Records never expire.
    ExpiryIgnored,
    /// Records addressed case-insensitively (a lower-cased map key, a case-insensitive
    /// collation).
    CaseInsensitiveAddress,
    /// Records addressed by `scope + ":" + key`, so a separator can move between the two.
    ConcatenatedAddress,
    /// Records addressed by the key without its spaces (a key column or name that drops or
    /// collapses white space), so a derived key meets the sent key it spells.
    SpacesDroppedAddress,
    /// `purge_expired` deletes the rows but reports one fewer than it deleted.
    PurgeMiscount,
    /// `extend` sets the lease to `now + lease` whatever it was, zero included (it may shorten it).
    ExtendSetsTheLease,
    /// `extend` answers `Extended` with the new deadline but writes nothing (an `UPDATE` whose
    /// row count is not checked and whose answer is computed, not read back).
    ExtendForgets,
    /// `checkpoint` appends to any live record, whatever its token or state (an
    /// `UPDATE … SET checkpoints = … WHERE scope = ? AND key = ?` without the fencing condition).
    CheckpointUnfenced,
    /// `wait_for_change` subscribes to a notifier that never fires and does not poll.
    NeverWakes,
}

/// Every defect.
pub const ALL: &[Defect] = &[
    Defect::ReadThenWriteClaim,
    Defect::ReadThenWriteRewrite,
    Defect::RewriteWritesStaleCheckpoints,
    Defect::RewriteComparesTokenOnly,
    Defect::NoFencing,
    Defect::LeaseEndsHolder,
    Defect::ExpiryIgnored,
    Defect::CaseInsensitiveAddress,
    Defect::ConcatenatedAddress,
    Defect::SpacesDroppedAddress,
    Defect::PurgeMiscount,
    Defect::ExtendSetsTheLease,
    Defect::ExtendForgets,
    Defect::CheckpointUnfenced,
    Defect::NeverWakes,
];

/// A suite factory for a store with `defect`: every call returns a new handle to the same
/// records.
pub fn factory(defect: Defect) -> impl Fn() -> std::future::Ready<Broken> + Send + Sync + 'static {
    let map: Map = Default::default();
    move || {
        std::future::ready(Broken {
            defect,
            map: map.clone(),
        })
    }
}

/// A store with one [`Defect`]. Clones share the same records.
#[derive(Debug, Clone)]
pub struct Broken {
    defect: Defect,
    map: Map,
}

/// What a read-then-write store awaits between its read and its write (a round trip).
const ROUND_TRIP: Duration = Duration::from_millis(2);

impl Broken {
    /// The defect of this store.
    pub fn defect(&self) -> Defect {
        self.defect
    }

    fn address(&self, id: &RecordId) -> Address {
        let (scope, key) = (id.scope(), id.key());
        match self.defect {
            Defect::CaseInsensitiveAddress => (
                scope.as_str().to_lowercase(),
                key.as_str().to_ascii_lowercase(),
            ),
            Defect::ConcatenatedAddress => (
                format!("{}:{}", scope.as_str(), key.as_str()),
                String::new(),
            ),
            Defect::SpacesDroppedAddress => {
                (scope.as_str().to_owned(), key.as_str().replace(' ', ""))
            }
            _ => (scope.as_str().to_owned(), key.as_str().to_owned()),
        }
    }

    fn found(&self, id: &RecordId) -> Option<Record> {
        self.map.lock().unwrap().get(&self.address(id)).cloned()
    }

    fn stored(&self, mut record: Record) -> Record {
        if self.defect == Defect::ExpiryIgnored {
            record.expires_at = Timestamp::from_millis(u64::MAX);
        }
        record
    }

    fn write(&self, id: &RecordId, record: Record) {
        let record = self.stored(record);
        self.map.lock().unwrap().insert(self.address(id), record);
    }

    /// The record the holder rules are shown: as stored; or (no fencing) one the caller seems
    /// to hold; or (lease ends holder) none once the lease has elapsed.
    fn for_holder(&self, found: Option<Record>, token: Token, now: Timestamp) -> Option<Record> {
        match (self.defect, found) {
            (Defect::NoFencing, Some(r)) => Some(Record {
                token,
                state: RecordState::Processing,
                ..r
            }),
            (Defect::LeaseEndsHolder, Some(r)) if r.lease_elapsed(now) => None,
            (_, found) => found,
        }
    }

    /// An atomic claim: decide and write under one lock.
    fn claim_atomic(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> ClaimAnswer {
        let mut map = self.map.lock().unwrap();
        let address = self.address(id);
        let t = machine::claim(
            map.get(&address),
            ClaimRequest::new(id, fingerprint),
            now,
            policy,
        );
        if let Some(w) = t.write {
            map.insert(address, self.stored(w));
        }
        t.answer
    }
}

impl Broken {
    /// A claim that rewrites an existing record by read, await, then a compare-and-set that
    /// compares too little (see the defects), reading again when the record changed.
    async fn claim_compare_and_set(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> ClaimAnswer {
        loop {
            let Some(found) = self.found(id) else {
                return self.claim_atomic(id, fingerprint, policy, now);
            };
            let req = ClaimRequest::new(id, fingerprint);
            let t = machine::claim(Some(&found), req, now, policy);
            let Some(write) = t.write else {
                return t.answer;
            };
            tokio::time::sleep(ROUND_TRIP).await;
            if self.replace_if_unchanged(id, &found, write) {
                return t.answer;
            }
        }
    }

    /// Writes `record` if the stored record still matches `found` in what the defect compares.
    fn replace_if_unchanged(&self, id: &RecordId, found: &Record, record: Record) -> bool {
        let mut map = self.map.lock().unwrap();
        let id = self.address(id);
        let unchanged = map.get(&id).is_some_and(|now| {
            now.token == found.token
                && (self.defect == Defect::RewriteComparesTokenOnly
                    || (now.state, now.lease_until, now.expires_at)
                        == (found.state, found.lease_until, found.expires_at))
        });
        if unchanged {
            map.insert(id, self.stored(record));
        }
        unchanged
    }
}

#[async_trait]
impl KeyStore for Broken {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        match self.defect {
            Defect::ReadThenWriteClaim => {}
            Defect::ReadThenWriteRewrite if self.found(id).is_some() => {}
            Defect::RewriteWritesStaleCheckpoints | Defect::RewriteComparesTokenOnly => {
                return Ok(self
                    .claim_compare_and_set(id, fingerprint, policy, now)
                    .await);
            }
            // Atomic for an absent key: the insert-if-absent runs under the lock.
            _ => return Ok(self.claim_atomic(id, fingerprint, policy, now)),
        }
        let found = self.found(id);
        // The defect: another caller can read the same record while this one waits.
        tokio::time::sleep(ROUND_TRIP).await;
        let t = machine::claim(
            found.as_ref(),
            ClaimRequest::new(id, fingerprint),
            now,
            policy,
        );
        if let Some(w) = t.write {
            self.write(id, w);
        }
        Ok(t.answer)
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        let found = self.for_holder(self.found(id), token, now);
        let t = machine::complete(found.as_ref(), token, outcome, now, policy)?;
        if let Some(w) = t.write {
            self.write(id, w);
        }
        Ok(t.answer)
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let found = self.for_holder(self.found(id), token, now);
        let t = machine::release(found.as_ref(), token, now);
        if let Some(w) = t.write {
            self.write(id, w);
        }
        Ok(t.answer)
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        let found = self.for_holder(self.found(id), token, now);
        if self.defect == Defect::ExtendSetsTheLease {
            let held = found.filter(|r| {
                r.token == token && r.state == RecordState::Processing && !r.is_expired(now)
            });
            let Some(mut r) = held else {
                return Ok(ExtendAnswer::Fenced);
            };
            r.lease_until = now + lease;
            r.updated_at = now;
            let lease_until = r.lease_until;
            self.write(id, r);
            return Ok(ExtendAnswer::Extended { lease_until });
        }
        let t = machine::extend(found.as_ref(), token, lease, now)?;
        if self.defect == Defect::ExtendForgets {
            return Ok(t.answer);
        }
        if let Some(w) = t.write {
            self.write(id, w);
        }
        Ok(t.answer)
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        Ok(self.found(id).filter(|r| !r.is_expired(now)))
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let records: Vec<Record> = self.map.lock().unwrap().values().cloned().collect();
        let mut stale: Vec<Record> = records
            .into_iter()
            .filter(|r| r.is_stale_processing(older_than))
            .collect();
        stale.sort_by_key(|r| r.lease_until);
        stale.truncate(limit);
        Ok(stale)
    }

    async fn list(
        &self,
        filter: &idem_core::store::ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut found: Vec<Record> = self
            .map
            .lock()
            .unwrap()
            .values()
            .filter(|r| filter.matches(r, now))
            .cloned()
            .collect();
        idem_core::store::ListFilter::order_and_truncate(&mut found, limit);
        Ok(found)
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut map = self.map.lock().unwrap();
        let ids: Vec<_> = map
            .iter()
            .filter(|(_, r)| r.is_expired(now))
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect();
        for id in &ids {
            map.remove(id);
        }
        if self.defect == Defect::PurgeMiscount {
            return Ok(ids.len().saturating_sub(1));
        }
        Ok(ids.len())
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        if self.defect == Defect::NeverWakes {
            return std::future::pending().await;
        }
        idem_core::wait::poll_for_change(self, seen, clock, timer).await
    }
}

#[async_trait]
impl CheckpointStore for Broken {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        let now = checkpoint.saved_at();
        let found = self.found(id);
        if self.defect == Defect::CheckpointUnfenced {
            let Some(mut r) = found.filter(|r| !r.is_expired(now)) else {
                return Ok(CheckpointAnswer::Fenced);
            };
            r.checkpoints.push(checkpoint.clone());
            r.updated_at = now;
            self.write(id, r);
            return Ok(CheckpointAnswer::Saved);
        }
        let found = self.for_holder(found, token, now);
        let t = machine::checkpoint(found.as_ref(), token, checkpoint, policy)?;
        if let Some(w) = t.write {
            self.write(id, w);
        }
        Ok(t.answer)
    }
}

/// A case every defect passes: a failure of the cases in [`caught_by`] is the defect's, not a
/// store that cannot work at all.
pub const BASIC_CASE: &str = "claim_absent_key_is_claimed_as_attempt_one";

/// The suite's cases meant to catch `defect`: each must fail against its store.
pub fn caught_by(defect: Defect) -> &'static [&'static str] {
    match defect {
        Defect::ReadThenWriteClaim => &[
            "concurrency_64_claims_one_key_one_winner",
            "concurrency_200_keys_one_winner_each",
            "concurrency_executor_runs_once",
            "concurrency_claims_race_on_an_expired_record",
            "concurrency_claims_race_on_a_failed_retryable_record",
            "concurrency_claims_race_on_a_stale_record_under_takeover",
            "concurrency_claims_racing_a_release_one_winner",
            "concurrency_executor_retry_runs_once",
        ],
        Defect::ReadThenWriteRewrite => &[
            "concurrency_claims_race_on_an_expired_record",
            "concurrency_claims_race_on_a_failed_retryable_record",
            "concurrency_claims_race_on_a_stale_record_under_takeover",
            "concurrency_claims_racing_a_release_one_winner",
            "concurrency_executor_retry_runs_once",
        ],
        Defect::RewriteWritesStaleCheckpoints => &[
            "checkpoint_kept_by_a_racing_takeover",
            "checkpoint_kept_by_a_racing_reconciler_takeover",
        ],
        Defect::RewriteComparesTokenOnly => &[
            "concurrency_takeover_racing_the_holders_completion",
            "concurrency_takeover_racing_the_holders_release",
            "concurrency_takeover_racing_the_holders_extension",
        ],
        Defect::NoFencing => &[
            "fencing_second_complete_is_fenced",
            "fencing_stale_token_cannot_complete_after_takeover",
            "fencing_stale_token_cannot_release",
            "fencing_stale_token_cannot_extend",
            "expiry_tokens_never_reused_after_purge",
            "executor_fenced_holder_cannot_overwrite",
        ],
        Defect::LeaseEndsHolder => &[
            "fencing_holder_completes_after_its_lease_elapsed",
            "fencing_holder_releases_after_its_lease_elapsed",
            "fencing_holder_extends_after_its_lease_elapsed",
            "executor_slow_holder_past_its_lease_is_recorded",
        ],
        Defect::ExpiryIgnored => &[
            "expiry_expired_record_is_absent_to_get",
            "expiry_boundary_is_exact",
            "expiry_expired_completed_is_claimed_again",
            "expiry_holder_cannot_act_after_expiry",
            "expiry_purge_deletes_in_batches_and_keeps_live",
            "expiry_purge_returns_exactly_what_it_deleted",
            "executor_expired_record_runs_once_more",
        ],
        Defect::CaseInsensitiveAddress => &["scope_case_is_significant"],
        Defect::ConcatenatedAddress => &["scope_separator_position_is_significant"],
        Defect::SpacesDroppedAddress => &["scope_derived_keys_are_stored_as_they_are"],
        Defect::PurgeMiscount => &["expiry_purge_returns_exactly_what_it_deleted"],
        Defect::ExtendSetsTheLease => &[
            "fencing_extend_never_shortens",
            "fencing_extend_refuses_a_zero_lease",
        ],
        Defect::ExtendForgets => &["heartbeat_keeps_a_holder_twice_its_lease"],
        Defect::CheckpointUnfenced => &[
            "checkpoint_stale_holder_is_fenced_after_takeover",
            "checkpoint_fenced_like_complete",
        ],
        Defect::NeverWakes => &[
            "wait_wakes_on_completion",
            "wait_wakes_on_release",
            "wait_wakes_on_takeover",
        ],
    }
}
