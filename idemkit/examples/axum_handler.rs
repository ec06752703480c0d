//! An axum tool whose side effect runs once per `Idempotency-Key`, however often the agent
//! retries; records in an SQLite file. `cargo run -p idemkit --example axum_handler -F sqlite,http`
use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Json, Router, http::request::Parts, routing::post};
use idemkit::http::{IdempotencyLayer, Problem};
use idemkit::{Executor, sqlite::SqliteStore};
use serde_json::{Value, json};

/// Tickets made: the side effect (in your tool, the call to the helpdesk).
pub static TICKETS: AtomicU64 = AtomicU64::new(0);

async fn create_ticket(Json(args): Json<Value>) -> Json<Value> {
    let n = TICKETS.fetch_add(1, Ordering::SeqCst) + 1; // once per key
    Json(json!({"ticket_id": format!("T-{n}"), "title": args["title"]}))
}

/// The principal: who is asking, from your authentication. Keys are scoped by it.
fn principal(parts: &Parts) -> Result<String, Problem> {
    let tenant = parts
        .headers
        .get("x-tenant-id")
        .and_then(|v| v.to_str().ok());
    tenant
        .map(str::to_owned)
        .ok_or(Problem::Unauthenticated("no X-Tenant-Id".into()))
}

/// The tool's route behind the layer: the first request with a key runs the handler, every
/// repeat gets its stored answer.
pub fn app(store: SqliteStore) -> Router {
    let layer = IdempotencyLayer::new(Executor::new(store), principal);
    Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open("idem.sqlite3")?;
    store.migrate()?; // creates the records' table if it is not there
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app(store)).await?;
    Ok(())
}
