//! contract [§3.6](idem_core::contract#guarantee-6) and [§3.7](idem_core::contract#guarantee-7):
//! expiry, purge, inspection.
//!
//! The purge and list cases run decades in the past (see the crate docs), so that purging cannot
//! touch the records of cases running at the wall clock's time. Each purging case has a time
//! window of its own, and the purging windows come before the listing ones (1980–2000):
//!
//! | case | window |
//! | --- | --- |
//! | `expiry_purge_deletes_in_batches_and_keeps_live` | 1972–1973 |
//! | `expiry_tokens_never_reused_after_purge` | 1974–1975 |
//! | `checkpoint_gone_after_expiry_and_purge` | 1975–1976 |
//! | `expiry_purge_returns_exactly_what_it_deleted` | 1977–1979 |
//!
//! A purge at `now` deletes every record expired by `now`, so a purging case may still find a
//! record of its own deleted, or held (`SKIP LOCKED`), by a later window's purge: each tolerates
//! that by purging until its own records are gone, and the exact count is checked where only a
//! foreign record expiring in the same millisecond could disturb it.

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{ClaimKind, RecordState};

use super::*;
use crate::harness::Harness;

mod inspect;

pub(crate) use inspect::{
    inspect_get_returns_the_record, inspect_list_filters_by_state_scope_and_age,
    inspect_list_in_flight_returns_only_stale_processing,
};

/// An expired record is absent to `get`, from any handle.
pub(crate) async fn expiry_expired_record_is_absent_to_get(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    store
        .complete(&id, token, &ok("T"), &policy(), h.now())
        .await
        .unwrap();
    h.advance(TTL + Duration::from_secs(1));
    assert_eq!(store.get(&id, h.now()).await.unwrap(), None);
    assert_eq!(h.store().await.get(&id, h.now()).await.unwrap(), None);
}

/// `now == expires_at` is expired; one millisecond before is not.
pub(crate) async fn expiry_boundary_is_exact(h: Harness) {
    let (store, id) = one(&h).await;
    let t0 = h.now();
    let token = claim_new(&store, &id, &fp("a"), &policy(), t0).await;
    store
        .complete(&id, token, &ok("T"), &policy(), t0)
        .await
        .unwrap();
    let expires = t0 + TTL;
    let before = expires - Duration::from_millis(1);
    assert!(
        store.get(&id, before).await.unwrap().is_some(),
        "alive 1 ms before expires_at"
    );
    assert_eq!(
        store.claim(&id, &fp("a"), &policy(), before).await.unwrap(),
        ClaimAnswer::Replay(ok("T"))
    );
    assert_eq!(
        store.get(&id, expires).await.unwrap(),
        None,
        "gone at expires_at"
    );
    let answer = store
        .claim(&id, &fp("a"), &policy(), expires)
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            ClaimAnswer::Claimed {
                kind: ClaimKind::ExpiredReplaced,
                attempt: 1,
                ..
            }
        ),
        "{answer:?}"
    );
}

/// An expired completed record is replaced by a new claim (even for another request), whose
/// token continues upward; the old outcome is gone.
pub(crate) async fn expiry_expired_completed_is_claimed_again(h: Harness) {
    let (store, id, old) = one_claimed(&h, &policy()).await;
    store
        .complete(&id, old, &ok("T-old"), &policy(), h.now())
        .await
        .unwrap();
    h.advance(TTL + Duration::from_secs(60));
    let answer = store
        .claim(&id, &fp("b"), &policy(), h.now())
        .await
        .unwrap();
    let (token, attempt, kind) = won(&answer, "expired record");
    assert_eq!((attempt, kind), (1, ClaimKind::ExpiredReplaced));
    assert!(
        token > old,
        "the token continues upward: {token:?} after {old:?}"
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.fingerprint, r.outcome),
        (RecordState::Processing, fp("b"), None)
    );
    assert_eq!(r.created_at, h.now(), "a new record");
}

