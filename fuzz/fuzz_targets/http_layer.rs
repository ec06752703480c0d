//! `idem_http::IdempotencyLayer` driven with arbitrary requests: method, path, principal,
//! `Idempotency-Key` headers (none, one or several, any bytes), a declared `Content-Length`, and
//! any body, around a tool that answers with an arbitrary status and body. Each run uses a fresh
//! MemoryStore and counts the tool's runs at the sink.
//!
//! - A refused request is an `application/problem+json` 4xx, the tool did not run and nothing
//!   was written.
//! - An accepted request ran the tool exactly once, with the key `read_key` reads from the same
//!   headers and the body byte for byte, and answered with the JSON envelope (which parses).
//! - The same request again is a replay (same status, same `original_response`, tool not run)
//!   when the answer was definitive, and runs the tool again when it was retryable.
//! - The same body written again (other white space, key order and number spelling) and its
//!   RFC 8785 canonical form are the same request: replayed, never 422.
#![no_main]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_core::{Attempt, Executor, IdempotencyKey, MemoryStore, OutcomeClass, canonical_json};
use idem_fuzz::block_on;
use idem_http::{IDEMPOTENCY_KEY, IdempotencyLayer, Problem, default_classify, read_key};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower_layer::Layer;
use tower_service::Service;

const BODY_LIMIT: usize = 1024;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Verb {
    Post,
    Put,
    Patch,
    Delete,
    Get,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Reply {
    /// The request body, as received.
    Echo,
    /// A fixed JSON object.
    Json,
    /// No body.
    Empty,
    /// The input's raw bytes (any, not necessarily UTF-8 or JSON).
    Raw,
}

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    verb: Verb,
    path: &'a str,
    tenant: Option<&'a [u8]>,
    keys: Vec<&'a [u8]>,
    declared_length: Option<u16>,
    status: u16,
    reply: Reply,
    raw_reply: &'a [u8],
    body: &'a [u8],
}

#[derive(Default)]
struct Sink {
    runs: usize,
    bodies: Vec<Bytes>,
    keys: Vec<IdempotencyKey>,
}

#[derive(Clone)]
struct Tool {
    sink: Arc<Mutex<Sink>>,
    status: StatusCode,
    reply: Reply,
    raw_reply: Bytes,
}

impl Service<Request<Full<Bytes>>> for Tool {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let tool = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.expect("infallible").to_bytes();
            let attempt = parts
                .extensions
                .get::<Attempt>()
                .expect("the layer hands the tool its attempt");
            let reply = match tool.reply {
                Reply::Echo => body.clone(),
                Reply::Json => Bytes::from_static(br#"{"ticket_id":"T-1"}"#),
                Reply::Empty => Bytes::new(),
                Reply::Raw => tool.raw_reply.clone(),
            };
            {
                let mut sink = tool.sink.lock().unwrap();
                sink.runs += 1;
                sink.bodies.push(body);
                sink.keys.push(attempt.key().clone());
            }
            let mut response = Response::new(Full::new(reply));
            *response.status_mut() = tool.status;
            Ok(response)
        })
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

fn send(
    layer: &IdempotencyLayer,
    tool: &Tool,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Answer {
    let mut service = layer.layer(tool.clone());
    let mut request = Request::new(Full::new(Bytes::copy_from_slice(body)));
    *request.method_mut() = method.clone();
    *request.uri_mut() = uri.clone();
    *request.headers_mut() = headers.clone();
    block_on(async move {
        let response = service.call(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("infallible").to_bytes(),
        }
    })
}

fn envelope(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
        panic!(
            "the layer's answer is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&answer.body)
        )
    })
}

