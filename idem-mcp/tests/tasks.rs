//! MCP tasks served from the store ([contract §5.3](idem_core::contract#tasks)): two
//! `IdempotentTools` servers, each with a store handle of its own on one SQLite file, serve
//! stateless streamable HTTP to real rmcp clients that declare the tasks extension (MCP
//! 2026-07-28, `server/discover`, capabilities in every request's `_meta`). Calls, retries and
//! polls alternate between the two; effects are counted at the sink, a list every server writes
//! the provisioned name to after the tool's work.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use idem_core::{IdempotencyKey, KeyStore, OutcomeClass, Policy, RecordId, StalePolicy, Timestamp};
use idem_mcp::{IdempotentTools, ToolSettings, is_replay};
use idem_store_sqlite::SqliteStore;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, ContentBlock, ErrorCode, ErrorData, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, RequestMetaObject,
    ServerCapabilities, ServerConfig, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleClient, RoleServer, ServerHandler, schemars, tool, tool_router};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const SECRET: [u8; 32] = [42; 32];
const LATENCY: Duration = Duration::from_millis(400);

/// The system the tool acts on: every provisioned name, in order, whichever server ran it.
type Sink = Arc<Mutex<Vec<String>>>;

/// The names whose provisioning a test holds: the tool, once it runs, waits until the test
/// releases its name, so the test knows the task is running for as long as it holds it.
static HELD: LazyLock<watch::Sender<HashSet<String>>> =
    LazyLock::new(|| watch::Sender::new(HashSet::new()));

fn hold(name: &str) {
    HELD.send_modify(|held| {
        held.insert(name.to_owned());
    });
}

fn release(name: &str) {
    HELD.send_modify(|held| {
        held.remove(name);
    });
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct ProvisionArgs {
    name: String,
    /// Fails (a JSON-RPC error, retryable) instead of provisioning.
    #[serde(default)]
    fail: bool,
    /// Answers an `isError` result (retryable, as the tool is set up) instead of provisioning.
    #[serde(default)]
    reject: bool,
}

#[derive(Clone)]
struct Provisioner {
    idem: IdempotentTools,
    sink: Sink,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Provisioner {
    #[tool(description = "Names a server (no task: answered at once).")]
    async fn rename(&self) -> CallToolResult {
        self.sink.lock().unwrap().push("renamed".to_owned());
        CallToolResult::success(vec![ContentBlock::text("renamed")])
    }

    #[tool(description = "Provisions a server (slow).")]
    async fn provision(
        &self,
        Parameters(args): Parameters<ProvisionArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let _ = HELD
            .subscribe()
            .wait_for(|held| !held.contains(&args.name))
            .await;
        tokio::time::sleep(LATENCY).await;
        if args.fail {
            return Err(ErrorData::internal_error("the provider is down", None));
        }
        if args.reject {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "quota exceeded",
            )]));
        }
        self.sink.lock().unwrap().push(args.name.clone());
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "provisioned {}",
            args.name
        ))]))
    }
}

impl ServerHandler for Provisioner {
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
        Ok(ListToolsResult::with_all_items(
            self.idem.describe(self.tool_router.list_all()),
        ))
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

    async fn get_task(
        &self,
        params: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.idem.get_task(params, context).await
    }

    async fn cancel_task(
        &self,
        params: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.idem.cancel_task(params, context).await
    }
}

/// The principal: the `x-tenant-id` header (a stand-in for authentication).
fn tenant(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    Some(parts.headers.get("x-tenant-id")?.to_str().ok()?.to_owned())
}

/// One server: a store handle of its own on `db`, stateless streamable HTTP on a free port.
struct Replica {
    url: String,
    stop: CancellationToken,
}

