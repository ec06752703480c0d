//! SPEC §3.4: scope isolation.

use idem_core::{ClaimAnswer, RecordState};

use super::*;
use crate::Harness;

/// Same key, two scopes: two independent claims and records.
pub async fn scope_same_key_two_scopes_two_records(h: Harness) {
    let store = h.store().await;
    let (a, b, key) = (h.scope("tenant-a"), h.scope("tenant-b"), h.key("k"));
    let (ta, _) = claimed(
        &store
            .claim(&a, &key, &fp("x"), &policy(), h.now())
            .await
            .unwrap(),
        "scope a",
    );
    let (tb, _) = claimed(
        &store
            .claim(&b, &key, &fp("y"), &policy(), h.now())
            .await
            .unwrap(),
        "scope b, other request",
    );
    assert_ne!(ta, tb);
    store.release(&a, &key, ta, h.now()).await.unwrap();
    let ra = store.get(&a, &key, h.now()).await.unwrap().unwrap();
    let rb = store.get(&b, &key, h.now()).await.unwrap().unwrap();
    assert_eq!(
        (ra.state, ra.scope.clone()),
        (RecordState::FailedRetryable, a)
    );
    assert_eq!(
        (rb.state, rb.scope.clone(), rb.fingerprint),
        (RecordState::Processing, b, fp("y"))
    );
}

/// A completed key never replays into another scope; each scope replays its own outcome.
pub async fn scope_no_cross_scope_replay(h: Harness) {
    let store = h.store().await;
    let (a, b, key) = (h.scope("tenant-a"), h.scope("tenant-b"), h.key("k"));
    let (ta, _) = claimed(
        &store
            .claim(&a, &key, &fp("x"), &policy(), h.now())
            .await
            .unwrap(),
        "scope a",
    );
    store
        .complete(&a, &key, ta, &ok("A"), &policy(), h.now())
        .await
        .unwrap();
    let (tb, _) = claimed(
        &store
            .claim(&b, &key, &fp("x"), &policy(), h.now())
            .await
            .unwrap(),
        "scope b must not replay a",
    );
    store
        .complete(&b, &key, tb, &ok("B"), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(
        store
            .claim(&a, &key, &fp("x"), &policy(), h.now())
            .await
            .unwrap(),
        ClaimAnswer::Replay(ok("A"))
    );
    assert_eq!(
        store
            .claim(&b, &key, &fp("x"), &policy(), h.now())
            .await
            .unwrap(),
        ClaimAnswer::Replay(ok("B"))
    );
    // A token of scope a does nothing in scope b.
    assert_eq!(
        store.release(&b, &key, ta, h.now()).await.unwrap(),
        idem_core::ReleaseAnswer::Fenced
    );
}
