//! The layer's modes over real HTTP on loopback ([contract §5](idem_core::contract#http)):
//! verbatim replay, an optional key, and a fingerprint over part of the body. Every test counts
//! how often the tool ran at the sink.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use idem_core::{Executor, KeyStore, MemoryStore};
use idem_http::{IdempotencyLayer, Problem, Replay};
use serde_json::{Value, json};

/// Where the effects land: one count per run of each tool.
#[derive(Default)]
struct Sink {
    orders: AtomicUsize,
    texts: AtomicUsize,
    files: AtomicUsize,
    payments: AtomicUsize,
}

impl Sink {
    fn runs(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

/// A JSON body with its own spacing, which a replay must keep.
const ORDER_BODY: &str = "{ \"order_id\" : \"O-1\",\n  \"total\": 12.50 }";

/// An existing API: 201, a vendor content type, `Location`, `ETag` and a request id.
async fn create_order(State(sink): State<Arc<Sink>>) -> impl IntoResponse {
    let n = sink.orders.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [
            (
                header::CONTENT_TYPE,
                "application/vnd.acme.order+json; charset=utf-8".to_owned(),
            ),
            (header::LOCATION, "/orders/O-1".to_owned()),
            (header::ETAG, "W/\"rev-1\"".to_owned()),
            (HeaderName::from_static("x-request-id"), format!("req-{n}")),
        ],
        ORDER_BODY,
    )
}

/// A plain-text answer.
async fn send_text(State(sink): State<Arc<Sink>>) -> impl IntoResponse {
    sink.texts.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "queued: ünïcode ✓\r\n  trailing spaces  ",
    )
}

/// Every byte value, invalid UTF-8 included.
fn binary() -> Vec<u8> {
    (0..=255u8).rev().chain([0xff, 0xfe, 0x00, 0xc3]).collect()
}

/// A binary answer.
async fn export_file(State(sink): State<Arc<Sink>>) -> impl IntoResponse {
    sink.files.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Bytes::from(binary()),
    )
}

/// A payment: the tool's JSON answer, counted.
async fn pay(
    State(sink): State<Arc<Sink>>,
    axum::Json(args): axum::Json<Value>,
) -> axum::Json<Value> {
    let n = sink.payments.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(json!({"payment": n, "amount": args["amount"]}))
}

fn executor(store: Arc<dyn KeyStore>) -> Executor {
    Executor::from_arc(store)
}

fn layer(store: &Arc<dyn KeyStore>) -> IdempotencyLayer {
    IdempotencyLayer::new(executor(store.clone()), |_| Ok("tenant-a".to_owned()))
}

async fn serve(app: Router<Arc<Sink>>, sink: Arc<Sink>) -> String {
    let app = app.with_state(sink);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn send(url: &str, key: Option<&str>, body: &str) -> reqwest::Response {
    let mut req = idem_http::client::http_client()
        .unwrap()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.send().await.unwrap()
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

async fn answer(resp: reqwest::Response) -> Answer {
    Answer {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.bytes().await.unwrap().to_vec(),
    }
}

#[tokio::test]
async fn verbatim_replays_status_listed_headers_and_body_byte_for_byte() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let verbatim = layer(&store).replay(Replay::verbatim_with([
        header::CONTENT_TYPE,
        header::LOCATION,
        header::ETAG,
    ]));
    let url = serve(
        Router::new().route("/orders", post(create_order).layer(verbatim)),
        sink.clone(),
    )
    .await;
    let url = format!("{url}/orders");

    let first = answer(send(&url, Some("wf-1:order"), "{}").await).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body, ORDER_BODY.as_bytes(), "no envelope");
    assert!(first.headers.get("idempotency-replayed").is_none());
    assert_eq!(
        first.headers["x-request-id"], "req-1",
        "the first caller gets the tool's response untouched"
    );

    for _ in 0..2 {
        let again = answer(send(&url, Some("wf-1:order"), "{}").await).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body, "the body byte for byte");
        for name in ["content-type", "location", "etag"] {
            assert_eq!(
                again.headers[name].as_bytes(),
                first.headers[name].as_bytes(),
                "{name}"
            );
        }
        assert_eq!(again.headers["idempotency-replayed"], "true");
        assert!(
            again.headers.get("x-request-id").is_none(),
            "a header not in the list is not replayed"
        );
    }
    assert_eq!(Sink::runs(&sink.orders), 1, "the order was created once");
}

/// `POST /orders` behind a layer in the default verbatim mode, on a store of its own: the
/// route's URL and the sink.
async fn verbatim_orders() -> (String, Arc<Sink>) {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let url = serve(
        Router::new().route(
            "/orders",
            post(create_order).layer(layer(&store).replay(Replay::verbatim())),
        ),
        sink.clone(),
    )
    .await;
    (format!("{url}/orders"), sink)
}