impl Replica {
    async fn start(db: &std::path::Path, sink: &Sink, policy: Policy) -> Self {
        let store = SqliteStore::open(db).unwrap();
        store.migrate().unwrap();
        let tool = |tasks| {
            idem_core::Tool::builder()
                .policy(policy)
                .processing_window(Duration::from_secs(2))
                .tasks(tasks)
                .build()
                .unwrap()
        };
        let idem = IdempotentTools::with_store(store)
            .principal_with(tenant)
            .tasks(SECRET)
            .tool(
                "provision",
                ToolSettings::new(tool(true))
                    .tool_error(OutcomeClass::Retryable)
                    .poll_interval(Duration::from_millis(50)),
            )
            // Protected, but never a task.
            .tool("rename", ToolSettings::new(tool(false)));
        let server = Provisioner {
            idem,
            sink: sink.clone(),
            tool_router: Provisioner::tool_router(),
        };
        let stop = CancellationToken::new();
        let config = StreamableHttpServerConfig::default()
            .with_sse_keep_alive(None)
            .with_cancellation_token(stop.clone());
        let service: StreamableHttpService<Provisioner, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
        let router = axum::Router::new().nest_service("/mcp", service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let token = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
        });
        Self { url, stop }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type Client = RunningService<RoleClient, ClientConfig>;

/// A client of `replica` for `tenant`, declaring the tasks extension (or not).
async fn connect(replica: &Replica, tenant: &'static str, tasks: bool) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = HashMap::new();
    headers.insert(
        http::HeaderName::from_static("x-tenant-id"),
        http::HeaderValue::from_static(tenant),
    );
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(replica.url.as_str()).custom_headers(headers),
    );
    let capabilities = match tasks {
        true => ClientCapabilities::builder().enable_tasks().build(),
        false => ClientCapabilities::default(),
    };
    ClientConfig::new(capabilities, Implementation::new("tasks-test", "1.0.0"))
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap()
}

fn provision(name: &str, key: &str, fail: bool) -> CallToolRequestParams {
    call("provision", key, json!({"name": name, "fail": fail}))
}

fn call(tool: &'static str, key: &str, arguments: Value) -> CallToolRequestParams {
    let mut meta = RequestMetaObject::new();
    meta.0
        .0
        .insert(idem_mcp::key::META_KEY.to_owned(), json!(key));
    let mut params =
        CallToolRequestParams::new(tool).with_arguments(arguments.as_object().cloned().unwrap());
    params.meta = Some(meta);
    params
}

