//! The key of a call: the one the client sent, else the one the tool's [`KeySource`] gives a call
//! without one ([contract §5.1](idem_core::contract#keyless)).

use idem_core::metrics::count_refusal;
use idem_core::{IdempotencyKey, KeySource, Refusal};
use rmcp::model::{CallToolRequestParams, ErrorCode};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use super::refusal::refuse;
use crate::key;

/// The header of the streamable HTTP transport that names the session.
const SESSION_HEADER: &str = "mcp-session-id";

/// What a call runs under.
pub(super) enum KeyOf {
    /// This key, sent or derived.
    Key(IdempotencyKey),
    /// No key, and the tool runs unprotected.
    Unprotected,
}

/// The key of the call `params` of `tool` under `source`. Takes the model argument out of the
/// arguments (whether or not a key was sent: the tool never sees it). `session` names the
/// connection of a transport without session ids (stdio: one client per process).
pub(super) fn key_of_call(
    source: &KeySource,
    tool: &str,
    params: &mut CallToolRequestParams,
    context: &RequestContext<RoleServer>,
    session: &str,
) -> Result<KeyOf, ErrorData> {
    let model_value = match source {
        KeySource::ModelArgument(name) => params.arguments.as_mut().and_then(|a| a.remove(name)),
        _ => None,
    };
    let sent = key::key_of(params, &context.meta.0.0)
        .map_err(|refusal| refused(Refusal::InvalidKey(refusal.to_string()), tool))?;
    if let Some(key) = sent {
        return Ok(KeyOf::Key(key));
    }
    let key = match source {
        KeySource::Unprotected => return Ok(KeyOf::Unprotected),
        KeySource::Arguments(_) => {
            let given = params.arguments.is_some();
            let arguments = Value::Object(params.arguments.take().unwrap_or_default());
            let key = source.arguments_key(&arguments);
            if let (true, Value::Object(arguments)) = (given, arguments) {
                params.arguments = Some(arguments);
            }
            key.unwrap_or_else(|| unreachable!("arguments give a key"))
                .map_err(|e| refused(Refusal::InvalidBody(e.to_string()), tool))?
        }
        KeySource::ModelArgument(name) => match model_value {
            Some(Value::String(value)) => IdempotencyKey::from_model_argument(&value)
                .map_err(|e| refused(Refusal::InvalidKey(format!("{e} (in {name})")), tool))?,
            Some(_) => {
                let why = format!("invalid idempotency key: the argument {name} must be a string");
                return Err(refused(Refusal::InvalidKey(why), tool));
            }
            None => return Err(argument_required(tool, name)),
        },
        KeySource::Request => {
            let session = match context.extensions.get::<http::request::Parts>() {
                Some(parts) => match parts.headers.get(SESSION_HEADER) {
                    Some(id) => String::from_utf8_lossy(id.as_bytes()).into_owned(),
                    // Stateless HTTP: request ids are the client's own, not unique per server.
                    None => return Err(refused(Refusal::KeyRequired, tool)),
                },
                None => session.to_owned(),
            };
            let id = serde_json::to_string(&context.id).unwrap_or_default();
            IdempotencyKey::from_request(&session, &id)
        }
        _ => return Err(refused(Refusal::KeyRequired, tool)),
    };
    Ok(KeyOf::Key(key))
}

/// A refusal made before the executor, counted in `idem_refusals_total`.
pub(super) fn refused(refusal: Refusal, tool: &str) -> ErrorData {
    count_refusal("mcp", refusal.name());
    refuse(&refusal, tool)
}

/// `KeyRequired` for a call without the model argument: `-32602`, saying which argument.
fn argument_required(tool: &str, name: &str) -> ErrorData {
    count_refusal("mcp", Refusal::KeyRequired.name());
    ErrorData::new(
        ErrorCode::INVALID_PARAMS,
        format!(
            "{tool} is side-effecting and needs the argument {name}: {} Nothing ran.",
            KeySource::MODEL_ARGUMENT_DESCRIPTION
        ),
        Some(json!({"type": Refusal::KeyRequired.type_uri()})),
    )
}
