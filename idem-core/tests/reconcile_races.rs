//! The reconciler honours how its takeover claim was won (a record released, completed, retried,
//! expired or purged meanwhile is skipped, unprobed, not left `processing`, and never written
//! back past its expiry), shows its probe the steps saved up to the takeover, writes no finding
//! once its own claim was taken from it, and one record's failure does not stop the pass. A
//! `FaultStore` hook changes the record at the worst moment: right after the reconciler lists
//! it, right after it reads it back, or right before it writes its finding.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_conformance::kit::{FaultStore, Op};
use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::reconcile::{Finding, Probe, Reconciler};
use idem_core::{
    Checkpoint, Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore,
    Outcome, Policy, Record, RecordId, RecordState, Scope, StalePolicy, StoreError, Timestamp,
    Token, async_trait,
};
use serde_json::json;

/// A probe that counts its calls, keeps the name of the last step each record it was shown had
/// saved (`""` for none), and answers per key: `happened-big` with an outcome over the limit,
/// `happened-*` with a small one, anything else not found.
#[derive(Clone, Default)]
struct CountingProbe(Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>);

#[async_trait]
impl Probe for CountingProbe {
    async fn probe(&self, record: &Record) -> Finding {
        self.0.fetch_add(1, Ordering::SeqCst);
        let last = record.last_checkpoint().map_or("", |c| c.name());
        self.1.lock().unwrap().push(last.to_owned());
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

/// What a stale holder, waking up late, does to the record it still holds.
#[derive(Clone, Copy)]
enum Late {
    Releases,
    Completes,
    SavesAStep,
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
    /// the holder of `token`, late but still holding the record, does `late` to it.
    fn holder_after(&self, op: Op, token: Token, late: Late) {
        let (inner, policy) = (self.store.inner(), self.policy);
        self.store.after_once(op, move |call| {
            let inner = inner.clone();
            async move {
                let id = RecordId::new(call.scope.unwrap(), call.key.unwrap());
                let record = inner
                    .get(&id, Timestamp::from_millis(0))
                    .await
                    .unwrap()
                    .unwrap();
                let at = record.lease_until;
                match late {
                    Late::Releases => {
                        let answer = inner.release(&id, token, at).await.unwrap();
                        assert_eq!(answer, ReleaseAnswer::Released);
                    }
                    Late::Completes => {
                        let late = Outcome::definitive(201, &json!({"ticket": "T-late"})).unwrap();
                        let answer = inner.complete(&id, token, &late, &policy, at).await;
                        assert_eq!(answer.unwrap(), CompleteAnswer::Completed);
                    }
                    Late::SavesAStep => {
                        let step = Checkpoint::new("charged", r#"{"charge":"ch_1"}"#, at).unwrap();
                        let checkpoints = inner.as_checkpoint_store().unwrap();
                        checkpoints
                            .checkpoint(&id, token, &step, &policy)
                            .await
                            .unwrap();
                    }
                }
            }
        });
    }

    /// Right before the reconciler writes its finding (`op`: `Complete` or `Release`), its own
    /// lease runs out and another process takes the record over; answers that process's token.
    fn taken_over_before(&self, op: Op) -> Arc<Mutex<Option<Token>>> {
        let taken = Arc::new(Mutex::new(None));
        let (inner, clock, fp, taken_by) = (
            self.store.inner(),
            self.clock.clone(),
            self.fp.clone(),
            taken.clone(),
        );
        let takeover = self
            .policy
            .to_builder()
            .stale(StalePolicy::Takeover)
            .build()
            .unwrap();
        self.store.before(op, move |call| {
            let (inner, clock, fp, taken_by) =
                (inner.clone(), clock.clone(), fp.clone(), taken_by.clone());
            async move {
                clock.advance(Duration::from_secs(31));
                let id = RecordId::new(call.scope.unwrap(), call.key.unwrap());
                let answer = inner.claim(&id, &fp, &takeover, clock.now()).await.unwrap();
                let ClaimAnswer::Claimed { token, .. } = answer else {
                    panic!("the other process takes the record over: {answer:?}")
                };
                *taken_by.lock().unwrap() = Some(token);
                Ok(())
            }
        });
        taken
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
    w.holder_after(Op::ListInFlight, token, Late::Releases);
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
    w.holder_after(Op::Get, token, Late::Releases);
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
async fn completed_between_read_and_claim_is_skipped_unprobed_and_replayed() {
    let w = world();
    let (key, token) = w.stale_claim("k-5").await;
    w.clock.advance(Duration::from_secs(31));
    w.holder_after(Op::Get, token, Late::Completes);
    w.pass_skips_it_unprobed().await;
    let r = w.record(&key).await.unwrap();
    assert_eq!((r.state, r.token), (RecordState::Completed, token));
    assert_eq!(r.outcome.unwrap().body_json()["ticket"], "T-late");
    assert_eq!(
        w.retry_runs(&key).await,
        0,
        "the retry replays the holder's answer"
    );
}

/// A step the stale holder saves between the reconciler's read and its takeover is kept by the
/// takeover, and it is the step the probe is asked after (not the record as listed).
#[tokio::test]
async fn a_step_saved_between_read_and_claim_is_the_one_the_probe_sees() {
    let w = world();
    let (key, token) = w.stale_claim("k-6").await;
    w.clock.advance(Duration::from_secs(31));
    w.holder_after(Op::Get, token, Late::SavesAStep);
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!((report.examined, report.released), (1, 1));
    assert_eq!(*w.probe.1.lock().unwrap(), ["charged"]);
    let r = w.record(&key).await.unwrap();
    assert_eq!(r.state, RecordState::FailedRetryable);
    assert_eq!(
        r.last_checkpoint().unwrap().name(),
        "charged",
        "kept for the retry"
    );
}

/// The reconciler's finding, written after its own lease ran out and another process took the
/// record over, is fenced: the record stays with that process, and the pass counts it skipped,
/// neither completed nor released.
#[tokio::test]
async fn a_finding_written_after_the_reconcilers_claim_was_taken_is_fenced_and_skipped() {
    for (key, write) in [("happened-1", Op::Complete), ("k-7", Op::Release)] {
        let w = world();
        let (key, _) = w.stale_claim(key).await;
        w.clock.advance(Duration::from_secs(31));
        let taken = w.taken_over_before(write);
        let report = w.reconciler().run_once().await.unwrap();
        assert_eq!(
            (
                report.examined,
                report.skipped,
                report.completed,
                report.released
            ),
            (1, 1, 0, 0),
            "{key}"
        );
        assert_eq!(w.probes(), 1, "probed, then fenced");
        let r = w.record(&key).await.unwrap();
        assert_eq!(
            (r.state, Some(r.token)),
            (RecordState::Processing, *taken.lock().unwrap()),
            "left to the process that took it over"
        );
    }
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
