//! `ReplayCache`: replays of completed records answered from memory, decided by the same rules.
//!
//! Each test proves where an answer came from by taking the record out of the wrapped store
//! behind the cache's back (a purge at a later `now`, as another process or an operator would):
//! an answer the store could no longer give came from memory, and a `Claimed` came from the store.

use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::store::ReplayCache;
use idem_core::{
    ClaimKind, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome, Policy, RecordId,
    Scope, Timestamp,
};
use serde_json::json;

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const TTL: Duration = Duration::from_secs(3600);

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .ttl(TTL)
        .build()
        .unwrap()
}

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp(title: &str) -> Fingerprint {
    Fingerprint::of("create_ticket", &json!({ "title": title })).unwrap()
}

fn ticket(id: &str) -> Outcome {
    Outcome::definitive(201, &json!({ "ticket_id": id })).unwrap()
}

/// Claims and completes `k` with `outcome`, then replays it once through the cache (the replay
/// that keeps it).
async fn completed_and_replayed(cache: &ReplayCache<MemoryStore>, k: &str, outcome: &Outcome) {
    let ClaimAnswer::Claimed { token, .. } = cache
        .claim(
            &RecordId::new(scope(), key(k)),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    let done = cache
        .complete(
            &RecordId::new(scope(), key(k)),
            token,
            outcome,
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
    let replay = cache
        .claim(
            &RecordId::new(scope(), key(k)),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(replay, ClaimAnswer::Replay(outcome.clone()));
}

/// Takes every record out of `store` (a purge after they all expired).
async fn gone_from_the_store(store: &MemoryStore) {
    store.purge_expired(NOW + TTL * 2, 1000).await.unwrap();
    assert!(
        store
            .get(&RecordId::new(scope(), key("k1")), NOW)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_kept_record_is_replayed_and_refuses_another_request_without_the_store() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    let outcome = ticket("T-1");
    completed_and_replayed(&cache, "k1", &outcome).await;
    gone_from_the_store(&store).await;

    let later = NOW + Duration::from_secs(60);
    let replay = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            later,
        )
        .await
        .unwrap();
    assert_eq!(replay, ClaimAnswer::Replay(outcome));
    let other = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("a different request"),
            &policy(),
            later,
        )
        .await
        .unwrap();
    assert_eq!(other, ClaimAnswer::FingerprintMismatch);
    // Another scope with the same key is another record: the store's (absent, so claimed).
    let elsewhere = Scope::new("tenant-b/create_ticket").unwrap();
    let claimed = cache
        .claim(
            &RecordId::new(elsewhere.clone(), key("k1")),
            &fp("printer"),
            &policy(),
            later,
        )
        .await
        .unwrap();
    assert!(
        matches!(claimed, ClaimAnswer::Claimed { .. }),
        "{claimed:?}"
    );
}

#[tokio::test]
async fn a_kept_record_that_expired_is_claimed_in_the_store() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    completed_and_replayed(&cache, "k1", &ticket("T-1")).await;

    let expired = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW + TTL,
        )
        .await
        .unwrap();
    assert!(
        matches!(
            expired,
            ClaimAnswer::Claimed {
                kind: ClaimKind::ExpiredReplaced,
                ..
            }
        ),
        "{expired:?}"
    );
    let record = store
        .get(&RecordId::new(scope(), key("k1")), NOW + TTL)
        .await
        .unwrap();
    assert!(record.is_some(), "the new claim is in the store");
}

#[tokio::test]
async fn only_completed_records_are_kept() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    let ClaimAnswer::Claimed { token, .. } = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    let in_flight = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert!(matches!(in_flight, ClaimAnswer::InFlight { .. }));
    // A retryable outcome leaves the record claimable: not kept, the next claim is the store's.
    let failed = Outcome::retryable(503, &json!({ "error": "busy" })).unwrap();
    cache
        .complete(
            &RecordId::new(scope(), key("k1")),
            token,
            &failed,
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    let retry = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert!(
        matches!(
            retry,
            ClaimAnswer::Claimed {
                kind: ClaimKind::Retry,
                ..
            }
        ),
        "{retry:?}"
    );
}

#[tokio::test]
async fn the_oldest_kept_record_goes_first_when_entries_run_out() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone()).max_entries(1);
    completed_and_replayed(&cache, "k1", &ticket("T-1")).await;
    completed_and_replayed(&cache, "k2", &ticket("T-2")).await;
    gone_from_the_store(&store).await;

    // k2 is kept; k1 was evicted, so its claim reaches the store, which no longer has it.
    let k2 = cache
        .claim(
            &RecordId::new(scope(), key("k2")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(k2, ClaimAnswer::Replay(ticket("T-2")));
    let k1 = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert!(matches!(k1, ClaimAnswer::Claimed { .. }), "{k1:?}");
}

#[tokio::test]
async fn an_outcome_over_the_byte_bound_is_not_kept() {
    let store = MemoryStore::new();
    let outcome = ticket("T-1");
    let cache = ReplayCache::new(store.clone()).max_bytes(outcome.size() - 1);
    completed_and_replayed(&cache, "k1", &outcome).await;
    gone_from_the_store(&store).await;

    let k1 = cache
        .claim(
            &RecordId::new(scope(), key("k1")),
            &fp("printer"),
            &policy(),
            NOW,
        )
        .await
        .unwrap();
    assert!(matches!(k1, ClaimAnswer::Claimed { .. }), "{k1:?}");
}

#[tokio::test]
async fn a_purge_through_the_cache_drops_what_expired() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    completed_and_replayed(&cache, "k1", &ticket("T-1")).await;
    assert!(format!("{cache:?}").contains("kept: 1"), "{cache:?}");
    cache.purge_expired(NOW + TTL, 1000).await.unwrap();
    assert!(format!("{cache:?}").contains("kept: 0"), "{cache:?}");
}
