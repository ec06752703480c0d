//! An AWS Lambda function (`lambda_runtime`) whose tool runs once per idempotency key, with its
//! records in DynamoDB: the retried invocation gets the first one's answer, a concurrent one is
//! told the operation is in flight, and the same key with other arguments is refused.
//!
//! Deploy it with `cargo lambda build --release --example lambda` (its environment: `IDEM_TABLE`,
//! a table `idem migrate --store dynamodb://TABLE` created; `IDEM_LEASE_SECONDS`, the function's
//! timeout). The function's role needs `dynamodb:UpdateItem`, `PutItem`, `GetItem`, `Query` and
//! `DeleteItem` on the table and its indexes. What a frozen function means for leases and
//! heartbeats: the crate's README, "Lambda".
//!
//! The event: `{"idempotency_key": "wf-8812:step-3", "tenant": "acme", "order": {...}}`.

use std::time::Duration;

use idem_core::{
    Error as IdemError, Executor, Fingerprint, IdempotencyKey, Outcome, Policy, Scope,
};
use idem_store_dynamodb::DynamoStore;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

/// The tool: creates the order (here, an answer; in a real function, the call to the provider,
/// with `attempt.downstream_key()` as its own idempotency key).
async fn create_order(order: &Value) -> Outcome {
    Outcome::definitive_json(201, json!({"order_id": order["id"], "status": "created"}))
}

async fn handle(executor: &Executor, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let payload = event.payload;
    let key = IdempotencyKey::new(payload["idempotency_key"].as_str().unwrap_or_default())?;
    let scope = Scope::from_parts([
        payload["tenant"].as_str().unwrap_or_default(),
        "create_order",
    ])?;
    let order = payload["order"].clone();
    let fingerprint = Fingerprint::of("create_order", &order)?;
    match executor
        .run(&scope, &key, &fingerprint, |_attempt| create_order(&order))
        .await
    {
        Ok(execution) => Ok(json!({
            "status": execution.outcome().status(),
            "idempotent_replay": execution.is_replay(),
            "body": execution.outcome().body_json(),
        })),
        // In flight, another request under this key, a store that is down: the caller retries
        // (or gives up) with the same key; the function never runs the tool without a claim.
        Err(e @ (IdemError::InFlight { .. } | IdemError::FingerprintMismatch)) => {
            Ok(json!({"status": 409, "error": e.to_string()}))
        }
        Err(e) => Err(e.into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let table = std::env::var("IDEM_TABLE").unwrap_or_else(|_| "idem_records".into());
    let lease: u64 = std::env::var("IDEM_LEASE_SECONDS").map_or(Ok(60), |s| s.parse())?;
    // The region and the credentials are the function's (its environment and its role).
    let store = DynamoStore::connect(&format!("dynamodb://{table}")).await?;
    // The lease covers the whole invocation: the function's timeout, plus the store's write.
    let policy = Policy::builder()
        .lease(Duration::from_secs(lease) + Duration::from_secs(1))
        .build()?;
    let executor = Executor::new(store).with_policy(policy);
    lambda_runtime::run(service_fn(|event| handle(&executor, event))).await
}