fuzz_target!(|input: Input| {
    let method = match input.verb {
        Verb::Post => Method::POST,
        Verb::Put => Method::PUT,
        Verb::Patch => Method::PATCH,
        Verb::Delete => Method::DELETE,
        Verb::Get => Method::GET,
    };
    let uri = http::Uri::try_from(format!("/{}", input.path))
        .unwrap_or_else(|_| http::Uri::from_static("/tools/t"));
    let mut headers = HeaderMap::new();
    for key in &input.keys {
        if let Ok(value) = HeaderValue::from_bytes(key) {
            headers.append(IDEMPOTENCY_KEY, value);
        }
    }
    if let Some(tenant) = input.tenant.and_then(|t| HeaderValue::from_bytes(t).ok()) {
        headers.insert("x-tenant", tenant);
    }
    if let Some(n) = input.declared_length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }

    let store = MemoryStore::new();
    let executor = Executor::new(store.clone());
    let layer = IdempotencyLayer::new(executor, |parts| {
        let tenant = parts
            .headers
            .get("x-tenant")
            .ok_or_else(|| Problem::Unauthenticated("no x-tenant".into()))?;
        Ok(String::from_utf8_lossy(tenant.as_bytes()).into_owned())
    })
    .body_limit(BODY_LIMIT);
    let status = StatusCode::from_u16(200 + input.status % 400).expect("200..=599");
    let tool = Tool {
        sink: Arc::default(),
        status,
        reply: input.reply,
        raw_reply: Bytes::copy_from_slice(input.raw_reply),
    };
    let runs = || tool.sink.lock().unwrap().runs;

    let first = send(&layer, &tool, &method, &uri, &headers, input.body);
    if runs() == 0 {
        assert!(
            matches!(first.status.as_u16(), 400 | 401 | 413),
            "refused with {}",
            first.status
        );
        assert_eq!(
            first
                .headers
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..])
        );
        let problem = envelope(&first);
        assert_eq!(problem["status"], first.status.as_u16());
        assert!(store.is_empty(), "a refused request wrote a record");
        return;
    }

    // Accepted: the tool ran once, with the key the headers carry and the body as sent.
    assert_eq!(runs(), 1);
    let key = read_key(&headers).expect("the tool ran, so the key was readable");
    {
        let sink = tool.sink.lock().unwrap();
        assert_eq!(sink.keys[0], key);
        assert_eq!(&sink.bodies[0][..], input.body);
    }
    assert!(input.body.len() <= BODY_LIMIT);
    let args: Value =
        serde_json::from_slice(input.body).expect("the tool ran, so the body is JSON");
    assert_eq!(store.len(), 1);
    assert!(first.headers.get("idempotency-replayed").is_none());
    let first_envelope = envelope(&first);
    assert_eq!(first_envelope["idempotent_replay"], false);
    assert_eq!(first_envelope["ok"], first.status.is_success());
    let definitive = default_classify(first.status) == OutcomeClass::Definitive;

    let mut repeats: Vec<Vec<u8>> = vec![input.body.to_vec()];
    repeats.push(serde_json::to_vec(&args).expect("a parsed body serialises"));
    if let Ok(canonical) = canonical_json(&args) {
        repeats.push(canonical.into_bytes());
    }
    let mut repeat_headers = headers.clone();
    repeat_headers.remove(header::CONTENT_LENGTH);
    for (i, body) in repeats.iter().enumerate() {
        let before = runs();
        let again = send(&layer, &tool, &method, &uri, &repeat_headers, body);
        let answer = envelope(&again);
        assert_ne!(
            answer["type"],
            "urn:idem:problem:fingerprint-mismatch",
            "the same request (form {i}: {:?}) got 422",
            String::from_utf8_lossy(body)
        );
        if definitive {
            assert_eq!(runs(), before, "a definitive answer ran the tool again");
            assert_eq!(again.status, first.status);
            assert_eq!(
                again
                    .headers
                    .get("idempotency-replayed")
                    .map(|v| v.as_bytes()),
                Some(&b"true"[..])
            );
            assert_eq!(answer["idempotent_replay"], true);
            assert_eq!(
                answer["original_response"],
                first_envelope["original_response"]
            );
        } else {
            assert_eq!(runs(), before + 1, "a retryable answer is run again");
        }
    }
    assert_eq!(store.len(), 1);
});
