//! Connection faults: backends killed with `pg_terminate_backend` while the store is in use.
//!
//! Restarting the server is not an option on a shared test machine (other suites use it), so
//! faults are injected by terminating exactly this test's connections (found by their
//! `application_name`). What must hold: a caller whose connection died gets
//! `StoreError::Unavailable` (never a silent proceed), no operation's effect happens twice, and
//! every operation completes once connections can be made again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope,
    StalePolicy, StoreError, Timestamp, Token,
};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, PgPool, postgres::PgPoolOptions};

const EFFECT: &str =
    "INSERT INTO idem_test.effects (scope, key, executor) VALUES ($1, $2, 'fault')";

fn fingerprint() -> Fingerprint {
    Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap()
}

/// A store whose pool does not ping connections before handing them out, so a killed idle
/// connection surfaces as an error on the next statement instead of being replaced silently.
async fn fragile_store(url: &str, app: &str, max: u32) -> PostgresStore {
    common::store(url, app).await; // migrated
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(common::options(url, app))
        .await
        .unwrap();
    // A direct connection, said so: no pooler check, whose own two connections (under this
    // `application_name`) the kills below would count and cut.
    PostgresStore::with_table(pool, common::SCHEMA, common::TABLE)
        .unwrap()
        .with_transaction_pooler(false)
}

/// What a fault test starts from: the server's URL, the `application_name` of the store's
/// connections (the ones it kills), an admin pool that kills them, the fragile store (up to
/// `max` connections) and a scope of its own. `None` without a server (skipped).
struct Setup {
    url: String,
    app: String,
    admin: PgPool,
    store: PostgresStore,
    scope: Scope,
}

async fn setup(name: &str, max: u32) -> Option<Setup> {
    let url = common::url()?;
    let app = common::unique(&format!("idem-{name}"));
    let admin = common::pool(&url, "idem-fault-admin", 2).await;
    common::effects_table(&admin).await;
    let store = fragile_store(&url, &app, max).await;
    let scope = Scope::new(common::unique(name)).unwrap();
    Some(Setup {
        url,
        app,
        admin,
        store,
        scope,
    })
}

/// Terminates every backend of `app`; returns how many.
async fn kill_all(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Makes sure the pool holds one idle connection, then terminates it.
async fn open_then_kill(store: &PostgresStore, admin: &PgPool, app: &str) {
    drop(store.pool().acquire().await.unwrap());
    // Conditions, not sleeps: the connection is back in the pool, then its backend is gone.
    while store.pool().num_idle() < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(kill_all(admin, app).await, 1);
    while backends(admin, app).await > 0 {
        tokio::task::yield_now().await;
    }
}

async fn backends(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_one(admin)
        .await
        .unwrap()
}

/// Each store method, called on a connection that was killed while idle, answers Unavailable
/// (never a silent proceed) and the next call, on a new connection, works. The driver may notice
/// a dead connection on its own before handing it out and use a new one; then the call must
/// simply answer right. Most kills surface, and at least one must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_is_unavailable_then_recovers() {
    let Some(Setup {
        app,
        admin,
        store,
        scope,
        ..
    }) = setup("fault-idle", 1).await
    else {
        return;
    };
    let key = IdempotencyKey::new("k").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_000_000_000_000);
    let outcome = Outcome::definitive(200, &serde_json::json!({"charged": true})).unwrap();
    let mut surfaced = 0;

    // Each step: kill the idle connection, call; an error must be Unavailable and then the
    // same call on a new connection answers.
    macro_rules! after_kill {
        ($what:literal, $call:expr) => {{
            open_then_kill(&store, &admin, &app).await;
            match $call {
                Err(err) => {
                    assert!(
                        err.is_unavailable(),
                        "{} on a killed connection: {err:?}",
                        $what
                    );
                    surfaced += 1;
                    $call.unwrap()
                }
                Ok(answer) => answer,
            }
        }};
    }

    let claimed = after_kill!(
        "claim",
        store.claim(&id, &fingerprint(), &policy, now).await
    );
    let ClaimAnswer::Claimed { token, .. } = claimed else {
        panic!("a failed claim writes nothing, so the retry wins: {claimed:?}")
    };
    let extended = after_kill!(
        "extend",
        store.extend(&id, token, Duration::from_secs(60), now).await
    );
    assert!(
        matches!(extended, idem_core::machine::ExtendAnswer::Extended { .. }),
        "{extended:?}"
    );
    let record = after_kill!("get", store.get(&id, now).await);
    assert_eq!(record.map(|r| r.state), Some(RecordState::Processing));
    let completed = after_kill!(
        "complete",
        store.complete(&id, token, &outcome, &policy, now).await
    );
    assert_eq!(completed, CompleteAnswer::Completed);
    after_kill!("purge_expired", store.purge_expired(now, 1).await);
    after_kill!("list_in_flight", store.list_in_flight(now, 1).await);
    assert!(matches!(
        store
            .claim(&id, &fingerprint(), &policy, now)
            .await
            .unwrap(),
        ClaimAnswer::Replay(_)
    ));
    assert!(
        surfaced >= 1,
        "no kill surfaced as Unavailable: the fault was not injected"
    );
}

