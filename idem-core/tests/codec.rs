//! Outcome codecs on the executor ([contract §6](idem_core::contract#codecs)), against the
//! reference MemoryStore: what sits at rest, what is replayed, and what a wrong key does. Every
//! test counts the operation's runs at the sink.
#![cfg(feature = "encryption")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::codec::{AesGcmCodec, Chain, CodecError, Redact, sealed_info};
use idem_core::{
    Clock, Error, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome,
    OutcomeClass, Policy, RecordId, RecordState, Scope, SystemClock,
};
use serde_json::json;

const SECRET: &str = "SECRET-MARKER-4242";

fn scope() -> Scope {
    Scope::new("tenant-a/charge").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("charge", &json!({"cents": 500})).unwrap()
}

fn secret_outcome() -> Outcome {
    Outcome::definitive(
        201,
        &json!({"charge_id": "ch_1", "card": SECRET, "email": "ada@example.com"}),
    )
    .unwrap()
}

fn aes(kid: &str, key: u8) -> AesGcmCodec {
    AesGcmCodec::new(kid, [key; 32]).unwrap()
}

/// Runs the charge once through `executor`, counting runs in `runs`.
async fn charge(
    executor: &Executor,
    k: &str,
    runs: &Arc<AtomicUsize>,
) -> Result<idem_core::Execution, Error> {
    let runs = runs.clone();
    executor
        .run(&scope(), &key(k), &fp(), |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            secret_outcome()
        })
        .await
}

/// The stored body, as the store holds it.
async fn at_rest(store: &MemoryStore, k: &str) -> Outcome {
    store
        .get(&RecordId::new(scope(), key(k)), SystemClock.now())
        .await
        .unwrap()
        .expect("a record")
        .outcome
        .expect("an outcome")
}

#[tokio::test]
async fn encrypted_at_rest_replayed_in_clear_and_run_once() {
    let store = MemoryStore::new();
    let executor = Executor::new(store.clone()).with_codec(aes("2026-01", 1));
    let runs = Arc::new(AtomicUsize::new(0));

    let first = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(
        first.outcome(),
        &secret_outcome(),
        "the caller gets the real answer"
    );

    let stored = at_rest(&store, "k-1").await;
    assert!(!stored.body().contains(SECRET), "{}", stored.body());
    assert!(!stored.body().contains("ada@example.com"));
    assert!(!stored.body().contains("ch_1"));
    assert_eq!(
        (stored.status(), stored.class()),
        (201, OutcomeClass::Definitive),
        "status and class stay clear"
    );
    assert_eq!(sealed_info(stored.body()).unwrap().key_id, "2026-01");

    let again = charge(&executor, "k-1", &runs).await.unwrap();
    assert!(again.is_replay());
    assert_eq!(again.outcome(), &secret_outcome(), "replayed byte for byte");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn key_rotation_old_records_open_new_ones_use_the_new_key() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let before = Executor::new(store.clone()).with_codec(aes("k1", 1));
    charge(&before, "old", &runs).await.unwrap();

    let rotated =
        Executor::new(store.clone()).with_codec(aes("k2", 2).with_old_key("k1", [1; 32]).unwrap());
    let old = charge(&rotated, "old", &runs).await.unwrap();
    assert!(old.is_replay());
    assert_eq!(old.outcome(), &secret_outcome());
    charge(&rotated, "new", &runs).await.unwrap();
    assert_eq!(
        sealed_info(at_rest(&store, "new").await.body())
            .unwrap()
            .key_id,
        "k2"
    );
    assert_eq!(
        sealed_info(at_rest(&store, "old").await.body())
            .unwrap()
            .key_id,
        "k1"
    );

    // k1 retired too early: the old record is an error, never a run and never garbage.
    let retired = Executor::new(store.clone()).with_codec(aes("k2", 2));
    let err = charge(&retired, "old", &runs).await.unwrap_err();
    assert!(
        matches!(&err, Error::Decode(CodecError::UnknownKey { key_id }) if key_id == "k1"),
        "{err:?}"
    );
    assert!(!err.operation_ran());
    assert!(charge(&retired, "new", &runs).await.unwrap().is_replay());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "one run per key, whatever the keys"
    );
}

