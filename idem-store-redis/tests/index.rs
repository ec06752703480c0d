//! Purge and reconciliation around live records whose lease passed (the unreconciled stale
//! backlog): a purge deletes exactly the expired records, one call at a time or in batches, and
//! leaves the stale `processing` records where `list_in_flight` finds them. Against the server
//! named by `IDEM_TEST_REDIS_URL`, under a key prefix of the test's own.

mod common;

use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::store::ListFilter;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idem_store_redis::{RedisStore, redis};

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
        let answer = store
            .claim(&RecordId::new(scope.clone(), key.clone()), &fp, &long, t0)
            .await
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
        let key = IdempotencyKey::new(format!("done-{i}")).unwrap();
        claim_and_complete(
            &store,
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            [&short, &short],
            t0,
            i,
        )
        .await;
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

/// The names under `prefix` matching `pattern` (`SCAN`, the whole keyspace).
/// Claims the fresh record `id` under `policies[0]` and completes it under `policies[1]` with the
/// outcome `{"i": i}`, both at `now`.
async fn claim_and_complete(
    store: &RedisStore,
    id: &RecordId,
    fp: &Fingerprint,
    policies: [&Policy; 2],
    now: Timestamp,
    i: usize,
) {
    let ClaimAnswer::Claimed { token, .. } = store.claim(id, fp, policies[0], now).await.unwrap()
    else {
        panic!("a fresh key is claimed")
    };
    let outcome = Outcome::definitive(200, &serde_json::json!({"i": i})).unwrap();
    store
        .complete(id, token, &outcome, policies[1], now)
        .await
        .unwrap();
}

