//! [`IdempotencyLayer`]: the tower layer.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{
    ErrorAnswer, Execution, Executor, Fingerprint, KeyOrigin, KeySource, Outcome, OutcomeClass,
    Scope,
};
use serde_json::Value;
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::{internal_failure, respond, to_outcome, to_verbatim_outcome};
use crate::keyless::{IDEMPOTENCY_KEY_SOURCE, Keyless};
use crate::replay::Replay;
use crate::{IDEMPOTENCY_KEY, Problem, ProblemResponse, read_key};

/// The header set on a replayed response ([contract §5](idem_core::contract#http)).
pub const IDEMPOTENCY_REPLAYED: &str = "idempotency-replayed";

/// The default request body limit: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

type PrincipalFn = dyn Fn(&Parts) -> Result<String, Problem> + Send + Sync;
pub(crate) type ClassifyFn = dyn Fn(StatusCode) -> OutcomeClass + Send + Sync;
type FingerprintFn = dyn Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync;
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

/// Makes the routes it wraps exactly-once per `Idempotency-Key` (contract [§4](idem_core::contract#refusals)–[§5](idem_core::contract#http)).
///
/// For each request: reads and validates the key (400 `key-required` / `invalid-key`), derives
/// the scope from the principal the extractor returns plus the request path, reads the body
/// (413 over the limit, 400 if not JSON), fingerprints method + path + the query string
/// (parameters sorted, see [`canonical_query`](crate::canonical_query)) + canonical JSON body, and
/// runs the inner service through the [`Executor`]: once per (scope, key). The answer is the
/// tool's status with `{"ok", "idempotent_replay", "original_response"}`; a repeat gets the same
/// status and body with `"idempotent_replay": true` and `Idempotency-Replayed: true` (or, in
/// [`Replay::Verbatim`] mode, the tool's own response: see [`replay`](Self::replay)); same key
/// with another body is 422, a repeat while the first runs is 409 with `Retry-After`, a store
/// that is down is 503 — each an `application/problem+json` body.
///
/// A request with `Prefer: wait=N` that finds its operation in flight waits for the answer
/// ([contract §5.2](idem_core::contract#waiting)): at most the least of N, the executor's
/// [maximum wait](idem_core::Executor::with_max_wait) and the holder's remaining lease. The answer
/// of a request that waited carries `Preference-Applied: wait=B`, B that bound without the lease
/// (the replay, the tool's own answer if the record became claimable and it ran, or 409 if the
/// bound passed).
///
/// The claim, the inner service and the completion run in one spawned task per request: a client
/// that disconnects (its deadline passed) cannot cancel a tool halfway; the outcome is recorded
/// and its retry gets the replay. The
/// [`idem_core::Attempt`] is put in the request's extensions, so a handler can complete the
/// record in the same transaction as its effect and call
/// [`Attempt::mark_recorded`](idem_core::Attempt::mark_recorded).
///
/// Per layer: [`key_source`](Self::key_source) chooses what a request without a key gets
/// (refused by default; a key derived from its body; or unprotected), and
/// [`fingerprint_with`](Self::fingerprint_with) chooses the part of the body that identifies a
/// request.
#[derive(Clone)]
pub struct IdempotencyLayer {
    executor: Executor,
    principal: Arc<PrincipalFn>,
    classify: Arc<ClassifyFn>,
    body_limit: usize,
    replay: Replay,
    keyless: Keyless,
    fingerprint: Option<Arc<FingerprintFn>>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("executor", &self.executor)
            .field("body_limit", &self.body_limit)
            .field("replay", &self.replay)
            .field("key_source", &self.keyless.source)
            .field("key_window", &self.keyless.window)
            .field("fingerprint_with", &self.fingerprint.is_some())
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer running tools through `executor`, with `principal` naming who sent a request
    /// (a tenant or user id taken from the authenticated request parts; an `Err` refuses the
    /// request). Each request runs in a task of its own (claim, tool and completion together), so
    /// claims and completions survive dropped callers with or without a spawner on `executor`;
    /// the layer does not use the spawner (it would add a task hop per claim and completion and
    /// protect nothing more).
    pub fn new(
        executor: Executor,
        principal: impl Fn(&Parts) -> Result<String, Problem> + Send + Sync + 'static,
    ) -> Self {
        Self {
            executor,
            principal: Arc::new(principal),
            classify: Arc::new(default_classify),
            body_limit: DEFAULT_BODY_LIMIT,
            replay: Replay::Envelope,
            keyless: Keyless::default(),
            fingerprint: None,
        }
    }

