//! A caller that goes away cannot cancel the tool or lose its outcome ([contract
//! §2](idem_core::contract#states)): the layer runs the claim, the tool and the completion in a
//! task of its own, whether or not the executor has a spawner. In-process (the router as a tower
//! service), so the moment the caller's future is dropped is exact: before the tool started, or
//! while it runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt;
use idem_core::{Executor, IdempotencyKey, KeyStore, MemoryStore, RecordId, RecordState, Scope};
use idem_http::IdempotencyLayer;
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use tower_service::Service;

struct Tool {
    runs: AtomicUsize,
    started: Notify,
    release: Semaphore,
    finished: Notify,
}

async fn create_ticket(State(tool): State<Arc<Tool>>) -> (StatusCode, axum::Json<Value>) {
    let n = tool.runs.fetch_add(1, Ordering::SeqCst) + 1;
    tool.started.notify_one();
    tool.release.acquire().await.unwrap().forget();
    tool.finished.notify_one();
    (
        StatusCode::CREATED,
        axum::Json(json!({"ticket_id": format!("T-{n}")})),
    )
}

fn app(store: &MemoryStore, spawner: bool, tool: &Arc<Tool>) -> Router {
    let mut executor = Executor::new(store.clone());
    if !spawner {
        executor = executor.without_spawner();
    }
    Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(IdempotencyLayer::new(executor, |_| Ok("tenant-a".into())))
        .with_state(tool.clone())
}

fn request(key: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri("/tools/create_ticket")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(r#"{"title":"x"}"#))
        .unwrap()
}

async fn state_of(store: &MemoryStore, key: &str) -> Option<RecordState> {
    let scope = Scope::from_parts(["tenant-a", "/tools/create_ticket"]).unwrap();
    let id = RecordId::new(scope.clone(), IdempotencyKey::new(key).unwrap());
    store
        .get(&id, idem_core::Timestamp::now())
        .await
        .unwrap()
        .map(|r| r.state)
}

/// Polls `future` once, as a caller that then goes away would.
fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(future).poll(&mut cx), Poll::Ready(_))
}

async fn dropped_caller(spawner: bool, while_running: bool) {
    let store = MemoryStore::new();
    let tool = Arc::new(Tool {
        runs: AtomicUsize::new(0),
        started: Notify::new(),
        release: Semaphore::new(0),
        finished: Notify::new(),
    });
    let mut app = app(&store, spawner, &tool);
    let key = format!("wf-1:spawner-{spawner}:running-{while_running}");

    let mut call = Box::pin(app.call(request(&key)));
    assert!(!poll_once(&mut call), "the tool waits to be released");
    if while_running {
        tool.started.notified().await;
        assert_eq!(state_of(&store, &key).await, Some(RecordState::Processing));
    }
    // The caller goes away (its deadline passed, the connection closed).
    drop(call);
    if !while_running {
        tool.started.notified().await;
    }
    tool.release.add_permits(1);
    tool.finished.notified().await;
    // The completion is written after the tool returns: wait for it without a timer.
    while state_of(&store, &key).await != Some(RecordState::Completed) {
        tokio::task::yield_now().await;
    }

    let replay = app.call(request(&key)).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotency-replayed"], "true");
    let body: Value =
        serde_json::from_slice(&replay.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        body,
        json!({"ok": true, "idempotent_replay": true, "original_response": {"ticket_id": "T-1"}})
    );
    assert_eq!(tool.runs.load(Ordering::SeqCst), 1, "the tool ran once");
}

#[tokio::test]
async fn a_caller_dropped_before_the_tool_starts_still_gets_it_run_and_recorded() {
    dropped_caller(true, false).await;
    dropped_caller(false, false).await;
}

#[tokio::test]
async fn a_caller_dropped_while_the_tool_runs_does_not_cancel_it() {
    dropped_caller(true, true).await;
    dropped_caller(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_on_a_multi_threaded_runtime() {
    for (spawner, running) in [(true, false), (true, true), (false, false), (false, true)] {
        dropped_caller(spawner, running).await;
    }
}
