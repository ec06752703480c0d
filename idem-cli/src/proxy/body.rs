//! A request body of any kind as the JSON the idempotency layer fingerprints, and the bytes the
//! upstream gets.
//!
//! The layer fingerprints (and derives keys from) JSON. A JSON body is itself, so key order and
//! white space do not make two requests; any other body (a form, text, bytes, nothing at all, as
//! a `DELETE` often has) is wrapped: `{"idem_proxy_body": "TEXT"}`, `{"idem_proxy_body":
//! {"hex": "…"}}` when it is not UTF-8, `{"idem_proxy_body": null}` when empty. The upstream
//! always gets the bytes the client sent ([`RawBody`]).

use axum::body::Bytes;
use serde_json::{Value, json};

/// The bytes the client sent, forwarded unchanged (a request extension).
#[derive(Debug, Clone)]
pub(crate) struct RawBody(pub(crate) Bytes);

/// The JSON text the layer reads for `body`.
pub(crate) fn as_json(body: &Bytes) -> Bytes {
    if !body.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
        return body.clone();
    }
    let wrapped = match std::str::from_utf8(body) {
        Ok("") => json!({"idem_proxy_body": null}),
        Ok(text) => json!({"idem_proxy_body": text}),
        Err(_) => {
            let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
            json!({"idem_proxy_body": {"hex": hex}})
        }
    };
    Bytes::from(Value::to_string(&wrapped))
}

/// How much larger [`as_json`] can make a body of `limit` bytes (hex's 2×, JSON's escaping of
/// control characters up to 6×, and the wrapper).
pub(crate) fn json_limit(limit: usize) -> usize {
    limit.saturating_mul(6).saturating_add(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(body: &[u8]) -> Value {
        serde_json::from_slice(&as_json(&Bytes::copy_from_slice(body))).unwrap()
    }

    #[test]
    fn json_stays_itself_and_anything_else_is_wrapped() {
        let body = Bytes::from_static(b"{ \"b\": 1, \"a\": [2] }");
        assert_eq!(as_json(&body), body);
        assert_eq!(json(b""), json!({"idem_proxy_body": null}));
        assert_eq!(json(b"a=1&b=2"), json!({"idem_proxy_body": "a=1&b=2"}));
        assert_eq!(
            json(b"\xff\x00"),
            json!({"idem_proxy_body": {"hex": "ff00"}})
        );
        assert_ne!(json(b"a=1"), json(b"a=2"));
        let controls = vec![1u8; 100];
        assert!(as_json(&Bytes::from(controls)).len() <= json_limit(100));
    }
}
