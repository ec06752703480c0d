//! `idem proxy`: exactly-once in front of an HTTP tool server that knows nothing of idem.
//!
//! Requests to a protected method of a route (by default POST, PUT, PATCH and DELETE on every
//! path; [`config`] for routes) are claimed in the store before they are forwarded, and every
//! repeat gets the upstream's first answer verbatim; everything else passes through untouched and
//! unrecorded. [`pipeline`] holds every use of idem's types; [`forward`] talks to the upstream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use idemkit::StoreUrl;

mod body;
mod config;
mod forward;
mod mcp;
mod pipeline;
mod tenant;

pub(crate) use config::KeySourceName;
use config::{Config, Route, RouteSettings};
use forward::{Forwarded, Outgoing, Upstream, problem};
use pipeline::Protected;
use tenant::Tenancy;

use crate::exit::Failure;

/// `idem proxy`'s command line.
#[derive(Debug)]
pub(crate) struct ProxyOptions {
    pub(crate) upstream: Option<String>,
    pub(crate) mcp: bool,
    pub(crate) principal: Option<String>,
    pub(crate) command: Vec<String>,
    pub(crate) task_secret: Option<[u8; 32]>,
    pub(crate) addr: SocketAddr,
    pub(crate) config: Option<PathBuf>,
    pub(crate) key_source: KeySourceName,
    pub(crate) tokens: Option<PathBuf>,
    pub(crate) lease: Option<Duration>,
}

/// The routes, each with its protected service (none when it protects no method).
struct Proxy {
    routes: Vec<(Route, Option<Protected>)>,
    upstream: Upstream,
}

/// Runs the proxy until Ctrl-C. The first line on stdout is `listening on http://ADDR`.
pub(crate) async fn run(store: StoreUrl, options: ProxyOptions) -> Result<(), Failure> {
    if options.mcp {
        return run_mcp(store, options).await;
    }
    let upstream_url = options
        .upstream
        .clone()
        .ok_or_else(|| Failure::usage("--upstream URL is required without --mcp"))?;
    let mut defaults = RouteSettings {
        key_source: options.key_source,
        ..RouteSettings::default()
    };
    if let Some(lease) = options.lease {
        defaults.lease = lease;
        defaults.max_wait = lease;
    }
    config::check(&defaults).map_err(|why| Failure::usage(format!("--lease: {why}")))?;
    let config = match &options.config {
        Some(path) => Config::load(path, defaults).map_err(Failure::usage)?,
        None => Config::with_defaults(defaults),
    };
    let upstream = Upstream::new(&upstream_url).map_err(Failure::usage)?;
    let tokens = match &options.tokens {
        Some(path) => Some(Arc::new(
            crate::tokens::Tokens::load(path).map_err(Failure::usage)?,
        )),
        None => {
            tracing::warn!(
                "X-Tenant-Id is trusted AS SENT, unauthenticated: anyone who reaches this proxy can act as any tenant and replay its answers. Run it behind an authenticating proxy that sets the header, or give --tokens FILE"
            );
            None
        }
    };
    let tenancy = Tenancy::new(tokens);
    let store_handle = pipeline::open_store(&store).await?;
    let mut routes = Vec::with_capacity(config.routes.len());
    for route in config.routes {
        let protected = match route.methods.is_empty() {
            true => None,
            false => Some(
                Protected::new(
                    &store_handle,
                    &route.settings,
                    upstream.clone(),
                    tenancy.clone(),
                )
                .map_err(Failure::usage)?,
            ),
        };
        routes.push((route, protected));
    }
    let proxy = Arc::new(Proxy { routes, upstream });
    let app = Router::new().fallback(dispatch).with_state(proxy);
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| Failure::other(format!("cannot listen on {}: {e}", options.addr)))?;
    let addr = listener.local_addr().map_err(Failure::other)?;
    eprintln!("idem: proxying http://{addr} to {upstream_url} with records on {store}");
    // The first line on stdout: scripts and tests read the address from it.
    println!("listening on http://{addr}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(Failure::other)
}

/// `idem proxy --mcp`.
async fn run_mcp(store: StoreUrl, options: ProxyOptions) -> Result<(), Failure> {
    if options.config.is_some() || options.tokens.is_some() {
        return Err(Failure::usage(
            "--config and --tokens are for the HTTP proxy; --mcp takes --principal",
        ));
    }
    let stdio = !options.command.is_empty();
    let upstream = match options.upstream {
        Some(url) => mcp::McpUpstream::Http(url),
        None => mcp::McpUpstream::Child(options.command),
    };
    let lease = options.lease.unwrap_or(RouteSettings::default().lease);
    let store = pipeline::open_store(&store).await?;
    let options = mcp::McpOptions {
        upstream,
        addr: options.addr,
        principal: options.principal,
        key_source: options.key_source,
        lease,
        stdio,
        task_secret: options.task_secret,
    };
    mcp::run(store, options).await
}

/// Sends a request to its route: protected, or straight through.
async fn dispatch(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let path = request.uri().path();
    let (route, protected) = proxy
        .routes
        .iter()
        .find(|(route, _)| route.matches(path))
        .unwrap_or_else(|| proxy.routes.last().expect("the catch-all route"));
    match protected {
        Some(protected) if route.protects(request.method()) => protected.handle(request).await,
        _ => pass_through(&proxy.upstream, &route.settings, request).await,
    }
}

/// An unprotected request: forwarded as it came, its answer given back as it came.
async fn pass_through(upstream: &Upstream, settings: &RouteSettings, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, settings.max_request_bytes).await else {
        return problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            &format!(
                "the request body is over the limit of {} bytes",
                settings.max_request_bytes
            ),
        );
    };
    let outgoing = Outgoing {
        key: None,
        drop: &[],
        timeout: settings.timeout,
        max_response_bytes: settings.max_response_bytes,
    };
    match upstream.forward(&parts, body, outgoing).await {
        Forwarded::Answered(response)
        | Forwarded::NotSent(response)
        | Forwarded::NoAnswer(response) => response,
    }
}
