//! `idem_mcp::key::lift_line` (the stdio / streamable-HTTP lifting of the draft's
//! `params.idempotencyKey`) and `idem_mcp::key_of` on arbitrary JSON-RPC lines.
//!
//! - Text that is not JSON, and messages with nothing to lift, pass through unchanged (`None`).
//! - A rewritten message is JSON; it no longer has `params.idempotencyKey`; its
//!   `_meta["io.idem/params.idempotencyKey"]` holds exactly the value the client sent there, and
//!   is absent when the client sent none (a client cannot forge the lifted entry); everything
//!   else is unchanged, the tool's arguments fingerprint the same.
//! - The lifted key reads back through `key_of`: a valid key as itself (unless `_meta` holds a
//!   different one, refused as conflicting), an invalid one refused with its rule.
#![no_main]

use idem_core::{Fingerprint, IdempotencyKey};
use idem_fuzz::check_key;
use idem_mcp::key::{LIFTED_META_KEY, PARAMS_FIELD, lift_line};
use idem_mcp::rmcp::model::{CallToolRequestParams, JsonObject};
use idem_mcp::{KeyRefusal, META_KEY, key_of};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let rewritten = lift_line(data);
    let Ok(original) = serde_json::from_slice::<Value>(data) else {
        assert!(rewritten.is_none(), "text that is not JSON was rewritten");
        return;
    };
    let is_call = original.get("method").and_then(Value::as_str) == Some("tools/call");
    let params = original.get("params").and_then(Value::as_object);
    let sent_key = params.and_then(|p| p.get(PARAMS_FIELD));
    let Some(rewritten) = rewritten else {
        // Nothing lifted: no key to move (or a malformed `_meta` left for rmcp to refuse), and
        // no forged lifted entry left in place.
        if let (true, Some(params)) = (is_call, params) {
            let meta = params.get("_meta");
            assert!(
                sent_key.is_none() || meta.is_some_and(|m| !m.is_object()),
                "a key was not lifted"
            );
            assert!(meta.and_then(|m| m.get(LIFTED_META_KEY)).is_none());
        }
        return;
    };
    assert!(is_call, "only tools/call is rewritten");
    assert!(params.is_some(), "a rewritten call has params");
    let lifted: Value = serde_json::from_slice(&rewritten).expect("a rewritten message is JSON");
    let lifted_params = lifted["params"].as_object().expect("params stay an object");
    assert!(lifted_params.get(PARAMS_FIELD).is_none());
    let meta = lifted_params["_meta"]
        .as_object()
        .expect("_meta is an object");
    assert_eq!(
        meta.get(LIFTED_META_KEY),
        sent_key,
        "the lifted entry is the key sent"
    );

    // Nothing else changed.
    let strip = |v: &Value| {
        let mut v = v.clone();
        let p = v["params"].as_object_mut().unwrap();
        p.remove(PARAMS_FIELD);
        if let Some(m) = p.get_mut("_meta").and_then(Value::as_object_mut) {
            m.remove(LIFTED_META_KEY);
            if m.is_empty() {
                p.remove("_meta");
            }
        }
        v
    };
    assert_eq!(strip(&original), strip(&lifted));
    if let (Ok(a), Ok(b)) = (
        Fingerprint::of("t", &original["params"]["arguments"]),
        Fingerprint::of("t", &lifted["params"]["arguments"]),
    ) {
        assert_eq!(a, b, "lifting changed the arguments' fingerprint");
    }

    // The key reads back from where the server looks.
    let Ok(typed) = serde_json::from_value::<CallToolRequestParams>(lifted["params"].clone())
    else {
        return;
    };
    let context_meta: JsonObject = meta.clone();
    let read = key_of(&typed, &context_meta);
    let Some(sent) = sent_key else {
        // Only a client-sent lifted entry was removed: the key, if any, is the `_meta` one.
        let own = meta.get(META_KEY);
        match (own, &read) {
            (None, Ok(None)) => {}
            (Some(v), Ok(Some(k))) => assert_eq!(v.as_str(), Some(k.as_str())),
            (Some(_), Err(_)) => {}
            _ => panic!("key_of {read:?} with _meta key {own:?}"),
        }
        return;
    };
    let want: Option<IdempotencyKey> = sent.as_str().and_then(check_key);
    match (&want, &read) {
        (Some(want), Ok(Some(got))) => assert_eq!(got, want),
        (Some(want), Err(KeyRefusal::Conflicting)) => {
            assert_ne!(
                meta.get(META_KEY).and_then(Value::as_str),
                Some(want.as_str())
            )
        }
        (Some(_), Err(KeyRefusal::Invalid { .. } | KeyRefusal::NotAString { .. })) => {
            // The `_meta` key is the invalid one.
            assert!(meta.get(META_KEY).is_some());
        }
        (None, Err(KeyRefusal::Invalid { .. } | KeyRefusal::NotAString { .. })) => {}
        _ => panic!("key_of {read:?} for a sent key {sent:?}"),
    }
});
