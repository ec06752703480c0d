//! Measured on the stores directly: the wake-up of a waiter, and the retry of a slow tool.

use super::*;

/// Completes the claim `token` of (scope, key) on A as `completion` says; returns when the
/// completion's commit was called (`complete`'s call: its commit is inside it).
pub(super) async fn complete(
    a: &Arc<dyn KeyStore>,
    completion: &Completion,
    (scope, key): (&Scope, &IdempotencyKey),
    token: Token,
) -> Instant {
    let p = policy();
    let claim = ClaimAnswer::Claimed {
        token,
        attempt: 1,
        kind: ClaimKind::New,
    };
    let attempt = || {
        Executor::from_arc(a.clone())
            .with_policy(p)
            .attempt_for(scope, key, &claim)
            .unwrap()
    };
    match completion {
        Completion::Store => {
            let called = Instant::now();
            let now = idemkit::Clock::now(&SystemClock);
            let id = RecordId::new(scope.clone(), key.clone());
            a.complete(&id, token, &ticket(), &p, now).await.unwrap();
            called
        }
        Completion::Sqlite(store) => {
            let (store, attempt) = (store.clone(), attempt());
            let holder = store.clone();
            holder
                .with_connection(move |conn| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .unwrap();
                    let done = store.complete_in(&tx, &attempt, &ticket()).unwrap();
                    assert_eq!(done, CompleteAnswer::Completed);
                    let called = Instant::now();
                    tx.commit().unwrap();
                    attempt.mark_recorded();
                    called
                })
                .await
                .unwrap()
        }
        Completion::Postgres(store) => {
            let attempt = attempt();
            let mut tx = store.pool().begin().await.unwrap();
            let done = store
                .complete_in(&mut tx, &attempt, &ticket())
                .await
                .unwrap();
            assert_eq!(done, CompleteAnswer::Completed);
            let called = Instant::now();
            tx.commit().await.unwrap();
            attempt.mark_recorded();
            called
        }
    }
}

/// From the call of the completion's commit on A to the replay of a request waiting on B.
pub(super) async fn wake_up((a, b): &Pair, completion: &Completion) -> Vec<Duration> {
    let p = policy();
    let waiting = Executor::from_arc(b.clone())
        .with_policy(p)
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (a, waiting, completion) = (a.clone(), waiting.clone(), completion.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("wake", batch * BATCH + i);
                    let now = idemkit::Clock::now(&SystemClock);
                    let token = match a
                        .claim(&RecordId::new(scope.clone(), key.clone()), &fp, &p, now)
                        .await
                        .unwrap()
                    {
                        ClaimAnswer::Claimed { token, .. } => token,
                        other => panic!("{other:?}"),
                    };
                    let waiter = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            let again = waiting
                                .run(&scope, &key, &fp, |_| async { unreachable!() })
                                .await
                                .unwrap();
                            assert!(again.is_replay());
                            Instant::now()
                        })
                    };
                    tokio::time::sleep(HOLD).await;
                    let called = complete(&a, &completion, (&scope, &key), token).await;
                    waiter.await.unwrap().saturating_duration_since(called)
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.unwrap());
        }
    }
    out
}

/// The first request's operation: the tool's 300 ms, then its answer, recorded by the executor
/// or, with a transactional completion, in a transaction of the operation's own.
pub(super) async fn tool(attempt: Attempt, completion: Completion) -> Outcome {
    tokio::time::sleep(TOOL).await;
    match completion {
        Completion::Store => {}
        Completion::Sqlite(store) => {
            store
                .clone()
                .with_connection(move |conn| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .unwrap();
                    store.complete_in(&tx, &attempt, &ticket()).unwrap();
                    tx.commit().unwrap();
                    attempt.mark_recorded();
                })
                .await
                .unwrap();
        }
        Completion::Postgres(store) => {
            let mut tx = store.pool().begin().await.unwrap();
            store
                .complete_in(&mut tx, &attempt, &ticket())
                .await
                .unwrap();
            tx.commit().await.unwrap();
            attempt.mark_recorded();
        }
    }
    ticket()
}

/// A retry sent 10 ms after the first request of a 300 ms tool: from the first answer to the
/// retry's replay.
pub(super) async fn retry_pairs((a, b): &Pair, completion: &Completion) -> Vec<Duration> {
    let first = Executor::from_arc(a.clone()).with_policy(policy());
    let retry = Executor::from_arc(b.clone())
        .with_policy(policy())
        .waiting(Duration::from_secs(5));
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (first, retry, completion) = (first.clone(), retry.clone(), completion.clone());
                tokio::spawn(async move {
                    let (scope, key, fp) = ids("retry", batch * BATCH + i);
                    let (started, running) = tokio::sync::oneshot::channel();
                    let holder = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            first
                                .run(&scope, &key, &fp, |attempt| async {
                                    let _ = started.send(());
                                    tool(attempt, completion).await
                                })
                                .await
                                .unwrap();
                            Instant::now()
                        })
                    };
                    // 10 ms after the first request began to run (on a busy machine a fixed
                    // 10 ms from its spawn could come before its claim).
                    running.await.unwrap();
                    tokio::time::sleep(RETRY_AFTER).await;
                    let again = retry
                        .run(&scope, &key, &fp, |_| async { unreachable!() })
                        .await
                        .unwrap();
                    let answered = Instant::now();
                    assert!(again.is_replay());
                    answered.saturating_duration_since(holder.await.unwrap())
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.unwrap());
        }
    }
    out
}
