//! The operator commands, run as the `idem` binary against a real SQLite file and a real
//! PostgreSQL (and the suite and the bench against Redis too when its URL is set).

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use idem_conformance::kit::{self, TempDir, unique};
use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idemkit::OpenOptions;
use serde_json::{Value, json};

struct Fixture {
    /// The SQLite file's directory, removed on drop.
    _dir: Option<TempDir>,
    url: String,
    store: Arc<dyn KeyStore>,
    scope: Scope,
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

/// The URL of `backend`'s store: a fresh SQLite file (migrated by the fixture: operator commands
/// never do), or the PostgreSQL / Redis the test script provides (`None` when unset outside CI:
/// skipped).
fn store_url(backend: &str) -> Option<(String, Option<TempDir>)> {
    kit::store_url(backend, "ops.db")
}

/// Records in a scope of the test's own: `stuck-1`, `stuck-2` (processing, lease long elapsed),
/// `running` (lease runs for an hour), `done` (completed), and 3 expired ones.
async fn fixture(backend: &str) -> Option<Fixture> {
    let (url, dir) = store_url(backend)?;
    let store = OpenOptions::new()
        .migrate(true)
        .open(&url)
        .await
        .unwrap()
        .into_store();
    let scope = Scope::from_parts([unique("ops").as_str(), "/tools/create_ticket"]).unwrap();
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
    for (i, k) in ["stuck-1", "stuck-2"].iter().enumerate() {
        let at = now - Duration::from_secs(120 - i as u64);
        store
            .claim(&RecordId::new(scope.clone(), key(k)), &fp, &short, at)
            .await
            .unwrap();
    }
    store
        .claim(
            &RecordId::new(scope.clone(), key("running")),
            &fp,
            &long,
            now,
        )
        .await
        .unwrap();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope.clone(), key("done")), &fp, &short, now)
        .await
        .unwrap()
    else {
        panic!()
    };
    let ok = Outcome::definitive(201, &json!({"ticket_id": "T-9"})).unwrap();
    store
        .complete(
            &RecordId::new(scope.clone(), key("done")),
            token,
            &ok,
            &short,
            now,
        )
        .await
        .unwrap();
    for i in 0..3 {
        let at = now - Duration::from_secs(60);
        store
            .claim(
                &RecordId::new(scope.clone(), key(&format!("old-{i}"))),
                &fp,
                &expiring,
                at,
            )
            .await
            .unwrap();
    }
    Some(Fixture {
        url,
        _dir: dir,
        store,
        scope,
    })
}

impl Fixture {
    async fn state(&self, key: &str) -> Option<RecordState> {
        self.store
            .get(
                &RecordId::new(self.scope.clone(), IdempotencyKey::new(key).unwrap()),
                Timestamp::now(),
            )
            .await
            .unwrap()
            .map(|r| r.state)
    }

    fn keys(&self, args: &[&str]) -> Output {
        let mut all = vec!["keys", "--store", self.url.as_str()];
        all.extend_from_slice(args);
        idem(&all)
    }
}

