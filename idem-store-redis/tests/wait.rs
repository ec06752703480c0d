//! Waking waiting requests with pub/sub ([contract §5.2](idem_core::contract#waiting)), across
//! two store handles with connections of their own (as two processes would be), on the standalone
//! server of `IDEM_TEST_REDIS_URL` and the cluster of `IDEM_TEST_REDIS_CLUSTER_URLS` (sharded
//! pub/sub).
//!
//! The store-level cases wait on a [`Timer`] that never fires: the waiting store's polls (its
//! safety net included) never run, so a wait that ends was ended by a message.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ReleaseAnswer};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, Outcome, Policy, RecordId,
    Scope, StalePolicy, SystemClock, Timer, Timestamp, Token,
};
use idem_store_redis::RedisStore;
use serde_json::json;

/// A guard against a hang, never a measure: the cases finish in milliseconds.
const HANG: Duration = Duration::from_secs(20);

type Ids = (Scope, IdempotencyKey, Fingerprint);

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

fn ids(test: &str) -> Ids {
    (
        Scope::new(common::unique(test)).unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap(),
    )
}

fn ticket() -> Outcome {
    Outcome::definitive(201, &json!({"ticket": "T-1"})).unwrap()
}

/// A new handle (its own connections) on the standalone server, or on the cluster.
async fn handle(cluster: bool, prefix: &str) -> Option<RedisStore> {
    let store = if cluster {
        RedisStore::connect_cluster(&common::cluster_urls()?).await
    } else {
        RedisStore::connect(&common::url()?).await
    };
    Some(store.unwrap().with_prefix(prefix).unwrap())
}

