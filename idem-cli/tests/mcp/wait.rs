//! Waiting for an in-flight result over MCP ([contract §5.2](idem_core::contract#waiting)): a
//! real rmcp client calls `idem serve --mcp` over stdio and over streamable HTTP; a retry sent
//! while the first call runs asks to wait (`IdempotentCaller`'s default) and gets the replay,
//! never "in flight". The retry leaves once the first call's claim is in the store; the tool
//! takes 300 ms from its claim (real latency, kept short), in which the retry arrives and waits.
//! Should a loaded machine deliver it later, it replays without waiting, which the assertions
//! accept too: they never depend on who is faster.

use idem_core::IdempotencyKey;
use idem_mcp::client::{IdempotentCaller, RetryPolicy};
use idem_mcp::server::TOOL_META_KEY;
use serde_json::{Value, json};

use crate::{Server, Transport, until_claimed};

/// Over stdio each client has a server process of its own on the same SQLite file, so the
/// waiter and the first call are in two processes; over HTTP both reach the one server.
async fn retry_waits_for_the_first_result(transport: Transport) {
    let server = Server::start(transport, &["--tool-latency-ms", "300"]).await;
    let (a, b) = (
        server.connect(Some("tenant-t")).await,
        server.connect(Some("tenant-t")).await,
    );
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
    // Only the first call has been sent: the record is its claim.
    until_claimed(&*server.open_store().await, "tenant-t", key.as_str()).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_retry_sent_while_a_300ms_call_runs_waits_and_replays() {
    retry_waits_for_the_first_result(Transport::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_from_another_process_a_retry_sent_while_a_300ms_call_runs_waits_and_replays() {
    retry_waits_for_the_first_result(Transport::Stdio).await;
}
