//! A tool's answer as the outcome recorded for it, and a recorded outcome as the answer of a
//! replay, marked in its `_meta` ([contract §5](idem_core::contract#mcp)).

use idem_core::{KeyOrigin, Outcome, OutcomeClass};
use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, MetaObject};
use serde_json::{Value, json};

/// The `_meta` entry of a result that says whether it is a replay: `"io.idem/replayed"`.
pub const REPLAYED_META_KEY: &str = "io.idem/replayed";
/// The `_meta` entry of a result whose key the tool derived, naming its source
/// ([contract §5.1](idem_core::contract#keyless)): `"io.idem/keySource"`, one of `arguments`,
/// `model_argument`, `request`. Absent when the client sent the key.
pub const KEY_SOURCE_META_KEY: &str = "io.idem/keySource";
/// The `_meta` entry of a replayed result whose original was too large to keep: the problem
/// document of type [`idem_core::OUTCOME_NOT_KEPT`] (the tool ran; its result was not kept).
pub const NOT_KEPT_META_KEY: &str = "io.idem/outcomeNotKept";

// Stored outcome statuses: the tool's result (200), its `isError` result (422), an error the
// tool returned instead of a result (500), a non-final answer that cannot be replayed (202).
const STATUS_OK: u16 = 200;
const STATUS_TOOL_ERROR: u16 = 422;
const STATUS_FAILED: u16 = 500;
const STATUS_NOT_FINAL: u16 = 202;

pub(super) fn to_outcome(
    answer: &Result<CallToolResponse, ErrorData>,
    tool_error: OutcomeClass,
) -> Outcome {
    let built = match answer {
        Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
            Outcome::new(STATUS_TOOL_ERROR, result, tool_error)
        }
        Ok(CallToolResponse::Complete(result)) => {
            Outcome::new(STATUS_OK, result, OutcomeClass::Definitive)
        }
        // An MRTR `input_required` or a task is not the call's answer yet: nothing to replay.
        Ok(_) => Outcome::new(
            STATUS_NOT_FINAL,
            &json!({"error": "the tool answered with a non-final result"}),
            OutcomeClass::Retryable,
        ),
        Err(e) => Outcome::new(STATUS_FAILED, &json!({"error": e}), OutcomeClass::Retryable),
    };
    built.unwrap_or_else(|_| {
        Outcome::from_json_text(
            STATUS_FAILED,
            r#"{"error":{"code":-32603,"message":"the tool's answer could not be serialised"}}"#,
            OutcomeClass::Retryable,
        )
        .expect("a constant JSON text")
    })
}

/// A stored outcome as the answer of a replay.
pub(super) fn from_outcome(outcome: &Outcome) -> Result<CallToolResponse, ErrorData> {
    let corrupt = |e: serde_json::Error| {
        ErrorData::internal_error(format!("the stored result cannot be read: {e}"), None)
    };
    if outcome.is_not_kept() {
        return not_kept(outcome);
    }
    match outcome.status() {
        STATUS_OK | STATUS_TOOL_ERROR => {
            let result: CallToolResult = serde_json::from_str(outcome.body()).map_err(corrupt)?;
            Ok(mark(CallToolResponse::Complete(result), true))
        }
        STATUS_FAILED => {
            #[derive(serde::Deserialize)]
            struct Failed {
                error: ErrorData,
            }
            let failed: Failed = serde_json::from_str(outcome.body()).map_err(corrupt)?;
            Err(failed.error)
        }
        _ => Err(ErrorData::internal_error(
            "the stored answer is not a final result",
            None,
        )),
    }
}

