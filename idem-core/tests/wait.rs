//! Waiting for an in-flight answer ([contract §5.2](idem_core::contract#waiting)), on the
//! executor over `MemoryStore` (in-process wake-ups) and over a store that implements nothing new
//! (polling). Time is tokio's paused clock, which moves only when every task is idle; the record's
//! clock reads it too, so leases end in the same time as the waits. Effects are counted at a sink.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Sink, TokioClock};
use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::metrics as names;
use idem_core::store::ListFilter;
use idem_core::{
    Clock, Error, Execution, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome,
    Policy, Record, RecordId, Scope, StalePolicy, StoreError, Timer, Timestamp, Token, async_trait,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;
use tokio::sync::oneshot;

fn policy(stale: StalePolicy) -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .stale(stale)
        .build()
        .unwrap()
}

fn ids() -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new("tenant/create_ticket").unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

fn executor(store: impl KeyStore, stale: StalePolicy) -> Executor {
    Executor::new(store)
        .with_policy(policy(stale))
        .with_clock(TokioClock(tokio::time::Instant::now()))
}

/// Starts the first attempt on `executor`; it runs until `finish` is sent, then creates a ticket.
/// It does not renew its lease (heartbeats off): a holder that is stuck or frozen, whose lease
/// runs out.
async fn hold(
    executor: &Executor,
    sink: &Arc<Sink>,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Execution, Error>>,
) {
    let (tx, rx) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel();
    let (exec, sink) = (executor.clone().with_heartbeat(None), sink.clone());
    let task = tokio::spawn(async move {
        let (scope, key, fp) = ids();
        exec.run(&scope, &key, &fp, |_| async move {
            started_tx.send(()).unwrap();
            rx.await.unwrap();
            sink.create_ticket()
        })
        .await
    });
    started.await.unwrap();
    (tx, task)
}

