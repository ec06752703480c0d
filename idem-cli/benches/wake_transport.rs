//! Issue 28's target through the transports: a retry sent 10 ms after the first request of a
//! 300 ms tool began to run gets the replay within 20 ms of the first answer (p99 over 100
//! pairs), over real HTTP and real MCP, per backend; and the same pairs without waiting, side by
//! side.
//!
//! - HTTP: the `IdempotencyLayer` in an axum server on `127.0.0.1:0`; two `ToolClient`s (each its
//!   own connection pool), the first request from one, the retry from the other, with
//!   `Idempotency-Key` and, by default, `Prefer: wait` (`without_wait()`: no header, so 409 and
//!   `Retry-After`).
//! - MCP: `IdempotentTools` in an rmcp server on streamable HTTP on `127.0.0.1:0`; two rmcp client
//!   sessions, each an `IdempotentCaller` sending `_meta["io.idem/wait"]` by default
//!   (`without_wait()`: none, so "in flight" and `retryAfterMs`).
//!
//! One server of each transport per backend, on one store handle, configured as `idem serve` is:
//! the lease is the tool's minimum client deadline (1.8 s), so a retry that does not wait is told
//! to come back when the lease ends. PostgreSQL and Redis wake a waiting retry through the engine
//! (`LISTEN/NOTIFY`, pub/sub) even in one process, SQLite and memory in process. Measured: from the
//! executed request's answer reaching its client to the replay reaching the other (whichever was
//! executed). 100 pairs, 10 at a time, each on a key of its own. The tool counts its runs; each row
//! asserts runs == pairs.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p idem-cli --bench wake_transport
//! ```
//! A backend whose variable is unset is left out. Under `cargo test --benches` (no `--bench`
//! argument) it runs 10 pairs per row on memory alone, as a smoke test. `IDEM_BENCH_BATCH` sets the
//! pairs at a time (default 10), `IDEM_BENCH_SQLITE_CONNECTIONS` the SQLite store's connections
//! (default the store's own, 4).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use idem_http::IdempotencyLayer;
use idem_http::client::{RetryPolicy, ToolClient};
use idem_mcp::{IdempotentCaller, IdempotentTools, ToolSettings};
use idemkit::{Executor, IdempotencyKey, KeyStore, MemoryStore, Policy, ToolContract};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ErrorData,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Pairs per row: 100, or 10 in a smoke test.
fn pairs_per_row() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        100
    } else {
        10
    }
}
const TOOL: Duration = Duration::from_millis(300);
const RETRY_AFTER: Duration = Duration::from_millis(10);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        idem_http::client::install_crypto_provider();
        let mut rows = Vec::new();
        let smoke = pairs_per_row() < 100;
        for (backend, store) in backends().await {
            if smoke && backend != "memory" {
                continue;
            }
            let tool = Arc::new(Tool::default());
            let http = Http::serve(store.clone(), tool.clone()).await;
            let mcp = Mcp::serve(store, tool.clone()).await;
            for wait in [true, false] {
                let sender = Sender::Http(http.clients(wait));
                rows.push((backend, "HTTP", wait, pairs(&sender, &tool).await));
                let sender = Sender::Mcp(mcp.callers(wait).await);
                rows.push((backend, "MCP", wait, pairs(&sender, &tool).await));
            }
        }
        println!(
            "{} pairs each, {} at a time; retry 10 ms into a 300 ms tool, from the first answer to the replay",
            pairs_per_row(),
            knob("BATCH", 10)
        );
        println!(
            "{:<9} {:<5} {:<8} | {:>9} {:>9} {:>9} | retry's refusals | runs at the sink",
            "backend", "via", "retry", "p50", "p99", "max"
        );
        for (backend, via, wait, mut done) in rows {
            let (p50, p99, max) = stats(&mut done.gaps);
            let how = if wait { "waits" } else { "no wait" };
            println!(
                "{backend:<9} {via:<5} {how:<8} | {p50:>9.2?} {p99:>9.2?} {max:>9.2?} | {:>16} | {} for {} pairs",
                done.refusals, done.runs, done.gaps.len()
            );
        }
    });
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(sqlite_file(suffix));
    }
}

/// The SQLite file of this run (`suffix` "": the database; "-wal", "-shm": its companions).
fn sqlite_file(suffix: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "idem-wake-transport-{}.db{suffix}",
        std::process::id()
    ))
}

/// `IDEM_BENCH_<name>` as a number, else `default`.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(format!("IDEM_BENCH_{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn stats(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |p: usize| v[(v.len() * p).div_ceil(100).max(1) - 1];
    (at(50), at(99), v[v.len() - 1])
}

