//! [contract §2](idem_core::contract#states) over real HTTP: a response too large to keep does not
//! leave the key stuck in `processing` (409 forever). The sink counts how often the tool ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{Executor, MemoryStore, OUTCOME_NOT_KEPT, Policy};
use idem_http::IdempotencyLayer;
use serde_json::{Value, json};

/// What only the tool's real answer contains.
const MARKER: &str = "BIG-RESPONSE-MARKER";

async fn export(State(runs): State<Arc<AtomicUsize>>) -> (StatusCode, axum::Json<Value>) {
    runs.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::CREATED,
        axum::Json(json!({"report": MARKER.repeat(200)})),
    )
}

/// The export tool behind the layer (in `replay` mode) on loopback, keeping outcomes of up to
/// 1 KiB: its URL and the count of its runs.
async fn serve(replay: idem_http::Replay) -> (String, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let executor = Executor::new(MemoryStore::new()).with_policy(
        Policy::builder()
            .lease(Duration::from_secs(10))
            .max_outcome_bytes(1024)
            .build()
            .unwrap(),
    );
    let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".to_owned())).replay(replay);
    let app = Router::new()
        .route("/tools/export", post(export))
        .route_layer(layer)
        .with_state(runs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tools/export", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, runs)
}

#[tokio::test]
async fn a_response_too_large_to_keep_runs_once_and_retries_get_a_final_answer() {
    let (url, runs) = serve(idem_http::Replay::default()).await;
    let client = idem_http::client::http_client().unwrap();
    let post = || {
        client
            .post(&url)
            .header("idempotency-key", "wf-1:step-1:export")
            .json(&json!({"month": "2026-11"}))
            .send()
    };
    let first = post().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotency-replayed").is_none());
    let body: Value = first.json().await.unwrap();
    assert_eq!(
        body["original_response"]["report"],
        MARKER.repeat(200),
        "the first caller gets the tool's real answer"
    );
    for _ in 0..2 {
        let again = post().await.unwrap();
        assert_eq!(again.status(), 201, "the tool's status, not 409");
        assert_eq!(again.headers()["idempotency-replayed"], "true");
        let text = again.text().await.unwrap();
        assert!(!text.contains(MARKER), "{text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (body["ok"].clone(), body["idempotent_replay"].clone()),
            (json!(true), json!(true))
        );
        let problem = &body["original_response"];
        assert_eq!(problem["type"], OUTCOME_NOT_KEPT);
        assert_eq!(problem["original_status"], 201);
        assert_eq!(problem["limit"], 1024);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
}

#[tokio::test]
async fn in_verbatim_mode_too_large_the_first_caller_gets_the_response_and_retries_a_problem() {
    let (url, runs) = serve(idem_http::Replay::verbatim()).await;
    let client = idem_http::client::http_client().unwrap();
    let post = || {
        client
            .post(&url)
            .header("idempotency-key", "wf-1:step-1:export")
            .json(&json!({"month": "2026-11"}))
            .send()
    };
    let first = post().await.unwrap();
    assert_eq!(first.status(), 201);
    let body: Value = first.json().await.unwrap();
    assert_eq!(
        body["report"],
        MARKER.repeat(200),
        "the tool's own response"
    );
    let again = post().await.unwrap();
    assert_eq!(again.status(), 201, "the tool's status, not 409");
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(again.headers()["content-type"], "application/problem+json");
    let problem: Value = again.json().await.unwrap();
    assert_eq!(problem["type"], OUTCOME_NOT_KEPT);
    assert_eq!(problem["original_status"], 201);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
}
