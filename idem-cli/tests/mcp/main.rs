//! `idem serve --mcp`, the binary, driven by rmcp's own client over stdio and streamable HTTP on
//! loopback. Every test counts tickets at the sink: the rows of the `tickets` table (a fresh
//! SQLite file per test, or a tenant of its own on PostgreSQL), or the tenant's list on Redis.
//!
//! - `transports`: keys, refusals, the published contract and scopes, over both transports;
//! - `keyless`: stock clients that send no key, per `--key-source`;
//! - `wait`: a retry that waits for the first call's result;
//! - `shared_store`: two server processes on one PostgreSQL or Redis store;
//! - `tasks`: MCP tasks across two server processes on one store, the holder killed mid-task.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;

use idem_conformance::kit::{self, TempDir};
use idem_core::{IdempotencyKey, KeyStore, Record, RecordId, Scope, Timestamp};
use rmcp::RoleClient;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, RequestMetaObject};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

type Client = RunningService<RoleClient, ClientConfig>;

#[derive(Clone, Copy, Debug)]
enum Transport {
    Stdio,
    Http,
}

/// A server of one transport on one store: over HTTP one process, started now; over stdio one
/// process per client, started by [`Server::connect`]. Its processes' logs go to one file.
struct Server {
    store: String,
    /// The arguments of `idem serve --mcp` besides the transport and the store.
    args: Vec<String>,
    http: Option<(Child, String)>,
    log: PathBuf,
    /// The SQLite file of a test of its own, and the log.
    dir: TempDir,
}

impl Server {
    /// A server on a fresh SQLite file, with `args`.
    async fn start(transport: Transport, args: &[&str]) -> Self {
        let dir = kit::temp_dir("idem-mcp");
        let store = format!("sqlite://{}", dir.path().join("idem.db").display());
        Self::start_in(dir, transport, &store, args).await
    }

    /// A server on `store`, with `args`.
    async fn start_on(transport: Transport, store: &str, args: &[&str]) -> Self {
        Self::start_in(kit::temp_dir("idem-mcp"), transport, store, args).await
    }

    async fn start_in(dir: TempDir, transport: Transport, store: &str, args: &[&str]) -> Self {
        let log = dir.path().join("server.log");
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let http = match transport {
            Transport::Stdio => None,
            Transport::Http => {
                let mut child = idem(store, &log)
                    .args(["--addr", "127.0.0.1:0"])
                    .args(&args)
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap();
                let mut line = String::new();
                BufReader::new(child.stdout.take().unwrap())
                    .read_line(&mut line)
                    .await
                    .unwrap();
                let url = line
                    .trim()
                    .strip_prefix("listening on ")
                    .unwrap_or_else(|| {
                        let log = std::fs::read_to_string(&log).unwrap_or_default();
                        panic!("unexpected first line {line:?}; the server said {log}")
                    })
                    .to_owned();
                Some((child, url))
            }
        };
        Self {
            store: store.to_owned(),
            args,
            http,
            log,
            dir,
        }
    }

    /// A new rmcp client as `tenant`: over stdio a server process of its own (with `--principal
    /// TENANT`), over HTTP a connection sending `x-tenant-id: TENANT`.
    async fn connect(&self, tenant: Option<&str>) -> Client {
        match &self.http {
            None => {
                let command = idem(&self.store, &self.log);
                let (transport, _) = TokioChildProcess::builder(command.configure(|cmd| {
                    cmd.arg("--stdio").args(&self.args);
                    if let Some(t) = tenant {
                        cmd.args(["--principal", t]);
                    }
                }))
                .stderr(self.log_file())
                .spawn()
                .unwrap();
                ClientConfig::default().serve(transport).await.unwrap()
            }
            Some((_, url)) => http_client(url, tenant).await,
        }
    }