#[tokio::test]
async fn verbatim_by_default_keeps_content_type_and_location_only() {
    let (url, sink) = verbatim_orders().await;
    let first = answer(send(&url, Some("k-1"), "{}").await).await;
    assert_eq!(first.headers["etag"], "W/\"rev-1\"");
    let again = answer(send(&url, Some("k-1"), "{}").await).await;
    assert_eq!(
        again.headers["content-type"],
        "application/vnd.acme.order+json; charset=utf-8"
    );
    assert_eq!(again.headers["location"], "/orders/O-1");
    assert!(
        again.headers.get("etag").is_none(),
        "ETag is not listed by default"
    );
    assert_eq!(again.body, ORDER_BODY.as_bytes());
    assert_eq!(Sink::runs(&sink.orders), 1);
}

#[tokio::test]
async fn verbatim_replays_text_and_binary_bodies_byte_for_byte() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let verbatim = layer(&store).replay(Replay::verbatim());
    let url = serve(
        Router::new()
            .route("/texts", post(send_text))
            .route("/files", post(export_file))
            .route_layer(verbatim),
        sink.clone(),
    )
    .await;

    let texts = format!("{url}/texts");
    let first = answer(send(&texts, Some("t-1"), "{}").await).await;
    assert_eq!(first.status, 202);
    assert_eq!(
        first.body,
        "queued: ünïcode ✓\r\n  trailing spaces  ".as_bytes()
    );
    let again = answer(send(&texts, Some("t-1"), "{}").await).await;
    assert_eq!((again.status, &again.body), (202, &first.body));
    assert_eq!(again.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(again.headers["idempotency-replayed"], "true");
    assert_eq!(Sink::runs(&sink.texts), 1);

    let files = format!("{url}/files");
    let first = answer(send(&files, Some("f-1"), "{}").await).await;
    assert_eq!(first.body, binary());
    let again = answer(send(&files, Some("f-1"), "{}").await).await;
    assert_eq!(again.body, binary(), "binary bytes replayed exactly");
    assert_eq!(again.headers["content-type"], "application/octet-stream");
    assert_eq!(again.headers["idempotency-replayed"], "true");
    assert_eq!(Sink::runs(&sink.files), 1);
}

#[tokio::test]
async fn verbatim_refusals_stay_problem_json() {
    let (url, sink) = verbatim_orders().await;
    assert_eq!(send(&url, Some("k"), "{}").await.status(), 201);
    let refusals = [
        (
            send(&url, Some("k"), r#"{"other":1}"#).await,
            422,
            "fingerprint-mismatch",
        ),
        (send(&url, None, "{}").await, 400, "key-required"),
        (
            send(&url, Some("k2"), "not json").await,
            400,
            "invalid-body",
        ),
    ];
    for (resp, status, kind) in refusals {
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        assert!(resp.headers().get("idempotency-replayed").is_none());
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["type"], format!("urn:idem:problem:{kind}"));
    }
    assert_eq!(Sink::runs(&sink.orders), 1, "no refusal ran the tool");
}

#[tokio::test]
async fn a_record_replays_after_the_mode_changes() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    // Two deployments of one route on one store: before and after switching modes.
    let envelope_url = serve(
        Router::new().route("/texts", post(send_text).layer(layer(&store))),
        sink.clone(),
    )
    .await;
    let verbatim_url = serve(
        Router::new().route(
            "/texts",
            post(send_text).layer(layer(&store).replay(Replay::verbatim())),
        ),
        sink.clone(),
    )
    .await;
    let (envelope, verbatim) = (
        format!("{envelope_url}/texts"),
        format!("{verbatim_url}/texts"),
    );

    // Stored as an envelope, replayed verbatim: the kept JSON body.
    assert_eq!(send(&envelope, Some("a"), "{}").await.status(), 202);
    let replay = answer(send(&verbatim, Some("a"), "{}").await).await;
    assert_eq!(replay.status, 202);
    assert_eq!(replay.headers["content-type"], "application/json");
    assert_eq!(replay.headers["idempotency-replayed"], "true");
    let body: Value = serde_json::from_slice(&replay.body).unwrap();
    assert_eq!(body, "queued: ünïcode ✓\r\n  trailing spaces  ");

    // Stored verbatim, replayed as an envelope: the body as `original_response`.
    assert_eq!(send(&verbatim, Some("b"), "{}").await.status(), 202);
    let replay = answer(send(&envelope, Some("b"), "{}").await).await;
    assert_eq!(replay.status, 202);
    let body: Value = serde_json::from_slice(&replay.body).unwrap();
    assert_eq!(body["idempotent_replay"], true);
    assert_eq!(
        body["original_response"],
        "queued: ünïcode ✓\r\n  trailing spaces  "
    );
    assert_eq!(Sink::runs(&sink.texts), 2, "each key ran once");
}

