//! [contract §2](idem_core::contract#complete) `complete` / `release` / `extend` and [contract
//! §3.3](idem_core::contract#guarantee-3): only the current token acts.

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{CachePolicy, RecordState};

use super::*;
use crate::harness::Harness;

/// Definitive outcome → `completed`, outcome stored, expiry renewed to now + ttl.
pub(crate) async fn fencing_complete_definitive_completes(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    h.advance(Duration::from_secs(3));
    let answer = store
        .complete(&id, token, &ok("T-1"), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    let r = read_back(&h, &id).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.outcome, Some(ok("T-1")));
    assert_eq!(r.token, token);
    assert_eq!(r.expires_at, h.now() + TTL, "completion renews the expiry");
}

/// Retryable outcome under `DefinitiveOnly` → `failed_retryable`; the next claim runs again.
pub(crate) async fn fencing_retryable_under_definitive_only_is_failed_retryable(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    let answer = store
        .complete(&id, token, &retryable(), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::MarkedRetryable);
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(r.state, RecordState::FailedRetryable);
    assert_claimed_again(&store, &id, h.now()).await;
}

/// Retryable outcome under `CacheAll` → `completed`; it replays forever.
pub(crate) async fn fencing_retryable_under_cache_all_completes(h: Harness) {
    let (store, id) = one(&h).await;
    let all = policy()
        .to_builder()
        .cache(CachePolicy::CacheAll)
        .build()
        .unwrap();
    let token = claim_new(&store, &id, &fp("a"), &all, h.now()).await;
    let answer = store
        .complete(&id, token, &retryable(), &all, h.now())
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    let again = store.claim(&id, &fp("a"), &all, h.now()).await.unwrap();
    assert_eq!(again, ClaimAnswer::Replay(retryable()));
}

/// A record completes once: a second `complete` with the same token is `Fenced` and the first
/// outcome stands.
pub(crate) async fn fencing_second_complete_is_fenced(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    store
        .complete(&id, token, &ok("T-1"), &policy(), h.now())
        .await
        .unwrap();
    let second = store
        .complete(&id, token, &ok("T-2"), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(second, CompleteAnswer::Fenced);
    assert_eq!(
        store.release(&id, token, h.now()).await.unwrap(),
        ReleaseAnswer::Fenced
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.outcome),
        (RecordState::Completed, Some(ok("T-1")))
    );
}

