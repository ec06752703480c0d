//! The demo's tool server: `provision`, slow, whose tasks idem or rmcp's in-memory
//! `TaskManager` serves.

use std::time::Duration;

use idem_core::{Executor, Policy, StalePolicy, Tool};
use idem_mcp::{IdempotentTools, ToolSettings};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, ErrorData, GetTaskParams, GetTaskResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskManager, TaskOptions};
use rmcp::{RoleServer, ServerHandler, schemars, tool, tool_router};

use super::options::{Mode, Sink, TasksOptions};
use crate::serve::BoxError;

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct ProvisionArgs {
    name: String,
}

/// The replica's server: the tool, and who serves its tasks.
#[derive(Clone)]
pub(super) struct Provisioner {
    tasks: Tasks,
    sink: Sink,
    latency: Duration,
    poll_interval: Duration,
    tool_router: ToolRouter<Self>,
}

#[derive(Clone)]
enum Tasks {
    Idem(Box<IdempotentTools>),
    Manager(TaskManager),
}

/// The tool's work: its latency, then the effect.
async fn provision_at(sink: Sink, latency: Duration, name: String) -> CallToolResult {
    tokio::time::sleep(latency).await;
    if let Ok(mut sink) = sink.lock() {
        *sink.entry(name.clone()).or_default() += 1;
    }
    CallToolResult::success(vec![ContentBlock::text(format!("provisioned {name}"))])
}

#[tool_router]
impl Provisioner {
    pub(super) async fn new(
        mode: &Mode,
        sink: Sink,
        options: &TasksOptions,
    ) -> Result<Self, BoxError> {
        let tasks = match mode {
            Mode::Idem(url) => {
                let store = idemkit::OpenOptions::new()
                    .migrate(true)
                    .open(url.clone())
                    .await?
                    .into_store();
                let policy = Policy::builder()
                    .lease(options.lease())
                    .stale(StalePolicy::Takeover)
                    .build()?;
                let provision = Tool::builder()
                    .policy(policy)
                    .processing_window(options.tool_latency)
                    .tasks(true)
                    .build()?;
                let idem = IdempotentTools::new(Executor::from_arc(store))
                    .principal_with(|cx| {
                        let parts = cx.extensions.get::<http::request::Parts>()?;
                        Some(parts.headers.get("x-tenant-id")?.to_str().ok()?.to_owned())
                    })
                    .tasks(demo_secret())
                    .tool(
                        "provision",
                        ToolSettings::new(provision).poll_interval(options.poll_interval()),
                    );
                Tasks::Idem(Box::new(idem))
            }
            Mode::TaskManager => Tasks::Manager(TaskManager::new()),
        };
        Ok(Self {
            tasks,
            sink,
            latency: options.tool_latency,
            poll_interval: options.poll_interval(),
            tool_router: Self::tool_router(),
        })
    }

    #[tool(description = "Provisions a virtual machine (slow).")]
    async fn provision(&self, Parameters(args): Parameters<ProvisionArgs>) -> CallToolResult {
        provision_at(self.sink.clone(), self.latency, args.name).await
    }
}

/// The secret every replica seals task ids with (a real deployment reads it from its secret
/// store).
fn demo_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    secret[..13].copy_from_slice(b"idem-demo-key");
    secret
}

impl ServerHandler for Provisioner {
    fn get_info(&self) -> ServerConfig {
        let info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        );
        match &self.tasks {
            Tasks::Idem(idem) => idem.advertise(info),
            Tasks::Manager(_) => info,
        }
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match &self.tasks {
            Tasks::Idem(idem) => {
                idem.call_routed(self, &self.tool_router, params, context)
                    .await
            }
            Tasks::Manager(manager) => {
                // Every call is a new task: the manager knows no key.
                let name = params
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("name"))
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_owned();
                let (sink, latency) = (self.sink.clone(), self.latency);
                let options =
                    TaskOptions::new().with_poll_interval_ms(self.poll_interval.as_millis() as u64);
                let task = manager.spawn(options, move |_| {
                    Box::pin(async move { Ok(provision_at(sink, latency, name).await) })
                });
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
        }
    }

    async fn get_task(
        &self,
        params: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        match &self.tasks {
            Tasks::Idem(idem) => idem.get_task(params, context).await,
            Tasks::Manager(manager) => Ok(GetTaskResult::new(manager.get_task(&params.task_id)?)),
        }
    }

    async fn cancel_task(
        &self,
        params: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match &self.tasks {
            Tasks::Idem(idem) => idem.cancel_task(params, context).await,
            Tasks::Manager(manager) => manager.cancel_task(&params.task_id),
        }
    }
}
