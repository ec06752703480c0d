//! The reconciler honours how its takeover claim was won (a record released, retried, expired or
//! purged meanwhile is skipped, unprobed, and not left `processing`), and one record's failure
//! does not stop the pass. A store wrapper changes the record at the worst moment: right after
//! the reconciler lists it, or right after it reads it back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{
    Clock, Executor, Finding, Fingerprint, IdempotencyKey, KeyStore, ListFilter, ManualClock,
    MemoryStore, Outcome, Policy, Probe, Reconciler, Record, RecordState, Scope, StoreError,
    Timestamp, Token, async_trait,
};
use serde_json::json;

/// What the wrapper does to the record, and when.
#[derive(Debug, Clone, Copy)]
enum Meddle {
    /// The holder releases its claim right after `list_in_flight`.
    ReleaseAfterList(Token),
    /// The holder releases its claim right after the reconciler's `get`.
    ReleaseAfterGet(Token),
    /// Everything expired by then is purged right after the reconciler's `get`.
    PurgeAfterGet(Timestamp),
}

#[derive(Debug, Default)]
struct Meddler {
    inner: MemoryStore,
    meddle: Mutex<Option<Meddle>>,
    /// `complete` of this key fails as if the store were down.
    fail_complete: Mutex<Option<IdempotencyKey>>,
}

impl Meddler {
    async fn meddle(&self, scope: &Scope, key: &IdempotencyKey, after_get: bool) {
        let action = *self.meddle.lock().unwrap();
        match action {
            Some(Meddle::ReleaseAfterList(token)) if !after_get => {
                self.release_at(scope, key, token).await;
            }
            Some(Meddle::ReleaseAfterGet(token)) if after_get => {
                self.release_at(scope, key, token).await;
            }
            Some(Meddle::PurgeAfterGet(at)) if after_get => {
                assert!(self.inner.purge_expired(at, 100).await.unwrap() > 0);
            }
            _ => return,
        }
        *self.meddle.lock().unwrap() = None;
    }

    async fn release_at(&self, scope: &Scope, key: &IdempotencyKey, token: Token) {
        let record = self
            .inner
            .get(scope, key, Timestamp::from_millis(0))
            .await
            .unwrap()
            .unwrap();
        let answer = self
            .inner
            .release(scope, key, token, record.lease_until)
            .await
            .unwrap();
        assert_eq!(answer, ReleaseAnswer::Released);
    }
}

#[async_trait]
impl KeyStore for Meddler {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.inner.claim(scope, key, fingerprint, policy, now).await
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
        if self.fail_complete.lock().unwrap().as_ref() == Some(key) {
            return Err(StoreError::unavailable(
                "test: store down",
                std::io::Error::other("refused"),
            ));
        }
        self.inner
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
        self.inner.release(scope, key, token, now).await
    }
    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.inner.extend(scope, key, token, lease, now).await
    }
    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        let found = self.inner.get(scope, key, now).await;
        self.meddle(scope, key, true).await;
        found
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let listed = self.inner.list_in_flight(older_than, limit).await?;
        for r in &listed {
            self.meddle(&r.scope, &r.key, false).await;
        }
        Ok(listed)
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list(filter, now, limit).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
}

/// A probe that counts its calls and answers per key: `happened-big` with an outcome over the
/// limit, `happened-*` with a small one, anything else not found.
#[derive(Clone, Default)]
struct CountingProbe(Arc<AtomicUsize>);

#[async_trait]
impl Probe for CountingProbe {
    async fn probe(&self, record: &Record) -> Finding {
        self.0.fetch_add(1, Ordering::SeqCst);
        match record.key.as_str() {
            "happened-big" => {
                Finding::Happened(Outcome::definitive(201, &"x".repeat(4096)).unwrap())
            }
            k if k.starts_with("happened") => {
                Finding::Happened(Outcome::definitive(201, &json!({"ticket": k})).unwrap())
            }
            _ => Finding::NotHappened,
        }
    }
}

struct World {
    store: Arc<Meddler>,
    clock: ManualClock,
    policy: Policy,
    probe: CountingProbe,
    scope: Scope,
    fp: Fingerprint,
}

fn world() -> World {
    World {
        store: Arc::new(Meddler::default()),
        clock: ManualClock::new(Timestamp::from_millis(1_700_000_000_000)),
        policy: Policy::builder()
            .lease(Duration::from_secs(30))
            .ttl(Duration::from_secs(3600))
            .max_outcome_bytes(1024)
            .build()
            .unwrap(),
        probe: CountingProbe::default(),
        scope: Scope::new("tenant/create_ticket").unwrap(),
        fp: Fingerprint::of("create_ticket", &json!({"title": "x"})).unwrap(),
    }
}

impl World {
    fn reconciler(&self) -> Reconciler<CountingProbe> {
        Reconciler::new(
            self.store.clone(),
            Arc::new(self.clock.clone()),
            self.policy,
            self.probe.clone(),
        )
    }

