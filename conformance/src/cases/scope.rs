//! contract [§3.4](idem_core::contract#guarantee-4) and [§1](idem_core::contract#words) (scope):
//! isolation and exact addressing. Records are addressed by (scope, key) compared byte for byte: no
//! case folding, no normalisation, no trimming, no concatenation that lets a separator move.

use idem_core::machine::{ClaimAnswer, ReleaseAnswer};
use idem_core::{ClaimKind, RecordState};

use super::*;
use crate::harness::Harness;

/// Claims `id` with the request titled `title` under the default policy; the claim must win
/// (panics with `context` otherwise). Its token.
#[track_caller]
fn claim_wins<'a>(
    store: &'a Arc<dyn KeyStore>,
    id: &'a RecordId,
    title: &'a str,
    now: idem_core::Timestamp,
    context: &'a str,
) -> impl std::future::Future<Output = idem_core::Token> + Send + 'a {
    let caller = std::panic::Location::caller();
    async move {
        let answer = store.claim(id, &fp(title), &policy(), now).await.unwrap();
        match answer {
            ClaimAnswer::Claimed { token, .. } => token,
            other => panic!("{caller}: {context}: expected Claimed, got {other:?}"),
        }
    }
}

/// The records of the key `k` in the scopes `tenant-a` and `tenant-b`.
fn two_scopes(h: &Harness) -> (RecordId, RecordId) {
    (h.id("tenant-a", "k"), h.id("tenant-b", "k"))
}

/// Same key, two scopes: two independent claims and records.
pub(crate) async fn scope_same_key_two_scopes_two_records(h: Harness) {
    let store = h.store().await;
    let (a, b) = two_scopes(&h);
    let ta = claim_wins(&store, &a, "x", h.now(), "scope a").await;
    let tb = claim_wins(&store, &b, "y", h.now(), "scope b, other request").await;
    assert_ne!(ta, tb);
    store.release(&a, ta, h.now()).await.unwrap();
    let ra = store.get(&a, h.now()).await.unwrap().unwrap();
    let rb = store.get(&b, h.now()).await.unwrap().unwrap();
    assert_eq!((ra.state, ra.id()), (RecordState::FailedRetryable, a));
    assert_eq!(
        (rb.state, rb.id(), rb.fingerprint),
        (RecordState::Processing, b, fp("y"))
    );
}

/// A completed key never replays into another scope; each scope replays its own outcome.
pub(crate) async fn scope_no_cross_scope_replay(h: Harness) {
    let store = h.store().await;
    let (a, b) = two_scopes(&h);
    let ta = claim_wins(&store, &a, "x", h.now(), "scope a").await;
    store
        .complete(&a, ta, &ok("A"), &policy(), h.now())
        .await
        .unwrap();
    let tb = claim_wins(&store, &b, "x", h.now(), "scope b must not replay a").await;
    store
        .complete(&b, tb, &ok("B"), &policy(), h.now())
        .await
        .unwrap();
    assert_eq!(
        store.claim(&a, &fp("x"), &policy(), h.now()).await.unwrap(),
        ClaimAnswer::Replay(ok("A"))
    );
    assert_eq!(
        store.claim(&b, &fp("x"), &policy(), h.now()).await.unwrap(),
        ClaimAnswer::Replay(ok("B"))
    );
    // A token of scope a does nothing in scope b.
    assert_eq!(
        store.release(&b, ta, h.now()).await.unwrap(),
        idem_core::machine::ReleaseAnswer::Fenced
    );
}