/// Yields until `store` has `n` subscribed waits (the waiters are parked).
async fn until_subscribed(store: &MemoryStore, n: usize) {
    while store.wait_subscriptions() != n {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiting_repeat_gets_the_replay_when_the_first_completes() {
    let store = MemoryStore::new();
    let (exec, sink) = (
        executor(store.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let waiter = {
        let exec = exec.waiting(Duration::from_secs(10));
        let sink = sink.clone();
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                .await
        })
    };
    until_subscribed(&store, 1).await;
    let parked = tokio::time::Instant::now();
    finish.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    let again = waiter.await.unwrap().unwrap();
    assert!(again.is_replay(), "the waiter replays");
    assert_eq!(first.outcome(), again.outcome());
    assert_eq!(sink.count(), 1, "one ticket");
    assert!(
        parked.elapsed() < Duration::from_millis(1),
        "woken by the notification, not a poll"
    );
    assert_eq!(store.wait_subscriptions(), 0, "nothing left subscribed");
}

#[tokio::test(start_paused = true)]
async fn without_waiting_the_repeat_is_in_flight_at_once() {
    let store = MemoryStore::new();
    let (exec, sink) = (
        executor(store.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let err = exec
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InFlight { stale: false, .. }),
        "{err:?}"
    );
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_bound_passes_and_the_waiter_is_in_flight_having_written_nothing() {
    let store = MemoryStore::new();
    let (exec, sink) = (
        executor(store.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let id = RecordId::new(scope.clone(), key.clone());
    let before = store.get(&id, Timestamp::from_millis(0)).await;
    let started = tokio::time::Instant::now();
    let err = exec
        .waiting(Duration::from_secs(2))
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InFlight { stale: false, .. }),
        "{err:?}"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "waited the bound"
    );
    let after = store.get(&id, Timestamp::from_millis(0)).await;
    assert_eq!(before.unwrap(), after.unwrap(), "the record is unchanged");
    assert_eq!(store.wait_subscriptions(), 0);
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_maximum_wait_and_the_remaining_lease_bound_the_wait() {
    let store = MemoryStore::new();
    let sink = Arc::new(Sink::default());
    let exec =
        executor(store.clone(), StalePolicy::Reconcile).with_max_wait(Duration::from_secs(3));
    assert_eq!(exec.max_wait(), Duration::from_secs(3));
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let started = tokio::time::Instant::now();
    let err = exec
        .waiting(Duration::from_secs(60))
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(3),
        "the tool's maximum"
    );

    // The holder's lease (30 s) has 27 s left: a waiter asking for 60 s under a 60 s maximum
    // waits until the lease ends, then (Reconcile) answers stale in flight.
    let started = tokio::time::Instant::now();
    let err = exec
        .clone()
        .with_max_wait(Duration::from_secs(60))
        .waiting(Duration::from_secs(60))
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InFlight { stale: true, .. }),
        "{err:?}"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(27),
        "the remaining lease"
    );
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_when_the_lease_ends_under_takeover_and_runs() {
    let store = MemoryStore::new();
    let (exec, sink) = (
        executor(store.clone(), StalePolicy::Takeover),
        Arc::new(Sink::default()),
    );
    let (_finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let started = tokio::time::Instant::now();
    let ran = exec
        .with_max_wait(Duration::from_secs(60))
        .waiting(Duration::from_secs(60))
        .run(&scope, &key, &fp, |attempt| {
            assert_eq!(attempt.number(), 2);
            async { sink.create_ticket() }
        })
        .await
        .unwrap();
    assert!(!ran.is_replay(), "the waiter ran it");
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(30),
        "at the lease's end"
    );
    assert_eq!(sink.count(), 1, "the stuck first attempt made no ticket");
    first.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_claims_a_released_record_and_runs() {
    let store = MemoryStore::new();
    let (exec, sink) = (
        executor(store.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (scope, key, fp) = ids();
    let id = RecordId::new(scope.clone(), key.clone());
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&id, &fp, exec.policy(), exec.clock().now())
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let waiter = {
        let (exec, sink) = (exec.waiting(Duration::from_secs(10)), sink.clone());
        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                .await
        })
    };
    until_subscribed(&store, 1).await;
    let released = store.release(&id, token, exec.clock().now()).await.unwrap();
    assert_eq!(released, ReleaseAnswer::Released);
    let ran = waiter.await.unwrap().unwrap();
    assert!(!ran.is_replay(), "the waiter claimed and ran");
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn fifty_waiters_share_one_subscription_and_each_gets_the_replay() {
    let store = MemoryStore::new();
    let counting = Counting::new(store.clone());
    let (exec, sink) = (
        executor(counting.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let waiters: Vec<_> = (0..50)
        .map(|_| {
            let (exec, sink) = (exec.waiting(Duration::from_secs(10)), sink.clone());
            tokio::spawn(async move {
                let (scope, key, fp) = ids();
                exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                    .await
            })
        })
        .collect();
    // Every waiter has claimed (51 claims) and the one round is subscribed.
    while counting.claims.load(Ordering::SeqCst) < 51 || store.wait_subscriptions() != 1 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.wait_subscriptions(), 1, "one subscription");
    assert_eq!(
        counting.waits.load(Ordering::SeqCst),
        1,
        "one wait on the store"
    );
    finish.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    for waiter in waiters {
        let again = waiter.await.unwrap().unwrap();
        assert!(again.is_replay());
        assert_eq!(again.outcome(), first.outcome());
    }
    assert_eq!(sink.count(), 1, "one ticket for 51 requests");
    assert_eq!(counting.waits.load(Ordering::SeqCst), 1);
    assert_eq!(store.wait_subscriptions(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_no_record_change_and_no_subscription() {
    let store = MemoryStore::new();
    let counting = Counting::new(store.clone());
    let (exec, sink) = (
        executor(counting.clone(), StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let id = RecordId::new(scope.clone(), key.clone());
    let before = store.get(&id, Timestamp::from_millis(0)).await.unwrap();
    let waiter = {
        let (exec, sink) = (exec.waiting(Duration::from_secs(10)), sink.clone());
        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                .await
        })
    };
    until_subscribed(&store, 1).await;
    assert_eq!(counting.live_waits.load(Ordering::SeqCst), 1);
    // The caller goes away mid-wait.
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(store.wait_subscriptions(), 0, "unsubscribed");
    assert_eq!(
        counting.live_waits.load(Ordering::SeqCst),
        0,
        "the store's wait is gone"
    );
    let after = store.get(&id, Timestamp::from_millis(0)).await.unwrap();
    assert_eq!(before, after, "no record change");
    assert_eq!(
        counting.writes.load(Ordering::SeqCst),
        0,
        "the waiter wrote nothing"
    );
    // Nothing else runs meanwhile: a later waiter starts a fresh round.
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_implements_nothing_new_is_polled() {
    let store = MemoryStore::new();
    let plain = Plain(store.clone());
    let (exec, sink) = (
        executor(plain, StalePolicy::Reconcile),
        Arc::new(Sink::default()),
    );
    let (finish, first) = hold(&exec, &sink).await;
    let (scope, key, fp) = ids();
    let waiter = {
        let (exec, sink) = (exec.waiting(Duration::from_secs(10)), sink.clone());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                .await
        })
    };
    // Let the waiter poll a while (paused time: this moves the clock, it does not sleep).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let done = tokio::time::Instant::now();
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    let again = waiter.await.unwrap().unwrap();
    assert!(again.is_replay());
    assert!(
        done.elapsed() <= Duration::from_millis(250),
        "within one poll at the longest pause: {:?}",
        done.elapsed()
    );
    assert_eq!(store.wait_subscriptions(), 0, "polling subscribes nothing");
    assert_eq!(sink.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn waits_are_counted_by_result_and_timed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemoryStore::new();
    let sink = Arc::new(Sink::default());
    let exec =
        executor(store.clone(), StalePolicy::Takeover).with_max_wait(Duration::from_secs(60));
    let (scope, key, fp) = ids();

    // timed_out: a 1 s wait on a running claim.
    let (finish, first) = hold(&exec, &sink).await;
    let _ = exec
        .waiting(Duration::from_secs(1))
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap_err();
    // replayed: a wait the completion ends.
    let waiter = {
        let (exec, sink) = (exec.waiting(Duration::from_secs(10)), sink.clone());
        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
        tokio::spawn(async move {
            exec.run(&scope, &key, &fp, |_| async move { sink.create_ticket() })
                .await
        })
    };
    until_subscribed(&store, 1).await;
    finish.send(()).unwrap();
    first.await.unwrap().unwrap();
    assert!(waiter.await.unwrap().unwrap().is_replay());
    // claimed: a wait the lease's end ends, under takeover.
    let other = IdempotencyKey::new("wf-1:step-2").unwrap();
    let ClaimAnswer::Claimed { .. } = store
        .claim(
            &RecordId::new(scope.clone(), other.clone()),
            &fp,
            exec.policy(),
            exec.clock().now(),
        )
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let ran = exec
        .waiting(Duration::from_secs(60))
        .run(&scope, &other, &fp, |_| async { sink.create_ticket() })
        .await
        .unwrap();
    assert!(!ran.is_replay());

    let samples = snapshotter.snapshot().into_vec();
    let count = |name: &str, result: Option<&str>| -> u64 {
        samples
            .iter()
            .filter(|(key, ..)| {
                let key = key.key();
                key.name() == name
                    && result
                        .is_none_or(|r| key.labels().any(|l| l.key() == "result" && l.value() == r))
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                DebugValue::Histogram(v) => v.len() as u64,
                DebugValue::Gauge(_) => panic!("no gauge"),
            })
            .sum()
    };
    assert_eq!(count(names::WAITS, Some("timed_out")), 1);
    assert_eq!(count(names::WAITS, Some("replayed")), 1);
    assert_eq!(count(names::WAITS, Some("claimed")), 1);
    assert_eq!(count(names::WAIT_SECONDS, None), 3);
    // One claim answer per call, whatever the wait saw in between.
    assert_eq!(count(names::CLAIMS, Some("in_flight")), 1);
    assert_eq!(count(names::CLAIMS, Some("replayed")), 1);
    assert_eq!(count(names::CLAIMS, Some("taken_over")), 1);
}

/// `MemoryStore` behind a store that forwards only the required methods: the portable wait.
#[derive(Debug, Clone)]
struct Plain(MemoryStore);

/// `MemoryStore` counting claims, writes and waits (and waits still running).
#[derive(Debug, Clone)]
struct Counting {
    inner: MemoryStore,
    claims: Arc<AtomicUsize>,
    writes: Arc<AtomicUsize>,
    waits: Arc<AtomicUsize>,
    live_waits: Arc<AtomicUsize>,
}

impl Counting {
    fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            claims: Arc::default(),
            writes: Arc::default(),
            waits: Arc::default(),
            live_waits: Arc::default(),
        }
    }
}

/// Decrements on drop: a wait still running.
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

macro_rules! forward {
    ($ty:ty, $($wait:tt)*) => {
        #[async_trait]
        impl KeyStore for $ty {
            async fn claim(
                &self,
                id: &RecordId,
                fingerprint: &Fingerprint,
                policy: &Policy,
                now: Timestamp,
            ) -> Result<ClaimAnswer, StoreError> {
                self.on_claim();
                self.inner().claim(id, fingerprint, policy, now).await
            }
            async fn complete(
                &self,
                id: &RecordId,
                token: Token,
                outcome: &Outcome,
                policy: &Policy,
                now: Timestamp,
            ) -> Result<CompleteAnswer, StoreError> {
                self.on_write();
                self.inner().complete(id, token, outcome, policy, now).await
            }
            async fn release(
                &self,
                id: &RecordId,
                token: Token,
                now: Timestamp,
            ) -> Result<ReleaseAnswer, StoreError> {
                self.on_write();
                self.inner().release(id, token, now).await
            }
            async fn extend(
                &self,
                id: &RecordId,
                token: Token,
                lease: Duration,
                now: Timestamp,
            ) -> Result<ExtendAnswer, StoreError> {
                self.on_write();
                self.inner().extend(id, token, lease, now).await
            }
            async fn get(
                &self,
                id: &RecordId,
                now: Timestamp,
            ) -> Result<Option<Record>, StoreError> {
                self.inner().get(id, now).await
            }
            async fn list_in_flight(
                &self,
                older_than: Timestamp,
                limit: usize,
            ) -> Result<Vec<Record>, StoreError> {
                self.inner().list_in_flight(older_than, limit).await
            }
            async fn list(
                &self,
                filter: &ListFilter,
                now: Timestamp,
                limit: usize,
            ) -> Result<Vec<Record>, StoreError> {
                self.inner().list(filter, now, limit).await
            }
            async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
                self.inner().purge_expired(now, limit).await
            }
            $($wait)*
        }
    };
}

impl Plain {
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    fn on_claim(&self) {}
    fn on_write(&self) {}
}

forward!(Plain,);

impl Counting {
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    fn on_claim(&self) {
        self.claims.fetch_add(1, Ordering::SeqCst);
    }
    fn on_write(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }
}

forward!(
    Counting,
    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.live_waits.fetch_add(1, Ordering::SeqCst);
        let _live = Live(self.live_waits.clone());
        self.inner.wait_for_change(seen, clock, timer).await
    }
);

/// `wake` wakes the waits of its name only; `wake_all` (what a store does when it may have missed
/// a notification: a dropped connection) wakes every wait on every name, and not a wait
/// registered after it.
#[test]
fn wake_wakes_one_name_and_wake_all_every_wait_registered_before_it() {
    use futures_util::FutureExt;
    let waiters: idem_core::wait::Waiters<String> = idem_core::wait::Waiters::new();
    let mut a = waiters.register("a".to_owned());
    let mut b1 = waiters.register("b".to_owned());
    let mut b2 = waiters.register("b".to_owned());
    waiters.wake("a");
    assert!(a.woken().now_or_never().is_some(), "a woken");
    assert!(
        b1.woken().now_or_never().is_none(),
        "b not woken by a's wake"
    );
    waiters.wake_all();
    assert!(b1.woken().now_or_never().is_some(), "b woken by wake_all");
    assert!(b2.woken().now_or_never().is_some(), "every wait of b");
    let mut later = waiters.register("b".to_owned());
    assert!(
        later.woken().now_or_never().is_none(),
        "a wait registered after wake_all waits for the next wake"
    );
}

/// `is_waited` (what a store asks before it unsubscribes a channel): a name is waited on while a
/// wait registered on it lives, woken or not, and no longer once its last wait is dropped.
#[test]
fn a_name_is_waited_on_until_its_last_wait_is_dropped() {
    let waiters: idem_core::wait::Waiters<String> = idem_core::wait::Waiters::new();
    assert!(!waiters.is_waited("a"), "nothing registered");
    let first = waiters.register("a".to_owned());
    let second = waiters.register("a".to_owned());
    assert!(waiters.is_waited("a"));
    assert!(!waiters.is_waited("b"), "only the name registered");
    waiters.wake("a");
    assert!(
        waiters.is_waited("a"),
        "a woken wait is waited on until dropped"
    );
    drop(first);
    assert!(waiters.is_waited("a"), "one wait of two dropped");
    drop(second);
    assert!(!waiters.is_waited("a"), "the last wait dropped");
    assert_eq!(waiters.waiting(), 0);
}

/// What a log shows of the waits: how many wait, and which wait a [`Waiter`] is, never the names
/// waited on (a record id names a tenant's scope and key).
#[test]
fn debug_counts_the_waits_and_numbers_each_without_the_names() {
    let waiters: idem_core::wait::Waiters<String> = idem_core::wait::Waiters::new();
    let first = waiters.register("tenant-a:k".to_owned());
    let second = waiters.register("tenant-a:k".to_owned());
    assert_eq!(format!("{first:?}"), "Waiter { n: 1, .. }");
    assert_eq!(format!("{second:?}"), "Waiter { n: 2, .. }");
    let all = format!("{waiters:?}");
    assert!(
        all.starts_with("Waiters { waiting: ") && !all.contains("tenant"),
        "{all}"
    );
}

/// `poll_every`, the safety poll a store with notifications races its notification against:
/// while the record stays as seen it sleeps `every` and reads again, and never returns; once the
/// record changed, the next read returns.
#[tokio::test]
async fn poll_every_reads_every_interval_until_the_record_changed() {
    let store = MemoryStore::new();
    let (scope, key, fp) = ids();
    let id = RecordId::new(scope, key);
    let p = policy(StalePolicy::Reconcile);
    let clock = idem_core::SystemClock;
    let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &p, clock.now()).await.unwrap()
    else {
        panic!("a claim")
    };
    let seen = store.get(&id, clock.now()).await.unwrap().unwrap();
    let slept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let timer = {
        let slept = slept.clone();
        Timer::new(move |d| {
            slept.lock().unwrap().push(d);
            Box::pin(tokio::task::yield_now())
        })
    };
    let every = Duration::from_millis(250);
    let polling = idem_core::wait::poll_every(&store, &seen, &clock, &timer, every);
    tokio::pin!(polling);
    // Twenty intervals with the record as seen: still polling.
    let twenty = async {
        while slept.lock().unwrap().len() < 20 {
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        ended = &mut polling => panic!("poll_every ended with the record unchanged: {ended:?}"),
        () = twenty => {}
    }
    assert!(slept.lock().unwrap().iter().all(|d| *d == every));
    let done = Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap();
    let completed = store.complete(&id, token, &done, &p, clock.now()).await;
    assert_eq!(completed.unwrap(), CompleteAnswer::Completed);
    polling.await.unwrap();
}

/// A caller that did not ask to wait is answered "in flight" from its one claim: no second
/// claim, no wait counted (the executor waits only for a caller that asked, under a usable
/// timer).
#[tokio::test]
async fn a_caller_that_did_not_ask_to_wait_is_answered_from_one_claim() {
    use idem_conformance::kit::{FaultStore, Op};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = FaultStore::new(MemoryStore::new());
    let (scope, key, fp) = ids();
    let p = policy(StalePolicy::Reconcile);
    let id = RecordId::new(scope.clone(), key.clone());
    let holder = store
        .inner()
        .claim(&id, &fp, &p, idem_core::SystemClock.now())
        .await;
    assert!(matches!(holder.unwrap(), ClaimAnswer::Claimed { .. }));
    let executor = Executor::new(store.clone()).with_policy(p);
    let sink = Sink::default();
    let answer = executor
        .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
        .await;
    assert!(matches!(answer, Err(Error::InFlight { .. })), "{answer:?}");
    assert_eq!(store.calls(Op::Claim), 1);
    assert_eq!(sink.count(), 0);
    let waits = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == names::WAITS)
        .count();
    assert_eq!(waits, 0, "no wait counted");
}

/// Outside a tokio runtime the default timer cannot sleep: a caller that asked to wait is
/// answered "in flight" from its one claim instead of a panic, and an operation that runs gets no
/// heartbeat (it runs to its end and is recorded).
#[test]
fn outside_a_tokio_runtime_nothing_sleeps_on_the_default_timer() {
    let store = MemoryStore::new();
    let (scope, key, fp) = ids();
    let p = policy(StalePolicy::Reconcile);
    let executor = Executor::new(store.clone())
        .with_policy(p)
        .waiting(Duration::from_secs(5));
    let id = RecordId::new(scope.clone(), key.clone());
    let sink = Sink::default();
    block_on(async {
        let holder = store
            .claim(&id, &fp, &p, idem_core::SystemClock.now())
            .await;
        assert!(matches!(holder.unwrap(), ClaimAnswer::Claimed { .. }));
        let answer = executor
            .run(&scope, &key, &fp, |_| async { sink.create_ticket() })
            .await;
        assert!(matches!(answer, Err(Error::InFlight { .. })), "{answer:?}");
        let other = IdempotencyKey::new("wf-1:step-2").unwrap();
        let ran = executor
            .run(&scope, &other, &fp, |_| async { sink.create_ticket() })
            .await;
        assert!(!ran.unwrap().is_replay());
    });
    assert_eq!(sink.count(), 1);
}

/// Runs `future` to its end on this thread, with no runtime of any kind.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
