//! What changes a store: read-only commands never change its schema; `--force` settles a live
//! claim and fences its holder.

use super::*;

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
