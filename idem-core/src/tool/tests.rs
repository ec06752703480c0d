use std::time::Duration;

use serde_json::{Value, json};

use super::*;

fn lease(secs: u64) -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(secs))
        .build()
        .unwrap()
}

#[test]
fn a_setting_that_does_not_fit_is_refused_when_the_tool_is_built() {
    let short_window = Tool::builder()
        .policy(lease(10))
        .key_source(KeySource::arguments())
        .key_window(Duration::from_secs(10));
    assert_eq!(
        short_window.build(),
        Err(ToolError::KeyWindowNotAboveLease {
            window: Duration::from_secs(10),
            lease: Duration::from_secs(10)
        })
    );
    // Longer than the lease: a heartbeat renews a working holder's lease.
    let long_processing = Tool::builder()
        .policy(lease(10))
        .processing_window(Duration::from_secs(11));
    assert!(long_processing.build().is_ok());
    let zero = Tool::builder().processing_window(Duration::from_micros(10));
    assert_eq!(zero.build(), Err(ToolError::ZeroProcessingWindow));
    // A key window is only checked where keys are derived: a tool that refuses keyless calls
    // never keeps a record for it.
    let refusing = Tool::builder()
        .policy(lease(7200))
        .key_source(KeySource::Refuse)
        .build()
        .unwrap();
    assert_eq!(refusing.policy_for(KeyOrigin::Arguments), refusing.policy());
}

#[test]
fn a_derived_keys_record_is_kept_for_the_key_window_a_sent_keys_for_the_ttl() {
    let tool = Tool::builder()
        .policy(lease(10))
        .key_source(KeySource::arguments())
        .key_window(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(tool.policy_for(KeyOrigin::Sent).ttl(), Policy::DEFAULT_TTL);
    assert_eq!(
        tool.policy_for(KeyOrigin::Arguments).ttl(),
        Duration::from_secs(60)
    );
    assert_eq!(
        tool.policy_for(KeyOrigin::Arguments).lease(),
        Duration::from_secs(10)
    );
}

#[test]
fn defaults_fall_back_to_the_lease_and_publish_them() {
    let tool = Tool::default();
    assert_eq!(tool.processing_window(), Policy::DEFAULT_LEASE);
    assert_eq!(tool.max_wait(), Policy::DEFAULT_LEASE);
    assert_eq!(tool.key_source(), &KeySource::Refuse);
    assert!(!tool.tasks());
    let contract = Tool::builder()
        .processing_window(Duration::from_secs(2))
        .max_wait(Duration::from_secs(5))
        .tasks(true)
        .build()
        .unwrap();
    assert!(contract.tasks());
    assert_eq!(
        contract.contract().processing_window(),
        Duration::from_secs(2)
    );
    assert_eq!(contract.contract().max_wait(), Some(Duration::from_secs(5)));
    assert_eq!(contract.to_builder().build().unwrap(), contract);
}

#[test]
fn the_wait_bound_is_asked_for_or_given_to_a_derived_key() {
    let max = Duration::from_secs(5);
    let tool = Tool::builder().max_wait(max).build().unwrap();
    let ms = Duration::from_millis;
    assert_eq!(
        tool.wait_bound(KeyOrigin::Sent, Duration::ZERO),
        Duration::ZERO
    );
    assert_eq!(tool.wait_bound(KeyOrigin::Sent, ms(300)), ms(300));
    assert_eq!(tool.wait_bound(KeyOrigin::Sent, ms(60_000)), max);
    assert_eq!(tool.wait_bound(KeyOrigin::Arguments, Duration::ZERO), max);
    assert_eq!(tool.wait_bound(KeyOrigin::Request, ms(300)), ms(300));
    let off = tool.to_builder().derived_key_wait(false).build().unwrap();
    assert_eq!(
        off.wait_bound(KeyOrigin::Arguments, Duration::ZERO),
        Duration::ZERO
    );
}

fn key_of(
    source: KeySource,
    sent: Option<&str>,
    mut args: Value,
) -> (Result<CallKey, Refusal>, Value) {
    let tool = Tool::builder().key_source(source).build().unwrap();
    let sent = sent.map(|k| IdempotencyKey::new(k).unwrap());
    let key = tool.key_of(sent, &mut args, Some((Some("session-1"), "7")));
    (key, args)
}

fn key(answer: (Result<CallKey, Refusal>, Value)) -> IdempotencyKey {
    match answer.0 {
        Ok(CallKey::Key(key)) => key,
        other => panic!("a key, not {other:?}"),
    }
}

#[test]
fn a_sent_key_wins_and_the_model_argument_is_taken_out_either_way() {
    let args = json!({"title": "T", "idempotency_key": "m-1"});
    let (sent, left) = key_of(KeySource::model_argument(), Some("wf-1"), args.clone());
    assert_eq!(key((sent, left.clone())).origin(), KeyOrigin::Sent);
    assert_eq!(left, json!({"title": "T"}));
    let derived = key(key_of(KeySource::model_argument(), None, args));
    assert_eq!(derived, IdempotencyKey::from_model_argument("m-1").unwrap());
    for source in [
        KeySource::Refuse,
        KeySource::arguments(),
        KeySource::Request,
        KeySource::Unprotected,
    ] {
        let sent = key(key_of(source, Some("wf-1"), json!({"a": 1})));
        assert_eq!(sent.as_str(), "wf-1");
    }
}

#[test]
fn each_source_derives_its_key_or_refuses() {
    let args = json!({"title": "Printer on fire", "account_id": "A-7", "note": "urgent"});
    let all = key(key_of(KeySource::arguments(), None, args.clone()));
    assert_eq!(all, IdempotencyKey::from_arguments(&args).unwrap());
    let some = KeySource::arguments_at(["/title", "/account_id"]);
    let covered = key(key_of(some.clone(), None, args.clone()));
    let other_note = json!({"account_id": "A-7", "title": "Printer on fire", "note": "please"});
    assert_eq!(covered, key(key_of(some, None, other_note)));
    assert_eq!(covered.origin(), KeyOrigin::Arguments);
    assert_eq!(
        key(key_of(KeySource::Request, None, json!({}))),
        IdempotencyKey::from_request("session-1", "7")
    );
    let refused = |source, args| key_of(source, None, args).0.unwrap_err();
    assert_eq!(refused(KeySource::Refuse, json!({})), Refusal::KeyRequired);
    assert_eq!(
        refused(KeySource::model_argument(), json!({"title": "T"})),
        Refusal::KeyRequired
    );
    assert!(matches!(
        refused(KeySource::model_argument(), json!({"idempotency_key": 7})),
        Refusal::InvalidKey(why) if why.contains("must be a string")
    ));
    assert!(matches!(
        refused(KeySource::model_argument(), json!({"idempotency_key": ""})),
        Refusal::InvalidKey(why) if why.contains("idempotency_key")
    ));
    assert_eq!(
        key_of(KeySource::Unprotected, None, json!({})).0,
        Ok(CallKey::Unprotected)
    );
    // A transport without sessions (stateless streamable HTTP) or without request ids (HTTP).
    let tool = Tool::builder()
        .key_source(KeySource::Request)
        .build()
        .unwrap();
    assert_eq!(
        tool.key_of(None, &mut json!({}), Some((None, "7"))),
        Err(Refusal::KeyRequired)
    );
    assert_eq!(
        tool.key_of(None, &mut json!({}), None),
        Err(Refusal::KeyRequired)
    );
}
