//! The one file of the proxy that speaks idem's types: a protected route is idem-http's
//! [`IdempotencyLayer`] in verbatim mode around [`ToUpstream`], the service that forwards to the
//! upstream ([contract §5](idem_core::contract#http), and the proxy's own section of it).
//!
//! The layer claims before anything is forwarded and answers every repeat with the upstream's
//! first answer. What only the proxy can tell it goes through the attempt the layer hands the
//! inner service: the downstream key ([contract §6](idem_core::contract#beyond-one-call)) for the
//! upstream; a request never sent gives its claim back (released: a retry runs); a request sent
//! without a valid answer leaves its record `processing` (the effect may have happened), so a
//! retry gets 409 during the lease and, under the default stale policy, the in-doubt answer after.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{HeaderName, Request, Response, header};
use idem_core::{
    Attempt, CachePolicy, Executor, KeySource, KeyStore, OutcomeClass, Policy, StalePolicy, Tool,
};
use idem_http::{IdempotencyLayer, Idempotent, Problem, ProblemResponse, Replay, default_classify};
use idemkit::StoreUrl;
use tower_service::Service;

use super::body::{RawBody, as_json, json_limit};
use super::config::{KeySourceName, RouteSettings, Stale};
use super::forward::{Forwarded, Outgoing, Upstream};
use super::tenant::Tenancy;
use crate::exit::Failure;

/// The name the downstream key is derived for: the same for every upstream address, so moving
/// the upstream does not change the key of an operation.
const PROVIDER: &str = "idem-proxy";

/// The record store, opened (and its schema created or upgraded) at start.
#[derive(Debug, Clone)]
pub(crate) struct Store(Arc<dyn KeyStore>);

impl Store {
    /// The store itself.
    pub(crate) fn handle(&self) -> Arc<dyn KeyStore> {
        self.0.clone()
    }
}

/// Opens `url`, creating or upgrading its schema, as `idem serve` does.
pub(crate) async fn open_store(url: &StoreUrl) -> Result<Store, Failure> {
    let opened = idemkit::OpenOptions::new().migrate(true).open(url).await?;
    Ok(Store(opened.into_store()))
}

/// The tenant of a request, for the layer's scope.
#[derive(Debug, Clone)]
struct TenantName(String);

/// One protected route: the layer around the forwarder.
#[derive(Clone)]
pub(crate) struct Protected {
    service: Idempotent<ToUpstream>,
    tenancy: Tenancy,
    max_request_bytes: usize,
}

impl Protected {
    /// The route with `settings` in front of `upstream`, its records in `store`.
    pub(crate) fn new(
        store: &Store,
        settings: &RouteSettings,
        upstream: Upstream,
        tenancy: Tenancy,
    ) -> Result<Self, String> {
        let policy = Policy::builder()
            .lease(settings.lease)
            .stale(match settings.stale {
                Stale::InDoubt => StalePolicy::Reconcile,
                Stale::Takeover => StalePolicy::Takeover,
            })
            .cache(match settings.keep_every_answer {
                true => CachePolicy::CacheAll,
                false => CachePolicy::DefinitiveOnly,
            })
            .build()
            .map_err(|e| e.to_string())?;
        let tool = Tool::builder()
            .policy(policy)
            .max_wait(settings.max_wait)
            .processing_window(settings.processing_window)
            .key_source(match settings.key_source {
                KeySourceName::Refuse => KeySource::Refuse,
                KeySourceName::Arguments => KeySource::arguments(),
                KeySourceName::Unprotected => KeySource::Unprotected,
            })
            .key_window(settings.key_window)
            .build()
            .map_err(|e| e.to_string())?;
        let executor = Executor::from_arc(store.0.clone());
        let mut layer = IdempotencyLayer::new(executor, |parts| {
            parts
                .extensions
                .get::<TenantName>()
                .map(|t| t.0.clone())
                .ok_or_else(|| Problem::Unauthenticated("no tenant for the request".into()))
        })
        .tool(tool)
        .replay(Replay::VerbatimAllHeaders)
        .body_limit(json_limit(settings.max_request_bytes))
        .classify_with(classify);
        if settings.stale == Stale::InDoubt {
            layer = layer.in_doubt_when_stale();
        }
        let mut drop = vec![idem_http::IDEMPOTENCY_KEY.parse().expect("a header name")];
        drop.extend(tenancy.consumed().iter().cloned());
        let inner = ToUpstream(Arc::new(Hop {
            upstream,
            store: store.0.clone(),
            key_header: settings.downstream_key_header.clone(),
            drop,
            timeout: settings.timeout,
            max_response_bytes: settings.max_response_bytes,
        }));
        Ok(Self {
            service: tower_layer::Layer::layer(&layer, inner),
            tenancy,
            max_request_bytes: settings.max_request_bytes,
        })
    }

