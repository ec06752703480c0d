//! `idem serve`: the reference tool server.
//!
//! One tool, `POST /tools/create_ticket` (`title`, `account_id` required), behind the
//! [`IdempotencyLayer`]. Each ticket is a row of the table `tickets` in the same database as the
//! records, written in the same transaction as the record's completion: a ticket exists if and
//! only if its record is completed. `GET /tools` describes the tool, with its processing window and
//! the minimum client retry deadline.
//!
//! Who is asking: without tokens ([`ServeOptions::tokens`]) the tenant is the `X-Tenant-Id`
//! header **as sent, unauthenticated**: anyone who can reach the server can act as any tenant and
//! replay its answers, so the header must come from an authenticating proxy in front. With
//! tokens (`--tokens FILE`, see [`crate::tokens`]) a request to the tool must carry
//! `Authorization: Bearer TOKEN` (else 401 `application/problem+json`, nothing runs) and its
//! tenant is the token's; `X-Tenant-Id` is ignored. `GET /tools` (a description) stays open.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::contract::{ListedTool, ToolListing};
use idem_core::reconcile::Reconciler;
use idem_core::{Clock, Executor, KeySource, Policy, SystemClock, Tool, ToolContract, ToolError};
use idem_http::{IdempotencyLayer, Problem};
use serde_json::json;

use crate::tokens::Tokens;

mod auth;
pub(crate) mod command;
mod handlers;
mod mcp;
mod metrics;
mod tickets;

pub use mcp::{McpOptions, McpTransport, TicketServer, mcp_router, serve_stdio};
pub use metrics::{install_metrics, metrics_router};
pub use tickets::{Backend, Tickets};

use auth::{Tenant, authenticate};
use handlers::{create_ticket, create_ticket_unprotected};
use tickets::BoxedProbe;

/// A boxed error for the binary's setup paths.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The header naming the tenant (default `public`).
pub const TENANT_HEADER: &str = "x-tenant-id";

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long the tool works before answering (to give it real processing time).
    pub tool_latency: Duration,
    /// The clock (the system clock; tests pass a manual one).
    pub clock: Arc<dyn Clock>,
    /// Honour the demo's fault header ([`DEMO_FAULT_HEADER`]); never on in `idem serve`.
    pub demo_faults: bool,
    /// Bearer tokens mapped to tenants; `None` trusts `X-Tenant-Id` as sent (see the module
    /// docs).
    pub tokens: Option<Arc<Tokens>>,
    /// What a request without `Idempotency-Key` gets ([contract
    /// §5.1](idem_core::contract#keyless)): refused (the default), a key derived from `title` and
    /// `account_id`, or no protection.
    pub key_source: KeySource,
    /// For tests: the tool takes a permit of this semaphore before it works, so a test keeps a
    /// call in flight until it adds one. `None` (always in `idem serve`): it never waits.
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

/// The task secret in `path` (`--task-secret-file`): 64 hexadecimal digits, surrounding
/// whitespace ignored. A file that cannot be read or holds anything else is a usage error that
/// names the file, never the secret.
pub fn read_task_secret(path: &std::path::Path) -> Result<[u8; 32], crate::exit::Failure> {
    let fail = |why: &str| {
        crate::exit::Failure::usage(format!("--task-secret-file {}: {why}", path.display()))
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(&e.to_string()))?;
    let hex = text.trim();
    let mut secret = [0u8; 32];
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(fail("must hold 64 hexadecimal digits (32 bytes)"));
    }
    for (byte, pair) in secret.iter_mut().zip(hex.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| fail("not text"))?;
        *byte = u8::from_str_radix(pair, 16)
            .map_err(|_| fail("must hold 64 hexadecimal digits (32 bytes)"))?;
    }
    Ok(secret)
}