#[tokio::test]
async fn a_wrong_key_is_an_error_and_the_effect_does_not_run_again() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    charge(
        &Executor::new(store.clone()).with_codec(aes("k1", 1)),
        "k-1",
        &runs,
    )
    .await
    .unwrap();
    let stored = at_rest(&store, "k-1").await;

    let wrong = Executor::new(store.clone()).with_codec(aes("k1", 9));
    for _ in 0..3 {
        let err = charge(&wrong, "k-1", &runs).await.unwrap_err();
        assert!(
            matches!(err, Error::Decode(CodecError::Decrypt { .. })),
            "{err:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a wrong key never runs the effect again"
    );
    assert_eq!(
        at_rest(&store, "k-1").await,
        stored,
        "and changes nothing at rest"
    );
    let record = store
        .get(&RecordId::new(scope(), key("k-1")), SystemClock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

#[tokio::test]
async fn a_clear_record_is_refused_unless_unsealed_records_are_accepted() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    // Stored before encryption was turned on.
    charge(&Executor::new(store.clone()), "k-1", &runs)
        .await
        .unwrap();

    let strict = Executor::new(store.clone()).with_codec(aes("k1", 1));
    assert!(matches!(
        charge(&strict, "k-1", &runs).await,
        Err(Error::Decode(CodecError::NotSealed))
    ));
    let lenient = Executor::new(store.clone()).with_codec(aes("k1", 1).accept_unsealed(true));
    let replay = charge(&lenient, "k-1", &runs).await.unwrap();
    assert!(replay.is_replay());
    assert_eq!(replay.outcome(), &secret_outcome());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn redaction_stores_and_replays_the_redacted_body() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let executor =
        Executor::new(store.clone()).with_codec(Redact::mask(["/card", "/email"]).unwrap());
    let first = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(
        first.outcome(),
        &secret_outcome(),
        "the first caller sees everything"
    );
    let stored = at_rest(&store, "k-1").await;
    assert!(!stored.body().contains(SECRET) && !stored.body().contains("ada@"));
    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(
        replay.outcome().body_json(),
        json!({"charge_id": "ch_1", "card": "[redacted]", "email": "[redacted]"})
    );
    assert_eq!(replay.outcome().status(), 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn redact_then_encrypt() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let codec = Chain::new(Redact::remove(["/card"]).unwrap(), aes("k1", 1));
    let executor = Executor::new(store.clone()).with_codec(codec);
    charge(&executor, "k-1", &runs).await.unwrap();
    let stored = at_rest(&store, "k-1").await;
    assert!(sealed_info(stored.body()).is_some() && !stored.body().contains("ch_1"));
    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(
        replay.outcome().body_json(),
        json!({"charge_id": "ch_1", "email": "ada@example.com"})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An operation that completes its own record (transactional completion) stores what
/// `Attempt::encode` gives, under `Attempt::policy`: sealed like the executor's own.
#[tokio::test]
async fn transactional_completion_stores_the_encoded_outcome() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = Policy::builder()
        .ttl(std::time::Duration::from_secs(7200))
        .build()
        .unwrap();
    let executor = Executor::new(store.clone())
        .with_policy(policy)
        .with_codec(aes("k1", 1));
    let (r, s) = (runs.clone(), store.clone());
    executor
        .run(&scope(), &key("k-1"), &fp(), |attempt| async move {
            r.fetch_add(1, Ordering::SeqCst);
            let outcome = secret_outcome();
            assert_eq!(attempt.policy(), &policy);
            let stored = attempt.encode(&outcome).unwrap();
            let answer = s
                .complete(
                    &RecordId::new((attempt.scope()).clone(), (attempt.key()).clone()),
                    attempt.token(),
                    &stored,
                    attempt.policy(),
                    SystemClock.now(),
                )
                .await
                .unwrap();
            assert_eq!(answer, idem_core::machine::CompleteAnswer::Completed);
            attempt.mark_recorded();
            outcome
        })
        .await
        .unwrap();
    let record = store
        .get(&RecordId::new(scope(), key("k-1")), SystemClock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.expires_at.as_millis() - record.updated_at.as_millis(),
        7_200_000,
        "completed under the executor's policy"
    );
    assert!(!record.outcome.unwrap().body().contains(SECRET));
    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(replay.outcome(), &secret_outcome());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The size limit applies to what is stored: a body that fits in clear but not sealed is kept as
/// "ran, not kept", itself sealed, and retries get that final answer.
#[tokio::test]
async fn the_limit_counts_the_sealed_body() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let limit = secret_outcome().size() + 10;
    let policy = Policy::builder().max_outcome_bytes(limit).build().unwrap();
    let executor = Executor::new(store.clone())
        .with_policy(policy)
        .with_codec(aes("k1", 1));
    let err = charge(&executor, "k-1", &runs).await.unwrap_err();
    assert!(matches!(err, Error::OutcomeTooLarge { .. }), "{err:?}");
    assert!(sealed_info(at_rest(&store, "k-1").await.body()).is_some());
    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert!(replay.outcome().is_not_kept());
    assert!(!replay.outcome().body().contains(SECRET));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The reconciler seals the probe's outcome with the executor's codec, so a record settled by
/// reconciliation replays like one the executor completed.
#[tokio::test]
async fn reconciliation_stores_the_sealed_outcome() {
    use idem_core::machine::ClaimAnswer;
    use idem_core::reconcile::{Finding, Probe, Reconciler};
    use idem_core::{ManualClock, Record, async_trait};

    struct Found;
    #[async_trait]
    impl Probe for Found {
        async fn probe(&self, _record: &Record) -> Finding {
            Finding::Happened(secret_outcome())
        }
    }

    let store = MemoryStore::new();
    let clock = ManualClock::new(idem_core::Timestamp::from_millis(1_700_000_000_000));
    let policy = Policy::default();
    let codec: Arc<dyn idem_core::codec::OutcomeCodec> = Arc::new(aes("k1", 1));
    // A holder claimed, did the effect and died before recording it.
    let claimed = store
        .claim(
            &RecordId::new(scope(), key("k-1")),
            &fp(),
            &policy,
            clock.now(),
        )
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimAnswer::Claimed { .. }));
    clock.advance(policy.lease() * 2);
    let report = Reconciler::new(
        Arc::new(store.clone()),
        Arc::new(clock.clone()),
        policy,
        Found,
    )
    .codec(codec.clone())
    .run_once()
    .await
    .unwrap();
    assert_eq!(report.completed, 1);
    let stored = store
        .get(&RecordId::new(scope(), key("k-1")), clock.now())
        .await
        .unwrap()
        .unwrap();
    let body = stored.outcome.unwrap();
    assert!(sealed_info(body.body()).is_some() && !body.body().contains(SECRET));

    let runs = Arc::new(AtomicUsize::new(0));
    let executor = Executor::new(store.clone())
        .with_clock(clock.clone())
        .with_codec(codec);
    let replay = charge(&executor, "k-1", &runs).await.unwrap();
    assert_eq!(replay.outcome(), &secret_outcome());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// One codec shared by several executors as an `Arc` (its keys loaded once): what the first
/// stores is sealed with the codec's key, and the second replays it in clear.
#[tokio::test]
async fn a_codec_shared_as_an_arc_seals_and_opens_as_itself() {
    let store = MemoryStore::new();
    let shared = Arc::new(aes("shared", 4));
    let runs = Arc::new(AtomicUsize::new(0));

    let one = Executor::new(store.clone()).with_codec(shared.clone());
    let first = charge(&one, "k-1", &runs).await.unwrap();
    assert_eq!(first.outcome(), &secret_outcome());
    let stored = at_rest(&store, "k-1").await;
    assert!(!stored.body().contains(SECRET), "{}", stored.body());
    assert_eq!(sealed_info(stored.body()).unwrap().key_id, "shared");

    let two = Executor::new(store.clone()).with_codec(shared);
    let again = charge(&two, "k-1", &runs).await.unwrap();
    assert!(again.is_replay());
    assert_eq!(again.outcome(), &secret_outcome());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
