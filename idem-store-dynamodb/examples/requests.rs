//! What one idempotent operation costs on DynamoDB, measured at the client: requests (SDK
//! attempts included) and latency per first execution, per replay, and per replay answered by
//! the executor's `ReplayCache`, through `Executor::run`. The numbers of `docs/bench.md`, side by
//! side with `scripts/dynamodb-compare`'s Powertools run against the same server.
//!
//! ```text
//! IDEM_TEST_DYNAMODB_URL='dynamodb://bench?endpoint=http://127.0.0.1:8000&region=us-east-1' \
//!     cargo run --release -p idem-store-dynamodb --example requests -- 500
//! ```
//!
//! Prints one JSON object. The table is a new one (`idem-requests-<pid>`), created by `migrate`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::store::ReplayCache;
use idem_core::{Executor, Fingerprint, IdempotencyKey, Outcome, Scope};
use idem_store_dynamodb::aws_sdk_dynamodb::{self, config::Intercept};
use idem_store_dynamodb::{DynamoOptions, DynamoStore, TableName};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Counts the requests a client sends (each attempt).
#[derive(Debug, Default, Clone)]
struct Requests(Arc<Mutex<usize>>);

impl Requests {
    fn take(&self) -> usize {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "Requests"
    }

    fn read_before_transmit(
        &self,
        _: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        *self.0.lock().expect("not poisoned") += 1;
        Ok(())
    }
}

/// Latencies in milliseconds: p50 and p99.
fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let at = |q: f64| {
        let i = ((times.len() as f64 - 1.0) * q).round() as usize;
        times[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("IDEM_TEST_DYNAMODB_URL")
        .map_err(|_| "set IDEM_TEST_DYNAMODB_URL (scripts/services/dynamodb.sh starts moto)")?;
    let operations: usize = std::env::args().nth(1).map_or(Ok(200), |n| n.parse())?;
    let mut options = DynamoOptions::parse(&url)?;
    options.table = TableName::new(format!("idem-requests-{}", std::process::id()))?;
    let plain = DynamoStore::connect_with(&options).await?;
    plain.migrate().await?;
    let requests = Requests::default();
    let config = plain
        .client()
        .config()
        .to_builder()
        .interceptor(requests.clone())
        .build();
    let store = DynamoStore::from_client(
        aws_sdk_dynamodb::Client::from_conf(config),
        plain.table().clone(),
    );
    let executor = Executor::new(store.clone());
    let cached = Executor::new(ReplayCache::new(store));
    let scope = Scope::new("bench/create_order")?;

    let (mut first, mut replay, mut from_cache) = (Vec::new(), Vec::new(), Vec::new());
    let (mut first_requests, mut replay_requests, mut cache_requests) = (0, 0, 0);
    for i in 0..operations {
        let key = IdempotencyKey::new(format!("order-{i}"))?;
        let args = serde_json::json!({"order": i, "amount": 42});
        let fingerprint = Fingerprint::of("create_order", &args)?;
        let op = |_attempt| async move {
            Outcome::definitive_json(201, serde_json::json!({"order_id": i, "status": "created"}))
        };
        requests.take();
        let t = Instant::now();
        executor.run(&scope, &key, &fingerprint, op).await?;
        first.push(t.elapsed());
        first_requests += requests.take();

        let t = Instant::now();
        let again = executor.run(&scope, &key, &fingerprint, op).await?;
        replay.push(t.elapsed());
        replay_requests += requests.take();
        assert!(again.is_replay());

        // The cache keeps a record the first time a replay reaches the store.
        cached.run(&scope, &key, &fingerprint, op).await?;
        requests.take();
        let t = Instant::now();
        cached.run(&scope, &key, &fingerprint, op).await?;
        from_cache.push(t.elapsed());
        cache_requests += requests.take();
    }
    let n = operations as f64;
    let (f50, f99) = percentiles(first);
    let (r50, r99) = percentiles(replay);
    let (c50, c99) = percentiles(from_cache);
    println!(
        "{}",
        serde_json::json!({
            "system": "idem (idem-store-dynamodb)",
            "operations": operations,
            "first_execution": {"requests": first_requests as f64 / n, "p50_ms": f50, "p99_ms": f99},
            "replay": {"requests": replay_requests as f64 / n, "p50_ms": r50, "p99_ms": r99},
            "replay_cached": {"requests": cache_requests as f64 / n, "p50_ms": c50, "p99_ms": c99},
        })
    );
    Ok(())
}
