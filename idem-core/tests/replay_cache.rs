//! `ReplayCache`: replays of completed records answered from memory, decided by the same rules.
//!
//! Each test proves where an answer came from by taking the record out of the wrapped store
//! behind the cache's back (a purge at a later `now`, as another process or an operator would):
//! an answer the store could no longer give came from memory, and a `Claimed` came from the store.

use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::store::{ListFilter, ReplayCache};
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

/// Claims and completes `k` with `outcome` at `at`, then replays it once through the cache (the
/// replay that keeps it).
async fn kept_at(cache: &ReplayCache<MemoryStore>, k: &str, outcome: &Outcome, at: Timestamp) {
    let id = RecordId::new(scope(), key(k));
    let ClaimAnswer::Claimed { token, .. } = cache
        .claim(&id, &fp("printer"), &policy(), at)
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    let done = cache.complete(&id, token, outcome, &policy(), at).await;
    assert_eq!(done.unwrap(), CompleteAnswer::Completed);
    let replay = cache.claim(&id, &fp("printer"), &policy(), at).await;
    assert_eq!(replay.unwrap(), ClaimAnswer::Replay(outcome.clone()));
}

/// Whether `k` is answered from memory at `at`: the store behind the cache has been emptied,
/// so a replay can only come from the cache (and a `Claimed` came from the store).
async fn from_memory(cache: &ReplayCache<MemoryStore>, k: &str, at: Timestamp) -> bool {
    let id = RecordId::new(scope(), key(k));
    let answer = cache.claim(&id, &fp("printer"), &policy(), at).await;
    matches!(answer.unwrap(), ClaimAnswer::Replay(_))
}

/// An outcome too large to keep is passed over: it does not push out what is kept.
#[tokio::test]
async fn an_outcome_over_the_byte_bound_evicts_nothing() {
    let store = MemoryStore::new();
    let small = ticket("T-1");
    let large = ticket(&"T".repeat(3 * small.size()));
    let cache = ReplayCache::new(store.clone()).max_bytes(2 * small.size());
    kept_at(&cache, "k1", &small, NOW).await;
    completed_and_replayed(&cache, "k2", &large).await;
    gone_from_the_store(&store).await;
    assert!(from_memory(&cache, "k1", NOW).await);
    assert!(!from_memory(&cache, "k2", NOW).await);
}

/// An eviction gives back the bytes of what it evicted: with room for two outcomes, a third
/// pushes out the oldest, and a fourth the next one (the count is two outcomes again, not less).
#[tokio::test]
async fn each_eviction_gives_back_the_bytes_of_what_it_evicted() {
    let store = MemoryStore::new();
    let s = ticket("T-1").size();
    let cache = ReplayCache::new(store.clone()).max_bytes(2 * s);
    for (k, t) in [("k1", "T-1"), ("k2", "T-2"), ("k3", "T-3"), ("k4", "T-4")] {
        kept_at(&cache, k, &ticket(t), NOW).await;
    }
    store.purge_expired(NOW + TTL * 2, 1000).await.unwrap();
    assert!(from_memory(&cache, "k3", NOW).await);
    assert!(from_memory(&cache, "k4", NOW).await);
    assert!(
        !from_memory(&cache, "k2", NOW).await,
        "k2 kept beyond the bound"
    );
    assert!(!from_memory(&cache, "k1", NOW).await);
}

/// The byte bound counts what is kept now: a key kept again after its record expired and was
/// replaced counts once, and a purge through the cache gives back the bytes of what it dropped.
#[tokio::test]
async fn the_byte_bound_counts_a_record_kept_again_once_and_what_a_purge_dropped_not_at_all() {
    let store = MemoryStore::new();
    let s = ticket("T-1").size();
    let cache = ReplayCache::new(store.clone()).max_bytes(2 * s);
    let later = NOW + TTL + Duration::from_secs(1);
    let far = NOW + TTL * 10;

    // k1 kept, expired, claimed again in the store and kept again: one record of s bytes.
    kept_at(&cache, "k1", &ticket("T-1"), NOW).await;
    kept_at(&cache, "k1", &ticket("T-2"), later).await;
    // With room for one more of s bytes, k2 fits beside it.
    kept_at(&cache, "k2", &ticket("T-3"), later).await;
    store.purge_expired(far, 1000).await.unwrap();
    assert!(from_memory(&cache, "k1", later).await, "k1 counted twice");
    assert!(from_memory(&cache, "k2", later).await);

    // A purge drops a (expired) and gives its s bytes back: b (s bytes) is left. One of more
    // than s bytes then fits only if b makes way.
    let cache = ReplayCache::new(store.clone()).max_bytes(2 * s);
    let b_at = NOW + TTL / 2;
    kept_at(&cache, "a", &ticket("T-4"), NOW).await;
    kept_at(&cache, "b", &ticket("T-5"), b_at).await;
    cache.purge_expired(later, 1000).await.unwrap();
    let larger = ticket(&format!("T-{}", "6".repeat(s / 2)));
    assert!(
        larger.size() > s && larger.size() <= 2 * s - 2,
        "{}",
        larger.size()
    );
    kept_at(&cache, "c", &larger, later).await;
    store.purge_expired(far, 1000).await.unwrap();
    assert!(from_memory(&cache, "c", later).await);
    assert!(
        !from_memory(&cache, "b", later).await,
        "b kept beyond the bound"
    );

    // A purge gives back the bytes of what it dropped, not of what it kept: `d` (s bytes)
    // dropped, `e` (2 bytes fewer) kept; `f` (1 byte more than s) then fits beside `e`.
    let cache = ReplayCache::new(store.clone()).max_bytes(2 * s);
    let (d, e, f) = (ticket("T-7"), ticket("8"), ticket("T-99"));
    assert_eq!((d.size(), e.size() + 2, f.size() - 1), (s, s, s));
    kept_at(&cache, "d", &d, NOW).await;
    kept_at(&cache, "e", &e, b_at).await;
    cache.purge_expired(later, 1000).await.unwrap();
    kept_at(&cache, "f", &f, later).await;
    store.purge_expired(far, 1000).await.unwrap();
    assert!(from_memory(&cache, "f", later).await);
    assert!(
        from_memory(&cache, "e", later).await,
        "e made way: the purge gave back the bytes of what it kept"
    );
}

