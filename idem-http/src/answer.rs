//! What the layer answers: the tool's response as the outcome it records, and a recorded outcome
//! as the response in the layer's [`Replay`] mode.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Body;
use http_body_util::BodyExt;
use idem_core::{Outcome, OutcomeClass};

use crate::replay::{self, Replay};

/// The header set on a replayed response ([contract §5](idem_core::contract#http)).
pub const IDEMPOTENCY_REPLAYED: &str = "idempotency-replayed";

/// How a tool's status classifies its outcome ([`default_classify`] unless replaced).
pub(crate) type ClassifyFn = dyn Fn(StatusCode) -> OutcomeClass + Send + Sync;
/// A body's error, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default classification of a tool's answer: 2xx and 4xx other than 408 and 429 are
/// definitive; 5xx, 408 and 429 (and anything else) are retryable.
pub fn default_classify(status: StatusCode) -> OutcomeClass {
    let code = status.as_u16();
    if status.is_success()
        || (status.is_client_error() && code != 408 && code != 429)
        || status.is_redirection()
    {
        OutcomeClass::Definitive
    } else {
        OutcomeClass::Retryable
    }
}

/// The tool's response as an outcome: its status, its body (JSON kept byte for byte; an empty
/// body becomes `null`, any other non-JSON body a JSON string), classified.
pub(crate) async fn to_outcome<B>(response: Response<B>, classify: &ClassifyFn) -> Outcome
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    let class = classify(status);
    let Some(bytes) = collect(response.into_body()).await else {
        return internal_failure();
    };
    json_outcome(status.as_u16(), &bytes, class).unwrap_or_else(|_| internal_failure())
}

/// The outcome whose body is `bytes` as [`json_text`] keeps them, reading the body as JSON once
/// (the outcome's own check is that reading).
fn json_outcome(
    status: u16,
    bytes: &[u8],
    class: OutcomeClass,
) -> Result<Outcome, serde_json::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.is_empty() => Outcome::from_json_text(status, text, class)
            .or_else(|_| Outcome::from_json_text(status, json_string(text), class)),
        _ => Outcome::from_json_text(status, json_text(bytes), class),
    }
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// The tool's response in verbatim mode: the outcome to store (status, the `listed` headers, or
/// all but the hop-by-hop ones, and the body bytes) and the whole response for the caller whose request ran the tool.
pub(crate) async fn to_verbatim_outcome<B>(
    response: Response<B>,
    listed: Option<&[http::HeaderName]>,
    classify: &ClassifyFn,
) -> (Outcome, Option<Response<Bytes>>)
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let class = classify(parts.status);
    let Some(bytes) = collect(body).await else {
        return (internal_failure(), None);
    };
    let text = replay::encode(listed, &parts.headers, &bytes);
    match Outcome::from_json_text(parts.status.as_u16(), text, class) {
        Ok(outcome) => (outcome, Some(Response::from_parts(parts, bytes))),
        Err(_) => (internal_failure(), None),
    }
}

async fn collect<B>(body: B) -> Option<Bytes>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    match body.collect().await {
        Ok(collected) => Some(collected.to_bytes()),
        Err(e) => {
            let e: BoxError = e.into();
            tracing::error!(error = %e, "the tool's response body failed");
            None
        }
    }
}

/// A body as the JSON text the envelope holds: JSON kept byte for byte; an empty body becomes
/// `null`, any other non-JSON body a JSON string.
fn json_text(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        "null".to_owned()
    } else {
        match std::str::from_utf8(bytes) {
            // Read as a value: JSON a reader cannot hold (`1E400`) is kept as a string too.
            Ok(s) if serde_json::from_str::<serde_json::Value>(s).is_ok() => s.to_owned(),
            Ok(s) => json_string(s),
            Err(_) => {
                serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()).to_string()
            }
        }
    }
}

pub(crate) fn internal_failure() -> Outcome {
    Outcome::from_json_text(
        500,
        r#"{"error":"the tool failed without an answer"}"#,
        OutcomeClass::Retryable,
    )
    .expect("a constant JSON text")
}

/// The answer for a stored outcome in the layer's mode.
pub(crate) fn respond<B: From<Bytes>>(
    mode: &Replay,
    outcome: &Outcome,
    replay: bool,
) -> Response<B> {
    match mode {
        Replay::Verbatim { headers } => verbatim(Some(headers), outcome, replay),
        Replay::VerbatimAllHeaders => verbatim(None, outcome, replay),
        _ => wrap(outcome, replay),
    }
}

/// A stored outcome in verbatim mode: its status, the kept headers still `listed` (all of them
/// when `None`), its body bytes. An outcome without a kept response (stored in envelope mode, or stored by the executor
/// in place of the tool's answer) is its JSON body.
fn verbatim<B: From<Bytes>>(
    listed: Option<&[http::HeaderName]>,
    outcome: &Outcome,
    replay: bool,
) -> Response<B> {
    let mut response = match replay::decode(outcome) {
        Some(kept) => {
            let mut response = Response::new(B::from(kept.body));
            for (name, value) in kept.headers {
                if listed.is_none_or(|listed| listed.contains(&name)) {
                    response.headers_mut().append(name, value);
                }
            }
            response
        }
        None => {
            let mut response = Response::new(B::from(Bytes::from(outcome.body().to_owned())));
            let content_type = if outcome.is_not_kept() {
                "application/problem+json"
            } else {
                "application/json"
            };
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        }
    };
    *response.status_mut() = replay::status_of(outcome);
    if replay {
        response
            .headers_mut()
            .insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// The [contract §5](idem_core::contract#http) envelope around a stored outcome; the tool's body is
/// inserted byte for byte.
fn wrap<B: From<Bytes>>(outcome: &Outcome, replay: bool) -> Response<B> {
    let status = replay::status_of(outcome);
    // A response kept in verbatim mode (the layer's mode changed): its body, as envelope mode
    // would have kept it.
    let kept = replay::decode(outcome).map(|kept| json_text(&kept.body));
    let original = kept.as_deref().unwrap_or(outcome.body());
    let mut body = String::with_capacity(original.len() + 64);
    body.push_str(if status.is_success() {
        r#"{"ok":true,"idempotent_replay":"#
    } else {
        r#"{"ok":false,"idempotent_replay":"#
    });
    body.push_str(if replay {
        r#"true,"original_response":"#
    } else {
        r#"false,"original_response":"#
    });
    body.push_str(original);
    body.push('}');
    let mut response = Response::new(B::from(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if replay {
        headers.insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    async fn outcome_of(body: &'static str) -> Outcome {
        let response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        to_outcome(response, &default_classify).await
    }

    #[tokio::test]
    async fn the_tool_answer_is_kept_and_always_reads_back() {
        let json = outcome_of(r#"{"b":1,  "a":[1.50]}"#).await;
        assert_eq!(json.body(), r#"{"b":1,  "a":[1.50]}"#);
        assert_eq!(outcome_of("").await.body(), "null");
        assert_eq!(outcome_of("plain text").await.body_json(), "plain text");
        // Found by fuzzing (fuzz target `http_layer`): a body that is JSON syntax but holds a
        // number no reader can (`1E400`) was judged JSON and stored, so the answer and every
        // replay was an envelope no JSON reader could parse. It is now kept as a string, with
        // the tool's status.
        let huge = outcome_of("1E400").await;
        assert_eq!(huge.status(), 200);
        assert_eq!(huge.body_json(), "1E400");
        let envelope: serde_json::Value =
            serde_json::from_str(&format!(r#"{{"original_response":{}}}"#, huge.body())).unwrap();
        assert_eq!(envelope["original_response"], "1E400");
    }
}
