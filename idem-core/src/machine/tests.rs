//! One test per row of the state table, by rule, and a model-based property test.

use super::*;
use crate::{OutcomeClass, RecordState};
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(3600);

fn policy() -> Policy {
    Policy::builder().lease(LEASE).ttl(TTL).build().unwrap()
}

fn takeover() -> Policy {
    policy()
        .to_builder()
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap()
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(1_000_000 + ms)
}

struct Ids {
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    other_fp: Fingerprint,
}

fn ids() -> Ids {
    Ids {
        scope: Scope::new("tenant/tool").unwrap(),
        key: IdempotencyKey::new("k-1").unwrap(),
        fp: Fingerprint::of_bytes(b"request"),
        other_fp: Fingerprint::of_bytes(b"other request"),
    }
}

fn req<'a>(ids: &'a Ids, fp: &'a Fingerprint, token_id: u128) -> ClaimRequest<'a> {
    ClaimRequest {
        scope: &ids.scope,
        key: &ids.key,
        fingerprint: fp,
        token_id,
    }
}

fn ok_outcome() -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"id": 1})).unwrap()
}

fn retry_outcome() -> Outcome {
    Outcome::retryable(503, &serde_json::json!({"error": "down"})).unwrap()
}

/// A processing record claimed at `at`.
fn claimed(ids: &Ids, at: Timestamp) -> Record {
    claim(None, req(ids, &ids.fp, 7), at, &policy())
        .write
        .unwrap()
}

mod claim;
mod complete;
mod lease;
mod model;
