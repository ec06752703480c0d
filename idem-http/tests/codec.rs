//! An encrypting codec on the executor applies through the HTTP layer ([contract
//! §6](idem_core::contract#codecs)): the store holds ciphertext, the retry gets the tool's answer,
//! and a wrong key is a 500 that never runs the tool again. The sink counts how often the tool ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::codec::{AesGcmCodec, sealed_info};
use idem_core::store::ListFilter;
use idem_core::{Clock, Executor, KeyStore, MemoryStore, SystemClock};
use idem_http::IdempotencyLayer;
use serde_json::{Value, json};

const SECRET: &str = "SECRET-MARKER-4242";

async fn charge(State(runs): State<Arc<AtomicUsize>>) -> (StatusCode, axum::Json<Value>) {
    runs.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::CREATED,
        axum::Json(json!({"charge_id": "ch_1", "card": SECRET})),
    )
}

async fn serve(store: MemoryStore, codec: AesGcmCodec, runs: Arc<AtomicUsize>) -> String {
    let executor = Executor::new(store).with_codec(codec);
    let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".to_owned()));
    let app = Router::new()
        .route("/tools/charge", post(charge))
        .route_layer(layer)
        .with_state(runs);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tools/charge", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn encrypted_at_rest_replayed_over_http_and_a_wrong_key_never_reruns() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let key = [5u8; 32];
    let url = serve(
        store.clone(),
        AesGcmCodec::new("k1", key).unwrap(),
        runs.clone(),
    )
    .await;
    let client = idem_http::client::http_client().unwrap();
    let post = |url: String| {
        client
            .post(url)
            .header("idempotency-key", "wf-1:step-1:charge")
            .json(&json!({"cents": 500}))
            .send()
    };
    for replay in [false, true] {
        let answer = post(url.clone()).await.unwrap();
        assert_eq!(answer.status(), 201);
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["idempotent_replay"], replay);
        assert_eq!(body["original_response"]["card"], SECRET);
    }
    let records = store
        .list(&ListFilter::default(), SystemClock.now(), 10)
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    let at_rest = records[0].outcome.clone().unwrap();
    assert_eq!(at_rest.status(), 201);
    assert!(sealed_info(at_rest.body()).is_some());
    assert!(!at_rest.body().contains(SECRET), "{}", at_rest.body());

    let wrong = serve(
        store.clone(),
        AesGcmCodec::new("k1", [6; 32]).unwrap(),
        runs.clone(),
    )
    .await;
    let answer = post(wrong).await.unwrap();
    assert_eq!(answer.status(), 500);
    assert!(!answer.text().await.unwrap().contains(SECRET));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
}

/// A codec whose `encode` always fails, as a broken key service would.
#[derive(Debug)]
struct CannotEncode;

impl idem_core::codec::OutcomeCodec for CannotEncode {
    fn encode(
        &self,
        _: &idem_core::codec::CodecContext<'_>,
        _: &idem_core::Outcome,
    ) -> Result<String, idem_core::codec::CodecError> {
        Err(idem_core::codec::CodecError::Malformed {
            message: "the key service is down".to_owned(),
        })
    }
    fn decode(
        &self,
        _: &idem_core::codec::CodecContext<'_>,
        stored: &idem_core::Outcome,
    ) -> Result<String, idem_core::codec::CodecError> {
        Ok(stored.body().to_owned())
    }
}

/// The tool ran but its answer could not be encoded: the caller still gets the tool's answer
/// (the effect happened), nothing is stored, and the record stays `processing` for its lease, so
/// the retry is held off rather than run again.
#[tokio::test]
async fn an_outcome_the_codec_cannot_encode_still_reaches_the_caller_and_is_not_rerun() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let executor = Executor::new(store.clone()).with_codec(CannotEncode);
    let layer = IdempotencyLayer::new(executor, |_| Ok("tenant-a".to_owned()));
    let app = Router::new()
        .route("/tools/charge", post(charge))
        .route_layer(layer)
        .with_state(runs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tools/charge", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = idem_http::client::http_client().unwrap();
    let post = || {
        client
            .post(&url)
            .header("idempotency-key", "wf-2:step-1:charge")
            .json(&json!({"cents": 500}))
            .send()
    };
    let first = post().await.unwrap();
    assert_eq!(first.status(), 201, "the tool's own answer");
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["original_response"]["charge_id"], "ch_1");
    let retry = post().await.unwrap();
    assert_eq!(retry.status(), 409, "still processing under its lease");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tool ran once");
    let records = store
        .list(&ListFilter::default(), SystemClock.now(), 10)
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert!(records[0].outcome.is_none(), "nothing stored");
}
