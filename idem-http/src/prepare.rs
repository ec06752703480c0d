//! Everything before the executor: the checks that can refuse a request (key, principal, body,
//! fingerprint).

use bytes::Bytes;
use http::header;
use http::request::Parts;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{CallKey, Fingerprint, IdempotencyKey, KeySource, Scope};

use crate::answer::BoxError;
use crate::layer::IdempotencyLayer;
use crate::{Problem, read_key};

/// A request that passed every check: what the executor runs it under, and the body the tool
/// gets.
pub(crate) struct Prepared {
    pub(crate) scope: Scope,
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) body: Bytes,
}

/// Everything that can refuse a request before any record is written.
pub(crate) async fn prepare<B>(
    layer: &IdempotencyLayer,
    parts: &Parts,
    body: B,
) -> Result<Prepared, Problem>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let source = layer.tool.key_source();
    let derives = matches!(
        source,
        KeySource::Arguments(_) | KeySource::ModelArgument(_)
    );
    let sent = match read_key(&parts.headers) {
        Ok(key) => Some(key),
        // Refused before the body is read when no key can be derived.
        Err(Problem::KeyRequired) if derives => None,
        Err(problem) => return Err(problem),
    };
    let principal = (layer.principal)(parts)?;
    let path = parts.uri.path();
    let scope = Scope::from_parts([principal.as_str(), path])
        .map_err(|e| Problem::InvalidScope(e.to_string()))?;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > layer.body_limit as u64) {
        return Err(Problem::BodyTooLarge {
            limit: layer.body_limit,
        });
    }
    let body = match Limited::new(body, layer.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(Problem::BodyTooLarge {
                limit: layer.body_limit,
            });
        }
        Err(e) => {
            return Err(Problem::InvalidBody(format!(
                "the body could not be read: {e}"
            )));
        }
    };
    let mut json: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| Problem::InvalidBody(format!("the body is not JSON: {e}")))?;
    // The model argument is not the request's: `key_of` takes it out of the fingerprint and of
    // the tool's body.
    let had_model_argument = match source {
        KeySource::ModelArgument(name) => json.get(name).is_some(),
        _ => false,
    };
    let key = match (&layer.key_from, source) {
        (Some(choose), KeySource::Arguments(_)) if sent.is_none() => {
            let mut chosen = choose(parts, &json)?;
            layer.tool.key_of(sent, &mut chosen, None)?
        }
        _ => layer.tool.key_of(sent, &mut json, None)?,
    };
    let key = match key {
        CallKey::Key(key) => key,
        // Passed through before it gets here.
        CallKey::Unprotected => return Err(Problem::KeyRequired),
    };
    let body = match had_model_argument {
        true => {
            Bytes::from(serde_json::to_vec(&json).map_err(|e| Problem::InvalidBody(e.to_string()))?)
        }
        false => body,
    };
    let fingerprint = match &layer.fingerprint {
        Some(choose) => Fingerprint::of_value(&operation(parts), &choose(parts, &json)?),
        None => Fingerprint::of_value(&operation(parts), &json),
    }
    .map_err(|e| Problem::InvalidBody(e.to_string()))?;
    Ok(Prepared {
        scope,
        key,
        fingerprint,
        body,
    })
}

/// The operation's name in the fingerprint: `METHOD /path`, then `?` and the
/// [`canonical_query`](crate::canonical_query) when the request has query parameters. A request
/// without them keeps the name it had before the query string was included.
fn operation(parts: &Parts) -> String {
    let (method, path) = (parts.method.as_str(), parts.uri.path());
    let query = match parts.uri.query() {
        Some(query) if !query.is_empty() => crate::canonical_query(query),
        _ => String::new(),
    };
    let mut name = String::with_capacity(method.len() + path.len() + query.len() + 2);
    name.push_str(method);
    name.push(' ');
    name.push_str(path);
    if !query.is_empty() {
        name.push('?');
        name.push_str(&query);
    }
    name
}
