//! The MCP servers `idem proxy --mcp` is to stand in front of (tests/upstreams: the official
//! Python SDK's and the official TypeScript SDK's, installed by scripts/services/upstreams.sh),
//! spoken to directly, without idem: each counts its side-effecting tool's calls in its own sink
//! with the `_meta["io.idem/idempotencyKey"]` it received, marks its read-only tool
//! `readOnlyHint`, and runs every call it gets (nothing here deduplicates).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use idem_conformance::kit;
use serde_json::{Value, json};

mod proxy_kit;

use proxy_kit::Scratch;

const UPSTREAMS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstreams");

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "idem-test", "version": "1"}}})
}

fn call(id: u64, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "create_ticket", "arguments": {"title": "Printer on fire"},
        "_meta": {"io.idem/idempotencyKey": key}}})
}

fn list() -> Value {
    json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})
}

/// The tools/list result's read-only tools.
fn read_only(listed: &Value) -> Vec<String> {
    let tools = listed["result"]["tools"].as_array().expect("a tool list");
    tools
        .iter()
        .filter(|t| t["annotations"]["readOnlyHint"] == true)
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Over streamable HTTP (stateless, JSON answers).
async fn over_http(command: Command) -> Vec<Value> {
    let server = proxy_kit::Running::start(command);
    let http = proxy_kit::client();
    let mut answers = Vec::new();
    for message in [initialize(), list(), call(2, "idem-k1"), call(3, "idem-k1")] {
        let answer = http
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&message)
            .send()
            .await
            .unwrap();
        answers.push(answer.json().await.unwrap());
    }
    answers
}

/// Over stdio: one line per message, the answers read in order.
fn over_stdio(mut command: Command) -> Vec<Value> {
    let mut child: Child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let mut answers = Vec::new();
    for message in [
        initialize(),
        initialized,
        list(),
        call(2, "idem-k1"),
        call(3, "idem-k1"),
    ] {
        let notification = message.get("id").is_none();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
        if !notification {
            let line = stdout.next().expect("an answer").unwrap();
            answers.push(serde_json::from_str(&line).unwrap());
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    answers
}

fn check(answers: &[Value]) {
    assert_eq!(answers[0]["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(read_only(&answers[1]), ["count_tickets"]);
    for answer in &answers[2..] {
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("ticket "), "{answer}");
    }
}

fn python_tickets(sink: &std::path::Path) -> Vec<(String, Option<String>)> {
    let db = idemkit::sqlite::rusqlite::Connection::open(sink).unwrap();
    let mut rows = db
        .prepare("SELECT title, key FROM tickets ORDER BY id")
        .unwrap();
    rows.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn typescript_tickets(sink: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(sink).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn python() -> Option<String> {
    kit::env_url(
        "IDEM_TEST_UPSTREAM_PYTHON",
        "the venv with the MCP SDK: source scripts/services/upstreams.sh; scripts/test does",
    )
}

fn typescript() -> Option<String> {
    kit::env_url(
        "IDEM_TEST_UPSTREAM_TS_SERVER",
        "the compiled TypeScript MCP server: source scripts/services/upstreams.sh; scripts/test does",
    )
}

#[tokio::test]
async fn the_python_sdk_server_counts_every_call_over_http_and_stdio() {
    let Some(python) = python() else { return };
    let dir = Scratch::new("upstream-python-mcp");
    let sink = dir.0.join("tickets.db");
    let mut command = Command::new(&python);
    command
        .arg(format!("{UPSTREAMS}/mcp_tool.py"))
        .arg("--sink")
        .arg(&sink)
        .args(["--http", "0"]);
    check(&over_http(command).await);
    let mut command = Command::new(&python);
    command
        .arg(format!("{UPSTREAMS}/mcp_tool.py"))
        .arg("--sink")
        .arg(&sink);
    check(&over_stdio(command));
    let tickets = python_tickets(&sink);
    assert_eq!(
        tickets.len(),
        4,
        "two calls of one key, twice: four effects, unprotected"
    );
    assert!(
        tickets
            .iter()
            .all(|(_, key)| key.as_deref() == Some("idem-k1"))
    );
}

#[tokio::test]
async fn the_typescript_sdk_server_counts_every_call_over_http_and_stdio() {
    let Some(server) = typescript() else { return };
    let dir = Scratch::new("upstream-typescript-mcp");
    let sink = dir.0.join("tickets.jsonl");
    let mut command = Command::new("node");
    command
        .arg(&server)
        .arg("--sink")
        .arg(&sink)
        .args(["--http", "0"]);
    check(&over_http(command).await);
    let mut command = Command::new("node");
    command.arg(&server).arg("--sink").arg(&sink);
    check(&over_stdio(command));
    let tickets = typescript_tickets(&sink);
    assert_eq!(
        tickets.len(),
        4,
        "two calls of one key, twice: four effects, unprotected"
    );
    assert!(tickets.iter().all(|t| t["key"] == "idem-k1"));
}
