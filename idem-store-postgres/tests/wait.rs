//! Waking waiting requests with `LISTEN/NOTIFY` ([contract §5.2](idem_core::contract#waiting)),
//! across two store handles on their own pools (as two processes would be), against the server
//! named by `IDEM_TEST_POSTGRES_URL`.
//!
//! The store-level cases wait on a [`Timer`] that never fires: the waiting store's polls (its
//! safety net included) never run, so a wait that ends was ended by a notification. The cases of
//! a completion in the caller's transaction ([contract §6](idem_core::contract#transactional-completion))
//! wait through the executor on a timer whose every sleep lasts a minute, far past their hang
//! guard, and which reports each poll pause it is asked for: a waiter asks for one only once it
//! has read the record in flight, and the holder commits after that, never before. One waiter is
//! in the holder's process, on the holder's own store; the other in a second process (this test
//! binary again, `--exact <test>` with `IDEM_PG_WAIT_CHILD` set).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::{
    Attempt, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, Outcome, Policy,
    RecordId, Scope, StalePolicy, SystemClock, Timer, Timestamp, Token,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx;
use serde_json::json;

/// A guard against a hang, never a measure: the cases finish in milliseconds.
const HANG: Duration = Duration::from_secs(20);

fn never() -> Timer {
    Timer::new(|_| Box::pin(std::future::pending()))
}

fn policy(stale: StalePolicy) -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .stale(stale)
        .build()
        .unwrap()
}

