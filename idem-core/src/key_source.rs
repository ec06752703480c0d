//! What a tool does with a call that sends no key ([contract §5.1](crate::contract#keyless)): its
//! [`KeySource`], shared by the HTTP layer and the MCP wrapper.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::Value;

/// The key of a call that sends none, chosen per tool ([contract §5.1](crate::contract#keyless)).
///
/// A key the caller sends always wins. Without one, the tool refuses the call (the default),
/// derives a key from the call (its arguments, an argument the model fills, the MCP request), or
/// runs it unprotected. A derived key carries its source ([`KeyOrigin`](crate::KeyOrigin)), so it
/// never equals a key a caller could send, and it lives in the caller's scope (principal and
/// tool), so two tools or two tenants never share one. Its record is kept for the tool's window
/// ([`KeySource::DEFAULT_WINDOW`], 1 hour): the same call within it is the same operation and
/// replays; a deliberate repeat must differ in what the key covers.
///
/// A tool's key source is one of its settings ([`Tool`](crate::Tool)); [`Tool::key_of`](crate::Tool::key_of)
/// gives the key of a call.
///
/// ```
/// use idem_core::{CallKey, KeyOrigin, KeySource, Tool};
/// use serde_json::json;
/// let tool = Tool::builder()
///     .key_source(KeySource::arguments_at(["/title", "/account_id"]))
///     .build()?;
/// let mut call = json!({"title": "Printer on fire", "account_id": "A-7", "note": "urgent"});
/// let Ok(CallKey::Key(key)) = tool.key_of(None, &mut call, None) else { unreachable!() };
/// assert_eq!(key.origin(), KeyOrigin::Arguments);
/// assert!(key.as_str().starts_with("args: "));
/// // The note is not covered: the same title and account are the same operation.
/// let mut again = json!({"account_id": "A-7", "title": "Printer on fire", "note": "please"});
/// assert_eq!(tool.key_of(None, &mut again, None), Ok(CallKey::Key(key)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeySource {
    /// No key: the call is refused (`KeyRequired`: HTTP 400, MCP -32602) and nothing runs. The
    /// default.
    #[default]
    Refuse,
    /// The key is derived from the call's arguments: all of them (no pointers), or the values at
    /// these JSON pointers (RFC 6901, e.g. `/account_id`; a missing one counts as `null`).
    /// Protects against the model or client repeating the same call within the window.
    Arguments(Vec<String>),
    /// The tool adds a required string argument of this name to its input schema and asks the
    /// model to reuse its value when it retries the same action; the argument is removed before
    /// the fingerprint and before the tool sees the arguments. Protects as well as the model
    /// follows the instruction.
    ModelArgument(String),
    /// (MCP) The key is the session id and the JSON-RPC request id: only a transport's resend of
    /// the very same request meets it again.
    Request,
    /// No key: the call runs unprotected, counted in `idem_unprotected_total` and logged.
    Unprotected,
}

impl KeySource {
    /// The window of a derived key, the ttl of its record: 1 hour (as Powertools'
    /// `expires_after_seconds`).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

    /// The name of the model argument of [`KeySource::model_argument`]: `idempotency_key`.
    pub const DEFAULT_MODEL_ARGUMENT: &'static str = "idempotency_key";

    /// What the model is told about the key argument (its schema description).
    pub const MODEL_ARGUMENT_DESCRIPTION: &'static str =
        "A unique id for this action; send the same id when you retry the same action.";

    /// [`KeySource::Arguments`] over all the arguments.
    pub fn arguments() -> Self {
        Self::Arguments(Vec::new())
    }

    /// [`KeySource::Arguments`] over the values at these JSON pointers.
    pub fn arguments_at<I, S>(pointers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Arguments(pointers.into_iter().map(Into::into).collect())
    }

    /// [`KeySource::ModelArgument`] named [`KeySource::DEFAULT_MODEL_ARGUMENT`].
    pub fn model_argument() -> Self {
        Self::ModelArgument(Self::DEFAULT_MODEL_ARGUMENT.to_owned())
    }

