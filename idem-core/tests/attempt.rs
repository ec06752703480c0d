//! What an [`Attempt`] tells and does around a transactional completion
//! ([contract §6](idem_core::contract#transactional-completion)): the wake-up a store leaves for
//! the commit runs when the operation marks the record recorded and once more when it returns; a
//! recorded attempt's lease is no longer renewed; an attempt made for a direct claim carries the
//! claim's lease; the executor's and the attempt's `Debug` say what they hold. On `MemoryStore`
//! with tokio's paused clock as the records' clock (no real sleeping).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Sink, TokioClock};
use idem_core::machine::ClaimAnswer;
use idem_core::wait::wake_when_recorded;
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Policy, RecordId, Scope,
};
use serde_json::json;
use tokio::time::{Instant, sleep};

const LEASE: Duration = Duration::from_secs(30);

fn ids() -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new("tenant/create_ticket").unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

fn executor(store: &MemoryStore) -> Executor {
    let policy = Policy::builder().lease(LEASE).build().unwrap();
    Executor::new(store.clone())
        .with_policy(policy)
        .with_clock(TokioClock(Instant::now()))
}

/// A store's transactional completion leaves its wake-up for the commit: it runs when the
/// operation says the record is recorded (not before), and once more when the operation returns
/// (its transaction has surely committed by then).
#[tokio::test(start_paused = true)]
async fn the_wake_up_left_for_the_commit_runs_at_the_mark_and_when_the_operation_returns() {
    let (store, sink, wakes) = (
        MemoryStore::new(),
        Sink::default(),
        Arc::new(AtomicUsize::new(0)),
    );
    let (scope, key, fp) = ids();
    let ran = executor(&store)
        .run(&scope, &key, &fp, |attempt| {
            let wakes = wakes.clone();
            let sink = &sink;
            async move {
                let counted = wakes.clone();
                wake_when_recorded(&attempt, move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                });
                assert_eq!(
                    wakes.load(Ordering::SeqCst),
                    0,
                    "nobody woken before the commit"
                );
                let outcome = sink.create_ticket();
                attempt.mark_recorded();
                assert_eq!(wakes.load(Ordering::SeqCst), 1, "woken at the mark");
                outcome
            }
        })
        .await
        .unwrap();
    assert!(!ran.is_replay());
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        2,
        "woken again when it returned"
    );
    assert_eq!(sink.count(), 1);
}

/// A wake-up left after the operation already said the record is recorded runs at once.
#[tokio::test(start_paused = true)]
async fn a_wake_up_left_after_the_mark_runs_at_once() {
    let (store, sink, wakes) = (
        MemoryStore::new(),
        Sink::default(),
        Arc::new(AtomicUsize::new(0)),
    );
    let (scope, key, fp) = ids();
    executor(&store)
        .run(&scope, &key, &fp, |attempt| {
            let wakes = wakes.clone();
            let sink = &sink;
            async move {
                let outcome = sink.create_ticket();
                attempt.mark_recorded();
                let counted = wakes.clone();
                wake_when_recorded(&attempt, move || {
                    counted.fetch_add(1, Ordering::SeqCst);
                });
                assert_eq!(wakes.load(Ordering::SeqCst), 1, "woken at once");
                outcome
            }
        })
        .await
        .unwrap();
    assert_eq!(sink.count(), 1);
}

/// Once the operation recorded its outcome in its own transaction, the claim has ended well:
/// the heartbeat renews nothing more, however long the operation still runs.
#[tokio::test(start_paused = true)]
async fn a_recorded_attempt_is_not_renewed() {
    let (store, sink) = (MemoryStore::new(), Sink::default());
    let (scope, key, fp) = ids();
    let exec = executor(&store);
    let claimed = exec.clock().now() + LEASE;
    exec.run(&scope, &key, &fp, |attempt| {
        let sink = &sink;
        async move {
            let outcome = sink.create_ticket();
            attempt.mark_recorded();
            sleep(2 * LEASE).await;
            assert_eq!(attempt.lease_until(), claimed, "no renewal after the mark");
            outcome
        }
    })
    .await
    .unwrap();
    assert_eq!(sink.count(), 1);
}

/// The attempt of a claim made on the store directly holds the claim's lease, from now.
#[tokio::test(start_paused = true)]
async fn an_attempt_for_a_direct_claim_holds_the_claims_lease() {
    let store = MemoryStore::new();
    let (scope, key, fp) = ids();
    let exec = executor(&store);
    let now = exec.clock().now();
    let claim = store
        .claim(
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            exec.policy(),
            now,
        )
        .await
        .unwrap();
    assert!(matches!(claim, ClaimAnswer::Claimed { .. }), "{claim:?}");
    let attempt = exec.attempt_for(&scope, &key, &claim).unwrap();
    assert_eq!(attempt.lease_until(), now + LEASE);
    assert!(!attempt.is_lost());
}

/// `Debug` says what the executor and an attempt hold (a log line reads it).
#[tokio::test(start_paused = true)]
async fn debug_says_what_the_executor_and_the_attempt_hold() {
    let store = MemoryStore::new();
    let (scope, key, fp) = ids();
    let exec = executor(&store);
    let shown = format!("{exec:?}");
    assert!(shown.starts_with("Executor {"), "{shown}");
    assert!(shown.contains("derived_key_wait: true"), "{shown}");
    let off = format!("{:?}", exec.clone().with_derived_key_wait(false));
    assert!(off.contains("derived_key_wait: false"), "{off}");
    // A timer says whether it needs tokio (the executor's default) or is the caller's own.
    let tokio_timer = format!("{:?}", idem_core::Timer::tokio());
    assert_eq!(tokio_timer, "Timer { tokio: true, .. }");
    let own = idem_core::Timer::new(|_| Box::pin(std::future::ready(())));
    assert_eq!(format!("{own:?}"), "Timer { tokio: false, .. }");

    let now = exec.clock().now();
    let claim = store
        .claim(
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            exec.policy(),
            now,
        )
        .await
        .unwrap();
    let attempt = exec.attempt_for(&scope, &key, &claim).unwrap();
    let shown = format!("{attempt:?}");
    assert!(shown.starts_with("Attempt {"), "{shown}");
    for part in [
        "tenant/create_ticket",
        "wf-1:step-1",
        "lease_until",
        "lost: false",
    ] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}
