//! A [`Refusal`] as a JSON-RPC error: its code, a message for the caller and `data.type`, the
//! refusal's problem type ([contract §5](idem_core::contract#mcp)).

use idem_core::{KeySource, Refusal};
use rmcp::ErrorData;
use rmcp::model::ErrorCode;
use serde_json::json;

use crate::key;

/// JSON-RPC error code: the key was already used with other arguments ([contract
/// §4](idem_core::contract#refusals), `FingerprintMismatch`). In the implementation-defined
/// server-error range.
pub const FINGERPRINT_MISMATCH: ErrorCode = ErrorCode(-32090);
/// JSON-RPC error code: another call with this key is still running; `data.retryAfterMs` says
/// when to ask again ([contract §4](idem_core::contract#refusals), `InFlight`).
pub const IN_FLIGHT: ErrorCode = ErrorCode(-32091);
/// JSON-RPC error code: the idempotency store is unavailable; nothing ran, retry later
/// ([contract §4](idem_core::contract#refusals), `StoreUnavailable`). A store that failed
/// otherwise is an internal error (`-32603`) of type `store-error`: nothing ran, and a retry
/// waits for the store to be fixed.
pub const STORE_UNAVAILABLE: ErrorCode = ErrorCode(-32092);
/// JSON-RPC error code: a side-effecting tool was called without a principal and the server has not
/// opted into one shared scope
/// ([`IdempotentTools::allow_anonymous`](crate::IdempotentTools::allow_anonymous)); nothing was
/// claimed and the tool did not run ([contract §1](idem_core::contract#words), scope).
pub const UNAUTHENTICATED: ErrorCode = ErrorCode(-32093);

/// `refusal` of a call of `tool`, whose keyless calls get what `source` says, as a JSON-RPC
/// error: [`refuse`], but a call without the model argument is told which argument it needs.
pub(super) fn refuse_call(refusal: &Refusal, tool: &str, source: &KeySource) -> ErrorData {
    match (refusal, source) {
        (Refusal::KeyRequired, KeySource::ModelArgument(name)) => ErrorData::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "{tool} is side-effecting and needs the argument {name}: {} Nothing ran.",
                KeySource::MODEL_ARGUMENT_DESCRIPTION
            ),
            Some(json!({"type": refusal.type_uri()})),
        ),
        _ => refuse(refusal, tool),
    }
}

/// `refusal` of a call of `tool` as a JSON-RPC error.
pub(super) fn refuse(refusal: &Refusal, tool: &str) -> ErrorData {
    let code = match refusal {
        Refusal::FingerprintMismatch => FINGERPRINT_MISMATCH,
        Refusal::InFlight { .. } => IN_FLIGHT,
        Refusal::StoreUnavailable => STORE_UNAVAILABLE,
        Refusal::Unauthenticated(_) => UNAUTHENTICATED,
        Refusal::StoreError => ErrorCode::INTERNAL_ERROR,
        _ => ErrorCode::INVALID_PARAMS,
    };
    let mut data = json!({"type": refusal.type_uri()});
    if let Refusal::InFlight { retry_after, stale } = refusal {
        data["retryAfterMs"] = json!(retry_after.as_millis().max(1) as u64);
        data["retryAfterSeconds"] = json!(refusal.retry_after_secs());
        data["stale"] = json!(stale);
    }
    ErrorData::new(code, message(refusal, tool), Some(data))
}

/// What the caller is told, with MCP's words for the key and the principal.
fn message(refusal: &Refusal, tool: &str) -> String {
    match refusal {
        Refusal::KeyRequired => format!(
            "{tool} is side-effecting and needs an idempotency key: send params.idempotencyKey or params._meta[\"{}\"], made from your durable workflow step and the same on every retry",
            key::META_KEY
        ),
        Refusal::Unauthenticated(_) => format!(
            "{tool} is side-effecting and this request carries no principal: authenticate (the server scopes idempotency keys by principal); nothing ran"
        ),
        Refusal::InvalidKey(why) => why.clone(),
        Refusal::InvalidScope(why) => format!("the idempotency scope cannot be built: {why}"),
        Refusal::InvalidBody(why) => format!("the arguments cannot be fingerprinted: {why}"),
        Refusal::FingerprintMismatch => format!(
            "idempotency key already used for a call of {tool} with other arguments; nothing ran: use a new key for a new operation"
        ),
        Refusal::InFlight { retry_after, .. } => format!(
            "a call with this idempotency key is still running; retry with the same key after {} ms",
            retry_after.as_millis().max(1)
        ),
        Refusal::StoreUnavailable => {
            "the idempotency store is unavailable; nothing ran, retry later with the same key".into()
        }
        Refusal::StoreError => "the idempotency store failed, or the answer it holds for this key cannot be read; nothing ran".into(),
        other => other.detail(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn errors_carry_their_codes_and_delay() {
        let in_flight = Refusal::InFlight {
            retry_after: Duration::from_millis(1500),
            stale: false,
        };
        let e = refuse(&in_flight, "create_ticket");
        assert_eq!(e.code, IN_FLIGHT);
        let data = e.data.unwrap();
        assert_eq!(data["retryAfterMs"], 1500);
        assert_eq!(data["retryAfterSeconds"], 2);
        assert_eq!(data["type"], "urn:idem:problem:in-flight");
        let key_required = refuse(&Refusal::KeyRequired, "create_ticket");
        assert_eq!(key_required.code, ErrorCode::INVALID_PARAMS);
        assert!(key_required.message.contains("needs an idempotency key"));
        let broken = refuse(&Refusal::StoreError, "create_ticket");
        assert_eq!(broken.code, ErrorCode::INTERNAL_ERROR);
        assert_eq!(broken.data.unwrap()["type"], "urn:idem:problem:store-error");
    }
}