/// Claims, completes and replays two addresses that must be two independent records: the
/// second claims as new although the first completed with the same request, each replays its
/// own outcome, `get` returns each its own record, a token of one does nothing on the other,
/// and (when the scopes differ) listing a scope shows only its own record.
async fn assert_two_records(
    h: &Harness,
    what: &str,
    (s1, k1): (&idem_core::Scope, &idem_core::IdempotencyKey),
    (s2, k2): (&idem_core::Scope, &idem_core::IdempotencyKey),
) {
    assert!(
        (s1, k1) != (s2, k2),
        "{what}: the pair must be two addresses"
    );
    let (id1, id2) = (
        RecordId::new(s1.clone(), k1.clone()),
        RecordId::new(s2.clone(), k2.clone()),
    );
    let store = h.store().await;
    let now = h.now();
    let t1 = match store.claim(&id1, &fp("x"), &policy(), now).await.unwrap() {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("{what}: the first address ({s1}, {k1}) is new, got {other:?}"),
    };
    store
        .complete(&id1, t1, &ok("first"), &policy(), now)
        .await
        .unwrap();
    let t2 = match store.claim(&id2, &fp("x"), &policy(), now).await.unwrap() {
        ClaimAnswer::Claimed {
            token,
            attempt: 1,
            kind: ClaimKind::New,
        } => token,
        other => panic!(
            "{what}: ({s2}, {k2}) is another record than ({s1}, {k1}) and must claim as new \
             (addresses are compared byte for byte), got {other:?}"
        ),
    };
    assert_eq!(
        store.release(&id2, t1, now).await.unwrap(),
        ReleaseAnswer::Fenced,
        "{what}: a token of ({s1}, {k1}) does nothing on ({s2}, {k2})"
    );
    store
        .complete(&id2, t2, &ok("second"), &policy(), now)
        .await
        .unwrap();
    let other = h.store().await;
    for (id, outcome) in [(&id1, ok("first")), (&id2, ok("second"))] {
        let (s, k) = (id.scope(), id.key());
        assert_eq!(
            other.claim(id, &fp("x"), &policy(), now).await.unwrap(),
            ClaimAnswer::Replay(outcome.clone()),
            "{what}: ({s}, {k}) replays its own outcome"
        );
        let r = other.get(id, now).await.unwrap().expect("the record");
        assert_eq!(
            (r.id(), r.outcome),
            (id.clone(), Some(outcome)),
            "{what}: get ({s}, {k}) returns its own record"
        );
    }
    if s1 != s2 {
        for (s, k) in [(s1, k1), (s2, k2)] {
            let filter = idem_core::store::ListFilter {
                scope: Some(s.clone()),
                ..Default::default()
            };
            let listed: Vec<_> = other
                .list(&filter, now, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.scope, r.key))
                .collect();
            assert_eq!(
                listed,
                [(s.clone(), k.clone())],
                "{what}: listing scope {s} shows only its own record"
            );
        }
    }
}

/// Scopes and keys differing only in letter case are different records (no case folding, no
/// case-insensitive collation).
pub(crate) async fn scope_case_is_significant(h: Harness) {
    let key = h.key("wf-1:step-1:create_ticket");
    let (upper, lower) = (h.scope("Tenant-A/Tool"), h.scope("tenant-a/tool"));
    assert_two_records(
        &h,
        "scopes differing in case",
        (&upper, &key),
        (&lower, &key),
    )
    .await;
    let scope = h.scope("keys");
    let (k1, k2) = (h.key("WF-1:Step-1:Create"), h.key("wf-1:step-1:create"));
    assert_two_records(&h, "keys differing in case", (&scope, &k1), (&scope, &k2)).await;
}

/// Scopes differing only in accents or in Unicode normalisation (NFC `é` vs NFD `e` + U+0301)
/// are different records (no normalisation, no accent-insensitive collation).
pub(crate) async fn scope_unicode_is_compared_byte_for_byte(h: Harness) {
    let key = h.key("k");
    let (nfc, nfd) = (h.scope("caf\u{e9}"), h.scope("cafe\u{301}"));
    assert_ne!(nfc.as_str().as_bytes(), nfd.as_str().as_bytes());
    assert_two_records(&h, "NFC vs NFD scopes", (&nfc, &key), (&nfd, &key)).await;
    let (plain, accented) = (h.scope("resume"), h.scope("r\u{e9}sum\u{e9}"));
    assert_two_records(
        &h,
        "scopes differing in accents",
        (&plain, &key),
        (&accented, &key),
    )
    .await;
    let (sharp, ss) = (h.scope("stra\u{df}e"), h.scope("strasse"));
    assert_two_records(&h, "ß vs ss scopes", (&sharp, &key), (&ss, &key)).await;
}

/// Scopes differing only in trailing (or leading) spaces are different records (no trimming,
/// no space-padded comparison as SQL `CHAR` columns do).
pub(crate) async fn scope_trailing_spaces_are_significant(h: Harness) {
    let key = h.key("k");
    let (bare, padded) = (h.scope("tenant"), h.scope("tenant "));
    assert_two_records(&h, "a trailing space", (&bare, &key), (&padded, &key)).await;
    let (one, two) = (h.scope("tenant2 "), h.scope("tenant2  "));
    assert_two_records(&h, "one vs two trailing spaces", (&one, &key), (&two, &key)).await;
}