    /// The `idem serve --mcp --stdio` command of this server, for a client written by hand.
    fn stdio_command(&self) -> Command {
        let mut command = idem(&self.store, &self.log);
        command.arg("--stdio").args(&self.args);
        command
    }

    /// Every ticket in the server's SQLite file.
    fn tickets(&self) -> i64 {
        idemkit::sqlite::rusqlite::Connection::open(self.dir.path().join("idem.db"))
            .unwrap()
            .query_row("SELECT COUNT(*) FROM tickets", [], |r| r.get(0))
            .unwrap()
    }

    /// The server's store, opened by the test to read records.
    async fn open_store(&self) -> std::sync::Arc<dyn KeyStore> {
        idemkit::open(self.store.as_str()).await.unwrap()
    }

    fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `idem serve --mcp --store STORE`, logging to `log` (the events of `idem_core` included).
fn idem(store: &str, log: &std::path::Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut command = Command::new(IDEM);
    command
        .env_remove("IDEM_STORE")
        .env("RUST_LOG", "warn,idem_core=info")
        .args(["serve", "--mcp", "--store", store])
        .stderr(log);
    command
}

/// A streamable HTTP client of `url` as `tenant` (`x-tenant-id`).
async fn http_client(url: &str, tenant: Option<&str>) -> Client {
    http_client_result(url, tenant).await.unwrap()
}

/// [`http_client`], or why it could not connect.
async fn http_client_result(
    url: &str,
    tenant: Option<&str>,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let mut headers = HashMap::new();
    if let Some(t) = tenant {
        headers.insert(
            axum::http::HeaderName::from_static("x-tenant-id"),
            axum::http::HeaderValue::from_str(t).unwrap(),
        );
    }
    // reqwest in this workspace has rustls without a provider of its own.
    idem_http::client::install_crypto_provider();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers),
    );
    ClientConfig::default().serve(transport).await
}

fn args(title: &str) -> Option<serde_json::Map<String, Value>> {
    json!({"title": title, "account_id": "A-7"})
        .as_object()
        .cloned()
}

/// A `create_ticket` call with `key` in `_meta`.
fn keyed(key: &str, title: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("create_ticket");
    params.arguments = args(title);
    let mut meta = RequestMetaObject::new();
    meta.0.0.insert(idem_mcp::META_KEY.into(), json!(key));
    params.meta = Some(meta);
    params
}

/// The record of `key` in `tenant`'s scope of `create_ticket`, as `store` holds it now.
async fn record(store: &dyn KeyStore, tenant: &str, key: &str) -> Option<Record> {
    let id = RecordId::new(
        Scope::from_parts([tenant, "create_ticket"]).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    );
    store.get(&id, Timestamp::now()).await.unwrap()
}

/// Returns `key`'s record once a server has claimed it, polling `store` (the servers are other
/// processes: their store is what the test can watch).
async fn until_claimed(store: &dyn KeyStore, tenant: &str, key: &str) -> Record {
    let claimed = async {
        loop {
            if let Some(found) = record(store, tenant, key).await {
                return found;
            }
            // A poll's pause, not a wait for anything.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    // A guard against a hang, never a measure.
    tokio::time::timeout(std::time::Duration::from_secs(60), claimed)
        .await
        .unwrap_or_else(|_| panic!("{key} was never claimed"))
}

fn ticket_id(result: &CallToolResult) -> String {
    result.structured_content.as_ref().unwrap()["ticket_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn mcp_error(e: ServiceError) -> rmcp::model::ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => panic!("expected a JSON-RPC error, got {other}"),
    }
}

/// One `#[tokio::test]` per transport for each test function named.
macro_rules! on_both_transports {
    ($($name:ident),* $(,)?) => {
        mod stdio {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Transport::Stdio).await;
                }
            )*
        }
        mod streamable_http {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Transport::Http).await;
                }
            )*
        }
    };
}

mod keyless;
mod shared_store;
mod tasks;
mod transports;
mod wait;
