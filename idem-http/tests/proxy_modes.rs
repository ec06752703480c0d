//! The two settings a proxy in front of an unknown tool needs ([contract
//! §5](idem_core::contract#http)): verbatim replay of every header but the hop-by-hop ones, and a
//! stale record answered as in doubt. In process (`Router` as a tower service), effects counted
//! at the sink.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::BodyExt;
use idem_core::{Executor, ManualClock, MemoryStore, Policy, StalePolicy};
use idem_http::{IdempotencyLayer, Replay};
use tower_service::Service;

/// A tool with headers nobody listed: counts its runs.
async fn create(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [
            (header::CONTENT_TYPE, "text/plain".to_owned()),
            (HeaderName::from_static("x-answer"), format!("answer-{n}")),
            (header::SET_COOKIE, "a=1".to_owned()),
            (header::CONNECTION, "x-hop".to_owned()),
            (HeaderName::from_static("x-hop"), "1".to_owned()),
        ],
        format!("created {n}"),
    )
}

/// A tool that starts its effect and never answers (a holder whose upstream never replied).
async fn hang(State(runs): State<Arc<AtomicUsize>>) -> StatusCode {
    runs.fetch_add(1, Ordering::SeqCst);
    std::future::pending::<()>().await;
    StatusCode::OK
}

fn request(path: &str) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", "k-1")
        .body(Body::from("{}"))
        .unwrap()
}

async fn send(app: &mut Router, path: &str) -> Response<Body> {
    app.call(request(path)).await.unwrap()
}

#[tokio::test]
async fn verbatim_all_headers_replays_every_header_but_hop_by_hop_ones() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Executor::new(MemoryStore::new()), |_| Ok("t".into()))
        .replay(Replay::VerbatimAllHeaders);
    let mut app = Router::new()
        .route("/create", post(create))
        .route_layer(layer)
        .with_state(runs.clone());
    let first = send(&mut app, "/create").await;
    let again = send(&mut app, "/create").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "two requests, one run");
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    for name in ["x-answer", "set-cookie", "content-type"] {
        assert_eq!(again.headers()[name], first.headers()[name], "{name}");
    }
    assert_eq!(again.headers()["x-answer"], "answer-1");
    assert!(
        !again.headers().contains_key("x-hop"),
        "named by Connection"
    );
    assert!(!again.headers().contains_key(header::CONNECTION));
    let body = again.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.as_ref(), b"created 1");
}

/// A hung holder's record past its lease, answered by a layer with or without the setting.
async fn stale_answer(in_doubt: bool) -> (Response<Body>, Response<Body>, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let clock = ManualClock::starting_now();
    let lease = Duration::from_secs(5);
    let policy = Policy::builder()
        .lease(lease)
        .stale(StalePolicy::Reconcile)
        .build()
        .unwrap();
    let executor = Executor::new(MemoryStore::new())
        .with_policy(policy)
        .with_clock(clock.clone())
        .with_heartbeat(None);
    let mut layer = IdempotencyLayer::new(executor, |_| Ok("t".into()));
    if in_doubt {
        layer = layer.in_doubt_when_stale();
    }
    let mut app = Router::new()
        .route("/hang", post(hang))
        .route_layer(layer)
        .with_state(runs.clone());
    // The first request claims and hangs in its own task; its caller gives up.
    let mut first = app.clone();
    let holder = tokio::spawn(async move { send(&mut first, "/hang").await });
    // The effect has happened once the tool counted it (it runs only after the claim).
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let during = send(&mut app, "/hang").await;
    clock.advance(lease + Duration::from_secs(1));
    let after = send(&mut app, "/hang").await;
    holder.abort();
    (during, after, runs.load(Ordering::SeqCst))
}

async fn problem_type(response: Response<Body>) -> String {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    value["type"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_stale_record_is_in_doubt_without_retry_after_when_asked() {
    let (during, after, runs) = stale_answer(true).await;
    assert_eq!(runs, 1, "the tool never runs twice");
    assert_eq!(during.status(), StatusCode::CONFLICT);
    assert!(during.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(problem_type(during).await, "urn:idem:problem:in-flight");
    assert_eq!(after.status(), StatusCode::CONFLICT);
    assert!(!after.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(problem_type(after).await, "urn:idem:problem:in-doubt");
}

#[tokio::test]
async fn a_stale_record_is_in_flight_by_default() {
    let (_, after, runs) = stale_answer(false).await;
    assert_eq!(runs, 1);
    assert_eq!(after.status(), StatusCode::CONFLICT);
    assert!(after.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(problem_type(after).await, "urn:idem:problem:in-flight");
}
