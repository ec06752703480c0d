//! `idem-mcp-ticket-server`: an example MCP server with one side-effecting tool,
//! `create_ticket` (`title`, `account_id`), made exactly-once by [`IdempotentTools`].
//!
//! ```text
//! idem-mcp-ticket-server [--db PATH] [--http ADDR] [--latency-ms N] [--principal NAME]
//!                        [--key-source client|arguments|model-argument|request|unprotected]
//!                        [--no-derived-key-wait] [--stateless]
//! ```
//!
//! - Without `--http`: MCP over stdio (`params.idempotencyKey` lifted with `key::lift_lines`).
//!   The process serves exactly one client, so it opts into one shared scope explicitly
//!   ([`IdempotentTools::allow_anonymous`]) under the principal `--principal NAME` (default
//!   `stdio`).
//! - With `--http ADDR` (e.g. `127.0.0.1:8788`, port 0 picks one): streamable HTTP at
//!   `http://ADDR/mcp`; the first line on stdout is `listening on http://ADDR/mcp`. The header
//!   `x-tenant-id` names the principal: a stand-in for real authentication, which would insert
//!   the [`Principal`] itself. A call without it is refused (`-32093`, nothing runs), unless
//!   `--principal NAME` opts into one scope shared by every such caller.
//! - `--db PATH` (default `idem-mcp-tickets.sqlite3`): one SQLite file holds the idem records
//!   and the `tickets` table; each ticket row and its record's completion commit in one
//!   transaction, so a ticket exists if and only if its record is completed.
//! - `--latency-ms N`: the tool works N ms before creating the ticket (real latency, for tests
//!   of client timeouts).
//! - `--key-source` (contract §5.1): what a call without a key gets. `client` (the default): it
//!   is refused, the client must send the key; `arguments`: the key is derived from `title` and
//!   `account_id`; `model-argument`: the tool asks the model for an `idempotency_key` argument;
//!   `request`: the key is the session and JSON-RPC request id (transport resends only);
//!   `unprotected`: the call runs without protection. A derived key's window is one hour.
//! - `--no-derived-key-wait`: a call under a derived key that finds the same call in flight is
//!   told to retry (`-32091`) instead of being waited for (`ToolSettings::derived_key_wait`).
//! - `--stateless`: streamable HTTP without sessions (no `Mcp-Session-Id`), as MCP 2026-07-28
//!   serves every request; `--key-source request` then refuses calls without a key.

use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::CompleteAnswer;
use idem_core::{Attempt, KeySource, OutcomeClass, Policy, StalePolicy, StoreError, ToolContract};
use idem_mcp::key::{lift_http_request, lift_lines};
use idem_mcp::{IdempotentTools, Principal, ToolSettings};
use idem_store_sqlite::SqliteStore;
use idem_store_sqlite::rusqlite::{TransactionBehavior, params};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt, schemars, tool, tool_router};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The tenant header the HTTP transport reads (a stand-in for authentication).
const TENANT_HEADER: &str = "x-tenant-id";

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct NewTicket {
    /// What the ticket is about.
    title: String,
    /// The customer account the ticket belongs to.
    account_id: String,
}

#[derive(Clone)]
struct TicketServer {
    tool_router: ToolRouter<Self>,
    idem: IdempotentTools,
    store: SqliteStore,
    latency: Duration,
}

#[tool_router]
impl TicketServer {
    #[tool(description = "Creates a support ticket for an account and returns its id.")]
    async fn create_ticket(
        &self,
        Parameters(ticket): Parameters<NewTicket>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if ticket.title.trim().is_empty() || ticket.account_id.trim().is_empty() {
            // A definitive business answer: recorded and replayed like a success.
            return Ok(CallToolResult::error(vec![Content::text(
                "title and account_id must be non-empty",
            )]));
        }
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        // No claim: a call without a key under `--key-source unprotected`.
        let attempt = context.extensions.get::<Attempt>().cloned();
        match self.insert_and_complete(attempt.as_ref(), ticket).await {
            Ok(Some(result)) => {
                if let Some(attempt) = attempt {
                    attempt.mark_recorded(); // committed with the ticket: not to be completed again
                }
                Ok(result)
            }
            Ok(None) => Err(ErrorData::internal_error(
                "this attempt lost its claim to a newer one; no ticket was created",
                None,
            )),
            Err(e) => {
                tracing::error!(error = %e, "ticket not created");
                Err(ErrorData::internal_error(
                    "the ticket could not be stored; no ticket was created",
                    None,
                ))
            }
        }
    }
}

impl TicketServer {
    /// Inserts the ticket and completes the record (if the call has one) in one transaction;
    /// `None` if fenced (rolled back: no ticket).
    async fn insert_and_complete(
        &self,
        attempt: Option<&Attempt>,
        ticket: NewTicket,
    ) -> Result<Option<CallToolResult>, StoreError> {
        let (store, idem) = (self.store.clone(), self.idem.clone());
        let attempt = attempt.cloned();
        self.store
            .with_connection(move |conn| {
                let db = |e| StoreError::backend("sqlite: tickets", e);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(db)?;
                let (scope, key) = match &attempt {
                    Some(a) => (a.scope().as_str(), a.key().as_str()),
                    None => ("", ""),
                };
                tx.execute(
                    "INSERT INTO tickets (tenant_scope, title, account_id, idempotency_key) VALUES (?1, ?2, ?3, ?4)",
                    params![scope, ticket.title, ticket.account_id, key],
                )
                .map_err(db)?;
                let id = format!("T-{:06}", tx.last_insert_rowid());
                let result = CallToolResult::structured(json!({"ticket_id": id}));
                if let Some(attempt) = &attempt {
                    let outcome = idem.outcome_for("create_ticket", &result);
                    let answer = store.complete_in(&tx, attempt, &outcome)?;
                    if answer == CompleteAnswer::Fenced {
                        return Ok(None); // dropped: rolled back
                    }
                }
                tx.commit().map_err(db)?;
                Ok(Some(result))
            })
            .await?
    }
}

