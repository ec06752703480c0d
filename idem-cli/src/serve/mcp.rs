//! `idem serve --mcp`: the reference tool `create_ticket` as an MCP server, over streamable HTTP
//! at `/mcp` or over stdio, on every store the HTTP tool runs on.
//!
//! The tool is the HTTP tool's: the same arguments (`title`, `account_id`), the same tickets
//! next to the records ([`Backend`]), each completed in its ticket's own transaction where the
//! engine allows (SQLite, PostgreSQL; on Redis the reconciler settles what a crash leaves).
//! Only the transport differs: [`IdempotentTools`] makes the tool exactly-once per key, and
//! [`TicketServer::new`] is the one place it is set up. Processes on one store share the
//! records and the tickets, so a retry may reach any of them.
//!
//! Who is asking: over streamable HTTP the principal is the `x-tenant-id` header **as sent,
//! unauthenticated** (as the HTTP tool's tenant), or with tokens the tenant of the
//! `Authorization: Bearer` token (else 401, nothing runs). A call without a principal is refused
//! (`-32093`, nothing runs) unless [`McpOptions::principal`] opts every such caller into one
//! shared scope. Over stdio (one client per process) the server always opts in: as
//! [`McpOptions::principal`], else `stdio`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use idem_core::{Attempt, Executor, OutcomeClass};
use idem_mcp::key::{lift_http_request, lift_lines};
use idem_mcp::server::default_principal;
use idem_mcp::{IdempotentTools, Principal, ToolSettings};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use super::auth::{bearer_tenant, header_tenant, unauthenticated};
use super::tickets::{Answer, Backend, Created, NewTicket};
use super::{BoxError, ServeOptions, input_schema, policy, start_reconciler};
use crate::tokens::Tokens;

/// The one tool.
const TOOL: &str = "create_ticket";

/// How the MCP tool is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpTransport {
    /// Streamable HTTP without sessions, as MCP 2026-07-28 serves every request: no
    /// `Mcp-Session-Id`, so any process on the store can answer any request.
    Stateless,
    /// Streamable HTTP with sessions (`Mcp-Session-Id`) for the protocol revisions before
    /// 2026-07-28; a session lives in the process that opened it.
    Stateful,
    /// stdin and stdout: one client per process.
    Stdio,
}

/// The MCP server's settings, besides the [`ServeOptions`] it shares with the HTTP tool.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// How the tool is reached.
    pub transport: McpTransport,
    /// The principal of callers that name none: one scope they all share (see the module docs).
    pub principal: Option<String>,
    /// Whether a call under a derived key that finds the same call in flight waits for its
    /// result (`ToolBuilder::derived_key_wait`); if not, it is told to retry (`-32091`).
    pub derived_key_wait: bool,
    /// `Host` values the streamable HTTP endpoint accepts besides rmcp's defaults (`localhost`,
    /// `127.0.0.1`, `::1`: its protection against DNS rebinding) and the address it listens on.
    pub allowed_hosts: Vec<String>,
    /// The secret task ids are sealed with, when the tool answers clients that declared MCP's
    /// tasks extension with a task ([`IdempotentTools::tasks`]); every server on the store
    /// needs the same one.
    pub task_secret: Option<[u8; 32]>,
}

/// The MCP server of the reference tool: `create_ticket` behind [`IdempotentTools`].
#[derive(Clone)]
pub struct TicketServer {
    idem: IdempotentTools,
    backend: Backend,
    options: Arc<ServeOptions>,
    /// The principal of a call that names none, where the server opted into one.
    anonymous: Option<String>,
    /// The tool's answer for a new ticket, as the record keeps it.
    answer: Answer,
}

