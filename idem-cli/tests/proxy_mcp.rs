//! `idem proxy --mcp` in front of MCP servers nobody here wrote (tests/upstreams: the official
//! Python SDK's and TypeScript SDK's, installed by scripts/services/upstreams.sh), over
//! streamable HTTP and as a stdio child: every effect counted in the upstream's own sink, with
//! the `_meta` key it received.

mod proxy_kit;

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use idem_conformance::kit;
use proxy_kit::{IDEM, Running, Scratch};
use serde_json::{Value, json};

const UPSTREAMS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstreams");

/// Which upstream.
#[derive(Clone, Copy)]
enum Sdk {
    Python,
    TypeScript,
}

impl Sdk {
    /// The upstream's command line, its sink in `dir`; `None` (after saying why) when
    /// scripts/services/upstreams.sh has not run.
    fn command(self, dir: &Path) -> Option<Vec<String>> {
        let hint = "source scripts/services/upstreams.sh; scripts/test does";
        Some(match self {
            Sdk::Python => vec![
                kit::env_url("IDEM_TEST_UPSTREAM_PYTHON", hint)?,
                format!("{UPSTREAMS}/mcp_tool.py"),
                "--sink".into(),
                dir.join("tickets.db").display().to_string(),
            ],
            Sdk::TypeScript => vec![
                "node".into(),
                kit::env_url("IDEM_TEST_UPSTREAM_TS_SERVER", hint)?,
                "--sink".into(),
                dir.join("tickets.jsonl").display().to_string(),
            ],
        })
    }

