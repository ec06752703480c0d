//! The layer over real HTTP on loopback, counting tickets where they land (contract
//! [§4](idem_core::contract#refusals)–[§5](idem_core::contract#http)).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_conformance::kit::{Fault, FaultStore, Op};
use idem_core::{
    Executor, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Policy, RecordId, RecordState,
    Scope,
};
use idem_http::IdempotencyLayer;
use serde_json::{Value, json};
use tokio::sync::{Barrier, Semaphore};

/// Where the tool's effect lands: one row per ticket, with the tenant that asked.
#[derive(Default)]
struct Sink {
    tickets: Mutex<Vec<(String, String)>>,
}

struct Tool {
    sink: Arc<Sink>,
    hold: Option<Arc<Semaphore>>,
}

async fn create_ticket(
    State(tool): State<Arc<Tool>>,
    headers: axum::http::HeaderMap,
    axum::Json(args): axum::Json<Value>,
) -> (StatusCode, axum::Json<Value>) {
    let (Some(title), Some(_)) = (args["title"].as_str(), args["account_id"].as_str()) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"error": "title and account_id are required"})),
        );
    };
    if let Some(hold) = &tool.hold {
        hold.acquire().await.unwrap().forget();
    }
    let tenant = headers
        .get("x-tenant-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("public")
        .to_owned();
    let mut tickets = tool.sink.tickets.lock().unwrap();
    tickets.push((tenant, title.to_owned()));
    let id = format!("T-{}", tickets.len());
    (
        StatusCode::CREATED,
        axum::Json(json!({"ticket_id": id, "title": title, "note": "ünïcode ✓"})),
    )
}

struct Server {
    url: String,
    sink: Arc<Sink>,
    clock: ManualClock,
    store: Arc<dyn KeyStore>,
}

impl Server {
    fn tickets(&self) -> usize {
        self.sink.tickets.lock().unwrap().len()
    }
}

async fn serve(store: Arc<dyn KeyStore>, hold: Option<Arc<Semaphore>>) -> Server {
    let sink = Arc::new(Sink::default());
    let clock = ManualClock::starting_now();
    let executor = Executor::from_arc(store.clone())
        .with_policy(
            Policy::builder()
                .lease(Duration::from_secs(10))
                .ttl(Duration::from_secs(3600))
                .build()
                .unwrap(),
        )
        .with_clock(clock.clone());
    let layer = IdempotencyLayer::new(executor, |parts| {
        Ok(parts
            .headers
            .get("x-tenant-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("public")
            .to_owned())
    })
    .body_limit(4096);
    let tool = Arc::new(Tool {
        sink: sink.clone(),
        hold,
    });
    let app = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(layer)
        .with_state(tool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/tools/create_ticket",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        url,
        sink,
        clock,
        store,
    }
}

async fn memory_server() -> Server {
    serve(Arc::new(MemoryStore::new()), None).await
}

fn args() -> Value {
    json!({"title": "Printer on fire", "account_id": "A-7"})
}

async fn post_json(
    url: &str,
    key: Option<&str>,
    tenant: Option<&str>,
    body: String,
) -> reqwest::Response {
    let client = idem_http::client::http_client().unwrap();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    if let Some(tenant) = tenant {
        req = req.header("x-tenant-id", tenant);
    }
    req.send().await.unwrap()
}

async fn problem(resp: reqwest::Response, status: u16, type_suffix: &str) -> Value {
    assert_eq!(resp.status().as_u16(), status);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["type"],
        format!("urn:idem:problem:{type_suffix}"),
        "{body}"
    );
    assert_eq!(body["status"], status);
    body
}

#[tokio::test]
async fn same_key_twice_one_ticket_and_a_marked_replay() {
    let s = memory_server().await;
    let first = post_json(
        &s.url,
        Some("\"wf-8812:step-3:create_ticket\""),
        None,
        args().to_string(),
    )
    .await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotency-replayed").is_none());
    let first = first.text().await.unwrap();
    // The retry: same key (sent bare this time), same arguments in another key order.
    let again = post_json(
        &s.url,
        Some("wf-8812:step-3:create_ticket"),
        None,
        r#"{"account_id":"A-7",  "title":"Printer on fire"}"#.into(),
    )
    .await;
    assert_eq!(again.status(), 201, "the same status");
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    let again = again.text().await.unwrap();
    assert_eq!(s.tickets(), 1, "one ticket at the sink");
    assert_eq!(
        again,
        first.replace("\"idempotent_replay\":false", "\"idempotent_replay\":true"),
        "the same body but the flag"
    );
    let body: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(body["ok"], true);
    assert_eq!(body["idempotent_replay"], false);
    assert_eq!(body["original_response"]["ticket_id"], "T-1");
    assert_eq!(body["original_response"]["note"], "ünïcode ✓");
}

