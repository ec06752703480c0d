//! Stock rmcp clients that send no key ([contract §5.1](idem_core::contract#keyless)): no `_meta`
//! key, no `params.idempotencyKey`, just `call_tool` with the tool's arguments, against
//! `idem serve --mcp` started with each `--key-source`, over stdio and streamable HTTP on
//! loopback, on a fresh SQLite file per test.

use std::process::Stdio;

use idem_mcp::{IN_FLIGHT, KEY_SOURCE_META_KEY, META_KEY, is_replay};
use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorCode, RequestMetaObject};
use rmcp::service::ServiceError;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::{Client, Server, Transport, mcp_error, ticket_id};

/// A server on a fresh SQLite file whose calls without a key get `key_source`.
async fn start(transport: Transport, key_source: &str) -> Server {
    start_with(transport, key_source, &[]).await
}

/// [`start`], the server given `more` arguments.
async fn start_with(transport: Transport, key_source: &str, more: &[&str]) -> Server {
    let mut args = vec!["--key-source", key_source];
    args.extend_from_slice(more);
    Server::start(transport, &args).await
}

/// A stock call: the tool's arguments, nothing else.
fn call(arguments: Value) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("create_ticket");
    params.arguments = arguments.as_object().cloned();
    params
}

fn ticket(title: &str) -> Value {
    json!({"title": title, "account_id": "A-7"})
}

fn key_source(result: &CallToolResult) -> Option<&str> {
    result.meta.as_ref()?.0.get(KEY_SOURCE_META_KEY)?.as_str()
}

async fn arguments_repeats_replay_and_other_arguments_run(transport: Transport) {
    let server = start(transport, "arguments").await;
    let client = server.connect(Some("tenant-a")).await;
    let first = client
        .call_tool(call(ticket("Printer on fire")))
        .await
        .unwrap();
    let again = client
        .call_tool(call(ticket("Printer on fire")))
        .await
        .unwrap();
    assert!(
        !is_replay(&first) && is_replay(&again),
        "the repeat is marked"
    );
    assert_eq!(ticket_id(&first), ticket_id(&again));
    assert_eq!(
        (key_source(&first), key_source(&again)),
        (Some("arguments"), Some("arguments"))
    );
    assert_eq!(server.tickets(), 1);
    // A restarted agent (a new connection) repeating the call within the window: the replay.
    let other = server.connect(Some("tenant-a")).await;
    let third = other
        .call_tool(call(ticket("Printer on fire")))
        .await
        .unwrap();
    assert!(is_replay(&third));
    assert_eq!(server.tickets(), 1);
    // Other arguments: another operation.
    let new = client
        .call_tool(call(ticket("Printer out of toner")))
        .await
        .unwrap();
    assert!(!is_replay(&new));
    assert_ne!(ticket_id(&new), ticket_id(&first));
    assert_eq!(server.tickets(), 2);
    // The events say where the key came from.
    let log = server.log();
    let has = |event: &str| {
        log.lines()
            .any(|l| l.contains(event) && l.contains("key_source") && l.contains("arguments"))
    };
    assert!(has("claimed") && has("replayed"), "{log}");
}

