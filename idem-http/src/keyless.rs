//! The key of a request without an `Idempotency-Key` header, per the layer's [`KeySource`]
//! ([contract §5.1](idem_core::contract#keyless)).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use idem_core::{IdempotencyKey, KeySource};
use serde_json::Value;

use crate::Problem;

/// The header that names the source of a derived key on the answer to a request without
/// `Idempotency-Key` ([contract §5.1](idem_core::contract#keyless)): `arguments` or
/// `model_argument`. Absent when the request sent its key.
pub const IDEMPOTENCY_KEY_SOURCE: &str = "idempotency-key-source";

pub(crate) type ChooseFn = dyn Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync;

/// What the layer does with a request that sends no key.
#[derive(Clone)]
pub(crate) struct Keyless {
    pub(crate) source: KeySource,
    pub(crate) window: Duration,
    /// For [`KeySource::Arguments`]: the part of the body the key covers, instead of the
    /// source's pointers.
    pub(crate) choose: Option<Arc<ChooseFn>>,
}

impl Default for Keyless {
    fn default() -> Self {
        Self {
            source: KeySource::Refuse,
            window: KeySource::DEFAULT_WINDOW,
            choose: None,
        }
    }
}

impl Keyless {
    /// Whether a request without a key passes through to the tool unprotected.
    pub(crate) fn unprotected(&self) -> bool {
        self.source == KeySource::Unprotected
    }

    /// Whether a request without a key gets a derived one (else it is refused).
    pub(crate) fn derives(&self) -> bool {
        matches!(
            self.source,
            KeySource::Arguments(_) | KeySource::ModelArgument(_)
        )
    }

    /// Takes the model argument out of `body` (a request's JSON), if the source has one; the
    /// argument's value, if it was there.
    pub(crate) fn take_model_argument(&self, body: &mut Value) -> Option<Value> {
        match &self.source {
            KeySource::ModelArgument(name) => body.as_object_mut()?.remove(name),
            _ => None,
        }
    }

    /// The derived key of a request without one: `body` is its JSON (without the model
    /// argument), `model_value` the model argument's value.
    pub(crate) fn key(
        &self,
        parts: &Parts,
        body: &Value,
        model_value: Option<Value>,
    ) -> Result<IdempotencyKey, Problem> {
        match &self.source {
            KeySource::Arguments(_) => {
                let key = match &self.choose {
                    Some(choose) => IdempotencyKey::from_arguments(&choose(parts, body)?),
                    None => self
                        .source
                        .arguments_key(body)
                        .unwrap_or_else(|| unreachable!("arguments give a key")),
                };
                key.map_err(|e| Problem::InvalidBody(e.to_string()))
            }
            KeySource::ModelArgument(name) => match model_value {
                Some(Value::String(value)) => IdempotencyKey::from_model_argument(&value)
                    .map_err(|e| Problem::InvalidKey(format!("{e} (in the body's {name})"))),
                Some(_) => Err(Problem::InvalidKey(format!(
                    "invalid idempotency key: the body's {name} must be a string"
                ))),
                None => Err(Problem::KeyRequired),
            },
            _ => Err(Problem::KeyRequired),
        }
    }
}
