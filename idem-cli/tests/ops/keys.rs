//! `idem keys` on each SQL backend: listing and showing records, settling a stuck one, and
//! refusals that change nothing.

use super::*;

pub(super) async fn keys_ls_filters_by_state_scope_and_age(f: Fixture) {
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

pub(super) async fn keys_show_prints_the_record(f: Fixture) {
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
pub(super) async fn keys_show_says_encrypted(f: Fixture) {
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
pub(super) async fn keys_show_lists_the_checkpoints(f: Fixture) {
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

pub(super) async fn keys_release_gives_a_stuck_key_back(f: Fixture) {
    let out = f.keys(&["release", f.scope.as_str(), "stuck-1"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(f.state("stuck-1").await, Some(RecordState::FailedRetryable));
}

pub(super) async fn keys_resolve_completes_a_stuck_key(f: Fixture) {
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

pub(super) async fn refusals_are_one_clear_line_and_change_nothing(f: Fixture) {
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