#[tokio::test]
async fn same_key_other_body_is_422_and_no_ticket() {
    let s = memory_server().await;
    assert_eq!(
        post_json(&s.url, Some("k-1"), None, args().to_string())
            .await
            .status(),
        201
    );
    let other = json!({"title": "Printer fixed", "account_id": "A-7"}).to_string();
    problem(
        post_json(&s.url, Some("k-1"), None, other).await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    assert_eq!(s.tickets(), 1);
}

/// The query string is part of the request ([contract §1](idem_core::contract#words)): `?amount=5`
/// and `?amount=500` with one key and one body are two requests, so the second is refused and the
/// tool runs once; the same parameters in another order, or spelled with other escapes, are the
/// same request.
#[tokio::test]
async fn the_query_string_is_in_the_fingerprint() {
    let s = memory_server().await;
    let post = |query: &'static str| {
        let url = format!("{}?{query}", s.url);
        async move { post_json(&url, Some("k-q"), None, args().to_string()).await }
    };
    let first = post("amount=5&currency=eur").await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotency-replayed").is_none());
    problem(
        post("amount=500&currency=eur").await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    for same in [
        "currency=eur&amount=5",
        "amount=%35&currency=%65ur",
        "&currency=eur&&amount=5",
    ] {
        let again = post(same).await;
        assert_eq!(again.status(), 201, "{same}");
        assert_eq!(again.headers()["idempotency-replayed"], "true", "{same}");
    }
    problem(post("amount=5").await, 422, "fingerprint-mismatch").await;
    problem(
        post("amount=5&currency=eur&amount=5").await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    // Without any query string it is another request too.
    problem(
        post_json(&s.url, Some("k-q"), None, args().to_string()).await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    assert_eq!(s.tickets(), 1, "the tool ran once");

    // Repeated parameters keep their order: a list in another order is another request.
    let url = format!("{}?tag=a&tag=b", s.url);
    assert_eq!(
        post_json(&url, Some("k-tags"), None, args().to_string())
            .await
            .status(),
        201
    );
    let url = format!("{}?tag=b&tag=a", s.url);
    problem(
        post_json(&url, Some("k-tags"), None, args().to_string()).await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    assert_eq!(s.tickets(), 2);
}

#[tokio::test]
async fn refused_input_is_a_problem_and_writes_nothing() {
    let s = memory_server().await;
    let body = problem(
        post_json(&s.url, None, None, args().to_string()).await,
        400,
        "key-required",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("Idempotency-Key"));
    let body = problem(
        post_json(&s.url, Some(""), None, args().to_string()).await,
        400,
        "invalid-key",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("empty"), "{body}");
    let long = "k".repeat(256);
    let body = problem(
        post_json(&s.url, Some(&long), None, args().to_string()).await,
        400,
        "invalid-key",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("255"), "{body}");
    let body = problem(
        post_json(&s.url, Some("\"a b\""), None, args().to_string()).await,
        400,
        "invalid-key",
    )
    .await;
    assert!(
        body["detail"].as_str().unwrap().contains("visible ASCII"),
        "{body}"
    );
    problem(
        post_json(&s.url, Some("k-2"), None, "{not json".into()).await,
        400,
        "invalid-body",
    )
    .await;
    problem(
        post_json(&s.url, Some("k-3"), None, String::new()).await,
        400,
        "invalid-body",
    )
    .await;
    let big = json!({"title": "x".repeat(5000), "account_id": "A"}).to_string();
    problem(
        post_json(&s.url, Some("k-4"), None, big).await,
        413,
        "body-too-large",
    )
    .await;
    assert_eq!(s.tickets(), 0, "no effect");
    let now = idem_core::Clock::now(&s.clock);
    for key in ["k-2", "k-3", "k-4"] {
        let scope = Scope::from_parts(["public", "/tools/create_ticket"]).unwrap();
        let id = RecordId::new(scope.clone(), IdempotencyKey::new(key).unwrap());
        assert_eq!(
            s.store.get(&id, now).await.unwrap(),
            None,
            "no record written"
        );
    }
}

#[tokio::test]
async fn a_tool_validation_failure_is_definitive_and_replays() {
    let s = memory_server().await;
    let bad = json!({"title": "no account"}).to_string();
    let first = post_json(&s.url, Some("k-v"), None, bad.clone()).await;
    assert_eq!(first.status(), 422);
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["ok"], false);
    assert_eq!(
        body["original_response"]["error"],
        "title and account_id are required"
    );
    let again = post_json(&s.url, Some("k-v"), None, bad).await;
    assert_eq!(again.status(), 422);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
}

#[tokio::test]
async fn thirty_two_concurrent_requests_one_ticket() {
    const N: usize = 32;
    let hold = Arc::new(Semaphore::new(0));
    let s = Arc::new(serve(Arc::new(MemoryStore::new()), Some(hold.clone())).await);
    let gate = Arc::new(Barrier::new(N));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..N {
        let (s, gate) = (s.clone(), gate.clone());
        tasks.spawn(async move {
            // A client of its own: a separate connection per request.
            let client = idem_http::client::http_client_builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            gate.wait().await;
            let resp = client
                .post(&s.url)
                .header("idempotency-key", "wf-1:step-1:create_ticket")
                .json(&args())
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let replayed = resp.headers().get("idempotency-replayed").is_some();
            (status, retry_after, replayed)
        });
    }
    // The tool is held until every other request has had its answer.
    let mut answers = Vec::new();
    while answers.len() < N - 1 {
        answers.push(tasks.join_next().await.unwrap().unwrap());
    }
    hold.add_permits(1);
    answers.push(tasks.join_next().await.unwrap().unwrap());
    let executed = answers
        .iter()
        .filter(|(st, _, rep)| *st == 201 && !rep)
        .count();
    let conflicts: Vec<_> = answers.iter().filter(|(st, _, _)| *st == 409).collect();
    let replays = answers
        .iter()
        .filter(|(st, _, rep)| *st == 201 && *rep)
        .count();
    assert_eq!(executed, 1, "{answers:?}");
    assert_eq!(
        executed + conflicts.len() + replays,
        N,
        "every other answer a 409 or a replay: {answers:?}"
    );
    for (_, retry_after, _) in conflicts {
        let secs: u64 = retry_after
            .as_deref()
            .expect("409 carries Retry-After")
            .parse()
            .unwrap();
        assert!(secs >= 1);
    }
    assert_eq!(s.tickets(), 1, "exactly one ticket");
}

#[tokio::test]
async fn after_expiry_it_runs_again_exactly_once() {
    let s = memory_server().await;
    assert_eq!(
        post_json(&s.url, Some("k-e"), None, args().to_string())
            .await
            .status(),
        201
    );
    s.clock.advance(Duration::from_secs(3601));
    let again = post_json(&s.url, Some("k-e"), None, args().to_string()).await;
    assert_eq!(again.status(), 201);
    assert!(
        again.headers().get("idempotency-replayed").is_none(),
        "the expired record is gone: a new execution"
    );
    let third = post_json(&s.url, Some("k-e"), None, args().to_string()).await;
    assert_eq!(third.headers()["idempotency-replayed"], "true");
    assert_eq!(s.tickets(), 2, "exactly one new ticket");
}

#[tokio::test]
async fn two_tenants_same_key_two_tickets_no_cross_replay() {
    let s = memory_server().await;
    let a = post_json(&s.url, Some("k-t"), Some("tenant-a"), args().to_string()).await;
    let b = post_json(&s.url, Some("k-t"), Some("tenant-b"), args().to_string()).await;
    assert!(a.headers().get("idempotency-replayed").is_none());
    assert!(
        b.headers().get("idempotency-replayed").is_none(),
        "tenant b must not get tenant a's answer"
    );
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_ne!(
        a["original_response"]["ticket_id"],
        b["original_response"]["ticket_id"]
    );
    assert_eq!(s.tickets(), 2);
    let tenants: Vec<String> = s
        .sink
        .tickets
        .lock()
        .unwrap()
        .iter()
        .map(|(t, _)| t.clone())
        .collect();
    assert_eq!(tenants, ["tenant-a", "tenant-b"]);
}

/// Returns once the record `id` is in `state`, read from the store the server writes.
async fn until_state(s: &Server, id: &RecordId, state: RecordState) {
    let reached = async {
        loop {
            let now = idem_core::Clock::now(&s.clock);
            if s.store.get(id, now).await.unwrap().map(|r| r.state) == Some(state) {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    // A guard against a hang, never a measure.
    tokio::time::timeout(Duration::from_secs(10), reached)
        .await
        .unwrap_or_else(|_| panic!("the record never reached {state:?}"));
}

#[tokio::test]
async fn slow_tool_short_client_deadline_retries_get_409_then_the_replay() {
    // The tool works until the test releases it, so every step below happens while it runs.
    let hold = Arc::new(Semaphore::new(0));
    let s = serve(Arc::new(MemoryStore::new()), Some(hold.clone())).await;
    let key = "wf-2:step-1:create_ticket";
    let id = RecordId::new(
        Scope::from_parts(["public", "/tools/create_ticket"]).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    );
    let client = idem_http::client::http_client().unwrap();
    let send = || {
        client
            .post(&s.url)
            .header("idempotency-key", key)
            .json(&args())
            .send()
    };
    // The first attempt's deadline passes while the tool works: its client gives up once the
    // claim is recorded.
    tokio::select! {
        sent = send() => panic!("the held tool answered: {sent:?}"),
        () = until_state(&s, &id, RecordState::Processing) => {}
    }
    let conflict = send().await.unwrap();
    assert_eq!(conflict.status(), 409, "a retry while it runs");
    let wait: u64 = conflict.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1);
    // The abandoned attempt's work goes on and completes the record once released.
    hold.add_permits(1);
    until_state(&s, &id, RecordState::Completed).await;
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotency-replayed"], "true");
    assert_eq!(
        s.tickets(),
        1,
        "the abandoned attempt's ticket is the only one"
    );
}

#[tokio::test]
async fn store_down_is_503_and_the_tool_does_not_run() {
    // A store that is down: every claim fails as unreachable.
    let down = FaultStore::new(MemoryStore::new());
    down.fail_next(Op::Claim, usize::MAX, Fault::Unavailable);
    let s = serve(Arc::new(down.clone()), None).await;
    problem(
        post_json(&s.url, Some("k-d"), None, args().to_string()).await,
        503,
        "store-unavailable",
    )
    .await;
    assert_eq!(s.tickets(), 0, "never a silent proceed");
    let forwarded = Op::ALL.map(|op| down.calls(op));
    assert_eq!(forwarded, [0; 8], "nothing but the failed claim was tried");
}

/// A tool that fails retryably (503) on its first call and succeeds after.
async fn flaky_server(layer_classify_503_definitive: bool) -> (String, Arc<Mutex<Vec<u16>>>) {
    let calls: Arc<Mutex<Vec<u16>>> = Arc::default();
    let executor = Executor::new(MemoryStore::new());
    let mut layer = IdempotencyLayer::new(executor, |_| Ok("public".into()));
    if layer_classify_503_definitive {
        layer = layer.classify_with(|status| {
            if status == StatusCode::SERVICE_UNAVAILABLE {
                idem_core::OutcomeClass::Definitive
            } else {
                idem_http::default_classify(status)
            }
        });
    }
    let seen = calls.clone();
    let tool = move || {
        let seen = seen.clone();
        async move {
            let mut calls = seen.lock().unwrap();
            let status = if calls.is_empty() { 503 } else { 201 };
            calls.push(status);
            (
                StatusCode::from_u16(status).unwrap(),
                axum::Json(json!({"n": calls.len()})),
            )
        }
    };
    let app = Router::new().route("/tool", post(tool)).route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tool", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

#[tokio::test]
async fn a_retryable_answer_lets_the_next_request_run_again() {
    let (url, calls) = flaky_server(false).await;
    let first = post_json(&url, Some("k-f"), None, "{}".into()).await;
    assert_eq!(first.status(), 503, "the tool's own answer passes through");
    let second = post_json(&url, Some("k-f"), None, "{}".into()).await;
    assert_eq!(
        second.status(),
        201,
        "5xx is retryable by default: the tool ran again"
    );
    assert!(second.headers().get("idempotency-replayed").is_none());
    let third = post_json(&url, Some("k-f"), None, "{}".into()).await;
    assert_eq!(
        (
            third.status().as_u16(),
            third.headers()["idempotency-replayed"].to_str().unwrap()
        ),
        (201, "true")
    );
    assert_eq!(
        *calls.lock().unwrap(),
        [503, 201],
        "two executions, the success once"
    );
}

#[tokio::test]
async fn classification_is_overridable() {
    let (url, calls) = flaky_server(true).await;
    assert_eq!(
        post_json(&url, Some("k-c"), None, "{}".into())
            .await
            .status(),
        503
    );
    let again = post_json(&url, Some("k-c"), None, "{}".into()).await;
    assert_eq!(
        again.status(),
        503,
        "503 classified definitive: it is the answer for good"
    );
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(*calls.lock().unwrap(), [503], "the tool ran once");
}
