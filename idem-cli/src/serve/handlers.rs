//! The tool `create_ticket`, with and without the idempotency layer.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use idem_core::Attempt;
use serde_json::{Value, json};

use super::auth::{Tenant, tenant};
use super::tickets::{Answer, Created, NewTicket};
use super::{AppState, DEMO_FAULT_HEADER};

pub(super) async fn create_ticket_unprotected(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Response {
    let work = tokio::spawn(async move {
        let field = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let (Some(title), Some(account_id)) = (field("title"), field("account_id")) else {
            return (StatusCode::UNPROCESSABLE_ENTITY, "{}".to_owned());
        };
        if app.options.demo_faults && headers.get(DEMO_FAULT_HEADER).is_some_and(|v| v == "hang") {
            // Without a record there is no "first attempt": hang the first request of the key.
            let first = app
                .hung
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key_of(&headers));
            if first {
                std::future::pending::<()>().await;
            }
        }
        if !app.options.tool_latency.is_zero() {
            tokio::time::sleep(app.options.tool_latency).await;
        }
        let ticket = NewTicket::new(tenant(&headers), title, account_id, app.options.clock.now());
        match app.backend.tickets.insert(&key_of(&headers), &ticket).await {
            Ok(id) => (StatusCode::CREATED, ticket.outcome(id).body().to_owned()),
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": e.to_string()}).to_string(),
            ),
        }
    });
    match work.await {
        Ok((status, body)) => {
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The key as the layer read it (a structured-field string is unquoted, as the client sends it).
fn key_of(headers: &HeaderMap) -> String {
    idem_http::read_key(headers)
        .map(|key| key.as_str().to_owned())
        .unwrap_or_default()
}

pub(super) async fn create_ticket(
    State(app): State<Arc<AppState>>,
    attempt: Option<Extension<Attempt>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Response {
    // No claim: a request without a key under `--key-source unprotected`.
    let Some(Extension(attempt)) = attempt else {
        return create_ticket_unprotected(State(app), headers, Json(args)).await;
    };
    let field = |name: &str| {
        args.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let (Some(title), Some(account_id)) = (field("title"), field("account_id")) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "title and account_id are required, non-empty strings"})),
        )
            .into_response();
    };
    if app.options.demo_faults
        && attempt.number() == 1
        && headers.get(DEMO_FAULT_HEADER).is_some_and(|v| v == "hang")
    {
        // A holder that crashed mid-flight: it never commits and never answers.
        std::future::pending::<()>().await;
    }
    if let Some(hold) = &app.options.hold {
        let _ = hold
            .acquire()
            .await
            .map(tokio::sync::SemaphorePermit::forget);
    }
    if !app.options.tool_latency.is_zero() {
        tokio::time::sleep(app.options.tool_latency).await;
    }
    let ticket = NewTicket::new(tenant, title, account_id, app.options.clock.now());
    let answer: Answer = Arc::new(NewTicket::outcome);
    match app.backend.tickets.create(&attempt, ticket, answer).await {
        Ok(Created::Ticket {
            outcome, recorded, ..
        }) => {
            if recorded {
                attempt.mark_recorded();
            }
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                outcome.body().to_owned(),
            )
                .into_response()
        }
        Ok(Created::Fenced) => (
            StatusCode::CONFLICT,
            Json(json!({"error": "this attempt lost its claim; no ticket was created"})),
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "ticket not created");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "the ticket could not be stored; no ticket was created"})),
            )
                .into_response()
        }
    }
}
