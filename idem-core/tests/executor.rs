//! The executor's own behaviour: cancellation ([contract §2](idem_core::contract#states)), errors
//! before and after the operation, heartbeats. Store-independent behaviour is in the conformance
//! suite.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_conformance::kit::{Fault, FaultStore, Op};
use idem_core::machine::CompleteAnswer;
use idem_core::{
    Clock, Error, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore,
    Outcome, Policy, Record, RecordId, RecordState, Scope, StoreError, Timestamp,
};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

struct Setup {
    /// Counts the calls that reached the MemoryStore; faults and gates are programmed on it.
    store: FaultStore<MemoryStore>,
    /// Notified after every `release` and `complete` that reached the MemoryStore.
    called: Arc<Notify>,
    clock: ManualClock,
    executor: Executor,
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    effects: Arc<AtomicUsize>,
}

/// An executor as a user builds one: no spawner given, so inside tokio it spawns on tokio.
fn setup(policy: Policy) -> Setup {
    let store = FaultStore::new(MemoryStore::new());
    let called = Arc::new(Notify::new());
    for op in [Op::Release, Op::Complete] {
        let called = called.clone();
        store.after(op, move |_| {
            called.notify_one();
            std::future::ready(())
        });
    }
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let executor = Executor::new(store.clone())
        .with_policy(policy)
        .with_clock(clock.clone());
    Setup {
        store,
        called,
        clock,
        executor,
        scope: Scope::new("tenant/tool").unwrap(),
        key: IdempotencyKey::new("wf-1:step-1").unwrap(),
        fp: Fingerprint::of("tool", &json!({"a": 1})).unwrap(),
        effects: Arc::new(AtomicUsize::new(0)),
    }
}

fn ok() -> Outcome {
    Outcome::definitive(200, &json!({"done": true})).unwrap()
}

impl Setup {
    async fn record(&self) -> Option<Record> {
        self.store
            .get(
                &RecordId::new(self.scope.clone(), self.key.clone()),
                idem_core::Clock::now(&self.clock),
            )
            .await
            .unwrap()
    }

    /// From now on every `op` waits at the returned gate (closed) for a permit of its own.
    fn gate(&self, op: Op) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        let waits = gate.clone();
        self.store.before(op, move |_| {
            let waits = waits.clone();
            async move {
                waits.acquire().await.unwrap().forget();
                Ok(())
            }
        });
        gate
    }

    /// Runs the call in a task whose operation counts an effect and then waits on `hold`.
    fn spawn_call(
        &self,
        hold: Option<Arc<Semaphore>>,
    ) -> tokio::task::JoinHandle<Result<idem_core::Execution, Error>> {
        let (executor, scope, key, fp, effects) = (
            self.executor.clone(),
            self.scope.clone(),
            self.key.clone(),
            self.fp.clone(),
            self.effects.clone(),
        );
        tokio::spawn(async move {
            executor
                .run(&scope, &key, &fp, |_| async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    if let Some(hold) = hold {
                        hold.acquire().await.unwrap().forget();
                    }
                    ok()
                })
                .await
        })
    }
}

