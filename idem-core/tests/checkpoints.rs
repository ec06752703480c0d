//! Checkpoints through the executor ([contract §6.1](idem_core::contract#checkpoints)): a resumed
//! attempt starts with the steps earlier attempts saved (after a retryable outcome, a release and
//! a takeover), a stale holder's checkpoint is fenced and writes nothing, completion ends them,
//! the codec encodes them, the size limit refuses before anything is written, and a store
//! without checkpoints says so; the steps are read back only where there can be some. Effects
//! are counted at a sink.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::codec::{AesGcmCodec, sealed_info};
use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::store::ListFilter;
use idem_core::{
    CheckpointError, Clock, Error, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock,
    MemoryStore, OperationError, Outcome, OutcomeClass, Policy, RecordId, RecordState, Scope,
    StalePolicy, StoreError, Timestamp, Token, async_trait,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(30);

struct World {
    store: MemoryStore,
    clock: ManualClock,
    executor: Executor,
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    /// Effects at their sinks.
    charges: Arc<AtomicUsize>,
    emails: Arc<AtomicUsize>,
}

fn world(stale: StalePolicy) -> World {
    let store = MemoryStore::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let policy = Policy::builder().lease(LEASE).stale(stale).build().unwrap();
    World {
        executor: Executor::new(store.clone())
            .with_clock(clock.clone())
            .with_policy(policy),
        store,
        clock,
        scope: Scope::new("shop/checkout").unwrap(),
        key: IdempotencyKey::new("order-7").unwrap(),
        fp: Fingerprint::of("checkout", &json!({"order": 7})).unwrap(),
        charges: Arc::default(),
        emails: Arc::default(),
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
}

impl World {
    /// Charges (unless a checkpoint says it was done) and saves `charged`; then answers
    /// retryable if `email_fails`, else emails and answers definitive.
    async fn checkout(&self, email_fails: bool) -> Result<idem_core::Execution, Error> {
        let (charges, emails) = (self.charges.clone(), self.emails.clone());
        self.executor
            .run(&self.scope, &self.key, &self.fp, |attempt| async move {
                let charge = match attempt.checkpoint_value::<Charge>("charged").unwrap() {
                    Some(charge) => charge,
                    None => {
                        let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                        let charge = Charge {
                            id: format!("ch_{n}"),
                        };
                        attempt.checkpoint("charged", &charge).await.unwrap();
                        charge
                    }
                };
                if email_fails {
                    return Outcome::retryable(503, &json!({"error": "smtp down"})).unwrap();
                }
                emails.fetch_add(1, Ordering::SeqCst);
                Outcome::definitive(200, &json!({"charge": charge.id})).unwrap()
            })
            .await
    }

    async fn record(&self) -> idem_core::Record {
        self.store
            .get(
                &RecordId::new(self.scope.clone(), self.key.clone()),
                self.clock.now(),
            )
            .await
            .unwrap()
            .unwrap()
    }
}

#[tokio::test]
async fn a_retry_after_a_retryable_outcome_resumes_after_the_charge() {
    let w = world(StalePolicy::Reconcile);
    let first = w.checkout(true).await.unwrap();
    assert_eq!(first.outcome().class(), OutcomeClass::Retryable);
    let kept = w.record().await;
    assert_eq!(kept.state, RecordState::FailedRetryable);
    assert_eq!(kept.checkpoints.len(), 1, "a retryable outcome keeps them");
    assert_eq!(kept.checkpoints[0].value(), r#"{"id":"ch_1"}"#);

    let second = w.checkout(false).await.unwrap();
    assert_eq!(second.outcome().body(), r#"{"charge":"ch_1"}"#);
    assert_eq!(w.charges.load(Ordering::SeqCst), 1, "one charge");
    assert_eq!(w.emails.load(Ordering::SeqCst), 1, "one email");
    let done = w.record().await;
    assert_eq!(done.state, RecordState::Completed);
    assert!(done.checkpoints.is_empty(), "completion ends them");
}

#[tokio::test]
async fn a_takeover_resumes_and_the_stale_holder_is_fenced() {
    let w = world(StalePolicy::Takeover);
    // The first holder charges, saves the step, and then stalls (its process died).
    let claim = w
        .store
        .claim(
            &RecordId::new(w.scope.clone(), w.key.clone()),
            &w.fp,
            w.executor.policy(),
            w.clock.now(),
        )
        .await
        .unwrap();
    let stale = w.executor.attempt_for(&w.scope, &w.key, &claim).unwrap();
    assert!(stale.checkpoints().is_empty());
    w.charges.fetch_add(1, Ordering::SeqCst);
    stale
        .checkpoint("charged", &Charge { id: "ch_1".into() })
        .await
        .unwrap();

    w.clock.advance(LEASE + Duration::from_millis(1));
    let (charges, emails) = (w.charges.clone(), w.emails.clone());
    let resumed = w
        .executor
        .run(&w.scope, &w.key, &w.fp, |attempt| async move {
            assert_eq!(attempt.number(), 2);
            let steps: Vec<&str> = attempt.checkpoints().iter().map(|c| c.name()).collect();
            assert_eq!(steps, ["charged"]);
            let charge = match attempt.checkpoint_value::<Charge>("charged").unwrap() {
                Some(charge) => charge,
                None => {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Charge { id: "ch_2".into() }
                }
            };
            attempt.checkpoint("emailed", &true).await.unwrap();
            emails.fetch_add(1, Ordering::SeqCst);
            Outcome::definitive(200, &json!({"charge": charge.id})).unwrap()
        })
        .await
        .unwrap();
    assert!(!resumed.is_replay());
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
    assert_eq!(w.emails.load(Ordering::SeqCst), 1);

    // The stale holder wakes up: fenced, and nothing is written.
    let before = w.record().await;
    let late = stale.checkpoint("emailed", &false).await;
    assert!(matches!(late, Err(CheckpointError::Fenced)), "{late:?}");
    assert_eq!(w.record().await, before);
}

#[tokio::test]
async fn a_release_keeps_the_checkpoints_for_the_next_attempt() {
    let w = world(StalePolicy::Reconcile);
    let claim = w
        .store
        .claim(
            &RecordId::new(w.scope.clone(), w.key.clone()),
            &w.fp,
            w.executor.policy(),
            w.clock.now(),
        )
        .await
        .unwrap();
    let first = w.executor.attempt_for(&w.scope, &w.key, &claim).unwrap();
    first.checkpoint("a", &1).await.unwrap();
    w.clock.advance(Duration::from_millis(5));
    first.checkpoint("b", &2).await.unwrap();
    first.checkpoint("a", &3).await.unwrap();
    let ClaimAnswer::Claimed { token, .. } = claim else {
        unreachable!()
    };
    w.store
        .release(
            &RecordId::new(w.scope.clone(), w.key.clone()),
            token,
            w.clock.now(),
        )
        .await
        .unwrap();
    w.executor
        .run(&w.scope, &w.key, &w.fp, |attempt| async move {
            let steps: Vec<(&str, &str)> = attempt
                .checkpoints()
                .iter()
                .map(|c| (c.name(), c.value()))
                .collect();
            assert_eq!(steps, [("a", "1"), ("b", "2"), ("a", "3")], "in order");
            assert_eq!(attempt.checkpoint_value::<u32>("a").unwrap(), Some(3));
            assert_eq!(attempt.checkpoint_value::<u32>("c").unwrap(), None);
            let times: Vec<u64> = attempt
                .checkpoints()
                .iter()
                .map(|c| c.saved_at().as_millis())
                .collect();
            assert_eq!(times[1] - times[0], 5);
            Outcome::definitive(200, &json!({})).unwrap()
        })
        .await
        .unwrap();
}

#[derive(Debug, Serialize, Deserialize)]
struct Failed;

impl OperationError for Failed {
    fn class(&self) -> OutcomeClass {
        OutcomeClass::Retryable
    }
}

#[tokio::test]
async fn typed_operations_resume_too() {
    let w = world(StalePolicy::Reconcile);
    for round in 0..2 {
        let charges = w.charges.clone();
        let ran = w
            .executor
            .run_typed(&w.scope, &w.key, &w.fp, |attempt| async move {
                if attempt
                    .checkpoint_value::<Charge>("charged")
                    .unwrap()
                    .is_none()
                {
                    charges.fetch_add(1, Ordering::SeqCst);
                    attempt
                        .checkpoint("charged", &Charge { id: "ch_1".into() })
                        .await
                        .unwrap();
                }
                if round == 0 {
                    return Err(Failed);
                }
                Ok(attempt.checkpoints().len())
            })
            .await
            .unwrap();
        if round == 1 {
            assert!(matches!(ran.into_result(), Ok(1)));
        }
    }
    assert_eq!(w.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_encrypting_codec_never_stores_a_checkpoint_in_clear() {
    let mut w = world(StalePolicy::Reconcile);
    w.executor = w
        .executor
        .clone()
        .with_codec(AesGcmCodec::new("k1", [7; 32]).unwrap());
    let secret = "4242-4242-4242-4242";
    let ran = w
        .executor
        .run(&w.scope, &w.key, &w.fp, |attempt| async move {
            attempt
                .checkpoint("charged", &json!({"card": secret}))
                .await
                .unwrap();
            Outcome::retryable(503, &json!({})).unwrap()
        })
        .await
        .unwrap();
    assert_eq!(ran.outcome().class(), OutcomeClass::Retryable);
    let stored = w.record().await;
    let value = stored.checkpoints[0].value();
    assert!(!value.contains(secret), "{value}");
    assert!(sealed_info(value).is_some(), "{value}");
    w.executor
        .run(&w.scope, &w.key, &w.fp, |attempt| async move {
            assert_eq!(
                attempt.checkpoints()[0].value_json(),
                json!({"card": secret})
            );
            Outcome::definitive(200, &json!({})).unwrap()
        })
        .await
        .unwrap();

    // Without the right key, a resumed attempt does not start: nothing runs, the claim is given
    // back.
    let other = w
        .executor
        .clone()
        .with_codec(AesGcmCodec::new("k1", [8; 32]).unwrap());
    let key2 = IdempotencyKey::new("order-8").unwrap();
    other
        .run(&w.scope, &key2, &w.fp, |attempt| async move {
            attempt.checkpoint("charged", &1).await.unwrap();
            Outcome::retryable(503, &json!({})).unwrap()
        })
        .await
        .unwrap();
    let err = w
        .executor
        .run(&w.scope, &key2, &w.fp, |_| async {
            unreachable!("must not run")
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err:?}");
    let after = w
        .store
        .get(&RecordId::new(w.scope.clone(), key2.clone()), w.clock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.state, RecordState::FailedRetryable, "claim released");
    assert_eq!(after.checkpoints.len(), 1, "the steps are kept");
}

#[tokio::test]
async fn a_checkpoint_over_the_limit_is_refused_and_nothing_is_written() {
    let mut w = world(StalePolicy::Reconcile);
    let policy = w
        .executor
        .policy()
        .to_builder()
        .max_checkpoint_bytes(16)
        .build()
        .unwrap();
    w.executor = w.executor.clone().with_policy(policy);
    w.executor
        .run(&w.scope, &w.key, &w.fp, |attempt| async move {
            let err = attempt
                .checkpoint("charged", &"x".repeat(20))
                .await
                .unwrap_err();
            assert!(
                matches!(err, CheckpointError::TooLarge(e) if e.size == 29 && e.limit == 16),
                "{err:?}"
            );
            attempt.checkpoint("ok", &"x").await.unwrap();
            Outcome::retryable(503, &json!({})).unwrap()
        })
        .await
        .unwrap();
    let names: Vec<String> = w
        .record()
        .await
        .checkpoints
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    assert_eq!(names, ["ok"]);
}

/// A store written against the trait without checkpoints: it keeps the default methods.
#[derive(Debug, Default)]
struct Plain(MemoryStore);

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
    async fn get(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<idem_core::Record>, StoreError> {
        self.0.get(id, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<idem_core::Record>, StoreError> {
        self.0.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<idem_core::Record>, StoreError> {
        self.0.list(filter, now, limit).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(now, limit).await
    }
}

/// A store that is no `CheckpointStore` is never asked for a checkpoint (it has no method to
/// ask): the executor answers the operation's checkpoint with the typed error itself.
#[tokio::test]
async fn a_store_without_checkpoints_is_not_asked_and_the_executor_refuses_them() {
    let store = Arc::new(Plain::default());
    assert!(store.as_checkpoint_store().is_none());
    let executor = Executor::from_arc(store.clone());
    let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
    let id = RecordId::new(scope.clone(), key.clone());
    let fp = Fingerprint::of("op", &json!({})).unwrap();
    executor
        .run(&scope, &key, &fp, |attempt| async move {
            let err = attempt.checkpoint("charged", &1).await.unwrap_err();
            assert!(
                matches!(err, CheckpointError::Unsupported { backend: "custom" }),
                "{err:?}"
            );
            Outcome::definitive(200, &json!({})).unwrap()
        })
        .await
        .unwrap();
    let record = store.get(&id, Timestamp::now()).await.unwrap().unwrap();
    assert!(record.checkpoints.is_empty(), "nothing written");
}

/// The steps a claim resumes from cost a read only where there can be some: after a retry's
/// claim on a store that keeps checkpoints. A first execution (a new record has none) and a
/// retry on a store without checkpoints go from the claim to the operation without reading the
/// record back.
#[tokio::test]
async fn only_a_retry_on_a_store_that_keeps_checkpoints_reads_its_steps_back() {
    use idem_conformance::kit::{FaultStore, Op};
    let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
    let fp = Fingerprint::of("op", &json!({})).unwrap();
    let retryable = |_| async { Outcome::retryable(503, &json!({})).unwrap() };

    let keeps = FaultStore::new(MemoryStore::new());
    assert!(keeps.as_checkpoint_store().is_some());
    let executor = Executor::new(keeps.clone());
    executor.run(&scope, &key, &fp, retryable).await.unwrap();
    assert_eq!(
        keeps.calls(Op::Get),
        0,
        "a first execution reads nothing back"
    );
    executor.run(&scope, &key, &fp, retryable).await.unwrap();
    assert_eq!(keeps.calls(Op::Get), 1, "a retry reads its steps");

    let plain = FaultStore::new(Plain::default());
    assert!(plain.as_checkpoint_store().is_none());
    let executor = Executor::new(plain.clone());
    for _ in 0..2 {
        executor.run(&scope, &key, &fp, retryable).await.unwrap();
    }
    assert_eq!(plain.calls(Op::Claim), 2);
    assert_eq!(plain.calls(Op::Get), 0, "no steps to read back");
}