/// The replay of a call whose result was too large to keep ([contract
/// §2](idem_core::contract#states)): the tool ran and this is the final answer. A result (`isError`
/// as the original's) whose text says so, with the problem document under
/// `_meta["io.idem/outcomeNotKept"]`; an error the tool returned stays an error, with the problem
/// as its `data`.
fn not_kept(outcome: &Outcome) -> Result<CallToolResponse, ErrorData> {
    let problem = outcome.body_json();
    let detail = problem["detail"]
        .as_str()
        .unwrap_or("the tool ran, but its result was too large to keep")
        .to_owned();
    let text = format!(
        "The tool ran; its result was not kept by the idempotency store, so it cannot be replayed. Do not call it again under a new key: {detail}"
    );
    match outcome.status() {
        STATUS_OK | STATUS_TOOL_ERROR => {
            let mut result = if outcome.status() == STATUS_OK {
                CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)])
            } else {
                CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)])
            };
            result
                .meta
                .get_or_insert_with(MetaObject::default)
                .0
                .insert(NOT_KEPT_META_KEY.to_owned(), problem);
            Ok(mark(CallToolResponse::Complete(result), true))
        }
        _ => Err(ErrorData::internal_error(text, Some(problem))),
    }
}

pub(super) fn mark(response: CallToolResponse, replayed: bool) -> CallToolResponse {
    match response {
        CallToolResponse::Complete(mut result) => {
            result
                .meta
                .get_or_insert_with(MetaObject::default)
                .0
                .insert(REPLAYED_META_KEY.to_owned(), Value::Bool(replayed));
            CallToolResponse::Complete(result)
        }
        other => other,
    }
}

/// Marks a result answered under a derived key with its source ([`KEY_SOURCE_META_KEY`]).
pub(super) fn mark_source(response: CallToolResponse, origin: KeyOrigin) -> CallToolResponse {
    match response {
        CallToolResponse::Complete(mut result) if origin != KeyOrigin::Sent => {
            result
                .meta
                .get_or_insert_with(MetaObject::default)
                .0
                .insert(KEY_SOURCE_META_KEY.to_owned(), json!(origin.as_str()));
            CallToolResponse::Complete(result)
        }
        other => other,
    }
}

/// Whether `result` is marked as a replay of an earlier call (`_meta["io.idem/replayed"]`).
pub fn is_replay(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get(REPLAYED_META_KEY))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock as Content;

    /// A result answered under a key the server derived names where the key came from
    /// (`_meta["io.idem/keySource"]`); under a key the caller sent, it carries no such entry.
    #[test]
    fn a_derived_keys_result_names_its_source_and_a_sent_keys_does_not() {
        let source = |origin| {
            let result = CallToolResult::success(vec![Content::text("T-1")]);
            let CallToolResponse::Complete(marked) = mark_source(result.into(), origin) else {
                panic!("a complete result")
            };
            marked
                .meta
                .and_then(|m| m.0.get(KEY_SOURCE_META_KEY).cloned())
        };
        assert_eq!(source(KeyOrigin::Sent), None);
        assert_eq!(source(KeyOrigin::Arguments), Some(json!("arguments")));
        assert_eq!(
            source(KeyOrigin::ModelArgument),
            Some(json!("model_argument"))
        );
    }

    #[test]
    fn outcomes_round_trip_and_classify() {
        let ok = CallToolResult::success(vec![Content::text("T-1")]);
        let o = to_outcome(&Ok(ok.clone().into()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_OK, OutcomeClass::Definitive)
        );
        let CallToolResponse::Complete(replayed) = from_outcome(&o).unwrap() else {
            panic!("a complete result")
        };
        assert!(is_replay(&replayed));
        assert_eq!(replayed.content, ok.content);

        let rejected = CallToolResult::error(vec![Content::text("account closed")]);
        let o = to_outcome(&Ok(rejected.into()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_TOOL_ERROR, OutcomeClass::Definitive)
        );
        let o = to_outcome(
            &Ok(CallToolResult::error(vec![]).into()),
            OutcomeClass::Retryable,
        );
        assert_eq!(o.class(), OutcomeClass::Retryable);

        let failed = ErrorData::internal_error("db down", None);
        let o = to_outcome(&Err(failed.clone()), OutcomeClass::Definitive);
        assert_eq!(
            (o.status(), o.class()),
            (STATUS_FAILED, OutcomeClass::Retryable)
        );
        assert_eq!(from_outcome(&o).unwrap_err(), failed);
    }
}
