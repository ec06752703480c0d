//! Waiting for an in-flight result over MCP ([contract §5.2](idem_core::contract#waiting)): a
//! real rmcp client calls the example server (`idem-mcp-ticket-server`, a child process) over
//! stdio and over streamable HTTP; a retry sent while the first call runs asks to wait
//! (`IdempotentCaller`'s default) and gets the replay, never "in flight". Tickets are counted in
//! the server's SQLite file. The tool takes 300 ms and the retry is sent 50 ms after the first
//! call: real latency, kept short.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use idem_core::IdempotencyKey;
use idem_mcp::client::{IdempotentCaller, RetryPolicy};
use idem_mcp::server::TOOL_META_KEY;
use idem_store_sqlite::rusqlite;
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::model::ClientConfig;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

const SERVER: &str = env!("CARGO_BIN_EXE_idem-mcp-ticket-server");
const LATENCY_MS: u64 = 300;

type Client = RunningService<RoleClient, ClientConfig>;

struct Server {
    db: PathBuf,
    http: Option<(Child, String)>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(http: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("tickets.sqlite3");
        let http = if http {
            let mut child = Command::new(SERVER)
                .args(["--http", "127.0.0.1:0", "--db"])
                .arg(&db)
                .args(["--latency-ms", &LATENCY_MS.to_string()])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut line = String::new();
            tokio::io::BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .await
                .unwrap();
            let url = line
                .trim()
                .strip_prefix("listening on ")
                .unwrap()
                .to_owned();
            Some((child, url))
        } else {
            None
        };
        Self {
            db,
            http,
            _dir: dir,
        }
    }

    /// A client: over stdio, a server process of its own on the same SQLite file (so the waiter
    /// and the first call are in two processes); over HTTP, a connection to the one server.
    async fn connect(&self) -> Client {
        match &self.http {
            None => {
                let db = self.db.clone();
                let transport = TokioChildProcess::new(Command::new(SERVER).configure(|cmd| {
                    cmd.arg("--db")
                        .arg(&db)
                        .args(["--latency-ms", &LATENCY_MS.to_string()])
                        .args(["--principal", "tenant-t"]);
                }))
                .unwrap();
                ClientConfig::default().serve(transport).await.unwrap()
            }
            Some((_, url)) => {
                let mut headers = HashMap::new();
                headers.insert(
                    http::HeaderName::from_static("x-tenant-id"),
                    http::HeaderValue::from_static("tenant-t"),
                );
                let _ = rustls::crypto::ring::default_provider().install_default();
                let transport = StreamableHttpClientTransport::from_config(
                    StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .custom_headers(headers),
                );
                ClientConfig::default().serve(transport).await.unwrap()
            }
        }
    }

    fn tickets(&self) -> i64 {
        rusqlite::Connection::open(&self.db)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM tickets", [], |r| r.get(0))
            .unwrap()
    }
}

async fn retry_waits_for_the_first_result(http: bool) {
    let server = Server::start(http).await;
    let (a, b) = (server.connect().await, server.connect().await);
    let tools = a.peer().list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    let published = &tool.meta.as_ref().unwrap().0[TOOL_META_KEY];
    assert!(published["maxWaitMs"].as_u64().unwrap() > 0, "{published}");
    assert!(
        tool.description
            .as_deref()
            .unwrap()
            .contains("io.idem/wait"),
        "the description says how to wait"
    );
    let key = IdempotencyKey::new("wf-1:step-1:create_ticket").unwrap();
    let args = json!({"title": "Printer on fire", "account_id": "A-7"})
        .as_object()
        .cloned();
    let first = {
        let (caller, key, args) = (
            IdempotentCaller::new(a.peer().clone(), RetryPolicy::default()),
            key.clone(),
            args.clone(),
        );
        tokio::spawn(async move { caller.call("create_ticket", args, &key, None).await })
    };
    // Real latency: the retry leaves 50 ms into the first call's 300 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = IdempotentCaller::new(b.peer().clone(), RetryPolicy::default())
        .call("create_ticket", args, &key, None)
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(!first.replayed && again.replayed, "the retry replays");
    assert_eq!(again.in_flight, 0, "never told 'in flight': it waited");
    assert_eq!(again.attempts, 1);
    let text = |r: &rmcp::model::CallToolResult| -> Value {
        r.structured_content.clone().unwrap_or_default()
    };
    assert_eq!(text(&first.result), text(&again.result));
    assert_eq!(server.tickets(), 1, "one ticket");
}

#[tokio::test]
async fn over_http_a_retry_sent_50ms_into_a_300ms_call_waits_and_replays() {
    retry_waits_for_the_first_result(true).await;
}

#[tokio::test]
async fn over_stdio_from_another_process_a_retry_sent_50ms_into_a_300ms_call_waits_and_replays() {
    retry_waits_for_the_first_result(false).await;
}
