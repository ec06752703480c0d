//! The command line itself, run as the `idem` binary: where `--store` goes, `IDEM_STORE`,
//! read-only commands that never change the schema, `idem migrate`, `--force`, the exit codes,
//! `--json`, streaming conformance output, no carriage returns in pipes, and store URLs without
//! a scheme. Effects are checked in the store itself (SQLite files, a fresh PostgreSQL database).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idem_conformance::kit::{self, TempDir};
use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idemkit::OpenOptions;
use idemkit::sqlite::rusqlite::Connection;
use serde_json::{Value, json};

/// Exit codes, as `idem --help` documents them.
const USAGE: i32 = 2;
const STORE_UNAVAILABLE: i32 = 3;
const NOT_FOUND: i32 = 4;
const REFUSED: i32 = 5;
const SUITE_FAILED: i32 = 6;

/// A temporary directory of the test's own, removed on drop.
struct Dir(TempDir);

impl Dir {
    fn new() -> Self {
        Self(kit::temp_dir("idem-cli"))
    }

    fn db(&self, name: &str) -> (PathBuf, String) {
        let path = self.0.path().join(name);
        let url = format!("sqlite://{}", path.display());
        (path, url)
    }
}

fn idem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idem"));
    c.env_remove("IDEM_STORE").env_remove("RUST_LOG");
    c
}

fn run(args: &[&str]) -> Output {
    idem().args(args).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Names of the tables and indexes in an SQLite file.
fn schema_objects(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap()
}

fn scope() -> Scope {
    Scope::from_parts(["cli-test", "/tools/create_ticket"]).unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("t", &json!({})).unwrap()
}

/// The holder of `running` was alive after all: its late completion is refused (`Fenced`).
async fn assert_late_completion_fenced(store: &dyn KeyStore, holder: idem_core::Token) {
    let late = Outcome::definitive(201, &json!({"ticket_id": "T-late"})).unwrap();
    let answer = store
        .complete(
            &RecordId::new(scope(), key("running")),
            holder,
            &late,
            &Policy::default(),
            Timestamp::now(),
        )
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Fenced);
}

