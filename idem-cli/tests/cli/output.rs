//! What the commands print and return: exit codes, conformance streamed case by case, JSON,
//! no carriage returns or colour codes in a pipe.

use super::*;

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
