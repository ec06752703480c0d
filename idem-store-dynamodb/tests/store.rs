//! DynamoDB-specific behaviour beyond the conformance suite, against the server named by
//! `IDEM_TEST_DYNAMODB_URL`: the requests each operation costs (counted as the client sends
//! them), a write whose answer was lost, outcomes kept in chunks, the table `migrate` makes or
//! refuses, the TTL attribute, and `Debug`.
//!
//! Without the variable every test prints why and skips; under `CI` it fails instead.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_smithy_runtime_api::http::StatusCode;
use idem_core::machine::{ClaimAnswer, ClaimKind, CompleteAnswer, ReleaseAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Maintenance, Outcome, Policy, RecordId, RecordState,
    Scope, StoreError, Timestamp, Token,
};
use idem_store_dynamodb::aws_sdk_dynamodb::{self, types::AttributeValue};
use idem_store_dynamodb::{DynamoStore, TableName};

fn id(key: &str) -> RecordId {
    RecordId::new(
        Scope::new("tenant/tool").unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

fn fp(c: char) -> Fingerprint {
    Fingerprint::parse(&c.to_string().repeat(64)).unwrap()
}

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .ttl(Duration::from_secs(3600))
        .build()
        .unwrap()
}

const T0: Timestamp = Timestamp::from_millis(1_000_000);

fn claimed(answer: ClaimAnswer) -> Token {
    match answer {
        ClaimAnswer::Claimed { token, .. } => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// The first execution costs two requests (the claim, the completion) and a replay one: no more
/// than Powertools' idempotency utility (a put and an update; a failed put answers the replay).
#[tokio::test]
async fn a_first_execution_is_two_requests_and_a_replay_one() {
    let Some(url) = common::url() else { return };
    let (store, requests) = common::counted(&common::fresh(&url, "requests").await);
    let (p, k) = (policy(), id("k-1"));

    let token = claimed(store.claim(&k, &fp('a'), &p, T0).await.unwrap());
    assert_eq!(requests.take(), ["UpdateItem"]);
    let done = Outcome::definitive_json(201, serde_json::json!({"id": 1}));
    let answer = store.complete(&k, token, &done, &p, T0).await.unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    assert_eq!(requests.take(), ["UpdateItem"]);

    // The replay: the refused claim returned the record.
    let replay = store
        .claim(&k, &fp('a'), &p, T0 + Duration::from_secs(1))
        .await;
    assert_eq!(replay.unwrap(), ClaimAnswer::Replay(done));
    assert_eq!(requests.take(), ["UpdateItem"]);
    // A mismatch and an in-flight repeat cost one request too.
    assert_eq!(
        store.claim(&k, &fp('b'), &p, T0).await.unwrap(),
        ClaimAnswer::FingerprintMismatch
    );
    let other = id("k-2");
    claimed(store.claim(&other, &fp('a'), &p, T0).await.unwrap());
    assert!(matches!(
        store.claim(&other, &fp('a'), &p, T0).await.unwrap(),
        ClaimAnswer::InFlight { stale: false, .. }
    ));
    assert_eq!(requests.take().len(), 3);

    // A retry after a release: the refused claim, then the compare-and-set.
    let third = id("k-3");
    let first = claimed(store.claim(&third, &fp('a'), &p, T0).await.unwrap());
    assert_eq!(
        store.release(&third, first, T0).await.unwrap(),
        ReleaseAnswer::Released
    );
    requests.take();
    let again = store.claim(&third, &fp('a'), &p, T0).await.unwrap();
    assert!(matches!(
        again,
        ClaimAnswer::Claimed {
            attempt: 2,
            kind: ClaimKind::Retry,
            ..
        }
    ));
    assert_eq!(requests.take(), ["UpdateItem", "PutItem"]);
    // `get` is one strongly consistent read.
    assert!(store.get(&third, T0).await.unwrap().is_some());
    assert_eq!(requests.take(), ["GetItem"]);
}

/// Makes the SDK lose the answer of the next request after the server applied it: the response
/// becomes a 500, which the SDK's retries send again.
#[derive(Debug, Clone, Default)]
struct LoseNextAnswer(Arc<AtomicBool>);

impl aws_sdk_dynamodb::config::Intercept for LoseNextAnswer {
    fn name(&self) -> &'static str {
        "LoseNextAnswer"
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextMut<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        if self.0.swap(false, Ordering::SeqCst) {
            *context.response_mut().status_mut() = StatusCode::try_from(500).unwrap();
        }
        Ok(())
    }
}

/// A claim and a completion whose answers were lost and that the SDK sent again find their own
/// write in the record the refusal returns: the claim is the caller's (not "in flight" to
/// itself), the completion is recorded (not "fenced").
#[tokio::test]
async fn a_write_sent_again_after_a_lost_answer_knows_it_landed() {
    let Some(url) = common::url() else { return };
    let plain = common::fresh(&url, "lost").await;
    let lose = LoseNextAnswer::default();
    let config = plain
        .client()
        .config()
        .to_builder()
        .interceptor(lose.clone())
        .build();
    let store = DynamoStore::from_client(
        aws_sdk_dynamodb::Client::from_conf(config),
        plain.table().clone(),
    );
    let (store, requests) = common::counted(&store);
    let (p, k) = (policy(), id("lost"));

    lose.0.store(true, Ordering::SeqCst);
    let token = claimed(store.claim(&k, &fp('a'), &p, T0).await.unwrap());
    assert_eq!(requests.take(), ["UpdateItem", "UpdateItem"], "sent twice");
    let stored = plain.get(&k, T0).await.unwrap().unwrap();
    assert_eq!(
        (stored.token, stored.state),
        (token, RecordState::Processing)
    );

    lose.0.store(true, Ordering::SeqCst);
    let done = Outcome::definitive_json(200, "ok");
    let answer = store.complete(&k, token, &done, &p, T0).await.unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    assert_eq!(requests.take(), ["UpdateItem", "UpdateItem"], "sent twice");
    // A genuine second completion is still fenced.
    let again = store.complete(&k, token, &done, &p, T0).await.unwrap();
    assert_eq!(again, CompleteAnswer::Fenced);
}

/// An outcome over what an item holds (1 MiB, the default limit) is kept in chunk items, replays
/// byte for byte, and its chunks go with the record when it is purged.
#[tokio::test]
async fn a_large_outcome_is_kept_in_chunks_and_purged_with_its_record() {
    let Some(url) = common::url() else { return };
    let plain = common::fresh(&url, "chunks").await;
    let (store, requests) = common::counted(&plain);
    let p = Policy::default();
    let k = id("big");
    let limit = p.max_outcome_bytes();
    let filler: String = (0..limit - 2)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let big = Outcome::from_json_text(
        200,
        format!("\"{filler}\""),
        idem_core::OutcomeClass::Definitive,
    )
    .unwrap();
    assert_eq!(big.size(), limit);

    let token = claimed(store.claim(&k, &fp('a'), &p, T0).await.unwrap());
    requests.take();
    let answer = store.complete(&k, token, &big, &p, T0).await.unwrap();
    assert_eq!(answer, CompleteAnswer::Completed);
    // Four chunks of 256 KiB, then the fenced update that names them.
    assert_eq!(
        requests.take(),
        ["PutItem", "PutItem", "PutItem", "PutItem", "UpdateItem"]
    );
    match store.claim(&k, &fp('a'), &p, T0).await.unwrap() {
        ClaimAnswer::Replay(o) => assert_eq!(o.body(), big.body()),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(items(&plain).await, 5, "the record and its four chunks");

    let after = T0 + p.ttl();
    assert_eq!(
        store.purge_expired(after, 100).await.unwrap(),
        1,
        "one record"
    );
    assert_eq!(items(&plain).await, 0, "the chunks went too");
}

/// Every item of the store's table except the schema item (a scan: for this test only).
async fn items(store: &DynamoStore) -> usize {
    let mut pages = store
        .client()
        .scan()
        .table_name(store.table().as_str())
        .into_paginator()
        .items()
        .send();
    let mut count = 0;
    while let Some(item) = pages.next().await {
        let item = item.unwrap();
        if item.get("pk") != Some(&AttributeValue::S("#schema".into())) {
            count += 1;
        }
    }
    count
}

/// A record carries the TTL attribute (its expiry in seconds, rounded up), and `migrate` enabled
/// DynamoDB's TTL on it.
#[tokio::test]
async fn records_carry_the_ttl_that_migrate_enabled() {
    let Some(url) = common::url() else { return };
    let store = common::fresh(&url, "ttl").await;
    let (p, k) = (policy(), id("ttl"));
    let at = Timestamp::from_millis(1_700_000_000_500);
    claimed(store.claim(&k, &fp('a'), &p, at).await.unwrap());
    let raw = store
        .client()
        .get_item()
        .table_name(store.table().as_str())
        .key("pk", AttributeValue::S("11:tenant/toolttl".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let expires = (at + p.ttl()).as_millis();
    assert_eq!(
        raw.item().unwrap().get("ttl"),
        Some(&AttributeValue::N(expires.div_ceil(1000).to_string()))
    );
    let ttl = store
        .client()
        .describe_time_to_live()
        .table_name(store.table().as_str())
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some("ttl"));
    assert!(store.check_config().await.unwrap().is_empty());
}

/// `migrate` is idempotent and records the version; a table of another shape is refused with
/// what was found, and nothing is written to it; a missing table is a warning, then a clear
/// error on use.
#[tokio::test]
async fn migrate_creates_once_and_refuses_another_shape() {
    let Some(url) = common::url() else { return };
    let store = common::fresh(&url, "migrate").await;
    store.migrate().await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        store.latest_schema_version()
    );

    let other = TableName::new(idem_conformance::kit::unique("orders")).unwrap();
    store
        .client()
        .create_table()
        .table_name(other.as_str())
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("order_id")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("order_id")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let theirs = DynamoStore::from_client(store.client().clone(), other.clone());
    let err = theirs.migrate().await.unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(other.as_str()) && text.contains("order_id"),
        "{text}"
    );
    let err = theirs.schema_version().await.unwrap_err();
    assert!(err.to_string().contains("not an idem table"), "{err}");
    assert_eq!(items(&theirs).await, 0, "nothing written");
    let warnings = theirs.check_config().await.unwrap();
    assert!(
        warnings.iter().any(|w| w.setting.contains("another shape")),
        "{warnings:?}"
    );

    let missing = DynamoStore::from_client(
        store.client().clone(),
        TableName::new(idem_conformance::kit::unique("missing")).unwrap(),
    );
    assert_eq!(missing.schema_version().await.unwrap(), 0);
    let warnings = missing.check_config().await.unwrap();
    assert!(
        warnings[0].setting.contains("does not exist"),
        "{warnings:?}"
    );
    let err = missing
        .claim(&id("k"), &fp('a'), &policy(), T0)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    assert!(err.to_string().contains("migrate"), "{err}");
}

/// A bad URL is a clear, typed error before any request; `Debug` shows the table and the
/// region, never credentials.
#[tokio::test]
async fn bad_urls_are_refused_and_debug_shows_no_secret() {
    for bad in [
        "dynamodb://x",
        "dynamodb://tbl?regoin=eu-west-1",
        "postgres://tbl",
        "dynamodb://tbl?endpoint=nowhere",
    ] {
        let err = DynamoStore::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Misconfigured { .. }),
            "{bad}: {err:?}"
        );
    }
    let Some(url) = common::url() else { return };
    let plain = DynamoStore::connect(&url).await.unwrap();
    let config = plain
        .client()
        .config()
        .to_builder()
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "AKID-MARKER",
            "SECRET-MARKER",
            Some("SESSION-MARKER".into()),
            None,
            "test",
        ))
        .build();
    let store = DynamoStore::from_client(
        aws_sdk_dynamodb::Client::from_conf(config),
        plain.table().clone(),
    );
    let shown = format!("{store:?} {store:#?}");
    assert!(
        shown.contains("us-east-1") && shown.contains(store.table().as_str()),
        "{shown}"
    );
    assert!(!shown.contains("MARKER"), "{shown}");
}
