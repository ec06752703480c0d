//! [`Idempotent`], the service the layer wraps around a tool: one request, step by step.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use idem_core::{Error, ErrorAnswer, Execution, Executor, KeyOrigin, Outcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::{
    BoxError, ClassifyFn, internal_failure, respond, to_outcome, to_verbatim_outcome,
};
use crate::keyless::IDEMPOTENCY_KEY_SOURCE;
use crate::layer::IdempotencyLayer;
use crate::prepare::{Prepared, policy_for, prepare};
use crate::replay::Replay;
use crate::{IDEMPOTENCY_KEY, Problem, ProblemResponse};

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
                return pass_through(inner, parts, body).await;
            }
            let prepared = match prepare(&layer, &parts, body).await {
                Ok(prepared) => prepared,
                Err(problem) => {
                    idem_core::metrics::count_refusal("http", problem.name());
                    return Ok(problem.to_response());
                }
            };
            let origin = prepared.key.origin();
            let executor = match executor_for(&layer, &parts, origin) {
                Ok(executor) => executor,
                Err(response) => return Ok(response),
            };
            let ran = match run_detached(&layer, executor, inner, parts, prepared).await {
                Ok(ran) => ran,
                Err(response) => return Ok(response),
            };
            if let Some(e) = ran.failure {
                return Err(e);
            }
            let mut response = answer(&layer.replay, ran.result, ran.original);
            mark(&mut response, origin, ran.waited);
            Ok(response)
        })
    }
}

/// A request without a key on a route where the key is optional: straight to the tool.
async fn pass_through<S, ReqB, ResB>(
    mut inner: S,
    parts: Parts,
    body: ReqB,
) -> Result<Response<ResB>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    idem_core::metrics::count_unprotected("http");
    tracing::debug!(method = %parts.method, path = parts.uri.path(), "no Idempotency-Key on a route where it is optional: passed through unprotected");
    poll_fn(|cx| inner.poll_ready(cx)).await?;
    inner.call(Request::from_parts(parts, body)).await
}

/// The executor this request runs on: waiting when it asks to (`Prefer: wait=N`, a repeat that
/// finds its operation in flight waits for the answer), under the key window's policy when its
/// key was derived.
fn executor_for<B: From<Bytes>>(
    layer: &IdempotencyLayer,
    parts: &Parts,
    origin: KeyOrigin,
) -> Result<Executor, Response<B>> {
    let executor = match crate::prefer::requested_wait(&parts.headers) {
        Some(wait) if !wait.is_zero() => layer.executor.waiting(wait),
        _ => layer.executor.clone(),
    };
    Ok(match policy_for(layer, origin)? {
        Some(policy) => executor.with_policy(policy),
        None => executor,
    })
}

/// What the detached task hands back: beside the executor's result, the inner service's error
/// (if it failed), in verbatim mode the tool's whole response for the caller whose request ran
/// it, and the wait bound if the request waited.
struct Ran<E> {
    result: Result<Execution, Error>,
    failure: Option<E>,
    original: Option<Response<Bytes>>,
    waited: Option<Duration>,
}

/// Claims, runs the tool and completes in a task of its own, so a caller that goes away cannot
/// cancel the tool halfway. `Err` is the answer when the task did not finish (the runtime is
/// shutting down).
async fn run_detached<S, ReqB, ResB>(
    layer: &Arc<IdempotencyLayer>,
    executor: Executor,
    inner: S,
    parts: Parts,
    prepared: Prepared,
) -> Result<Ran<S::Error>, Response<ResB>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: From<Bytes> + Send + 'static,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    let layer = layer.clone();
    let task = tokio::spawn(async move {
        let Prepared {
            scope,
            key,
            fingerprint,
            body,
        } = prepared;
        let request = Request::from_parts(parts, ReqB::from(body));
        let (mut failure, mut original) = (None, None);
        let (failure_slot, original_slot) = (&mut failure, &mut original);
        let (replay, classify) = (&layer.replay, &*layer.classify);
        let result = executor
            .run(&scope, &key, &fingerprint, |attempt| async move {
                let mut request = request;
                request.extensions_mut().insert(attempt);
                let (outcome, response, error) = call_tool(inner, request, replay, classify).await;
                (*original_slot, *failure_slot) = (response, error);
                outcome
            })
            .await;
        // Said only to a request that asked (`Prefer: wait`); one under a derived key that
        // asked for nothing was waited for without being told.
        let waited = executor
            .waited()
            .map(|_| executor.wait_bound())
            .filter(|bound| !bound.is_zero());
        Ran {
            result,
            failure,
            original,
            waited,
        }
    });
    match task.await {
        Ok(ran) => Ok(ran),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => Err(Problem::StoreError.to_response()),
    }
}

/// Calls the tool: the outcome to record, in verbatim mode the tool's whole response, and the
/// inner service's error if it failed (recorded as [`internal_failure`]).
async fn call_tool<S, ReqB, ResB>(
    mut inner: S,
    request: Request<ReqB>,
    replay: &Replay,
    classify: &ClassifyFn,
) -> (Outcome, Option<Response<Bytes>>, Option<S::Error>)
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    let answer = match poll_fn(|cx| inner.poll_ready(cx)).await {
        Ok(()) => inner.call(request).await,
        Err(e) => Err(e),
    };
    match (answer, replay) {
        (Ok(response), Replay::Verbatim { headers }) => {
            let (outcome, response) = to_verbatim_outcome(response, headers, classify).await;
            (outcome, response, None)
        }
        (Ok(response), _) => (to_outcome(response, classify).await, None, None),
        (Err(e), _) => (internal_failure(), None, Some(e)),
    }
}

/// The caller's answer: the tool's own response where verbatim mode kept it, else the outcome
/// in the layer's mode; a replay marked as one; a refusal as a problem.
fn answer<B: From<Bytes>>(
    mode: &Replay,
    result: Result<Execution, Error>,
    original: Option<Response<Bytes>>,
) -> Response<B> {
    let first = |outcome: &Outcome| match original {
        Some(response) => response.map(B::from),
        None => respond(mode, outcome, false),
    };
    match result {
        Ok(Execution::Executed { outcome, .. }) => first(&outcome),
        Ok(Execution::Replayed { outcome }) => respond(mode, &outcome, true),
        // The tool ran and answered, but the answer could not be recorded: the caller still
        // gets it (the effect happened); the record is left to the lease and reconciliation.
        Err(error) => match ErrorAnswer::observed(&error, "http") {
            ErrorAnswer::Answer(outcome) => first(outcome),
            ErrorAnswer::Refuse(refusal) => refusal.to_response(),
        },
    }
}

/// The headers that say how the answer came about: where a derived key came from, and the wait
/// bound applied.
fn mark<B>(response: &mut Response<B>, origin: KeyOrigin, waited: Option<Duration>) {
    if origin != KeyOrigin::Sent {
        response.headers_mut().insert(
            IDEMPOTENCY_KEY_SOURCE,
            HeaderValue::from_static(origin.as_str()),
        );
    }
    if let Some(bound) = waited {
        response.headers_mut().insert(
            crate::prefer::PREFERENCE_APPLIED,
            crate::prefer::applied(bound),
        );
    }
}