/// (name, store) per backend configured.
async fn backends() -> Vec<(&'static str, Arc<dyn KeyStore>)> {
    let mut out: Vec<(&'static str, Arc<dyn KeyStore>)> =
        vec![("memory", Arc::new(MemoryStore::new()))];
    let dir = sqlite_file("");
    let mut sqlite = idemkit::sqlite::SqliteStore::builder(&dir);
    if let Ok(n) = std::env::var("IDEM_BENCH_SQLITE_CONNECTIONS") {
        sqlite = sqlite.max_connections(n.parse().expect("a number of connections"));
    }
    let sqlite = sqlite.open().unwrap();
    sqlite.migrate().unwrap();
    out.push(("sqlite", Arc::new(sqlite)));
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        let pg = idemkit::postgres::PostgresStore::connect(&url)
            .await
            .unwrap();
        pg.migrate().await.unwrap();
        out.push(("postgres", Arc::new(pg)));
    }
    if let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") {
        let prefix = format!("idem-wake-transport-{}", std::process::id());
        let redis = idemkit::redis::RedisStore::connect(&url)
            .await
            .unwrap()
            .with_prefix(&prefix)
            .unwrap();
        out.push(("redis", Arc::new(redis)));
    }
    out
}

/// The tool's processing window: its latency and a second of margin, as `idem serve` publishes.
fn window() -> Duration {
    TOOL + Duration::from_secs(1)
}

/// An executor as `idem serve` configures one: the lease is the tool's minimum client deadline
/// (window + store write), so a retry told "in flight" is told to come back when it ends.
fn executor(store: Arc<dyn KeyStore>) -> Executor {
    Executor::from_arc(store).with_tool(settings())
}

/// The 300 ms tool's settings: a lease of its minimum client deadline.
fn settings() -> idem_core::Tool {
    let lease = ToolContract::new(window()).min_client_deadline();
    let policy = Policy::builder().lease(lease).build().unwrap();
    idem_core::Tool::builder()
        .policy(policy)
        .processing_window(window())
        .build()
        .unwrap()
}

/// The 300 ms tool: counts its runs and tells the pair whose key it runs that it began.
#[derive(Default)]
struct Tool {
    runs: AtomicUsize,
    started: Mutex<HashMap<String, oneshot::Sender<()>>>,
}

impl Tool {
    /// A signal for when the tool begins to run for `pair`.
    fn expect(&self, pair: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.started.lock().unwrap().insert(pair.to_owned(), tx);
        rx
    }

    async fn run(&self, args: &Value) -> Value {
        let pair = args["pair"].as_str().unwrap_or_default();
        if let Some(started) = self.started.lock().unwrap().remove(pair) {
            let _ = started.send(());
        }
        tokio::time::sleep(TOOL).await;
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        json!({"ticket_id": format!("T-{n}")})
    }
}

/// The tool behind the `IdempotencyLayer` in an axum server.
struct Http {
    url: String,
}

impl Http {
    async fn serve(store: Arc<dyn KeyStore>, tool: Arc<Tool>) -> Self {
        let layer = IdempotencyLayer::new(executor(store), |_| Ok("bench".into()));
        let app = axum::Router::new()
            .route(
                "/tools/create_ticket",
                axum::routing::post(
                    |State(tool): State<Arc<Tool>>, axum::Json(args): axum::Json<Value>| async move {
                        (StatusCode::CREATED, axum::Json(tool.run(&args).await))
                    },
                ),
            )
            .route_layer(layer)
            .with_state(tool);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/tools/create_ticket",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url }
    }

    /// The first request's client and the retry's, each with connections of its own.
    fn clients(&self, wait: bool) -> (ToolClient, ToolClient) {
        let client = || {
            let c = ToolClient::new(self.url.clone(), RetryPolicy::default(), None).unwrap();
            if wait { c } else { c.without_wait() }
        };
        (client(), client())
    }
}

/// The tool behind `IdempotentTools` in an rmcp server on streamable HTTP.
#[derive(Clone)]
struct McpServer {
    idem: IdempotentTools,
    tool: Arc<Tool>,
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(ServerConfig::new(
            ServerCapabilities::builder().enable_tools().build(),
        ))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = self.tool.clone();
        self.idem
            .call(params, context, move |params, _| async move {
                let args = Value::Object(params.arguments.unwrap_or_default());
                let ticket = tool.run(&args).await;
                Ok(CallToolResponse::Complete(CallToolResult::structured(
                    ticket,
                )))
            })
            .await
    }
}

