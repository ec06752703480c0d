//! [`Executor::execute`], the one pipeline every transport calls ([contract §5](idem_core::contract#http),
//! [§5.1](idem_core::contract#keyless), [§5.2](idem_core::contract#waiting)): how a call was
//! answered, the wait it asked for and the one it gets without asking (a derived key), the key
//! window of a derived key, and the operation outliving a caller that went away. On the executor
//! over `MemoryStore`, time on tokio's paused clock; effects are counted at a sink.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Sink, TokioClock};
use idem_core::{
    Call, Executor, Fingerprint, IdempotencyKey, KeySource, KeyStore, MemoryStore, Outcome, Policy,
    RecordId, RecordState, Refusal, Reply, Scope, Started, Tool,
};
use serde_json::json;
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(600);

const MAX_WAIT: Duration = Duration::from_secs(5);

fn executor(store: &MemoryStore) -> Executor {
    Executor::new(store.clone()).with_clock(TokioClock(tokio::time::Instant::now()))
}

fn tool() -> Tool {
    Tool::builder()
        .policy(Policy::builder().lease(LEASE).build().unwrap())
        .processing_window(Duration::from_millis(20))
        .max_wait(MAX_WAIT)
        .key_source(KeySource::arguments())
        .key_window(WINDOW)
        .build()
        .unwrap()
}

fn scope() -> Scope {
    Scope::new("tenant/create_ticket").unwrap()
}

fn call(key: IdempotencyKey) -> Call {
    let fingerprint = Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap();
    Call::new(scope(), key, fingerprint).transport("test")
}

fn derived() -> IdempotencyKey {
    IdempotencyKey::from_arguments(&json!({"title": "t"})).unwrap()
}

fn sent() -> IdempotencyKey {
    IdempotencyKey::new("wf-1:step-1").unwrap()
}

/// Starts a call of `key` whose operation runs until `finish` is sent, then creates a ticket;
/// its value is the ticket count it saw.
async fn hold(
    executor: &Executor,
    call: Call,
    sink: &Arc<Sink>,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<idem_core::Answer<usize>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel::<()>();
    let (exec, sink) = (executor.clone(), sink.clone());
    let first = tokio::spawn(async move {
        exec.execute(&tool(), call, move |_attempt| async move {
            let _ = started_tx.send(());
            let _ = rx.await;
            let outcome = sink.create_ticket();
            (sink.count(), outcome)
        })
        .await
    });
    started.await.expect("the operation started");
    (tx, first)
}