    /// A holder claims `key` and goes silent; the clock moves past its lease.
    async fn stale_claim(&self, key: &str) -> (IdempotencyKey, Token) {
        let key = IdempotencyKey::new(key).unwrap();
        let ClaimAnswer::Claimed { token, .. } = self
            .store
            .claim(&self.scope, &key, &self.fp, &self.policy, self.clock.now())
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        (key, token)
    }

    async fn record(&self, key: &IdempotencyKey) -> Option<Record> {
        self.store
            .inner
            .get(&self.scope, key, self.clock.now())
            .await
            .unwrap()
    }

    fn probes(&self) -> usize {
        self.probe.0.load(Ordering::SeqCst)
    }

    /// A retry through the executor, counting its effect.
    async fn retry_runs(&self, key: &IdempotencyKey) -> usize {
        let effects = Arc::new(AtomicUsize::new(0));
        let counted = effects.clone();
        Executor::from_arc(self.store.clone())
            .with_policy(self.policy)
            .with_clock(self.clock.clone())
            .run(&self.scope, key, &self.fp, |_| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Outcome::definitive(201, &json!({"ticket": "T-2"})).unwrap()
            })
            .await
            .unwrap();
        effects.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn released_after_listing_is_skipped_without_a_write() {
    let w = world();
    let (key, token) = w.stale_claim("k-1").await;
    w.clock.advance(Duration::from_secs(31));
    *w.store.meddle.lock().unwrap() = Some(Meddle::ReleaseAfterList(token));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(
        (report.examined, report.skipped, report.released),
        (1, 1, 0)
    );
    assert_eq!(w.probes(), 0, "not probed");
    let r = w.record(&key).await.unwrap();
    assert_eq!(
        (r.state, r.token, r.attempt),
        (RecordState::FailedRetryable, token, 1),
        "untouched"
    );
    assert_eq!(w.retry_runs(&key).await, 1);
}

#[tokio::test]
async fn released_between_read_and_claim_is_given_back_unprobed() {
    let w = world();
    let (key, token) = w.stale_claim("k-2").await;
    w.clock.advance(Duration::from_secs(31));
    *w.store.meddle.lock().unwrap() = Some(Meddle::ReleaseAfterGet(token));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(
        (report.examined, report.skipped, report.released),
        (1, 1, 0)
    );
    assert_eq!(w.probes(), 0, "not probed");
    let r = w.record(&key).await.unwrap();
    assert_eq!(
        r.state,
        RecordState::FailedRetryable,
        "not left processing: {r:?}"
    );
    assert_eq!(r.fingerprint, w.fp);
    assert_eq!(w.retry_runs(&key).await, 1, "the next retry runs it, once");
}

#[tokio::test]
async fn purged_between_read_and_claim_is_not_left_processing() {
    let w = world();
    let (key, _) = w.stale_claim("k-3").await;
    let expired_at = w.record(&key).await.unwrap().expires_at;
    w.clock.advance(Duration::from_secs(31));
    *w.store.meddle.lock().unwrap() = Some(Meddle::PurgeAfterGet(expired_at));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!((report.examined, report.skipped), (1, 1));
    assert_eq!(w.probes(), 0, "not probed");
    let r = w.record(&key).await.unwrap();
    assert_ne!(
        r.state,
        RecordState::Processing,
        "a claim nobody holds: {r:?}"
    );
    assert!(
        w.store
            .inner
            .list_in_flight(w.clock.now() + Duration::from_secs(3000), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn one_records_failure_is_reported_and_the_pass_goes_on() {
    let w = world();
    let (big, _) = w.stale_claim("happened-big").await;
    let (down, _) = w.stale_claim("happened-down").await;
    let (fine, _) = w.stale_claim("happened-fine").await;
    let (gone, _) = w.stale_claim("not-there").await;
    *w.store.fail_complete.lock().unwrap() = Some(down.clone());
    w.clock.advance(Duration::from_secs(31));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(report.examined, 4);
    assert_eq!(
        (report.completed, report.outcome_not_kept, report.released),
        (2, 1, 1)
    );
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].record.key, down);
    assert!(report.failed[0].error.is_unavailable());
    assert_eq!(w.probes(), 4, "every record was probed");
    // The outcome too large to keep: completed as "ran, not kept", a final answer.
    let r = w.record(&big).await.unwrap();
    assert_eq!(r.state, RecordState::Completed);
    assert!(r.outcome.unwrap().is_not_kept());
    assert_eq!(w.record(&fine).await.unwrap().state, RecordState::Completed);
    assert_eq!(
        w.record(&gone).await.unwrap().state,
        RecordState::FailedRetryable
    );
    assert_eq!(
        w.record(&down).await.unwrap().state,
        RecordState::Processing,
        "left for the next pass"
    );
}