    /// `refuse`, `arguments`, `model_argument`, `request` or `unprotected`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Arguments(_) => "arguments",
            Self::ModelArgument(_) => "model_argument",
            Self::Request => "request",
            Self::Unprotected => "unprotected",
        }
    }

    /// Whether every call that runs is protected by a key: all but [`KeySource::Unprotected`]
    /// (a refused call does not run). MCP's `idempotentHint: true` is set only then.
    pub fn protects_every_call(&self) -> bool {
        !matches!(self, Self::Unprotected)
    }
}

/// The values at `pointers` as an array (a missing one as `null`), or all of `arguments`.
pub(crate) fn select<'a>(pointers: &[String], arguments: &'a Value) -> Cow<'a, Value> {
    if pointers.is_empty() {
        return Cow::Borrowed(arguments);
    }
    Cow::Owned(Value::Array(
        pointers
            .iter()
            .map(|p| arguments.pointer(p).cloned().unwrap_or(Value::Null))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{IdempotencyKey, KeyOrigin};

    #[test]
    fn derived_keys_are_never_sendable_and_read_back() {
        let keys = [
            IdempotencyKey::from_arguments(&json!({"a": 1})).unwrap(),
            IdempotencyKey::from_model_argument("plain-id").unwrap(),
            IdempotencyKey::from_model_argument("with space é").unwrap(),
            IdempotencyKey::from_model_argument(&"x".repeat(300)).unwrap(),
            IdempotencyKey::from_request("session-1", "7"),
        ];
        let origins = [
            KeyOrigin::Arguments,
            KeyOrigin::ModelArgument,
            KeyOrigin::ModelArgument,
            KeyOrigin::ModelArgument,
            KeyOrigin::Request,
        ];
        for (key, origin) in keys.iter().zip(origins) {
            assert_eq!(key.origin(), origin, "{key}");
            assert!(IdempotencyKey::new(key.as_str()).is_err(), "{key}");
            assert_eq!(&IdempotencyKey::from_stored(key.as_str()).unwrap(), key);
            assert_eq!(&key.as_str().parse::<IdempotencyKey>().unwrap(), key);
            let json = serde_json::to_string(key).unwrap();
            assert_eq!(&serde_json::from_str::<IdempotencyKey>(&json).unwrap(), key);
            assert!(key.as_str().len() <= crate::IdempotencyKey::MAX_BYTES);
        }
        assert_eq!(keys[1].as_str(), "model: plain-id");
        assert!(keys[2].as_str().starts_with("model: sha256 "));
        // A model value that spells the digest form is kept apart from it (no space in a plain
        // value).
        assert_ne!(
            IdempotencyKey::from_model_argument("sha256").unwrap(),
            keys[2]
        );
        assert_eq!(
            IdempotencyKey::from_model_argument(""),
            Err(crate::KeyError::Empty)
        );
        // Session and id are length-prefixed.
        assert_ne!(
            IdempotencyKey::from_request("ab", "c"),
            IdempotencyKey::from_request("a", "bc")
        );
    }

    #[test]
    fn sent_keys_that_look_derived_stay_sent() {
        for sent in ["args:abc", "model:x", "request:1", "args:"] {
            let key = IdempotencyKey::new(sent).unwrap();
            assert_eq!(key.origin(), KeyOrigin::Sent);
        }
        for corrupt in ["args: ", "other: x", "args: \u{7f}", " args: x"] {
            assert!(IdempotencyKey::from_stored(corrupt).is_err(), "{corrupt:?}");
        }
        assert!(IdempotencyKey::from_stored(format!("args: {}", "a".repeat(250))).is_err());
    }

    #[test]
    fn sources_name_themselves_and_say_what_they_protect() {
        assert_eq!(KeySource::default(), KeySource::Refuse);
        assert_eq!(
            KeySource::model_argument(),
            KeySource::ModelArgument("idempotency_key".into())
        );
        let names: Vec<_> = [
            KeySource::Refuse,
            KeySource::arguments(),
            KeySource::model_argument(),
            KeySource::Request,
            KeySource::Unprotected,
        ]
        .iter()
        .map(|s| (s.name(), s.protects_every_call()))
        .collect();
        assert_eq!(
            names,
            [
                ("refuse", true),
                ("arguments", true),
                ("model_argument", true),
                ("request", true),
                ("unprotected", false)
            ]
        );
    }
}
