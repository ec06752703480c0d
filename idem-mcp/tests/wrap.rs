//! An rmcp server written only with rmcp's own macros (`#[tool_router]`, `#[tool_handler]`, no
//! hand-written `call_tool`, `list_tools` or `get_info`), made exactly-once by wrapping it
//! ([`IdempotentTools::wrap`]), on a real SQLite file: its effect (a row) commits in one
//! transaction with its record (`SqliteStore::complete_in`), counted at the table. A real rmcp
//! client over an in-memory duplex pipe.

use std::time::Duration;

use idem_core::machine::CompleteAnswer;
use idem_core::{
    Attempt, Clock, IdempotencyKey, KeyStore, RecordId, RecordState, Scope, SystemClock, Tool,
};
use idem_mcp::{
    FINGERPRINT_MISMATCH, IdempotentTools, META_KEY, ToolSettings, is_replay, server::CAPABILITY,
};
use idem_store_sqlite::SqliteStore;
use rmcp::handler::server::common::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ContentBlock, ErrorData, RequestMetaObject,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::{RoleClient, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use rusqlite::TransactionBehavior;
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NewTicket {
    title: String,
}

/// The user's server, as rmcp's macros write it.
#[derive(Clone)]
struct Tickets {
    store: SqliteStore,
    tools: IdempotentTools,
}

#[tool_router]
impl Tickets {
    #[tool(description = "Creates a support ticket.")]
    async fn create_ticket(
        &self,
        Parameters(ticket): Parameters<NewTicket>,
        Extension(attempt): Extension<Attempt>,
    ) -> Result<CallToolResult, ErrorData> {
        let (store, tools) = (self.store.clone(), self.tools.clone());
        let created = self
            .store
            .with_connection(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                tx.execute("INSERT INTO tickets (title) VALUES (?1)", [&ticket.title])?;
                let id = tx.last_insert_rowid();
                let result = CallToolResult::success(vec![ContentBlock::text(format!("T-{id}"))]);
                let outcome = tools.outcome_for("create_ticket", &result);
                // The ticket and its record commit together, or neither does.
                let answer = store
                    .complete_in(&tx, &attempt, &outcome)
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                if answer == CompleteAnswer::Fenced {
                    // A newer attempt holds the key: roll the ticket back with the record.
                    return Err(rusqlite::Error::InvalidQuery);
                }
                tx.commit()?;
                attempt.mark_recorded();
                Ok::<_, rusqlite::Error>(result)
            })
            .await;
        match created {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(ErrorData::internal_error(e.to_string(), None)),
            Err(e) => Err(ErrorData::internal_error(e.to_string(), None)),
        }
    }

    #[tool(description = "Counts the tickets: a read, not protected.")]
    async fn count_tickets(&self) -> String {
        tickets(&self.store).await.to_string()
    }
}

#[tool_handler]
impl ServerHandler for Tickets {}

async fn tickets(store: &SqliteStore) -> i64 {
    store
        .with_connection(|c| c.query_row("SELECT count(*) FROM tickets", [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap()
}

fn call(name: &'static str, key: Option<&str>, title: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name);
    params.arguments = json!({"title": title}).as_object().cloned();
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(META_KEY.into(), json!(key));
        params.meta = Some(meta);
    }
    params
}

struct World {
    client: RunningService<RoleClient, ClientConfig>,
    store: SqliteStore,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("tickets.db")).unwrap();
    store.migrate().unwrap();
    store
        .with_connection(|c| {
            c.execute(
                "CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT NOT NULL)",
                [],
            )
        })
        .await
        .unwrap()
        .unwrap();
    let tool = Tool::builder()
        .processing_window(Duration::from_secs(2))
        .build()
        .unwrap();
    let tools = IdempotentTools::with_store(store.clone())
        .tool("create_ticket", ToolSettings::new(tool))
        .allow_anonymous("test-agent");
    let handler = Tickets {
        store: store.clone(),
        tools: tools.clone(),
    };
    let server = tools.wrap(handler);
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ClientConfig::default().serve(client_io).await.unwrap();
    World {
        client,
        store,
        _dir: dir,
    }
}

fn text(response: &CallToolResult) -> String {
    serde_json::to_value(&response.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_wrapped_macro_server_runs_a_key_once_and_commits_the_effect_with_its_record() {
    let w = world().await;
    let first = w
        .client
        .call_tool(call(
            "create_ticket",
            Some("wf-1:step-1"),
            "Printer on fire",
        ))
        .await
        .unwrap();
    let again = w
        .client
        .call_tool(call(
            "create_ticket",
            Some("wf-1:step-1"),
            "Printer on fire",
        ))
        .await
        .unwrap();
    assert!(!is_replay(&first) && is_replay(&again));
    assert_eq!(text(&first), text(&again));
    assert_eq!(tickets(&w.store).await, 1, "two calls, one row");
    // The record holds the row's answer, committed by the tool's own transaction.
    let id = RecordId::new(
        Scope::from_parts(["test-agent", "create_ticket"]).unwrap(),
        IdempotencyKey::new("wf-1:step-1").unwrap(),
    );
    let record = w.store.get(&id, SystemClock.now()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
    let stored = record.outcome.unwrap().body_json();
    assert_eq!(stored["content"][0]["text"], json!(text(&first)));

    // Other arguments under the same key: refused, nothing runs.
    let other = w
        .client
        .call_tool(call("create_ticket", Some("wf-1:step-1"), "Another"))
        .await
        .unwrap_err();
    let ServiceError::McpError(error) = other else {
        panic!("an MCP error: {other:?}")
    };
    assert_eq!(error.code, FINGERPRINT_MISMATCH);
    // Without a key: refused (the tool's default key source), nothing runs.
    let keyless = w
        .client
        .call_tool(call("create_ticket", None, "No key"))
        .await;
    assert!(keyless.is_err());
    assert_eq!(tickets(&w.store).await, 1);
}

#[tokio::test]
async fn the_wrapper_lists_advertises_and_passes_other_tools_through() {
    let w = world().await;
    let info = w.client.peer_info().unwrap();
    let experimental = info.capabilities.experimental.clone().unwrap();
    assert!(experimental.contains_key(CAPABILITY), "{experimental:?}");
    let listed = w.client.list_all_tools().await.unwrap();
    let protected = listed.iter().find(|t| t.name == "create_ticket").unwrap();
    assert!(
        protected
            .description
            .as_deref()
            .unwrap()
            .contains("Side-effecting")
    );
    let hints = protected.annotations.clone().unwrap();
    assert_eq!(hints.idempotent_hint, Some(true));
    let read = listed.iter().find(|t| t.name == "count_tickets").unwrap();
    assert_eq!(
        read.description.as_deref(),
        Some("Counts the tickets: a read, not protected.")
    );
    // A tool that is not registered runs every time, without a key.
    for _ in 0..2 {
        let counted = w
            .client
            .call_tool(CallToolRequestParams::new("count_tickets"))
            .await
            .unwrap();
        assert_eq!(text(&counted), "0");
        assert!(!is_replay(&counted));
    }
}