async fn keys_ls_filters_by_state_scope_and_age(f: Fixture) {
    let scope = f.scope.as_str();
    let ls = |extra: &[&str]| {
        let mut args = vec!["ls", "--json", "--scope", scope];
        args.extend_from_slice(extra);
        let out = f.keys(&args);
        assert!(out.status.success(), "{:?}", text(&out));
        let v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        v.iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    // Least recently written first; "done" and "running" were written at the same instant, then
    // by key; expired records never.
    assert_eq!(ls(&[]), ["stuck-1", "stuck-2", "done", "running"]);
    assert_eq!(
        ls(&["--state", "processing"]),
        ["stuck-1", "stuck-2", "running"]
    );
    assert_eq!(ls(&["--state", "completed"]), ["done"]);
    assert_eq!(ls(&["--older-than", "1m"]), ["stuck-1", "stuck-2"]);
    assert_eq!(ls(&["--limit", "1"]), ["stuck-1"]);
    let out = f.keys(&["ls", "--scope", "nobody/tool", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let table = f.keys(&["ls", "--state", "processing", "--scope", scope]);
    let (stdout, _) = text(&table);
    assert!(
        stdout.starts_with("STATE") && stdout.contains("stuck-1") && stdout.contains("3 records"),
        "{stdout}"
    );
    let bad = f.keys(&["ls", "--state", "done"]);
    assert!(!bad.status.success());
    assert!(text(&bad).1.contains("not a state"));
}

async fn keys_show_prints_the_record(f: Fixture) {
    let out = f.keys(&["show", f.scope.as_str(), "done"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("completed") && stdout.contains("\"ticket_id\": \"T-9\""),
        "{stdout}"
    );
    let out = f.keys(&["show", f.scope.as_str(), "done", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["outcome"]["body"]["ticket_id"], "T-9");
}

/// An encrypted body is shown as "encrypted (key id …)", never as ciphertext.
async fn keys_show_says_encrypted(f: Fixture) {
    let key = IdempotencyKey::new("sealed").unwrap();
    let fp = Fingerprint::of("t", &json!({})).unwrap();
    let now = Timestamp::now();
    let id = RecordId::new(f.scope.clone(), key.clone());
    let ClaimAnswer::Claimed { token, .. } = f
        .store
        .claim(&id, &fp, &Policy::default(), now)
        .await
        .unwrap()
    else {
        panic!()
    };
    let ct = "Q0lQSEVSVEVYVC1NQVJLRVI=";
    let sealed = Outcome::definitive(
        201,
        &json!({"idem_sealed": {"v": 1, "alg": "A256GCM", "kid": "2026-01", "nonce": "AAAAAAAAAAAAAAAA", "ct": ct}}),
    )
    .unwrap();
    f.store
        .complete(&id, token, &sealed, &Policy::default(), now)
        .await
        .unwrap();
    let out = f.keys(&["show", f.scope.as_str(), "sealed"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("encrypted (A256GCM, key id 2026-01)") && !stdout.contains(ct),
        "{stdout}"
    );
    let out = f.keys(&["show", f.scope.as_str(), "sealed", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"]["encrypted"]["key_id"], "2026-01");
    assert_eq!(v["outcome"]["status"], 201);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ct));
}

/// The steps of a record: names, times and sizes; values in clear only when not encoded.
async fn keys_show_lists_the_checkpoints(f: Fixture) {
    let key = IdempotencyKey::new("stepping").unwrap();
    let fp = Fingerprint::of("t", &json!({})).unwrap();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = f
        .store
        .claim(
            &RecordId::new(f.scope.clone(), key.clone()),
            &fp,
            &Policy::default(),
            now,
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    let ct = "Q0lQSEVSVEVYVC1NQVJLRVI=";
    let sealed = format!(
        r#"{{"idem_sealed":{{"v":1,"alg":"A256GCM","kid":"2026-01","nonce":"AAAAAAAAAAAAAAAA","ct":"{ct}"}}}}"#
    );
    for (name, value) in [
        ("charged", r#"{"charge":"ch_1"}"#),
        ("emailed", sealed.as_str()),
    ] {
        let step = idem_core::Checkpoint::new(name, value, now).unwrap();
        let id = idem_core::RecordId::new(f.scope.clone(), key.clone());
        f.store
            .as_checkpoint_store()
            .expect("the SQLite store keeps checkpoints")
            .checkpoint(&id, token, &step, &Policy::default())
            .await
            .unwrap();
    }
    let out = f.keys(&["show", f.scope.as_str(), "stepping"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("checkpoints  2")
            && stdout.contains("1. charged")
            && stdout.contains(r#"17 bytes  {"charge":"ch_1"}"#)
            && stdout.contains("2. emailed")
            && stdout.contains("encrypted (A256GCM, key id 2026-01)")
            && !stdout.contains(ct),
        "{stdout}"
    );
    let out = f.keys(&["show", f.scope.as_str(), "stepping", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = v["checkpoints"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["name"], "charged");
    assert_eq!(steps[0]["value"]["charge"], "ch_1");
    assert_eq!(steps[0]["size"], 17);
    assert_eq!(steps[1]["encrypted"]["key_id"], "2026-01");
    assert!(steps[1].get("value").is_none());
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ct));
}

async fn keys_release_gives_a_stuck_key_back(f: Fixture) {
    let out = f.keys(&["release", f.scope.as_str(), "stuck-1"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(f.state("stuck-1").await, Some(RecordState::FailedRetryable));
}

async fn keys_resolve_completes_a_stuck_key(f: Fixture) {
    let file = std::env::temp_dir().join(unique("outcome"));
    std::fs::write(
        &file,
        r#"{"status": 201, "body": {"ticket_id": "T-found"}}"#,
    )
    .unwrap();
    let out = f.keys(&[
        "resolve",
        f.scope.as_str(),
        "stuck-2",
        "--outcome",
        file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{:?}", text(&out));
    let r = f
        .store
        .get(
            &RecordId::new(f.scope.clone(), IdempotencyKey::new("stuck-2").unwrap()),
            Timestamp::now(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.outcome.unwrap().body_json()["ticket_id"], "T-found");
}

async fn refusals_are_one_clear_line_and_change_nothing(f: Fixture) {
    let file = std::env::temp_dir().join(unique("outcome"));
    std::fs::write(&file, r#"{"status": 200, "body": {}}"#).unwrap();
    let scope = f.scope.as_str();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "resolve",
                scope,
                "done",
                "--outcome",
                file.to_str().unwrap(),
            ],
            "completed",
        ),
        (vec!["release", scope, "done"], "completed"),
        (vec!["release", scope, "running"], "lease runs until"),
        (vec!["show", scope, "nope"], "no record"),
        (vec!["show", "s", "bad key"], "visible ASCII"),
    ];
    for (args, expected) in cases {
        let out = f.keys(&args);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            stderr.trim().lines().count() <= 3,
            "a clear message, not a dump: {stderr}"
        );
    }
    let _ = std::fs::remove_file(&file);
    assert_eq!(f.state("done").await, Some(RecordState::Completed));
    assert_eq!(f.state("running").await, Some(RecordState::Processing));
}

async fn purge_deletes_the_expired_records(f: Fixture) {
    let out = idem(&["purge", "--store", &f.url, "--batch", "2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    // The storage may be shared: at least this test's 3 expired records went.
    let purged: usize = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(stdout.starts_with("purged ") && purged >= 3, "{stdout}");
    for i in 0..3 {
        let key = IdempotencyKey::new(format!("old-{i}")).unwrap();
        let seen_before_expiry = f
            .store
            .get(
                &RecordId::new(f.scope.clone(), key.clone()),
                Timestamp::from_millis(0),
            )
            .await
            .unwrap();
        assert!(
            seen_before_expiry.is_none(),
            "old-{i} is gone from the store"
        );
    }
    assert_eq!(
        f.state("done").await,
        Some(RecordState::Completed),
        "live records stay"
    );
}

macro_rules! on_sql_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::fixture("sqlite").await.unwrap()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(f) = super::fixture("postgres").await {
                        super::$name(f).await;
                    }
                }
            )*
        }
    };
}

on_sql_backends! {
    keys_ls_filters_by_state_scope_and_age,
    keys_show_prints_the_record,
    keys_show_says_encrypted,
    keys_show_lists_the_checkpoints,
    keys_release_gives_a_stuck_key_back,
    keys_resolve_completes_a_stuck_key,
    refusals_are_one_clear_line_and_change_nothing,
    purge_deletes_the_expired_records,
}

#[test]
fn bad_urls_and_unreachable_stores_are_one_clear_line() {
    for (args, expected) in [
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
            "no SQLite file at /no/such/dir/x.db",
        ),
        (
            vec!["purge", "--store", "postgres://nobody@127.0.0.1:1/none"],
            "cannot open the store",
        ),
        (
            vec!["conformance", "--store", "redis://127.0.0.1:1"],
            "cannot open the store",
        ),
    ] {
        let out = idem(&args);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(stderr.trim().lines().count() <= 3, "{stderr}");
    }
}

fn conformance_passes(url: &str) {
    let out = idem(&["conformance", "--store", url]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("pass ")).count() >= 30);
}

/// A short bench with prefilled and purged records: it prints its ratios, saves its report, the
/// purge deleted the expired records it filled, and on Redis nothing of the run is left.
async fn bench_prints_ratios(url: &str) {
    let dir = kit::temp_dir("bench");
    let saved = dir.path().join("report.json");
    let out = idem(&[
        "bench",
        "--store",
        url,
        "--operations",
        "20",
        "--records",
        "30",
        "--purge",
        "40",
        "--purge-batch",
        "16",
        // Long rests between batches: claims run beside even a purge this small.
        "--purge-duty",
        "0.02",
        "--save",
        saved.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(report["points"][0]["records"], 30, "{report}");
    assert_eq!(report["purge"]["expired"], 40, "{report}");
    // A shared server may hold other expired records: the purge deletes those too.
    assert!(
        report["purge"]["deleted"].as_u64().unwrap() >= 40,
        "{report}"
    );
    assert!(report["purge"]["claim"]["purging"]["n"].as_u64().unwrap() >= 1);
    if url.starts_with("redis") {
        let client = idemkit::redis::redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let left: Vec<String> = idemkit::redis::redis::cmd("KEYS")
            .arg("idem-bench-[0-9a-f][0-9a-f]*:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left.is_empty(), "the bench's Redis keys are gone: {left:?}");
    }
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
        // A ratio, not a speed: one outlier of the shared machine can round it to 0.00×.
        assert!(ratio.is_finite() && ratio >= 0.0, "{line}");
    }
}

#[tokio::test]
async fn conformance_and_bench_run_against_every_live_store() {
    for backend in ["sqlite", "postgres", "redis"] {
        if let Some((url, _dir)) = store_url(backend) {
            let migrated = idem(&["migrate", "--store", &url]);
            assert!(migrated.status.success(), "{:?}", text(&migrated));
            conformance_passes(&url);
            bench_prints_ratios(&url).await;
        }
    }
}
