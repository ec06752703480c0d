//! Where a `tools/call` carries its idempotency key, and how it is read.
//!
//! Two places, in this order of precedence:
//!
//! 1. `params.idempotencyKey`, the field of the draft SEP-3182. rmcp's typed
//!    [`CallToolRequestParams`] has no such field and drops it while parsing, so the server must
//!    read it from the raw message first: wrap the transport with [`lift_lines`] (stdio, any
//!    line-delimited stream) or `lift_http_request` (streamable HTTP, feature `axum`). They move
//!    the value to `params._meta["io.idem/params.idempotencyKey"]` ([`LIFTED_META_KEY`]) before
//!    rmcp parses the message.
//! 2. `params._meta["io.idem/idempotencyKey"]` ([`META_KEY`]), which rmcp keeps as it is: what
//!    [`crate::client`] sends, and what works without any transport wrapping.
//!
//! If both are present they must be equal: two different keys in one request are refused
//! (`-32602`), as a client bug, rather than one of them silently winning.

use idem_core::{IdempotencyKey, KeyError};
use rmcp::model::{CallToolRequestParams, JsonObject};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};

/// The `_meta` entry a client puts its key in: `"io.idem/idempotencyKey"`.
pub const META_KEY: &str = "io.idem/idempotencyKey";

/// Where [`lift_lines`] and [`lift_http_request`] put `params.idempotencyKey` (the draft's field):
/// `"io.idem/params.idempotencyKey"`. Any value a client sends under this entry itself is
/// replaced (or removed) by the lifting, so with lifting on it only ever holds the draft's field.
pub const LIFTED_META_KEY: &str = "io.idem/params.idempotencyKey";

/// The draft SEP-3182 field of `tools/call` params: `"idempotencyKey"`.
pub const PARAMS_FIELD: &str = "idempotencyKey";

/// Why the key of a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRefusal {
    /// The key is not a string.
    #[error("invalid idempotency key in {place}: it must be a string")]
    NotAString {
        /// Where it was found.
        place: &'static str,
    },
    /// The key breaks a rule of [contract §4](idem_core::contract#refusals) (the message says
    /// which).
    #[error("{source} (in {place})")]
    Invalid {
        /// Where it was found.
        place: &'static str,
        /// The rule it broke.
        #[source]
        source: KeyError,
    },
    /// `params.idempotencyKey` and `params._meta["io.idem/idempotencyKey"]` differ.
    #[error(
        "two different idempotency keys in one request: params.idempotencyKey and params._meta[\"io.idem/idempotencyKey\"] must be equal when both are sent"
    )]
    Conflicting,
}

const PLACE_PARAMS: &str = "params.idempotencyKey";
const PLACE_META: &str = "params._meta[\"io.idem/idempotencyKey\"]";

/// Reads the key of a `tools/call` (see the module docs for the places and their precedence).
/// `context_meta` is the request's `_meta` as rmcp hands it to the server
/// (`RequestContext::meta`); `params.meta` is read too, for params built in process.
/// `Ok(None)`: no key was sent.
pub fn key_of(
    params: &CallToolRequestParams,
    context_meta: &JsonObject,
) -> Result<Option<IdempotencyKey>, KeyRefusal> {
    let entry = |name: &str| {
        context_meta
            .get(name)
            .or_else(|| params.meta.as_ref().and_then(|m| m.0.0.get(name)))
    };
    let lifted = entry(LIFTED_META_KEY)
        .map(|v| parse(v, PLACE_PARAMS))
        .transpose()?;
    let meta = entry(META_KEY).map(|v| parse(v, PLACE_META)).transpose()?;
    match (lifted, meta) {
        (Some(a), Some(b)) if a != b => Err(KeyRefusal::Conflicting),
        (Some(a), _) => Ok(Some(a)),
        (None, b) => Ok(b),
    }
}