/// A holder whose record expired can no longer complete, release or extend.
pub(crate) async fn expiry_holder_cannot_act_after_expiry(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    h.advance(TTL);
    assert_all_fenced(&store, &id, token, h.now()).await;
    assert_eq!(store.get(&id, h.now()).await.unwrap(), None);
}

/// `purge_expired` deletes expired records in batches of at most `limit` and never a live one.
pub(crate) async fn expiry_purge_deletes_in_batches_and_keeps_live(h: Harness) {
    let store = h.store().await;
    let base = ancient(1972, 1973);
    let scope = h.scope("purge");
    let mut expired = Vec::new();
    for i in 0..5 {
        let key = h.key(&format!("old-{i}"));
        let id = RecordId::new(scope.clone(), key.clone());
        let t = claim_new(&store, &id, &fp("a"), &policy(), base).await;
        if i % 2 == 0 {
            store
                .complete(&id, t, &ok("T"), &policy(), base)
                .await
                .unwrap();
        }
        expired.push(key);
    }
    // Live at purge time: claimed later, with a ttl reaching far beyond any purge of the suite.
    let long = policy()
        .to_builder()
        .ttl(Duration::from_secs(200 * 365 * 24 * 3600))
        .build()
        .unwrap();
    let live = h.key("live");
    let live_at = base + Duration::from_secs(5400);
    let id = RecordId::new(scope.clone(), live.clone());
    let t = claim_new(&store, &id, &fp("a"), &long, live_at).await;
    store
        .complete(&id, t, &ok("L"), &long, live_at)
        .await
        .unwrap();

    let purge_at = base + TTL + Duration::from_secs(3600);
    // Other cases may purge the same storage at the same time (a purge deletes every expired
    // record), and a store may skip rows another purge holds: so this case checks the batch bound
    // of its own calls, and that purging until a call finds less than a batch leaves none of its
    // expired records, allowing a concurrent purge to finish committing.
    let mut rounds = 0;
    loop {
        let n = store.purge_expired(purge_at, 2).await.unwrap();
        assert!(
            n <= 2,
            "purge_expired deleted {n} records with a limit of 2"
        );
        rounds += 1;
        assert!(rounds < 10_000, "purge never finished");
        if n == 2 {
            continue;
        }
        let mut left = Vec::new();
        for key in &expired {
            if store
                .get(&RecordId::new(scope.clone(), key.clone()), base)
                .await
                .unwrap()
                .is_some()
            {
                left.push(key.to_string());
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            rounds < 1_000,
            "expired records still stored after purging: {left:?}"
        );
        tokio::task::yield_now().await;
    }
    let r = store
        .get(&id, purge_at)
        .await
        .unwrap()
        .expect("live record purged");
    assert_eq!(r.outcome, Some(ok("L")));
}

/// `purge_expired(now, limit)` returns exactly the number of records it deleted; a record with
/// `expires_at == now` is expired and deleted, one with `expires_at == now + 1 ms` is live and
/// kept. (A store that reports fewer than it deleted stops `purge_expired_all` early.)
///
/// The case first purges everything that expired before its own records, so that the count is
/// its own alone; should a foreign record still slip in (another run purging or writing the same
/// instant), it tries again in a new window, and fails only if no attempt is exact.
pub(crate) async fn expiry_purge_returns_exactly_what_it_deleted(h: Harness) {
    const ATTEMPTS: usize = 5;
    const EXPIRING: usize = 3;
    let store = h.store().await;
    let mut tries = Vec::new();
    for attempt in 0..ATTEMPTS {
        let scope = h.scope(&format!("purge-{attempt}"));
        let base = ancient(1977, 1979);
        let expires = base + TTL;
        let before = expires - Duration::from_millis(1);
        // Three records expiring at exactly `expires`: completed, processing, failed_retryable.
        let mut expiring = Vec::new();
        for i in 0..EXPIRING {
            let key = h.key(&format!("expiring-{i}"));
            let id = RecordId::new(scope.clone(), key.clone());
            let t = claim_new(&store, &id, &fp("a"), &policy(), base).await;
            match i {
                0 => assert_eq!(
                    store
                        .complete(&id, t, &ok("T"), &policy(), base)
                        .await
                        .unwrap(),
                    CompleteAnswer::Completed
                ),
                2 => {
                    store.release(&id, t, base).await.unwrap();
                }
                _ => {}
            }
            expiring.push(key);
        }
        // Two expiring one millisecond later.
        let later = base + Duration::from_millis(1);
        let mut live = Vec::new();
        for i in 0..2 {
            let key = h.key(&format!("live-{i}"));
            let id = RecordId::new(scope.clone(), key.clone());
            let t = claim_new(&store, &id, &fp("a"), &policy(), later).await;
            if i == 0 {
                store
                    .complete(&id, t, &ok("L"), &policy(), later)
                    .await
                    .unwrap();
            }
            live.push(key);
        }
        let present = |keys: &[idem_core::IdempotencyKey], at: Timestamp| {
            let (store, scope, keys) = (store.clone(), scope.clone(), keys.to_vec());
            async move {
                let mut n = 0;
                for key in &keys {
                    if store
                        .get(&RecordId::new(scope.clone(), key.clone()), at)
                        .await
                        .unwrap()
                        .is_some()
                    {
                        n += 1;
                    }
                }
                n
            }
        };
        // Everything expired before ours goes first; ours are live 1 ms before they expire.
        let mut cleared = 0;
        loop {
            let n = store.purge_expired(before, 1000).await.unwrap();
            cleared += n;
            if n < 1000 {
                break;
            }
        }
        let kept_before = present(&expiring, before).await;
        let deleted = store.purge_expired(expires, 1000).await.unwrap();
        let left = present(&expiring, before).await;
        let kept_live = present(&live, expires).await;
        if (kept_before, deleted, left, kept_live) == (EXPIRING, EXPIRING, 0, live.len()) {
            return;
        }
        tries.push(format!(
            "attempt {attempt}: {kept_before} of {EXPIRING} records with expires_at == now + 1 ms \
             survived a purge at now (cleared {cleared} older records); purging at their \
             expires_at reported {deleted} deleted, left {left} of them, and kept {kept_live} of \
             {} records expiring 1 ms later",
            live.len()
        ));
    }
    panic!(
        "purge_expired must delete records with expires_at <= now, keep later ones, and return \
         exactly how many it deleted (expected {EXPIRING} each time):\n{}",
        tries.join("\n")
    );
}

/// A record purged and created again never gets a token its old holder has: the old holder is
/// fenced out of the new record.
pub(crate) async fn expiry_tokens_never_reused_after_purge(h: Harness) {
    let store = h.store().await;
    let id = h.id("s", "k");
    let base = ancient(1974, 1975);
    let old = claim_new(&store, &id, &fp("a"), &policy(), base).await;
    let later = base + TTL + Duration::from_secs(1);
    // Purge until the record is gone: a concurrent purge of a later window may hold it a moment.
    let mut rounds = 0;
    while store.purge_expired(later, 1000).await.unwrap() == 1000
        || store.get(&id, base).await.unwrap().is_some()
    {
        rounds += 1;
        assert!(
            rounds < 1000,
            "the expired record is still stored after purging"
        );
        tokio::task::yield_now().await;
    }
    // The new record lives far beyond any other case's purge time.
    let long = policy()
        .to_builder()
        .ttl(Duration::from_secs(200 * 365 * 24 * 3600))
        .build()
        .unwrap();
    let (new, attempt) = claimed(
        &store.claim(&id, &fp("a"), &long, later).await.unwrap(),
        "after purge",
    );
    assert_eq!(attempt, 1);
    assert_ne!(new, old, "a token is never reused, even after a purge");
    assert_eq!(
        store
            .complete(&id, old, &ok("old"), &long, later)
            .await
            .unwrap(),
        CompleteAnswer::Fenced
    );
    let r = store.get(&id, later).await.unwrap().unwrap();
    assert_eq!((r.state, r.token), (RecordState::Processing, new));
    // The new holder can; and its record leaves the stale-processing lists of other cases.
    assert_eq!(
        store
            .complete(&id, new, &ok("new"), &long, later)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
}
