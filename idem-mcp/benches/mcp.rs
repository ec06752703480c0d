//! What the MCP wrapper adds to a tool: a bare rmcp server against the same tool behind
//! `IdempotentTools` on a `MemoryStore` (so the store's round trips cost next to nothing), each
//! an rmcp client and server in this process over an in-memory pipe (`tokio::io::duplex`, rmcp's
//! in-process transport: the whole JSON-RPC path, no sockets). Bare calls, first executions (a
//! new key) and replays are interleaved call by call; p50, p90, p99, p99.9 and mean per kind,
//! and the wrapper's overhead beyond the bare call (issue 17's target: at most 15 % or 20 µs,
//! whichever is larger). Calls without a key to the tool under `KeySource::arguments()` (the key
//! derived from the canonical arguments, contract §5.1) are interleaved too, against the
//! sent-key calls (issue 27: deriving adds at most a few µs at p50).
//!
//! ```text
//! cargo bench -p idem-mcp --bench mcp
//! ```
//!
//! `IDEM_BENCH_ITERATIONS` (default 10000) sets the calls of each kind. Under `cargo test
//! --benches` (no `--bench` argument) it runs 20 of each, as a smoke test.

use std::time::{Duration, Instant};

use idem_core::{KeySource, MemoryStore};
use idem_mcp::{IdempotentTools, META_KEY, ToolSettings, is_replay};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ContentBlock, ErrorData,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use serde_json::json;

/// The tool, and the server around it: with `idem` its calls go through the wrapper, without
/// it straight to the router (a bare rmcp server).
#[derive(Clone)]
struct Server {
    tool_router: ToolRouter<Self>,
    idem: Option<IdempotentTools>,
}

#[tool_router]
impl Server {
    #[tool(description = "Creates a ticket.")]
    async fn create_ticket(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::text(
            r#"{"ticket_id":"T-1","title":"bench","status":"open"}"#,
        )])
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match &self.idem {
            Some(idem) => {
                idem.call_routed(self, &self.tool_router, params, context)
                    .await
            }
            None => {
                self.tool_router
                    .call(ToolCallContext::new(self, params, context))
                    .await
            }
        }
    }
}

async fn connect(idem: Option<IdempotentTools>) -> RunningService<RoleClient, ClientConfig> {
    let server = Server {
        tool_router: Server::tool_router(),
        idem,
    };
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ClientConfig::default().serve(client_io).await.unwrap()
}

fn params(key: Option<&str>, title: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("create_ticket");
    let args = json!({"title": title, "priority": 2});
    params.arguments = args.as_object().cloned();
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(META_KEY.into(), json!(key));
        params.meta = Some(meta);
    }
    params
}

/// One call, answered; `replay` is what the answer must say it is (`None`: a bare call).
async fn call(
    client: &RunningService<RoleClient, ClientConfig>,
    key: Option<&str>,
    replay: Option<bool>,
) -> Duration {
    call_titled(client, key, "bench", replay).await
}

/// [`call`] with the argument `title`.
async fn call_titled(
    client: &RunningService<RoleClient, ClientConfig>,
    key: Option<&str>,
    title: &str,
    replay: Option<bool>,
) -> Duration {
    let request = params(key, title);
    let t = Instant::now();
    let result = client.call_tool(request).await.unwrap();
    let took = t.elapsed();
    assert_ne!(result.is_error, Some(true));
    if let Some(replay) = replay {
        assert_eq!(is_replay(&result), replay);
    }
    took
}

struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    mean: f64,
}

fn stats(samples: &mut [Duration]) -> Stats {
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let rank = |q: f64| us(samples[((q * samples.len() as f64).ceil() as usize).max(1) - 1]);
    Stats {
        p50: rank(0.50),
        p90: rank(0.90),
        p99: rank(0.99),
        p999: rank(0.999),
        mean: samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64,
    }
}

async fn run(n: usize) {
    let bare = connect(None).await;
    let settings = |source| {
        let tool = idem_core::Tool::builder()
            .processing_window(Duration::from_secs(2))
            .key_source(source)
            .build()
            .expect("a valid tool");
        ToolSettings::new(tool)
    };
    let tools = IdempotentTools::with_store(MemoryStore::new())
        .tool("create_ticket", settings(KeySource::Refuse))
        .allow_anonymous("bench");
    let wrapped = connect(Some(tools)).await;
    let keyless = IdempotentTools::with_store(MemoryStore::new())
        .tool("create_ticket", settings(KeySource::arguments()))
        .allow_anonymous("bench");
    let derived = connect(Some(keyless)).await;

    for i in 0..200 {
        call(&bare, None, None).await;
        call(&wrapped, Some(&format!("warm-{i}")), Some(false)).await;
        call_titled(&derived, None, &format!("warm-{i}"), Some(false)).await;
    }
    let (mut b, mut first, mut replay) = (Vec::new(), Vec::new(), Vec::new());
    let (mut derived_first, mut derived_replay) = (Vec::new(), Vec::new());
    for i in 0..n {
        let key = format!("op-{i}");
        b.push(call(&bare, None, None).await);
        first.push(call(&wrapped, Some(&key), Some(false)).await);
        // The replay of the key before, so the record is settled (the completion ran).
        if i > 0 {
            let before = format!("op-{}", i - 1);
            replay.push(call(&wrapped, Some(&before), Some(true)).await);
        }
        derived_first.push(call_titled(&derived, None, &key, Some(false)).await);
        if i > 0 {
            let before = format!("op-{}", i - 1);
            derived_replay.push(call_titled(&derived, None, &before, Some(true)).await);
        }
    }
    let (derived_first, derived_replay) = (stats(&mut derived_first), stats(&mut derived_replay));
    let (b, first, replay) = (stats(&mut b), stats(&mut first), stats(&mut replay));
    println!(
        "idem-mcp bench: {n} calls of each kind, rmcp client and server in-process (tokio::io::duplex), MemoryStore"
    );
    println!(
        "  {:<32}{:>9}{:>9}{:>9}{:>9}{:>9}",
        "", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "mean µs"
    );
    for (name, s) in [
        ("bare rmcp tool", &b),
        ("wrapped, first execution", &first),
        ("wrapped, replay", &replay),
        ("derived key, first execution", &derived_first),
        ("derived key, replay", &derived_replay),
    ] {
        println!(
            "  {name:<32}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}",
            s.p50, s.p90, s.p99, s.p999, s.mean
        );
    }
    for (name, s) in [("first execution", &first), ("replay", &replay)] {
        println!(
            "  wrapper overhead, {name:<16} p50 +{:.1} µs ({:.2}×)  p99 +{:.1} µs ({:.2}×)",
            s.p50 - b.p50,
            s.p50 / b.p50,
            s.p99 - b.p99,
            s.p99 / b.p99
        );
    }
    for (name, d, s) in [
        ("first execution", &derived_first, &first),
        ("replay", &derived_replay, &replay),
    ] {
        println!(
            "  derived key vs sent, {name:<16} p50 +{:.1} µs ({:.2}×)  p99 +{:.1} µs ({:.2}×)",
            d.p50 - s.p50,
            d.p50 / s.p50,
            d.p99 - s.p99,
            d.p99 / s.p99
        );
    }
    derived.cancel().await.unwrap();
    bare.cancel().await.unwrap();
    wrapped.cancel().await.unwrap();
}

fn main() {
    // `cargo test --benches` runs benches with --bench absent: keep that quick.
    let n = if std::env::args().any(|a| a == "--bench") {
        std::env::var("IDEM_BENCH_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000)
    } else {
        20
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(n));
}