fn parse(value: &Value, place: &'static str) -> Result<IdempotencyKey, KeyRefusal> {
    let text = value.as_str().ok_or(KeyRefusal::NotAString { place })?;
    IdempotencyKey::new(text).map_err(|source| KeyRefusal::Invalid { place, source })
}

/// Moves `params.idempotencyKey` of a raw `tools/call` JSON-RPC message to
/// `params._meta["io.idem/params.idempotencyKey"]`, so it survives rmcp's typed parsing. Any
/// value already under that `_meta` entry is removed first. Returns whether the message was
/// changed; other messages are left alone.
pub fn lift(message: &mut Value) -> bool {
    let Some(obj) = message.as_object_mut() else {
        return false;
    };
    if obj.get("method").and_then(Value::as_str) != Some("tools/call") {
        return false;
    }
    let Some(params) = obj.get_mut("params").and_then(Value::as_object_mut) else {
        return false;
    };
    let key = params.remove(PARAMS_FIELD);
    let spoofed = params
        .get_mut("_meta")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.remove(LIFTED_META_KEY))
        .is_some();
    let Some(key) = key else {
        return spoofed;
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(JsonObject::new()));
    if !meta.is_object() {
        // A malformed `_meta`: leave it for rmcp to refuse, with the key put back.
        params.insert(PARAMS_FIELD.to_owned(), key);
        return spoofed;
    }
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(LIFTED_META_KEY.to_owned(), key);
    }
    true
}

/// [`lift`] applied to one line of a line-delimited JSON-RPC stream; lines that are not JSON
/// are passed through unchanged (rmcp answers them).
pub fn lift_line(line: &[u8]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(line).ok()?;
    if lift(&mut value) {
        serde_json::to_vec(&value).ok()
    } else {
        None
    }
}

/// Wraps the reading half of a line-delimited transport (stdio: `tokio::io::stdin()`) so that
/// `params.idempotencyKey` reaches the server (see [`lift`]). The lines are read and rewritten by
/// a spawned task (a tokio runtime is required); end of input and read errors end the stream.
///
/// ```no_run
/// # async fn demo(server: impl rmcp::ServerHandler) -> Result<(), Box<dyn std::error::Error>> {
/// use rmcp::ServiceExt;
/// let transport = (idem_mcp::key::lift_lines(tokio::io::stdin()), tokio::io::stdout());
/// server.serve(transport).await?.waiting().await?;
/// # Ok(()) }
/// ```
pub fn lift_lines<R>(reader: R) -> impl AsyncRead + Send + Unpin + 'static
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (mut to_server, from_pump) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let body = line.strip_suffix(b"\n").unwrap_or(&line);
            let written = match lift_line(body) {
                Some(mut rewritten) => {
                    rewritten.push(b'\n');
                    to_server.write_all(&rewritten).await
                }
                None => to_server.write_all(&line).await,
            };
            if written.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    });
    from_pump
}

