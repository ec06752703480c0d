//! Across OS processes: the test binary re-spawns itself (`--exact <test>` with
//! `IDEM_SQLITE_CHILD` set) so that several processes share one database file.
//!
//! - `race_across_processes`: 4 processes claim the same 1 000 keys, released together; each
//!   winner commits one effect row on its own (as an external effect would be, so only the claim
//!   prevents a second one), then completes. Counted at the sink: exactly 1 000 effect rows, one
//!   per key. (Completion inside the effect's transaction is tested in `tests/store.rs`.)
//! - `crash_after_claim_leaves_in_flight`: a process claims a key and is killed with SIGKILL;
//!   the next attempt is told "in flight", and once the lease has elapsed (injected time) the
//!   record is on reconciliation's list.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope,
    StalePolicy, Timestamp,
};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::params;

const CHILD_ENV: &str = "IDEM_SQLITE_CHILD";
const DB_ENV: &str = "IDEM_SQLITE_CHILD_DB";
const PROCESSES: usize = 4;
const KEYS: usize = 1_000;
/// Injected time: all processes agree on it, and it is far from the wall clock on purpose.
const NOW: Timestamp = Timestamp::from_millis(1_000_000_000_000);

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({"title": "x"})).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts this test binary again, running only `test`, as child `role`.
fn spawn_child(test: &str, role: &str, db: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(DB_ENV, db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the test binary");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// Reads the child's stdout until a line carrying `marker`, and returns what follows it.
fn wait_for(out: &mut BufReader<ChildStdout>, marker: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before printing {marker}");
        if let Some(at) = line.find(marker) {
            return line[at + marker.len()..].trim().to_owned();
        }
    }
}

fn child_db() -> PathBuf {
    PathBuf::from(std::env::var_os(DB_ENV).expect("db path for the child"))
}

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

#[test]
fn race_across_processes() {
    if let Ok(role) = std::env::var(CHILD_ENV) {
        return race_child(role.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("race.sqlite3");
    let store = SqliteStore::open(&db).unwrap();
    store.migrate().unwrap();
    // No unique constraint: a second effect for a key would be counted, not refused.
    store
        .connection()
        .unwrap()
        .execute_batch("CREATE TABLE effects (key TEXT NOT NULL, worker INTEGER NOT NULL)")
        .unwrap();

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|i| spawn_child("race_across_processes", &i.to_string(), &db))
        .collect();
    // The barrier: every child has opened the store and waits on its stdin.
    for (_, out) in &mut children {
        wait_for(out, "IDEM-READY");
    }
    for (child, _) in &mut children {
        child.stdin.as_mut().unwrap().write_all(b"GO\n").unwrap();
    }
    let mut won = 0;
    for (mut child, mut out) in children {
        let report = wait_for(&mut out, "IDEM-WON");
        let (n, fenced) = report.split_once(' ').unwrap();
        let n: usize = n.parse().unwrap();
        eprintln!("a racing process won {n} keys");
        assert_eq!(fenced, "0", "a winner's completion was fenced");
        won += n;
        assert!(child.wait().unwrap().success(), "a racing process failed");
    }

    let conn = store.connection().unwrap();
    let rows = count(&conn, "SELECT count(*) FROM effects");
    let keys = count(&conn, "SELECT count(DISTINCT key) FROM effects");
    let doubled = count(
        &conn,
        "SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1)",
    );
    assert_eq!(rows, KEYS, "exactly one effect row per key");
    assert_eq!(keys, KEYS);
    assert_eq!(doubled, 0, "no key has two winners");
    assert_eq!(won, KEYS, "the processes report one win per key");
    let completed = count(
        &conn,
        "SELECT count(*) FROM idem_records WHERE state = 'completed'",
    );
    assert_eq!(completed, KEYS, "every key ended completed");
}

/// A `count(*)` query's answer (the newer rusqlite releases read no `usize`, only `i64`).
fn count(conn: &idem_store_sqlite::rusqlite::Connection, sql: &str) -> usize {
    let n: i64 = conn.query_row(sql, [], |r| r.get(0)).unwrap();
    usize::try_from(n).unwrap()
}

fn race_child(worker: i64) {
    let rt = runtime();
    let store = SqliteStore::open(child_db()).unwrap();
    println!("IDEM-READY");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "GO");

    let (won, fenced) = rt.block_on(async {
        let (scope, fp, policy) = (scope(), fp(), policy());
        let (mut won, mut fenced) = (0, 0);
        for k in 0..KEYS {
            let key = IdempotencyKey::new(format!("wf-1:step-{k}:create_ticket")).unwrap();
            let id = RecordId::new(scope.clone(), key.clone());
            match store.claim(&id, &fp, &policy, NOW).await.unwrap() {
                ClaimAnswer::Claimed { token, .. } => {
                    // The effect commits on its own, as an external effect would: only the
                    // claim stands between it and a second execution.
                    let k2 = key.clone();
                    store
                        .with_connection(move |conn| {
                            conn.execute(
                                "INSERT INTO effects (key, worker) VALUES (?1, ?2)",
                                params![k2.as_str(), worker],
                            )
                            .unwrap()
                        })
                        .await
                        .unwrap();
                    let outcome = Outcome::definitive(201, &k).unwrap();
                    match store
                        .complete(&id, token, &outcome, &policy, NOW)
                        .await
                        .unwrap()
                    {
                        CompleteAnswer::Completed => {}
                        _ => fenced += 1,
                    }
                    won += 1;
                }
                ClaimAnswer::InFlight { stale: false, .. } | ClaimAnswer::Replay(_) => {}
                other => panic!("worker {worker}, key {k}: {other:?}"),
            }
        }
        (won, fenced)
    });
    println!("IDEM-WON {won} {fenced}");
}

#[test]
fn crash_after_claim_leaves_in_flight() {
    if std::env::var(CHILD_ENV).is_ok() {
        return crash_child();
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.sqlite3");
    let store = SqliteStore::open(&db).unwrap();
    store.migrate().unwrap();

    let (mut child, mut out) = spawn_child("crash_after_claim_leaves_in_flight", "crash", &db);
    let token = wait_for(&mut out, "IDEM-CLAIMED");
    child.kill().unwrap(); // SIGKILL: no destructor, no rollback, no goodbye.
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed");

    let rt = runtime();
    rt.block_on(async {
        let (scope, key, fp, policy) = (scope(), key(), fp(), policy());
        let id = RecordId::new(scope.clone(), key.clone());
        let later = NOW + Duration::from_secs(1);
        match store.claim(&id, &fp, &policy, later).await.unwrap() {
            ClaimAnswer::InFlight {
                stale: false,
                retry_after,
            } => assert_eq!(retry_after, Duration::from_secs(29)),
            other => panic!("after the crash the next attempt must be in flight: {other:?}"),
        }
        let record = store.get(&id, later).await.unwrap().unwrap();
        assert_eq!(record.state, RecordState::Processing);
        assert_eq!(record.token.to_string(), token, "the dead holder's claim");
        assert!(
            store.list_in_flight(later, 10).await.unwrap().is_empty(),
            "not stale while the lease runs"
        );

        let elapsed = NOW + policy.lease();
        let stale = store.list_in_flight(elapsed, 10).await.unwrap();
        assert_eq!(stale.len(), 1);
        assert_eq!((&stale[0].scope, &stale[0].key), (&scope, &key));
        assert_eq!(stale[0].token, record.token);
        assert!(matches!(
            store.claim(&id, &fp, &policy, elapsed).await.unwrap(),
            ClaimAnswer::InFlight { stale: true, .. }
        ));
        // Under `Takeover` the next attempt may run it again, with the next token.
        let takeover = policy
            .to_builder()
            .stale(StalePolicy::Takeover)
            .build()
            .unwrap();
        match store.claim(&id, &fp, &takeover, elapsed).await.unwrap() {
            ClaimAnswer::Claimed { token, attempt, .. } => {
                assert_eq!((token.seq, attempt), (2, 2));
            }
            other => panic!("{other:?}"),
        }
    });
}

fn key() -> IdempotencyKey {
    IdempotencyKey::new("wf-7:step-1:charge_card").unwrap()
}

fn crash_child() {
    let rt = runtime();
    let store = SqliteStore::open(child_db()).unwrap();
    let answer = rt
        .block_on(store.claim(&RecordId::new(scope(), key()), &fp(), &policy(), NOW))
        .unwrap();
    let ClaimAnswer::Claimed { token, .. } = answer else {
        panic!("the first claim wins: {answer:?}");
    };
    println!("IDEM-CLAIMED {token}");
    // Wait to be killed; the parent never writes, so this only ends with the process.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    panic!("the parent should have killed this process");
}
