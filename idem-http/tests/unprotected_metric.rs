//! `idem_unprotected_total{transport="http"}` counts the requests an optional-key route let
//! through without a key ([contract §8](idem_core::contract#observability)). Its own test binary:
//! the metrics recorder is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use idem_core::{Executor, MemoryStore};
use idem_http::IdempotencyLayer;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Counts increments of `idem_unprotected_total` with `transport = "http"`.
#[derive(Default)]
struct Unprotected(AtomicU64);

impl CounterFn for Unprotected {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

struct OneCounter(Arc<Unprotected>);

impl Recorder for OneCounter {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let http = key
            .labels()
            .any(|l| l.key() == "transport" && l.value() == "http");
        if key.name() == "idem_unprotected_total" && http {
            Counter::from_arc(self.0.clone())
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

async fn pay(State(runs): State<Arc<AtomicUsize>>) -> &'static str {
    runs.fetch_add(1, Ordering::SeqCst);
    "paid"
}

#[tokio::test]
async fn keyless_requests_on_an_optional_key_route_are_counted() {
    let unprotected = Arc::new(Unprotected::default());
    metrics::set_global_recorder(OneCounter(unprotected.clone())).unwrap();

    let runs = Arc::new(AtomicUsize::new(0));
    let executor = Executor::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".to_owned())).tool(
        idem_core::Tool::builder()
            .key_source(idem_core::KeySource::Unprotected)
            .build()
            .unwrap(),
    );
    let app = Router::new()
        .route("/pay", post(pay).layer(layer))
        .with_state(runs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/pay", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = idem_http::client::http_client().unwrap();
    for _ in 0..3 {
        let resp = client.post(&url).body("{}").send().await.unwrap();
        assert_eq!(resp.text().await.unwrap(), "paid");
    }
    for _ in 0..2 {
        let resp = client
            .post(&url)
            .header("idempotency-key", "k-1")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "3 unprotected runs, 1 keyed"
    );
    assert_eq!(
        unprotected.0.load(Ordering::SeqCst),
        3,
        "only the keyless requests are counted"
    );
}