/// The largest HTTP body [`lift_http_request`] reads: 4 MiB.
#[cfg(feature = "axum")]
pub const LIFT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// For the streamable HTTP transport: an axum `map_request` function that applies [`lift`] to a
/// `POST` body before rmcp's service reads it. Mount it on the route of the MCP service:
///
/// ```no_run
/// # fn demo(mcp: axum::routing::MethodRouter) {
/// let app: axum::Router = axum::Router::new()
///     .route_service("/mcp", mcp)
///     .layer(axum::middleware::map_request(idem_mcp::key::lift_http_request));
/// # }
/// ```
///
/// A body over [`LIFT_BODY_LIMIT`] is refused with 413; a body that is not JSON is passed on
/// unchanged.
#[cfg(feature = "axum")]
pub async fn lift_http_request(
    request: axum::extract::Request,
) -> Result<axum::extract::Request, axum::http::StatusCode> {
    if request.method() != axum::http::Method::POST {
        return Ok(request);
    }
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, LIFT_BODY_LIMIT)
        .await
        .map_err(|_| axum::http::StatusCode::PAYLOAD_TOO_LARGE)?;
    let bytes = match lift_line(&bytes) {
        Some(rewritten) => {
            parts.headers.remove(axum::http::header::CONTENT_LENGTH);
            axum::body::Bytes::from(rewritten)
        }
        None => bytes,
    };
    Ok(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::RequestMetaObject;
    use serde_json::json;

    fn meta(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn lift_moves_the_draft_field_into_meta() {
        let mut m = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t", "arguments": {}, "idempotencyKey": "k-1"}});
        assert!(lift(&mut m));
        assert_eq!(m["params"]["_meta"][LIFTED_META_KEY], "k-1");
        assert!(m["params"].get(PARAMS_FIELD).is_none());
        // Other methods and messages without the field are untouched.
        let mut other = json!({"method": "tools/list", "params": {"idempotencyKey": "k"}});
        assert!(!lift(&mut other));
        let mut plain = json!({"method": "tools/call", "params": {"name": "t"}});
        assert!(!lift(&mut plain));
        assert_eq!(lift_line(b"not json"), None);
    }

    /// A stdio server reads what `lift_lines` passes on: the `tools/call` line carries its key in
    /// `_meta` (without it the draft's field would never reach the key policy), every other line
    /// (another method, a call without the field, text that is not JSON) arrives byte for byte.
    #[tokio::test]
    async fn lift_lines_rewrites_the_calls_that_carry_the_field_and_passes_the_rest() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "t", "arguments": {"a": 1}, "idempotencyKey": "k-7"}});
        let others = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"idempotencyKey":"k"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t"}}"#,
            "not json",
        ];
        let (mut client, server) = tokio::io::duplex(4096);
        let mut lifted = lift_lines(server);
        let mut sent = format!("{call}\n");
        for line in others {
            sent.push_str(line);
            sent.push('\n');
        }
        client.write_all(sent.as_bytes()).await.unwrap();
        drop(client);
        let mut received = String::new();
        let read = lifted.read_to_string(&mut received);
        tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .expect("the lines come through (a pipe that takes nothing would hang)")
            .unwrap();
        let lines: Vec<&str> = received.lines().collect();
        assert_eq!(lines.len(), 4, "{received}");
        let first: Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["params"]["_meta"][LIFTED_META_KEY], "k-7");
        assert!(first["params"].get(PARAMS_FIELD).is_none());
        assert_eq!(first["params"]["arguments"], json!({"a": 1}));
        assert_eq!(first["id"], 7);
        assert_eq!(&lines[1..], &others);
    }

    /// The streamable HTTP transport's rewrite: a `POST` of a call carrying the field reaches
    /// rmcp with the key in `_meta` (and without the old `Content-Length`, since the body
    /// changed); a `GET` passes untouched; a `POST` body is read up to the documented 4 MiB and
    /// refused with 413 one byte over.
    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn lift_http_request_rewrites_a_posted_call_and_holds_the_body_to_4_mib() {
        use axum::body::{Body, to_bytes};
        use axum::http::{Method, Request, StatusCode, header};
        let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "t", "arguments": {}, "idempotencyKey": "k-9"}})
        .to_string();
        let post = |body: Vec<u8>| {
            Request::builder()
                .method(Method::POST)
                .uri("/mcp")
                .header(header::CONTENT_LENGTH, body.len())
                .body(Body::from(body))
                .unwrap()
        };
        let read = |request: axum::extract::Request| to_bytes(request.into_body(), usize::MAX);

        let lifted = lift_http_request(post(call.clone().into_bytes()))
            .await
            .unwrap();
        assert_eq!(
            (lifted.method(), lifted.uri().path()),
            (&Method::POST, "/mcp")
        );
        assert!(lifted.headers().get(header::CONTENT_LENGTH).is_none());
        let body: Value = serde_json::from_slice(&read(lifted).await.unwrap()).unwrap();
        assert_eq!(body["params"]["_meta"][LIFTED_META_KEY], "k-9");
        assert!(body["params"].get(PARAMS_FIELD).is_none());

        let get = Request::builder()
            .method(Method::GET)
            .uri("/mcp")
            .body(Body::from(call.clone()))
            .unwrap();
        let passed = lift_http_request(get).await.unwrap();
        assert_eq!(passed.method(), Method::GET);
        assert_eq!(
            read(passed).await.unwrap(),
            call.as_bytes(),
            "a GET is passed as it is"
        );

        let limit = 4 * 1024 * 1024;
        // Not JSON: read whole and passed on unchanged.
        let at_limit = lift_http_request(post(vec![b' '; limit])).await.unwrap();
        assert_eq!(read(at_limit).await.unwrap().len(), limit);
        let over = lift_http_request(post(vec![b' '; limit + 1])).await;
        assert_eq!(over.unwrap_err(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn lift_removes_a_client_sent_lifted_entry() {
        let mut m = json!({"method": "tools/call",
            "params": {"name": "t", "_meta": {LIFTED_META_KEY: "forged"}}});
        assert!(lift(&mut m));
        assert!(m["params"]["_meta"].get(LIFTED_META_KEY).is_none());
        let mut m = json!({"method": "tools/call",
            "params": {"name": "t", "idempotencyKey": "real", "_meta": {LIFTED_META_KEY: "forged", "x": 1}}});
        assert!(lift(&mut m));
        assert_eq!(m["params"]["_meta"][LIFTED_META_KEY], "real");
        assert_eq!(m["params"]["_meta"]["x"], 1);
    }

    #[test]
    fn precedence_draft_field_then_meta_and_conflicts_refused() {
        let params = CallToolRequestParams::new("t");
        assert_eq!(key_of(&params, &JsonObject::new()), Ok(None));
        let only_meta = meta(json!({META_KEY: "m-1"}));
        assert_eq!(
            key_of(&params, &only_meta).unwrap().unwrap().as_str(),
            "m-1"
        );
        let only_lifted = meta(json!({LIFTED_META_KEY: "p-1"}));
        assert_eq!(
            key_of(&params, &only_lifted).unwrap().unwrap().as_str(),
            "p-1"
        );
        let both_equal = meta(json!({LIFTED_META_KEY: "k", META_KEY: "k"}));
        assert_eq!(key_of(&params, &both_equal).unwrap().unwrap().as_str(), "k");
        let both_differ = meta(json!({LIFTED_META_KEY: "k", META_KEY: "j"}));
        assert_eq!(key_of(&params, &both_differ), Err(KeyRefusal::Conflicting));
        // Params built in process carry `_meta` on the params themselves.
        let mut in_process = CallToolRequestParams::new("t");
        let mut m = RequestMetaObject::new();
        m.0.0.insert(META_KEY.into(), json!("inproc"));
        in_process.meta = Some(m);
        assert_eq!(
            key_of(&in_process, &JsonObject::new())
                .unwrap()
                .unwrap()
                .as_str(),
            "inproc"
        );
    }

    #[test]
    fn invalid_keys_say_which_rule_and_where() {
        let params = CallToolRequestParams::new("t");
        let err = key_of(&params, &meta(json!({META_KEY: ""}))).unwrap_err();
        assert!(matches!(
            err,
            KeyRefusal::Invalid {
                source: KeyError::Empty,
                ..
            }
        ));
        assert!(err.to_string().contains("empty") && err.to_string().contains("_meta"));
        let err = key_of(&params, &meta(json!({LIFTED_META_KEY: "a b"}))).unwrap_err();
        assert!(err.to_string().contains("visible ASCII"));
        assert!(err.to_string().contains("params.idempotencyKey"));
        let long = "k".repeat(256);
        assert!(matches!(
            key_of(&params, &meta(json!({META_KEY: long}))),
            Err(KeyRefusal::Invalid {
                source: KeyError::TooLong { len: 256 },
                ..
            })
        ));
        assert_eq!(
            key_of(&params, &meta(json!({META_KEY: 7}))),
            Err(KeyRefusal::NotAString { place: PLACE_META })
        );
    }
}
