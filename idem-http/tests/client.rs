//! The retrying tool client against real servers on loopback: the key is reused on every attempt,
//! `Retry-After` is honoured, the deadline rule is enforced.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem_core::{Executor, IdempotencyKey, MemoryStore, Policy};
use idem_http::IdempotencyLayer;
use idem_http::client::{ClientError, DeadlineExceeded, RetryPolicy, ShortAttempt, ToolClient};
use serde_json::{Value, json};

/// What the server saw: the key of every request, and the tickets created.
#[derive(Default)]
struct Seen {
    keys: Mutex<Vec<String>>,
    arrivals: Mutex<Vec<Instant>>,
    tickets: Mutex<u32>,
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// The create_ticket tool behind the layer, taking `latency` to work, publishing
/// `min_client_deadline_ms` on `GET /tools`.
async fn tool_server(latency: Duration, seen: Arc<Seen>) -> String {
    let executor = Executor::new(MemoryStore::new()).with_policy(
        Policy::builder()
            .lease(Duration::from_secs(5))
            .build()
            .unwrap(),
    );
    let layer = IdempotencyLayer::new(executor, |_| Ok("public".into()));
    let tool = {
        let seen = seen.clone();
        move || async move {
            tokio::time::sleep(latency).await;
            let mut n = seen.tickets.lock().unwrap();
            *n += 1;
            (
                StatusCode::CREATED,
                axum::Json(json!({"ticket_id": format!("T-{n}")})),
            )
        }
    };
    let record = {
        let seen = seen.clone();
        move |headers: HeaderMap, req: axum::extract::Request, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                // The key as the layer reads it (the client sends a structured-field string).
                let key = idem_http::read_key(&headers).map(|k| k.as_str().to_owned());
                seen.keys.lock().unwrap().push(key.unwrap_or_default());
                seen.arrivals.lock().unwrap().push(Instant::now());
                next.run(req).await
            }
        }
    };
    let app = Router::new()
        .route("/tools/create_ticket", post(tool))
        .route_layer(layer)
        .route_layer(axum::middleware::from_fn(record))
        .route(
            "/tools",
            get(|| async {
                axum::Json(
                    json!({"tools": [{"name": "create_ticket", "min_client_deadline_ms": 1500}]}),
                )
            }),
        );
    listen(app).await
}

fn args() -> Value {
    json!({"title": "Printer on fire", "account_id": "A-7"})
}

#[tokio::test]
async fn retries_reuse_the_key_and_end_with_the_replay() {
    // Real latency on purpose: the tool takes 600 ms, attempts give up after 200 ms.
    let seen = Arc::new(Seen::default());
    let base = tool_server(Duration::from_millis(600), seen.clone()).await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(200),
        overall_deadline: Duration::from_secs(10),
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        allow_short_attempts: true,
    };
    let client = ToolClient::new(format!("{base}/tools/create_ticket"), policy, None).unwrap();
    let key = IdempotencyKey::for_step("wf-1", "step-1", "create_ticket").unwrap();
    let answer = client.call(&key, &args()).await.unwrap();
    assert_eq!(answer.status, 201);
    assert!(
        answer.replayed,
        "the answer came from the first attempt's execution"
    );
    assert!(
        answer.attempts >= 2 && answer.failed_attempts >= 1,
        "{answer:?}"
    );
    assert_eq!(answer.original_response()["ticket_id"], "T-1");
    assert_eq!(*seen.tickets.lock().unwrap(), 1, "one ticket");
    let keys = seen.keys.lock().unwrap();
    assert_eq!(
        keys.len() as u32,
        answer.attempts,
        "every attempt reached the server"
    );
    assert!(
        keys.iter().all(|k| k == "wf-1:step-1:create_ticket"),
        "the same key on every attempt: {keys:?}"
    );
}

#[tokio::test]
async fn retry_after_is_honoured() {
    // A server that answers 409 with Retry-After: 1 once, then 200.
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route(
            "/tool",
            post(|State(seen): State<Arc<Seen>>| async move {
                let n = {
                    let mut arrivals = seen.arrivals.lock().unwrap();
                    arrivals.push(Instant::now());
                    arrivals.len()
                };
                if n == 1 {
                    (StatusCode::CONFLICT, [("retry-after", "1")], "{}").into_response()
                } else {
                    (StatusCode::OK, axum::Json(json!({"ok": true, "idempotent_replay": false, "original_response": {}}))).into_response()
                }
            }),
        )
        .with_state(seen.clone());
    let base = listen(app).await;
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let client = ToolClient::new(format!("{base}/tool"), policy, None).unwrap();
    let answer = client
        .call(&IdempotencyKey::new("k").unwrap(), &args())
        .await
        .unwrap();
    assert_eq!((answer.attempts, answer.in_flight), (2, 1));
    let arrivals = seen.arrivals.lock().unwrap();
    assert!(
        arrivals[1] - arrivals[0] >= Duration::from_secs(1),
        "waited {:?}, less than Retry-After",
        arrivals[1] - arrivals[0]
    );
}

