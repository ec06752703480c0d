//! The executor over the store: effects counted at a sink (the seed's test and its variants).

use std::sync::Mutex;

use idem_core::{Error, Executor, Outcome, RecordState};
use tokio::sync::oneshot;

use super::*;
use crate::harness::Harness;

/// Where effects land: a ticket table and a business counter.
#[derive(Debug, Default)]
struct Sink {
    tickets: Mutex<Vec<String>>,
}

impl Sink {
    /// Creates a ticket (the side effect) and answers with its id.
    fn create_ticket(&self) -> Outcome {
        let mut tickets = self.tickets.lock().unwrap();
        let id = format!("T-{}", tickets.len() + 1);
        tickets.push(id.clone());
        ok(&id)
    }

    fn count(&self) -> usize {
        self.tickets.lock().unwrap().len()
    }
}

async fn executor(h: &Harness, p: Policy) -> Executor {
    Executor::from_arc(h.store().await)
        .with_policy(p)
        .with_clock(h.clock().clone())
}

/// The seed's test: same key twice → one ticket at the sink, the same outcome, the second
/// marked replayed.
pub(crate) async fn executor_same_key_twice_one_effect(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("wf-8812:step-3:create_ticket"));
    let first = exec
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    h.advance(Duration::from_secs(5));
    // The retry comes through another handle, as from another process.
    let again = executor(&h, policy())
        .await
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert_eq!(sink.count(), 1, "one ticket at the sink");
    assert!(!first.is_replay(), "the first call executes");
    assert!(again.is_replay(), "the second call is a replay");
    assert_eq!(first.outcome(), again.outcome(), "identical outcome");
    assert_eq!(again.outcome(), &ok("T-1"));
}

/// Same key, other arguments → `FingerprintMismatch`, no effect, the first outcome intact.
pub(crate) async fn executor_mismatch_runs_nothing(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("k"));
    exec.run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    let err = exec
        .run(&scope, &key, &fp("b"), |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    assert!(!err.operation_ran());
    assert_eq!(sink.count(), 1, "no second ticket");
    let replay = exec
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert_eq!(replay.outcome(), &ok("T-1"));
}

/// A repeat while the first call runs → `InFlight` with a positive wait, no effect.
pub(crate) async fn executor_in_flight_runs_nothing(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("k"));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (exec, sink, scope, key) = (exec.clone(), sink.clone(), scope.clone(), key.clone());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp("a"), |_| async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                sink.create_ticket()
            })
            .await
        })
    };
    started_rx.await.unwrap();
    let err = exec
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InFlight { stale: false, retry_after } if retry_after > Duration::ZERO),
        "{err:?}"
    );
    finish_tx.send(()).unwrap();
    assert!(!first.await.unwrap().unwrap().is_replay());
    assert_eq!(sink.count(), 1);
}

/// After the record expires (clock past the ttl) exactly one new effect happens, then replays.
pub(crate) async fn executor_expired_record_runs_once_more(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("k"));
    exec.run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    h.advance(TTL + Duration::from_secs(1));
    let second = exec
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert!(
        !second.is_replay(),
        "an expired record is absent: the call runs"
    );
    let third = exec
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert!(third.is_replay());
    assert_eq!(sink.count(), 2, "exactly one new ticket after expiry");
    assert_eq!(third.outcome(), &ok("T-2"));
}

/// A retryable failure, then a retry: exactly one successful effect, then replays.
pub(crate) async fn executor_retryable_failure_then_one_success(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("k"));
    let id = RecordId::new(scope.clone(), key.clone());
    let failed = exec
        .run(&scope, &key, &fp("a"), |_| async { retryable() })
        .await
        .unwrap();
    assert_eq!(failed.outcome(), &retryable());
    let r = exec.store().get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(r.state, RecordState::FailedRetryable);
    let sink2 = sink.clone();
    let success = exec
        .run(&scope, &key, &fp("a"), |a| async move {
            assert_eq!(a.number(), 2, "the retry is attempt 2");
            sink2.create_ticket()
        })
        .await
        .unwrap();
    assert!(!success.is_replay());
    for _ in 0..3 {
        let replay = exec
            .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
            .await
            .unwrap();
        assert!(replay.is_replay());
    }
    assert_eq!(sink.count(), 1, "exactly one successful ticket");
}

/// Holder A stalls past its lease; B takes over and completes; A finishes late and is `Fenced`:
/// its outcome is not stored and B's stands.
pub(crate) async fn executor_fenced_holder_cannot_overwrite(h: Harness) {
    let p = takeover();
    let (a, b) = (executor(&h, p).await, executor(&h, p).await);
    let (scope, key) = (h.scope("tool"), h.key("k"));
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let slow = {
        let (scope, key) = (scope.clone(), key.clone());
        tokio::spawn(async move {
            a.run(&scope, &key, &fp("a"), |_| async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                ok("from-A")
            })
            .await
        })
    };
    started_rx.await.unwrap();
    h.advance(LEASE + Duration::from_secs(1));
    let taken = b
        .run(&scope, &key, &fp("a"), |attempt| async move {
            assert_eq!(attempt.number(), 2);
            ok("from-B")
        })
        .await
        .unwrap();
    assert_eq!(taken.outcome(), &ok("from-B"));
    finish_tx.send(()).unwrap();
    match slow.await.unwrap() {
        Err(Error::Fenced { outcome }) => assert_eq!(*outcome, ok("from-A")),
        other => panic!("the stale holder must be fenced, got {other:?}"),
    }
    let id = RecordId::new(scope.clone(), key.clone());
    let r = b.store().get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        r.outcome,
        Some(ok("from-B")),
        "the newer holder's result stands"
    );
    let replay = b
        .run(&scope, &key, &fp("a"), |_| async { ok("never") })
        .await
        .unwrap();
    assert_eq!(replay.outcome(), &ok("from-B"));
}

/// A slow operation outlives its lease and nobody takes over: its outcome is still recorded
/// (never lost, the key never left `processing`), and the repeat replays it without a second
/// effect at the sink.
pub(crate) async fn executor_slow_holder_past_its_lease_is_recorded(h: Harness) {
    let (exec, sink) = (executor(&h, policy()).await, Arc::new(Sink::default()));
    let (scope, key) = (h.scope("tool"), h.key("wf-3:step-1:create_ticket"));
    let id = RecordId::new(scope.clone(), key.clone());
    let first = exec
        .run(&scope, &key, &fp("a"), |_| {
            let (h, sink) = (h.clone(), sink.clone());
            async move {
                // The work takes longer than the lease.
                h.advance(LEASE + Duration::from_secs(10));
                sink.create_ticket()
            }
        })
        .await;
    match &first {
        Ok(e) if !e.is_replay() => assert_eq!(e.outcome(), &ok("T-1")),
        other => panic!("a holder whose lease elapsed, not taken over, completes: {other:?}"),
    }
    let r = read_back(&h, &id).await;
    assert_eq!(
        (r.state, r.outcome),
        (RecordState::Completed, Some(ok("T-1")))
    );
    let again = executor(&h, policy())
        .await
        .run(&scope, &key, &fp("a"), |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert!(again.is_replay(), "the repeat replays");
    assert_eq!(again.outcome(), &ok("T-1"));
    assert_eq!(sink.count(), 1, "one ticket at the sink");
}