    /// Chooses how answers look: [`Replay::Envelope`] (the default) or [`Replay::Verbatim`]
    /// (the tool's own response; a repeat gets its status, the listed headers and the body byte
    /// for byte, plus `Idempotency-Replayed: true`). Refusals are `application/problem+json` in
    /// both modes.
    ///
    /// A record keeps the shape it was stored in: switching modes on a live store is safe, but a
    /// record stored in envelope mode replays in verbatim mode as its JSON body with
    /// `Content-Type: application/json` (no headers were kept), and one stored verbatim replays
    /// in envelope mode with its body as `original_response`.
    pub fn replay(mut self, replay: Replay) -> Self {
        self.replay = replay;
        self
    }

    /// Chooses what a request without an `Idempotency-Key` header gets on the routes this layer
    /// wraps ([contract §5.1](idem_core::contract#keyless)); a key the request sends always wins,
    /// and an invalid one is refused (400) whatever the source.
    ///
    /// - [`KeySource::Refuse`] (the default): 400 `key-required`, nothing runs.
    /// - [`KeySource::Arguments`]: the key is derived from the canonical JSON body (all of it, or
    ///   the values at the source's JSON pointers, or what [`key_from`](Self::key_from) picks),
    ///   in the request's scope (principal and path). The same body within the
    ///   [`key_window`](Self::key_window) replays: what a client with a retry policy and no key
    ///   needs; a deliberate repeat must differ in what the key covers.
    /// - [`KeySource::ModelArgument`]: the key is the body's field of that name (a string the
    ///   model fills), taken out of the body before the fingerprint and before the tool sees it;
    ///   a body without it is 400 `key-required`.
    /// - [`KeySource::Unprotected`]: the request passes straight through to the tool,
    ///   unprotected (it runs every time; no body limit, principal or record), counted in
    ///   `idem_unprotected_total{transport="http"}`.
    /// - [`KeySource::Request`] is MCP's (HTTP has no request id): refused as `Refuse`.
    ///
    /// The answer to a request under a derived key carries `Idempotency-Key-Source: arguments`
    /// (or `model_argument`), on the first execution and on every replay.
    ///
    /// ```
    /// # use idem_core::{Executor, MemoryStore};
    /// use idem_core::KeySource;
    /// use idem_http::IdempotencyLayer;
    /// # let executor = Executor::new(MemoryStore::new());
    /// // A client that retries without a key: the same order body within an hour is one order.
    /// let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".into()))
    ///     .key_source(KeySource::arguments_at(["/account", "/items"]));
    /// ```
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.keyless.source = source;
        self
    }

    /// The window of a derived key: how long its record is kept, so how long the same request
    /// without a key replays (default [`KeySource::DEFAULT_WINDOW`], 1 hour). It must exceed the
    /// executor's lease; a request under a derived key is otherwise refused with 500.
    pub fn key_window(mut self, window: std::time::Duration) -> Self {
        self.keyless.window = window;
        self
    }

    /// Derives the key of a request without one from the value `choose` returns (as
    /// [`fingerprint_with`](Self::fingerprint_with) chooses the fingerprint's part) instead of the
    /// whole body; sets the key source to [`KeySource::Arguments`]. An `Err` refuses the
    /// request.
    pub fn key_from(
        mut self,
        choose: impl Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync + 'static,
    ) -> Self {
        self.keyless.source = KeySource::arguments();
        self.keyless.choose = Some(Arc::new(choose));
        self
    }

    /// Chooses what of the JSON body identifies a request: the fingerprint covers the method,
    /// the path, the [`canonical_query`](crate::canonical_query) and the value `choose` returns
    /// instead of the whole body. Two requests with one key whose chosen values are equal (as
    /// canonical JSON) get the replay; otherwise 422. An `Err` refuses the request (nothing is
    /// recorded, the tool does not run). The request still has to be JSON.
    ///
    /// Identify a payment by its account and amount, not by a free-text note (what AWS Lambda
    /// Powertools calls `payload_validation_jmespath="[account, payment.amount]"`; the key itself
    /// still comes from the `Idempotency-Key` header):
    ///
    /// ```
    /// # use idem_core::{Executor, MemoryStore};
    /// use idem_http::{IdempotencyLayer, Problem};
    /// use serde_json::json;
    /// # let executor = Executor::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".into()))
    ///     .fingerprint_with(|_parts, body| {
    ///         // A missing field is `null`: say so if that is not the same request to you.
    ///         Ok(json!([body.pointer("/account"), body.pointer("/payment/amount")]))
    ///     });
    /// ```
    pub fn fingerprint_with(
        mut self,
        choose: impl Fn(&Parts, &Value) -> Result<Value, Problem> + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Some(Arc::new(choose));
        self
    }

    /// Replaces [`default_classify`].
    pub fn classify_with(
        mut self,
        classify: impl Fn(StatusCode) -> OutcomeClass + Send + Sync + 'static,
    ) -> Self {
        self.classify = Arc::new(classify);
        self
    }

    /// Sets the request body limit in bytes (413 beyond it).
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The executor.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            layer: Arc::new(Self {
                // The request's own task already protects the claim and the completion.
                executor: self.executor.without_spawner(),
                ..self.clone()
            }),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around a tool.
