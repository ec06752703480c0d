//! A race across OS processes: this test binary re-spawns itself several times; every child
//! claims the same keys at the same moment (released together by an advisory lock), and each
//! winner records an effect. Exactly one effect per key proves exactly one winner per key.

mod common;

use std::process::{Command, Stdio};

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idem_store_postgres::sqlx;

const CHILDREN: usize = 3;
const KEYS: usize = 60;
const CHILD_ENV: &str = "IDEM_RACE_CHILD";

fn key(i: usize) -> IdempotencyKey {
    IdempotencyKey::new(format!("wf-race:step-{i}")).unwrap()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({"title": "race"})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_between_processes_one_winner_per_key() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // a child runs only `race_child`
    }
    let Some(url) = common::url() else { return };
    let admin = common::pool(&url, "idem-race-admin", 2).await;
    common::store(&url, "idem-race-admin").await; // migrated before the children start
    common::effects_table(&admin).await;
    let scope = common::unique("race");
    let app = format!("idem-race-{scope}");
    let lock: i64 = rand::random::<i32>().into();
    let now = 1_262_304_000_000u64; // 2010-01-01: the store must only use the caller's time

    // Hold the starting gate.
    let mut gate = admin.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(lock)
        .execute(&mut *gate)
        .await
        .unwrap();

    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            Command::new(&exe)
                .args(["race_child", "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, i.to_string())
                .env("IDEM_RACE_SCOPE", &scope)
                .env("IDEM_RACE_APP", &app)
                .env("IDEM_RACE_LOCK", lock.to_string())
                .env("IDEM_RACE_NOW", now.to_string())
                .env("IDEM_TEST_POSTGRES_URL", &url)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a child test process")
        })
        .collect();

    // Open the gate once every child is waiting on it (a condition, not a sleep).
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .unwrap();
        if waiting == i64::try_from(CHILDREN).unwrap() {
            break;
        }
        tokio::task::yield_now().await;
    }
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(lock)
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);

    let mut wins = 0usize;
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // libtest may print "test race_child ... " on the same line.
        let reported = stdout
            .lines()
            .find_map(|l| l.split_once("race-wins=").map(|(_, n)| n.trim().to_owned()))
            .expect("the child reports its wins");
        wins += reported.parse::<usize>().unwrap();
    }

    let store = common::store(&url, "idem-race-admin").await;
    let scope = Scope::new(scope).unwrap();
    for i in 0..KEYS {
        let key = key(i);
        let id = RecordId::new(scope.clone(), key.clone());
        assert_eq!(
            common::effects(&admin, scope.as_str(), key.as_str()).await,
            1,
            "exactly one effect for {key}"
        );
        let record = store
            .get(&id, Timestamp::from_millis(now))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, RecordState::Completed);
    }
    assert_eq!(
        wins, KEYS,
        "exactly one claim won per key across all processes"
    );
}

/// Not a test on its own: the body of each child process of the race above (a no-op otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name| std::env::var(name).unwrap();
    let url = var("IDEM_TEST_POSTGRES_URL");
    let child = var(CHILD_ENV);
    let scope = Scope::new(var("IDEM_RACE_SCOPE")).unwrap();
    let lock: i64 = var("IDEM_RACE_LOCK").parse().unwrap();
    let now = Timestamp::from_millis(var("IDEM_RACE_NOW").parse().unwrap());
    let store = common::store(&url, &var("IDEM_RACE_APP")).await;
    // The test's own statements (the gate, the effects) on a direct connection: the store's may
    // go through a transaction pooler, where a session lock does not hold.
    let direct = common::pool(&url, &var("IDEM_RACE_APP"), 2).await;

    // Every connection is open before the gate, so the claims start together.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(store.pool().acquire().await.unwrap());
    }
    sqlx::query("SELECT pg_advisory_lock_shared($1), pg_advisory_unlock_shared($1)")
        .bind(lock)
        .execute(&direct)
        .await
        .unwrap();
    drop(conns);

    let policy = Policy::default();
    let tasks: Vec<_> = (0..KEYS)
        .map(|i| {
            let (store, scope, child) = (store.clone(), scope.clone(), child.clone());
            let direct = direct.clone();
            tokio::spawn(async move {
                let key = key(i);
                let id = RecordId::new(scope.clone(), key.clone());
                match store
                    .claim(&id, &fingerprint(), &policy, now)
                    .await
                    .unwrap()
                {
                    ClaimAnswer::Claimed { token, .. } => {
                        sqlx::query(
                            "INSERT INTO idem_test.effects (scope, key, executor) VALUES ($1, $2, $3)",
                        )
                        .bind(scope.as_str())
                        .bind(key.as_str())
                        .bind(format!("process-{child}"))
                        .execute(&direct)
                        .await
                        .unwrap();
                        let outcome = Outcome::definitive(201, &serde_json::json!({"by": child}))
                            .unwrap();
                        store
                            .complete(&id, token, &outcome, &policy, now)
                            .await
                            .unwrap();
                        1usize
                    }
                    ClaimAnswer::InFlight { .. } | ClaimAnswer::Replay(_) => 0,
                    other => panic!("unexpected answer {other:?}"),
                }
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += t.await.unwrap();
    }
    println!("race-wins={wins}");
}
