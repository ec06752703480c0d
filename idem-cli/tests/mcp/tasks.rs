//! MCP tasks across processes ([contract §5.3](idem_core::contract#tasks)): two `idem serve
//! --mcp --task-secret-file` processes on one store (PostgreSQL, Redis, an SQLite file), each
//! reached by an rmcp client of MCP 2026-07-28 that declares the tasks extension (stateless
//! streamable HTTP). A task-augmented call whose answer is dropped is sent again to the other
//! process: the same task id; polls alternate between the processes until `completed` with the
//! result; one ticket at the sink. Then a process whose tool outlasts the test (so it is killed
//! mid-task, whatever the machine's load) holds a task and is killed: the task is still reported
//! `working` (never lost), by another process and by a new one, whose claim finds the lease
//! running and runs nothing (the record is the killed holder's claim, untouched).

use std::collections::HashMap;
use std::time::Duration;

use idem_conformance::kit;
use rmcp::model::{
    CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams, GetTaskResult,
    Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::shared_store::Sink;
use crate::{Client, Server, Transport, keyed, record};

/// A client of `server` as `tenant` that declares the tasks extension (no session).
async fn tasks_client(server: &Server, tenant: &str) -> Client {
    let url = &server.http.as_ref().unwrap().1;
    let mut headers = HashMap::new();
    headers.insert(
        axum::http::HeaderName::from_static("x-tenant-id"),
        axum::http::HeaderValue::from_str(tenant).unwrap(),
    );
    idem_http::client::install_crypto_provider();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers),
    );
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("tasks-test", "1.0.0"),
    )
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap()
}

async fn task_of(client: &Client, key: &str) -> String {
    match client
        .peer()
        .call_tool_once(keyed(key, "provision"))
        .await
        .unwrap()
    {
        CallToolResponse::Task(created) => created.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn get(client: &Client, id: &str) -> GetTaskResult {
    client
        .peer()
        .get_task(GetTaskParams::new(id))
        .await
        .unwrap()
}

/// The tickets of `tenant` at the sink.
async fn tickets(backend: &str, url: &str, tenant: &str) -> usize {
    match backend {
        "sqlite" => {
            let path = url.strip_prefix("sqlite://").unwrap();
            let count: i64 = idemkit::sqlite::rusqlite::Connection::open(path)
                .unwrap()
                .query_row(
                    "SELECT COUNT(*) FROM tickets WHERE tenant = ?1",
                    [tenant],
                    |r| r.get(0),
                )
                .unwrap();
            count as usize
        }
        _ => Sink::open(backend, url)
            .await
            .ticket_keys(tenant)
            .await
            .len(),
    }
}

async fn two_processes_one_task(backend: &str) {
    let Some((url, _dir)) = kit::store_url(backend, "idem.db") else {
        return;
    };
    let secret = kit::temp_dir("idem-task-secret");
    let secret_file = secret.path().join("secret");
    std::fs::write(&secret_file, format!("{}\n", "ab".repeat(32))).unwrap();
    let secret_file = secret_file.display().to_string();
    let tenant = kit::unique("mcp-tasks");
    let args = [
        "--tool-latency-ms",
        "200",
        "--task-secret-file",
        &secret_file,
    ];
    // Ten minutes: the test never sees this tool finish.
    let stuck = [
        "--tool-latency-ms",
        "600000",
        "--task-secret-file",
        &secret_file,
    ];
    let a = Server::start_on(Transport::Http, &url, &args).await;
    let b = Server::start_on(Transport::Http, &url, &args).await;
    let (to_a, to_b) = (
        tasks_client(&a, &tenant).await,
        tasks_client(&b, &tenant).await,
    );

    // The first answer lost: the same call again, to the other process.
    let id = task_of(&to_a, "wf-1:step-1").await;
    assert_eq!(task_of(&to_b, "wf-1:step-1").await, id, "one key, one task");
    let mut polls = 0;
    let done = loop {
        let got = get(if polls % 2 == 0 { &to_b } else { &to_a }, &id).await;
        match got.task.status() {
            status if status.is_terminal() => break got,
            status => assert_eq!(status, TaskStatus::Working),
        }
        polls += 1;
        // A guard against a hang, never a measure (the tool takes 200 ms).
        assert!(polls < 1200, "the task never finished");
        // A poll's pause, as a client's `pollInterval`.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("completed, got {:?}", done.task.payload)
    };
    assert!(
        result["structuredContent"]["ticket_id"].is_string(),
        "{result:?}"
    );
    assert_eq!(tickets(backend, &url, &tenant).await, 1);

    // A holder killed mid-task, then a new process: the task is reported, never lost, and not
    // run again while its lease runs.
    let store = idemkit::open(url.as_str()).await.unwrap();
    let holder = Server::start_on(Transport::Http, &url, &stuck).await;
    let to_holder = tasks_client(&holder, &tenant).await;
    let id = task_of(&to_holder, "wf-2:step-1").await;
    assert_eq!(get(&to_b, &id).await.task.status(), TaskStatus::Working);
    let claimed = record(&*store, &tenant, "wf-2:step-1").await.unwrap();
    assert_eq!(claimed.state, idem_core::RecordState::Processing);
    drop(to_holder);
    let mut holder = holder;
    holder.http.as_mut().unwrap().0.kill().await.unwrap();
    assert_eq!(get(&to_b, &id).await.task.status(), TaskStatus::Working);
    let restarted = Server::start_on(Transport::Http, &url, &args).await;
    let to_restarted = tasks_client(&restarted, &tenant).await;
    assert_eq!(task_of(&to_restarted, "wf-2:step-1").await, id);
    assert_eq!(
        get(&to_restarted, &id).await.task.status(),
        TaskStatus::Working
    );
    // The new process answered once its claim had been decided: a claim of its own would have
    // replaced the holder's token and started the tool, so an unchanged record shows it ran
    // nothing.
    let after = record(&*store, &tenant, "wf-2:step-1").await.unwrap();
    assert_eq!(
        (after.state, after.token, after.attempt),
        (claimed.state, claimed.token, claimed.attempt),
        "the killed holder's claim, untouched"
    );
    assert_eq!(
        tickets(backend, &url, &tenant).await,
        1,
        "the killed holder's tool made no ticket, and nothing ran it again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_sqlite_file_one_task() {
    two_processes_one_task("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_postgres_store_one_task() {
    two_processes_one_task("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_redis_store_one_task() {
    two_processes_one_task("redis").await;
}