/// The connection of the caller's transaction dies between the effect and the completion: the
/// completion is Unavailable, the effect rolls back with it, and the holder's retry runs it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_inside_the_transaction_runs_the_effect_once() {
    let Some(Setup {
        admin,
        store,
        scope,
        ..
    }) = setup("fault-tx", 2).await
    else {
        return;
    };
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_000_000_000_000);
    let outcome = Outcome::definitive(201, &serde_json::json!({"id": 1})).unwrap();
    for i in 0..5 {
        let key = IdempotencyKey::new(format!("op-{i}")).unwrap();
        let ClaimAnswer::Claimed { token, .. } = store
            .claim(
                &RecordId::new(scope.clone(), key.clone()),
                &fingerprint(),
                &policy,
                now,
            )
            .await
            .unwrap()
        else {
            panic!()
        };
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query(EFFECT)
            .bind(scope.as_str())
            .bind(key.as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert!(killed);
        let err = store
            .complete_in(
                &mut tx,
                &common::attempt(&store, &scope, &key, token, &policy, now),
                &outcome,
            )
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        drop(tx);
        assert_eq!(
            common::effects(&admin, scope.as_str(), key.as_str()).await,
            0
        );

        // The holder retries with its token on a new connection.
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query(EFFECT)
            .bind(scope.as_str())
            .bind(key.as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
        let answer = store
            .complete_in(
                &mut tx,
                &common::attempt(&store, &scope, &key, token, &policy, now),
                &outcome,
            )
            .await
            .unwrap();
        assert_eq!(answer, CompleteAnswer::Completed);
        tx.commit().await.unwrap();
        assert_eq!(
            common::effects(&admin, scope.as_str(), key.as_str()).await,
            1
        );
    }
}

#[derive(Default)]
struct Tally {
    unavailable: AtomicUsize,
    effect_tx_failures: AtomicUsize,
    takeovers: AtomicUsize,
}

/// One operation, retried by its caller until done: claim (its own commit), then the effect and
/// the completion in one transaction. A claim whose answer was lost leaves an in-flight record
/// that only this caller could hold; the caller moves its clock past the lease and takes it over
/// (safe here because the effect commits only together with the completion).
async fn run_operation(store: &PostgresStore, id: &RecordId, tally: &Tally) -> Token {
    let (scope, key) = (id.scope(), id.key());
    let policy = Policy::builder()
        .stale(StalePolicy::Takeover)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut now = Timestamp::from_millis(1_100_000_000_000);
    let outcome = Outcome::definitive(201, &serde_json::json!({"key": key.as_str()})).unwrap();
    let unavailable = |e: StoreError| {
        assert!(
            e.is_unavailable(),
            "only Unavailable is acceptable here: {e:?}"
        );
        tally.unavailable.fetch_add(1, Ordering::Relaxed);
    };
    for _ in 0..10_000 {
        let token = match store.claim(id, &fingerprint(), &policy, now).await {
            Err(e) => {
                unavailable(e);
                continue;
            }
            Ok(ClaimAnswer::Replay(_)) => {
                let record = store.get(id, now).await;
                match record {
                    Ok(Some(r)) => return r.token,
                    Ok(None) => panic!("replayed but no record"),
                    Err(e) => {
                        unavailable(e);
                        continue;
                    }
                }
            }
            Ok(ClaimAnswer::InFlight { .. }) => {
                tally.takeovers.fetch_add(1, Ordering::Relaxed);
                now = now + policy.lease();
                continue;
            }
            Ok(ClaimAnswer::Claimed { token, .. }) => token,
            Ok(other) => panic!("unexpected {other:?}"),
        };
        // Effect and completion, retried with the same token until the transaction commits or
        // the claim turns out to be settled.
        loop {
            let Ok(mut tx) = store.pool().begin().await else {
                tally.effect_tx_failures.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let effect = sqlx::query(EFFECT)
                .bind(scope.as_str())
                .bind(key.as_str())
                .execute(&mut *tx)
                .await;
            if effect.is_err() {
                tally.effect_tx_failures.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match store
                .complete_in(
                    &mut tx,
                    &common::attempt(store, scope, key, token, &policy, now),
                    &outcome,
                )
                .await
            {
                Err(e) => unavailable(e),
                Ok(CompleteAnswer::Fenced) => {
                    // Settled by an earlier commit whose answer was lost: undo this effect.
                    let _ = tx.rollback().await;
                    break;
                }
                Ok(_) => {
                    if tx.commit().await.is_err() {
                        tally.effect_tx_failures.fetch_add(1, Ordering::Relaxed);
                    }
                    break; // committed or not, the claim tells on the next round
                }
            }
        }
    }
    panic!("operation {key} never completed");
}

/// Many operations run while a killer terminates this test's connections again and again: every
/// operation completes, and every effect happens exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_killed_under_load_every_operation_once() {
    let Some(Setup {
        url,
        app,
        admin,
        store,
        scope,
    }) = setup("fault-load", 4).await
    else {
        return;
    };
    const OPERATIONS: usize = 120;
    const WORKERS: usize = 8;

    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (admin, app, stop, kills) = (admin.clone(), app.clone(), stop.clone(), kills.clone());
        tokio::spawn(async move {
            // Pacing of the fault injection only; no decision of the test depends on time.
            while !stop.load(Ordering::Relaxed) {
                let n = kill_all(&admin, &app).await;
                kills.fetch_add(usize::try_from(n).unwrap(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };

    let tally = Arc::new(Tally::default());
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (store, scope, tally, next) =
                (store.clone(), scope.clone(), tally.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= OPERATIONS {
                        break;
                    }
                    let key = IdempotencyKey::new(format!("op-{i}")).unwrap();
                    run_operation(&store, &RecordId::new(scope.clone(), key.clone()), &tally).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    killer.await.unwrap();

    // Connections are back: every operation is completed, and its effect happened once.
    let check = common::store(&url, "idem-fault-admin").await;
    let now = Timestamp::from_millis(1_100_000_000_000);
    for i in 0..OPERATIONS {
        let key = IdempotencyKey::new(format!("op-{i}")).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        assert_eq!(
            common::effects(&admin, scope.as_str(), key.as_str()).await,
            1,
            "effect of {key}"
        );
        let record = check.get(&id, now).await.unwrap();
        assert!(
            record.is_some_and(|r| r.state == RecordState::Completed),
            "{key} completed"
        );
    }
    let (unavailable, kills) = (
        tally.unavailable.load(Ordering::Relaxed),
        kills.load(Ordering::Relaxed),
    );
    println!(
        "killed {kills} connections; callers saw {unavailable} Unavailable errors, {} failed effect transactions, {} takeovers of lost claims",
        tally.effect_tx_failures.load(Ordering::Relaxed),
        tally.takeovers.load(Ordering::Relaxed)
    );
    assert!(kills > 0, "the killer killed nothing");
    assert!(unavailable > 0, "no caller ever saw Unavailable");
}
