//! [contract §3.5](idem_core::contract#guarantee-5): stored outcomes replay byte for byte;
//! oversized ones are refused.

use idem_core::machine::ClaimAnswer;
use idem_core::{Outcome, OutcomeClass, RecordState, StoreError};

use super::*;
use crate::harness::Harness;

async fn round_trip(h: &Harness, name: &str, outcome: &Outcome, p: &Policy) -> Outcome {
    let store = h.store().await;
    let id = RecordId::new(h.scope(name), h.key("k"));
    let token = claim_new(&store, &id, &fp(name), p, h.now()).await;
    store
        .complete(&id, token, outcome, p, h.now())
        .await
        .unwrap();
    // Read back through another handle.
    match h
        .store()
        .await
        .claim(&id, &fp(name), p, h.now())
        .await
        .unwrap()
    {
        ClaimAnswer::Replay(o) => o,
        other => panic!("expected Replay, got {other:?}"),
    }
}

/// Status, class and body text come back exactly: key order, white space and number spelling
/// included.
pub(crate) async fn outcome_replays_byte_for_byte(h: Harness) {
    let text = "{ \"z\": 1.50,\n  \"a\": [true, null, 1e3], \"m\": {\"y\": \"\", \"b\": -0}\t}";
    for (status, class) in [
        (201, OutcomeClass::Definitive),
        (422, OutcomeClass::Definitive),
    ] {
        let o = Outcome::from_json_text(status, text, class).unwrap();
        let back = round_trip(&h, &format!("s{status}"), &o, &policy()).await;
        assert_eq!(back.status(), status);
        assert_eq!(back.class(), class);
        assert_eq!(
            back.body().as_bytes(),
            text.as_bytes(),
            "body must replay byte for byte"
        );
    }
    let all = policy()
        .to_builder()
        .cache(CachePolicy::CacheAll)
        .build()
        .unwrap();
    let o = Outcome::from_json_text(503, "[]", OutcomeClass::Retryable).unwrap();
    assert_eq!(round_trip(&h, "retryable", &o, &all).await, o);
}

/// Unicode (astral, combining, right-to-left), escapes and an escaped NUL survive.
pub(crate) async fn outcome_unicode_and_escapes_survive(h: Harness) {
    let text = r#"{"emoji":"😀👩‍👩‍👧","combining":"e\u0301 é","rtl":"שלום","nul":"a\u0000b","quote":"\"\\/\n","raw":"ü€𝄞"}"#;
    let o = Outcome::from_json_text(200, text, OutcomeClass::Definitive).unwrap();
    let back = round_trip(&h, "unicode", &o, &policy()).await;
    assert_eq!(back.body(), text);
    assert_eq!(back.body_json()["nul"], "a\u{0}b");
}

/// A body of exactly the limit is stored and replayed whole.
pub(crate) async fn outcome_up_to_the_limit_is_stored(h: Harness) {
    let limit = policy().max_outcome_bytes();
    // A JSON string of `limit` bytes: quotes plus a varied filler.
    let filler: String = (0..limit - 2)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let text = format!("\"{filler}\"");
    assert_eq!(text.len(), limit);
    let o = Outcome::from_json_text(200, text.clone(), OutcomeClass::Definitive).unwrap();
    let back = round_trip(&h, "large", &o, &policy()).await;
    assert_eq!(back.body().len(), limit);
    assert!(back.body() == text, "large body must replay byte for byte");
}

/// One byte over the limit: `OutcomeTooLarge`, and the record is untouched (still `processing`,
/// no outcome); a smaller outcome then completes it.
pub(crate) async fn outcome_over_the_limit_is_refused_and_nothing_stored(h: Harness) {
    let (store, id) = one(&h).await;
    let small = policy().to_builder().max_outcome_bytes(64).build().unwrap();
    let token = claim_new(&store, &id, &fp("a"), &small, h.now()).await;
    let before = store.get(&id, h.now()).await.unwrap().unwrap();
    let big = Outcome::from_json_text(
        200,
        format!("\"{}\"", "x".repeat(63)),
        OutcomeClass::Definitive,
    )
    .unwrap();
    assert_eq!(big.size(), 65);
    match store.complete(&id, token, &big, &small, h.now()).await {
        Err(StoreError::OutcomeTooLarge(e)) => assert_eq!((e.size, e.limit), (65, 64)),
        other => panic!("expected OutcomeTooLarge, got {other:?}"),
    }
    let after = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(before, after, "nothing stored");
    assert_eq!(after.state, RecordState::Processing);
    let fits = Outcome::from_json_text(
        200,
        format!("\"{}\"", "x".repeat(62)),
        OutcomeClass::Definitive,
    )
    .unwrap();
    assert_eq!(
        store
            .complete(&id, token, &fits, &small, h.now())
            .await
            .unwrap(),
        idem_core::machine::CompleteAnswer::Completed
    );
}

use idem_core::CachePolicy;