/// Holder A's lease elapses, B takes over and completes; A's late `complete` is `Fenced` and
/// B's outcome stands.
pub(crate) async fn fencing_stale_token_cannot_complete_after_takeover(h: Harness) {
    let (a, id) = one(&h).await;
    let b = h.store().await;
    let old = claim_new(&a, &id, &fp("a"), &takeover(), h.now()).await;
    h.advance(LEASE + Duration::from_secs(1));
    let (new, _) = claimed(
        &b.claim(&id, &fp("a"), &takeover(), h.now()).await.unwrap(),
        "takeover",
    );
    // The old holder tries before and after the new one finishes.
    assert_eq!(
        a.complete(&id, old, &ok("A"), &takeover(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::Fenced
    );
    assert_eq!(
        b.complete(&id, new, &ok("B"), &takeover(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    assert_eq!(
        a.complete(&id, old, &ok("A"), &takeover(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::Fenced
    );
    let r = a.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(r.outcome, Some(ok("B")), "the newer holder's result stands");
    assert_eq!(r.token, new);
}

/// A stale token cannot release the newer holder's claim.
pub(crate) async fn fencing_stale_token_cannot_release(h: Harness) {
    let (store, id, old) = one_claimed(&h, &takeover()).await;
    h.advance(LEASE);
    let (new, _) = claimed(
        &store
            .claim(&id, &fp("a"), &takeover(), h.now())
            .await
            .unwrap(),
        "takeover",
    );
    assert_eq!(
        store.release(&id, old, h.now()).await.unwrap(),
        ReleaseAnswer::Fenced
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.token),
        (RecordState::Processing, new),
        "still the new holder's claim"
    );
    // And a forged token with the current seq but another id is fenced too.
    let forged = Token::with_id(new.seq, new.id ^ 1);
    assert_all_fenced(&store, &id, forged, h.now()).await;
    assert_eq!(store.get(&id, h.now()).await.unwrap().unwrap(), r);
}

/// A stale token cannot extend the lease.
pub(crate) async fn fencing_stale_token_cannot_extend(h: Harness) {
    let (store, id, old) = one_claimed(&h, &takeover()).await;
    h.advance(LEASE);
    claimed(
        &store
            .claim(&id, &fp("a"), &takeover(), h.now())
            .await
            .unwrap(),
        "takeover",
    );
    let before = store.get(&id, h.now()).await.unwrap().unwrap();
    let answer = store
        .extend(&id, old, Duration::from_secs(3600), h.now())
        .await
        .unwrap();
    assert_eq!(answer, ExtendAnswer::Fenced);
    assert_eq!(
        store.get(&id, h.now()).await.unwrap().unwrap(),
        before,
        "nothing written"
    );
}

/// complete / release / extend on a key that was never claimed are `Fenced` and create nothing.
pub(crate) async fn fencing_unknown_key_is_fenced(h: Harness) {
    let (store, id) = one(&h).await;
    let token = Token::new(1);
    assert_all_fenced(&store, &id, token, h.now()).await;
    assert_eq!(
        store.get(&id, h.now()).await.unwrap(),
        None,
        "no record created"
    );
}

/// `release` → `failed_retryable` without outcome; the retry claims with the next token.
pub(crate) async fn fencing_release_then_retry(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    assert_eq!(
        store.release(&id, token, h.now()).await.unwrap(),
        ReleaseAnswer::Released
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.outcome.as_ref()),
        (RecordState::FailedRetryable, None)
    );
    assert_eq!(
        store.release(&id, token, h.now()).await.unwrap(),
        ReleaseAnswer::Fenced,
        "released once"
    );
    let (next, attempt) = claimed(
        &store
            .claim(&id, &fp("a"), &policy(), h.now())
            .await
            .unwrap(),
        "after release",
    );
    assert!(next > token && attempt == 2);
}

/// `extend` renews the lease: a claim after the original lease is still `InFlight`, not stale,
/// and even `Takeover` cannot take it.
pub(crate) async fn fencing_extend_keeps_the_claim_alive(h: Harness) {
    let (store, id, token) = one_claimed(&h, &takeover()).await;
    h.advance(Duration::from_secs(20));
    let answer = store
        .extend(&id, token, Duration::from_secs(60), h.now())
        .await
        .unwrap();
    let until = h.now() + Duration::from_secs(60);
    assert_eq!(answer, ExtendAnswer::Extended { lease_until: until });
    h.advance(Duration::from_secs(40)); // past the original lease, inside the new one
    let answer = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    assert_eq!(answer, running(Duration::from_secs(20)));
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!((r.token, r.lease_until), (token, until));
    assert!(
        r.expires_at >= until + (TTL - LEASE),
        "the record outlives its lease by the same margin"
    );
    assert_eq!(
        store
            .complete(&id, token, &ok("T"), &policy(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
}

/// The fingerprint stored at claim is the one on the completed record ([contract
/// §3.3](idem_core::contract#guarantee-3)).
pub(crate) async fn fencing_fingerprint_kept_on_completion(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    store
        .complete(&id, token, &ok("T"), &policy(), h.now())
        .await
        .unwrap();
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(r.fingerprint, fp("a"));
    assert_eq!(
        store
            .claim(&id, &fp("b"), &policy(), h.now())
            .await
            .unwrap(),
        ClaimAnswer::FingerprintMismatch
    );
}

/// A holder whose lease elapsed, with nobody taking over (even under `Takeover`, a takeover happens
/// only on a claim), still holds the current token: its `complete` succeeds and the outcome replays
/// ([contract §2](idem_core::contract#states): leases end claims only by a takeover).
pub(crate) async fn fencing_holder_completes_after_its_lease_elapsed(h: Harness) {
    for (name, policy) in [("reconcile", policy()), ("takeover", takeover())] {
        let (store, scope, key) = (h.store().await, h.scope(name), h.key("slow"));
        let id = RecordId::new(scope.clone(), key.clone());
        let token = claim_new(&store, &id, &fp("a"), &policy, h.now()).await;
        h.advance(LEASE + Duration::from_secs(5));
        if name == "reconcile" {
            // A claim meanwhile only learns the record is stale; it ends nothing.
            let seen = store.claim(&id, &fp("a"), &policy, h.now()).await.unwrap();
            assert!(
                matches!(seen, ClaimAnswer::InFlight { stale: true, .. }),
                "{seen:?}"
            );
        }
        let answer = store
            .complete(&id, token, &ok("late"), &policy, h.now())
            .await
            .unwrap();
        assert_eq!(
            answer,
            CompleteAnswer::Completed,
            "{name}: a holder whose lease elapsed, not taken over, completes"
        );
        let r = read_back(&h, &id).await;
        assert_eq!(
            (r.state, r.token, r.outcome),
            (RecordState::Completed, token, Some(ok("late")))
        );
        assert_eq!(
            store.claim(&id, &fp("a"), &policy, h.now()).await.unwrap(),
            ClaimAnswer::Replay(ok("late"))
        );
    }
}

/// A holder whose lease elapsed, not taken over, still releases: the record is
/// `failed_retryable` and the next claim is attempt 2.
pub(crate) async fn fencing_holder_releases_after_its_lease_elapsed(h: Harness) {
    let (store, id, token) = one_claimed(&h, &takeover()).await;
    h.advance(LEASE + Duration::from_secs(5));
    assert_eq!(
        store.release(&id, token, h.now()).await.unwrap(),
        ReleaseAnswer::Released,
        "a holder whose lease elapsed, not taken over, releases"
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!((r.state, r.token), (RecordState::FailedRetryable, token));
    assert_claimed_again(&store, &id, h.now()).await;
}

/// A holder whose lease elapsed, not taken over, still extends: its lease runs again from now,
/// so a claim, even under `Takeover`, is `InFlight` and not stale.
pub(crate) async fn fencing_holder_extends_after_its_lease_elapsed(h: Harness) {
    let (store, id, token) = one_claimed(&h, &takeover()).await;
    h.advance(LEASE + Duration::from_secs(5));
    let answer = store.extend(&id, token, LEASE, h.now()).await.unwrap();
    assert_eq!(
        answer,
        ExtendAnswer::Extended {
            lease_until: h.now() + LEASE
        },
        "a holder whose lease elapsed, not taken over, extends"
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.token, r.lease_until),
        (RecordState::Processing, token, h.now() + LEASE)
    );
    let seen = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    assert!(
        matches!(seen, ClaimAnswer::InFlight { stale: false, .. }),
        "the extended lease runs: {seen:?}"
    );
}

/// `extend` never shortens a lease: a shorter heartbeat keeps the later deadline (and the
/// record's expiry), answers it, and a claim between the two deadlines is still `InFlight`.
pub(crate) async fn fencing_extend_never_shortens(h: Harness) {
    let (store, id, token) = one_claimed(&h, &takeover()).await;
    let long = store
        .extend(&id, token, Duration::from_secs(600), h.now())
        .await
        .unwrap();
    let until = h.now() + Duration::from_secs(600);
    assert_eq!(long, ExtendAnswer::Extended { lease_until: until });
    let before = store.get(&id, h.now()).await.unwrap().unwrap();
    h.advance(Duration::from_secs(10));
    let short = store
        .extend(&id, token, Duration::from_secs(5), h.now())
        .await
        .unwrap();
    assert_eq!(
        short,
        ExtendAnswer::Extended { lease_until: until },
        "a shorter extension answers the later deadline it kept"
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.lease_until, r.expires_at, r.token, r.state),
        (until, before.expires_at, token, RecordState::Processing),
        "the lease and the expiry are not shortened"
    );
    h.advance(Duration::from_secs(60)); // past the short deadline, inside the long one
    let answer = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    assert!(
        matches!(answer, ClaimAnswer::InFlight { stale: false, .. }),
        "{answer:?}"
    );
    assert!(
        store
            .list_in_flight(h.now(), 1000)
            .await
            .unwrap()
            .iter()
            .all(|r| r.id() != id),
        "not listed as stale while the later deadline runs"
    );
}

/// `extend` refuses a lease of zero whole milliseconds with `StoreError::ZeroLease`, for the
/// holder as for anyone, and writes nothing.
pub(crate) async fn fencing_extend_refuses_a_zero_lease(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    let before = store.get(&id, h.now()).await.unwrap().unwrap();
    h.advance(Duration::from_secs(1));
    let stranger = Token::with_id(token.seq + 1, token.id ^ 1);
    for lease in [Duration::ZERO, Duration::from_micros(999)] {
        for t in [token, stranger] {
            let answer = store.extend(&id, t, lease, h.now()).await;
            assert!(
                matches!(answer, Err(idem_core::StoreError::ZeroLease(_))),
                "extend({lease:?}) answered {answer:?}"
            );
        }
    }
    let after = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(after, before, "a refused extend writes nothing");
}
