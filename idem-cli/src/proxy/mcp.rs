//! `idem proxy --mcp`: exactly-once in front of an MCP server that knows nothing of idem, over
//! streamable HTTP (`--upstream http://HOST:PORT/mcp`) or as a stdio child (`-- CMD ARGS…`).
//! The one file of the MCP proxy that speaks idem's types: idem-mcp's [`IdempotentTools`] around
//! an rmcp client of the upstream.
//!
//! At start it connects to the upstream and lists its tools: every tool the upstream does not
//! mark `readOnlyHint` is protected (published as idem-mcp publishes it: `idempotentHint`, its
//! window), the others pass through. A protected `tools/call` is claimed before it is forwarded,
//! with the downstream key in `_meta["io.idem/idempotencyKey"]`; a repeat gets the stored result,
//! replay-marked. An upstream JSON-RPC error is not kept (the next attempt goes again); a call
//! forwarded without an answer (the upstream gone) leaves its record `processing`: its effect may
//! have happened.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use idem_core::{Attempt, Executor, KeySource, OutcomeClass, Policy, StalePolicy, Tool};
use idem_mcp::key::{lift_http_request, lift_lines};
use idem_mcp::{IdempotentTools, Principal, ToolSettings};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ErrorCode, ErrorData, GetTaskParams,
    GetTaskResult, ListToolsResult, PaginatedRequestParams, RequestMetaObject, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{RequestContext, RunningService, ServiceError};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

use super::config::KeySourceName;
use super::pipeline::Store;
use crate::exit::Failure;

/// The `_meta` key the downstream key goes in.
const META_KEY: &str = "io.idem/idempotencyKey";
/// The provider name the downstream key is derived for (as the HTTP proxy's).
const PROVIDER: &str = "idem-proxy";
/// JSON-RPC error code of a call whose first attempt may have taken effect and got no answer
/// (its holder's lease ended): retrying changes nothing until an operator settles the key.
const IN_DOUBT: ErrorCode = ErrorCode(-32094);

/// Where the MCP upstream is.
#[derive(Debug)]
pub(crate) enum McpUpstream {
    /// Streamable HTTP at this URL.
    Http(String),
    /// A stdio child: the command and its arguments.
    Child(Vec<String>),
}

/// `idem proxy --mcp`'s settings.
#[derive(Debug)]
pub(crate) struct McpOptions {
    pub(crate) upstream: McpUpstream,
    pub(crate) addr: SocketAddr,
    /// Callers without X-Tenant-Id share this scope (over stdio: every call's, default `stdio`).
    pub(crate) principal: Option<String>,
    pub(crate) key_source: KeySourceName,
    pub(crate) lease: Duration,
    /// Serve over stdin and stdout (with a child upstream) instead of HTTP.
    pub(crate) stdio: bool,
    /// With it, a client that declares MCP's tasks extension gets a task for a protected tool
    /// (the upstream is called synchronously under the lease), its id sealed with the secret.
    pub(crate) task_secret: Option<[u8; 32]>,
}

#[derive(Clone)]
struct McpProxy {
    upstream: Arc<RunningService<RoleClient, ()>>,
    idem: IdempotentTools,
    info: ServerConfig,
}