async fn names(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        found.extend(page);
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

/// The expiry lists every slice registry under `prefix` names (`<base>:x:<slice>` for each slice
/// number in `<base>:xs`), sorted.
async fn registered(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut all = Vec::new();
    for registry in names(conn, &format!("{prefix}:*:xs")).await {
        let base = registry.strip_suffix(":xs").unwrap().to_owned();
        let slices: Vec<String> = redis::cmd("ZRANGE")
            .arg(&registry)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await
            .unwrap();
        all.extend(slices.into_iter().map(|s| format!("{base}:x:{s}")));
    }
    all.sort();
    all
}

/// The scope, fingerprint and start instant of the slice tests.
fn slice_case() -> (Scope, Fingerprint, Timestamp) {
    let scope = Scope::new("tenant/tool").unwrap();
    let fp = Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap();
    (scope, fp, Timestamp::from_millis(1_800_000_000_000))
}

/// Records live for `secs`, under a lease of one second.
fn policy(secs: u64) -> Policy {
    Policy::builder()
        .ttl(Duration::from_secs(secs))
        .lease(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_index_is_slice_lists_which_purge_drains_and_unregisters() {
    let Some((store, prefix, mut conn)) = common::prefixed_store("idem-slices").await else {
        return;
    };
    let (scope, fp, t0) = slice_case();
    // Expiring 2 s after t0, and 10 min after: slices 10 minutes apart.
    let (short, long) = (policy(2), policy(600));
    let n = 200;
    for i in 0..n {
        for (name, p) in [("short", &short), ("long", &long)] {
            let key = IdempotencyKey::new(format!("{name}-{i}")).unwrap();
            claim_and_complete(
                &store,
                &RecordId::new(scope.clone(), key.clone()),
                &fp,
                [p, p],
                t0,
                i,
            )
            .await;
        }
    }
    // Every record is filed once, in a list of its expiry's slice; nothing in the sorted index
    // of earlier versions, nothing left in the lease index.
    let slice = |ms: u64| ms / idem_store_redis::SLICE_MS;
    let lists = names(&mut conn, &format!("{prefix}:*:x:*")).await;
    let mut entries = 0;
    for list in &lists {
        let len: usize = redis::cmd("LLEN")
            .arg(list)
            .query_async(&mut conn)
            .await
            .unwrap();
        entries += len;
        let s: u64 = list.rsplit(':').next().unwrap().parse().unwrap();
        assert!(
            [
                slice(t0.as_millis() + 2_000),
                slice(t0.as_millis() + 600_000)
            ]
            .contains(&s),
            "{list}"
        );
    }
    assert_eq!(entries, 2 * n);
    assert!(
        names(&mut conn, &format!("{prefix}:*:exp"))
            .await
            .is_empty()
    );
    assert!(
        names(&mut conn, &format!("{prefix}:*:lease"))
            .await
            .is_empty()
    );
    // Each registry names exactly the lists of its bucket.
    let mut sorted = lists.clone();
    sorted.sort();
    assert_eq!(registered(&mut conn, &prefix).await, sorted);

    // A purge after the short ones expired deletes exactly them: their slices are gone and
    // unregistered, the long ones' untouched.
    let later = t0 + Duration::from_secs(60);
    assert_eq!(store.purge_expired(later, 10_000).await.unwrap(), n);
    let lists = names(&mut conn, &format!("{prefix}:*:x:*")).await;
    assert!(
        lists
            .iter()
            .all(|l| l.ends_with(&format!(":x:{}", slice(t0.as_millis() + 600_000))))
    );
    let mut sorted = lists.clone();
    sorted.sort();
    assert_eq!(registered(&mut conn, &prefix).await, sorted);
    assert_eq!(
        store
            .list(&ListFilter::default(), later, 10_000)
            .await
            .unwrap()
            .len(),
        n
    );

    // A purge inside the long ones' slice, before they expire, looks at each once and keeps it
    // (filed again in the same slice); after, they all go and the index is empty.
    let inside =
        Timestamp::from_millis(slice(t0.as_millis() + 600_000) * idem_store_redis::SLICE_MS);
    if inside < t0 + Duration::from_secs(600) {
        assert_eq!(store.purge_expired(inside, 10_000).await.unwrap(), 0);
    }
    let mut entries = 0;
    for list in names(&mut conn, &format!("{prefix}:*:x:*")).await {
        let len: usize = redis::cmd("LLEN")
            .arg(&list)
            .query_async(&mut conn)
            .await
            .unwrap();
        entries += len;
    }
    assert_eq!(entries, n);
    let end = t0 + Duration::from_secs(601);
    assert_eq!(store.purge_expired(end, 10_000).await.unwrap(), n);
    assert!(names(&mut conn, &format!("{prefix}:*")).await.is_empty());
}

/// A completion whose expiry is earlier than its claim's files the record again, in the earlier
/// slice, and the append that creates that slice's list registers it under the slice number the
/// script reads from the list's name: the registries name exactly the lists, and a purge after the
/// earlier expiry finds and deletes every such record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_expires_earlier_files_and_registers_the_earlier_slice() {
    let Some((store, prefix, mut conn)) = common::prefixed_store("idem-earlier").await else {
        return;
    };
    let (scope, fp, t0) = slice_case();
    let (long, short) = (policy(3_600), policy(2));
    let n = 64;
    for i in 0..n {
        let key = IdempotencyKey::new(format!("k-{i}")).unwrap();
        claim_and_complete(
            &store,
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            [&long, &short],
            t0,
            i,
        )
        .await;
    }
    let slice = |ms: u64| ms / idem_store_redis::SLICE_MS;
    let lists = names(&mut conn, &format!("{prefix}:*:x:*")).await;
    let early = lists
        .iter()
        .filter(|l| l.ends_with(&format!(":x:{}", slice(t0.as_millis() + 2_000))))
        .count();
    assert!(early > 0, "the earlier slice has lists: {lists:?}");
    let mut sorted = lists.clone();
    sorted.sort();
    assert_eq!(registered(&mut conn, &prefix).await, sorted);
    // Expired after 2 s: a purge a minute later finds all of them through the earlier slices.
    let later = t0 + Duration::from_secs(60);
    assert_eq!(store.purge_expired(later, 10_000).await.unwrap(), n);
    // The claims' entries in the later slices name deleted records: a purge past them deletes
    // nothing more and leaves no key behind.
    let end = t0 + Duration::from_secs(3_601);
    assert_eq!(store.purge_expired(end, 10_000).await.unwrap(), 0);
    assert!(names(&mut conn, &format!("{prefix}:*")).await.is_empty());
}