#[tokio::test]
async fn caller_dropped_before_the_operation_started_releases_the_claim() {
    let s = setup(Policy::default());
    let gate = s.gate(Op::Claim);
    let call = s.spawn_call(None);
    tokio::task::yield_now().await;
    // The caller goes away while its claim is still in the store.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // The store now answers: the claim is won, but nobody is there to run the operation.
    gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), s.called.notified())
        .await
        .expect("the abandoned claim is released");
    assert_eq!(s.store.calls(Op::Release), 1);
    assert_eq!(
        s.effects.load(Ordering::SeqCst),
        0,
        "the operation never ran"
    );
    let r = s.record().await.unwrap();
    assert_eq!(
        r.state,
        RecordState::FailedRetryable,
        "released, so a retry may run it"
    );
    // And the retry does run it, once.
    gate.add_permits(1);
    assert!(!s.spawn_call(None).await.unwrap().unwrap().is_replay());
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_spawner_of_your_own_still_releases_an_abandoned_claim() {
    let mut s = setup(Policy::default());
    let spawned = Arc::new(AtomicUsize::new(0));
    let counted = spawned.clone();
    s.executor = s.executor.with_spawner(move |task| {
        counted.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(task);
    });
    let gate = s.gate(Op::Claim);
    let call = s.spawn_call(None);
    tokio::task::yield_now().await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), s.called.notified())
        .await
        .expect("the abandoned claim is released");
    assert_eq!(s.store.calls(Op::Release), 1);
    assert_eq!(
        s.record().await.unwrap().state,
        RecordState::FailedRetryable
    );
    // The claim and the release went through the spawner given, not tokio's default.
    assert_eq!(spawned.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn without_a_spawner_the_claim_dies_with_its_caller() {
    let mut s = setup(Policy::default());
    s.executor = s.executor.without_spawner();
    let gate = s.gate(Op::Claim);
    let call = s.spawn_call(None);
    tokio::task::yield_now().await;
    // The claim runs inline in the caller's task: aborting it drops the claim mid-call, where
    // the default executor's claim goes on in a task of its own (and is then released).
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(s.record().await, None, "the claim never reached the store");
    assert_eq!(s.store.calls(Op::Release), 0);
    assert_eq!(s.effects.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn caller_dropped_while_the_operation_runs_leaves_it_processing() {
    let s = setup(Policy::default());
    let hold = Arc::new(Semaphore::new(0));
    let call = s.spawn_call(Some(hold.clone()));
    while s.effects.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        s.store.calls(Op::Release),
        0,
        "never guess it did not happen"
    );
    let r = s.record().await.unwrap();
    assert_eq!(r.state, RecordState::Processing);
    // A retry is told the call is in flight; it does not run the effect again.
    let err = s.spawn_call(None).await.unwrap().unwrap_err();
    assert!(
        matches!(err, Error::InFlight { stale: false, .. }),
        "{err:?}"
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn caller_dropped_while_recording_still_records_the_outcome() {
    let s = setup(Policy::default());
    let gate = s.gate(Op::Complete);
    let call = s.spawn_call(None);
    while s.effects.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    tokio::task::yield_now().await;
    call.abort();
    let _ = call.await;
    gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), s.called.notified())
        .await
        .expect("the completion runs to the end");
    let r = s.record().await.unwrap();
    assert_eq!((r.state, r.outcome), (RecordState::Completed, Some(ok())));
    gate.add_permits(1);
    assert!(s.spawn_call(None).await.unwrap().unwrap().is_replay());
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn store_down_at_claim_runs_nothing() {
    let s = setup(Policy::default());
    s.store.fail_next(Op::Claim, usize::MAX, Fault::Unavailable);
    let err = s.spawn_call(None).await.unwrap().unwrap_err();
    match &err {
        Error::Store(e) => assert!(e.is_unavailable()),
        other => panic!("expected Store(Unavailable), got {other:?}"),
    }
    assert!(!err.operation_ran());
    assert_eq!(
        s.effects.load(Ordering::SeqCst),
        0,
        "never a silent proceed"
    );
    assert_eq!(s.record().await, None);
}

#[tokio::test]
async fn store_down_at_completion_reports_the_outcome_and_leaves_processing() {
    let s = setup(Policy::default());
    s.store
        .fail_next(Op::Complete, usize::MAX, Fault::Unavailable);
    let err = s.spawn_call(None).await.unwrap().unwrap_err();
    match &err {
        Error::NotRecorded { outcome, source } => {
            assert_eq!(**outcome, ok());
            assert!(source.is_unavailable());
        }
        other => panic!("expected NotRecorded, got {other:?}"),
    }
    assert!(err.operation_ran());
    assert_eq!(s.record().await.unwrap().state, RecordState::Processing);
    // The store is back; the retry is in flight, not a second effect.
    s.store.heal();
    assert!(matches!(
        s.spawn_call(None).await.unwrap(),
        Err(Error::InFlight { .. })
    ));
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
}

/// [contract §2](idem_core::contract#states): an outcome too large to keep does not leave the key
/// stuck in `processing` (every retry a 409 until an operator acts): the record completes with a
/// small "ran, not kept" outcome, the first caller gets the real answer, and a retry gets the final
/// answer without running the operation again.
#[tokio::test]
async fn oversized_outcome_completes_as_not_kept_and_retries_get_that_final_answer() {
    let policy = Policy::builder().max_outcome_bytes(8).build().unwrap();
    let s = setup(policy);
    let err = s.spawn_call(None).await.unwrap().unwrap_err();
    let Error::OutcomeTooLarge {
        outcome,
        size: 13,
        limit: 8,
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        **outcome,
        ok(),
        "the first caller gets the tool's real answer"
    );
    assert!(err.operation_ran());
    let r = s.record().await.unwrap();
    assert_eq!(r.state, RecordState::Completed);
    let stored = r.outcome.unwrap();
    assert!(stored.is_not_kept(), "{stored:?}");
    assert_eq!(
        (stored.status(), stored.class()),
        (200, idem_core::OutcomeClass::Definitive)
    );
    assert!(
        !stored.body().contains("done"),
        "none of the real body kept"
    );
    // The retry: a final answer, not InFlight, and no second effect.
    let again = s.spawn_call(None).await.unwrap().unwrap();
    assert!(again.is_replay());
    assert_eq!(again.outcome(), &stored);
    assert_eq!(s.effects.load(Ordering::SeqCst), 1, "the tool ran once");
}

/// A retryable answer too large to keep stays retryable under `DefinitiveOnly`: the next attempt
/// runs the operation again, as it would have with the answer kept.
#[tokio::test]
async fn oversized_retryable_outcome_is_marked_retryable_not_stuck() {
    let policy = Policy::builder().max_outcome_bytes(8).build().unwrap();
    let s = setup(policy);
    let failing = Outcome::retryable(503, &json!({"error": "upstream down"})).unwrap();
    let run = |o: Outcome| {
        let effects = s.effects.clone();
        s.executor
            .run(&s.scope, &s.key, &s.fp, move |_| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                o
            })
    };
    let err = run(failing.clone()).await.unwrap_err();
    assert!(matches!(err, Error::OutcomeTooLarge { .. }), "{err:?}");
    let r = s.record().await.unwrap();
    assert_eq!(r.state, RecordState::FailedRetryable);
    assert!(r.outcome.unwrap().is_not_kept());
    let tiny = Outcome::definitive(200, &1).unwrap();
    let second = run(tiny.clone()).await.unwrap();
    assert!(!second.is_replay());
    assert_eq!(second.outcome(), &tiny);
    assert_eq!(s.effects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_zero_heartbeat_is_refused_before_the_store_is_called() {
    let s = setup(Policy::default());
    let result = s
        .executor
        .run(&s.scope, &s.key, &s.fp, |attempt| async move {
            for lease in [Duration::ZERO, Duration::from_micros(500)] {
                let refused = attempt.extend(lease).await;
                assert!(
                    matches!(refused, Err(StoreError::ZeroLease(_))),
                    "{refused:?}"
                );
            }
            ok()
        })
        .await
        .unwrap();
    assert!(!result.is_replay());
}

#[tokio::test]
async fn heartbeat_extends_and_reports_a_lost_claim() {
    let policy = Policy::builder()
        .stale(idem_core::StalePolicy::Takeover)
        .build()
        .unwrap();
    let s = setup(policy);
    let clock = s.clock.clone();
    let executor2 = s.executor.clone();
    let (scope, key, fp) = (s.scope.clone(), s.key.clone(), s.fp.clone());
    let result = s
        .executor
        .run(&s.scope, &s.key, &s.fp, |attempt| async move {
            clock.advance(Duration::from_secs(20));
            assert!(
                attempt.extend(Duration::from_secs(30)).await.unwrap(),
                "still held"
            );
            clock.advance(Duration::from_secs(25)); // past the original lease, inside the new one
            let inner = executor2.run(&scope, &key, &fp, |_| async { ok() }).await;
            assert!(
                matches!(inner, Err(Error::InFlight { stale: false, .. })),
                "{inner:?}"
            );
            clock.advance(Duration::from_secs(10)); // lease lost
            let taker = executor2
                .run(&scope, &key, &fp, |_| async { ok() })
                .await
                .unwrap();
            assert!(!taker.is_replay(), "taken over");
            assert!(
                !attempt.extend(Duration::from_secs(30)).await.unwrap(),
                "lost: stop now"
            );
            assert_eq!(
                attempt.downstream_key("stripe"),
                idem_core::downstream_key(&scope, &key, "stripe")
            );
            ok()
        })
        .await;
    assert!(matches!(result, Err(Error::Fenced { .. })), "{result:?}");
}

#[tokio::test]
async fn an_operation_that_recorded_its_own_outcome_is_not_completed_twice() {
    let s = setup(Policy::default());
    let store = s.store.clone();
    let clock = s.clock.clone();
    let execution = s
        .executor
        .run(&s.scope, &s.key, &s.fp, |attempt| async move {
            // What a transactional completion does: the effect and the record in one commit.
            let now = idem_core::Clock::now(&clock);
            let done = store
                .complete(
                    &RecordId::new((attempt.scope()).clone(), (attempt.key()).clone()),
                    attempt.token(),
                    &ok(),
                    &Policy::default(),
                    now,
                )
                .await
                .unwrap();
            assert_eq!(done, CompleteAnswer::Completed);
            attempt.mark_recorded();
            ok()
        })
        .await
        .unwrap();
    assert!(!execution.is_replay());
    assert_eq!(
        s.store.calls(Op::Complete),
        1,
        "completed once, by the operation"
    );
    assert_eq!(s.record().await.unwrap().state, RecordState::Completed);
}

/// What an executor was built with reads back as given: its policy (an MCP task server decides
/// from its stale policy whether a task whose holder crashed is still working), its store and
/// its clock.
#[test]
fn an_executor_reads_back_its_policy_store_and_clock() {
    let policy = Policy::builder()
        .lease(Duration::from_secs(7))
        .stale(idem_core::StalePolicy::Takeover)
        .build()
        .unwrap();
    assert_ne!(policy, Policy::default());
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let executor = Executor::new(MemoryStore::new())
        .with_policy(policy)
        .with_clock(clock.clone());
    assert_eq!(executor.policy(), &policy);
    assert_eq!(executor.store().backend(), "memory");
    clock.advance(Duration::from_secs(1));
    assert_eq!(executor.clock().now(), clock.now());
}
