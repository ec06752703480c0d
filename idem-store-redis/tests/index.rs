//! Purge and reconciliation around live records whose lease passed (the unreconciled stale
//! backlog): a purge deletes exactly the expired records, one call at a time or in batches, and
//! leaves the stale `processing` records where `list_in_flight` finds them. Against the server
//! named by `IDEM_TEST_REDIS_URL`, under a key prefix of the test's own.

mod common;

use std::time::Duration;

use idem_core::{
    ClaimAnswer, Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, Policy, RecordState,
    Scope, Timestamp,
};
use idem_store_redis::RedisStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_stale_processing_records_which_stay_listed() {
    let Some(url) = common::url() else { return };
    let prefix = common::unique("idem-index");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(&prefix)
        .unwrap();
    let scope = Scope::new("tenant/tool").unwrap();
    let fp = Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap();
    let t0 = Timestamp::from_millis(1_000_000);
    // Stale once the lease (1 s) passes, live for 100 s.
    let long = Policy::builder()
        .ttl(Duration::from_secs(100))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    // Completed records expired 2 s after t0: scored after every stale lease of their bucket.
    let short = Policy::builder()
        .ttl(Duration::from_secs(2))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    // Enough of each that every bucket holds stale entries ahead of expired ones.
    let n = 256;
    for i in 0..n {
        let key = IdempotencyKey::new(format!("stale-{i}")).unwrap();
        let answer = store.claim(&scope, &key, &fp, &long, t0).await.unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
        let key = IdempotencyKey::new(format!("done-{i}")).unwrap();
        let ClaimAnswer::Claimed { token, .. } =
            store.claim(&scope, &key, &fp, &short, t0).await.unwrap()
        else {
            panic!("a fresh key is claimed")
        };
        let outcome = Outcome::definitive(200, &serde_json::json!({"i": i})).unwrap();
        store
            .complete(&scope, &key, token, &outcome, &short, t0)
            .await
            .unwrap();
    }
    let now = t0 + Duration::from_secs(50);
    // One deletion per call, each answering exactly how many it deleted.
    let mut deleted = 0;
    loop {
        let d = store.purge_expired(now, 1).await.unwrap();
        assert!(d <= 1);
        if d == 0 {
            break;
        }
        deleted += d;
    }
    assert_eq!(deleted, n);
    // Then in batches: nothing is left to delete, the stale records are untouched.
    assert_eq!(store.purge_expired(now, 10_000).await.unwrap(), 0);
    let stale = store.list_in_flight(now, 10_000).await.unwrap();
    assert_eq!(stale.len(), n);
    assert!(stale.iter().all(|r| r.state == RecordState::Processing));
    let filter = ListFilter::default();
    assert_eq!(store.list(&filter, now, 10_000).await.unwrap().len(), n);
    // Once expired, they go too.
    let later = t0 + Duration::from_secs(101);
    assert_eq!(store.purge_expired(later, 10_000).await.unwrap(), n);
    assert!(store.list_in_flight(later, 10).await.unwrap().is_empty());
}