struct Mcp {
    url: String,
}

type Client = RunningService<RoleClient, ClientConfig>;
/// The two sessions (kept open) and a caller on each.
type Callers = (Arc<(Client, Client)>, IdempotentCaller, IdempotentCaller);

impl Mcp {
    async fn serve(store: Arc<dyn KeyStore>, tool: Arc<Tool>) -> Self {
        let idem = IdempotentTools::new(executor(store))
            .tool("create_ticket", ToolSettings::new(settings()))
            .allow_anonymous("bench");
        let server = McpServer { idem, tool };
        let service: StreamableHttpService<McpServer, LocalSessionManager> =
            StreamableHttpService::new(
                move || Ok(server.clone()),
                Arc::default(),
                StreamableHttpServerConfig::default(),
            );
        let app = axum::Router::new().route_service("/mcp", service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url }
    }

    /// The first call's session and the retry's, each a client of its own.
    async fn callers(&self, wait: bool) -> Callers {
        let connect = || async {
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(self.url.as_str()),
            );
            ClientConfig::default().serve(transport).await.unwrap()
        };
        let (a, b) = (connect().await, connect().await);
        let caller = |c: &Client| {
            let caller = IdempotentCaller::new(c.peer().clone(), RetryPolicy::default());
            if wait { caller } else { caller.without_wait() }
        };
        let (first, retry) = (caller(&a), caller(&b));
        // Dropping a client would close its session.
        (Arc::new((a, b)), first, retry)
    }
}

/// The two senders of a pair over one transport.
#[derive(Clone)]
enum Sender {
    Http((ToolClient, ToolClient)),
    Mcp(Callers),
}

/// What one call got: whether it was a replay, and the refusals ("in flight") before it.
async fn send(sender: &Sender, retry: bool, key: &IdempotencyKey, args: &Value) -> (bool, u32) {
    match sender {
        Sender::Http((first, again)) => {
            let client = if retry { again } else { first };
            let a = client.call(key, args).await.unwrap();
            (a.replayed, a.in_flight)
        }
        Sender::Mcp((_, first, again)) => {
            let caller = if retry { again } else { first };
            let a = caller
                .call("create_ticket", args.as_object().cloned(), key, None)
                .await
                .unwrap();
            (a.replayed, a.in_flight)
        }
    }
}

struct Done {
    gaps: Vec<Duration>,
    refusals: u32,
    runs: usize,
}

/// A row's pairs: the first request, then, 10 ms after the tool began to run, the retry. A replay
/// that reaches its client before the first answer counts as 0.
async fn pairs(sender: &Sender, tool: &Arc<Tool>) -> Done {
    let runs_before = tool.runs.load(Ordering::SeqCst);
    let run = format!("{:08x}", rand::random::<u32>());
    let n = pairs_per_row();
    let (mut gaps, mut refusals) = (Vec::with_capacity(n), 0);
    let at_once = knob("BATCH", 10).clamp(1, n);
    for batch in 0..n.div_ceil(at_once) {
        let tasks: Vec<_> = (batch * at_once..((batch + 1) * at_once).min(n))
            .map(|i| {
                let (sender, tool) = (sender.clone(), tool.clone());
                let pair = format!("{run}:{i}");
                tokio::spawn(async move {
                    let key = IdempotencyKey::new(pair.clone()).unwrap();
                    let args = json!({"title": "Printer on fire", "pair": pair});
                    let started = tool.expect(&pair);
                    let first = {
                        let (sender, key, args) = (sender.clone(), key.clone(), args.clone());
                        tokio::spawn(async move {
                            let answer = send(&sender, false, &key, &args).await;
                            (answer, Instant::now())
                        })
                    };
                    started.await.unwrap();
                    tokio::time::sleep(RETRY_AFTER).await;
                    let again = send(&sender, true, &key, &args).await;
                    let again_at = Instant::now();
                    let (first, first_at) = first.await.unwrap();
                    assert!(first.0 != again.0, "one execution and one replay");
                    let gap = if again.0 {
                        again_at.saturating_duration_since(first_at)
                    } else {
                        first_at.saturating_duration_since(again_at)
                    };
                    (gap, first.1 + again.1)
                })
            })
            .collect();
        for t in tasks {
            let (gap, refused) = t.await.unwrap();
            gaps.push(gap);
            refusals += refused;
        }
    }
    let runs = tool.runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(runs, n, "the tool ran once per pair");
    Done {
        gaps,
        refusals,
        runs,
    }
}
