//! Metrics, counted exactly with a recorder local to each test ([contract
//! §8](idem_core::contract#observability)): every store operation the executor and the reconciler
//! make is timed with its `op`, every reconciler decision is counted, and `describe()` gives every
//! metric a description and a unit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::metrics::{self as names, describe};
use idem_core::reconcile::{Finding, Probe, Reconciler, purge_expired_all};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Outcome,
    Policy, Record, RecordId, Refusal, Scope, Timestamp, async_trait,
};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;

/// One snapshot: (name, sorted labels, value) where a counter's value is its count and a
/// histogram's is its number of observations since the previous snapshot (taking a snapshot
/// drains the histograms).
struct Snapshot(Vec<Sample>);

/// Name, sorted labels, value.
type Sample = (String, Vec<(String, String)>, u64);

fn snapshot(snapshotter: &Snapshotter) -> Snapshot {
    Snapshot(
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let mut labels: Vec<(String, String)> = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                labels.sort();
                let n = match value {
                    DebugValue::Counter(n) => n,
                    DebugValue::Histogram(samples) => samples.len() as u64,
                    DebugValue::Gauge(_) => panic!("no idem metric is a gauge"),
                };
                (key.name().to_owned(), labels, n)
            })
            .collect(),
    )
}

impl Snapshot {
    /// The value of `name` with exactly these labels (0 if never recorded).
    fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.sort();
        self.0
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(.., v)| v)
            .sum()
    }

    /// Observations of the store operation `op` on the memory store.
    fn op(&self, op: &str) -> u64 {
        self.count(
            names::STORE_OP_SECONDS,
            &[("backend", "memory"), ("op", op)],
        )
    }
}

fn policy() -> Policy {
    Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_executor_times_claim_extend_and_complete() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let executor = Executor::new(MemoryStore::new()).with_policy(policy());
    let scope = Scope::new("tenant/tool").unwrap();
    let key = IdempotencyKey::new("k-1").unwrap();
    let fp = Fingerprint::of("tool", &json!({})).unwrap();
    let mut runs = 0;
    for _ in 0..2 {
        executor
            .run(&scope, &key, &fp, |attempt| {
                runs += 1;
                async move {
                    assert!(attempt.extend(Duration::from_secs(60)).await.unwrap());
                    Outcome::definitive(200, &json!({"ok": true})).unwrap()
                }
            })
            .await
            .unwrap();
    }
    assert_eq!(runs, 1, "the retry replayed");
    let m = snapshot(&snapshotter);
    assert_eq!(m.op("claim"), 2);
    assert_eq!(m.op("extend"), 1);
    assert_eq!(m.op("complete"), 1);
    let claims = |result| m.count(names::CLAIMS, &[("result", result), ("key_source", "sent")]);
    assert_eq!(claims("claimed"), 1);
    assert_eq!(claims("replayed"), 1);
    assert_eq!(m.count(names::COMPLETIONS, &[("result", "completed")]), 1);
}

/// A key reused with other arguments is refused and counted once in `idem_refusals_total` with
/// its transport and reason, as a transport observes it ([contract
/// §8](idem_core::contract#observability)).
#[tokio::test]
async fn a_fingerprint_mismatch_is_counted_as_a_refusal_of_its_transport() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let executor = Executor::new(MemoryStore::new()).without_spawner();
    let tool = idem_core::Tool::builder().policy(policy()).build().unwrap();
    let scope = Scope::new("tenant/tool").unwrap();
    let key = IdempotencyKey::new("k-1").unwrap();
    let ok = |_| async { ((), Outcome::definitive(200, &json!({"ok": true})).unwrap()) };
    let call = |args| {
        let fingerprint = Fingerprint::of("tool", &args).unwrap();
        idem_core::Call::new(scope.clone(), key.clone(), fingerprint).transport("http")
    };
    let first = executor.execute(&tool, call(json!({"a": 1})), ok).await;
    assert!(matches!(first.reply, idem_core::Reply::Executed { .. }));
    let other = executor.execute(&tool, call(json!({"a": 2})), ok).await;
    assert!(matches!(
        other.reply,
        idem_core::Reply::Refused {
            refusal: Refusal::FingerprintMismatch,
            ..
        }
    ));
    let m = snapshot(&snapshotter);
    let reason = Refusal::FingerprintMismatch.name();
    let refusals = |transport| {
        m.count(
            names::REFUSALS,
            &[("transport", transport), ("reason", reason)],
        )
    };
    assert_eq!((refusals("http"), refusals("mcp")), (1, 0));
}

/// A request a transport passed through unprotected (no key where the key is optional) is counted
/// in `idem_unprotected_total` with its transport.
#[test]
fn a_request_passed_through_unprotected_is_counted_with_its_transport() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    idem_core::metrics::count_unprotected("mcp");
    let m = snapshot(&snapshotter);
    let unprotected = |transport| m.count(names::UNPROTECTED, &[("transport", transport)]);
    assert_eq!((unprotected("mcp"), unprotected("http")), (1, 0));
}

