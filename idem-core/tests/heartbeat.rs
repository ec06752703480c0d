//! Heartbeats ([contract §2](idem_core::contract#extend), [§7](idem_core::contract#traps)): while
//! an operation runs, the executor renews its lease, so a holder whose work outlives its lease is
//! not taken over while it is alive; a fenced holder learns it lost the claim; a dropped call
//! stops renewing. On `MemoryStore`, with tokio's paused clock as the records' clock too (time
//! moves only when every task is idle: no real sleeping). Effects are counted at a sink. The same
//! scenarios run on every store in the conformance suite (`heartbeat_` cases).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Sink;
use futures_util::future::{Either, select};
use idem_conformance::kit::{FaultStore, Op};
use idem_core::metrics as names;
use idem_core::{
    Attempt, Clock, Error, Execution, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore,
    Outcome, Policy, RecordId, Scope, StalePolicy, Timestamp,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

const LEASE: Duration = Duration::from_secs(30);
const SECOND: Duration = Duration::from_secs(1);

/// tokio's clock as a wall clock (moves with paused time), `ahead` of it (a process whose clock
/// runs fast).
#[derive(Debug, Clone)]
struct TokioClock {
    start: Instant,
    ahead: Duration,
}

impl TokioClock {
    fn new(start: Instant) -> Self {
        Self {
            start,
            ahead: Duration::ZERO,
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(1_700_000_000_000) + self.start.elapsed() + self.ahead
    }
}

fn ids() -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new("tenant/create_ticket").unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

/// An executor under `StalePolicy::Takeover` (a stale claim is taken over at once), on `clock`.
fn executor(store: &MemoryStore, clock: TokioClock) -> Executor {
    let policy = Policy::builder()
        .lease(LEASE)
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap();
    Executor::new(store.clone())
        .with_policy(policy)
        .with_clock(clock)
}

/// Starts a holder on `executor` whose work takes `work`, then creates a ticket; `Attempt`
/// comes back as soon as the work starts.
async fn hold(
    executor: &Executor,
    sink: &Arc<Sink>,
    work: Duration,
) -> (Attempt, tokio::task::JoinHandle<Result<Execution, Error>>) {
    let (started_tx, started) = oneshot::channel();
    let (exec, sink) = (executor.clone(), sink.clone());
    let task = tokio::spawn(async move {
        let (scope, key, fp) = ids();
        exec.run(&scope, &key, &fp, |attempt| async move {
            started_tx.send(attempt).unwrap();
            sleep(work).await;
            sink.create_ticket()
        })
        .await
    });
    (started.await.unwrap(), task)
}

/// A second caller tries to take the claim over every second until `holder` ends; the times
/// (since the start) at which it ran the operation itself.
async fn take_over_throughout(
    taker: &Executor,
    sink: &Arc<Sink>,
    holder: &tokio::task::JoinHandle<Result<Execution, Error>>,
    start: Instant,
) -> Vec<Duration> {
    let (scope, key, fp) = ids();
    let mut taken = Vec::new();
    while !holder.is_finished() {
        sleep(SECOND).await;
        match taker
            .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
            .await
        {
            Ok(Execution::Executed { .. }) => taken.push(start.elapsed()),
            Ok(Execution::Replayed { .. }) => break,
            Err(Error::InFlight { stale: false, .. }) => {}
            Err(other) => panic!("unexpected answer to the taker: {other:?}"),
        }
    }
    taken
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_work_is_twice_its_lease_is_not_taken_over_while_alive() {
    let (store, start, sink) = (
        MemoryStore::new(),
        Instant::now(),
        Arc::new(Sink::default()),
    );
    let holder_exec = executor(&store, TokioClock::new(start));
    let (attempt, holder) = hold(&holder_exec, &sink, 2 * LEASE).await;
    let claimed = attempt.lease_until();
    assert_eq!(
        claimed,
        holder_exec.clock().now() + LEASE,
        "the claim's lease"
    );

    let taker = executor(&store, TokioClock::new(start)).with_heartbeat(None);
    let taken = take_over_throughout(&taker, &sink, &holder, start).await;

    assert!(taken.is_empty(), "taken over while alive at {taken:?}");
    let ran = holder.await.unwrap().expect("the holder completes");
    assert!(!ran.is_replay());
    assert_eq!(sink.count(), 1, "one ticket at the sink");
    // Renewed every third of the lease up to the end: the renewal at 50 s moved it to 80 s.
    assert!(attempt.lease_until() >= claimed + 5 * LEASE / 3);
}

#[tokio::test(start_paused = true)]
async fn without_heartbeats_the_same_holder_is_taken_over_and_the_effect_doubles() {
    let (store, start, sink) = (
        MemoryStore::new(),
        Instant::now(),
        Arc::new(Sink::default()),
    );
    let holder_exec = executor(&store, TokioClock::new(start)).with_heartbeat(None);
    let (attempt, holder) = hold(&holder_exec, &sink, 2 * LEASE).await;
    let claimed = attempt.lease_until();

    let taker = executor(&store, TokioClock::new(start)).with_heartbeat(None);
    let taken = take_over_throughout(&taker, &sink, &holder, start).await;

    assert_eq!(taken, [LEASE], "taken over when the lease ended");
    match holder.await.unwrap() {
        Err(Error::Fenced { .. }) => {}
        other => panic!("the holder is fenced at its completion: {other:?}"),
    }
    assert_eq!(sink.count(), 2, "the double effect heartbeats prevent");
    assert_eq!(attempt.lease_until(), claimed, "never renewed");
}

#[tokio::test(start_paused = true)]
async fn a_claim_slow_to_answer_is_renewed_at_once_not_a_whole_interval_later() {
    let (start, sink) = (Instant::now(), Arc::new(Sink::default()));
    let store = FaultStore::new(MemoryStore::new());
    // The claim is written at 0 s (lease to 30 s); its answer arrives at 25 s, as from a commit
    // held up by the disk or a queue before the store.
    store.after_once(Op::Claim, |_| sleep(LEASE * 5 / 6));
    let policy = Policy::builder()
        .lease(LEASE)
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap();
    let holder_exec = Executor::new(store.clone())
        .with_policy(policy)
        .with_clock(TokioClock::new(start));
    let (attempt, holder) = hold(&holder_exec, &sink, 2 * LEASE).await;
    assert_eq!(start.elapsed(), LEASE * 5 / 6, "the claim answered late");
    // Renewed as the operation started, from 25 s to 55 s.
    sleep(SECOND).await;
    assert_eq!(
        attempt.lease_until(),
        Timestamp::from_millis(1_700_000_000_000) + LEASE * 5 / 6 + LEASE
    );

    let taker = executor(&store.inner(), TokioClock::new(start)).with_heartbeat(None);
    let taken = take_over_throughout(&taker, &sink, &holder, start).await;

    // A first renewal a third of the lease after the answer (at 35 s) would have come after the
    // taker's try at 31 s: taken over while alive, two tickets.
    assert!(taken.is_empty(), "taken over while alive at {taken:?}");
    holder.await.unwrap().expect("the holder completes");
    assert_eq!(sink.count(), 1, "one ticket at the sink");
}

/// Observations of the memory store's `extend` since the previous snapshot.
fn extends(snapshotter: &Snapshotter) -> usize {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == names::STORE_OP_SECONDS
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "op" && l.value() == "extend")
        })
        .map(|(.., value)| match value {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_fenced_holder_learns_it_lost_the_claim_and_stops_renewing() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (store, start, sink) = (
        MemoryStore::new(),
        Instant::now(),
        Arc::new(Sink::default()),
    );
    let holder_exec = executor(&store, TokioClock::new(start));
    let (learned_tx, learned) = oneshot::channel();
    let holder = {
        let (exec, sink) = (holder_exec.clone(), sink.clone());
        tokio::spawn(async move {
            let (scope, key, fp) = ids();
            exec.run(&scope, &key, &fp, |attempt| async move {
                // Long work that stops before its effect once the claim is lost.
                match select(Box::pin(sleep(10 * LEASE)), Box::pin(attempt.lost())).await {
                    Either::Left(_) => sink.create_ticket(),
                    Either::Right(_) => {
                        assert!(attempt.is_lost());
                        learned_tx.send(Instant::now()).unwrap();
                        Outcome::retryable(503, &json!({"stopped": "claim lost"})).unwrap()
                    }
                }
            })
            .await
        })
    };
    sleep(5 * SECOND).await;
    // A process whose clock runs a lease ahead sees the lease elapsed and takes the claim over.
    let skewed = TokioClock {
        start,
        ahead: LEASE,
    };
    let (scope, key, fp) = ids();
    let taken = executor(&store, skewed)
        .with_heartbeat(None)
        .run(&scope, &key, &fp, |attempt| {
            assert_eq!(attempt.number(), 2, "a takeover");
            async { sink.create_ticket() }
        })
        .await
        .unwrap();
    assert!(!taken.is_replay());
    let taken_at = Instant::now();

    let learned_at = learned.await.unwrap();
    assert!(
        learned_at - taken_at <= LEASE / 3,
        "learned at the next heartbeat"
    );
    match holder.await.unwrap() {
        Err(Error::Fenced { .. }) => {}
        other => panic!("the holder's completion is fenced: {other:?}"),
    }
    assert_eq!(sink.count(), 1, "the fenced holder made no ticket");
    extends(&snapshotter);
    sleep(10 * LEASE).await;
    assert_eq!(extends(&snapshotter), 0, "no renewal after the fence");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_stops_renewing_and_detached_work_keeps_the_old_deadline() {
    let (store, start, sink) = (
        MemoryStore::new(),
        Instant::now(),
        Arc::new(Sink::default()),
    );
    let holder_exec = executor(&store, TokioClock::new(start));
    let (detached_tx, detached) = oneshot::channel();
    let holder = {
        let exec = holder_exec.clone();
        tokio::spawn(async move {
            let (scope, key, fp) = ids();
            exec.run(&scope, &key, &fp, |attempt| async move {
                // Work handed to a task of its own, which outlives the call.
                let (done_tx, done) = oneshot::channel::<()>();
                tokio::spawn(async move {
                    sleep(10 * LEASE).await;
                    let _ = done_tx.send(());
                });
                detached_tx.send(attempt).unwrap();
                let _ = done.await;
                Outcome::definitive(200, &json!({})).unwrap()
            })
            .await
        })
    };
    let attempt = detached.await.unwrap();
    sleep(LEASE / 2).await;
    // One renewal (at 10 s) moved the deadline to 40 s; the caller goes away at 15 s.
    let renewed = attempt.lease_until();
    assert_eq!(renewed, attempt.now() - LEASE / 2 + LEASE / 3 + LEASE);
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());

    let (scope, key, fp) = ids();
    let id = RecordId::new(scope.clone(), key.clone());
    let taker = executor(&store, TokioClock::new(start)).with_heartbeat(None);
    let record = store.get(&id, attempt.now()).await.unwrap();
    assert_eq!(record.unwrap().lease_until, renewed);
    sleep(renewed.saturating_since(attempt.now())).await;
    let ran = taker
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .expect("taken over at the deadline the dropped call left");
    assert!(!ran.is_replay());
    assert_eq!(attempt.lease_until(), renewed, "nothing renewed it since");
    assert!(!attempt.is_lost(), "nobody told the detached work");
}

#[tokio::test(start_paused = true)]
async fn the_interval_is_configurable_and_a_manual_extend_moves_the_deadline_too() {
    let (store, start) = (MemoryStore::new(), Instant::now());
    let exec = executor(&store, TokioClock::new(start)).with_heartbeat(Some(5 * SECOND));
    let (scope, key, fp) = ids();
    let ran = exec
        .run(&scope, &key, &fp, |attempt| async move {
            let claimed = attempt.lease_until();
            sleep(6 * SECOND).await;
            assert_eq!(
                attempt.lease_until(),
                claimed + 5 * SECOND,
                "one beat at 5 s"
            );
            assert!(attempt.extend(2 * LEASE).await.unwrap());
            assert_eq!(attempt.lease_until(), attempt.now() + 2 * LEASE);
            Outcome::definitive(200, &json!({})).unwrap()
        })
        .await
        .unwrap();
    assert!(!ran.is_replay());
}
