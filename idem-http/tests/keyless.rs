//! Requests without `Idempotency-Key` under each key source of the layer ([contract
//! §5.1](idem_core::contract#keyless)), over real HTTP on loopback, counting tickets where they
//! land.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_conformance::kit::{FaultStore, Op};
use idem_core::store::ListFilter;
use idem_core::{
    Executor, KeyOrigin, KeySource, KeyStore, ManualClock, MemoryStore, Policy, Timestamp,
};
use idem_http::{IDEMPOTENCY_KEY_SOURCE, IdempotencyLayer, Problem};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// Where the tool's effect lands: one row per ticket (tenant, the body the tool saw).
#[derive(Default)]
struct Sink(Mutex<Vec<(String, Value)>>);

struct Tool {
    sink: Arc<Sink>,
    hold: Option<Arc<Semaphore>>,
}

async fn create_ticket(
    State(tool): State<Arc<Tool>>,
    headers: axum::http::HeaderMap,
    axum::Json(args): axum::Json<Value>,
) -> (StatusCode, axum::Json<Value>) {
    if let Some(hold) = &tool.hold {
        hold.acquire().await.unwrap().forget();
    }
    let tenant = headers["x-tenant-id"].to_str().unwrap().to_owned();
    let mut tickets = tool.sink.0.lock().unwrap();
    tickets.push((tenant, args));
    let id = format!("T-{}", tickets.len());
    (StatusCode::CREATED, axum::Json(json!({"ticket_id": id})))
}

struct Server {
    url: String,
    sink: Arc<Sink>,
    clock: ManualClock,
    store: Arc<dyn KeyStore>,
    /// The same store, counting the calls that reached it.
    counted: FaultStore<MemoryStore>,
}

impl Server {
    fn tickets(&self) -> usize {
        self.sink.0.lock().unwrap().len()
    }

    async fn post(&self, tenant: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
        let mut request = idem_http::client::http_client_builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
            .post(&self.url)
            .header("x-tenant-id", tenant)
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.unwrap()
    }
}

