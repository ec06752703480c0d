//! [contract §2](idem_core::contract#claim), `claim`: one case per row of the table.

use idem_core::machine::ClaimAnswer;
use idem_core::{ClaimKind, RecordState};

use super::*;
use crate::harness::Harness;

/// No record → `Claimed { attempt: 1 }`, kind `New`.
pub(crate) async fn claim_absent_key_is_claimed_as_attempt_one(h: Harness) {
    let (store, id) = one(&h).await;
    let answer = store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    match answer {
        ClaimAnswer::Claimed { attempt, kind, .. } => {
            assert_eq!(attempt, 1, "first claim is attempt 1");
            assert_eq!(kind, ClaimKind::New);
        }
        other => panic!("absent key: expected Claimed, got {other:?}"),
    }
}

/// The claim is written: `processing`, the fingerprint, the token, the lease and the expiry.
pub(crate) async fn claim_writes_a_processing_record(h: Harness) {
    let (store, id) = one(&h).await;
    let now = h.now();
    let token = claim_new(&store, &id, &fp("a"), &policy(), now).await;
    // Read through a second handle: the claim is committed, not only visible to its writer.
    let other = h.store().await;
    let r = other
        .get(&id, now)
        .await
        .unwrap()
        .expect("the claim is stored");
    assert_eq!(r.state, RecordState::Processing);
    assert_eq!(r.token, token);
    assert_eq!(r.attempt, 1);
    assert_eq!(r.fingerprint, fp("a"));
    assert_eq!(r.id(), id);
    assert_eq!(r.lease_until, now + LEASE, "lease_until = now + lease");
    assert_eq!(r.expires_at, now + TTL, "expires_at = now + ttl");
    assert_eq!(r.created_at, now);
    assert_eq!(r.outcome, None);
}

/// `processing`, lease running → `InFlight { stale: false }`, retry_after = time left, never 0.
pub(crate) async fn claim_while_lease_runs_is_in_flight(h: Harness) {
    let (store, id) = one(&h).await;
    store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    h.advance(Duration::from_secs(10));
    let answer = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    assert_eq!(
        answer,
        running(Duration::from_secs(20)),
        "10 s into a 30 s lease, even under Takeover"
    );
    h.advance(Duration::from_millis(19_999));
    let answer = store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(
        answer,
        running(Duration::from_millis(1)),
        "1 ms before the lease ends"
    );
}

/// A claim that answers `InFlight` changes nothing.
pub(crate) async fn claim_in_flight_writes_nothing(h: Harness) {
    let (store, id) = one(&h).await;
    let t0 = h.now();
    store.claim(&id, &fp("a"), &policy(), t0).await.unwrap();
    let before = store.get(&id, t0).await.unwrap().unwrap();
    h.advance(Duration::from_secs(5));
    for _ in 0..3 {
        let a = store
            .claim(&id, &fp("a"), &policy(), h.now())
            .await
            .unwrap();
        assert!(matches!(a, ClaimAnswer::InFlight { .. }), "{a:?}");
    }
    h.advance(LEASE);
    let a = store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    assert!(
        matches!(a, ClaimAnswer::InFlight { stale: true, .. }),
        "{a:?}"
    );
    let after = store.get(&id, t0).await.unwrap().unwrap();
    assert_eq!(before, after, "in-flight answers must not write");
}

/// `processing`, lease elapsed, `Reconcile` → `InFlight { stale: true }`, no write.
pub(crate) async fn claim_stale_under_reconcile_is_stale_in_flight(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    h.advance(LEASE);
    let answer = store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    assert!(
        matches!(answer, ClaimAnswer::InFlight { stale: true, retry_after } if retry_after > Duration::ZERO),
        "lease elapsed under Reconcile: {answer:?}"
    );
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.token, r.state),
        (token, RecordState::Processing),
        "nothing written"
    );
}

/// `processing`, lease elapsed, `Takeover` → `Claimed { token + 1, attempt + 1 }`.
pub(crate) async fn claim_stale_under_takeover_claims_next_token(h: Harness) {
    let (store, id, first) = one_claimed(&h, &takeover()).await;
    h.advance(LEASE + Duration::from_secs(1));
    let answer = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    let (token, attempt, kind) = won(&answer, "lease elapsed under Takeover");
    assert_eq!(kind, ClaimKind::TakenOver);
    assert_eq!(attempt, 2);
    assert_eq!(token.seq, first.seq + 1, "token goes up by one");
    assert_ne!(token.id, first.id, "a fresh token id");
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.token, r.attempt, r.state),
        (token, 2, RecordState::Processing)
    );
    assert_eq!(r.lease_until, h.now() + LEASE, "a new lease");
    assert_eq!(r.expires_at, h.now() + TTL, "expires_at = now + ttl");
    // Under the ttl the record has left (the reconciler's takeover), the expiry stays where it
    // was: a takeover writes `now + ttl` as given, never more.
    h.advance(LEASE + Duration::from_secs(1));
    let left = r.expires_at.saturating_since(h.now());
    let own = takeover().to_builder().ttl(left).build().unwrap();
    let answer = store.claim(&id, &fp("a"), &own, h.now()).await.unwrap();
    let (again, _, _) = won(&answer, "lease elapsed again, under the ttl left");
    let r2 = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r2.token, r2.expires_at),
        (again, r.expires_at),
        "expiry kept"
    );
}

