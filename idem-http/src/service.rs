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
use idem_core::{Answer, Call, KeyOrigin, KeySource, Outcome, Reply};
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::{
    BoxError, ClassifyFn, internal_failure, respond, to_outcome, to_verbatim_outcome,
};
use crate::keyless::IDEMPOTENCY_KEY_SOURCE;
use crate::layer::IdempotencyLayer;
use crate::prepare::{Prepared, prepare};
use crate::replay::Replay;
use crate::{IDEMPOTENCY_KEY, Problem, ProblemResponse};

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            layer: Arc::new(self.clone()),
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
            if layer.tool.key_source() == &KeySource::Unprotected
                && !parts.headers.contains_key(IDEMPOTENCY_KEY)
            {
                return pass_through(inner, parts, body).await;
            }
            let (answer, origin) = match prepare(&layer, &parts, body).await {
                Ok(prepared) => {
                    let origin = prepared.key.origin();
                    let answer = execute(&layer, inner, parts, prepared).await;
                    (answer, Some(origin))
                }
                Err(problem) => (Answer::refused(problem, "http"), None),
            };
            let mut response = match answer.reply {
                // Also when the answer could not be recorded as this attempt's: the caller still
                // gets it (the effect happened).
                Reply::Executed {
                    value: (_, Some(failure)),
                    ..
                } => return Err(failure),
                Reply::Executed {
                    value: (Some(original), None),
                    ..
                } => original.map(ResB::from),
                Reply::Executed {
                    value: (None, None),
                    outcome,
                    ..
                } => respond(&layer.replay, &outcome, false),
                Reply::Replayed { outcome } => respond(&layer.replay, &outcome, true),
                Reply::Refused {
                    refusal: Problem::InFlight { stale: true, .. },
                    ..
                } if layer.in_doubt_when_stale => crate::problem::in_doubt(),
                Reply::Refused { refusal, .. } => refusal.to_response(),
            };
            if let Some(origin) = origin {
                mark(&mut response, origin, answer.waited);
            }
            Ok(response)
        })
    }
}

/// What the tool's answer to a request is made of: in verbatim mode its whole response, and the
/// inner service's error if it failed.
type ToolAnswer<E> = (Option<Response<Bytes>>, Option<E>);

/// Runs the inner service for a request that passed every check, through the executor.
async fn execute<S, ReqB, ResB>(
    layer: &Arc<IdempotencyLayer>,
    inner: S,
    parts: Parts,
    prepared: Prepared,
) -> Answer<ToolAnswer<S::Error>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    let Prepared {
        scope,
        key,
        fingerprint,
        body,
    } = prepared;
    let wait = crate::prefer::requested_wait(&parts.headers).unwrap_or_default();
    let call = Call::new(scope, key, fingerprint)
        .wait(wait)
        .transport("http");
    let request = Request::from_parts(parts, ReqB::from(body));
    let tool = layer.clone();
    layer
        .executor
        .execute(&layer.tool, call, move |attempt| async move {
            let mut request = request;
            request.extensions_mut().insert(attempt);
            let (outcome, response, error) =
                call_tool(inner, request, &tool.replay, &*tool.classify).await;
            ((response, error), outcome)
        })
        .await
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
            let (outcome, response) = to_verbatim_outcome(response, Some(headers), classify).await;
            (outcome, response, None)
        }
        (Ok(response), Replay::VerbatimAllHeaders) => {
            let (outcome, response) = to_verbatim_outcome(response, None, classify).await;
            (outcome, response, None)
        }
        (Ok(response), _) => (to_outcome(response, classify).await, None, None),
        (Err(e), _) => (internal_failure(), None, Some(e)),
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