/// Each claim answer is counted with where its key came from ([contract
/// §5.1](idem_core::contract#keyless)): a sent key and each derived one, and the effect ran once
/// per key.
#[tokio::test]
async fn claims_carry_the_key_source() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let executor = Executor::new(MemoryStore::new()).with_policy(policy());
    let scope = Scope::new("tenant/tool").unwrap();
    let args = json!({"title": "Printer on fire"});
    let fp = Fingerprint::of("tool", &args).unwrap();
    let keys = [
        IdempotencyKey::new("wf-1:step-1").unwrap(),
        IdempotencyKey::from_arguments(&args).unwrap(),
        IdempotencyKey::from_model_argument("ticket-for-printer").unwrap(),
        IdempotencyKey::from_request("session-1", "7"),
    ];
    let mut runs = 0;
    for key in &keys {
        for _ in 0..2 {
            executor
                .run(&scope, key, &fp, |_| {
                    runs += 1;
                    async { Outcome::definitive(200, &json!({"ok": true})).unwrap() }
                })
                .await
                .unwrap();
        }
        let other = Fingerprint::of("tool", &json!({"title": "other"})).unwrap();
        let mismatch = executor.run(&scope, key, &other, |_| async {
            unreachable!("a mismatch never runs")
        });
        assert!(mismatch.await.is_err());
    }
    assert_eq!(runs, keys.len(), "each key ran once, its repeat replayed");
    let m = snapshot(&snapshotter);
    for source in ["sent", "arguments", "model_argument", "request"] {
        for result in ["claimed", "replayed", "mismatch"] {
            let labels = [("result", result), ("key_source", source)];
            assert_eq!(m.count(names::CLAIMS, &labels), 1, "{labels:?}");
        }
    }
}

#[tokio::test]
async fn checkpoints_are_counted_saved_and_fenced() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = MemoryStore::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let executor = Executor::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(
            policy()
                .to_builder()
                .stale(idem_core::StalePolicy::Takeover)
                .build()
                .unwrap(),
        );
    let scope = Scope::new("tenant/tool").unwrap();
    let key = IdempotencyKey::new("k-cp").unwrap();
    let fp = Fingerprint::of("tool", &json!({})).unwrap();
    let claim = store
        .claim(
            &RecordId::new(scope.clone(), key.clone()),
            &fp,
            executor.policy(),
            clock.now(),
        )
        .await
        .unwrap();
    let stale = executor.attempt_for(&scope, &key, &claim).unwrap();
    stale.checkpoint("charged", &1).await.unwrap();
    clock.advance(Duration::from_secs(31));
    executor
        .run(&scope, &key, &fp, |attempt| async move {
            assert_eq!(attempt.checkpoints().len(), 1);
            Outcome::definitive(200, &json!({})).unwrap()
        })
        .await
        .unwrap();
    assert!(stale.checkpoint("emailed", &2).await.is_err());
    let m = snapshot(&snapshotter);
    assert_eq!(m.count(names::CHECKPOINTS, &[("result", "saved")]), 1);
    assert_eq!(m.count(names::CHECKPOINTS, &[("result", "fenced")]), 1);
    assert_eq!(m.op("checkpoint"), 2);
}

/// Decides by key: `happened-*`, `not-*`, anything else unknown.
struct ByKey;

#[async_trait]
impl Probe for ByKey {
    async fn probe(&self, record: &Record) -> Finding {
        let key = record.key.as_str();
        if key.starts_with("happened") {
            Finding::Happened(Outcome::definitive(201, &json!({"id": 1})).unwrap())
        } else if key.starts_with("not") {
            Finding::NotHappened
        } else {
            Finding::Unknown
        }
    }
}