async fn claim(store: &RedisStore, ids: &Ids, p: &Policy, now: Timestamp) -> Token {
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
async fn wait_on(b: &RedisStore, ids: &Ids, clock: &ManualClock) -> tokio::task::JoinHandle<()> {
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

async fn wakes_on_completion_release_and_takeover(cluster: bool) {
    let prefix = common::unique("wait-kinds");
    let (Some(a), Some(b), Some(c)) = (
        handle(cluster, &prefix).await,
        handle(cluster, &prefix).await,
        handle(cluster, &prefix).await,
    ) else {
        return;
    };
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let p = policy(StalePolicy::Takeover);

    let ids = self::ids("complete");
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

    let ids = self::ids("release");
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

    let ids = self::ids("takeover");
    claim(&a, &ids, &p, clock.now()).await;
    let waiter = wait_on(&b, &ids, &clock).await;
    clock.advance(Duration::from_secs(31));
    claim(&c, &ids, &p, clock.now()).await;
    woken(waiter, "takeover").await;
    assert_eq!(b.wait_subscriptions(), 0, "nothing left registered");
    assert_eq!(b.subscriber_connections_opened(), 1);
}

#[tokio::test]
async fn standalone_a_waiter_on_another_store_wakes_on_completion_release_and_takeover() {
    wakes_on_completion_release_and_takeover(false).await;
}

#[tokio::test]
async fn cluster_a_waiter_on_another_store_wakes_on_completion_release_and_takeover() {
    wakes_on_completion_release_and_takeover(true).await;
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

async fn fifty_waiters_share_one_subscription(cluster: bool) {
    let prefix = common::unique("wait-fifty");
    let (Some(a), Some(b)) = (
        handle(cluster, &prefix).await,
        handle(cluster, &prefix).await,
    ) else {
        return;
    };
    let ids = ids("fifty");
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
    // Each waiter, once its claim found the record in flight, asks the timer for its bound:
    // counted, that says how many are waiting.
    const BOUND: Duration = Duration::from_secs(15);
    let (waiting_tx, mut waiting_rx) = tokio::sync::watch::channel(0usize);
    let timer = Timer::new(move |d| {
        if d == BOUND {
            waiting_tx.send_modify(|n| *n += 1);
        }
        Box::pin(tokio::time::sleep(d))
    });
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
    tokio::time::timeout(HANG, waiting_rx.wait_for(|&n| n == 50))
        .await
        .expect("every waiter waits")
        .unwrap();
    // Their shared round subscribes once it has read the record.
    while b.wait_subscriptions() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.wait_subscriptions(), 1, "one subscription for 50 waiters");
    assert_eq!(b.subscriber_connections_opened(), 1, "one subscriber");
    if !cluster {
        // On the server: one subscriber to the record's channel.
        let client = redis::Client::open(common::url().unwrap()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(channels.len(), 1, "one channel: {channels:?}");
        let numsub: (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channels[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(numsub.1, 1, "one subscriber on the server");
    }
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
async fn standalone_fifty_waiters_in_one_process_share_one_subscription() {
    fifty_waiters_share_one_subscription(false).await;
}

#[tokio::test]
async fn cluster_fifty_waiters_in_one_process_share_one_subscription() {
    fifty_waiters_share_one_subscription(true).await;
}

#[tokio::test]
async fn a_dropped_waiter_leaves_no_record_change_and_no_subscription() {
    let prefix = common::unique("wait-drop");
    let (Some(a), Some(b)) = (handle(false, &prefix).await, handle(false, &prefix).await) else {
        return;
    };
    let ids = ids("drop");
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
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(b.wait_subscriptions(), 0, "unsubscribed");
    let after = a
        .get(
            &RecordId::new(ids.0.clone(), ids.1.clone()),
            SystemClock.now(),
        )
        .await
        .unwrap();
    assert_eq!(before, after, "no record change");
    assert_eq!(sink.0.load(Ordering::SeqCst), 0, "nothing ran");
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
async fn a_store_on_a_callers_connection_manager_polls() {
    let Some(url) = common::url() else { return };
    let prefix = common::unique("wait-manager");
    let a = handle(false, &prefix).await.unwrap();
    let manager = redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let b = RedisStore::from_connection_manager(manager)
        .with_prefix(&prefix)
        .unwrap();
    let ids = ids("manager");
    let p = policy(StalePolicy::Reconcile);
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
    assert_eq!(b.subscriber_connections_opened(), 0, "no subscriber");
}

/// The name of the one record hash under `prefix` (the tests do not know the bucket).
async fn record_key(prefix: &str) -> String {
    let url = common::url().unwrap();
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*:r:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "one record under {prefix}: {keys:?}");
    keys.into_iter().next().unwrap()
}

/// Whether the record hash `key` carries a waiter's mark.
async fn marked(key: &str) -> bool {
    let mut conn = redis::Client::open(common::url().unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("HEXISTS")
        .arg(key)
        .arg("w")
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
}

/// Counted at the sink: a subscriber to every channel of the test's keys sees a message for the
/// completion and the takeover of records a waiter marked, and none for the completion, release
/// and takeover of records nobody waits on. A message published by the test itself after the
/// writes ends the count (a server delivers to one subscriber in order).
#[tokio::test]
async fn writes_publish_only_for_a_record_a_waiter_marked() {
    let Some(url) = common::url() else { return };
    let p = policy(StalePolicy::Takeover);
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let mut sub = redis::Client::open(url.clone())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(HANG)).unwrap();
    let base = common::unique("wait-mark");
    pubsub.psubscribe(format!("{base}*")).unwrap();
    let store = |case: &str| {
        let prefix = format!("{base}-{case}");
        async move { handle(false, &prefix).await.unwrap() }
    };

    // Nobody waits: a completion, a release, a takeover.
    let a = store("complete").await;
    let ids = self::ids("quiet");
    let id = RecordId::new(ids.0.clone(), ids.1.clone());
    let token = claim(&a, &ids, &p, clock.now()).await;
    let done = a.complete(&id, token, &ticket(), &p, clock.now()).await;
    assert_eq!(done.unwrap(), CompleteAnswer::Completed);
    let a = store("release").await;
    let token = claim(&a, &ids, &p, clock.now()).await;
    let released = a.release(&id, token, clock.now()).await.unwrap();
    assert_eq!(released, ReleaseAnswer::Released);
    let a = store("takeover").await;
    claim(&a, &ids, &p, clock.now()).await;
    let later = clock.now() + Duration::from_secs(31);
    claim(&a, &ids, &p, later).await;

    // Waited: the waiter's mark is on the record before the write.
    let mut expected = Vec::new();
    for case in ["waited-complete", "waited-takeover"] {
        let prefix = format!("{base}-{case}");
        let (a, b) = (store(case).await, store(case).await);
        let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
        let token = claim(&a, &ids, &p, clock.now()).await;
        let key = record_key(&prefix).await;
        let waiter = wait_on(&b, &ids, &clock).await;
        while !marked(&key).await {
            tokio::task::yield_now().await;
        }
        if case == "waited-complete" {
            let done = a.complete(&id, token, &ticket(), &p, clock.now()).await;
            assert_eq!(done.unwrap(), CompleteAnswer::Completed);
        } else {
            clock.advance(Duration::from_secs(31));
            claim(&a, &ids, &p, clock.now()).await;
        }
        woken(waiter, case).await;
        assert!(!marked(&key).await, "{case}: the write took the mark off");
        expected.push(key);
    }

    let end = format!("{base}-end");
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&end)
        .arg("")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut published = Vec::new();
    loop {
        let channel = pubsub.get_message().unwrap().get_channel_name().to_owned();
        if channel == end {
            break;
        }
        published.push(channel);
    }
    assert_eq!(published, expected, "messages only for the marked records");
}
