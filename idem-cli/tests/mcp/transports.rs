//! Keys, refusals, the published contract and scopes over stdio and streamable HTTP (stateless,
//! the default), on a fresh SQLite file per test.

use std::time::Duration;

use idem_core::IdempotencyKey;
use idem_mcp::client::{CallError, IdempotentCaller, RetryPolicy, min_client_deadline};
use idem_mcp::{FINGERPRINT_MISMATCH, META_KEY, UNAUTHENTICATED, is_replay};
use rmcp::model::{
    CallToolRequestParams, ClientConfig, ClientRequest, CustomRequest, ErrorCode, ServerResult,
};
use rmcp::service::{Peer, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::{Server, Transport, args, keyed, mcp_error, ticket_id};

/// The principal of the tests that need just one.
const TENANT: &str = "tenant-t";

/// A server on a fresh SQLite file whose tool works `latency_ms`.
async fn start(transport: Transport, latency_ms: u64) -> Server {
    Server::start(transport, &["--tool-latency-ms", &latency_ms.to_string()]).await
}

/// Sends `tools/call` with raw params (rmcp's typed params cannot carry `idempotencyKey`).
async fn raw_call(peer: &Peer<RoleClient>, params: Value) -> Result<Value, ServiceError> {
    let request = ClientRequest::CustomRequest(CustomRequest::new("tools/call", Some(params)));
    let answer = peer.send_request(request).await?;
    Ok(match answer {
        ServerResult::CallToolResult(r) => serde_json::to_value(r).unwrap(),
        other => serde_json::to_value(other).unwrap(),
    })
}

async fn same_key_twice_one_ticket_and_replay_mark(transport: Transport) {
    let server = start(transport, 0).await;
    let client = server.connect(Some(TENANT)).await;
    let first = client
        .call_tool(keyed("wf-1:step-1:create_ticket", "Printer on fire"))
        .await
        .unwrap();
    let again = client
        .call_tool(keyed("wf-1:step-1:create_ticket", "Printer on fire"))
        .await
        .unwrap();
    assert!(!is_replay(&first), "the first call runs the tool");
    assert!(is_replay(&again), "the repeat is marked as a replay");
    assert_eq!(ticket_id(&first), ticket_id(&again));
    assert_eq!(server.tickets(), 1);
    // A new connection (a restarted agent) with the same key still gets the replay.
    let other = server.connect(Some(TENANT)).await;
    let third = other
        .call_tool(keyed("wf-1:step-1:create_ticket", "Printer on fire"))
        .await
        .unwrap();
    assert!(is_replay(&third));
    assert_eq!(server.tickets(), 1);
    // Another key is another operation.
    client
        .call_tool(keyed("wf-1:step-2:create_ticket", "Printer on fire"))
        .await
        .unwrap();
    assert_eq!(server.tickets(), 2);
}

async fn other_arguments_mismatch_error_and_no_ticket(transport: Transport) {
    let server = start(transport, 0).await;
    let client = server.connect(Some(TENANT)).await;
    client
        .call_tool(keyed("wf-2:step-1:create_ticket", "first"))
        .await
        .unwrap();
    let err = mcp_error(
        client
            .call_tool(keyed("wf-2:step-1:create_ticket", "second"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, FINGERPRINT_MISMATCH);
    assert!(err.message.contains("other arguments"), "{}", err.message);
    assert_eq!(server.tickets(), 1, "the mismatched call created nothing");
}

async fn concurrent_calls_with_one_key_one_ticket_with_real_latency(transport: Transport) {
    // Real latency (300 ms) so that the calls overlap the running one. Four connections (over
    // stdio: four server processes sharing the SQLite file), two concurrent calls on each.
    let server = start(transport, 300).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.connect(Some(TENANT)).await);
    }
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(10),
        overall_deadline: Duration::from_secs(30),
        initial_backoff: Duration::from_millis(50),
        ..RetryPolicy::default()
    };
    let key = IdempotencyKey::for_step("wf-3", "step-1", "create_ticket").unwrap();
    let calls: Vec<_> = clients
        .iter()
        .flat_map(|client| [client.peer().clone(), client.peer().clone()])
        .map(|peer| {
            // Without waiting, so the overlap shows as "in flight" answers (tests/wait.rs
            // covers the calls that wait).
            let (caller, key) = (
                IdempotentCaller::new(peer, policy).without_wait(),
                key.clone(),
            );
            tokio::spawn(async move {
                caller
                    .call("create_ticket", args("concurrent"), &key, None)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    let (mut executed, mut in_flight) = (0, 0);
    for call in calls {
        let answer = call.await.unwrap();
        executed += usize::from(!answer.replayed);
        in_flight += answer.in_flight;
        ids.push(ticket_id(&answer.result));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every caller got the same ticket: {ids:?}");
    assert_eq!(executed, 1, "exactly one call ran the tool");
    assert!(in_flight >= 1, "the calls overlapped the running one");
    assert_eq!(server.tickets(), 1);
}

async fn client_timeout_shorter_than_tool_latency_then_retries_one_ticket(transport: Transport) {
    // Real latency: the tool works 1.5 s; each client attempt gives up after 0.3 s.
    let server = start(transport, 1500).await;
    let client = server.connect(Some(TENANT)).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    let minimum = min_client_deadline(tool).unwrap();
    assert_eq!(minimum, Duration::from_millis(3000));
    let short = RetryPolicy {
        attempt_timeout: Duration::from_millis(300),
        overall_deadline: Duration::from_secs(30),
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(500),
        allow_short_attempts: false,
    };
    let key = IdempotencyKey::for_step("wf-4", "step-1", "create_ticket").unwrap();
    // The published minimum is enforced unless the caller opts out.
    let strict = IdempotentCaller::new(client.peer().clone(), short);
    assert_eq!(
        strict.published_minimum("create_ticket").await.unwrap(),
        Some(minimum)
    );
    let refused = strict
        .call("create_ticket", args("slow"), &key, Some(minimum))
        .await
        .unwrap_err();
    assert!(matches!(refused, CallError::DeadlineBelowMinimum(_)));
    assert_eq!(server.tickets(), 0);

    let caller = IdempotentCaller::new(
        client.peer().clone(),
        RetryPolicy {
            allow_short_attempts: true,
            ..short
        },
    );
    let answer = caller
        .call("create_ticket", args("slow"), &key, Some(minimum))
        .await
        .unwrap();
    assert!(answer.failed_attempts >= 1, "{answer:?}");
    assert!(answer.attempts >= 2, "{answer:?}");
    assert!(
        answer.replayed,
        "the answer came from the record: {answer:?}"
    );
    assert_eq!(server.tickets(), 1);
}

async fn refusals_create_nothing(transport: Transport) {
    let server = start(transport, 0).await;
    let client = server.connect(Some(TENANT)).await;
    let mut no_key = CallToolRequestParams::new("create_ticket");
    no_key.arguments = args("no key");
    let err = mcp_error(client.call_tool(no_key).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(
        err.message.contains("needs an idempotency key"),
        "{}",
        err.message
    );
    let err = mcp_error(client.call_tool(keyed("has space", "x")).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("visible ASCII"), "{}", err.message);
    let conflicting = json!({"name": "create_ticket", "arguments": {"title": "x", "account_id": "A"},
        "idempotencyKey": "k-1", "_meta": {META_KEY: "k-2"}});
    let err = mcp_error(raw_call(client.peer(), conflicting).await.unwrap_err());
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert!(err.message.contains("two different"), "{}", err.message);
    assert_eq!(server.tickets(), 0);
}

async fn draft_params_field_is_honoured(transport: Transport) {
    let server = start(transport, 0).await;
    let client = server.connect(Some(TENANT)).await;
    let params = json!({"name": "create_ticket", "arguments": {"title": "draft", "account_id": "A-7"},
        "idempotencyKey": "wf-5:step-1:create_ticket"});
    let first = raw_call(client.peer(), params.clone()).await.unwrap();
    let again = raw_call(client.peer(), params).await.unwrap();
    assert_eq!(first["_meta"]["io.idem/replayed"], false, "{first}");
    assert_eq!(again["_meta"]["io.idem/replayed"], true, "{again}");
    // The same key in `_meta` names the same operation.
    let via_meta = client
        .call_tool(keyed("wf-5:step-1:create_ticket", "draft"))
        .await
        .unwrap();
    assert!(is_replay(&via_meta));
    assert_eq!(server.tickets(), 1);
}

async fn tool_listing_publishes_window_deadline_and_honest_hints(transport: Transport) {
    let server = start(transport, 0).await;
    let client = server.connect(Some(TENANT)).await;
    let info = client.peer_info().unwrap();
    let capability = &info.capabilities.experimental.as_ref().unwrap()["tools.idempotency"];
    assert_eq!(capability["keyField"], "idempotencyKey");
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    let description = tool.description.as_deref().unwrap();
    assert!(
        description.contains("Processing window: 1000 ms"),
        "{description}"
    );
    assert!(description.contains("minimum client retry deadline: 1500 ms"));
    let hints = tool.annotations.as_ref().unwrap();
    assert_eq!(hints.idempotent_hint, Some(true), "keys are required");
    assert_eq!(hints.read_only_hint, Some(false));
    assert_eq!(hints.destructive_hint, Some(false));
}

async fn scope_is_the_principal(transport: Transport) {
    let server = start(transport, 0).await;
    let a = server.connect(Some("tenant-a")).await;
    let b = server.connect(Some("tenant-b")).await;
    let key = "wf-6:step-1:create_ticket";
    let from_a = a.call_tool(keyed(key, "same")).await.unwrap();
    let from_b = b.call_tool(keyed(key, "same")).await.unwrap();
    assert!(!is_replay(&from_a) && !is_replay(&from_b));
    assert_ne!(ticket_id(&from_a), ticket_id(&from_b));
    assert_eq!(
        server.tickets(),
        2,
        "a key never replays another principal's answer"
    );
}

/// Over streamable HTTP a caller without a principal (no `x-tenant-id`, unauthenticated, or a
/// token) is refused: nothing is claimed, no ticket is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_without_a_principal_is_refused_and_creates_nothing() {
    let server = start(Transport::Http, 0).await;
    let anonymous = server.connect(None).await;
    let err = mcp_error(
        anonymous
            .call_tool(keyed("wf-7:step-1:create_ticket", "x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, UNAUTHENTICATED, "{}", err.message);
    assert_eq!(server.tickets(), 0);
    // The key was not claimed: an authenticated caller runs it.
    let client = server.connect(Some(TENANT)).await;
    let first = client
        .call_tool(keyed("wf-7:step-1:create_ticket", "x"))
        .await
        .unwrap();
    assert!(!is_replay(&first));
    assert_eq!(server.tickets(), 1);
}

/// With `--principal`, the server opts into one scope for every caller without `x-tenant-id`:
/// a second anonymous client gets the first one's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_shared_principal_is_an_explicit_opt_in() {
    let server = Server::start(Transport::Http, &["--principal", "shared"]).await;
    let a = server.connect(None).await;
    let b = server.connect(None).await;
    let first = a
        .call_tool(keyed("wf-8:step-1:create_ticket", "x"))
        .await
        .unwrap();
    let again = b
        .call_tool(keyed("wf-8:step-1:create_ticket", "x"))
        .await
        .unwrap();
    assert!(!is_replay(&first) && is_replay(&again));
    assert_eq!(ticket_id(&first), ticket_id(&again));
    assert_eq!(server.tickets(), 1);
}

/// With `--tokens FILE` the principal is the bearer token's tenant (`x-tenant-id` ignored): two
/// tokens of one tenant share its records; a request without a known token gets 401, nothing
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tokens_name_the_principal_and_no_token_gets_401() {
    let dir = idem_conformance::kit::temp_dir("idem-mcp-tokens");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "tok-acme-laptop-7f3a9c1e acme\ntok-acme-server-2d8b6e4f acme\n",
    )
    .unwrap();
    let server = Server::start(Transport::Http, &["--tokens", tokens.to_str().unwrap()]).await;
    let url = server.http.as_ref().unwrap().1.clone();
    let with_token = async |token: &str| {
        idem_http::client::install_crypto_provider();
        let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token);
        ClientConfig::default()
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
    };
    assert!(
        with_token("tok-unknown-00000000").await.is_err(),
        "an unknown token is refused before MCP"
    );
    let no_token = crate::http_client_result(&url, Some("acme")).await;
    assert!(no_token.is_err(), "x-tenant-id alone is not enough");
    let laptop = with_token("tok-acme-laptop-7f3a9c1e").await.unwrap();
    let server_side = with_token("tok-acme-server-2d8b6e4f").await.unwrap();
    let first = laptop
        .call_tool(keyed("wf-9:step-1:create_ticket", "x"))
        .await
        .unwrap();
    let again = server_side
        .call_tool(keyed("wf-9:step-1:create_ticket", "x"))
        .await
        .unwrap();
    assert!(
        !is_replay(&first) && is_replay(&again),
        "one tenant, one scope"
    );
    assert_eq!(server.tickets(), 1);
}

/// rmcp refuses a `Host` it does not know (DNS rebinding): loopback names are known, others
/// only with `--allowed-host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_other_hosts_need_allowed_host() {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "0"}}});
    let status = async |server: &Server, host: &str| {
        let url = &server.http.as_ref().unwrap().1;
        idem_http::client::http_client()
            .unwrap()
            .post(url)
            .header("host", host)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
            .await
            .unwrap()
            .status()
    };
    let default = Server::start(Transport::Http, &[]).await;
    assert!(status(&default, "localhost").await.is_success());
    assert_eq!(status(&default, "tickets.internal").await, 403);
    let allowing = Server::start(Transport::Http, &["--allowed-host", "tickets.internal"]).await;
    assert!(status(&allowing, "tickets.internal").await.is_success());
    assert_eq!(status(&allowing, "elsewhere.example").await, 403);
}

on_both_transports!(
    same_key_twice_one_ticket_and_replay_mark,
    other_arguments_mismatch_error_and_no_ticket,
    concurrent_calls_with_one_key_one_ticket_with_real_latency,
    client_timeout_shorter_than_tool_latency_then_retries_one_ticket,
    refusals_create_nothing,
    draft_params_field_is_honoured,
    tool_listing_publishes_window_deadline_and_honest_hints,
    scope_is_the_principal,
);