#[tokio::test]
async fn envelope_mode_is_unchanged() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let url = serve(
        Router::new().route("/orders", post(create_order).layer(layer(&store))),
        sink.clone(),
    )
    .await;
    let url = format!("{url}/orders");
    let first = answer(send(&url, Some("k"), "{}").await).await;
    assert_eq!(first.headers["content-type"], "application/json");
    assert!(first.headers.get("location").is_none());
    assert_eq!(
        String::from_utf8(first.body).unwrap(),
        format!(r#"{{"ok":true,"idempotent_replay":false,"original_response":{ORDER_BODY}}}"#)
    );
    let again = answer(send(&url, Some("k"), "{}").await).await;
    assert_eq!(
        String::from_utf8(again.body).unwrap(),
        format!(r#"{{"ok":true,"idempotent_replay":true,"original_response":{ORDER_BODY}}}"#)
    );
    assert_eq!(Sink::runs(&sink.orders), 1);
}

#[tokio::test]
async fn an_optional_key_lets_keyless_requests_through_every_time() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let url = serve(
        Router::new()
            .route(
                "/pay",
                post(pay).layer(
                    layer(&store).tool(
                        idem_core::Tool::builder()
                            .key_source(idem_core::KeySource::Unprotected)
                            .build()
                            .unwrap(),
                    ),
                ),
            )
            .route("/pay-strict", post(pay).layer(layer(&store))),
        sink.clone(),
    )
    .await;
    let (optional, strict) = (format!("{url}/pay"), format!("{url}/pay-strict"));

    for n in 1..=3 {
        let resp = send(&optional, None, r#"{"amount":5}"#).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("idempotency-replayed").is_none());
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body,
            json!({"payment": n, "amount": 5}),
            "the tool's own answer"
        );
    }
    assert_eq!(
        Sink::runs(&sink.payments),
        3,
        "unprotected: it ran every time"
    );

    // Not JSON, and no key: the layer does not read the body; the tool refuses it itself.
    let resp = send(&optional, None, "not json").await;
    assert_ne!(resp.headers()["content-type"], "application/problem+json");

    // With a key the route is protected as always.
    for _ in 0..2 {
        assert_eq!(
            send(&optional, Some("k"), r#"{"amount":5}"#).await.status(),
            200
        );
    }
    assert_eq!(Sink::runs(&sink.payments), 4, "one more run for the key");
    let resp = send(&optional, Some(""), r#"{"amount":5}"#).await;
    assert_eq!(resp.status(), 400, "an invalid key is still refused");

    // The key is optional per route: the other route still requires it.
    let resp = send(&strict, None, r#"{"amount":5}"#).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:key-required");
    assert_eq!(Sink::runs(&sink.payments), 4);
}

#[tokio::test]
async fn fingerprint_with_a_subset_of_fields() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryStore::new());
    let sink = Arc::new(Sink::default());
    let subset = layer(&store).fingerprint_with(|_, body| {
        let (Some(account), Some(amount)) = (body.get("account"), body.get("amount")) else {
            return Err(Problem::InvalidBody(
                "account and amount are required".into(),
            ));
        };
        Ok(json!([account, amount]))
    });
    let url = serve(
        Router::new().route("/pay", post(pay).layer(subset)),
        sink.clone(),
    )
    .await;
    let url = format!("{url}/pay");

    let first = send(
        &url,
        Some("p-1"),
        r#"{"account":"A","amount":5,"note":"first"}"#,
    )
    .await;
    assert_eq!(first.status(), 200);
    // Differs only outside the subset: the replay.
    let again = send(
        &url,
        Some("p-1"),
        r#"{"note":"retry, reworded","amount":5,"account":"A"}"#,
    )
    .await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["original_response"]["payment"], 1);
    assert_eq!(Sink::runs(&sink.payments), 1);

    // Differs inside the subset: 422, the tool does not run.
    let other = send(
        &url,
        Some("p-1"),
        r#"{"account":"A","amount":500,"note":"first"}"#,
    )
    .await;
    assert_eq!(other.status(), 422);
    let body: Value = other.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:fingerprint-mismatch");

    // The query string is still in the fingerprint.
    let query = send(
        &format!("{url}?currency=eur"),
        Some("p-1"),
        r#"{"account":"A","amount":5}"#,
    )
    .await;
    assert_eq!(query.status(), 422);

    // The closure refuses: 400, nothing recorded, the key stays free.
    let refused = send(&url, Some("p-2"), r#"{"note":"no amount"}"#).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:invalid-body");
    assert_eq!(Sink::runs(&sink.payments), 1);
    let fresh = send(&url, Some("p-2"), r#"{"account":"B","amount":1}"#).await;
    assert!(fresh.headers().get("idempotency-replayed").is_none());
    assert_eq!(Sink::runs(&sink.payments), 2);
}
