//! What the layer says of a request without an `Idempotency-Key` header, whose key its tool's
//! [`KeySource`](idem_core::KeySource) derived ([contract §5.1](idem_core::contract#keyless)).

use std::sync::Arc;

use http::request::Parts;
use serde_json::Value;

use crate::Problem;

/// The header that names the source of a derived key on the answer to a request without
/// `Idempotency-Key` ([contract §5.1](idem_core::contract#keyless)): `arguments` or
/// `model_argument`. Absent when the request sent its key.
pub const IDEMPOTENCY_KEY_SOURCE: &str = "idempotency-key-source";

/// The part of a request's body a derived key covers ([`IdempotencyLayer::key_from`](crate::IdempotencyLayer::key_from)).
pub(crate) type ChooseFn = dyn Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync;

/// The chooser of a layer, shared by its services.
pub(crate) type Choose = Option<Arc<ChooseFn>>;
