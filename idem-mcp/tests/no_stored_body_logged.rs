//! [contract §8](idem_core::contract#observability): keys and scopes are logged, stored bodies
//! never. One process runs the executor, the reconciler, the HTTP layer and an MCP server with
//! every `tracing` event of idem's crates captured (down to TRACE), including what an application
//! logs of the values idem hands it (`?execution`, `?report`, `?record`); no stored body text may
//! appear. Every transition event carries `idem.event`.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use idem_core::machine::ClaimAnswer;
use idem_core::reconcile::{Finding, Probe, Reconciler};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Outcome,
    Policy, Record, RecordId, Scope, Timestamp, async_trait,
};
use idem_http::IdempotencyLayer;
use idem_mcp::{IdempotentTools, META_KEY, ToolSettings, is_replay};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ContentBlock, ErrorData,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use serde_json::json;
use tower_layer::Layer;
use tower_service::Service;

/// In every stored body; never in a log line.
const MARKER: &str = "STORED-BODY-MARKER-7f3a";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn body(n: usize) -> Outcome {
    Outcome::definitive(201, &json!({"secret": MARKER, "n": n})).unwrap()
}

// --- MCP: a server whose tool answers with the marker.

#[derive(Clone)]
struct Server {
    tool_router: ToolRouter<Self>,
    idem: IdempotentTools,
}

#[tool_router]
impl Server {
    #[tool(description = "Creates a ticket.")]
    async fn create_ticket(&self) -> CallToolResult {
        CallToolResult::success(vec![ContentBlock::text(MARKER)])
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
        self.idem
            .call_routed(self, &self.tool_router, params, context)
            .await
    }
}

// --- HTTP: a tool service answering with the marker.

#[derive(Clone)]
struct HttpTool(Arc<AtomicUsize>);

impl Service<http::Request<Full<Bytes>>> for HttpTool {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Full<Bytes>>) -> Self::Future {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let text = json!({"secret": MARKER, "n": n}).to_string();
            Ok(http::Response::builder()
                .status(201)
                .body(Full::new(Bytes::from(text)))
                .unwrap())
        })
    }
}

struct Found;

#[async_trait]
impl Probe for Found {
    async fn probe(&self, _: &Record) -> Finding {
        Finding::Happened(body(99))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_run_logs_no_stored_body_and_names_every_transition() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "idem_core=trace,idem_http=trace,idem_mcp=trace,no_stored_body_logged=trace",
        ))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let store = MemoryStore::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .max_outcome_bytes(4096)
        .build()
        .unwrap();
    let executor = Executor::new(store.clone())
        .with_policy(policy)
        .with_clock(clock.clone());
    let scope = Scope::new("tenant-a/create_ticket").unwrap();
    let fp = Fingerprint::of("create_ticket", &json!({"title": "x"})).unwrap();

    // The executor: executed, replayed, in flight, too large.
    let key = IdempotencyKey::new("wf-1:step-1:create_ticket").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    for _ in 0..2 {
        let run = executor.run(&scope, &key, &fp, |_| async { body(1) }).await;
        tracing::info!(?run, "application: executor answered");
    }
    let big_key = IdempotencyKey::new("wf-1:step-2:create_ticket").unwrap();
    let big = executor
        .run(&scope, &big_key, &fp, |_| async {
            Outcome::definitive(200, &MARKER.repeat(1000)).unwrap()
        })
        .await;
    tracing::info!(?big, "application: executor answered");
    let record = store.get(&id, clock.now()).await.unwrap();
    tracing::info!(?record, "application: the record");

    // The reconciler: a stale claim whose effect happened; then one completed meanwhile.
    let stale = IdempotencyKey::new("wf-1:step-3:create_ticket").unwrap();
    let answer = store
        .claim(
            &RecordId::new(scope.clone(), stale.clone()),
            &fp,
            &policy,
            clock.now(),
        )
        .await
        .unwrap();
    assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
    clock.advance(Duration::from_secs(31));
    let reconciler = Reconciler::new(
        Arc::new(store.clone()),
        Arc::new(clock.clone()),
        policy,
        Found,
    );
    let report = reconciler.run_once().await.unwrap();
    assert_eq!(report.completed, 1);
    tracing::info!(?report, "application: reconciliation pass");
    let listed = store
        .list(&idem_core::store::ListFilter::default(), clock.now(), 100)
        .await
        .unwrap();
    tracing::info!(?listed, "application: every record");

    // The HTTP layer: executed, then replayed.
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(executor.clone(), |_| Ok("tenant-a".to_owned()));
    let mut service = layer.layer(HttpTool(runs.clone()));
    for _ in 0..2 {
        let request = http::Request::post("/tools/create_ticket")
            .header("idempotency-key", "wf-2:step-1:create_ticket")
            .body(Full::new(Bytes::from(r#"{"title":"x"}"#)))
            .unwrap();
        let response = service.call(request).await.unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&text).contains(MARKER));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // MCP: executed, then replayed.
    let idem = IdempotentTools::new(executor.clone())
        .principal_with(|_| Some("tenant-a".to_owned()))
        .tool(
            "create_ticket",
            ToolSettings::new(
                executor
                    .tool()
                    .to_builder()
                    .processing_window(Duration::from_secs(2))
                    .build()
                    .unwrap(),
            ),
        );
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
    let client = ClientConfig::default().serve(client_io).await.unwrap();
    for replay in [false, true] {
        let mut params = CallToolRequestParams::new("create_ticket");
        let mut meta = RequestMetaObject::new();
        meta.0
            .0
            .insert(META_KEY.into(), json!("wf-3:step-1:create_ticket"));
        params.meta = Some(meta);
        let result = client.call_tool(params).await.unwrap();
        assert_eq!(is_replay(&result), replay);
    }
    client.cancel().await.unwrap();

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("wf-1:step-1:create_ticket"),
        "keys are logged:\n{log}"
    );
    assert!(!log.contains(MARKER), "a stored body was logged:\n{log}");
    for event in ["claimed", "completed", "replayed"] {
        assert!(
            log.contains(&format!("idem.event=\"{event}\"")),
            "no idem.event={event}:\n{log}"
        );
    }
}
