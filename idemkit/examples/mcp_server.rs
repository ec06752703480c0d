//! An MCP server (on rmcp) with one idempotent tool, and an agent calling it twice with the
//! same key over an in-process pipe: the tool runs once, the second call is a replay.
//!
//! ```sh
//! cargo run -p idemkit --example mcp_server --features mcp
//! ```
//!
//! rmcp's macros name the `rmcp` crate, so a server depends on it directly (`cargo add rmcp -F
//! server,client,macros`, the version idem-mcp uses), as well as on idemkit with `mcp`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit::mcp::{IdempotentCaller, IdempotentTools, RetryPolicy, ToolSettings};
use idemkit::{MemoryStore, Tool};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientConfig, ErrorData, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt, schemars, tool, tool_router};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NewTicket {
    /// What the ticket is about.
    title: String,
}

#[derive(Clone)]
struct Tickets {
    tool_router: ToolRouter<Self>,
    idem: IdempotentTools,
    created: Arc<AtomicUsize>, // tickets created: the effect, counted where it happens
}

#[tool_router]
impl Tickets {
    #[tool(description = "Creates a support ticket and returns its id.")]
    async fn create_ticket(&self, Parameters(ticket): Parameters<NewTicket>) -> String {
        let n = self.created.fetch_add(1, Ordering::SeqCst) + 1; // a real tool writes it somewhere
        format!("ticket T-{n}: {}", ticket.title)
    }
}

/// The server routes `call_tool`, `list_tools` and `get_info` through `IdempotentTools`.
impl ServerHandler for Tickets {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(ServerConfig::new(
            ServerCapabilities::builder().enable_tools().build(),
        ))
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(self.idem.list_routed(&self.tool_router))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The tool runs in a spawned task: a dropped request cannot cut it halfway.
        self.idem
            .call_routed(self, &self.tool_router, params, cx)
            .await
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // MemoryStore here; SqliteStore, PostgresStore or RedisStore in production.
    // The tool's settings are checked here, once: a bad one never reaches a call.
    let create_ticket = Tool::builder()
        .processing_window(Duration::from_secs(5))
        .build()?;
    let idem = IdempotentTools::with_store(MemoryStore::new())
        .tool("create_ticket", ToolSettings::new(create_ticket))
        // One client per pipe and no authentication on it: opt into one shared scope (over
        // streamable HTTP, authenticate instead).
        .allow_anonymous("example-agent");
    let created = Arc::new(AtomicUsize::new(0));
    let server = Tickets {
        tool_router: Tickets::tool_router(),
        idem,
        created: created.clone(),
    };

    // An in-process transport: the two ends of a pipe (stdio or streamable HTTP in production).
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ClientConfig::default().serve(client_io).await?;

    // The agent's side: the key from its durable workflow step, the same on every retry, sent in
    // `_meta`; the tool's published minimum deadline checked against the retry policy.
    let caller = IdempotentCaller::new(client.peer().clone(), RetryPolicy::default());
    let minimum = caller.published_minimum("create_ticket").await?;
    let key = IdempotentCaller::step_key("wf-8812", "step-5", "create_ticket")?;
    let args = json!({"title": "Printer on fire"}).as_object().cloned();
    let first = caller
        .call("create_ticket", args.clone(), &key, minimum)
        .await?;
    let second = caller.call("create_ticket", args, &key, minimum).await?;

    let tickets = created.load(Ordering::SeqCst);
    println!(
        "first: {:?} (replayed: {})",
        first.result.content, first.replayed
    );
    println!(
        "second: {:?} (replayed: {})",
        second.result.content, second.replayed
    );
    println!("tickets created: {tickets}; published minimum client deadline: {minimum:?}");
    check(
        !first.replayed && second.replayed,
        "the second call is a replay",
    )?;
    check(
        first.result.content == second.result.content,
        "the replay is the same result",
    )?;
    check(tickets == 1, "exactly one ticket created")?;
    client.cancel().await?;
    println!("mcp_server: ok");
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("mcp_server: FAILED: {what}").into())
    }
}