#[derive(Clone, Debug)]
pub struct Idempotent<S> {
    inner: S,
    // Shared: a request clones one `Arc`, not the layer's settings.
    layer: Arc<IdempotencyLayer>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Idempotent<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven to readiness per request, in its own task.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let inner = self.inner.clone();
        let layer = self.layer.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            if layer.keyless.unprotected() && !parts.headers.contains_key(IDEMPOTENCY_KEY) {
                idem_core::metrics::count_unprotected("http");
                tracing::debug!(method = %parts.method, path = parts.uri.path(), "no Idempotency-Key on a route where it is optional: passed through unprotected");
                let mut inner = inner;
                poll_fn(|cx| inner.poll_ready(cx)).await?;
                return inner.call(Request::from_parts(parts, body)).await;
            }
            // `Prefer: wait=N`: a repeat that finds its operation in flight waits for the answer.
            let executor = match crate::prefer::requested_wait(&parts.headers) {
                Some(wait) if !wait.is_zero() => layer.executor.waiting(wait),
                _ => layer.executor.clone(),
            };
            let prepared = match prepare(&layer, &parts, body).await {
                Ok(prepared) => prepared,
                Err(problem) => {
                    idem_core::metrics::count_refusal("http", problem.name());
                    return Ok(problem.to_response());
                }
            };
            let Prepared {
                scope,
                key,
                fingerprint,
                body,
            } = prepared;
            let origin = key.origin();
            let derived_policy = match policy_for(&layer, origin) {
                Ok(policy) => policy,
                Err(response) => return Ok(response),
            };
            let request = Request::from_parts(parts, ReqB::from(body));
            let task_layer = layer.clone();
            // Detached, so a caller that goes away cannot cancel the tool halfway. The task
            // hands back, beside the executor's result, the inner service's error (if it failed)
            // and, in verbatim mode, the tool's whole response for the caller whose request ran it.
            let task = tokio::spawn(async move {
                let layer = task_layer;
                let executor = match derived_policy {
                    Some(policy) => executor.with_policy(policy),
                    None => executor,
                };
                let mut failure: Option<S::Error> = None;
                let mut original: Option<Response<Bytes>> = None;
                let (failure_slot, original_slot) = (&mut failure, &mut original);
                let (replay, classify) = (&layer.replay, &*layer.classify);
                let result = executor
                    .run(&scope, &key, &fingerprint, |attempt| async move {
                        let mut request = request;
                        request.extensions_mut().insert(attempt);
                        let mut inner = inner;
                        let answer = match poll_fn(|cx| inner.poll_ready(cx)).await {
                            Ok(()) => inner.call(request).await,
                            Err(e) => Err(e),
                        };
                        match answer {
                            Ok(response) => match replay {
                                Replay::Verbatim { headers } => {
                                    let (outcome, response) =
                                        to_verbatim_outcome(response, headers, classify).await;
                                    *original_slot = response;
                                    outcome
                                }
                                _ => to_outcome(response, classify).await,
                            },
                            Err(e) => {
                                *failure_slot = Some(e);
                                internal_failure()
                            }
                        }
                    })
                    .await;
                let waited = executor.waited().map(|_| executor.wait_bound());
                (result, failure, original, waited)
            });
            let (result, failure, original, waited) = match task.await {
                Ok(done) => done,
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(_) => return Ok(Problem::StoreError.to_response()),
            };
            if let Some(e) = failure {
                return Err(e);
            }
            let answer = |outcome: &Outcome| match original {
                Some(response) => response.map(ResB::from),
                None => respond(&layer.replay, outcome, false),
            };
            let mut response = match result {
                Ok(Execution::Executed { outcome, .. }) => answer(&outcome),
                Ok(Execution::Replayed { outcome }) => respond(&layer.replay, &outcome, true),
                // The tool ran and answered, but the answer could not be recorded: the caller still
                // gets it (the effect happened); the record is left to the lease and reconciliation.
                Err(error) => match ErrorAnswer::observed(&error, "http") {
                    ErrorAnswer::Answer(outcome) => answer(outcome),
                    ErrorAnswer::Refuse(refusal) => refusal.to_response(),
                },
            };
            if origin != KeyOrigin::Sent {
                response.headers_mut().insert(
                    IDEMPOTENCY_KEY_SOURCE,
                    http::HeaderValue::from_static(origin.as_str()),
                );
            }
            if let Some(bound) = waited {
                response.headers_mut().insert(
                    crate::prefer::PREFERENCE_APPLIED,
                    crate::prefer::applied(bound),
                );
            }
            Ok(response)
        })
    }
}