    /// Answers a request to a protected method of the route.
    pub(crate) async fn handle(&self, request: Request<Body>) -> Response<Body> {
        let (mut parts, body) = request.into_parts();
        let Some(tenant) = self.tenancy.tenant(&parts.headers) else {
            let mut refused: Response<Body> = Problem::Unauthenticated(
                "send Authorization: Bearer TOKEN with a token this proxy knows".into(),
            )
            .to_response();
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"idem\""),
            );
            return refused;
        };
        let too_large = || {
            Problem::BodyTooLarge {
                limit: self.max_request_bytes,
            }
            .to_response()
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_request_bytes as u64) {
            return too_large();
        }
        let Ok(raw) = axum::body::to_bytes(body, self.max_request_bytes).await else {
            return too_large();
        };
        parts.extensions.insert(TenantName(tenant));
        let json = as_json(&raw);
        parts.extensions.insert(RawBody(raw));
        let request = Request::from_parts(parts, Body::from(json));
        match self.service.clone().call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// The default classification, with 425 (Too Early) retryable too.
fn classify(status: http::StatusCode) -> OutcomeClass {
    match status.as_u16() {
        425 => OutcomeClass::Retryable,
        _ => default_classify(status),
    }
}

/// What [`ToUpstream`] needs.
struct Hop {
    upstream: Upstream,
    store: Arc<dyn KeyStore>,
    key_header: HeaderName,
    drop: Vec<HeaderName>,
    timeout: std::time::Duration,
    max_response_bytes: usize,
}

/// The service the layer wraps: forwards the claimed request with its downstream key, and tells
/// the record what the upstream's silence means.
#[derive(Clone)]
struct ToUpstream(Arc<Hop>);

impl Service<Request<Body>> for ToUpstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let hop = self.0.clone();
        Box::pin(async move {
            let (mut parts, _json) = request.into_parts();
            let raw = parts.extensions.remove::<RawBody>().map(|r| r.0);
            let attempt = parts.extensions.get::<Attempt>().cloned();
            let key = attempt
                .as_ref()
                .map(|a| (&hop.key_header, a.downstream_key(PROVIDER)));
            let outgoing = Outgoing {
                key,
                drop: &hop.drop,
                timeout: hop.timeout,
                max_response_bytes: hop.max_response_bytes,
            };
            let forwarded = hop
                .upstream
                .forward(&parts, raw.unwrap_or_default(), outgoing)
                .await;
            Ok(match (forwarded, attempt) {
                (Forwarded::Answered(response), _) => response,
                (Forwarded::NotSent(response), Some(attempt)) => {
                    // Nothing happened: the claim goes back, and nothing is recorded.
                    let released = hop
                        .store
                        .release(attempt.id(), attempt.token(), attempt.now())
                        .await;
                    if let Err(e) = released {
                        tracing::warn!(error = %e, "the claim could not be released: the key stays in flight until its lease ends, then in doubt");
                    }
                    attempt.mark_recorded();
                    response
                }
                (Forwarded::NoAnswer(response), Some(attempt)) => {
                    // The effect may have happened: the record stays `processing`.
                    attempt.mark_recorded();
                    response
                }
                (Forwarded::NotSent(response) | Forwarded::NoAnswer(response), None) => response,
            })
        })
    }
}
