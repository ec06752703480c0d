//! An axum tool endpoint on PostgreSQL whose effect (a ticket row) and whose idempotency record
//! commit in ONE transaction: a ticket exists if and only if its record is completed.
//!
//! It starts the server on 127.0.0.1:0, posts the same request twice with the same key, and
//! checks that the ticket table holds one row and that the second answer is a replay.
//!
//! ```sh
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run -p idemkit --example axum_postgres --features postgres,client
//! ```
//!
//! Everything lives in a schema of its own (`idem_example_<unique>`), dropped at the end.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Extension, Json, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Router, routing::post};
use idemkit::http::IdempotencyLayer;
use idemkit::http::client::{RetryPolicy, ToolClient};
use idemkit::machine::CompleteAnswer;
use idemkit::postgres::PostgresStore;
use idemkit::postgres::sqlx::{self, AssertSqlSafe};
use idemkit::{Attempt, Executor, IdempotencyKey, Outcome};
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct App {
    store: PostgresStore,
    tickets: String, // the effect's table, schema-qualified
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        println!("axum_postgres: skipped (IDEM_TEST_POSTGRES_URL is not set)");
        return Ok(());
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() % 1_000_000_000;
    let schema = format!("idem_example_{}_{nanos}", std::process::id());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    let store = PostgresStore::with_table(pool.clone(), &schema, "idem_records")?;
    store.migrate().await?; // creates the schema and the records table
    let tickets = format!("{schema}.tickets");
    // Table names are ours, built above: sqlx 0.9 asks us to vouch for SQL built at run time.
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {tickets} (id BIGSERIAL PRIMARY KEY, title TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await?;

    let result = demo(App { store, tickets }).await;
    sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await?;
    result
}

async fn demo(app: App) -> Result<(), BoxError> {
    // The layer claims the key before the handler runs and replays the stored answer after.
    let executor = Executor::new(app.store.clone());
    // Who is asking: from your authentication in a real server (it is part of the record's scope).
    let layer = IdempotencyLayer::new(executor, |_parts| Ok("tenant-acme".to_owned()));
    let router = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/tools/create_ticket", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });

    // The agent's side: the key comes from its durable workflow step, the same on every retry.
    let client = ToolClient::new(url, RetryPolicy::default(), None)?;
    let key = IdempotencyKey::for_step("wf-8812", "step-3", "create_ticket")?;
    let args = json!({"title": "Printer on fire"});
    let first = client.call(&key, &args).await?;
    let second = client.call(&key, &args).await?;

    let (rows,): (i64,) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        app.tickets
    )))
    .fetch_one(app.store.pool())
    .await?;
    let (answer, again) = (first.original_response(), second.original_response());
    println!(
        "first: {} {answer}; second: {} {again} (replayed: {})",
        first.status, second.status, second.replayed
    );
    println!("ticket rows: {rows}");
    check(
        first.status == StatusCode::CREATED && !first.replayed,
        "the first call runs the tool",
    )?;
    check(
        second.replayed && again == answer,
        "the second call replays the same answer",
    )?;
    check(rows == 1, "exactly one ticket row")?;
    println!("axum_postgres: ok");
    Ok(())
}

/// The tool: the layer put the claim (`Attempt`) in the request's extensions.
async fn create_ticket(
    State(app): State<App>,
    Extension(attempt): Extension<Attempt>,
    Json(args): Json<Value>,
) -> Response {
    match insert_and_complete(&app, &attempt, &args).await {
        // Committed with the effect and marked recorded, so the layer does not complete it again.
        Ok(Some(body)) => (StatusCode::CREATED, Json(body)).into_response(),
        Ok(None) => (StatusCode::CONFLICT, "lost the claim; no ticket created").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// Inserts the ticket and completes the record in one transaction; `None` if another attempt
/// holds the claim (rolled back: no ticket).
async fn insert_and_complete(
    app: &App,
    attempt: &Attempt,
    args: &Value,
) -> Result<Option<Value>, BoxError> {
    let mut tx = app.store.pool().begin().await?;
    let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(format!(
        "INSERT INTO {} (title) VALUES ($1) RETURNING id",
        app.tickets
    )))
    .bind(args["title"].as_str().unwrap_or_default())
    .fetch_one(&mut *tx)
    .await?;
    let body = json!({"ticket_id": id});
    // Stored as the executor would store it (its codec, its policy), so the layer replays it.
    let outcome = attempt.encode(&Outcome::definitive(201, &body)?)?;
    // At the attempt's clock, under its policy.
    let answer = app.store.complete_in(&mut tx, attempt, &outcome).await?;
    if answer == CompleteAnswer::Fenced {
        tx.rollback().await?;
        return Ok(None);
    }
    tx.commit().await?;
    attempt.mark_recorded(); // committed with the ticket: the executor must not complete it again
    Ok(Some(body))
}

fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("axum_postgres: FAILED: {what}").into())
    }
}