fn ids(test: &str) -> (Scope, IdempotencyKey, Fingerprint) {
    (
        Scope::new(common::unique(test)).unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

fn ticket() -> Outcome {
    Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap()
}

/// Two handles, `a` (the writer) and `b` (the waiter), each on a pool of its own.
async fn two(app: &str) -> Option<(PostgresStore, PostgresStore)> {
    let url = common::url()?;
    Some((
        common::store(&url, &format!("{app}-a")).await,
        common::store(&url, &format!("{app}-b")).await,
    ))
}

async fn claim(
    store: &PostgresStore,
    ids: &(Scope, IdempotencyKey, Fingerprint),
    p: &Policy,
    now: Timestamp,
) -> Token {
    match store
        .claim(&RecordId::new(ids.0.clone(), ids.1.clone()), &ids.2, p, now)
        .await
        .unwrap()
    {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Starts `b`'s wait on the record as it is now; returns once it is registered.
async fn wait_on(
    b: &PostgresStore,
    ids: &(Scope, IdempotencyKey, Fingerprint),
    clock: &ManualClock,
) -> tokio::task::JoinHandle<()> {
    use idem_core::Clock;
    let seen = b
        .get(&RecordId::new(ids.0.clone(), ids.1.clone()), clock.now())
        .await
        .unwrap()
        .expect("a record");
    let (b2, clock2) = (b.clone(), clock.clone());
    let task = tokio::spawn(async move {
        b2.wait_for_change(&seen, &clock2, &never()).await.unwrap();
    });
    while b.wait_subscriptions() == 0 {
        tokio::task::yield_now().await;
    }
    task
}

async fn woken(task: tokio::task::JoinHandle<()>, by: &str) {
    tokio::time::timeout(HANG, task)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not woken by the {by}"))
        .unwrap();
}

/// A direct session listening on the channel every store notifies on (`idem_changes`).
async fn channel_listener(app: &str) -> sqlx::postgres::PgListener {
    let direct = common::pool(&common::url().unwrap(), app, 1).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&direct)
        .await
        .unwrap();
    listener.listen("idem_changes").await.unwrap();
    listener
}

/// Sends a notification of its own on the channel and reads `listener` up to it: none for the
/// record of `ids` came first (notifications arrive in commit order, so one sent by a write that
/// committed before would have).
async fn nothing_notified_for(
    listener: &mut sqlx::postgres::PgListener,
    ids: &(Scope, IdempotencyKey, Fingerprint),
) {
    let sentinel = common::unique("sentinel");
    let direct = common::pool(&common::url().unwrap(), "wait-sentinel", 1).await;
    sqlx::query("SELECT pg_notify('idem_changes', $1)")
        .bind(&sentinel)
        .execute(&direct)
        .await
        .unwrap();
    let before = notified_before(listener, &sentinel).await;
    assert!(
        !before.contains(&payload(&ids.0, &ids.1)),
        "the record's waiters were notified"
    );
}

#[tokio::test]
async fn a_waiter_on_another_store_wakes_on_completion_release_and_takeover() {
    let Some((a, b)) = two("wait-kinds").await else {
        return;
    };
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let p = policy(StalePolicy::Takeover);
    use idem_core::Clock;

    // Completion.
    let ids = ids("wait-complete");
    let token = claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    let done = a
        .complete(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            token,
            &ticket(),
            &p,
            clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
    woken(waiter, "completion").await;

    // Release.
    let ids = self::ids("wait-release");
    let token = claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    let released = a
        .release(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            token,
            clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(released, ReleaseAnswer::Released);
    woken(waiter, "release").await;

    // Takeover: the lease ends, a third handle's claim replaces the processing record.
    let ids = self::ids("wait-takeover");
    claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    clock.advance(Duration::from_secs(31));
    let c = common::store(&common::url().unwrap(), "wait-kinds-c").await;
    claim(&c, &ids, &p, clock.now()).await;
    woken(waiter, "takeover").await;
    assert_eq!(b.wait_subscriptions(), 0, "nothing left registered");
}

#[tokio::test]
async fn a_completion_in_the_callers_transaction_wakes_only_at_commit() {
    let Some((a, b)) = two("wait-tx").await else {
        return;
    };
    use idem_core::Clock;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let p = policy(StalePolicy::Reconcile);
    let ids = ids("wait-tx");
    let token = claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    let mut listener = channel_listener("wait-tx").await;
    let attempt = common::attempt(&a, &ids.0, &ids.1, token, &p, clock.now());
    let mut tx = a.pool().begin().await.unwrap();
    let answer = a.complete_in(&mut tx, &attempt, &ticket()).await.unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    // Not before the commit: the waiter wakes only by notification (its timer never fires), and
    // none for the record precedes a notification sent after the uncommitted completion.
    nothing_notified_for(&mut listener, &ids).await;
    assert!(!waiter.is_finished(), "woken before the commit");
    tx.commit().await.unwrap();
    woken(waiter, "commit").await;
}

#[tokio::test]
async fn a_rolled_back_completion_wakes_nobody_and_a_later_release_does() {
    let Some((a, b)) = two("wait-rollback").await else {
        return;
    };
    use idem_core::Clock;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let p = policy(StalePolicy::Reconcile);
    let ids = ids("wait-rollback");
    let token = claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    let mut listener = channel_listener("wait-rollback").await;
    let attempt = common::attempt(&a, &ids.0, &ids.1, token, &p, clock.now());
    let mut tx = a.pool().begin().await.unwrap();
    a.complete_in(&mut tx, &attempt, &ticket()).await.unwrap();
    tx.rollback().await.unwrap();
    nothing_notified_for(&mut listener, &ids).await;
    assert!(!waiter.is_finished(), "woken by a rolled-back completion");
    a.release(
        &RecordId::new(ids.0.clone(), ids.1.clone()),
        token,
        clock.now(),
    )
    .await
    .unwrap();
    woken(waiter, "release").await;
}

/// Tickets created at the sink.
#[derive(Debug, Default)]
struct Sink(AtomicUsize);

impl Sink {
    fn create_ticket(&self) -> Outcome {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Outcome::definitive(201, &json!({"ticket": format!("T-{n}")})).unwrap()
    }
}

/// Listening connections of `app` on the server.
async fn listening(admin: &sqlx::PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

#[tokio::test]
async fn fifty_waiters_in_one_process_share_one_listen_and_each_gets_the_replay() {
    let Some(url) = common::url() else { return };
    let app_b = common::unique("wait-fifty-b");
    let (a, b) = (
        common::store(&url, "wait-fifty-a").await,
        common::store(&url, &app_b).await,
    );
    let admin = common::pool(&url, "wait-fifty-admin", 1).await;
    let ids = ids("wait-fifty");
    let p = policy(StalePolicy::Reconcile);
    let sink = Arc::new(Sink::default());
    let first = Executor::new(a).with_policy(p).with_clock(SystemClock);
    let (finish, hold) = tokio::sync::oneshot::channel::<()>();
    let (started, running) = tokio::sync::oneshot::channel();
    let first = {
        let (sink, ids) = (sink.clone(), ids.clone());
        tokio::spawn(async move {
            first
                .run(&ids.0, &ids.1, &ids.2, |_| async move {
                    started.send(()).unwrap();
                    hold.await.unwrap();
                    sink.create_ticket()
                })
                .await
        })
    };
    running.await.unwrap();
    // Each waiter asks its timer for its wait's bound once, as it starts to wait: that call says
    // it has arrived. Otherwise the timer is tokio's: the waits' own clock (their bound, the
    // store's safety poll), which decides nothing here, since the completion ends every wait.
    const BOUND: Duration = Duration::from_secs(15);
    let arrived = Arc::new(tokio::sync::Semaphore::new(0));
    let timer = {
        let arrived = arrived.clone();
        Timer::new(move |d| {
            if d == BOUND {
                arrived.add_permits(1);
            }
            Box::pin(tokio::time::sleep(d))
        })
    };
    let waiting = Executor::new(b.clone())
        .with_policy(p)
        .with_clock(SystemClock)
        .with_timer(timer)
        .waiting(BOUND);
    let waiters: Vec<_> = (0..50)
        .map(|_| {
            let (exec, sink, ids) = (waiting.clone(), sink.clone(), ids.clone());
            tokio::spawn(async move {
                exec.run(
                    &ids.0,
                    &ids.1,
                    &ids.2,
                    |_| async move { sink.create_ticket() },
                )
                .await
            })
        })
        .collect();
    // Every waiter has arrived, and the store's one wait has registered.
    tokio::time::timeout(HANG, async {
        let _ = arrived.acquire_many(50).await.unwrap();
        while b.wait_subscriptions() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiters arrive");
    assert_eq!(b.wait_subscriptions(), 1, "one registration for 50 waiters");
    assert_eq!(b.listen_connections_opened(), 1, "one LISTEN connection");
    assert_eq!(
        listening(&admin, &app_b).await,
        1,
        "one listening session on the server"
    );
    finish.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    for waiter in waiters {
        let again = tokio::time::timeout(HANG, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(again.is_replay());
        assert_eq!(again.outcome(), first.outcome());
    }
    assert_eq!(
        sink.0.load(Ordering::SeqCst),
        1,
        "one ticket for 51 requests"
    );
    assert_eq!(b.wait_subscriptions(), 0);
}

#[tokio::test]
async fn a_dropped_waiter_leaves_no_record_change_and_no_registration() {
    let Some((a, b)) = two("wait-drop").await else {
        return;
    };
    use idem_core::Clock;
    let ids = ids("wait-drop");
    let p = policy(StalePolicy::Reconcile);
    let token = claim(&a, &ids, &p, SystemClock.now()).await;
    let before = a
        .get(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            SystemClock.now(),
        )
        .await
        .unwrap();
    let sink = Arc::new(Sink::default());
    let waiter = {
        let exec = Executor::new(b.clone())
            .with_policy(p)
            .with_clock(SystemClock)
            .waiting(Duration::from_secs(15));
        let (sink, ids) = (sink.clone(), ids.clone());
        tokio::spawn(async move {
            exec.run(
                &ids.0,
                &ids.1,
                &ids.2,
                |_| async move { sink.create_ticket() },
            )
            .await
        })
    };
    while b.wait_subscriptions() == 0 {
        tokio::task::yield_now().await;
    }
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(b.wait_subscriptions(), 0, "unregistered");
    let after = a
        .get(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            SystemClock.now(),
        )
        .await
        .unwrap();
    assert_eq!(before, after, "no record change");
    assert_eq!(sink.0.load(Ordering::SeqCst), 0, "nothing ran");
    // The holder still completes as usual.
    let done = a
        .complete(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            token,
            &ticket(),
            &p,
            SystemClock.now(),
        )
        .await
        .unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
}

#[tokio::test]
async fn a_waiter_survives_its_listen_connection_being_killed() {
    let Some(url) = common::url() else { return };
    let app_b = common::unique("wait-kill-b");
    let (a, b) = (
        common::store(&url, "wait-kill-a").await,
        common::store(&url, &app_b).await,
    );
    let admin = common::pool(&url, "wait-kill-admin", 1).await;
    use idem_core::Clock;
    let clock = SystemClock;
    let p = policy(StalePolicy::Reconcile);
    let ids = ids("wait-kill");
    let token = claim(&a, &ids, &p, clock.now()).await;
    let seen = b
        .get(&RecordId::new(ids.0.clone(), ids.1.clone()), clock.now())
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let (b, ids) = (b.clone(), ids.clone());
        tokio::spawn(async move {
            // Woken by the drop (it may have missed a notification), it waits again, as the
            // executor's round does, until the record changed.
            loop {
                b.wait_for_change(&seen, &SystemClock, &Timer::tokio())
                    .await
                    .unwrap();
                let now = b
                    .get(
                        &RecordId::new(ids.0.clone(), ids.1.clone()),
                        SystemClock.now(),
                    )
                    .await
                    .unwrap();
                if idem_core::wait::changed(&seen, now.as_ref()) {
                    return;
                }
            }
        })
    };
    while listening(&admin, &app_b).await == 0 || b.wait_subscriptions() == 0 {
        tokio::task::yield_now().await;
    }
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(&app_b)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(killed, 1);
    a.complete(
        &RecordId::new(ids.0.clone(), ids.1.clone()),
        token,
        &ticket(),
        &p,
        clock.now(),
    )
    .await
    .unwrap();
    tokio::time::timeout(HANG, waiter)
        .await
        .expect("the waiter did not hang")
        .unwrap();
    // The store listens again.
    while listening(&admin, &app_b).await == 0 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn without_notifications_a_waiter_polls() {
    let Some((a, b)) = two("wait-poll").await else {
        return;
    };
    let b = b.with_notifications(false);
    use idem_core::Clock;
    let p = policy(StalePolicy::Reconcile);
    let ids = ids("wait-poll");
    let token = claim(&a, &ids, &p, SystemClock.now()).await;
    let seen = b
        .get(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            SystemClock.now(),
        )
        .await
        .unwrap()
        .unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.wait_for_change(&seen, &SystemClock, &Timer::tokio())
                .await
                .unwrap()
        })
    };
    a.complete(
        &RecordId::new(ids.0.clone(), ids.1.clone()),
        token,
        &ticket(),
        &p,
        SystemClock.now(),
    )
    .await
    .unwrap();
    tokio::time::timeout(HANG, waiter).await.unwrap().unwrap();
    assert_eq!(b.listen_connections_opened(), 0, "no LISTEN connection");
}

/// How long a waiter of the transactional cases may wait; every sleep of [`minute_timer`] is
/// longer than this, and so is [`HANG`].
const WAIT: Duration = Duration::from_secs(10);
const CHILD_ENV: &str = "IDEM_PG_WAIT_CHILD";

/// A timer whose every sleep lasts at least a minute, which calls `polling` at each sleep shorter
/// than the wait (a poll's pause: the other sleeps are the wait's bound and the holder's lease).
fn minute_timer(polling: impl Fn() + Send + Sync + 'static) -> Timer {
    Timer::new(move |d| {
        if d < WAIT {
            polling();
        }
        Box::pin(tokio::time::sleep(d.max(Duration::from_secs(60))))
    })
}

/// The holder's operation: once the waiter reports it parked (`parked`), inserts the effect and
/// completes the record in one transaction, commits, marks the attempt recorded, and returns
/// only once the waiter has its answer (`answered`): still running, only the commit can have
/// woken the waiter.
async fn effect_in_transaction(
    store: &PostgresStore,
    attempt: Attempt,
    parked: impl Future<Output = ()>,
    answered: impl Future<Output = ()>,
) -> Outcome {
    tokio::time::timeout(HANG, parked)
        .await
        .expect("the waiter parks");
    let mut tx = store.pool().begin().await.unwrap();
    // Unnamed, as a caller's own statements must be behind a transaction pooler (the store's
    // README): a named one would outlive the transaction on the client connection.
    sqlx::query("INSERT INTO idem_test.effects (scope, key, executor) VALUES ($1, $2, 'holder')")
        .bind(attempt.scope().as_str())
        .bind(attempt.key().as_str())
        .persistent(false)
        .execute(&mut *tx)
        .await
        .unwrap();
    let answer = store
        .complete_in(&mut tx, &attempt, &ticket())
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    tx.commit().await.unwrap();
    attempt.mark_recorded();
    tokio::time::timeout(HANG, answered)
        .await
        .expect("the waiter answered while the holder still ran");
    ticket()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_in_the_callers_transaction_wakes_a_waiter_of_this_process_at_commit() {
    let Some(url) = common::url() else { return };
    let store = common::store(&url, "wait-commit-here").await;
    // The test's own statements on a direct connection: the store's may go through a pooler.
    let direct = common::pool(&url, "wait-commit-here", 2).await;
    common::effects_table(&direct).await;
    let ids = ids("wait-commit-here");
    let p = policy(StalePolicy::Reconcile);
    let (polling, mut parked) = tokio::sync::mpsc::unbounded_channel();
    let timer = minute_timer(move || {
        let _ = polling.send(());
    });
    let (started, running) = tokio::sync::oneshot::channel();
    let (answered, waiter_answered) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let (store, ids) = (store.clone(), ids.clone());
        let exec = Executor::new(store.clone()).with_policy(p);
        tokio::spawn(async move {
            exec.run(&ids.0, &ids.1, &ids.2, |attempt| async move {
                started.send(()).unwrap();
                let parked = async move {
                    parked.recv().await;
                };
                let answered = async move {
                    let _ = waiter_answered.await;
                };
                effect_in_transaction(&store, attempt, parked, answered).await
            })
            .await
        })
    };
    running.await.unwrap();
    let waiting = Executor::new(store.clone())
        .with_policy(p)
        .with_timer(timer)
        .waiting(WAIT);
    let again = tokio::time::timeout(HANG, async {
        let again = waiting
            .run(&ids.0, &ids.1, &ids.2, |_| async {
                unreachable!("the waiter replays")
            })
            .await;
        answered.send(()).unwrap();
        again
    })
    .await
    .expect("the waiter was woken by the commit")
    .unwrap();
    let first = holder.await.unwrap().unwrap();
    assert!(!first.is_replay());
    assert!(again.is_replay(), "the waiter replays");
    assert_eq!(again.outcome(), first.outcome());
    let effects = common::effects(&direct, ids.0.as_str(), ids.1.as_str()).await;
    assert_eq!(effects, 1, "one effect for two requests");
}

#[test]
fn a_completion_in_the_callers_transaction_wakes_a_waiter_in_another_process_at_commit() {
    const TEST: &str =
        "a_completion_in_the_callers_transaction_wakes_a_waiter_in_another_process_at_commit";
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(scope) = std::env::var(CHILD_ENV) {
        return runtime.block_on(waiting_child(scope));
    }
    let Some(url) = common::url() else { return };
    runtime.block_on(async {
        let store = common::store(&url, "wait-commit-there").await;
        // The test's own statements on a direct connection: the store's may go through a pooler.
        let direct = common::pool(&url, "wait-commit-there", 2).await;
        common::effects_table(&direct).await;
        let ids = ids("wait-commit-there");
        let p = policy(StalePolicy::Reconcile);
        // The child's lines, read on a thread of their own: it parked; its answer, which the
        // holder awaits (unit) and the test checks (the answer itself).
        let (parked_tx, parked_rx) = tokio::sync::oneshot::channel::<()>();
        let (answered_tx, answered_rx) = tokio::sync::oneshot::channel::<String>();
        let (answer_tx, answer) = tokio::sync::oneshot::channel::<String>();
        let parked = async move {
            parked_rx.await.expect("the child parks");
        };
        let answered = async move {
            let _ = answer_tx.send(answered_rx.await.expect("the child answers"));
        };
        let (started, running) = tokio::sync::oneshot::channel();
        let holder = {
            let (store, ids) = (store.clone(), ids.clone());
            let exec = Executor::new(store.clone()).with_policy(p);
            tokio::spawn(async move {
                exec.run(&ids.0, &ids.1, &ids.2, |attempt| async move {
                    started.send(()).unwrap();
                    effect_in_transaction(&store, attempt, parked, answered).await
                })
                .await
            })
        };
        running.await.unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, ids.0.as_str())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the test binary");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            let (mut parked, mut answered) = (Some(parked_tx), Some(answered_tx));
            for line in stdout.lines().map_while(Result::ok) {
                // A marker can follow the harness's "test … ... " on the same line.
                if line.contains("IDEM-PARKED") {
                    parked.take().map(|t| t.send(()));
                } else if let Some(at) = line.find("IDEM-ANSWER ") {
                    let answer = line[at + "IDEM-ANSWER ".len()..].to_owned();
                    answered.take().map(|t| t.send(answer));
                }
            }
        });
        let first = tokio::time::timeout(HANG, holder)
            .await
            .expect("the child was woken by the commit")
            .unwrap()
            .unwrap();
        assert!(!first.is_replay());
        let child_answer = answer.await.unwrap();
        assert_eq!(child_answer, format!("replay {}", first.outcome().body()));
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success(), "the waiting process failed");
        let effects = common::effects(&direct, ids.0.as_str(), ids.1.as_str()).await;
        assert_eq!(effects, 1, "one effect for two requests in two processes");
    });
}

/// The second process: waits for the answer of the scope it is given, printing `IDEM-PARKED` at
/// each poll pause and `IDEM-ANSWER replay <body>` (or what else it got) at the end.
async fn waiting_child(scope: String) {
    let url = common::url().expect("the parent had a URL");
    let store = common::store(&url, "wait-commit-child").await;
    let timer = minute_timer(|| println!("IDEM-PARKED"));
    let key = IdempotencyKey::new("wf-1:step-1").unwrap();
    let fp = Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap();
    let again = Executor::new(store)
        .with_policy(policy(StalePolicy::Reconcile))
        .with_timer(timer)
        .waiting(WAIT)
        .run(&Scope::new(scope).unwrap(), &key, &fp, |_| async {
            unreachable!("the waiter replays")
        })
        .await;
    match again {
        Ok(again) if again.is_replay() => {
            println!("IDEM-ANSWER replay {}", again.outcome().body())
        }
        other => println!("IDEM-ANSWER {other:?}"),
    }
}

/// The notification payload of (scope, key) in the test table: FNV-1a 64 of the quoted table
/// name, scope and key, each followed by 0x1f, in 16 hex digits (`wake::payload`, stable across
/// versions: every process of a deployment must compute it alike).
fn payload(scope: &Scope, key: &IdempotencyKey) -> String {
    let table = format!("\"{}\".\"{}\"", common::SCHEMA, common::TABLE);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [table.as_str(), scope.as_str(), key.as_str()] {
        for &b in part.as_bytes().iter().chain(&[0x1f]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// Reads `listener` until `until` arrives; returns every payload before it.
async fn notified_before(listener: &mut sqlx::postgres::PgListener, until: &str) -> Vec<String> {
    let mut before = Vec::new();
    loop {
        let n = tokio::time::timeout(HANG, listener.recv())
            .await
            .unwrap_or_else(|_| panic!("no notification {until}"))
            .unwrap();
        if n.payload() == until {
            return before;
        }
        before.push(n.payload().to_owned());
    }
}

#[tokio::test]
async fn only_the_writes_of_a_record_a_waiter_marked_notify() {
    let Some((a, b)) = two("wait-marked").await else {
        return;
    };
    let url = common::url().unwrap();
    let direct = common::pool(&url, "wait-marked", 2).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&direct)
        .await
        .unwrap();
    listener.listen("idem_changes").await.unwrap();
    use idem_core::Clock;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let p = policy(StalePolicy::Takeover);

    // Nobody waits: a completion, a release and a takeover write their records and notify
    // nobody (notifications arrive in commit order: one sent would come before the sentinel).
    let (done, released, taken) = (ids("quiet-done"), ids("quiet-released"), ids("quiet-taken"));
    let token = claim(&a, &done, &p, clock.now()).await;
    let answer = a
        .complete(
            &RecordId::new(done.0.clone(), done.1.clone()),
            token,
            &ticket(),
            &p,
            clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    let token = claim(&a, &released, &p, clock.now()).await;
    let answer = a
        .release(
            &RecordId::new(released.0.clone(), released.1.clone()),
            token,
            clock.now(),
        )
        .await
        .unwrap();
    assert_eq!(answer, ReleaseAnswer::Released);
    claim(&a, &taken, &p, clock.now()).await;
    clock.advance(Duration::from_secs(31));
    claim(&b, &taken, &p, clock.now()).await;
    let sentinel = done.0.as_str().to_owned();
    sqlx::query("SELECT pg_notify('idem_changes', $1)")
        .bind(&sentinel)
        .execute(&direct)
        .await
        .unwrap();
    let quiet = [&done, &released, &taken].map(|ids| payload(&ids.0, &ids.1));
    let before = notified_before(&mut listener, &sentinel).await;
    for (ids, payload) in quiet.iter().enumerate() {
        assert!(
            !before.contains(payload),
            "write {ids} of a record nobody waited on notified"
        );
    }

    // A waiter marks the record: its completion notifies, and the waiter wakes.
    let loud = ids("loud");
    let token = claim(&a, &loud, &p, clock.now()).await;
    let waiter = wait_on(&b, &loud, &clock).await;
    let marked = async {
        loop {
            let marked: bool = sqlx::query_scalar(
                "SELECT waited FROM idem_test.idem_records WHERE scope = $1 AND key = $2",
            )
            .bind(loud.0.as_str())
            .bind(loud.1.as_str())
            .fetch_one(&direct)
            .await
            .unwrap();
            if marked {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(HANG, marked)
        .await
        .expect("the waiter marks the record");
    a.complete(
        &RecordId::new(loud.0.clone(), loud.1.clone()),
        token,
        &ticket(),
        &p,
        clock.now(),
    )
    .await
    .unwrap();
    notified_before(&mut listener, &payload(&loud.0, &loud.1)).await;
    woken(waiter, "completion of a marked record").await;
}