impl ServerHandler for TicketServer {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
                .with_server_info(Implementation::new(
                    "idem-mcp-ticket-server",
                    env!("CARGO_PKG_VERSION"),
                ))
                .with_instructions("Creates support tickets, once per idempotency key."),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(self.idem.list_routed(&self.tool_router))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.idem
            .call_routed(self, &self.tool_router, params, context)
            .await
    }
}

struct Args {
    db: String,
    http: Option<String>,
    latency: Duration,
    principal: Option<String>,
    key_source: KeySource,
    derived_key_wait: bool,
    stateless: bool,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        db: "idem-mcp-tickets.sqlite3".into(),
        http: None,
        latency: Duration::ZERO,
        principal: None,
        key_source: KeySource::Refuse,
        derived_key_wait: true,
        stateless: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--db" => args.db = value()?,
            "--http" => args.http = Some(value()?),
            "--latency-ms" => args.latency = Duration::from_millis(value()?.parse()?),
            "--principal" => args.principal = Some(value()?),
            "--no-derived-key-wait" => args.derived_key_wait = false,
            "--stateless" => args.stateless = true,
            "--key-source" => {
                args.key_source = match value()?.as_str() {
                    "client" => KeySource::Refuse,
                    "arguments" => KeySource::arguments_at(["/title", "/account_id"]),
                    "model-argument" => KeySource::model_argument(),
                    "request" => KeySource::Request,
                    "unprotected" => KeySource::Unprotected,
                    other => return Err(format!("unknown key source {other}: client, arguments, model-argument, request or unprotected").into()),
                }
            }
            "-h" | "--help" => {
                println!(
                    "idem-mcp-ticket-server [--db PATH] [--http ADDR] [--latency-ms N] [--principal NAME] [--key-source client|arguments|model-argument|request|unprotected] [--no-derived-key-wait] [--stateless]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Logs go to stderr: on stdio, stdout is the protocol.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,rmcp::service=error".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: never in a file or a pipe, never with NO_COLOR.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let args = parse_args()?;

    let store = SqliteStore::open(&args.db)?;
    store.migrate()?;
    store
        .with_connection(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS tickets (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    tenant_scope TEXT NOT NULL,
                    title TEXT NOT NULL,
                    account_id TEXT NOT NULL,
                    idempotency_key TEXT NOT NULL)",
            )
        })
        .await??;

    // The tool's processing window is its latency plus a second of margin; the store write
    // budget is the default.
    let contract = ToolContract::new(args.latency + Duration::from_secs(1));
    // Takeover is safe here, and only because the ticket and the completion commit together: a
    // record still `processing` after its lease means its holder never committed, so no ticket
    // exists, and a late holder is fenced inside its own transaction (which then rolls back).
    let policy = Policy::builder()
        .lease(contract.min_client_deadline())
        .stale(StalePolicy::Takeover)
        .build()?;
    let mut idem = IdempotentTools::with_store(store.clone(), policy)
        .store_write(contract.store_write())
        .tool(
            "create_ticket",
            ToolSettings::window(contract.processing_window())
                .tool_error(OutcomeClass::Definitive)
                .destructive(false)
                .key_source(args.key_source)
                .derived_key_wait(args.derived_key_wait),
        );
    // Requests without a principal are refused unless we opt into one shared scope: always on
    // stdio (one client per process, nobody to share with), on HTTP only with `--principal`.
    match (&args.http, args.principal) {
        (None, principal) => {
            idem = idem.allow_anonymous(principal.unwrap_or_else(|| "stdio".to_owned()));
        }
        (Some(_), Some(principal)) => {
            tracing::warn!(
                %principal,
                "callers without x-tenant-id share one idempotency scope (--principal)"
            );
            idem = idem.allow_anonymous(principal);
        }
        (Some(_), None) => {}
    }
    let server = TicketServer {
        tool_router: TicketServer::tool_router(),
        idem,
        store,
        latency: args.latency,
    };

    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(!args.stateless);
    match args.http {
        None => {
            let transport = (lift_lines(tokio::io::stdin()), tokio::io::stdout());
            server.serve(transport).await?.waiting().await?;
        }
        Some(addr) => {
            let service: StreamableHttpService<TicketServer, LocalSessionManager> =
                StreamableHttpService::new(move || Ok(server.clone()), Arc::default(), config);
            let app = axum::Router::new()
                .route_service("/mcp", service)
                .layer(axum::middleware::map_request(lift_http_request))
                .layer(axum::middleware::map_request(tenant_as_principal));
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("listening on http://{}/mcp", listener.local_addr()?);
            axum::serve(listener, app).await?;
        }
    }
    Ok(())
}

/// Takes the principal from `x-tenant-id`: a stand-in for an authentication layer.
async fn tenant_as_principal(mut request: axum::extract::Request) -> axum::extract::Request {
    let tenant = request
        .headers()
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    if let Some(tenant) = tenant {
        request.extensions_mut().insert(Principal(tenant));
    }
    request
}
