//! Where the store comes from: `--store` anywhere, `IDEM_STORE`, a URL without a scheme,
//! passwords never printed, a transaction pooler.

use super::*;

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
