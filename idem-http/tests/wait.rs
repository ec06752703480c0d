//! `Prefer: wait=N` over real HTTP on loopback ([contract §5.2](idem_core::contract#waiting)): a
//! repeat that arrives while the first request runs gets the replay instead of 409, with
//! `Preference-Applied`; the bound passing is 409 as without waiting; `ToolClient` asks to wait
//! by default. Tickets are counted where they land.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{Executor, IdempotencyKey, MemoryStore, Policy};
use idem_http::IdempotencyLayer;
use idem_http::client::{RetryPolicy, ToolClient};
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};

/// The tool: waits for a permit (the test decides when the first attempt ends), then creates a
/// ticket.
struct Tool {
    tickets: Mutex<Vec<String>>,
    hold: Semaphore,
    entered: Notify,
}

async fn create_ticket(
    State(tool): State<Arc<Tool>>,
    axum::Json(args): axum::Json<Value>,
) -> (StatusCode, axum::Json<Value>) {
    tool.entered.notify_one();
    tool.hold.acquire().await.unwrap().forget();
    let mut tickets = tool.tickets.lock().unwrap();
    tickets.push(args["title"].as_str().unwrap_or_default().to_owned());
    let id = format!("T-{}", tickets.len());
    (StatusCode::CREATED, axum::Json(json!({"ticket_id": id})))
}

struct Server {
    url: String,
    tool: Arc<Tool>,
    store: MemoryStore,
}

impl Server {
    fn tickets(&self) -> usize {
        self.tool.tickets.lock().unwrap().len()
    }

    /// Yields until `n` waits are subscribed on the store.
    async fn waiting(&self, n: usize) {
        while self.store.wait_subscriptions() != n {
            tokio::task::yield_now().await;
        }
    }
}

async fn serve(max_wait: Duration) -> Server {
    let store = MemoryStore::new();
    let executor = Executor::new(store.clone())
        .with_policy(
            Policy::builder()
                .lease(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .with_max_wait(max_wait)
        .with_processing_window(Duration::from_millis(20));
    let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".into()));
    let tool = Arc::new(Tool {
        tickets: Mutex::default(),
        hold: Semaphore::new(0),
        entered: Notify::new(),
    });
    let app = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
        .with_state(tool.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/tools/create_ticket",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server { url, tool, store }
}

fn send(server: &Server, prefer: Option<&str>) -> tokio::task::JoinHandle<reqwest::Response> {
    // Through idem-http's client: with reqwest's `rustls-no-provider` (on in the workspace) a bare
    // `reqwest::Client::new()` panics unless a crypto provider was installed first.
    let mut request = idem_http::client::http_client()
        .unwrap()
        .post(&server.url)
        .header("idempotency-key", "wf-1:step-1")
        .json(&json!({"title": "Printer on fire", "account_id": "A-7"}));
    if let Some(prefer) = prefer {
        request = request.header("prefer", prefer);
    }
    tokio::spawn(async move { request.send().await.unwrap() })
}

#[tokio::test]
async fn a_repeat_with_prefer_wait_gets_the_replay_with_preference_applied() {
    let server = serve(Duration::from_secs(30)).await;
    let first = send(&server, None);
    server.tool.entered.notified().await;
    let again = send(&server, Some("wait=5"));
    server.waiting(1).await;
    server.tool.hold.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("preference-applied").is_none());
    let first: Value = first.json().await.unwrap();
    let again = again.await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED, "the replay, not 409");
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(again.headers()["preference-applied"], "wait=5");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["original_response"], first["original_response"]);
    assert_eq!(server.tickets(), 1, "one ticket");
    assert_eq!(server.store.wait_subscriptions(), 0);
}

#[tokio::test]
async fn the_tools_maximum_caps_the_wait_and_a_short_real_bound_passing_is_409() {
    // Asked 5 s, allowed 0.2 s: a short real wait.
    let server = serve(Duration::from_millis(200)).await;
    let first = send(&server, None);
    server.tool.entered.notified().await;
    let started = std::time::Instant::now();
    let again = send(&server, Some("wait=5")).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert!(again.headers().contains_key("retry-after"));
    assert_eq!(again.headers()["preference-applied"], "wait=0.200");
    server.tool.hold.add_permits(1);
    assert_eq!(first.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(server.tickets(), 1);
}

#[tokio::test]
async fn without_prefer_wait_a_repeat_is_409_at_once() {
    let server = serve(Duration::from_secs(30)).await;
    let first = send(&server, None);
    server.tool.entered.notified().await;
    let again = send(&server, None).await.unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert!(again.headers().get("preference-applied").is_none());
    // A 20 ms tool under a 10 s lease: when its window has passed, not when the lease ends.
    assert_eq!(again.headers()["retry-after"], "1");
    server.tool.hold.add_permits(1);
    first.await.unwrap();
    assert_eq!(server.tickets(), 1);
}

#[tokio::test]
async fn the_tool_client_asks_to_wait_and_gets_the_replay_without_a_409() {
    let server = serve(Duration::from_secs(30)).await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    let client = ToolClient::new(server.url.clone(), policy, None).unwrap();
    let key = IdempotencyKey::new("wf-1:step-1").unwrap();
    let args = json!({"title": "Printer on fire", "account_id": "A-7"});
    let first = {
        let (client, key, args) = (client.clone(), key.clone(), args.clone());
        tokio::spawn(async move { client.call(&key, &args).await })
    };
    server.tool.entered.notified().await;
    let again = {
        let (client, key, args) = (client.clone(), key.clone(), args.clone());
        tokio::spawn(async move { client.call(&key, &args).await })
    };
    server.waiting(1).await;
    server.tool.hold.add_permits(1);
    let first = first.await.unwrap().unwrap();
    let again = again.await.unwrap().unwrap();
    assert!(!first.replayed && again.replayed);
    assert_eq!(again.in_flight, 0, "no 409: the tool waited");
    assert_eq!(again.attempts, 1);
    assert_eq!(again.original_response(), first.original_response());
    assert_eq!(server.tickets(), 1);
}