struct Prepared {
    scope: Scope,
    key: idem_core::IdempotencyKey,
    fingerprint: Fingerprint,
    body: Bytes,
}

/// Everything that can refuse a request before any record is written.
async fn prepare<B>(layer: &IdempotencyLayer, parts: &Parts, body: B) -> Result<Prepared, Problem>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let sent = match read_key(&parts.headers) {
        Ok(key) => Some(key),
        Err(Problem::KeyRequired) if layer.keyless.derives() => None,
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
    // The model argument is not the request's: out of the fingerprint and of the tool's body.
    let model_value = layer.keyless.take_model_argument(&mut json);
    let body = match model_value {
        Some(_) => {
            Bytes::from(serde_json::to_vec(&json).map_err(|e| Problem::InvalidBody(e.to_string()))?)
        }
        None => body,
    };
    let fingerprint = match &layer.fingerprint {
        Some(choose) => Fingerprint::of_value(&operation(parts), &choose(parts, &json)?),
        None => Fingerprint::of_value(&operation(parts), &json),
    }
    .map_err(|e| Problem::InvalidBody(e.to_string()))?;
    let key = match sent {
        Some(key) => key,
        None => layer.keyless.key(parts, &json, model_value)?,
    };
    Ok(Prepared {
        scope,
        key,
        fingerprint,
        body,
    })
}

/// The policy of a request under a key from `origin`, if not the executor's: a derived key's
/// record lives for the key window. A window that does not fit the lease is a misconfiguration:
/// 500, nothing runs.
fn policy_for<B: From<Bytes>>(
    layer: &IdempotencyLayer,
    origin: KeyOrigin,
) -> Result<Option<idem_core::Policy>, Response<B>> {
    if origin == KeyOrigin::Sent {
        return Ok(None);
    }
    let policy = layer
        .executor
        .policy()
        .to_builder()
        .ttl(layer.keyless.window)
        .build();
    match policy {
        Ok(policy) => Ok(Some(policy)),
        Err(e) => {
            tracing::error!(error = %e, "the key window does not fit the executor's lease; nothing ran");
            Err(Problem::StoreError.to_response())
        }
    }
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
