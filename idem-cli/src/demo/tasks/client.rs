//! The demo's clients: real rmcp clients that do what a task-aware client does (call, call again
//! on no answer, poll whichever replica the balancer picks), counting what they sent.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams,
    Implementation, ProtocolVersion, RequestMetaObject, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

use super::options::TasksOptions;
use crate::serve::BoxError;

/// What the clients sent and were told, over a run.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) calls: AtomicUsize,
    pub(super) polls: AtomicUsize,
    pub(super) lost: AtomicUsize,
    pub(super) ids: Mutex<std::collections::HashSet<String>>,
}

/// One operation as a task-aware client performs it; its time to the result, if it got one.
pub(super) async fn operate(
    op: usize,
    clients: &[Client],
    alive: &[AtomicBool; 2],
    counters: &Counters,
    options: &TasksOptions,
) -> Option<Duration> {
    let started = Instant::now();
    let give_up = started + options.tool_latency * 6;
    let mut turn = op;
    let pick = |turn: &mut usize| -> usize {
        *turn += 1;
        let i = *turn % 2;
        if alive[i].load(Ordering::SeqCst) {
            i
        } else {
            1 - i
        }
    };
    let mut task: Option<String> = None;
    let mut lose_next = op.is_multiple_of(3);
    while Instant::now() < give_up {
        let Some(id) = task.clone() else {
            counters.calls.fetch_add(1, Ordering::SeqCst);
            let client = &clients[pick(&mut turn)];
            let answer = tokio::time::timeout(
                options.client_deadline,
                client.peer().call_tool_once(provision(op)),
            )
            .await;
            match answer {
                Ok(Ok(CallToolResponse::Task(created))) => {
                    if let Ok(mut ids) = counters.ids.lock() {
                        ids.insert(created.task.task_id.clone());
                    }
                    if std::mem::take(&mut lose_next) {
                        continue;
                    }
                    task = Some(created.task.task_id);
                }
                Ok(Ok(CallToolResponse::Complete(_))) => return Some(started.elapsed()),
                _ => tokio::time::sleep(options.poll_interval()).await,
            }
            continue;
        };
        tokio::time::sleep(options.poll_interval()).await;
        counters.polls.fetch_add(1, Ordering::SeqCst);
        let client = &clients[pick(&mut turn)];
        match client.peer().get_task(GetTaskParams::new(id)).await {
            Ok(got) if got.task.status() == TaskStatus::Completed => {
                return Some(started.elapsed());
            }
            Ok(got) if got.task.status().is_terminal() => task = None,
            // A holder that stopped renewing: the same call again takes it over.
            Ok(got) if got.task.task.status_message.is_some() => task = None,
            Ok(_) => {}
            Err(rmcp::ServiceError::McpError(e))
                if e.code == rmcp::model::ErrorCode::INVALID_PARAMS =>
            {
                counters.lost.fetch_add(1, Ordering::SeqCst);
                task = None;
            }
            Err(_) => {}
        }
    }
    None
}

fn provision(op: usize) -> CallToolRequestParams {
    let mut meta = RequestMetaObject::new();
    meta.0.0.insert(
        idem_mcp::key::META_KEY.to_owned(),
        json!(format!("demo-op-{op}")),
    );
    let mut params = CallToolRequestParams::new("provision").with_arguments(
        serde_json::Map::from_iter([("name".to_owned(), json!(format!("vm-{op}")))]),
    );
    params.meta = Some(meta);
    params
}

pub(super) type Client = RunningService<RoleClient, ClientConfig>;

/// A client of MCP 2026-07-28 (no session) that declares the tasks extension.
pub(super) async fn connect(url: &str, tenant: &str) -> Result<Client, BoxError> {
    idem_http::client::install_crypto_provider();
    let mut headers = HashMap::new();
    headers.insert(
        http::HeaderName::from_static("x-tenant-id"),
        http::HeaderValue::from_str(tenant)?,
    );
    let transport = StreamableHttpClientTransport::from_config(
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(headers),
    );
    let client = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("idem-demo", env!("CARGO_PKG_VERSION")),
    )
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await?;
    Ok(client)
}