    /// The effects in the sink: each ticket's `_meta` key.
    fn effects(self, dir: &Path) -> Vec<Option<String>> {
        match self {
            Sdk::Python => {
                let db = idemkit::sqlite::rusqlite::Connection::open(dir.join("tickets.db"));
                let db = db.unwrap();
                let mut rows = db.prepare("SELECT key FROM tickets ORDER BY id").unwrap();
                rows.query_map([], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Sdk::TypeScript => std::fs::read_to_string(dir.join("tickets.jsonl"))
                .unwrap_or_default()
                .lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["key"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect(),
        }
    }
}

/// An MCP client of the proxy: JSON-RPC over streamable HTTP or over the proxy's stdio.
enum Client {
    Http(String),
    Stdio(Child, ChildStdin, Lines<BufReader<ChildStdout>>),
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Client::Stdio(child, ..) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Client {
    async fn request(&mut self, message: Value) -> Value {
        match self {
            Client::Http(url) => {
                let answer = proxy_kit::client()
                    .post(url.as_str())
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2025-06-18")
                    .header("x-tenant-id", "acme")
                    .json(&message)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                if message.get("id").is_none() {
                    return Value::Null; // a notification: 202, no body
                }
                let json = answer
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .find(|l| l.starts_with('{'))
                    .unwrap_or(answer.as_str());
                serde_json::from_str(json).unwrap_or_else(|_| panic!("{answer}"))
            }
            Client::Stdio(_, stdin, lines) => {
                writeln!(stdin, "{message}").unwrap();
                stdin.flush().unwrap();
                if message.get("id").is_none() {
                    return Value::Null;
                }
                serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap()
            }
        }
    }

    async fn initialize(&mut self) {
        let answer = self
            .request(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "idem-test", "version": "1"}}}),
            )
            .await;
        assert!(
            answer["result"]["capabilities"]["tools"].is_object(),
            "{answer}"
        );
        self.request(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    async fn call(&mut self, tool: &str, title: &str, key: Option<&str>) -> Value {
        let mut params = json!({"name": tool, "arguments": {"title": title}});
        if tool == "count_tickets" {
            params["arguments"] = json!({});
        }
        if let Some(key) = key {
            params["_meta"] = json!({"io.idem/idempotencyKey": key});
        }
        self.request(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
            .await
    }
}

/// `idem proxy --mcp` in front of `sdk`'s server, over HTTP or as its stdio child.
fn proxied(
    sdk: Sdk,
    dir: &Scratch,
    stdio: bool,
    args: &[&str],
) -> Option<(Client, Option<proxy_kit::Pair>)> {
    let upstream = sdk.command(&dir.0)?;
    if stdio {
        let mut child = Command::new(IDEM)
            .env_remove("IDEM_STORE")
            .args(["proxy", "--mcp", "--store", &dir.sqlite()])
            .args(args)
            .arg("--")
            .args(&upstream)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        return Some((Client::Stdio(child, stdin, lines), None));
    }
    let mut command = Command::new(&upstream[0]);
    command.args(&upstream[1..]).args(["--http", "0"]);
    let server = Running::start(command);
    let mut command = Command::new(IDEM);
    command
        .env_remove("IDEM_STORE")
        .args([
            "proxy",
            "--mcp",
            "--upstream",
            &server.url,
            "--addr",
            "127.0.0.1:0",
        ])
        .args(["--store", &dir.sqlite()])
        .args(args);
    let proxy = Running::start(command);
    let url = proxy.url.clone();
    // The proxy first: it is dropped (killed) before the upstream.
    Some((Client::Http(url), Some(Running::start_pair(proxy, server))))
}

fn replayed(answer: &Value) -> bool {
    answer["result"]["_meta"]["io.idem/replayed"] == true
}

async fn same_key_twice_one_effect(sdk: Sdk, stdio: bool) {
    let dir = Scratch::new("proxy-mcp");
    let Some((mut client, _servers)) = proxied(sdk, &dir, stdio, &[]) else {
        return;
    };
    client.initialize().await;
    let first = client
        .call("create_ticket", "Printer on fire", Some("wf-1:s-1"))
        .await;
    let again = client
        .call("create_ticket", "Printer on fire", Some("wf-1:s-1"))
        .await;
    assert!(!replayed(&first) && replayed(&again), "{first} {again}");
    assert_eq!(first["result"]["content"], again["result"]["content"]);
    let other = client
        .call("create_ticket", "Another printer", Some("wf-1:s-1"))
        .await;
    assert_eq!(
        other["error"]["data"]["type"],
        "urn:idem:problem:fingerprint-mismatch"
    );
    let refused = client.call("create_ticket", "No key", None).await;
    assert!(
        refused["error"].is_object(),
        "a call without a key is refused: {refused}"
    );
    // The read-only tool passes through every time, unprotected.
    for _ in 0..2 {
        let count = client.call("count_tickets", "", None).await;
        assert_eq!(count["result"]["content"][0]["text"], "1");
        assert!(count["result"]["_meta"]["io.idem/replayed"].is_null());
    }
    let effects = sdk.effects(&dir.0);
    assert_eq!(effects.len(), 1, "one effect at the upstream's sink");
    let key = effects[0].clone().expect("the downstream key in _meta");
    assert!(key.starts_with("idem-") && key != "wf-1:s-1", "{key}");
}

#[tokio::test]
async fn python_over_http_same_key_twice_is_one_effect() {
    same_key_twice_one_effect(Sdk::Python, false).await;
}

#[tokio::test]
async fn python_as_a_stdio_child_same_key_twice_is_one_effect() {
    same_key_twice_one_effect(Sdk::Python, true).await;
}

#[tokio::test]
async fn typescript_over_http_same_key_twice_is_one_effect() {
    same_key_twice_one_effect(Sdk::TypeScript, false).await;
}

#[tokio::test]
async fn typescript_as_a_stdio_child_same_key_twice_is_one_effect() {
    same_key_twice_one_effect(Sdk::TypeScript, true).await;
}

#[tokio::test]
async fn six_identical_keyless_calls_with_arguments_keys_are_one_effect_and_six_answers() {
    let dir = Scratch::new("proxy-mcp-keyless");
    let Some((client, _servers)) =
        proxied(Sdk::Python, &dir, false, &["--key-source", "arguments"])
    else {
        return;
    };
    let Client::Http(url) = &client else {
        unreachable!()
    };
    let mut calls = Vec::new();
    for _ in 0..6 {
        let mut client = Client::Http(url.clone());
        calls.push(tokio::spawn(async move {
            client.call("create_ticket", "Printer on fire", None).await
        }));
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert!(
        answers.iter().all(|a| a["result"].is_object()),
        "{answers:?}"
    );
    assert_eq!(answers.iter().filter(|a| !replayed(a)).count(), 1);
    assert_eq!(
        Sdk::Python.effects(&dir.0).len(),
        1,
        "six calls, one effect"
    );
}

/// Waiting for the lease to end is waiting for the engine's clock: polled, every answer on the
/// way checked.
#[tokio::test]
async fn a_proxy_killed_mid_call_is_in_flight_then_in_doubt_never_a_second_effect() {
    let dir = Scratch::new("proxy-mcp-kill");
    let Some(upstream) = Sdk::Python.command(&dir.0) else {
        return;
    };
    let block = dir.0.join("release");
    let mut command = Command::new(&upstream[0]);
    command
        .args(&upstream[1..])
        .args(["--http", "0", "--block-file"])
        .arg(&block);
    let server = Running::start(command);
    let start = || {
        let mut command = Command::new(IDEM);
        command
            .env_remove("IDEM_STORE")
            .args([
                "proxy",
                "--mcp",
                "--upstream",
                &server.url,
                "--addr",
                "127.0.0.1:0",
            ])
            .args(["--store", &dir.sqlite(), "--lease", "2s"]);
        Running::start(command)
    };
    let mut first = start();
    let second = start();
    let mut held = Client::Http(first.url.clone());
    tokio::spawn(async move {
        held.call("create_ticket", "Printer on fire", Some("k-1"))
            .await
    });
    // The upstream recorded the effect and holds its answer.
    while Sdk::Python.effects(&dir.0).is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    let mut client = Client::Http(second.url.clone());
    let during = client
        .call("create_ticket", "Printer on fire", Some("k-1"))
        .await;
    assert_eq!(
        during["error"]["data"]["type"], "urn:idem:problem:in-flight",
        "{during}"
    );
    let waited = std::time::Instant::now();
    let after = loop {
        let retry = client
            .call("create_ticket", "Printer on fire", Some("k-1"))
            .await;
        if retry["error"]["data"]["type"] != "urn:idem:problem:in-flight" {
            break retry;
        }
        assert!(waited.elapsed().as_secs() < 60, "the lease never ended");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(after["error"]["data"]["io.idem/inDoubt"], true, "{after}");
    assert_eq!(after["error"]["data"]["type"], "urn:idem:problem:in-doubt");
    std::fs::write(&block, "").unwrap();
    let again = client
        .call("create_ticket", "Printer on fire", Some("k-1"))
        .await;
    assert_eq!(again["error"]["data"]["io.idem/inDoubt"], true);
    assert_eq!(
        Sdk::Python.effects(&dir.0).len(),
        1,
        "never a second effect"
    );
}

/// A client of the proxy at `url` as `tenant` that declares MCP's tasks extension (MCP
/// 2026-07-28, no session).
async fn tasks_client(
    url: &str,
    tenant: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig> {
    use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut headers = std::collections::HashMap::new();
    headers.insert(
        http::HeaderName::from_static("x-tenant-id"),
        http::HeaderValue::from_str(tenant).unwrap(),
    );
    idem_http::client::install_crypto_provider();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers),
    );
    ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("proxy-tasks-test", "1.0.0"),
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

/// The Python SDK's server knows no tasks; two proxies serve one for its tool: created once,
/// the same task from either proxy, `working` while the upstream holds the call, then
/// `completed` with its result from either; one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_for_a_task_less_upstream_across_two_proxies() {
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, GetTaskParams, RequestMetaObject, TaskPayload,
        TaskStatus,
    };
    let dir = Scratch::new("proxy-mcp-tasks");
    let Some(upstream) = Sdk::Python.command(&dir.0) else {
        return;
    };
    let block = dir.0.join("release");
    let mut command = Command::new(&upstream[0]);
    command
        .args(&upstream[1..])
        .args(["--http", "0", "--block-file"])
        .arg(&block);
    let server = Running::start(command);
    let secret = dir.0.join("secret");
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let start = || {
        let mut command = Command::new(IDEM);
        command
            .env_remove("IDEM_STORE")
            .args([
                "proxy",
                "--mcp",
                "--upstream",
                &server.url,
                "--addr",
                "127.0.0.1:0",
            ])
            .args(["--store", &dir.sqlite(), "--task-secret-file"])
            .arg(&secret);
        Running::start(command)
    };
    let (a, b) = (start(), start());
    let (to_a, to_b) = (
        tasks_client(&a.url, "acme").await,
        tasks_client(&b.url, "acme").await,
    );
    let mut params = CallToolRequestParams::new("create_ticket");
    params.arguments = json!({"title": "Printer on fire"}).as_object().cloned();
    let mut meta = RequestMetaObject::new();
    meta.0
        .0
        .insert("io.idem/idempotencyKey".into(), json!("wf-1:step-1"));
    params.meta = Some(meta);
    let task_of = async |client: &rmcp::service::RunningService<_, _>| match client
        .peer()
        .call_tool_once(params.clone())
        .await
        .unwrap()
    {
        CallToolResponse::Task(created) => created.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let id = task_of(&to_a).await;
    // The first answer lost: the same call again, through the other proxy.
    assert_eq!(task_of(&to_b).await, id, "one key, one task");
    let got = to_b.peer().get_task(GetTaskParams::new(&id)).await.unwrap();
    assert_eq!(got.task.status(), TaskStatus::Working);
    std::fs::write(&block, "").unwrap();
    let mut polls = 0;
    let done = loop {
        let client = if polls % 2 == 0 { &to_a } else { &to_b };
        let got = client
            .peer()
            .get_task(GetTaskParams::new(&id))
            .await
            .unwrap();
        if got.task.status().is_terminal() {
            break got;
        }
        polls += 1;
        assert!(polls < 600, "the task never finished");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("completed, got {:?}", done.task.payload)
    };
    assert_eq!(
        result["content"][0]["text"], "ticket 1: Printer on fire",
        "{result:?}"
    );
    assert_eq!(Sdk::Python.effects(&dir.0).len(), 1, "one task, one effect");
}

/// Eight calls with one key at once, through the proxy to the Python SDK's server (which holds
/// the first until the test lets it answer; the others wait for its result): one effect, eight
/// results.
#[tokio::test]
async fn eight_concurrent_calls_with_one_key_are_one_effect() {
    let dir = Scratch::new("proxy-mcp-eight");
    let Some(upstream) = Sdk::Python.command(&dir.0) else {
        return;
    };
    let block = dir.0.join("release");
    let mut command = Command::new(&upstream[0]);
    command
        .args(&upstream[1..])
        .args(["--http", "0", "--block-file"])
        .arg(&block);
    let server = Running::start(command);
    let mut command = Command::new(IDEM);
    command
        .env_remove("IDEM_STORE")
        .args([
            "proxy",
            "--mcp",
            "--upstream",
            &server.url,
            "--addr",
            "127.0.0.1:0",
        ])
        .args(["--store", &dir.sqlite()]);
    let proxy = Running::start(command);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut calls = Vec::new();
    for _ in 0..8 {
        let (mut client, barrier) = (Client::Http(proxy.url.clone()), barrier.clone());
        calls.push(tokio::spawn(async move {
            barrier.wait().await;
            let params = json!({"name": "create_ticket", "arguments": {"title": "x"},
                "_meta": {"io.idem/idempotencyKey": "k-8", "io.idem/wait": 30}});
            client
                .request(
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}),
                )
                .await
        }));
    }
    while Sdk::Python.effects(&dir.0).is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    std::fs::write(&block, "").unwrap();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert!(
        answers.iter().all(|a| a["result"].is_object()),
        "{answers:?}"
    );
    assert_eq!(answers.iter().filter(|a| !replayed(a)).count(), 1);
    assert_eq!(
        Sdk::Python.effects(&dir.0).len(),
        1,
        "eight calls, one effect"
    );
}
