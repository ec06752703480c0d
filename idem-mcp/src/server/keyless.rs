//! The key of a call: the one the client sent, else the one the tool's
//! [`KeySource`](idem_core::KeySource) gives a call without one ([contract
//! §5.1](idem_core::contract#keyless)), as [`Tool::key_of`] derives it from MCP's arguments and
//! request ids.

use idem_core::{CallKey, Refusal, Tool};
use rmcp::RoleServer;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RequestContext;
use serde_json::Value;

use crate::key;

/// The header of the streamable HTTP transport that names the session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The key of the call `params` of `tool`. Takes the model argument out of the arguments
/// (whether or not a key was sent: the tool never sees it). `session` names the connection of a
/// transport without session ids (stdio: one client per process).
pub(super) fn key_of_call(
    tool: &Tool,
    params: &mut CallToolRequestParams,
    context: &RequestContext<RoleServer>,
    session: &str,
) -> Result<CallKey, Refusal> {
    let sent = key::key_of(params, &context.meta.0.0)
        .map_err(|refusal| Refusal::InvalidKey(refusal.to_string()))?;
    let session = match context.extensions.get::<http::request::Parts>() {
        // Stateless HTTP has none: its request ids are the client's own, not unique per server.
        Some(parts) => parts
            .headers
            .get(SESSION_HEADER)
            .map(|id| String::from_utf8_lossy(id.as_bytes()).into_owned()),
        None => Some(session.to_owned()),
    };
    let id = serde_json::to_string(&context.id).unwrap_or_default();
    // The arguments are lent to the key and put back as they are, not copied.
    let given = params.arguments.is_some();
    let mut arguments = Value::Object(params.arguments.take().unwrap_or_default());
    let key = tool.key_of(sent, &mut arguments, Some((session.as_deref(), &id)));
    if let (true, Value::Object(arguments)) = (given, arguments) {
        params.arguments = Some(arguments);
    }
    key
}
