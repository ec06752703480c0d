//! `idem demo --mcp-tasks`: a tool that works longer than its clients wait, served as MCP tasks
//! (MCP 2026-07-28) by two replicas behind no sticky routing, one of which is killed mid-task;
//! with idem (the task is the record, in one store) and, side by side, with rmcp's in-memory
//! `TaskManager` in each replica. Effects are counted at the sink.
//!
//! Each replica runs on a tokio runtime of its own, serving stateless streamable HTTP; killing
//! it shuts the runtime down at once: its listener, its store handle and every tool it was
//! running are gone, as in a crash. The clients (real rmcp clients declaring the tasks
//! extension) do what a task-aware client does: call, and on no answer within their deadline (or
//! an answer lost on the way) call again; poll `tasks/get`, each poll to whichever replica the
//! balancer picks; call again when a task is unknown (a replica forgot it or never had it) or is
//! reported stale (its holder stopped renewing). The demo loses the first answer of every third
//! operation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Executor, Policy, StalePolicy};
use idem_mcp::{IdempotentTools, ToolSettings};
use idemkit::StoreUrl;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, ContentBlock, CreateTaskResult, ErrorData, GetTaskParams, GetTaskResult,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, RequestMetaObject,
    ServerCapabilities, ServerConfig, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::task_manager::{TaskManager, TaskOptions};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleClient, RoleServer, ServerHandler, schemars, tool, tool_router};
use serde_json::json;

use crate::exit::Failure;
use crate::serve::BoxError;

/// What `idem demo --mcp-tasks` runs.
#[derive(Debug, Clone)]
pub struct TasksOptions {
    /// Operations, each one provisioning, meant once.
    pub operations: usize,
    /// How long the tool works.
    pub tool_latency: Duration,
    /// How long a client waits for the answer to a call before it calls again.
    pub client_deadline: Duration,
    /// When the first replica is killed, after the start.
    pub kill_after: Duration,
}

impl TasksOptions {
    /// The demo's defaults for `operations`: a 12 s tool, a 5 s client deadline, the first
    /// replica killed halfway through the tool.
    pub fn new(operations: usize, tool_latency: Duration) -> Self {
        Self {
            operations,
            tool_latency,
            client_deadline: (tool_latency * 5 / 12).max(Duration::from_millis(100)),
            kill_after: tool_latency / 2,
        }
    }

    /// The lease of the idem replicas: short enough that a killed holder's task is taken over
    /// soon, renewed by the heartbeat while the holder lives. Not below a second: a lease covers
    /// the store's writes too (contract §1), and on a loaded machine one commit can take a few
    /// hundred milliseconds (a 300 ms lease let a live holder be taken over there).
    fn lease(&self) -> Duration {
        (self.tool_latency / 4).max(Duration::from_secs(1))
    }

    fn poll_interval(&self) -> Duration {
        (self.tool_latency / 24).max(Duration::from_millis(20))
    }
}

/// What one run produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TasksReport {
    /// Operations meant.
    pub operations: usize,
    /// Effects at the sink.
    pub effects: usize,
    /// Operations whose effect happened more than once.
    pub doubled: usize,
    /// Operations that never got a result.
    pub unfinished: usize,
    /// `tools/call` requests sent.
    pub calls: usize,
    /// Distinct task ids the clients were given.
    pub tasks_created: usize,
    /// Polls answered "unknown task": a task the replica polled does not have.
    pub lost: usize,
    /// `tasks/get` requests sent.
    pub polls: usize,
    /// Time to the result, median and slowest, in milliseconds.
    pub p50_ms: u64,
    /// The slowest.
    pub max_ms: u64,
}