/// `completed` → `Replay(outcome)`, no write, whatever the lease or policy.
pub(crate) async fn claim_completed_replays(h: Harness) {
    let (store, id, token) = one_claimed(&h, &policy()).await;
    store
        .complete(&id, token, &ok("T-1"), &policy(), h.now())
        .await
        .unwrap();
    let stored = store.get(&id, h.now()).await.unwrap().unwrap();
    for (advance, p) in [(0, policy()), (60, takeover()), (600, policy())] {
        h.advance(Duration::from_secs(advance));
        let answer = store.claim(&id, &fp("a"), &p, h.now()).await.unwrap();
        assert_eq!(answer, ClaimAnswer::Replay(ok("T-1")));
    }
    assert_eq!(
        store.get(&id, h.now()).await.unwrap().unwrap(),
        stored,
        "replays are read-only"
    );
}

/// `failed_retryable` → `Claimed { token + 1, attempt + 1 }`, back to `processing`.
pub(crate) async fn claim_failed_retryable_claims_again(h: Harness) {
    let (store, id, first) = one_claimed(&h, &policy()).await;
    let done = store
        .complete(&id, first, &retryable(), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(done, idem_core::machine::CompleteAnswer::MarkedRetryable);
    h.advance(Duration::from_secs(1));
    let answer = store
        .claim(&id, &fp("a"), &policy(), h.now())
        .await
        .unwrap();
    let (token, attempt, kind) = won(&answer, "failed_retryable");
    assert_eq!((attempt, kind), (2, ClaimKind::Retry));
    assert!(token > first && token.seq == first.seq + 1);
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.token, r.attempt),
        (RecordState::Processing, token, 2)
    );
    assert_eq!(r.outcome, None, "a new attempt starts without an outcome");
}

/// Which state the record is in before a mismatching claim.
enum Then {
    Stay,
    Complete,
    Release,
}

async fn mismatch_leaves_record(h: &Harness, then: Then) {
    let (store, id) = one(h).await;
    let token = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    match then {
        Then::Stay => {}
        Then::Complete => {
            store
                .complete(&id, token, &ok("T-1"), &policy(), h.now())
                .await
                .unwrap();
        }
        Then::Release => {
            store.release(&id, token, h.now()).await.unwrap();
        }
    }
    let before = store.get(&id, h.now()).await.unwrap().unwrap();
    for (advance, p) in [(0, policy()), (LEASE.as_secs() + 1, takeover())] {
        h.advance(Duration::from_secs(advance));
        let answer = store.claim(&id, &fp("b"), &p, h.now()).await.unwrap();
        assert_eq!(
            answer,
            ClaimAnswer::FingerprintMismatch,
            "{:?} record, other request",
            before.state
        );
    }
    let after = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(before, after, "a mismatch changes nothing");
}

/// `processing`, other fingerprint → `FingerprintMismatch`, nothing written (also when stale
/// under `Takeover`).
pub(crate) async fn claim_mismatch_on_processing(h: Harness) {
    mismatch_leaves_record(&h, Then::Stay).await;
}

/// `completed`, other fingerprint → `FingerprintMismatch`, nothing written.
pub(crate) async fn claim_mismatch_on_completed(h: Harness) {
    mismatch_leaves_record(&h, Then::Complete).await;
}

/// `failed_retryable`, other fingerprint → `FingerprintMismatch`, nothing written.
pub(crate) async fn claim_mismatch_on_failed_retryable(h: Harness) {
    mismatch_leaves_record(&h, Then::Release).await;
}

/// Token ids are random: claims of different keys never share one.
pub(crate) async fn claim_tokens_are_unique_across_keys(h: Harness) {
    let store = h.store().await;
    let scope = h.scope("s");
    let mut ids = std::collections::HashSet::new();
    for i in 0..20 {
        let id = RecordId::new(scope.clone(), h.key(&format!("k-{i}")));
        let token = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
        assert!(ids.insert(token.id), "token id reused across keys");
    }
}
