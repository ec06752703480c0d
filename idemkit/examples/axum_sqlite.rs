//! An axum tool endpoint on an embedded SQLite file: the records survive a restart.
//!
//! The tool's effect is outside the database (here: an email "sent", counted in memory, the
//! sink), so the layer records the answer after the tool ran. The example posts a request to a
//! server, stops it, starts a new server with a new store on the same file, retries there with
//! the same key, then sends other arguments under that key, and checks that the email was sent
//! once, the retry was a replay and the changed request was refused (422).
//!
//! ```sh
//! cargo run -p idemkit --example axum_sqlite --features sqlite,client
//! ```
//!
//! Needs no server; the file goes in the system's temp directory and is removed at the end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Json, State};
use axum::http::StatusCode;
use axum::{Router, routing::post};
use idemkit::http::IdempotencyLayer;
use idemkit::http::client::{ClientError, RetryPolicy, ToolClient};
use idemkit::sqlite::SqliteStore;
use idemkit::{Executor, IdempotencyKey};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let path = std::env::temp_dir().join(format!(
        "idem-example-{}-{nanos}.sqlite3",
        std::process::id()
    ));
    let result = demo(&path).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    result
}

async fn demo(path: &Path) -> Result<(), BoxError> {
    let sent = Arc::new(AtomicUsize::new(0)); // emails sent: the effect, counted where it happens
    let key = IdempotencyKey::for_step("wf-8812", "step-4", "send_email")?;
    let args = json!({"to": "ops@example.com", "subject": "Printer on fire"});

    // First server: the agent calls the tool once. Then the server stops.
    let (url, server) = start(path.into(), sent.clone()).await?;
    let first = client(url)?.call(&key, &args).await?;
    server.abort();

    // Restarted: a new store on the same file behind a new server. The agent retries (its first
    // answer was lost, say) with the same key.
    let restarted = client(start(path.into(), sent.clone()).await?.0)?;
    let retry = restarted.call(&key, &args).await?;
    // A different request under the same key is refused, and runs nothing.
    let changed = restarted
        .call(&key, &json!({"to": "ceo@example.com"}))
        .await;

    let emails = sent.load(Ordering::SeqCst);
    println!(
        "first: {} {} (replayed: {})",
        first.status,
        first.original_response(),
        first.replayed
    );
    println!(
        "after the restart: {} (replayed: {})",
        retry.original_response(),
        retry.replayed
    );
    println!("other arguments, same key: {changed:?}");
    println!("emails sent: {emails}");
    check(
        !first.replayed && retry.replayed,
        "the retry after the restart is a replay",
    )?;
    check(
        retry.original_response() == first.original_response(),
        "the replay is the same answer",
    )?;
    let refused = matches!(changed, Err(ClientError::Refused { status, .. }) if status == 422);
    check(
        refused,
        "other arguments under the same key are refused with 422",
    )?;
    check(emails == 1, "exactly one email sent")?;
    println!("axum_sqlite: ok");
    Ok(())
}

/// Opens the store on `path` and serves the tool on 127.0.0.1:0; returns the tool's URL and the
/// server's task.
async fn start(
    path: PathBuf,
    sent: Arc<AtomicUsize>,
) -> Result<(String, JoinHandle<std::io::Result<()>>), BoxError> {
    let store = SqliteStore::open(path)?;
    store.migrate()?; // creates the records table once; a no-op on the second start
    let executor = Executor::new(store);
    // Who is asking: from your authentication in a real server (it is part of the record's scope).
    let layer = IdempotencyLayer::new(executor, |_parts| Ok("tenant-acme".to_owned()));
    let router = Router::new()
        .route("/tools/send_email", post(send_email))
        .route_layer(layer)
        .with_state(sent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/tools/send_email", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((url, server))
}

/// The tool: its effect happens here, once per key; the layer stores and replays its answer.
async fn send_email(
    State(sent): State<Arc<AtomicUsize>>,
    Json(args): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let n = sent.fetch_add(1, Ordering::SeqCst) + 1; // a real tool calls the mail provider here
    (
        StatusCode::ACCEPTED,
        Json(json!({"message_id": format!("m-{n}"), "to": args["to"]})),
    )
}

fn client(url: String) -> Result<ToolClient, ClientError> {
    ToolClient::new(url, RetryPolicy::default(), None)
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("axum_sqlite: FAILED: {what}").into())
    }
}