/// Parses `idem serve --key-source`: `client` (a request without a key is refused: the client
/// must send one), `arguments` (the key is derived from `title` and `account_id`; the same
/// ticket within an hour is one ticket), `unprotected` (runs every time), and for `--mcp` only
/// (see [`mcp_only`]) `model-argument` (the tool asks the model for an `idempotency_key`
/// argument) and `request` (the session and JSON-RPC request id: transport resends only).
pub fn parse_key_source(name: &str) -> Result<KeySource, String> {
    match name {
        "client" => Ok(KeySource::Refuse),
        "arguments" => Ok(KeySource::arguments_at(["/title", "/account_id"])),
        "unprotected" => Ok(KeySource::Unprotected),
        "model-argument" => Ok(KeySource::model_argument()),
        "request" => Ok(KeySource::Request),
        other => Err(format!(
            "unknown key source {other:?}: client, arguments, unprotected, and with --mcp \
             model-argument or request"
        )),
    }
}

/// Whether `source` is one only the MCP tool offers (`idem serve --mcp`): the HTTP tool
/// publishes no model argument and HTTP has no request id.
pub fn mcp_only(source: &KeySource) -> bool {
    matches!(source, KeySource::ModelArgument(_) | KeySource::Request)
}

/// With [`ServeOptions::demo_faults`], a request with `x-idem-demo-fault: hang` makes the first
/// attempt of its key hang before its effect, as a holder that crashed mid-flight.
pub const DEMO_FAULT_HEADER: &str = "x-idem-demo-fault";

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tool_latency: Duration::ZERO,
            clock: Arc::new(SystemClock),
            demo_faults: false,
            tokens: None,
            key_source: KeySource::Refuse,
            hold: None,
        }
    }
}

impl ServeOptions {
    /// The tool's contract: its published processing window (its latency plus one second of
    /// margin) and the default store write budget.
    pub fn contract(&self) -> ToolContract {
        let contract = ToolContract::new(self.tool_latency + Duration::from_secs(1));
        // A repeat may wait as long as a claim's lease (the minimum client retry deadline).
        contract.with_max_wait(contract.min_client_deadline())
    }

    /// The tool's published processing window.
    pub fn processing_window(&self) -> Duration {
        self.contract().processing_window()
    }

    /// The minimum client retry deadline: processing window + store write ([contract
    /// §5](idem_core::contract#http)). Also the lease of a claim.
    pub fn min_client_deadline(&self) -> Duration {
        self.contract().min_client_deadline()
    }
}

struct AppState {
    backend: Backend,
    options: ServeOptions,
    /// Keys whose first unprotected request was hung (demo faults without idem).
    hung: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The tool's description, as `GET /tools` lists it.
pub fn tools(options: &ServeOptions) -> ToolListing {
    let mut tool = ListedTool::new("create_ticket", &options.contract());
    let without = match &options.key_source {
        KeySource::Arguments(_) => {
            " A request without one is keyed by its title and account_id: within 3600 s the same \
             ticket is one ticket (the first answer is replayed), so a deliberate repeat must \
             differ in one of them; one sent while the same ticket is being created waits for \
             its answer."
        }
        KeySource::Unprotected => {
            " A request without one runs unprotected: a retry of it may create a second ticket."
        }
        _ => " A request without one is refused.",
    };
    tool.description = format!(
        "Creates a support ticket. Side-effecting: send an Idempotency-Key header made from your \
         durable workflow step and reuse it on every retry.{without} Processing window: {window} \
         ms; minimum client retry deadline: {deadline} ms — a client attempt shorter than that is \
         cut off while the tool is still working. A retry sent while the first request runs may \
         wait for its answer with `Prefer: wait=N` (seconds), up to {max_wait} ms.",
        window = options.processing_window().as_millis(),
        deadline = options.min_client_deadline().as_millis(),
        max_wait = options.min_client_deadline().as_millis(),
    );
    tool.input_schema = serde_json::Value::Object(input_schema());
    ToolListing { tools: vec![tool] }
}

/// The arguments of `create_ticket`, as a JSON Schema (the HTTP and the MCP tool publish it).
fn input_schema() -> serde_json::Map<String, serde_json::Value> {
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1},
            "account_id": {"type": "string", "minLength": 1}
        },
        "required": ["title", "account_id"],
        "additionalProperties": false
    });
    match schema {
        serde_json::Value::Object(schema) => schema,
        _ => serde_json::Map::new(),
    }
}