/// Runs the MCP proxy until the client (stdio) or Ctrl-C (HTTP) ends it.
pub(crate) async fn run(store: Store, options: McpOptions) -> Result<(), Failure> {
    // reqwest (under rmcp's client too) is built without a default TLS provider: idem-http's.
    idem_http::client::install_crypto_provider();
    let upstream = match &options.upstream {
        McpUpstream::Http(url) => ()
            .serve(StreamableHttpClientTransport::from_uri(url.as_str()))
            .await
            .map_err(|e| Failure::other(format!("cannot reach the MCP upstream {url}: {e}")))?,
        McpUpstream::Child(command) => {
            let (program, args) = command
                .split_first()
                .ok_or_else(|| Failure::usage("--mcp -- CMD: the command is missing"))?;
            let mut child = tokio::process::Command::new(program);
            child.args(args);
            let transport = TokioChildProcess::new(child)
                .map_err(|e| Failure::other(format!("cannot start {program}: {e}")))?;
            ().serve(transport)
                .await
                .map_err(|e| Failure::other(format!("{program} did not start MCP: {e}")))?
        }
    };
    let tools = upstream
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| Failure::other(format!("the upstream's tools/list failed: {e}")))?;
    let peer_info = upstream
        .peer()
        .peer_info()
        .ok_or_else(|| Failure::other("the upstream did not initialize"))?;
    // Its name and instructions; of its capabilities, the tools (what this proxy forwards).
    let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
    if let Some(server) = &peer_info.server_info {
        info = info.with_server_info(server.clone());
    }
    if let Some(instructions) = &peer_info.instructions {
        info = info.with_instructions(instructions.clone());
    }
    let policy = Policy::builder()
        .lease(options.lease)
        .stale(StalePolicy::Reconcile)
        .build()
        .map_err(|e| Failure::usage(e.to_string()))?;
    let executor = Executor::from_arc(store.handle());
    let mut idem = IdempotentTools::new(executor);
    let key_source = match options.key_source {
        KeySourceName::Refuse => KeySource::Refuse,
        KeySourceName::Arguments => KeySource::arguments(),
        KeySourceName::Unprotected => KeySource::Unprotected,
    };
    for tool in &tools {
        let read_only = tool.annotations.as_ref().and_then(|a| a.read_only_hint);
        if read_only != Some(true) {
            let settings = Tool::builder()
                .policy(policy)
                .processing_window(options.lease.min(Duration::from_secs(5)))
                .max_wait(options.lease)
                .key_source(key_source.clone())
                .tasks(options.task_secret.is_some())
                .build()
                .map_err(Failure::usage)?;
            let settings = ToolSettings::new(settings).tool_error(OutcomeClass::Definitive);
            idem = idem.tool(tool.name.to_string(), settings);
        }
    }
    let anonymous = match options.stdio {
        true => Some(options.principal.unwrap_or_else(|| "stdio".into())),
        false => options.principal,
    };
    if let Some(principal) = anonymous {
        idem = idem.allow_anonymous(principal);
    }
    if let Some(secret) = options.task_secret {
        idem = idem.tasks(secret);
    }
    let proxy = McpProxy {
        upstream: Arc::new(upstream),
        idem,
        info,
    };
    if options.stdio {
        let transport = (lift_lines(tokio::io::stdin()), tokio::io::stdout());
        let served = proxy.serve(transport).await.map_err(Failure::other)?;
        served.waiting().await.map_err(Failure::other)?;
        return Ok(());
    }
    // Stateless (MCP 2026-07-28: no sessions), so any proxy on the store answers any request.
    tracing::warn!(
        "X-Tenant-Id is trusted AS SENT, unauthenticated: anyone who reaches this proxy can act as any tenant and replay its answers. Run it behind an authenticating proxy that sets the header"
    );
    let mut config = StreamableHttpServerConfig::default().with_legacy_session_mode(false);
    let mut hosts = config.allowed_hosts.clone();
    if !options.addr.ip().is_unspecified() {
        hosts.push(options.addr.ip().to_string());
    }
    config = config.with_allowed_hosts(hosts);
    let service: StreamableHttpService<McpProxy, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(proxy.clone()), Arc::default(), config);
    let app = axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::map_request(lift_http_request))
        .layer(axum::middleware::from_fn(tenant));
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|e| Failure::other(format!("cannot listen on {}: {e}", options.addr)))?;
    let addr = listener.local_addr().map_err(Failure::other)?;
    println!("listening on http://{addr}/mcp");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(Failure::other)
}

/// The caller's principal: the `X-Tenant-Id` header as sent.
async fn tenant(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    if let Some(tenant) = tenant {
        request.extensions_mut().insert(Principal(tenant));
    }
    next.run(request).await
}

impl ServerHandler for McpProxy {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(self.info.clone())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut listed = self
            .upstream
            .peer()
            .list_tools(request)
            .await
            .map_err(|e| upstream_failed(&e))?;
        listed.tools = self.idem.describe(listed.tools);
        Ok(listed)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let peer = self.upstream.peer().clone();
        self.idem
            .call(params, context, move |mut params, context| async move {
                let attempt = context.extensions.get::<Attempt>().cloned();
                if let Some(attempt) = &attempt {
                    let mut meta = params.meta.take().unwrap_or_else(RequestMetaObject::new);
                    meta.0.0.insert(
                        META_KEY.to_owned(),
                        Value::String(attempt.downstream_key(PROVIDER)),
                    );
                    params.meta = Some(meta);
                }
                match peer.call_tool_once(params).await {
                    Ok(response) => Ok(response),
                    Err(ServiceError::McpError(error)) => Err(error),
                    Err(e) => {
                        // Sent, no answer: the effect may have happened.
                        if let Some(attempt) = attempt {
                            attempt.mark_recorded();
                        }
                        Err(ErrorData::internal_error(
                            "the upstream gave no answer: the call's effect may have happened",
                            Some(json!({"io.idem/mayHaveHappened": true, "cause": e.to_string()})),
                        ))
                    }
                }
            })
            .await
            .map_err(in_doubt)
    }

    async fn get_task(
        &self,
        params: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.idem.get_task(params, context).await
    }

    async fn cancel_task(
        &self,
        params: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.idem.cancel_task(params, context).await
    }
}

/// idem-mcp's answer to a call whose record is stale (in flight past its holder's lease) as the
/// in-doubt error: the proxy cannot see the effect and nobody reconciles it.
fn in_doubt(error: ErrorData) -> ErrorData {
    let stale = error
        .data
        .as_ref()
        .is_some_and(|d| d["type"] == "urn:idem:problem:in-flight" && d["stale"] == true);
    if !stale {
        return error;
    }
    ErrorData::new(
        IN_DOUBT,
        "the first call with this idempotency key was forwarded and never answered: its effect may have happened; it will not run again until an operator settles the key (idem keys resolve or release)",
        Some(json!({"type": "urn:idem:problem:in-doubt", "io.idem/inDoubt": true})),
    )
}

fn upstream_failed(e: &ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(error) => error.clone(),
        other => ErrorData::internal_error(format!("the upstream failed: {other}"), None),
    }
}
