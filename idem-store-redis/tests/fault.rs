//! Server faults: a Redis the test starts itself (on a free port, never the shared one) is
//! killed and restarted while the store is in use.
//!
//! The server runs with `--appendonly yes --appendfsync always`, so every acknowledged write is
//! on disk before its reply and survives the kill. What must hold: while the server is down every
//! call is `StoreError::Unavailable` (never a silent proceed), no operation's effect happens twice
//! (counted at the sink), and calls succeed again once it is back.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::server::TestServer;
use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Error, Executor, Fingerprint, IdempotencyKey, KeyStore, Maintenance, ManualClock, Outcome,
    Policy, RecordId, RecordState, Scope, Timestamp,
};
use idem_store_redis::RedisStore;

const DURABLE: &[&str] = &[
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--save",
    "",
];

fn fingerprint() -> Fingerprint {
    Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap()
}

/// Retries `get` until the store answers again (the connection manager reconnects in the
/// background after the server returns).
async fn until_available(store: &RedisStore, scope: &Scope, now: Timestamp) {
    let key = IdempotencyKey::new("probe").unwrap();
    for _ in 0..500 {
        match store
            .get(&RecordId::new(scope.clone(), key.clone()), now)
            .await
        {
            Ok(_) => return,
            Err(e) => assert!(e.is_unavailable(), "while reconnecting: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the store never became available again");
}

/// Every method answers Unavailable while the server is down; the claim made before the kill
/// survives the restart and its holder completes it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_unavailable_while_down_then_recovers() {
    let Some(mut server) = TestServer::start(DURABLE).await else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let scope = Scope::new(common::unique("fault")).unwrap();
    let (a, b) = (
        RecordId::new(scope.clone(), IdempotencyKey::new("a").unwrap()),
        RecordId::new(scope.clone(), IdempotencyKey::new("b").unwrap()),
    );
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_700_000_000_000);
    let outcome = Outcome::definitive(200, &serde_json::json!({"charged": true})).unwrap();
    let ClaimAnswer::Claimed { token, .. } =
        store.claim(&a, &fingerprint(), &policy, now).await.unwrap()
    else {
        panic!("a fresh key is claimed")
    };

    server.kill();
    let unavailable = |what: &str, e: idem_core::StoreError| {
        assert!(e.is_unavailable(), "{what} while the server is down: {e:?}");
    };
    unavailable(
        "claim",
        store
            .claim(&b, &fingerprint(), &policy, now)
            .await
            .unwrap_err(),
    );
    unavailable(
        "complete",
        store
            .complete(&a, token, &outcome, &policy, now)
            .await
            .unwrap_err(),
    );
    unavailable("release", store.release(&a, token, now).await.unwrap_err());
    unavailable(
        "extend",
        store
            .extend(&a, token, Duration::from_secs(60), now)
            .await
            .unwrap_err(),
    );
    unavailable("get", store.get(&a, now).await.unwrap_err());
    unavailable(
        "list_in_flight",
        store.list_in_flight(now, 10).await.unwrap_err(),
    );
    unavailable(
        "purge_expired",
        store.purge_expired(now, 10).await.unwrap_err(),
    );
    unavailable("check_config", store.check_config().await.unwrap_err());

    server.restart().await;
    until_available(&store, &scope, now).await;
    // The script cache died with the server: EVALSHA meets NOSCRIPT and loads the script again.
    let r = store
        .get(&a, now)
        .await
        .unwrap()
        .expect("the claim survived");
    assert_eq!((r.state, r.token), (RecordState::Processing, token));
    assert_eq!(
        store
            .complete(&a, token, &outcome, &policy, now)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    assert_eq!(
        store.claim(&a, &fingerprint(), &policy, now).await.unwrap(),
        ClaimAnswer::Replay(outcome)
    );
    assert!(matches!(
        store.claim(&b, &fingerprint(), &policy, now).await.unwrap(),
        ClaimAnswer::Claimed { .. }
    ));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum End {
    /// Executed or replayed: the operation's answer is stored.
    Done,
    /// The claim (or its reply) was caught by the kill: the record is `processing` and the
    /// caller is told it is in flight; reconciliation decides.
    InFlight,
    /// The operation ran but its completion failed: the record stays `processing`.
    NotRecorded,
}

/// Workers run a stream of operations through the executor while the server is killed and
/// restarted under them. Each retries on Unavailable. No operation's effect happens twice, every
/// operation whose answer was stored happened exactly once, and the ones after the restart all
/// complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_run_runs_each_operation_at_most_once() {
    const WORKERS: usize = 4;
    const KEYS_PER_WORKER: usize = 40;
    let Some(mut server) = TestServer::start(DURABLE).await else {
        return;
    };
    let scope = Scope::new(common::unique("fault-run")).unwrap();
    let clock = ManualClock::starting_now();
    let sink: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let executor = Executor::new(store)
            .with_policy(Policy::default())
            .with_clock(clock.clone());
        let (scope, sink, done, unavailable) = (
            scope.clone(),
            sink.clone(),
            done.clone(),
            unavailable.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut ends = Vec::new();
            for k in 0..KEYS_PER_WORKER {
                let key = IdempotencyKey::new(format!("w{w}-op{k}")).unwrap();
                let end = 'retry: {
                    for _ in 0..2000 {
                        let sink = sink.clone();
                        let result = executor
                            .run(&scope, &key, &fingerprint(), |attempt| async move {
                                *sink
                                    .lock()
                                    .unwrap()
                                    .entry(attempt.key().to_string())
                                    .or_default() += 1;
                                tokio::task::yield_now().await;
                                Outcome::definitive(
                                    201,
                                    &serde_json::json!({"op": attempt.key().as_str()}),
                                )
                                .unwrap()
                            })
                            .await;
                        match result {
                            Ok(_) => break 'retry End::Done,
                            Err(Error::Store(e)) if e.is_unavailable() => {
                                unavailable.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            Err(Error::InFlight { .. }) => break 'retry End::InFlight,
                            Err(Error::NotRecorded { source, .. }) if source.is_unavailable() => {
                                unavailable.fetch_add(1, Ordering::SeqCst);
                                break 'retry End::NotRecorded;
                            }
                            Err(e) => panic!("{key}: unexpected error {e:?}"),
                        }
                    }
                    panic!("{key}: the store never came back");
                };
                done.fetch_add(1, Ordering::SeqCst);
                ends.push((key, end));
            }
            ends
        }));
    }

    // Conditions, not sleeps: kill once work is under way, restart once callers have felt it.
    while done.load(Ordering::SeqCst) < 12 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.kill();
    while unavailable.load(Ordering::SeqCst) < 2 * WORKERS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.restart().await;

    let mut ends = Vec::new();
    for w in workers {
        ends.extend(w.await.unwrap());
    }
    let effects = sink.lock().unwrap().clone();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let now = idem_core::Clock::now(&clock);
    let mut tally: HashMap<End, usize> = HashMap::new();
    for (key, end) in &ends {
        *tally.entry(*end).or_default() += 1;
        let n = effects.get(key.as_str()).copied().unwrap_or(0);
        assert!(n <= 1, "{key}: the effect happened {n} times");
        let record = store
            .get(&RecordId::new(scope.clone(), key.clone()), now)
            .await
            .unwrap();
        match end {
            End::Done => {
                assert_eq!(n, 1, "{key}: answered, so it happened exactly once");
                let r = record.expect("a stored answer");
                assert_eq!(r.state, RecordState::Completed, "{key}");
            }
            End::NotRecorded => {
                assert_eq!(n, 1, "{key}: it ran");
                // Processing, or Completed when the server wrote the completion and died before
                // replying.
                let state = record.unwrap().state;
                assert_ne!(state, RecordState::FailedRetryable, "{key}");
            }
            End::InFlight => {
                assert_eq!(record.unwrap().state, RecordState::Processing, "{key}");
            }
        }
    }
    // Every operation started after the restart completes; the last one of each worker did.
    for w in 0..WORKERS {
        let last = format!("w{w}-op{}", KEYS_PER_WORKER - 1);
        assert!(
            ends.iter()
                .any(|(k, e)| k.as_str() == last && *e == End::Done),
            "{last} did not complete after the restart"
        );
    }
    assert!(unavailable.load(Ordering::SeqCst) >= 2 * WORKERS);
    eprintln!(
        "fault run: {} operations, {:?}, {} unavailable answers",
        ends.len(),
        tally,
        unavailable.load(Ordering::SeqCst)
    );
}
