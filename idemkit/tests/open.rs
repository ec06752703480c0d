//! `idemkit::open` against real stores: it reads only unless asked to migrate, refuses a missing
//! schema with a typed error, and the store it opens works (records counted in the store).

use std::time::Duration;

use idem_conformance::kit;
use idemkit::machine::ClaimAnswer;
use idemkit::open::{OpenError, OpenOptions};
use idemkit::sqlite::SqliteStore;
use idemkit::{Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, Timestamp};
use serde_json::json;

/// One claim and completion, then a replay: the store behind the URL works.
async fn round_trip(store: &dyn KeyStore, scope: &str) {
    let scope = Scope::new(scope).unwrap();
    let key = IdempotencyKey::new("k").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let fp = Fingerprint::of("t", &json!({})).unwrap();
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store.claim(&id, &fp, &policy, now).await.unwrap()
    else {
        panic!("a new key is claimed")
    };
    let ok = Outcome::definitive(201, &json!({"id": 1})).unwrap();
    store.complete(&id, token, &ok, &policy, now).await.unwrap();
    let again = store.claim(&id, &fp, &policy, now).await.unwrap();
    assert!(matches!(again, ClaimAnswer::Replay(_)), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_opens_read_only_until_migrated() {
    let d = kit::temp_dir("idemkit-open");
    let path = d.path().join("idem.db");
    let url = format!("sqlite://{}", path.display());
    let err = idemkit::open(&url).await.unwrap_err();
    assert!(matches!(err, OpenError::NoDatabaseFile { .. }), "{err:?}");
    assert!(!path.exists(), "not created");
    drop(SqliteStore::open(&path).unwrap()); // an empty file
    let err = idemkit::open(&url).await.unwrap_err();
    assert!(
        matches!(err, OpenError::SchemaMissing { found: 0, expected, .. } if expected >= 1),
        "{err:?}"
    );
    assert!(err.to_string().contains("idem migrate"), "{err}");
    let opened = OpenOptions::new().migrate(true).open(&url).await.unwrap();
    assert!(opened.engine::<SqliteStore>().is_some());
    let maintenance = opened.maintenance();
    assert_eq!(
        maintenance.schema_version().await.unwrap(),
        maintenance.latest_schema_version()
    );
    assert_eq!(maintenance.check_config().await.unwrap(), []);
    assert_eq!(opened.url().backend(), "sqlite");
    let store = idemkit::open(&url).await.unwrap();
    round_trip(&*store, "open/sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_are_store_errors_without_the_password() {
    for url in [
        "postgres://app:hunter2@127.0.0.1:1/app",
        "redis://:hunter2@127.0.0.1:1",
    ] {
        let err = idemkit::open(url).await.unwrap_err();
        match &err {
            OpenError::Store { source, .. } => assert!(source.is_unavailable(), "{err:?}"),
            other => panic!("{other:?}"),
        }
        assert!(!err.is_bad_url());
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_redis_urls_open_working_stores() {
    if let Some(url) = kit::postgres_url() {
        let opened = OpenOptions::new().migrate(true).open(&url).await.unwrap();
        assert!(
            opened
                .engine::<idemkit::postgres::PostgresStore>()
                .is_some()
        );
        let store = idemkit::open(&url).await.unwrap();
        round_trip(&*store, &kit::unique("open/pg")).await;
    }
    if let Some(url) = kit::redis_url() {
        let store = idemkit::open(&url).await.unwrap();
        round_trip(&*store, &kit::unique("open/redis")).await;
    }
}

/// A `redis+cluster://` URL built from `IDEM_TEST_REDIS_CLUSTER_URLS` (scripts/test starts a
/// cluster; skipped without it outside CI, a failure under CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_url_opens_a_cluster_store() {
    let Some(urls) = kit::env_urls(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "scripts/services/redis.sh starts a cluster",
    ) else {
        return;
    };
    let nodes: Vec<&str> = urls
        .iter()
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    let mut url = format!("redis+cluster://{}", nodes[0]);
    for (i, n) in nodes[1..].iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(&format!("node={n}"));
    }
    let opened = OpenOptions::new().open(&url).await.unwrap();
    let redis = opened.engine::<idemkit::redis::RedisStore>().unwrap();
    assert!(redis.is_cluster());
    round_trip(&*opened.store(), &kit::unique("open/cluster")).await;
}

/// `dynamodb://TABLE?endpoint=…&region=…` opens the DynamoDB store: refused before `migrate`
/// creates the table (schema missing), working after; a parameter it does not know is a bad URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_url_opens_a_working_store_once_migrated() {
    let err = idemkit::open("dynamodb://tbl?regoin=eu-west-1")
        .await
        .unwrap_err();
    assert!(err.is_bad_url(), "{err:?}");
    let Some((base, _)) = kit::store_url("dynamodb", "unused") else {
        return;
    };
    // A table of this test's own: the URL's table name replaced.
    let (_, query) = base.split_once('?').expect("the test URL has an endpoint");
    let url = format!("dynamodb://{}?{query}", kit::unique("open"));
    match idemkit::open(&url).await.unwrap_err() {
        OpenError::SchemaMissing { found: 0, .. } => {}
        other => panic!("{other:?}"),
    }
    let opened = OpenOptions::new().migrate(true).open(&url).await.unwrap();
    assert!(opened.engine::<idemkit::dynamodb::DynamoStore>().is_some());
    assert_eq!(opened.url().backend(), "dynamodb");
    assert_eq!(opened.maintenance().check_config().await.unwrap(), []);
    let store = idemkit::open(&url).await.unwrap();
    round_trip(&*store, "open/dynamodb").await;
}