/// Where a separator falls between scope and key matters: `("…a:b", "c")` and `("…a", "b:c")`
/// are different records, and so are `("…a/b", "c")` and `("…a", "b/c")` (no concatenation of
/// scope and key that lets a separator move).
pub(crate) async fn scope_separator_position_is_significant(h: Harness) {
    for (i, sep) in [":", "/", "|", "#"].into_iter().enumerate() {
        let (s1, k1) = (h.scope(&format!("{i}a{sep}b")), h.key("c"));
        let (s2, k2) = (h.scope(&format!("{i}a")), h.key(&format!("b{sep}c")));
        let what = format!("the separator {sep:?} moving between scope and key");
        assert_two_records(&h, &what, (&s1, &k1), (&s2, &k2)).await;
    }
}

/// Keys of the maximum length (255 bytes) and scopes of the maximum length (512 bytes) that
/// differ only in their last byte are different records (no truncation, no prefix index that
/// stops short).
pub(crate) async fn scope_long_values_differing_in_the_last_byte(h: Harness) {
    let long_key = |last: char| {
        let mut k = "k".repeat(idem_core::IdempotencyKey::MAX_BYTES - 1);
        k.push(last);
        h.key(&k)
    };
    let scope = h.scope("long-keys");
    let (k1, k2) = (long_key('a'), long_key('b'));
    assert_two_records(&h, "255-byte keys", (&scope, &k1), (&scope, &k2)).await;
    let prefix = h.scope("").as_str().len();
    let long_scope = |last: char| {
        let mut name = "s".repeat(idem_core::Scope::MAX_BYTES - prefix - 1);
        name.push(last);
        h.scope(&name)
    };
    let (s1, s2) = (long_scope('a'), long_scope('b'));
    assert_eq!(s1.as_str().len(), idem_core::Scope::MAX_BYTES);
    assert_two_records(&h, "512-byte scopes", (&s1, &k1), (&s2, &k1)).await;
}

/// Keys a tool derived for a call that sent none ([contract §5.1](idem_core::contract#keyless):
/// a source prefix and a space) are stored and read back as they are, with their origin; a sent
/// key spelled like one without the space is another record (no dropping or collapsing of
/// spaces).
pub(crate) async fn scope_derived_keys_are_stored_as_they_are(h: Harness) {
    use idem_core::KeyOrigin;
    let scope = h.scope("derived");
    let derived = [
        IdempotencyKey::from_arguments(&serde_json::json!({"title": "x"})).unwrap(),
        IdempotencyKey::from_model_argument("create-ticket-1").unwrap(),
        IdempotencyKey::from_model_argument("spaces and é").unwrap(),
        IdempotencyKey::from_request("session-1", "7"),
    ];
    let store = h.store().await;
    for key in &derived {
        let id = RecordId::new(scope.clone(), key.clone());
        let token = claim_wins(&store, &id, "x", h.now(), "a derived key").await;
        store
            .complete(&id, token, &ok("derived"), &policy(), h.now())
            .await
            .unwrap();
        let r = store.get(&id, h.now()).await.unwrap().unwrap();
        assert_eq!(&r.key, key, "the derived key reads back as it was written");
        assert_ne!(r.key_origin(), KeyOrigin::Sent, "{key}");
    }
    let filter = idem_core::store::ListFilter {
        scope: Some(scope.clone()),
        ..Default::default()
    };
    let mut listed: Vec<_> = store
        .list(&filter, h.now(), 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    listed.sort();
    let mut want = derived.to_vec();
    want.sort();
    assert_eq!(listed, want, "list reads the derived keys back");
    let pairs = [("model:create-ticket-1", "model: create-ticket-1")];
    for (sent, derived) in pairs {
        let sent = IdempotencyKey::new(sent).unwrap();
        let derived = IdempotencyKey::from_stored(derived).unwrap();
        let scope = h.scope("derived-vs-sent");
        assert_two_records(
            &h,
            "a sent key and the derived key it spells without its space",
            (&scope, &sent),
            (&scope, &derived),
        )
        .await;
    }
}