/// `idem demo --mcp-tasks`: both runs, side by side, then the verdict (exit 6 on a double
/// effect with idem).
pub async fn run_cli(store: Option<StoreUrl>, options: TasksOptions) -> Result<(), Failure> {
    let dir = std::env::temp_dir().join(format!("idem-demo-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Failure::other)?;
    let store = match store {
        Some(store) => store,
        None => format!("sqlite://{}", dir.join("demo.db").display())
            .parse()
            .map_err(Failure::usage)?,
    };
    println!(
        "{} operations, a {} ms tool, clients that call again after {} ms and lose the first answer of every third operation, polls over two replicas, the first killed at {} ms",
        options.operations,
        options.tool_latency.as_millis(),
        options.client_deadline.as_millis(),
        options.kill_after.as_millis()
    );
    let with = run(Mode::Idem(store), &options)
        .await
        .map_err(super::orchestrated::demo_failure)?;
    let without = run(Mode::TaskManager, &options)
        .await
        .map_err(super::orchestrated::demo_failure)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", table(&with, &without));
    if with.doubled > 0 || with.unfinished > 0 {
        return Err(Failure::suite_failed(format!(
            "with idem: {} operations doubled, {} unfinished",
            with.doubled, with.unfinished
        )));
    }
    Ok(())
}

fn table(with: &TasksReport, without: &TasksReport) -> String {
    let row = |name: &str, f: &dyn Fn(&TasksReport) -> String| {
        format!("{name:<34} {:>14} {:>22}\n", f(with), f(without))
    };
    let mut out = format!("{:<34} {:>14} {:>22}\n", "", "idem", "TaskManager alone");
    out += &row("operations", &|r| r.operations.to_string());
    out += &row("effects at the sink", &|r| r.effects.to_string());
    out += &row("operations with a double effect", &|r| {
        r.doubled.to_string()
    });
    out += &row("operations without a result", &|r| r.unfinished.to_string());
    out += &row("tools/call sent", &|r| r.calls.to_string());
    out += &row("tasks created", &|r| r.tasks_created.to_string());
    out += &row("polls of an unknown task (lost)", &|r| r.lost.to_string());
    out += &row("polls per operation", &|r| {
        format!("{:.1}", r.polls as f64 / r.operations.max(1) as f64)
    });
    out += &row("time to result p50 / max, ms", &|r| {
        format!("{} / {}", r.p50_ms, r.max_ms)
    });
    out
}

/// Who serves the tasks.
#[derive(Clone)]
pub(crate) enum Mode {
    /// `IdempotentTools` over the store at this URL, one handle per replica.
    Idem(StoreUrl),
    /// rmcp's `TaskManager`, in each replica's memory.
    TaskManager,
}

/// The system the tool acts on: how often each name was provisioned.
type Sink = Arc<Mutex<HashMap<String, usize>>>;

pub(crate) async fn run(mode: Mode, options: &TasksOptions) -> Result<TasksReport, BoxError> {
    let sink = Sink::default();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(Replica::start(&mode, &sink, options).await?);
    }
    let alive = Arc::new([AtomicBool::new(true), AtomicBool::new(true)]);
    // A tenant of its own for each run: records of an earlier run on the same store are not
    // this run's.
    let tenant = format!("demo-{}", &idem_core::Token::new(0).id_hex()[..12]);
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(connect(&replica.url, &tenant).await?);
    }
    let clients = Arc::new(clients);
    let counters = Arc::new(Counters::default());
    let mut operations = tokio::task::JoinSet::new();
    for op in 0..options.operations {
        let (clients, alive, counters, options) = (
            clients.clone(),
            alive.clone(),
            counters.clone(),
            options.clone(),
        );
        operations.spawn(async move { operate(op, &clients, &alive, &counters, &options).await });
    }
    tokio::time::sleep(options.kill_after).await;
    alive[0].store(false, Ordering::SeqCst);
    replicas[0].kill();
    let mut times = Vec::new();
    while let Some(done) = operations.join_next().await {
        if let Some(took) = done? {
            times.push(took);
        }
    }
    // Whatever is still running finishes before the sink is read.
    tokio::time::sleep(options.tool_latency / 4).await;
    times.sort();
    let effects = sink.lock().map_err(|_| "the sink's lock")?.clone();
    let report = TasksReport {
        operations: options.operations,
        effects: effects.values().sum(),
        doubled: effects.values().filter(|n| **n > 1).count(),
        unfinished: options.operations - times.len(),
        calls: counters.calls.load(Ordering::SeqCst),
        tasks_created: counters.ids.lock().map_err(|_| "the ids' lock")?.len(),
        lost: counters.lost.load(Ordering::SeqCst),
        polls: counters.polls.load(Ordering::SeqCst),
        p50_ms: times
            .get(times.len() / 2)
            .map_or(0, |d| d.as_millis() as u64),
        max_ms: times.last().map_or(0, |d| d.as_millis() as u64),
    };
    for replica in &mut replicas {
        replica.kill();
    }
    Ok(report)
}

#[derive(Default)]
struct Counters {
    calls: AtomicUsize,
    polls: AtomicUsize,
    lost: AtomicUsize,
    ids: Mutex<std::collections::HashSet<String>>,
}

/// One operation as a task-aware client performs it; its time to the result, if it got one.
async fn operate(
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

type Client = RunningService<RoleClient, ClientConfig>;

/// A client of MCP 2026-07-28 (no session) that declares the tasks extension.
async fn connect(url: &str, tenant: &str) -> Result<Client, BoxError> {
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

/// One replica: its own runtime, so killing it stops everything it runs at once.
struct Replica {
    url: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Replica {
    async fn start(mode: &Mode, sink: &Sink, options: &TasksOptions) -> Result<Self, BoxError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let (mode, sink, options) = (mode.clone(), sink.clone(), options.clone());
        runtime.spawn(async move {
            let server = match Provisioner::new(&mode, sink, &options).await {
                Ok(server) => server,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let config = StreamableHttpServerConfig::default().with_sse_keep_alive(None);
            let service: StreamableHttpService<Provisioner, LocalSessionManager> =
                StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
            let router = axum::Router::new().nest_service("/mcp", service);
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let _ = axum::serve(listener, router).await;
        });
        ready_rx.await.map_err(|_| "the replica did not start")??;
        Ok(Self {
            url,
            runtime: Some(runtime),
        })
    }

    /// Stops the replica at once, as a crash would.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct ProvisionArgs {
    name: String,
}

/// The replica's server: the tool, and who serves its tasks.
#[derive(Clone)]
struct Provisioner {
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
    async fn new(mode: &Mode, sink: Sink, options: &TasksOptions) -> Result<Self, BoxError> {
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
                let idem = IdempotentTools::new(Executor::from_arc(store).with_policy(policy))
                    .principal_with(|cx| {
                        let parts = cx.extensions.get::<http::request::Parts>()?;
                        Some(parts.headers.get("x-tenant-id")?.to_str().ok()?.to_owned())
                    })
                    .tasks(demo_secret())
                    .tool(
                        "provision",
                        ToolSettings::window(options.tool_latency)
                            .tasks(true)
                            .poll_interval(options.poll_interval()),
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