#[tokio::test]
async fn the_reconciler_counts_each_decision_and_times_its_store_operations() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let local = metrics::set_default_local_recorder(&recorder);
    let store = MemoryStore::new();
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let scope = Scope::new("tenant/tool").unwrap();
    let fp = Fingerprint::of("tool", &json!({})).unwrap();
    for key in ["happened-1", "not-1", "not-2", "unknown-1"] {
        let key = IdempotencyKey::new(key).unwrap();
        let answer = store
            .claim(
                &RecordId::new(scope.clone(), key.clone()),
                &fp,
                &policy(),
                clock.now(),
            )
            .await
            .unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
    }
    clock.advance(Duration::from_secs(31));
    let reconciler = Reconciler::new(
        Arc::new(store.clone()),
        Arc::new(clock.clone()),
        policy(),
        ByKey,
    );
    let report = reconciler.run_once().await.unwrap();
    assert_eq!((report.completed, report.released), (1, 2));
    let m = snapshot(&snapshotter);
    let decision = |m: &Snapshot, d| m.count(names::RECONCILE_DECISIONS, &[("decision", d)]);
    assert_eq!(decision(&m, "completed"), 1);
    assert_eq!(decision(&m, "released"), 2);
    assert_eq!(decision(&m, "unknown"), 1);
    assert_eq!(decision(&m, "skipped"), 0);
    assert_eq!(decision(&m, "failed"), 0);
    assert_eq!(m.op("list_in_flight"), 1);
    assert_eq!(
        m.op("get"),
        8,
        "one read before each takeover, one after it (the checkpoints the probe sees)"
    );
    assert_eq!(m.op("claim"), 4, "one takeover each");
    assert_eq!(m.op("complete"), 1);
    assert_eq!(m.op("release"), 2);

    // A second pass finds the unknown one still stale, but it was taken over and is not
    // stale under the reconciler's fresh lease: nothing listed, nothing decided.
    // (A fresh recorder per phase: a snapshot drains the histograms.)
    drop(local);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let local = metrics::set_default_local_recorder(&recorder);
    reconciler.run_once().await.unwrap();
    let m = snapshot(&snapshotter);
    assert_eq!(m.op("list_in_flight"), 1);
    assert_eq!(m.op("get"), 0);
    assert_eq!(decision(&m, "unknown"), 0);

    // Purge: one timed purge_expired per batch.
    drop(local);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    let purged = purge_expired_all(&store, &clock, 2, None, |_| {})
        .await
        .unwrap();
    let m = snapshot(&snapshotter);
    assert_eq!(purged.deleted, 4);
    assert_eq!(m.op("purge_expired"), purged.batches as u64);
    assert_eq!(purged.batches, 3);
}

/// Captures what `describe()` tells the recorder.
#[derive(Default)]
struct Descriptions(Mutex<Vec<Described>>);

/// Name, kind, unit, description.
type Described = (String, &'static str, Option<Unit>, String);

impl Recorder for Descriptions {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        let entry = (key.as_str().to_owned(), "counter", unit, text.to_string());
        self.0.lock().unwrap().push(entry);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        let entry = (key.as_str().to_owned(), "gauge", unit, text.to_string());
        self.0.lock().unwrap().push(entry);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
        let entry = (key.as_str().to_owned(), "histogram", unit, text.to_string());
        self.0.lock().unwrap().push(entry);
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[test]
fn describe_gives_every_metric_a_description_and_a_unit() {
    let recorder = Descriptions::default();
    metrics::with_local_recorder(&recorder, describe);
    let mut got = recorder.0.into_inner().unwrap();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (names::CLAIMS, "counter", Unit::Count),
        (names::COMPLETIONS, "counter", Unit::Count),
        (names::STORE_ERRORS, "counter", Unit::Count),
        (names::STORE_OP_SECONDS, "histogram", Unit::Seconds),
        (names::UNPROTECTED, "counter", Unit::Count),
        (names::REFUSALS, "counter", Unit::Count),
        (names::RECONCILE_DECISIONS, "counter", Unit::Count),
        (names::CHECKPOINTS, "counter", Unit::Count),
        (names::WAITS, "counter", Unit::Count),
        (names::WAIT_SECONDS, "histogram", Unit::Seconds),
    ];
    want.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((name, kind, unit, text), (w_name, w_kind, w_unit)) in got.iter().zip(&want) {
        assert_eq!(
            (name.as_str(), *kind, *unit),
            (*w_name, *w_kind, Some(*w_unit))
        );
        assert!(!text.is_empty(), "{name} has no description");
    }
}

/// An outcome over the size limit is recorded as "ran, response not kept" and still counted by
/// the state it leaves: a definitive one as `completed`, a retryable one as `retryable`.
#[tokio::test]
async fn an_outcome_too_large_to_keep_is_counted_by_the_state_it_leaves() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .max_outcome_bytes(8)
        .build()
        .unwrap();
    let executor = Executor::new(MemoryStore::new()).with_policy(policy);
    let scope = Scope::new("tenant/tool").unwrap();
    let fp = Fingerprint::of("tool", &json!({})).unwrap();
    let large = json!({"ticket": "a body longer than eight bytes"});
    let run = |key: &'static str, outcome: Outcome| {
        let (executor, scope, fp) = (&executor, &scope, &fp);
        async move {
            let key = IdempotencyKey::new(key).unwrap();
            let err = executor
                .run(scope, &key, fp, |_| async move { outcome })
                .await
                .unwrap_err();
            assert!(
                matches!(err, idem_core::Error::OutcomeTooLarge { .. }),
                "{err:?}"
            );
        }
    };
    run("k-definitive", Outcome::definitive(200, &large).unwrap()).await;
    let m = snapshot(&snapshotter);
    assert_eq!(m.count(names::COMPLETIONS, &[("result", "completed")]), 1);
    assert_eq!(m.count(names::COMPLETIONS, &[("result", "retryable")]), 0);
    // Counted since the last snapshot.
    run("k-retryable", Outcome::retryable(503, &large).unwrap()).await;
    let m = snapshot(&snapshotter);
    assert_eq!(m.count(names::COMPLETIONS, &[("result", "completed")]), 0);
    assert_eq!(m.count(names::COMPLETIONS, &[("result", "retryable")]), 1);
}
