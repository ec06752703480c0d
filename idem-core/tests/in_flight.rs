//! What a call that finds its operation in flight gets ([contract §4](idem_core::contract#refusals),
//! [§5.1](idem_core::contract#keyless)): a hint to ask again when the tool's processing window
//! has passed, not the whole lease; and, under a key the tool derived (a caller that cannot ask
//! to wait), a wait for the answer without asking. On the executor over `MemoryStore`; time is
//! tokio's paused clock, which the record's clock reads too. Effects are counted at a sink.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Sink, TokioClock};
use idem_core::{
    Error, Execution, Executor, Fingerprint, IdempotencyKey, MemoryStore, Policy, Scope,
};
use serde_json::json;
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_millis(20);

/// A tool under a 30 s lease that publishes no window.
fn without_window(store: &MemoryStore, clock: &TokioClock) -> Executor {
    Executor::new(store.clone())
        .with_policy(Policy::builder().lease(LEASE).build().unwrap())
        .with_clock(clock.clone())
}

/// A 20 ms tool under a 30 s lease.
fn executor(store: &MemoryStore) -> Executor {
    without_window(store, &TokioClock(tokio::time::Instant::now())).with_processing_window(WINDOW)
}

fn scope() -> Scope {
    Scope::new("tenant/create_ticket").unwrap()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap()
}

/// The key a tool derives from the call's arguments (the caller sent none).
fn derived() -> IdempotencyKey {
    IdempotencyKey::from_arguments(&json!({"title": "t"})).unwrap()
}

fn sent() -> IdempotencyKey {
    IdempotencyKey::new("wf-1:step-1").unwrap()
}

/// Starts the first attempt of `key`; it runs until `finish` is sent, then creates a ticket.
async fn hold(
    executor: &Executor,
    key: IdempotencyKey,
    sink: &Arc<Sink>,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Execution, Error>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel();
    let (exec, sink) = (executor.clone(), sink.clone());
    let task = tokio::spawn(async move {
        exec.run(&scope(), &key, &fingerprint(), |_| async move {
            started_tx.send(()).unwrap();
            rx.await.unwrap();
            sink.create_ticket()
        })
        .await
    });
    started.await.unwrap();
    (tx, task)
}

fn retry_after(err: Error) -> Duration {
    match err {
        Error::InFlight {
            retry_after,
            stale: false,
        } => retry_after,
        other => panic!("expected in flight under a running lease, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_repeat_is_told_to_ask_again_when_the_window_has_passed_not_the_lease() {
    let store = MemoryStore::new();
    let clock = TokioClock(tokio::time::Instant::now());
    let exec = without_window(&store, &clock).with_processing_window(WINDOW);
    let sink = Arc::new(Sink::default());
    let (finish, first) = hold(&exec, sent(), &sink).await;
    tokio::time::advance(Duration::from_millis(5)).await;
    let repeat = |exec: Executor| {
        let sink = sink.clone();
        async move {
            exec.run(&scope(), &sent(), &fingerprint(), |_| async move {
                sink.create_ticket()
            })
            .await
            .unwrap_err()
        }
    };
    // Claimed 5 ms ago by a 20 ms tool: ask again in 15 ms, not in the 29.995 s of lease left.
    assert_eq!(
        retry_after(repeat(exec.clone()).await),
        Duration::from_millis(15)
    );
    // Past its window, the holder is late: one more window, still not the lease.
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(retry_after(repeat(exec.clone()).await), WINDOW);
    // A tool that publishes no window: the lease counts as its window.
    assert_eq!(
        retry_after(repeat(without_window(&store, &clock)).await),
        LEASE - Duration::from_millis(105)
    );
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(sink.count(), 1, "no repeat ran");
}

#[tokio::test(start_paused = true)]
async fn six_identical_calls_under_a_derived_key_get_six_answers_and_one_ticket() {
    let store = MemoryStore::new();
    let (exec, sink) = (executor(&store), Arc::new(Sink::default()));
    let (finish, first) = hold(&exec, derived(), &sink).await;
    // Five more, none asking to wait (a stock client cannot).
    let repeats: Vec<_> = (0..5)
        .map(|_| {
            let (exec, sink) = (exec.clone(), sink.clone());
            tokio::spawn(async move {
                exec.run(&scope(), &derived(), &fingerprint(), |_| async move {
                    sink.create_ticket()
                })
                .await
            })
        })
        .collect();
    // They found it in flight and are waiting on the store (or, were they not waited for,
    // they have already answered).
    while store.wait_subscriptions() == 0 && !repeats.iter().all(|r| r.is_finished()) {
        tokio::task::yield_now().await;
    }
    finish.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(!first.is_replay());
    for repeat in repeats {
        let answer = repeat.await.unwrap().expect("an answer, not an error");
        assert!(answer.is_replay(), "the first call's answer");
        assert_eq!(answer.outcome(), first.outcome());
    }
    assert_eq!(sink.count(), 1, "one ticket");
    assert_eq!(store.wait_subscriptions(), 0, "nothing left subscribed");
}

#[tokio::test(start_paused = true)]
async fn the_derived_key_wait_is_bounded_by_the_maximum_and_can_be_turned_off() {
    let store = MemoryStore::new();
    let sink = Arc::new(Sink::default());
    let exec = executor(&store).with_max_wait(Duration::from_secs(3));
    let (finish, first) = hold(&exec, derived(), &sink).await;
    let repeat = |exec: Executor| {
        let sink = sink.clone();
        async move {
            exec.run(&scope(), &derived(), &fingerprint(), |_| async move {
                sink.create_ticket()
            })
            .await
            .unwrap_err()
        }
    };
    let started = tokio::time::Instant::now();
    let err = repeat(exec.clone()).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(3),
        "the maximum wait"
    );
    // 3 s in: the 20 ms window is long past, one more window.
    assert_eq!(retry_after(err), WINDOW);
    // Turned off: in flight at once, as a keyed call that did not ask.
    let started = tokio::time::Instant::now();
    let err = repeat(exec.clone().with_derived_key_wait(false)).await;
    assert_eq!(started.elapsed(), Duration::ZERO, "not waited for");
    assert_eq!(retry_after(err), WINDOW);
    // A keyed call that did not ask is not waited for either.
    let (keyed_finish, keyed) = hold(&exec, sent(), &sink).await;
    let started = tokio::time::Instant::now();
    let err = exec
        .run(&scope(), &sent(), &fingerprint(), |_| async {
            sink.create_ticket()
        })
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "answered at once");
    assert_eq!(retry_after(err), WINDOW);
    finish.send(()).unwrap();
    keyed_finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    keyed.await.unwrap().unwrap();
    assert_eq!(sink.count(), 2, "one ticket per key, no repeat ran");
}
