//! [contract §2](idem_core::contract#states): a result too large to keep does not leave the key
//! stuck in `processing`. A real rmcp client and server over an in-memory pipe; the sink counts how
//! often the tool's body ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{MemoryStore, OUTCOME_NOT_KEPT, Policy};
use idem_mcp::{IdempotentTools, META_KEY, NOT_KEPT_META_KEY, ToolSettings, is_replay};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ContentBlock, ErrorData,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use serde_json::json;

/// What only the tool's real answer contains.
const MARKER: &str = "BIG-RESULT-MARKER";

#[derive(Clone)]
struct Server {
    tool_router: ToolRouter<Self>,
    idem: IdempotentTools,
    runs: Arc<AtomicUsize>,
}

#[tool_router]
impl Server {
    #[tool(description = "Exports a report far larger than the store keeps.")]
    async fn export(&self) -> CallToolResult {
        self.runs.fetch_add(1, Ordering::SeqCst);
        CallToolResult::success(vec![ContentBlock::text(MARKER.repeat(200))])
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

async fn connect() -> (RunningService<RoleClient, ClientConfig>, Arc<AtomicUsize>) {
    let policy = Policy::builder().max_outcome_bytes(1024).build().unwrap();
    let tool = idem_core::Tool::builder()
        .policy(policy)
        .processing_window(Duration::from_secs(2))
        .build()
        .unwrap();
    let idem = IdempotentTools::with_store(MemoryStore::new())
        .principal_with(|_| Some("tenant-a".to_owned()))
        .tool("export", ToolSettings::new(tool));
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server {
        tool_router: Server::tool_router(),
        idem,
        runs: runs.clone(),
    };
    let (server_io, client_io) = tokio::io::duplex(256 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    (
        ClientConfig::default().serve(client_io).await.unwrap(),
        runs,
    )
}

fn call(key: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("export");
    let mut meta = RequestMetaObject::new();
    meta.0.0.insert(META_KEY.into(), json!(key));
    params.meta = Some(meta);
    params
}

#[tokio::test]
async fn a_result_too_large_to_keep_runs_once_and_retries_get_a_final_answer() {
    let (client, runs) = connect().await;
    let first = client.call_tool(call("wf-1:export")).await.unwrap();
    assert!(!is_replay(&first));
    assert!(
        serde_json::to_string(&first).unwrap().contains(MARKER),
        "the first caller gets the real result"
    );
    for _ in 0..2 {
        let again = client.call_tool(call("wf-1:export")).await.unwrap();
        assert!(is_replay(&again), "{again:?}");
        assert_eq!(again.is_error, Some(false), "the tool succeeded");
        let problem = &again.meta.as_ref().unwrap().0[NOT_KEPT_META_KEY];
        assert_eq!(problem["type"], OUTCOME_NOT_KEPT);
        let text = serde_json::to_string(&again.content).unwrap();
        assert!(
            text.contains("not kept") && !text.contains(MARKER),
            "{text}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
    client.cancel().await.unwrap();
}