/// Six identical calls at once from one stock client (no `_meta`), to a tool that takes 300 ms
/// (real latency, so that they overlap): each call's answer, in the order sent.
async fn six_at_once(client: &Client) -> Vec<Result<CallToolResult, ServiceError>> {
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let peer = client.peer().clone();
            tokio::spawn(async move { peer.call_tool(call(ticket("Six at once"))).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

const SLOW: &[&str] = &["--tool-latency-ms", "300"];

async fn arguments_six_identical_calls_to_a_slow_tool_six_answers_one_ticket(transport: Transport) {
    let server = start_with(transport, "arguments", SLOW).await;
    let client = server.connect(Some("tenant-a")).await;
    // The five that find the first in flight are waited for: their client cannot ask to wait.
    let results: Vec<CallToolResult> = six_at_once(&client)
        .await
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|e| panic!("every call answered, got {e}")))
        .collect();
    let mut ids: Vec<String> = results.iter().map(ticket_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 1, "every call names the one ticket: {ids:?}");
    assert_eq!(
        results.iter().filter(|r| !is_replay(r)).count(),
        1,
        "one ran, five replayed"
    );
    assert_eq!(server.tickets(), 1);
    // Each of them repeated now gets the replay of the one ticket.
    for _ in 0..6 {
        let repeat = client.call_tool(call(ticket("Six at once"))).await.unwrap();
        assert!(is_replay(&repeat));
        assert_eq!(ticket_id(&repeat), ids[0]);
    }
    assert_eq!(server.tickets(), 1);
}

async fn arguments_without_the_wait_overlapping_calls_retry_within_the_window(
    transport: Transport,
) {
    // A tool that outlasts the test: whichever call claims first, the five others find it in
    // flight, however late a loaded machine delivers them.
    let server = start_with(
        transport,
        "arguments",
        &["--tool-latency-ms", "600000", "--no-derived-key-wait"],
    )
    .await;
    let client = server.connect(Some("tenant-a")).await;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let peer = client.peer().clone();
        calls.spawn(async move { peer.call_tool(call(ticket("Six at once"))).await });
    }
    let mut in_flight = Vec::new();
    while in_flight.len() < 5 {
        let e = match calls.join_next().await.unwrap().unwrap() {
            Err(e) => mcp_error(e),
            Ok(answer) => panic!("only the first runs, and it outlasts the test: {answer:?}"),
        };
        assert_eq!(e.code, IN_FLIGHT);
        in_flight.push(e.data.unwrap()["retryAfterMs"].as_u64().unwrap());
    }
    // The tool's window is its latency and a second, its lease that and the store's write
    // budget: what is left of the window, not of the lease.
    assert!(
        in_flight.iter().all(|ms| (1..=601_000).contains(ms)),
        "{in_flight:?}"
    );
    assert_eq!(server.tickets(), 0, "told to retry: nothing ran");
    calls.abort_all();
}

async fn arguments_a_sent_key_wins_and_tenants_are_apart(transport: Transport) {
    let server = start(transport, "arguments").await;
    let (a, b) = (
        server.connect(Some("tenant-a")).await,
        server.connect(Some("tenant-b")).await,
    );
    let derived = a.call_tool(call(ticket("Same words"))).await.unwrap();
    // Another tenant with identical arguments: its own operation.
    let other_tenant = b.call_tool(call(ticket("Same words"))).await.unwrap();
    assert!(!is_replay(&other_tenant));
    assert_ne!(ticket_id(&derived), ticket_id(&other_tenant));
    assert_eq!(server.tickets(), 2);
    // A key sent with the same arguments is used, not the derived one: a new operation.
    let mut keyed = call(ticket("Same words"));
    let mut meta = RequestMetaObject::new();
    meta.0
        .0
        .insert(META_KEY.into(), json!("wf-1:step-1:create_ticket"));
    keyed.meta = Some(meta);
    let sent = a.call_tool(keyed.clone()).await.unwrap();
    assert!(!is_replay(&sent));
    assert_eq!(key_source(&sent), None, "a sent key is the caller's own");
    let sent_again = a.call_tool(keyed).await.unwrap();
    assert!(is_replay(&sent_again));
    assert_eq!(server.tickets(), 3);
}

async fn arguments_tool_listing_is_honest(transport: Transport) {
    let server = start(transport, "arguments").await;
    let client = server.connect(Some("tenant-a")).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    assert_eq!(
        tool.annotations.as_ref().unwrap().idempotent_hint,
        Some(true)
    );
    let description = tool.description.as_deref().unwrap();
    assert!(
        description.contains("keyed by its arguments /title, /account_id")
            && description.contains("within 3600 s")
            && description
                .contains("A repeat without a key sent while the first call runs is waited for"),
        "{description}"
    );
    let meta = &tool.meta.as_ref().unwrap().0["io.idem/idempotency"];
    assert_eq!(
        (meta["keySource"].as_str(), meta["keyWindowMs"].as_u64()),
        (Some("arguments"), Some(3_600_000))
    );
    assert!(
        !tool.input_schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "idempotency_key")
    );
}