/// The claims' policy on `backend`: leases of the minimum client retry deadline, and what a
/// stale record gets. On SQL stores, Takeover is safe, and only because the ticket and the
/// completion commit together: a record still `processing` after its lease means its holder
/// never committed, so no ticket exists, and a late holder is fenced inside its own transaction
/// (which then rolls back). On Redis the ticket is written before the record is completed, so a
/// stale record is left to the reconciler ([`start_reconciler`]), which looks the ticket up.
fn policy(backend: &Backend, options: &ServeOptions) -> Result<Policy, idem_core::PolicyError> {
    let stale = match backend.tickets.probe() {
        Some(_) => idem_core::StalePolicy::Reconcile,
        None => idem_core::StalePolicy::Takeover,
    };
    Policy::builder()
        .lease(options.min_client_deadline())
        .stale(stale)
        .build()
}

/// Where tickets do not commit with their records (Redis), settles stale records in the
/// background by looking their tickets up, every half lease.
fn start_reconciler(backend: &Backend, options: &ServeOptions, policy: Policy) {
    if let Some(probe) = backend.tickets.probe() {
        let reconciler = Reconciler::new(
            backend.store(),
            options.clock.clone(),
            policy,
            BoxedProbe(probe),
        );
        let every = policy.lease() / 2;
        tokio::spawn(async move { reconciler.run_periodically(every, tokio::time::sleep).await });
    }
}

/// The reference tool's settings under `policy`: its processing window, a maximum wait of its
/// minimum client deadline, and the key source; a bad one is refused here, as the server starts.
pub(crate) fn tool(policy: Policy, options: &ServeOptions) -> Result<Tool, ToolError> {
    Tool::builder()
        .policy(policy)
        .processing_window(options.processing_window())
        .max_wait(options.min_client_deadline())
        .key_source(options.key_source.clone())
        .build()
}

/// The server's router on `backend`, or why its tool's settings do not fit together.
pub fn router(backend: Backend, options: ServeOptions) -> Result<Router, ToolError> {
    let policy = policy(&backend, &options)?;
    let tool = tool(policy, &options)?;
    start_reconciler(&backend, &options, policy);
    let mut executor = Executor::from_arc(backend.store()).with_clock(options.clock.clone());
    if options.demo_faults {
        // The demo's hung holder stands for one that crashed mid-flight, which renews nothing:
        // its lease must run out as a crashed holder's would.
        executor = executor.with_heartbeat(None);
    }
    // The tenant `authenticate` put in the request: from the token, or the header as sent.
    let layer = IdempotencyLayer::new(executor, |parts| {
        parts
            .extensions
            .get::<Tenant>()
            .map(|t| t.0.clone())
            .ok_or_else(|| Problem::Unauthenticated("no tenant for the request".into()))
    })
    .tool(tool);
    let tokens = options.tokens.clone();
    let listing = tools(&options);
    let state = Arc::new(AppState {
        backend,
        options,
        hung: Default::default(),
    });
    let router = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
        .route_layer(axum::middleware::from_fn_with_state(tokens, authenticate))
        .route("/tools", get(move || async move { Json(listing) }))
        .with_state(state);
    Ok(router)
}

/// The same tool without the idempotency layer (for `idem demo --without-idem`): every request
/// that reaches it creates a ticket. Like the layered tool, the work runs in its own task, so a
/// client that gives up does not stop a ticket that is being created.
pub fn router_without_idem(backend: Backend, options: ServeOptions) -> Router {
    let listing = tools(&options);
    let state = Arc::new(AppState {
        backend,
        options,
        hung: Default::default(),
    });
    Router::new()
        .route("/tools/create_ticket", post(create_ticket_unprotected))
        .route("/tools", get(move || async move { Json(listing) }))
        .with_state(state)
}