/// A migrated SQLite store holding `running` (a live holder, lease for an hour) and `done`
/// (completed); returns the store and the holder's token for `running`.
async fn migrated(url: &str) -> (std::sync::Arc<dyn KeyStore>, idem_core::Token) {
    let store = OpenOptions::new()
        .migrate(true)
        .open(url)
        .await
        .unwrap()
        .into_store();
    let long = Policy::builder()
        .lease(Duration::from_secs(3600))
        .ttl(Duration::from_secs(7200))
        .build()
        .unwrap();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope(), key("running")), &fp(), &long, now)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let ClaimAnswer::Claimed { token: t, .. } = store
        .claim(&RecordId::new(scope(), key("done")), &fp(), &long, now)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let ok = Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap();
    store
        .complete(&RecordId::new(scope(), key("done")), t, &ok, &long, now)
        .await
        .unwrap();
    (store, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_is_accepted_anywhere_and_from_the_environment() {
    let dir = Dir::new();
    let (_, url) = dir.db("anywhere.db");
    migrated(&url).await;
    let keys = |out: &Output| -> Vec<String> {
        assert_eq!(code(out), 0, "{}", stderr(out));
        let v: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        v.iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let expected = ["done", "running"];
    for args in [
        vec!["keys", "ls", "--json", "--store", url.as_str()],
        vec!["--store", url.as_str(), "keys", "ls", "--json"],
        vec!["keys", "--store", url.as_str(), "ls", "--json"],
    ] {
        let mut listed = keys(&run(&args));
        listed.sort();
        assert_eq!(listed, expected, "{args:?}");
    }
    let out = idem()
        .args(["keys", "ls", "--json"])
        .env("IDEM_STORE", &url)
        .output()
        .unwrap();
    let mut listed = keys(&out);
    listed.sort();
    assert_eq!(listed, expected, "IDEM_STORE");
}

#[test]
fn bench_and_conformance_use_idem_store() {
    let dir = Dir::new();
    let (path, url) = dir.db("env.db");
    let out = run(&["migrate", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = idem()
        .args(["bench", "--operations", "5", "--json"])
        .env("IDEM_STORE", &url)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["operations"], 5);
    assert!(
        report["replay"]["ratio"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let conn = Connection::open(&path).unwrap();
    let bench_records = || -> i64 {
        conn.query_row(
            "SELECT count(*) FROM idem_records WHERE scope LIKE 'idem-bench/%'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(
        bench_records(),
        5,
        "the bench wrote into the IDEM_STORE file"
    );

    // A saved report drawn again with --plot-only: a plot, and no new measurement in the file.
    let saved = dir.0.path().join("report.json");
    std::fs::write(&saved, &out.stdout).unwrap();
    let svg = dir.0.path().join("plot.svg");
    let out = run(&[
        "bench",
        "--store",
        &url,
        "--plot",
        svg.to_str().unwrap(),
        "--plot-only",
        "--plot-with",
        saved.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap()
            .contains("sqlite ×1 idem p50")
    );
    assert_eq!(bench_records(), 5, "--plot-only measured nothing");
}

/// A store that breaks the contract: deletes of records are silently ignored, so purge reports
/// and removes nothing. The suite must fail on it, and say so while it runs.
#[test]
fn conformance_streams_each_case_and_exits_6_when_a_case_fails() {
    let dir = Dir::new();
    let (path, url) = dir.db("broken.db");
    assert_eq!(code(&run(&["migrate", "--store", &url])), 0);
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER keep_everything BEFORE DELETE ON idem_records \
             BEGIN SELECT RAISE(IGNORE); END;",
        )
        .unwrap();
    let mut child = idem()
        .args(["conformance", "--json"])
        .env("IDEM_STORE", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["type"], "case", "{first}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first case is printed while the suite still runs"
    );
    let mut cases = vec![first];
    let mut summary = None;
    for line in lines {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        match v["type"].as_str() {
            Some("case") => cases.push(v),
            Some("summary") => summary = Some(v),
            other => panic!("unexpected line type {other:?}"),
        }
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(SUITE_FAILED));
    let summary = summary.expect("a summary line");
    let failed: Vec<&Value> = cases.iter().filter(|c| c["passed"] == false).collect();
    assert!(!failed.is_empty(), "the broken store fails some case");
    assert_eq!(summary["failed"], failed.len());
    assert_eq!(summary["passed"], cases.len() - failed.len());
    assert!(
        failed
            .iter()
            .any(|c| c["case"].as_str().unwrap().contains("purge")),
        "{failed:#?}"
    );
    let written: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0))
        .unwrap();
    assert!(written > 0, "the suite ran against the IDEM_STORE file");
}

#[test]
fn read_only_commands_never_change_the_schema() {
    let dir = Dir::new();
    // A file that exists but was never migrated.
    let (path, url) = dir.db("empty.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("VACUUM")
        .unwrap();
    for args in [
        vec!["keys", "ls", "--store", url.as_str()],
        vec!["keys", "show", "s/t", "k", "--store", url.as_str()],
        vec!["keys", "release", "s/t", "k", "--store", url.as_str()],
        vec!["purge", "--store", url.as_str()],
        vec!["conformance", "--store", url.as_str()],
    ] {
        let out = run(&args);
        assert_eq!(code(&out), STORE_UNAVAILABLE, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("schema missing") && stderr(&out).contains("idem migrate"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(schema_objects(&path), 0, "{args:?} created nothing");
    }
    // A file that does not exist is not created.
    let (missing, url) = dir.db("missing.db");
    let out = run(&["keys", "ls", "--store", &url]);
    assert_eq!(code(&out), STORE_UNAVAILABLE);
    assert!(stderr(&out).contains("no SQLite file"), "{}", stderr(&out));
    assert!(!missing.exists());
    // `idem migrate` creates it; then the same commands work.
    let out = run(&["migrate", "--json", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["migrated"], true);
    assert!(schema_objects(&missing) > 0);
    let out = run(&["keys", "ls", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_never_change_a_postgres_schema() {
    let Some(base) = kit::postgres_url() else {
        return;
    };
    use idemkit::postgres::sqlx::{self, Connection as _};
    let name = format!(
        "idem_cli_{}_{}",
        std::process::id(),
        Timestamp::now().as_millis()
    );
    let mut admin = sqlx::PgConnection::connect(&base).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&base).unwrap();
    url.set_path(&name);
    let url = url.to_string();
    let tables = || async {
        let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        n
    };
    for args in [
        vec!["keys", "ls", "--store", url.as_str()],
        vec!["keys", "show", "s/t", "k", "--store", url.as_str()],
    ] {
        let out = run(&args);
        assert_eq!(code(&out), STORE_UNAVAILABLE, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("idem migrate"), "{}", stderr(&out));
        assert_eq!(tables().await, 0, "{args:?} created nothing");
    }
    let out = run(&["migrate", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(tables().await >= 2, "the records and migrations tables");
    let out = run(&["keys", "ls", "--json", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "[]");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_overrides_a_live_lease_and_the_holder_stays_fenced() {
    let dir = Dir::new();
    let (_, url) = dir.db("force.db");
    let (store, holder) = migrated(&url).await;
    let scope_text = scope().to_string();
    let without = vec![
        "keys",
        "release",
        scope_text.as_str(),
        "running",
        "--store",
        url.as_str(),
    ];
    let out = run(&without);
    assert_eq!(code(&out), REFUSED, "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    let state = |store: std::sync::Arc<dyn KeyStore>| async move {
        store
            .get(&RecordId::new(scope(), key("running")), Timestamp::now())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(state(store.clone()).await.state, RecordState::Processing);
    let mut forced = without.clone();
    forced.extend(["--force", "--json"]);
    let out = run(&forced);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["result"], "released");
    let record = state(store.clone()).await;
    assert_eq!(record.state, RecordState::FailedRetryable);
    assert_ne!(record.token, holder);
    // The holder was alive after all: its completion is refused and changes nothing.
    assert_late_completion_fenced(&*store, holder).await;
    assert_eq!(state(store).await.state, RecordState::FailedRetryable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_resolve_completes_a_live_claim_and_the_holder_stays_fenced() {
    let dir = Dir::new();
    let (_, url) = dir.db("resolve.db");
    let (store, holder) = migrated(&url).await;
    let file = dir.0.path().join("outcome.json");
    std::fs::write(
        &file,
        r#"{"status": 201, "body": {"ticket_id": "T-found"}}"#,
    )
    .unwrap();
    let scope_text = scope().to_string();
    let base = [
        "keys",
        "resolve",
        scope_text.as_str(),
        "running",
        "--outcome",
        file.to_str().unwrap(),
        "--store",
        url.as_str(),
    ];
    let out = run(&base);
    assert_eq!(code(&out), REFUSED, "{}", stderr(&out));
    let mut forced = base.to_vec();
    forced.push("--force");
    let out = run(&forced);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_late_completion_fenced(&*store, holder).await;
    let record = store
        .get(&RecordId::new(scope(), key("running")), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.outcome.unwrap().body_json()["ticket_id"], "T-found");
    // A completed record stays refused, force or not.
    let mut done = forced.clone();
    done[3] = "done";
    assert_eq!(code(&run(&done)), REFUSED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_what_went_wrong() {
    let dir = Dir::new();
    let (_, url) = dir.db("codes.db");
    migrated(&url).await;
    let scope_text = scope().to_string();
    for (args, expected) in [
        (vec!["keys", "ls", "--no-such-flag"], USAGE),
        (vec!["keys", "ls", "--store", "mysql://db/x"], USAGE),
        (
            vec![
                "keys",
                "ls",
                "--store",
                "postgres://nobody@127.0.0.1:1/none",
            ],
            STORE_UNAVAILABLE,
        ),
        (
            vec![
                "keys",
                "show",
                scope_text.as_str(),
                "nope",
                "--store",
                url.as_str(),
            ],
            NOT_FOUND,
        ),
        (
            vec![
                "keys",
                "release",
                scope_text.as_str(),
                "nope",
                "--store",
                url.as_str(),
            ],
            NOT_FOUND,
        ),
        (
            vec![
                "keys",
                "release",
                scope_text.as_str(),
                "done",
                "--store",
                url.as_str(),
            ],
            REFUSED,
        ),
    ] {
        let out = run(&args);
        assert_eq!(code(&out), expected, "{args:?}: {}", stderr(&out));
    }
    let help = stdout(&run(&["--help"]));
    for line in [
        "Exit codes:",
        "2  usage",
        "3  the store",
        "4  not found",
        "5  refused",
        "6  the conformance",
    ] {
        assert!(help.contains(line), "{line:?} in --help:\n{help}");
    }
}

#[test]
fn a_store_url_without_a_scheme_is_refused_with_a_hint() {
    let dir = Dir::new();
    for (text, hint) in [
        ("localhost:5432", "postgres://localhost:5432"),
        ("idem.db", "sqlite://idem.db"),
    ] {
        let out = idem()
            .args(["keys", "ls", "--store", text])
            .current_dir(&dir.0)
            .output()
            .unwrap();
        assert_eq!(code(&out), USAGE, "{}", stderr(&out));
        assert!(stderr(&out).contains(hint), "{}", stderr(&out));
        assert!(stderr(&out).trim().lines().count() <= 2, "{}", stderr(&out));
    }
    let out = idem()
        .args(["migrate", "--store", "localhost:5432"])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert_eq!(code(&out), USAGE);
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "no file named localhost:5432 (or anything else) was created"
    );
}

#[test]
fn passwords_never_reach_the_terminal() {
    for url in [
        "postgres://app:hunter2@127.0.0.1:1/app",
        "postgres://app@127.0.0.1:1/app?password=hunter2",
        "redis://:hunter2@127.0.0.1:1",
        "app:hunter2@127.0.0.1:1",
        "mysql://app:hunter2@db/app",
    ] {
        let out = run(&["keys", "ls", "--store", url]);
        assert_ne!(code(&out), 0);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!all.contains("hunter2"), "{url}: {all}");
        assert!(!all.is_empty());
    }
    let out = idem()
        .args(["keys", "--help"])
        .env("IDEM_STORE", "postgres://app:hunter2@db/app")
        .output()
        .unwrap();
    assert!(!stdout(&out).contains("hunter2"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_reports_json_and_writes_no_carriage_return_into_a_pipe() {
    let dir = Dir::new();
    let (_, url) = dir.db("purge.db");
    let (store, _) = migrated(&url).await;
    let expiring = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let past = Timestamp::now() - Duration::from_secs(60);
    for i in 0..5 {
        store
            .claim(
                &RecordId::new(scope(), key(&format!("old-{i}"))),
                &fp(),
                &expiring,
                past,
            )
            .await
            .unwrap();
    }
    let count = || -> i64 {
        Connection::open(dir.0.path().join("purge.db"))
            .unwrap()
            .query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0))
            .unwrap()
    };
    let before = count();
    for bad in ["0", "-1", "1.5", "NaN", "half"] {
        let out = run(&["purge", &format!("--duty={bad}"), "--store", &url]);
        assert_eq!(code(&out), USAGE, "--duty {bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("--duty"), "{}", stderr(&out));
        assert_eq!(count(), before, "--duty {bad} deleted nothing");
    }
    let out = run(&["purge", "--batch", "2", "--duty", "0.25", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains('\r') && !stdout(&out).contains('\r'));
    assert!(
        stdout(&out).starts_with("purged 5 expired records in "),
        "{}",
        stdout(&out)
    );
    for i in 0..5 {
        store
            .claim(
                &RecordId::new(scope(), key(&format!("again-{i}"))),
                &fp(),
                &expiring,
                past,
            )
            .await
            .unwrap();
    }
    let out = run(&["purge", "--json", "--batch", "2", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["deleted"], 5);
    assert_eq!(v["batches"], 3);
    assert_eq!(count(), 2, "only the live records are left");
}

/// Logs written to a file or a pipe carry no ANSI colour codes (colour is for a terminal only).
#[test]
fn serve_logs_to_a_pipe_without_colour_codes() {
    let dir = Dir::new();
    let (_, url) = dir.db("serve.db");
    assert_eq!(code(&run(&["migrate", "--store", &url])), 0);
    let mut child = idem()
        .args(["serve", "--addr", "127.0.0.1:0", "--store", &url])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a log line").unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first.contains("X-Tenant-Id"), "{first}");
    assert!(
        !first.contains('\u{1b}'),
        "colour codes in a piped log: {first:?}"
    );
}

/// Through PgBouncer in transaction mode, the operator commands take the pooler's plain URL (no
/// `pooler=` parameter: the store finds the pooler): `idem migrate` succeeds and succeeds again
/// (the schema is current), `idem keys ls` reads, and `idem conformance` passes every case.
#[test]
fn migrate_list_and_conformance_through_a_transaction_pooler() {
    let Some((url, _)) = kit::store_url("postgres-pooler", "unused") else {
        return;
    };
    for round in ["first", "second"] {
        let out = run(&["migrate", "--store", &url]);
        assert_eq!(code(&out), 0, "{round} migrate: {}", stderr(&out));
    }
    let out = run(&["keys", "ls", "--json", "--store", &url]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(&["conformance", "--json", "--store", &url]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let summary = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["type"] == "summary")
        .expect("a summary line");
    assert_eq!(summary["failed"], 0, "{summary}");
    assert!(summary["passed"].as_u64().unwrap() > 0, "{summary}");
}