async fn model_argument_reused_once_left_out_refused(transport: Transport) {
    let server = start(transport, "model-argument").await;
    let client = server.connect(Some("tenant-a")).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    let schema = &tool.input_schema;
    assert!(
        schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "idempotency_key")
    );
    assert_eq!(schema["properties"]["idempotency_key"]["type"], "string");
    assert!(
        schema["properties"]["idempotency_key"]["description"]
            .as_str()
            .unwrap()
            .contains("send the same id when you retry the same action")
    );
    assert_eq!(
        tool.annotations.as_ref().unwrap().idempotent_hint,
        Some(true)
    );

    let with = |id: &str, title: &str| {
        call(json!({"title": title, "account_id": "A-7", "idempotency_key": id}))
    };
    let first = client
        .call_tool(with("printer-1", "Printer on fire"))
        .await
        .unwrap();
    let again = client
        .call_tool(with("printer-1", "Printer on fire"))
        .await
        .unwrap();
    assert!(!is_replay(&first) && is_replay(&again));
    assert_eq!(ticket_id(&first), ticket_id(&again));
    assert_eq!(key_source(&again), Some("model_argument"));
    assert_eq!(server.tickets(), 1);
    // A new id for a new action, even with the same words.
    let new = client
        .call_tool(with("printer-2", "Printer on fire"))
        .await
        .unwrap();
    assert_ne!(ticket_id(&new), ticket_id(&first));
    assert_eq!(server.tickets(), 2);
    // Left out: refused, nothing runs.
    let err = mcp_error(
        client
            .call_tool(call(ticket("Printer on fire")))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("idempotency_key"), "{}", err.message);
    assert_eq!(server.tickets(), 2);
}

async fn client_refuses_and_unprotected_repeats(transport: Transport) {
    let refusing = start(transport, "client").await;
    let client = refusing.connect(Some("tenant-a")).await;
    let err = mcp_error(client.call_tool(call(ticket("x"))).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(refusing.tickets(), 0);

    let open = start(transport, "unprotected").await;
    let client = open.connect(Some("tenant-a")).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    assert_eq!(
        tool.annotations.as_ref().unwrap().idempotent_hint,
        Some(false)
    );
    for _ in 0..2 {
        let result = client.call_tool(call(ticket("x"))).await.unwrap();
        assert!(!is_replay(&result) && key_source(&result).is_none());
    }
    assert_eq!(
        open.tickets(),
        2,
        "without protection the repeat is a second ticket"
    );
}

/// `--key-source request` over stdio, with JSON-RPC written by hand: a resend of the very same
/// request (same id) is replayed; a new request with the same arguments runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_resend_replays_and_a_new_request_runs() {
    let server = start(Transport::Stdio, "request").await;
    let mut child = server
        .stdio_command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |message: Value| {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "0"}}}),
    )
    .await;
    let _ = lines.next_line().await.unwrap();
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let tools_call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "create_ticket", "arguments": ticket("Resent")}})
    };
    let mut answers = Vec::new();
    for id in [7, 7, 8] {
        send(tools_call(id)).await;
        let line = lines.next_line().await.unwrap().unwrap();
        answers.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let replayed = |a: &Value| a["result"]["_meta"]["io.idem/replayed"].as_bool();
    let id_of = |a: &Value| a["result"]["structuredContent"]["ticket_id"].clone();
    assert_eq!(replayed(&answers[0]), Some(false), "{answers:?}");
    assert_eq!(replayed(&answers[1]), Some(true), "the resend replays");
    assert_eq!(id_of(&answers[0]), id_of(&answers[1]));
    assert_eq!(
        answers[1]["result"]["_meta"][KEY_SOURCE_META_KEY],
        "request"
    );
    assert_eq!(replayed(&answers[2]), Some(false), "a new request runs");
    assert_eq!(server.tickets(), 2);
}

/// `--key-source request` over streamable HTTP: without sessions (the default, as MCP
/// 2026-07-28 serves) request ids are the client's own, not unique on the server: a stock
/// client's call is refused, nothing runs. With sessions (`--stateful`, `Mcp-Session-Id`) it
/// gets a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_keys_need_a_session_over_streamable_http() {
    let stateless = start(Transport::Http, "request").await;
    let client = stateless.connect(Some("tenant-a")).await;
    let err = mcp_error(
        client
            .call_tool(call(ticket("No session")))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(
        err.data.unwrap()["type"],
        "urn:idem:problem:key-required",
        "{}",
        err.message
    );
    assert_eq!(stateless.tickets(), 0, "nothing ran");

    let with_sessions = start_with(Transport::Http, "request", &["--stateful"]).await;
    let client = with_sessions.connect(Some("tenant-a")).await;
    let result = client
        .call_tool(call(ticket("With a session")))
        .await
        .unwrap();
    assert_eq!(key_source(&result), Some("request"));
    assert_eq!(with_sessions.tickets(), 1);
}

on_both_transports!(
    arguments_repeats_replay_and_other_arguments_run,
    arguments_six_identical_calls_to_a_slow_tool_six_answers_one_ticket,
    arguments_without_the_wait_overlapping_calls_retry_within_the_window,
    arguments_a_sent_key_wins_and_tenants_are_apart,
    arguments_tool_listing_is_honest,
    model_argument_reused_once_left_out_refused,
    client_refuses_and_unprotected_repeats,
);