/// A server whose layer is `configure`d, with a 10 s lease and a 24 h ttl for sent keys.
async fn serve(
    hold: Option<Arc<Semaphore>>,
    configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Server {
    serve_with(hold, |e| e, configure).await
}

/// The tests' tool: a 10 s lease, `source` for a request without a key, then `set`.
fn protected(
    source: KeySource,
    set: impl FnOnce(idem_core::ToolBuilder) -> idem_core::ToolBuilder,
) -> idem_core::Tool {
    let policy = Policy::builder()
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    set(idem_core::Tool::builder().policy(policy).key_source(source))
        .build()
        .unwrap()
}

/// [`serve`], its executor `set` up first.
async fn serve_with(
    hold: Option<Arc<Semaphore>>,
    set: impl FnOnce(Executor) -> Executor,
    configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Server {
    let counted = FaultStore::new(MemoryStore::new());
    let store: Arc<dyn KeyStore> = Arc::new(counted.clone());
    let sink = Arc::new(Sink::default());
    let clock = ManualClock::starting_now();
    let executor = Executor::from_arc(store.clone())
        .with_policy(
            Policy::builder()
                .lease(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .with_clock(clock.clone());
    let layer = IdempotencyLayer::new(set(executor), |parts| {
        let tenant = parts
            .headers
            .get("x-tenant-id")
            .and_then(|v| v.to_str().ok());
        tenant
            .map(str::to_owned)
            .ok_or_else(|| Problem::Unauthenticated("no tenant".into()))
    });
    let tool = Arc::new(Tool {
        sink: sink.clone(),
        hold,
    });
    let app = Router::new()
        .route("/tools/create_ticket", post(create_ticket))
        .route_layer(configure(layer))
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
        counted,
    }
}

fn ticket(title: &str) -> Value {
    json!({"title": title, "account_id": "A-7"})
}

fn replayed(answer: &reqwest::Response) -> bool {
    answer.headers().contains_key("idempotency-replayed")
}

fn source(answer: &reqwest::Response) -> Option<&str> {
    answer
        .headers()
        .get(IDEMPOTENCY_KEY_SOURCE)
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn refuse_is_the_default_and_nothing_runs() {
    let s = serve(None, |l| l).await;
    let answer = s.post("t", None, &ticket("x")).await;
    assert_eq!(answer.status(), 400);
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:key-required");
    assert_eq!(s.tickets(), 0);
}

/// Under the default, a request without a key is refused for the key before anything else of
/// it is looked at: without a principal and with a body over the limit it still learns that it
/// must send a key (not 401 or 413, which a retry with a key would then meet), and nothing runs.
#[tokio::test]
async fn refuse_answers_key_required_before_the_principal_and_the_body() {
    let s = serve(None, |l| l.body_limit(16)).await;
    let answer = idem_http::client::http_client()
        .unwrap()
        .post(&s.url)
        .json(&ticket("a title well over sixteen bytes"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:key-required");
    assert_eq!(s.tickets(), 0);
    assert_eq!(s.counted.calls(Op::Claim), 0);
}

/// The body limit is inclusive: a body of exactly the limit, its length declared, runs; one
/// byte more is refused (413) and nothing runs.
#[tokio::test]
async fn a_body_of_exactly_the_limit_runs_one_byte_more_is_refused() {
    let body = ticket("x");
    let limit = serde_json::to_vec(&body).unwrap().len();
    let s = serve(None, |l| l.body_limit(limit)).await;
    let answer = s.post("t", Some("exact"), &body).await;
    assert_eq!(answer.status(), 201);
    assert_eq!(s.tickets(), 1);
    let answer = s.post("t", Some("over"), &ticket("xy")).await;
    assert_eq!(answer.status(), 413);
    assert_eq!(s.tickets(), 1);
}

/// Sends `body` to `url` over a plain TCP connection as HTTP/1.1 chunks, its length not
/// declared (as a streaming client sends it), each item of `chunks` written as it is: the status
/// the server answers.
async fn post_chunked(url: &str, key: &str, chunks: &[&[u8]]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nx-tenant-id: t\r\nidempotency-key: {key}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    for chunk in chunks {
        // A write may fail once the server has answered and closed: what it answered counts.
        if tcp.write_all(chunk).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split(' ')
        .nth(1)
        .unwrap_or_else(|| panic!("no answer: {answer:?}"));
    status.parse().unwrap()
}

/// One HTTP/1.1 chunk of `data`.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// A body whose length is not declared (chunked) is held to the limit as it is read: within it
/// the tool runs; past it the answer is 413, as for a declared length, and nothing is claimed or
/// runs.
#[tokio::test]
async fn an_undeclared_length_is_held_to_the_limit_as_it_is_read() {
    let body = serde_json::to_vec(&ticket("x")).unwrap();
    let s = serve(None, |l| l.body_limit(body.len())).await;
    let (a, b) = body.split_at(body.len() / 2);
    let within = [chunk(a), chunk(b), b"0\r\n\r\n".to_vec()];
    let within: Vec<&[u8]> = within.iter().map(Vec::as_slice).collect();
    assert_eq!(post_chunked(&s.url, "within", &within).await, 201);
    assert_eq!(s.tickets(), 1);

    let over = serde_json::to_vec(&ticket("xy")).unwrap();
    let (a, b) = over.split_at(over.len() / 2);
    let over = [chunk(a), chunk(b), b"0\r\n\r\n".to_vec()];
    let over: Vec<&[u8]> = over.iter().map(Vec::as_slice).collect();
    assert_eq!(post_chunked(&s.url, "over", &over).await, 413);
    assert_eq!(s.tickets(), 1);
    assert_eq!(s.counted.calls(Op::Claim), 1, "only the first was claimed");
}

/// A body that cannot be read (a broken chunk) is the caller's error, 400 and not 413, however
/// small: nothing is claimed or runs.
#[tokio::test]
async fn a_body_that_cannot_be_read_is_400_and_nothing_runs() {
    let s = serve(None, |l| l.body_limit(1 << 20)).await;
    let broken: [&[u8]; 2] = [b"4\r\n{\"a\"\r\n", b"zz-not-a-chunk-size\r\n\r\n"];
    assert_eq!(post_chunked(&s.url, "broken", &broken).await, 400);
    assert_eq!(s.tickets(), 0);
    assert_eq!(s.counted.calls(Op::Claim), 0);
}

#[tokio::test]
async fn arguments_repeat_replays_other_body_runs_and_tenants_are_apart() {
    let s = serve(None, |l| l.tool(protected(KeySource::arguments(), |t| t))).await;
    let first = s.post("tenant-a", None, &ticket("Printer on fire")).await;
    assert_eq!(
        (first.status(), replayed(&first)),
        (StatusCode::CREATED, false)
    );
    assert_eq!(source(&first), Some("arguments"));
    let first: Value = first.json().await.unwrap();
    // Key order and white space do not matter: the canonical body.
    let again = s
        .post(
            "tenant-a",
            None,
            &json!({"account_id": "A-7", "title": "Printer on fire"}),
        )
        .await;
    assert!(replayed(&again));
    assert_eq!(source(&again), Some("arguments"));
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["original_response"], first["original_response"]);
    assert_eq!(s.tickets(), 1);
    // Another body: another operation.
    let other = s
        .post("tenant-a", None, &ticket("Printer out of toner"))
        .await;
    assert!(!replayed(&other));
    assert_eq!(s.tickets(), 2);
    // Another tenant with the same body: its own operation.
    let b = s.post("tenant-b", None, &ticket("Printer on fire")).await;
    assert!(!replayed(&b));
    assert_eq!(s.tickets(), 3);
    // The records carry their source.
    let records = s
        .store
        .list(&ListFilter::default(), Timestamp::from_millis(0), 100)
        .await
        .unwrap();
    assert_eq!(records.len(), 3);
    assert!(
        records
            .iter()
            .all(|r| r.key_origin() == KeyOrigin::Arguments)
    );
}

#[tokio::test]
async fn a_sent_key_wins_over_the_derived_one() {
    let s = serve(None, |l| l.tool(protected(KeySource::arguments(), |t| t))).await;
    let derived = s.post("t", None, &ticket("x")).await;
    assert!(!replayed(&derived));
    let sent = s.post("t", Some("wf-1:step-1"), &ticket("x")).await;
    assert!(!replayed(&sent), "the sent key is its own operation");
    assert_eq!(source(&sent), None);
    assert!(replayed(
        &s.post("t", Some("wf-1:step-1"), &ticket("x")).await
    ));
    // A sent key that spells the derived form is refused, not mistaken for it.
    let forged = s.post("t", Some("args:abc"), &ticket("x")).await;
    assert_eq!(forged.status(), 201);
    assert_eq!(s.tickets(), 3);
    assert_eq!(
        s.post("t", Some("args: abc"), &ticket("x")).await.status(),
        400
    );
}

/// Six identical requests without a key at once, the first held until the five others found
/// it in flight: each answer's status, whether it is a replay, its `Retry-After`, and whether it
/// says a preference was applied.
async fn six_at_once(
    s: Arc<Server>,
    hold: Arc<Semaphore>,
) -> Vec<(u16, bool, Option<String>, bool)> {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let s = s.clone();
        calls.spawn(async move {
            let answer = s.post("t", None, &ticket("six")).await;
            let header = |name: &str| {
                let value = answer.headers().get(name);
                value.map(|v| v.to_str().unwrap().to_owned())
            };
            (
                answer.status().as_u16(),
                replayed(&answer),
                header("retry-after"),
                header("preference-applied").is_some(),
            )
        });
    }
    while s.counted.calls(Op::Claim) < 6 {
        tokio::task::yield_now().await;
    }
    hold.add_permits(1);
    calls.join_all().await
}

#[tokio::test]
async fn six_identical_requests_at_once_six_answers_one_ticket() {
    let hold = Arc::new(Semaphore::new(0));
    let s = serve(Some(hold.clone()), |l| {
        l.tool(protected(KeySource::arguments(), |t| t))
    })
    .await;
    let s = Arc::new(s);
    // A client that sends no key cannot ask to wait, so the layer waits for it.
    let answers = six_at_once(s.clone(), hold).await;
    let executed = answers
        .iter()
        .filter(|a| (a.0, a.1) == (201, false))
        .count();
    let replays = answers.iter().filter(|a| (a.0, a.1) == (201, true)).count();
    assert_eq!(
        (executed, replays),
        (1, 5),
        "six answers, no 409: {answers:?}"
    );
    assert!(
        answers.iter().all(|a| !a.3),
        "nothing was asked, so no Preference-Applied: {answers:?}"
    );
    assert_eq!(s.tickets(), 1);
    // Each of them retried now: the replay.
    for _ in 0..5 {
        assert!(replayed(&s.post("t", None, &ticket("six")).await));
    }
    assert_eq!(s.tickets(), 1);
}

#[tokio::test]
async fn a_tool_that_turns_the_wait_off_answers_409_with_retry_after_from_its_window() {
    let hold = Arc::new(Semaphore::new(0));
    let s = serve_with(
        Some(hold.clone()),
        |e| e,
        |l| {
            l.tool(protected(KeySource::arguments(), |t| {
                t.derived_key_wait(false)
                    .processing_window(Duration::from_millis(20))
            }))
        },
    )
    .await;
    let answers = six_at_once(Arc::new(s), hold).await;
    let in_flight: Vec<_> = answers.iter().filter(|a| a.0 == 409).collect();
    assert_eq!(in_flight.len(), 5, "{answers:?}");
    // A 20 ms tool under a 10 s lease: ask again in a second, not in ten.
    assert!(
        in_flight.iter().all(|a| a.2.as_deref() == Some("1")),
        "{answers:?}"
    );
}

#[tokio::test]
async fn pointers_and_key_from_choose_what_the_key_covers() {
    let s = serve(None, |l| {
        l.tool(protected(KeySource::arguments_at(["/title"]), |t| t))
    })
    .await;
    assert!(!replayed(&s.post("t", None, &ticket("x")).await));
    // Same title, another account: the same key, another request: 422, nothing runs.
    let other = s
        .post("t", None, &json!({"title": "x", "account_id": "B"}))
        .await;
    assert_eq!(other.status(), 422);
    assert_eq!(s.tickets(), 1);

    let s = serve(None, |l| {
        l.tool(protected(KeySource::arguments(), |t| t))
            .key_from(|parts, body| Ok(json!([parts.uri.path(), body["title"]])))
            .fingerprint_with(|_, body| Ok(body["title"].clone()))
    })
    .await;
    assert!(!replayed(&s.post("t", None, &ticket("y")).await));
    let note = json!({"title": "y", "account_id": "A-7", "note": "again"});
    assert!(replayed(&s.post("t", None, &note).await));
    assert_eq!(s.tickets(), 1);
}

#[tokio::test]
async fn model_argument_is_the_key_and_the_tool_never_sees_it() {
    let s = serve(None, |l| {
        l.tool(protected(KeySource::model_argument(), |t| t))
    })
    .await;
    let with = |id: &str| json!({"title": "x", "account_id": "A-7", "idempotency_key": id});
    let first = s.post("t", None, &with("op-1")).await;
    assert_eq!(source(&first), Some("model_argument"));
    assert!(replayed(&s.post("t", None, &with("op-1")).await));
    assert!(!replayed(&s.post("t", None, &with("op-2")).await));
    assert_eq!(s.tickets(), 2);
    let seen = s.sink.0.lock().unwrap().clone();
    assert!(
        seen.iter().all(|(_, body)| *body == ticket("x")),
        "{seen:?}"
    );
    let missing = s.post("t", None, &ticket("x")).await;
    assert_eq!(missing.status(), 400);
    assert_eq!(
        s.post("t", None, &json!({"idempotency_key": 7}))
            .await
            .status(),
        400
    );
    assert_eq!(s.tickets(), 2);
}

#[tokio::test]
async fn unprotected_runs_every_time() {
    let s = serve(None, |l| l.tool(protected(KeySource::Unprotected, |t| t))).await;
    for _ in 0..2 {
        let answer = s.post("t", None, &ticket("x")).await;
        assert_eq!(
            (answer.status(), source(&answer)),
            (StatusCode::CREATED, None)
        );
    }
    assert_eq!(s.tickets(), 2);
}

#[tokio::test]
async fn the_window_is_the_derived_records_ttl() {
    let s = serve(None, |l| {
        l.tool(protected(KeySource::arguments(), |t| {
            t.key_window(Duration::from_secs(600))
        }))
    })
    .await;
    assert!(!replayed(&s.post("t", None, &ticket("w")).await));
    let record = s
        .store
        .list(&ListFilter::default(), Timestamp::from_millis(0), 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        record.expires_at.as_millis() - record.updated_at.as_millis(),
        600_000,
        "kept for the window"
    );
    s.clock.advance(Duration::from_secs(599));
    assert!(replayed(&s.post("t", None, &ticket("w")).await));
    s.clock.advance(Duration::from_secs(2));
    assert!(
        !replayed(&s.post("t", None, &ticket("w")).await),
        "after the window the same request is a new operation"
    );
    assert_eq!(s.tickets(), 2);
    // A sent key keeps the executor's ttl (24 h).
    s.post("t", Some("k-1"), &ticket("w")).await;
    let sent = s
        .store
        .list(&ListFilter::default(), Timestamp::from_millis(0), 10)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.key.as_str() == "k-1")
        .unwrap();
    assert_eq!(
        sent.expires_at.as_millis() - sent.updated_at.as_millis(),
        24 * 3600 * 1000
    );
}
