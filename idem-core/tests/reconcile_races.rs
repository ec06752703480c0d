//! The reconciler honours how its takeover claim was won (a record released, retried, expired or
//! purged meanwhile is skipped, unprobed, not left `processing`, and never written back past its
//! expiry), and one record's failure does not stop the pass. A `FaultStore` hook changes the record
//! at the worst moment: right after the reconciler lists it, or right after it reads it back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_conformance::kit::{FaultStore, Op};
use idem_core::machine::{ClaimAnswer, ReleaseAnswer};
use idem_core::reconcile::{Finding, Probe, Reconciler};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Outcome,
    Policy, Record, RecordId, RecordState, Scope, StoreError, Timestamp, Token, async_trait,
};
use serde_json::json;

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
    store: Arc<FaultStore<MemoryStore>>,
    clock: ManualClock,
    policy: Policy,
    probe: CountingProbe,
    scope: Scope,
    fp: Fingerprint,
}

fn world() -> World {
    World {
        store: Arc::new(FaultStore::new(MemoryStore::new())),
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
            .claim(
                &RecordId::new(self.scope.clone(), key.clone()),
                &self.fp,
                &self.policy,
                self.clock.now(),
            )
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        (key, token)
    }

    async fn record(&self, key: &IdempotencyKey) -> Option<Record> {
        self.store
            .inner()
            .get(
                &RecordId::new(self.scope.clone(), key.clone()),
                self.clock.now(),
            )
            .await
            .unwrap()
    }

    /// Right after the reconciler's next `op` (for a listing: right after it lists the record),
    /// the holder of `token` releases that record.
    fn release_after(&self, op: Op, token: Token) {
        let inner = self.store.inner();
        self.store.after_once(op, move |call| {
            let inner = inner.clone();
            async move {
                let id = RecordId::new(call.scope.unwrap(), call.key.unwrap());
                let record = inner
                    .get(&id, Timestamp::from_millis(0))
                    .await
                    .unwrap()
                    .unwrap();
                let answer = inner.release(&id, token, record.lease_until).await.unwrap();
                assert_eq!(answer, ReleaseAnswer::Released);
            }
        });
    }

    /// One reconciler pass over a single stale record that someone changed meanwhile: it is
    /// examined, skipped, not released and not probed.
    async fn pass_skips_it_unprobed(&self) {
        let report = self.reconciler().run_once().await.unwrap();
        assert_eq!(
            (report.examined, report.skipped, report.released),
            (1, 1, 0)
        );
        assert_eq!(self.probes(), 0, "not probed");
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
    w.release_after(Op::ListInFlight, token);
    w.pass_skips_it_unprobed().await;
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
    w.release_after(Op::Get, token);
    w.pass_skips_it_unprobed().await;
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
    // Everything expired by then is purged right after the reconciler's `get`.
    let inner = w.store.inner();
    w.store.after_once(Op::Get, move |_| {
        let inner = inner.clone();
        async move { assert!(inner.purge_expired(expired_at, 100).await.unwrap() > 0) }
    });
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
            .inner()
            .list_in_flight(w.clock.now() + Duration::from_secs(3000), 10)
            .await
            .unwrap()
            .is_empty()
    );
    // The purge's clock was ahead of the reconciler's (another host): the record the claim
    // created expires when the listed one did, not a whole ttl later.
    assert_eq!(r.expires_at, expired_at, "no longer than the listed record");
    w.clock.set(expired_at);
    assert_eq!(w.record(&key).await, None);
}

/// Model-check finding (docs/model-check.md): the reconciler reads a stale record back, then the
/// clock passes the record's expiry and purge deletes it before the takeover claim. The claim
/// must not write the dead operation back: afterwards the key is absent, and another request on
/// it runs (one effect at the sink), not `FingerprintMismatch`.
#[tokio::test]
async fn expired_and_purged_between_read_and_claim_is_not_written_back() {
    let w = world();
    let (key, _) = w.stale_claim("k-4").await;
    let expires_at = w.record(&key).await.unwrap().expires_at;
    w.clock.advance(Duration::from_secs(31));
    // Right after the reconciler's read: the clock moves past the expiry, and purge runs.
    let (inner, clock) = (w.store.inner(), w.clock.clone());
    w.store.after_once(Op::Get, move |_| {
        let (inner, clock) = (inner.clone(), clock.clone());
        async move {
            clock.set(expires_at + Duration::from_secs(1));
            assert_eq!(inner.purge_expired(clock.now(), 100).await.unwrap(), 1);
        }
    });
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!((report.examined, report.skipped), (1, 1), "{report:?}");
    assert_eq!(w.probes(), 0, "not probed");
    assert_eq!(w.record(&key).await, None, "nothing written back");
    assert_eq!(
        w.store
            .inner()
            .purge_expired(w.clock.now(), 100)
            .await
            .unwrap(),
        0
    );
    // Another request on the key runs, once.
    let effects = Arc::new(AtomicUsize::new(0));
    let counted = effects.clone();
    let other = Fingerprint::of("create_ticket", &json!({"title": "y"})).unwrap();
    let done = Executor::from_arc(w.store.clone())
        .with_policy(w.policy)
        .with_clock(w.clock.clone())
        .run(&w.scope, &key, &other, |_| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Outcome::definitive(201, &json!({"ticket": "T-9"})).unwrap()
        })
        .await
        .expect("another request runs, not FingerprintMismatch");
    assert!(!done.is_replay());
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one effect at the sink");
}

#[tokio::test]
async fn one_records_failure_is_reported_and_the_pass_goes_on() {
    let w = world();
    let (big, _) = w.stale_claim("happened-big").await;
    let (down, _) = w.stale_claim("happened-down").await;
    let (fine, _) = w.stale_claim("happened-fine").await;
    let (gone, _) = w.stale_claim("not-there").await;
    // `complete` of `down` fails as if the store were down.
    let failing = down.clone();
    w.store.before(Op::Complete, move |call| {
        let fail = call.key.as_ref() == Some(&failing);
        async move {
            if fail {
                return Err(StoreError::unavailable(
                    "test: store down",
                    std::io::Error::other("refused"),
                ));
            }
            Ok(())
        }
    });
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