#[tokio::test(start_paused = true)]
async fn six_parallel_calls_under_a_derived_key_get_six_answers_and_one_effect() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    let exec = executor(&store);
    let (finish, first) = hold(&exec, call(derived()), &sink).await;
    let repeats: Vec<_> = (0..5)
        .map(|_| {
            let (exec, sink) = (exec.clone(), sink.clone());
            tokio::spawn(async move {
                exec.execute(&tool(), call(derived()), move |_| async move {
                    let outcome = sink.create_ticket();
                    (sink.count(), outcome)
                })
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    finish.send(()).unwrap();
    let first = first.await.unwrap();
    assert!(
        matches!(
            first.reply,
            Reply::Executed {
                value: 1,
                attempt: 1,
                unrecorded: None,
                ..
            }
        ),
        "{first:?}"
    );
    for repeat in repeats {
        let answer = repeat.await.unwrap();
        assert!(matches!(answer.reply, Reply::Replayed { .. }), "{answer:?}");
        // Waited for without asking: not reported as a wait the caller asked for.
        assert_eq!(answer.waited, None);
    }
    assert_eq!(sink.count(), 1, "one effect");
}

#[tokio::test(start_paused = true)]
async fn a_sent_key_waits_only_when_asked_and_is_told_the_bound() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    let exec = executor(&store);
    let (finish, first) = hold(&exec, call(sent()), &sink).await;

    let unasked: idem_core::Answer<usize> = exec
        .execute(&tool(), call(sent()), |_| async {
            unreachable!("in flight: never runs")
        })
        .await;
    let Reply::Refused { refusal, .. } = &unasked.reply else {
        panic!("in flight: {unasked:?}");
    };
    assert!(matches!(refusal, Refusal::InFlight { stale: false, .. }));
    assert_eq!(unasked.waited, None);

    let asked = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(
                &tool(),
                call(sent()).wait(Duration::from_secs(10)),
                |_| async { unreachable!("replayed: never runs") },
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    finish.send(()).unwrap();
    first.await.unwrap();
    let asked: idem_core::Answer<usize> = asked.await.unwrap();
    assert!(matches!(asked.reply, Reply::Replayed { .. }), "{asked:?}");
    // The least of the 10 s asked for and the 5 s maximum.
    assert_eq!(asked.waited, Some(MAX_WAIT));
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_derived_key_s_record_lives_for_the_key_window_a_sent_key_s_for_the_ttl() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    let exec = executor(&store);
    for key in [derived(), sent()] {
        let sink = sink.clone();
        let answer = exec
            .execute(&tool(), call(key.clone()), move |_| async move {
                let outcome = sink.create_ticket();
                ((), outcome)
            })
            .await;
        assert!(matches!(answer.reply, Reply::Executed { .. }));
        let now = exec.clock().now();
        let record = store
            .get(&RecordId::new(scope(), key.clone()), now)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, RecordState::Completed);
        let kept = record.expires_at.saturating_since(record.created_at);
        let expected = match key.origin() {
            idem_core::KeyOrigin::Sent => tool().policy().ttl(),
            _ => WINDOW,
        };
        assert_eq!(kept, expected, "{key}");
    }
    assert_eq!(sink.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_operation_outlives_a_caller_that_went_away() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    // Without a spawner of its own: the call still runs in a task of its own.
    let exec = executor(&store).without_spawner();
    let (finish, first) = hold(&exec, call(sent()), &sink).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    finish.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(sink.count(), 1, "the operation ran to its end");
    let now = exec.clock().now();
    let record = store
        .get(&RecordId::new(scope(), sent()), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Completed, "and was recorded");

    let again = exec
        .execute(&tool(), call(sent()), |_| async {
            unreachable!("replayed: never runs")
        })
        .await;
    let Reply::<()>::Replayed { outcome } = again.reply else {
        panic!("replayed");
    };
    assert_eq!(outcome.status(), 201);
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "the tool panicked")]
async fn a_panic_in_the_operation_is_resumed_in_the_caller() {
    let exec = executor(&MemoryStore::new());
    let _: idem_core::Answer<()> = exec
        .execute(&tool(), call(sent()), |_| async {
            panic!("the tool panicked")
        })
        .await;
}

/// [`Executor::start`]: a won claim answers at once while the operation runs on detached; the
/// same call again, in flight or done, starts nothing and answers what the record holds.
#[tokio::test(start_paused = true)]
async fn a_started_call_answers_at_its_claim_and_runs_on() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    let exec = executor(&store);
    let (finish, finished) = oneshot::channel::<()>();
    let (done_tx, done) = oneshot::channel::<()>();
    let started = {
        let sink = sink.clone();
        exec.start(&tool(), call(sent()), move |_attempt| async move {
            let _ = finished.await;
            let outcome = sink.create_ticket();
            let _ = done_tx.send(());
            outcome
        })
        .await
    };
    assert!(
        matches!(started, Started::Running { attempt: 1 }),
        "{started:?}"
    );
    let again = exec
        .start(&tool(), call(sent()), |_| async {
            unreachable!("in flight")
        })
        .await;
    let Started::Answered(answer) = again else {
        panic!("in flight: {again:?}")
    };
    assert!(matches!(
        answer.reply,
        Reply::Refused {
            refusal: Refusal::InFlight { stale: false, .. },
            ..
        }
    ));
    finish.send(()).unwrap();
    done.await.unwrap();
    let record = loop {
        let now = exec.clock().now();
        let record = store
            .get(&RecordId::new(scope(), sent()), now)
            .await
            .unwrap()
            .unwrap();
        if record.state != RecordState::Processing {
            break record;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(record.state, RecordState::Completed);
    let replayed = exec
        .start(&tool(), call(sent()), |_| async {
            unreachable!("replayed")
        })
        .await;
    assert!(matches!(
        replayed,
        Started::Answered(idem_core::Answer {
            reply: Reply::Replayed { .. },
            ..
        })
    ));
    assert_eq!(sink.count(), 1);
}

/// [`Executor::settle`]: a record nobody holds is completed with the given outcome (nothing
/// runs), and every repeat replays it; a record in flight is left to its holder.
#[tokio::test(start_paused = true)]
async fn a_settled_record_answers_its_repeats_and_a_held_one_is_not_settled() {
    let (store, sink) = (MemoryStore::new(), Arc::new(Sink::default()));
    let exec = executor(&store);
    let cancelled = Outcome::definitive_json(409, json!({"cancelled": true}));
    let settled = exec.settle(&tool(), call(sent()), cancelled.clone()).await;
    assert!(
        matches!(settled.reply, Reply::Executed { attempt: 1, .. }),
        "{settled:?}"
    );
    let again = exec
        .execute(&tool(), call(sent()), |_| async { unreachable!("settled") })
        .await;
    let Reply::<()>::Replayed { outcome } = again.reply else {
        panic!("replayed: {again:?}")
    };
    assert_eq!(outcome, cancelled);

    let other = IdempotencyKey::new("wf-2").unwrap();
    let (finish, first) = hold(&exec, call(other.clone()), &sink).await;
    let held = exec.settle(&tool(), call(other), cancelled).await;
    assert!(matches!(
        held.reply,
        Reply::Refused {
            refusal: Refusal::InFlight { .. },
            ..
        }
    ));
    finish.send(()).unwrap();
    assert!(matches!(first.await.unwrap().reply, Reply::Executed { .. }));
    assert_eq!(sink.count(), 1);
}

/// What a refused caller reads (HTTP's problem `detail`, MCP's error text): what happened and
/// what to do, with the figures it needs; a refusal that carries its reason passes it on as is.
#[test]
fn each_refusal_says_what_to_do() {
    let says = |refusal: Refusal, parts: &[&str]| {
        let detail = refusal.detail();
        for part in parts {
            assert!(detail.contains(part), "{refusal:?}: {detail}");
        }
    };
    says(
        Refusal::KeyRequired,
        &["Idempotency-Key", "the same on every retry"],
    );
    says(Refusal::BodyTooLarge { limit: 1024 }, &["1024 bytes"]);
    says(
        Refusal::FingerprintMismatch,
        &["different request", "new key"],
    );
    let in_flight = |stale| Refusal::InFlight {
        retry_after: Duration::from_secs(7),
        stale,
    };
    says(in_flight(false), &["still processing", "retry after 7 s"]);
    says(in_flight(true), &["reconciled", "retry after 7 s"]);
    says(Refusal::StoreUnavailable, &["not run", "retry later"]);
    says(Refusal::StoreError, &["not run"]);
    for refusal in [
        Refusal::InvalidKey("keys are at most 255 bytes".into()),
        Refusal::InvalidBody("expected an object".into()),
        Refusal::Unauthenticated("no bearer token".into()),
        Refusal::InvalidScope("a scope part is empty".into()),
    ] {
        let (Refusal::InvalidKey(why)
        | Refusal::InvalidBody(why)
        | Refusal::Unauthenticated(why)
        | Refusal::InvalidScope(why)) = &refusal
        else {
            unreachable!()
        };
        assert_eq!(&refusal.detail(), why);
    }
}

/// A refusal's `title` (the problem's summary for people) is its own: the two a caller most
/// often meets read as documented, and no two refusals share one.
#[test]
fn each_refusal_has_its_own_title() {
    assert_eq!(
        Refusal::FingerprintMismatch.title(),
        "Idempotency-Key reused with a different request"
    );
    assert_eq!(
        Refusal::KeyRequired.title(),
        "Idempotency-Key header required"
    );
    let all = [
        Refusal::KeyRequired,
        Refusal::InvalidKey(String::new()),
        Refusal::InvalidBody(String::new()),
        Refusal::BodyTooLarge { limit: 1 },
        Refusal::FingerprintMismatch,
        Refusal::InFlight {
            retry_after: Duration::from_secs(1),
            stale: false,
        },
        Refusal::StoreUnavailable,
        Refusal::StoreError,
        Refusal::Unauthenticated(String::new()),
        Refusal::InvalidScope(String::new()),
    ];
    let titles: std::collections::HashSet<_> = all.iter().map(Refusal::title).collect();
    assert_eq!(titles.len(), all.len(), "{titles:?}");
}
