//! A suite that cannot fail proves nothing: deliberately broken stores, each shown to fail
//! the cases meant to catch it (and to pass a basic case, so the failure is the defect's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_conformance::{Report, run_matching};
use idem_core::machine::{
    self, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, Record, Scope, StoreError, Timestamp,
    Token, async_trait,
};

type Map = Arc<Mutex<HashMap<(Scope, IdempotencyKey), Record>>>;

/// How each store is broken.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Defect {
    /// Claim reads, awaits, then writes: not atomic.
    ReadThenWriteClaim,
    /// complete / release / extend write to any live record, whatever its token or state (an
    /// `UPDATE … WHERE scope = ? AND key = ?` without the fencing condition).
    NoFencing,
    /// Records never expire.
    ExpiryIgnored,
    /// `extend` sets the lease to `now + lease` whatever it was, zero included (it may shorten it).
    ExtendSetsTheLease,
}

#[derive(Debug, Clone)]
struct Broken {
    defect: Defect,
    map: Map,
}

impl Broken {
    fn factory(defect: Defect) -> impl Fn() -> std::future::Ready<Broken> + Send + Sync + 'static {
        let map: Map = Default::default();
        move || {
            std::future::ready(Broken {
                defect,
                map: map.clone(),
            })
        }
    }

    fn id(scope: &Scope, key: &IdempotencyKey) -> (Scope, IdempotencyKey) {
        (scope.clone(), key.clone())
    }

    fn found(&self, scope: &Scope, key: &IdempotencyKey) -> Option<Record> {
        self.map.lock().unwrap().get(&Self::id(scope, key)).cloned()
    }

    fn write(&self, mut record: Record) {
        if self.defect == Defect::ExpiryIgnored {
            record.expires_at = Timestamp::from_millis(u64::MAX);
        }
        self.map
            .lock()
            .unwrap()
            .insert(Self::id(&record.scope, &record.key), record);
    }

    /// The record the rules are shown: as stored, or (no fencing) one the caller seems to hold.
    fn unfenced(&self, found: Option<Record>, token: Token) -> Option<Record> {
        match (self.defect, found) {
            (Defect::NoFencing, Some(r)) => Some(Record {
                token,
                state: idem_core::RecordState::Processing,
                ..r
            }),
            (_, found) => found,
        }
    }
}

#[async_trait]
impl KeyStore for Broken {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        if self.defect != Defect::ReadThenWriteClaim {
            // Atomic: decide and write under one lock.
            let mut map = self.map.lock().unwrap();
            let id = Self::id(scope, key);
            let t = machine::claim(
                map.get(&id),
                ClaimRequest::new(scope, key, fingerprint),
                now,
                policy,
            );
            if let Some(mut w) = t.write {
                if self.defect == Defect::ExpiryIgnored {
                    w.expires_at = Timestamp::from_millis(u64::MAX);
                }
                map.insert(id, w);
            }
            return Ok(t.answer);
        }
        let found = self.found(scope, key);
        // The defect: another caller can read the same "absent" while this one waits.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let t = machine::claim(
            found.as_ref(),
            ClaimRequest::new(scope, key, fingerprint),
            now,
            policy,
        );
        if let Some(w) = t.write {
            self.write(w);
        }
        Ok(t.answer)
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
        let found = self.unfenced(self.found(scope, key), token);
        let t = machine::complete(found.as_ref(), token, outcome, now, policy)?;
        if let Some(w) = t.write {
            self.write(w);
        }
        Ok(t.answer)
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let found = self.unfenced(self.found(scope, key), token);
        let t = machine::release(found.as_ref(), token, now);
        if let Some(w) = t.write {
            self.write(w);
        }
        Ok(t.answer)
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        let found = self.unfenced(self.found(scope, key), token);
        if self.defect == Defect::ExtendSetsTheLease {
            let held = found.filter(|r| {
                r.token == token
                    && r.state == idem_core::RecordState::Processing
                    && !r.is_expired(now)
            });
            let Some(mut r) = held else {
                return Ok(ExtendAnswer::Fenced);
            };
            r.lease_until = now + lease;
            r.updated_at = now;
            let lease_until = r.lease_until;
            self.write(r);
            return Ok(ExtendAnswer::Extended { lease_until });
        }
        let t = machine::extend(found.as_ref(), token, lease, now)?;
        if let Some(w) = t.write {
            self.write(w);
        }
        Ok(t.answer)
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        Ok(self.found(scope, key).filter(|r| !r.is_expired(now)))
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
        filter: &idem_core::ListFilter,
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
        idem_core::ListFilter::order_and_truncate(&mut found, limit);
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
        Ok(ids.len())
    }
}

fn check(defect: Defect, must_fail: &[&str]) -> Report {
    let names: Vec<String> = must_fail.iter().map(|s| s.to_string()).collect();
    let report = run_matching(Broken::factory(defect), |name| {
        names.iter().any(|n| n == name) || name == "claim_absent_key_is_claimed_as_attempt_one"
    });
    for case in must_fail {
        assert!(
            report.failed(case),
            "{defect:?}: case {case} should fail but passed\n{report}"
        );
    }
    assert!(
        !report.failed("claim_absent_key_is_claimed_as_attempt_one"),
        "{defect:?} is otherwise a working store\n{report}"
    );
    report
}

#[test]
fn read_then_write_claim_fails_the_concurrency_cases() {
    check(
        Defect::ReadThenWriteClaim,
        &[
            "concurrency_64_claims_one_key_one_winner",
            "concurrency_200_keys_one_winner_each",
            "concurrency_executor_runs_once",
        ],
    );
}

#[test]
fn missing_fencing_fails_the_fencing_cases() {
    check(
        Defect::NoFencing,
        &[
            "fencing_second_complete_is_fenced",
            "fencing_stale_token_cannot_complete_after_takeover",
            "fencing_stale_token_cannot_release",
            "fencing_stale_token_cannot_extend",
            "expiry_tokens_never_reused_after_purge",
            "executor_fenced_holder_cannot_overwrite",
        ],
    );
}

#[test]
fn ignored_expiry_fails_the_expiry_cases() {
    check(
        Defect::ExpiryIgnored,
        &[
            "expiry_expired_record_is_absent_to_get",
            "expiry_boundary_is_exact",
            "expiry_expired_completed_is_claimed_again",
            "expiry_holder_cannot_act_after_expiry",
            "expiry_purge_deletes_in_batches_and_keeps_live",
            "executor_expired_record_runs_once_more",
        ],
    );
}

#[test]
fn an_extend_that_sets_the_lease_fails_the_extend_cases() {
    check(
        Defect::ExtendSetsTheLease,
        &[
            "fencing_extend_never_shortens",
            "fencing_extend_refuses_a_zero_lease",
        ],
    );
}
