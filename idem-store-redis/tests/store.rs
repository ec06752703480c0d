//! The store's own promises beyond the suite, against servers the tests start themselves (so
//! their settings and key space are known): the configuration check, native expiry relative to
//! the caller's clock, and a `Debug` without credentials.

mod common;

use std::time::Duration;

use common::server::TestServer;
use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Maintenance, Policy, RecordId, Scope, Timestamp,
};
use idem_store_redis::{RedisStore, redis};

fn fingerprint() -> Fingerprint {
    Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_warns_about_eviction_and_missing_persistence() {
    let Some(server) = TestServer::start(&[
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--appendonly",
        "no",
        "--save",
        "",
    ])
    .await
    else {
        return;
    };
    let store: &dyn Maintenance = &RedisStore::connect(&server.url()).await.unwrap();
    // Twice: migrating is idempotent. Redis has no schema: its version is always the build's.
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), 0);
    assert_eq!(store.latest_schema_version(), 0);
    let warnings = store.check_config().await.unwrap();
    assert!(
        matches!(
            &warnings[..],
            [eviction, persistence]
                if eviction.setting.starts_with("maxmemory-policy is allkeys-lru on ")
                && eviction.setting.ends_with(&format!("(maxmemory {})", 100 * 1024 * 1024))
                && persistence.setting.starts_with("persistence is off on ")
        ),
        "{warnings:#?}"
    );
    // The warnings say what to do.
    assert!(warnings[0].fix.contains("noeviction"), "{warnings:#?}");
    assert!(warnings[1].fix.contains("appendonly yes"), "{warnings:#?}");

    let Some(server) =
        TestServer::start(&["--maxmemory-policy", "volatile-lru", "--save", "900 1"]).await
    else {
        return;
    };
    let warnings = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .check_config()
        .await
        .unwrap();
    // Records carry a native expiry, so volatile-* can evict them too.
    assert!(
        matches!(
            &warnings[..],
            [eviction, snapshots]
                if eviction.setting.starts_with("maxmemory-policy is volatile-lru")
                && snapshots.setting.starts_with("only snapshots persist records")
        ),
        "{warnings:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_passes_a_durable_server() {
    let Some(server) = TestServer::start(&[
        "--maxmemory-policy",
        "noeviction",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .await
    else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    store.migrate().await.unwrap();
    let warnings = store.check_config().await.unwrap();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_covers_every_master_of_a_cluster() {
    let Some(urls) = common::cluster_urls() else {
        return;
    };
    let store = RedisStore::connect_cluster(&urls).await.unwrap();
    let warnings = store.check_config().await.unwrap();
    // scripts/test's cluster runs without persistence, so each of its 3 masters is reported.
    let unpersisted: std::collections::BTreeSet<&str> = warnings
        .iter()
        .filter(|w| w.setting.starts_with("persistence is off on "))
        .map(|w| w.setting.as_str())
        .collect();
    assert_eq!(unpersisted.len(), 3, "{warnings:#?}");
}

/// Checkpoints on Redis through the executor, counted at the sink: an attempt that paid, saved
/// the payment and then failed retryably is retried, and the retry finds the payment and does
/// not pay again (the suite's checkpoint cases pass for a store that keeps none, so this pins
/// that this one keeps them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_finds_the_checkpoint_its_failed_attempt_saved_and_pays_once() {
    let Some(server) = TestServer::start(&[]).await else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let executor = idem_core::Executor::new(store);
    let scope = Scope::new("checkout").unwrap();
    let key = IdempotencyKey::new("order-1").unwrap();
    let payments = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    for attempt_no in 1..=2 {
        let payments = payments.clone();
        let execution = executor
            .run(&scope, &key, &fingerprint(), move |attempt| async move {
                let paid: Option<u32> = attempt.checkpoint_value("paid").unwrap();
                let payment = match paid {
                    Some(payment) => payment,
                    None => {
                        let payment = payments.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if let Err(e) = attempt.checkpoint("paid", &payment).await {
                            return idem_core::Outcome::retryable_json(503, e.to_string());
                        }
                        payment
                    }
                };
                if attempt_no == 1 {
                    // The receipt service is down: retry later, the payment is saved.
                    return idem_core::Outcome::retryable_json(503, "receipts down");
                }
                idem_core::Outcome::definitive_json(200, serde_json::json!({"payment": payment}))
            })
            .await
            .unwrap();
        assert!(!execution.is_replay());
    }
    assert_eq!(payments.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A completion that finds its record's stored metadata unreadable (damaged by hand, or by
/// another program writing under idem's keys) answers a corrupt-record error, not `Fenced`: a
/// holder told it was fenced would conclude another caller owns the key, where nobody does. The
/// record is left as it was found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_on_an_unreadable_record_is_a_corrupt_record_error_and_writes_nothing() {
    let Some(server) = TestServer::start(&[]).await else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let policy = Policy::default();
    let id = RecordId::new(
        Scope::new("damaged").unwrap(),
        IdempotencyKey::new("k").unwrap(),
    );
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&id, &fingerprint(), &policy, now)
        .await
        .unwrap()
    else {
        panic!("a fresh key is claimed");
    };
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let records: Vec<String> = redis::cmd("KEYS")
        .arg("idem:*:r:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    let [record] = &records[..] else {
        panic!("one record: {records:?}");
    };
    let damaged = "p-not-idem-metadata";
    let _: i64 = redis::cmd("HSET")
        .arg(record)
        .arg("m")
        .arg(damaged)
        .query_async(&mut raw)
        .await
        .unwrap();
    let outcome = idem_core::Outcome::definitive_json(201, serde_json::json!({"ok": true}));
    let err = store
        .complete(&id, token, &outcome, &policy, now)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "corrupt", "{err}");
    let (m, o): (String, Option<String>) = redis::cmd("HMGET")
        .arg(record)
        .arg("m")
        .arg("o")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!((m.as_str(), o), (damaged, None));
}

/// Native expiry is set relative to the caller's `now` (ttl + margin from the write), so a caller
/// whose clock is decades in the past or the future neither loses its record at once nor keeps
/// it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_expiry_is_relative_to_the_callers_clock() {
    let Some(server) = TestServer::start(&[]).await else {
        return;
    };
    let margin = Duration::from_secs(600);
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .with_gc_margin(margin);
    let policy = Policy::builder()
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap();
    let scope = Scope::new("expiry").unwrap();
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let year = 365 * 24 * 3600 * 1000;
    for (name, now) in [
        ("past", Timestamp::from_millis(5 * year)),
        ("future", Timestamp::from_millis(230 * year)),
    ] {
        let key = IdempotencyKey::new(name).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        let answer = store
            .claim(&id, &fingerprint(), &policy, now)
            .await
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
        let records: Vec<String> = redis::cmd("KEYS")
            .arg("idem:*:r:*")
            .query_async(&mut raw)
            .await
            .unwrap();
        let mut ttls = Vec::new();
        for record in &records {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(record)
                .query_async(&mut raw)
                .await
                .unwrap();
            ttls.push(ttl);
        }
        let expected = (3600 + 600) * 1000;
        assert!(
            ttls.iter()
                .all(|t| *t > expected - 60_000 && *t <= expected),
            "{name}: native ttls {ttls:?}, expected about {expected} ms"
        );
        assert!(store.get(&id, now).await.unwrap().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_never_prints_the_password() {
    let Some(server) = TestServer::start(&["--requirepass", "s3cret-pa55"]).await else {
        return;
    };
    let url = server.url().replace("redis://", "redis://:s3cret-pa55@");
    let store = RedisStore::connect(&url).await.unwrap();
    let debug = format!("{store:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
    assert!(debug.contains("127.0.0.1"), "{debug}");
    assert_eq!(store.backend(), "redis");
    // And it works through the password.
    let key = IdempotencyKey::new("k").unwrap();
    let scope = Scope::new("auth").unwrap();
    let now = Timestamp::now();
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), key.clone()),
                &fingerprint(),
                &Policy::default(),
                now
            )
            .await
            .unwrap(),
        ClaimAnswer::Claimed { .. }
    ));
}

#[test]
fn prefixes_that_would_break_the_hash_tag_are_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(server) = rt.block_on(TestServer::start(&[])) else {
        return;
    };
    let store = rt.block_on(RedisStore::connect(&server.url())).unwrap();
    assert!(store.clone().with_prefix("a{b").is_err());
    assert!(store.clone().with_prefix("").is_err());
    assert_eq!(store.with_prefix("app:idem").unwrap().prefix(), "app:idem");
}