impl std::fmt::Debug for TicketServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketServer")
            .field("idem", &self.idem)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl TicketServer {
    /// The server on `backend`: here the tool's protection is set up (its settings, the
    /// executor's policy, the shared scope). Starts the reconciler where the backend needs one,
    /// so it runs inside a tokio runtime.
    pub fn new(
        backend: Backend,
        options: ServeOptions,
        mcp: &McpOptions,
    ) -> Result<Self, BoxError> {
        let policy = policy(&backend, &options)?;
        start_reconciler(&backend, &options, policy);
        let executor = Executor::from_arc(backend.store()).with_clock(options.clock.clone());
        let tool = super::tool(policy, &options)?
            .to_builder()
            .derived_key_wait(mcp.derived_key_wait)
            .tasks(mcp.task_secret.is_some())
            .build()?;
        let settings = ToolSettings::new(tool)
            .tool_error(OutcomeClass::Definitive)
            .destructive(false);
        let mut idem = IdempotentTools::new(executor)
            .store_write(options.contract().store_write())
            .tool(TOOL, settings);
        if let Some(secret) = mcp.task_secret {
            idem = idem.tasks(secret);
        }
        // Callers without a principal share one scope only by choice: always on stdio (one
        // client per process, nobody to share with), on HTTP only with a principal given.
        let anonymous = match mcp.transport {
            McpTransport::Stdio => Some(mcp.principal.clone().unwrap_or_else(|| "stdio".into())),
            McpTransport::Stateless | McpTransport::Stateful => mcp.principal.clone(),
        };
        if let Some(principal) = &anonymous {
            idem = idem.allow_anonymous(principal.clone());
        }
        let answer: Answer = {
            let idem = idem.clone();
            Arc::new(move |ticket, id| idem.outcome_for(TOOL, &result(ticket, id)))
        };
        Ok(Self {
            idem,
            backend,
            options: Arc::new(options),
            anonymous,
            answer,
        })
    }

    /// The tool as `tools/list` shows it, before [`IdempotentTools::describe`] adds its contract.
    fn tool() -> Tool {
        Tool::new(
            TOOL,
            "Creates a support ticket for an account and returns its id.",
            input_schema(),
        )
    }

    /// The tool itself, under the call's [`Attempt`] (none: a call without a key under
    /// `--key-source unprotected`): checks the arguments, works the tool latency, then creates
    /// the ticket, completing the record in the ticket's own transaction where the engine
    /// allows.
    async fn create_ticket(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if params.name != TOOL {
            return Err(ErrorData::invalid_params(
                format!("no tool named {:?}", params.name),
                None,
            ));
        }
        let field = |name: &str| {
            params
                .arguments
                .as_ref()
                .and_then(|a| a.get(name))
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
        };
        let (Some(title), Some(account_id)) = (field("title"), field("account_id")) else {
            // A definitive business answer: recorded and replayed like a success.
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "title and account_id are required, non-empty strings",
            )])
            .into());
        };
        // `IdempotentTools` refuses a call without one before the tool runs.
        let Some(tenant) = default_principal(&context).or_else(|| self.anonymous.clone()) else {
            return Err(ErrorData::internal_error("the call has no principal", None));
        };
        if !self.options.tool_latency.is_zero() {
            tokio::time::sleep(self.options.tool_latency).await;
        }
        let ticket = NewTicket::new(tenant, title, account_id, self.options.clock.now());
        let not_created = |e: &dyn std::fmt::Display| {
            tracing::error!(error = %e, "ticket not created");
            ErrorData::internal_error(
                "the ticket could not be stored; no ticket was created",
                None,
            )
        };
        let Some(attempt) = context.extensions.get::<Attempt>().cloned() else {
            let id = self.backend.tickets.insert("", &ticket).await;
            return id
                .map(|id| result(&ticket, id).into())
                .map_err(|e| not_created(&e));
        };
        let created = self
            .backend
            .tickets
            .create(&attempt, ticket.clone(), self.answer.clone())
            .await;
        match created {
            Ok(Created::Ticket { id, recorded, .. }) => {
                if recorded {
                    attempt.mark_recorded(); // committed with the ticket: not to be completed again
                }
                Ok(result(&ticket, id).into())
            }
            Ok(Created::Fenced) => Err(ErrorData::internal_error(
                "this attempt lost its claim to a newer one; no ticket was created",
                None,
            )),
            Err(e) => Err(not_created(&e)),
        }
    }
}

/// The tool's result for `ticket` with `id`: `ticket_id` and `created_at`, as structured content.
fn result(ticket: &NewTicket, id: i64) -> CallToolResult {
    CallToolResult::structured(ticket.body(id))
}

impl ServerHandler for TicketServer {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
                .with_server_info(Implementation::new("idem", env!("CARGO_PKG_VERSION")))
                .with_instructions("Creates support tickets, once per idempotency key."),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.idem.describe(vec![Self::tool()]),
        ))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let server = self.clone();
        self.idem
            .call(params, context, move |params, context| async move {
                server.create_ticket(params, context).await
            })
            .await
    }

    async fn get_task(
        &self,
        params: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.idem.get_task(params, context).await
    }

    async fn cancel_task(
        &self,
        params: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.idem.cancel_task(params, context).await
    }
}

/// The streamable HTTP app: the MCP endpoint at `/mcp`, `params.idempotencyKey` lifted before
/// rmcp reads the body, and each request's [`Principal`] from its token
/// ([`ServeOptions::tokens`]) or `x-tenant-id`. `at` is the address it listens on, accepted as
/// a `Host` besides rmcp's defaults and [`McpOptions::allowed_hosts`].
pub fn mcp_router(
    server: TicketServer,
    mcp: &McpOptions,
    at: std::net::SocketAddr,
) -> axum::Router {
    let tokens = server.options.tokens.clone();
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(mcp.transport == McpTransport::Stateful);
    let mut hosts = config.allowed_hosts.clone();
    if !at.ip().is_unspecified() {
        hosts.push(at.ip().to_string());
    }
    hosts.extend(mcp.allowed_hosts.iter().cloned());
    config = config.with_allowed_hosts(hosts);
    let service: StreamableHttpService<TicketServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::default(), config);
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::map_request(lift_http_request))
        .layer(axum::middleware::from_fn_with_state(tokens, principal))
}

/// Serves `server` on stdin and stdout (`params.idempotencyKey` lifted from each line) until
/// the client closes stdin.
pub async fn serve_stdio(server: TicketServer) -> Result<(), BoxError> {
    let transport = (lift_lines(tokio::io::stdin()), tokio::io::stdout());
    server.serve(transport).await?.waiting().await?;
    Ok(())
}

/// Puts the caller's [`Principal`] in the HTTP request, where [`IdempotentTools`] looks for it:
/// with tokens, the tenant of the bearer token (else 401, and the request goes no further);
/// without, the `x-tenant-id` header as sent, if there is one.
async fn principal(
    State(tokens): State<Option<Arc<Tokens>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let principal = match &tokens {
        Some(tokens) => match bearer_tenant(tokens, request.headers()) {
            Some(tenant) => Some(tenant),
            None => return unauthenticated(),
        },
        None => header_tenant(request.headers()).map(str::to_owned),
    };
    if let Some(principal) = principal {
        request.extensions_mut().insert(Principal(principal));
    }
    next.run(request).await
}