/// The byte bound is inclusive: an outcome of exactly `max_bytes` is kept.
#[tokio::test]
async fn an_outcome_of_exactly_the_byte_bound_is_kept() {
    let store = MemoryStore::new();
    let outcome = ticket("T-1");
    let cache = ReplayCache::new(store.clone()).max_bytes(outcome.size());
    completed_and_replayed(&cache, "k1", &outcome).await;
    gone_from_the_store(&store).await;
    assert!(from_memory(&cache, "k1", NOW).await);
}

/// What the cache does not answer goes to the store behind it: `get` reads the store's record,
/// and `backend` (the label of every store metric) names the store's engine.
#[tokio::test]
async fn reads_and_the_backend_name_are_the_stores() {
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    let id = RecordId::new(scope(), key("k1"));
    let claimed = cache.claim(&id, &fp("printer"), &policy(), NOW).await;
    assert!(matches!(claimed.unwrap(), ClaimAnswer::Claimed { .. }));
    let record = cache
        .get(&id, NOW)
        .await
        .unwrap()
        .expect("the store's record");
    assert_eq!(record.state, idem_core::RecordState::Processing);
    assert_eq!(Some(record), store.get(&id, NOW).await.unwrap());
    assert_eq!(cache.backend(), "memory");
}

/// The token of a first claim of `id` through `cache`, at `NOW`.
async fn claimed(cache: &ReplayCache<MemoryStore>, id: &RecordId) -> idem_core::Token {
    let answer = cache.claim(id, &fp("printer"), &policy(), NOW).await;
    let ClaimAnswer::Claimed { token, .. } = answer.unwrap() else {
        panic!("not claimed")
    };
    token
}

/// What is not a replay goes to the store behind the cache: a step saved through the cache is
/// in the store's record (a retry resumes from it), the reconciler, listing stale claims through
/// the cache, finds the one whose lease ended, and an operator's listing shows the record.
#[tokio::test]
async fn steps_and_the_listing_of_stale_claims_go_through_to_the_store() {
    use idem_core::machine::CheckpointAnswer;
    let store = MemoryStore::new();
    let cache = ReplayCache::new(store.clone());
    let id = RecordId::new(scope(), key("k1"));
    let token = claimed(&cache, &id).await;
    let step = idem_core::Checkpoint::new("charged", r#"{"charge":"ch_1"}"#, NOW).unwrap();
    let saved = cache
        .as_checkpoint_store()
        .expect("the cache keeps the store's checkpoints")
        .checkpoint(&id, token, &step, &policy())
        .await
        .unwrap();
    assert_eq!(saved, CheckpointAnswer::Saved);
    let record = store.get(&id, NOW).await.unwrap().unwrap();
    assert_eq!(record.last_checkpoint().unwrap().name(), "charged");

    let after_the_lease = NOW + Duration::from_secs(31);
    let stale = cache.list_in_flight(after_the_lease, 10).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!((stale[0].id(), &stale[0].token), (id.clone(), &token));
    let listed = cache.list(&ListFilter::default(), NOW, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id(), id);
}

/// A repeat waiting through the cache waits on the store's wake-ups: its wait does not end
/// while the record is as it saw it, and ends once the holder completes.
#[tokio::test]
async fn a_wait_through_the_cache_ends_when_the_record_changes() {
    let store = MemoryStore::new();
    let cache = std::sync::Arc::new(ReplayCache::new(store.clone()));
    let id = RecordId::new(scope(), key("k1"));
    let token = claimed(&cache, &id).await;
    let seen = cache.get(&id, NOW).await.unwrap().unwrap();
    let waiting = cache.clone();
    let wait = tokio::spawn(async move {
        let clock = idem_core::ManualClock::new(NOW);
        waiting
            .wait_for_change(&seen, &clock, &idem_core::Timer::tokio())
            .await
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!wait.is_finished(), "the record has not changed");
    let done = cache
        .complete(&id, token, &ticket("T-1"), &policy(), NOW)
        .await;
    assert_eq!(done.unwrap(), CompleteAnswer::Completed);
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("woken by the completion")
        .unwrap()
        .unwrap();
}