/// `create_ticket` discovered from the tool server at `base`, with `policy`.
async fn discover_create_ticket(
    base: &str,
    policy: RetryPolicy,
) -> Result<ToolClient, ClientError> {
    ToolClient::discover(
        &format!("{base}/tools"),
        "create_ticket",
        format!("{base}/tools/create_ticket"),
        policy,
    )
    .await
}

#[tokio::test]
async fn the_deadline_rule_reads_the_published_minimum() {
    let seen = Arc::new(Seen::default());
    let base = tool_server(Duration::ZERO, seen.clone()).await;
    let short = RetryPolicy {
        attempt_timeout: Duration::from_millis(500),
        ..RetryPolicy::default()
    };
    let err = discover_create_ticket(&base, short).await.unwrap_err();
    match err {
        ClientError::DeadlineBelowMinimum(ShortAttempt {
            attempt_timeout,
            min_client_deadline,
        }) => {
            assert_eq!(attempt_timeout, Duration::from_millis(500));
            assert_eq!(min_client_deadline, Duration::from_millis(1500));
        }
        other => panic!("expected DeadlineBelowMinimum, got {other:?}"),
    }
    let enough = RetryPolicy {
        attempt_timeout: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let client = discover_create_ticket(&base, enough).await.unwrap();
    assert_eq!(
        client.min_client_deadline(),
        Some(Duration::from_millis(1500))
    );
    let unknown = ToolClient::discover(
        &format!("{base}/tools"),
        "delete_everything",
        format!("{base}/x"),
        enough,
    )
    .await;
    assert!(matches!(unknown, Err(ClientError::Discovery(_))));
    assert_eq!(*seen.tickets.lock().unwrap(), 0, "discovery runs no tool");
}

#[tokio::test]
async fn a_refusal_is_not_retried() {
    let seen = Arc::new(Seen::default());
    let base = tool_server(Duration::ZERO, seen.clone()).await;
    let client = ToolClient::new(
        format!("{base}/tools/create_ticket"),
        RetryPolicy::default(),
        None,
    )
    .unwrap();
    let key = IdempotencyKey::new("k-r").unwrap();
    client.call(&key, &args()).await.unwrap();
    let err = client
        .call(&key, &json!({"title": "other"}))
        .await
        .unwrap_err();
    match err {
        ClientError::Refused { status, body } => {
            assert_eq!(status, 422);
            assert_eq!(body["type"], "urn:idem:problem:fingerprint-mismatch");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(
        seen.keys.lock().unwrap().len(),
        2,
        "the refusal was not retried"
    );
}

#[tokio::test]
async fn the_overall_deadline_stops_retries() {
    let app = Router::new().route(
        "/tool",
        post(|| async { (StatusCode::SERVICE_UNAVAILABLE, "down") }),
    );
    let base = listen(app).await;
    let policy = RetryPolicy {
        overall_deadline: Duration::from_millis(600),
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..RetryPolicy::default()
    };
    let client = ToolClient::new(format!("{base}/tool"), policy, None).unwrap();
    match client
        .call(&IdempotencyKey::new("k").unwrap(), &args())
        .await
    {
        Err(ClientError::DeadlineExceeded(DeadlineExceeded { attempts, last })) => {
            assert!(attempts >= 2, "retried before giving up");
            assert!(last.contains("503"), "{last}");
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
}

#[tokio::test]
async fn every_valid_key_reaches_the_server_unchanged() {
    // Found with the fuzz target `http_key` (its round-trip property): the client sent the key
    // bare, and a bare value starting with '"' is a structured-field string to the server, so the
    // key `"abc"` reached it as `abc` (another key: it replayed `abc`'s ticket) and `"a` was
    // refused. The client now always sends a structured-field string.
    let seen = Arc::new(Seen::default());
    let base = tool_server(Duration::ZERO, seen.clone()).await;
    let client = ToolClient::new(
        format!("{base}/tools/create_ticket"),
        RetryPolicy::default(),
        None,
    )
    .unwrap();
    let texts = ["abc", "\"abc\"", "\"a", "a\"b\\c", "\\"];
    for text in texts {
        let key = IdempotencyKey::new(text).unwrap();
        let answer = client.call(&key, &args()).await.unwrap();
        assert_eq!(answer.status, 201, "{text}");
        assert!(!answer.replayed, "{text} replayed another key's ticket");
    }
    assert_eq!(
        *seen.tickets.lock().unwrap(),
        texts.len() as u32,
        "one ticket per key"
    );
    assert_eq!(*seen.keys.lock().unwrap(), texts);
    // And each one replays itself.
    let answer = client
        .call(&IdempotencyKey::new("\"abc\"").unwrap(), &args())
        .await
        .unwrap();
    assert!(answer.replayed);
    assert_eq!(*seen.tickets.lock().unwrap(), texts.len() as u32);
}
