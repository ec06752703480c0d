//! Reconciliation of an operation with two effects ([contract
//! §6.1](idem_core::contract#checkpoints)): the probe sees the record's checkpoints, decoded by the
//! reconciler's codec, and is asked about the step after the last one; "not happened" releases the
//! record with its checkpoints and the next attempt resumes after them. Effects are counted at
//! their sinks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::codec::AesGcmCodec;
use idem_core::reconcile::{Finding, Probe, Reconciler};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Outcome,
    Policy, Record, RecordId, RecordState, Scope, Timestamp, async_trait,
};
use serde_json::json;

/// Answers "not happened" for the email, and notes what it was shown.
#[derive(Default, Clone)]
struct EmailProbe {
    emails: Arc<AtomicUsize>,
    asked_after: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
}

#[async_trait]
impl Probe for EmailProbe {
    async fn probe(&self, record: &Record) -> Finding {
        let last = record.last_checkpoint().expect("the charge was saved");
        self.asked_after
            .lock()
            .unwrap()
            .push((last.name().to_owned(), last.value_json()));
        if self.emails.load(Ordering::SeqCst) == 0 {
            Finding::NotHappened
        } else {
            Finding::Unknown
        }
    }
}

fn codec() -> AesGcmCodec {
    AesGcmCodec::new("k1", [3; 32]).unwrap()
}

#[tokio::test]
async fn the_probe_is_asked_after_the_last_checkpoint_and_the_retry_resumes() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let executor = Executor::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(policy)
        .with_codec(codec());
    let scope = Scope::new("shop/checkout").unwrap();
    let key = IdempotencyKey::new("order-9").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let fp = Fingerprint::of("checkout", &json!({"order": 9})).unwrap();
    let (charges, probe) = (Arc::new(AtomicUsize::new(0)), EmailProbe::default());

    // The first holder charges, saves the step, and dies before the email.
    let claim = store.claim(&id, &fp, &policy, clock.now()).await.unwrap();
    let holder = executor.attempt_for(&scope, &key, &claim).unwrap();
    charges.fetch_add(1, Ordering::SeqCst);
    holder
        .checkpoint("charged", &json!({"charge": "ch_1"}))
        .await
        .unwrap();

    clock.advance(Duration::from_secs(31));
    let report = Reconciler::new(
        Arc::new(store.clone()),
        Arc::new(clock.clone()),
        policy,
        probe.clone(),
    )
    .codec(Arc::new(codec()))
    .run_once()
    .await
    .unwrap();
    assert_eq!(report.released, 1, "{report:?}");
    assert_eq!(
        *probe.asked_after.lock().unwrap(),
        [("charged".to_owned(), json!({"charge": "ch_1"}))],
        "the probe saw the last step, decoded"
    );
    let released = store.get(&id, clock.now()).await.unwrap().unwrap();
    assert_eq!(released.state, RecordState::FailedRetryable);
    assert_eq!(released.checkpoints.len(), 1, "released with its steps");

    // The retry resumes after the charge: one charge, one email.
    let (c, e) = (charges.clone(), probe.emails.clone());
    executor
        .run(&scope, &key, &fp, |attempt| async move {
            if attempt
                .checkpoint_value::<serde_json::Value>("charged")
                .unwrap()
                .is_none()
            {
                c.fetch_add(1, Ordering::SeqCst);
            }
            e.fetch_add(1, Ordering::SeqCst);
            Outcome::definitive(200, &json!({"ok": true})).unwrap()
        })
        .await
        .unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    assert_eq!(probe.emails.load(Ordering::SeqCst), 1);
}