/// The task id a task-augmented call answered with.
async fn create(client: &Client, params: CallToolRequestParams) -> (String, TaskStatus) {
    match client.peer().call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(created) => (created.task.task_id, created.task.status),
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn get(client: &Client, id: &str) -> Result<GetTaskResult, rmcp::ServiceError> {
    client.peer().get_task(GetTaskParams::new(id)).await
}

/// Polls `id` through `clients` in turn until it is terminal.
async fn until_terminal(clients: &[&Client], id: &str) -> (GetTaskResult, usize) {
    for polls in 1..200 {
        let got = get(clients[polls % clients.len()], id).await.unwrap();
        if got.task.status().is_terminal() {
            return (got, polls);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {id} never finished");
}

fn code(error: rmcp::ServiceError) -> (ErrorCode, Value) {
    match error {
        rmcp::ServiceError::McpError(e) => (e.code, e.data.unwrap_or_default()),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_retried_task_call_gets_the_same_task_from_either_replica_and_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let (one, two) = (
        Replica::start(&db, &sink, policy()).await,
        Replica::start(&db, &sink, policy()).await,
    );
    let (a, b) = (
        connect(&one, "tenant-a", true).await,
        connect(&two, "tenant-a", true).await,
    );

    hold("db-1");
    let (id, status) = create(&a, provision("db-1", "order-1", false)).await;
    assert_eq!(status, TaskStatus::Working);
    // Its answer lost: the same call again, through the other replica, while it runs.
    let (again, _) = create(&b, provision("db-1", "order-1", false)).await;
    assert_eq!(again, id, "one key, one task");
    assert_eq!(
        get(&b, &id).await.unwrap().task.status(),
        TaskStatus::Working
    );
    release("db-1");

    let (done, _) = until_terminal(&[&a, &b], &id).await;
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("completed, got {:?}", done.task.payload)
    };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    assert!(is_replay(&result), "the stored result, replay-marked");
    assert_eq!(
        result.content[0].as_text().unwrap().text,
        "provisioned db-1"
    );
    // The record's times: created when the call was, kept for the policy's ttl (24 h) from its
    // completion, so the task's ttl from creation is that and the tool's time.
    let task = &done.task.task;
    let ttl = Duration::from_millis(task.ttl_ms.unwrap()) - Duration::from_secs(24 * 3600);
    assert!(ttl >= LATENCY && ttl < Duration::from_secs(60), "{ttl:?}");
    assert_eq!(task.poll_interval_ms, Some(50));
    let created = humantime::parse_rfc3339(&task.created_at).unwrap();
    let updated = humantime::parse_rfc3339(&task.last_updated_at).unwrap();
    let age = std::time::SystemTime::now()
        .duration_since(created)
        .unwrap();
    assert!(age < Duration::from_secs(60), "created {age:?} ago");
    assert!(
        updated.duration_since(created).unwrap() >= LATENCY,
        "updated at completion"
    );

    // Once done, the same call again still names the same task, finished; nothing ran again.
    assert_eq!(
        create(&a, provision("db-1", "order-1", false)).await,
        (id.clone(), TaskStatus::Completed)
    );
    assert_eq!(*sink.lock().unwrap(), ["db-1"], "one effect at the sink");
}

#[tokio::test]
async fn a_task_survives_its_server_and_another_principal_never_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let one = Replica::start(&db, &sink, policy()).await;
    let a = connect(&one, "tenant-a", true).await;
    let (id, _) = create(&a, provision("db-2", "order-2", false)).await;

    // Another principal, on the same server: the id is unknown to it, and its cancel changes
    // nothing.
    let mallory = connect(&one, "tenant-m", true).await;
    let (unknown, _) = code(get(&mallory, &id).await.unwrap_err());
    assert_eq!(unknown, ErrorCode::INVALID_PARAMS);
    let cancel = mallory
        .peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap_err();
    assert_eq!(code(cancel).0, ErrorCode::INVALID_PARAMS);
    // A forged id: unknown too.
    let (forged, _) = code(
        get(&a, "t1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
            .await
            .unwrap_err(),
    );
    assert_eq!(forged, ErrorCode::INVALID_PARAMS);

    // The server goes; a new one on the same file answers for the task.
    drop(a);
    drop(one);
    let restarted = Replica::start(&db, &sink, policy()).await;
    let a = connect(&restarted, "tenant-a", true).await;
    let (done, _) = until_terminal(&[&a], &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    assert_eq!(*sink.lock().unwrap(), ["db-2"]);
}

#[tokio::test]
async fn a_running_task_is_not_cancelled_and_a_failed_one_is_cancelled_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let one = Replica::start(&db, &sink, policy()).await;
    let a = connect(&one, "tenant-a", true).await;

    // Running: its effect may happen any moment; cancel says so and the task completes.
    hold("db-3");
    let (id, _) = create(&a, provision("db-3", "order-3", false)).await;
    let refused = a
        .peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap_err();
    let (refused, data) = code(refused);
    assert_eq!(
        (refused, data["type"].as_str()),
        (ErrorCode::INVALID_REQUEST, Some("task-running"))
    );
    release("db-3");
    assert_eq!(
        until_terminal(&[&a], &id).await.0.task.status(),
        TaskStatus::Completed
    );
    // Finished: cancel changes nothing.
    let finished = a
        .peer()
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .unwrap_err();
    assert_eq!(code(finished).1["type"], "task-finished");

    // Failed (the tool returned an error): `failed`, and the same call again would run it again.
    let (failed, _) = create(&a, provision("db-4", "order-4", true)).await;
    let (got, _) = until_terminal(&[&a], &failed).await;
    let TaskPayload::Failed { error } = got.task.payload else {
        panic!("failed, got {:?}", got.task.payload)
    };
    assert_eq!(error["message"], "the provider is down");
    // An `isError` result the tool's settings call retryable: `failed` with that result.
    let (rejected, _) = create(
        &a,
        call(
            "provision",
            "order-7",
            json!({"name": "db-7", "reject": true}),
        ),
    )
    .await;
    let (got, _) = until_terminal(&[&a], &rejected).await;
    let TaskPayload::Failed { error } = got.task.payload else {
        panic!("failed, got {:?}", got.task.payload)
    };
    assert_eq!(
        error["data"]["content"][0]["text"], "quota exceeded",
        "{error:?}"
    );
    // Cancelled now, before it runs again: for good.
    a.peer()
        .cancel_task(CancelTaskParams::new(failed.clone()))
        .await
        .unwrap();
    assert_eq!(
        get(&a, &failed).await.unwrap().task.status(),
        TaskStatus::Cancelled
    );
    let (again, status) = create(&a, provision("db-4", "order-4", true)).await;
    assert_eq!((again, status), (failed, TaskStatus::Cancelled));
    assert_eq!(
        *sink.lock().unwrap(),
        ["db-3"],
        "the cancelled task never ran its effect"
    );
}

#[tokio::test]
async fn a_crashed_holder_is_reported_working_with_what_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let one = Replica::start(&db, &sink, policy()).await;
    let a = connect(&one, "tenant-a", true).await;
    // A holder that claimed and died: the record, written by hand, with a lease long gone.
    let store = SqliteStore::open(&db).unwrap();
    let scope = idem_core::Scope::from_parts(["tenant-a", "provision"]).unwrap();
    let key = IdempotencyKey::new("order-5").unwrap();
    let args = json!({"name": "db-5", "fail": false});
    let fingerprint = idem_core::Fingerprint::of_value("provision", &args).unwrap();
    let past = Timestamp::from_millis(Timestamp::now().as_millis() - 60_000);
    let claim = store
        .claim(
            &RecordId::new(scope.clone(), key.clone()),
            &fingerprint,
            &policy(),
            past,
        )
        .await
        .unwrap();
    let idem_core::machine::ClaimAnswer::Claimed { token, .. } = claim else {
        panic!("claimed, got {claim:?}")
    };

    // The same call: the same task, still in flight (Reconcile, the default stale policy);
    // nothing runs again.
    let (id, status) = create(&a, provision("db-5", "order-5", false)).await;
    assert_eq!(status, TaskStatus::Working);
    let got = get(&a, &id).await.unwrap();
    assert_eq!(got.task.status(), TaskStatus::Working);
    let message = got.task.task.status_message.unwrap();
    assert!(message.contains("awaiting reconciliation"), "{message}");
    // The server answered once its claim had been decided: a claim of its own would have
    // replaced the dead holder's token before the tool ran.
    let record = store
        .get(&RecordId::new(scope.clone(), key.clone()), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.token, record.attempt),
        (token, 1),
        "the dead holder's claim"
    );
    assert!(sink.lock().unwrap().is_empty());

    // Under Takeover, a server says the next call takes it over, and that call runs it.
    let takeover = Policy::builder()
        .lease(Duration::from_secs(5))
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap();
    let two = Replica::start(&db, &sink, takeover).await;
    let b = connect(&two, "tenant-a", true).await;
    let message = get(&b, &id)
        .await
        .unwrap()
        .task
        .task
        .status_message
        .unwrap();
    assert!(message.contains("takes it over"), "{message}");
    assert_eq!(create(&b, provision("db-5", "order-5", false)).await.0, id);
    assert_eq!(
        until_terminal(&[&b], &id).await.0.task.status(),
        TaskStatus::Completed
    );
    assert_eq!(*sink.lock().unwrap(), ["db-5"]);
}

#[tokio::test]
async fn a_client_without_the_extension_gets_the_result_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let one = Replica::start(&db, &sink, policy()).await;
    let plain = connect(&one, "tenant-a", false).await;
    let result = plain
        .peer()
        .call_tool(provision("db-6", "order-6", false))
        .await
        .unwrap();
    assert!(!is_replay(&result));
    let again = plain
        .peer()
        .call_tool(provision("db-6", "order-6", false))
        .await
        .unwrap();
    assert!(is_replay(&again));
    // A protected tool that does not allow tasks answers a client that declared them as before.
    let tasked = connect(&one, "tenant-a", true).await;
    for replayed in [false, true] {
        let renamed = tasked
            .peer()
            .call_tool(call("rename", "rename-1", json!({})))
            .await
            .unwrap();
        assert_eq!(is_replay(&renamed), replayed);
    }
    // Its tasks/* requests are refused by rmcp: it did not declare the extension.
    assert!(get(&plain, "t1.x").await.is_err());
    assert_eq!(*sink.lock().unwrap(), ["db-6", "renamed"]);
}

/// A store that fails under `tasks/get` is the store's refusal to the caller, typed as the
/// contract's ([contract §5.3](idem_core::contract#tasks)), not an empty error: here the
/// records table is taken away behind the server's back.
#[tokio::test]
async fn a_store_that_fails_under_tasks_get_is_a_typed_store_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let sink = Sink::default();
    let one = Replica::start(&db, &sink, policy()).await;
    let a = connect(&one, "tenant-a", true).await;
    let (id, _) = create(&a, provision("db-9", "order-9", false)).await;
    let (done, _) = until_terminal(&[&a], &id).await;
    assert_eq!(done.task.status(), TaskStatus::Completed);
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("DROP TABLE idem_records")
        .unwrap();
    let (error, data) = code(get(&a, &id).await.unwrap_err());
    assert_eq!(error, ErrorCode::INTERNAL_ERROR, "{data}");
    assert_eq!(data["type"], "urn:idem:problem:store-error", "{data}");
}
