//! The operator commands, run as the `idem` binary against a real SQLite file (and the suite
//! against PostgreSQL and Redis when their URLs are set).

use std::process::{Command, Output};
use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordState, Scope, Timestamp,
};
use idem_store_sqlite::SqliteStore;
use serde_json::{Value, json};

struct Fixture {
    dir: std::path::PathBuf,
    url: String,
    store: SqliteStore,
    scope: Scope,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Records: `stuck-1`, `stuck-2` (processing, lease long elapsed), `running` (lease runs for an
/// hour), `done` (completed), and 3 expired ones.
async fn fixture() -> Fixture {
    let dir = std::env::temp_dir().join(format!(
        "idem-ops-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ops.db");
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().unwrap();
    let scope = Scope::from_parts(["public", "/tools/create_ticket"]).unwrap();
    let fp = Fingerprint::of("t", &json!({})).unwrap();
    let now = Timestamp::now();
    let short = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let long = Policy::builder()
        .lease(Duration::from_secs(3600))
        .ttl(Duration::from_secs(7200))
        .build()
        .unwrap();
    let expiring = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let key = |k: &str| IdempotencyKey::new(k).unwrap();
    for k in ["stuck-1", "stuck-2"] {
        store
            .claim(&scope, &key(k), &fp, &short, now - Duration::from_secs(120))
            .await
            .unwrap();
    }
    store
        .claim(&scope, &key("running"), &fp, &long, now)
        .await
        .unwrap();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&scope, &key("done"), &fp, &short, now)
        .await
        .unwrap()
    else {
        panic!()
    };
    let ok = Outcome::definitive(201, &json!({"ticket_id": "T-9"})).unwrap();
    store
        .complete(&scope, &key("done"), token, &ok, &short, now)
        .await
        .unwrap();
    for i in 0..3 {
        store
            .claim(
                &scope,
                &key(&format!("old-{i}")),
                &fp,
                &expiring,
                now - Duration::from_secs(60),
            )
            .await
            .unwrap();
    }
    Fixture {
        url: format!("sqlite://{}", path.display()),
        dir,
        store,
        scope,
    }
}

impl Fixture {
    async fn state(&self, key: &str) -> Option<RecordState> {
        self.store
            .get(
                &self.scope,
                &IdempotencyKey::new(key).unwrap(),
                Timestamp::now(),
            )
            .await
            .unwrap()
            .map(|r| r.state)
    }
}

#[tokio::test]
async fn keys_show_prints_the_record() {
    let f = fixture().await;
    let out = idem(&["keys", "--store", &f.url, "show", f.scope.as_str(), "done"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("completed") && stdout.contains("\"ticket_id\": \"T-9\""),
        "{stdout}"
    );
    let out = idem(&[
        "keys",
        "--store",
        &f.url,
        "show",
        f.scope.as_str(),
        "done",
        "--json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["outcome"]["body"]["ticket_id"], "T-9");
}

#[tokio::test]
async fn keys_ls_filters_by_state_scope_and_age() {
    let f = fixture().await;
    let ls = |extra: &[&str]| {
        let mut args = vec!["keys", "--store", f.url.as_str(), "ls", "--json"];
        args.extend_from_slice(extra);
        let out = idem(&args);
        assert!(out.status.success(), "{:?}", text(&out));
        let v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        v.iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    // Least recently written first; expired records never.
    // "done" and "running" were written at the same instant: then by key.
    assert_eq!(ls(&[]), ["stuck-1", "stuck-2", "done", "running"]);
    assert_eq!(
        ls(&["--state", "processing"]),
        ["stuck-1", "stuck-2", "running"]
    );
    assert_eq!(ls(&["--state", "completed"]), ["done"]);
    assert_eq!(ls(&["--older-than", "1m"]), ["stuck-1", "stuck-2"]);
    assert_eq!(
        ls(&["--scope", f.scope.as_str(), "--limit", "1"]),
        ["stuck-1"]
    );
    assert!(ls(&["--scope", "other/tool"]).is_empty());
    let table = idem(&["keys", "--store", &f.url, "ls", "--state", "processing"]);
    let (stdout, _) = text(&table);
    assert!(
        stdout.starts_with("STATE") && stdout.contains("stuck-1") && stdout.contains("3 records"),
        "{stdout}"
    );
    let bad = idem(&["keys", "--store", &f.url, "ls", "--state", "done"]);
    assert!(!bad.status.success());
    assert!(text(&bad).1.contains("not a state"));
}

#[tokio::test]
async fn keys_release_gives_a_stuck_key_back() {
    let f = fixture().await;
    let out = idem(&[
        "keys",
        "--store",
        &f.url,
        "release",
        f.scope.as_str(),
        "stuck-1",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(f.state("stuck-1").await, Some(RecordState::FailedRetryable));
}

#[tokio::test]
async fn keys_resolve_completes_a_stuck_key_with_the_given_outcome() {
    let f = fixture().await;
    let file = f.dir.join("outcome.json");
    std::fs::write(
        &file,
        r#"{"status": 201, "body": {"ticket_id": "T-found"}}"#,
    )
    .unwrap();
    let out = idem(&[
        "keys",
        "--store",
        &f.url,
        "resolve",
        f.scope.as_str(),
        "stuck-2",
        "--outcome",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let r = f
        .store
        .get(
            &f.scope,
            &IdempotencyKey::new("stuck-2").unwrap(),
            Timestamp::now(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.outcome.unwrap().body_json()["ticket_id"], "T-found");
}

#[tokio::test]
async fn refusals_are_one_clear_line_and_a_non_zero_exit_and_change_nothing() {
    let f = fixture().await;
    let file = f.dir.join("outcome.json");
    std::fs::write(&file, r#"{"status": 200, "body": {}}"#).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "keys",
                "--store",
                &f.url,
                "resolve",
                f.scope.as_str(),
                "done",
                "--outcome",
                file.to_str().unwrap(),
            ],
            "completed",
        ),
        (
            vec![
                "keys",
                "--store",
                &f.url,
                "release",
                f.scope.as_str(),
                "done",
            ],
            "completed",
        ),
        (
            vec![
                "keys",
                "--store",
                &f.url,
                "release",
                f.scope.as_str(),
                "running",
            ],
            "lease runs until",
        ),
        (
            vec!["keys", "--store", &f.url, "show", f.scope.as_str(), "nope"],
            "no record",
        ),
        (
            vec!["keys", "--store", "mysql://x", "show", "s", "k"],
            "unknown store URL scheme",
        ),
        (
            vec![
                "keys",
                "--store",
                "sqlite:///no/such/dir/x.db",
                "show",
                "s",
                "k",
            ],
            "cannot open the store",
        ),
        (
            vec!["keys", "--store", &f.url, "show", "s", "bad key"],
            "visible ASCII",
        ),
    ];
    for (args, expected) in cases {
        let out = idem(&args);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            stderr.trim().lines().count() <= 3,
            "a clear message, not a dump: {stderr}"
        );
    }
    assert_eq!(f.state("done").await, Some(RecordState::Completed));
    assert_eq!(f.state("running").await, Some(RecordState::Processing));
}

#[tokio::test]
async fn purge_deletes_the_expired_records() {
    let f = fixture().await;
    let out = idem(&["purge", "--store", &f.url, "--batch", "2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("purged 3 expired records in 2 batches"),
        "{stdout}"
    );
    let old = f
        .store
        .get(
            &f.scope,
            &IdempotencyKey::new("old-0").unwrap(),
            Timestamp::from_millis(0),
        )
        .await
        .unwrap();
    assert!(
        old.is_none(),
        "gone from the file, even seen from before its expiry"
    );
    assert_eq!(
        f.state("done").await,
        Some(RecordState::Completed),
        "live records stay"
    );
}

fn conformance_passes(url: &str) {
    let out = idem(&["conformance", "--store", url]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("pass ")).count() >= 30);
}

#[tokio::test]
async fn conformance_runs_the_suite_against_a_live_store() {
    let f = fixture().await;
    conformance_passes(&f.url);
    for var in ["IDEM_TEST_POSTGRES_URL", "IDEM_TEST_REDIS_URL"] {
        match std::env::var(var) {
            Ok(url) => conformance_passes(&url),
            Err(_) if std::env::var_os("CI").is_some() => panic!("{var} is not set under CI"),
            Err(_) => eprintln!("skipped the {var} run: not set"),
        }
    }
}

fn bench_prints_ratios(url: &str) {
    let out = idem(&["bench", "--store", url, "--operations", "20"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for row in ["first execution", "replay"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{stdout}"));
        let ratio: f64 = line
            .split_whitespace()
            .last()
            .unwrap()
            .trim_end_matches('×')
            .parse()
            .unwrap();
        assert!(ratio > 0.0, "{line}");
    }
}

#[tokio::test]
async fn bench_compares_idem_with_the_raw_engine_operations() {
    let f = fixture().await;
    bench_prints_ratios(&f.url);
    for var in ["IDEM_TEST_POSTGRES_URL", "IDEM_TEST_REDIS_URL"] {
        match std::env::var(var) {
            Ok(url) => bench_prints_ratios(&url),
            Err(_) if std::env::var_os("CI").is_some() => panic!("{var} is not set under CI"),
            Err(_) => eprintln!("skipped the {var} run: not set"),
        }
    }
}
