//! Waiting for an in-flight answer, measured: a retry sent 10 ms after the first request of a
//! 300 ms operation waits (`Executor::waiting`), and we take the time from the first request's
//! answer to the retry's (the replay), p50 and p99 over 100 such pairs, on `MemoryStore` with its
//! in-process wake-ups and behind a store that implements nothing new (the portable polling).
//!
//! `cargo bench -p idem-core --bench wait`

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::store::ListFilter;
use idem_core::{
    Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome, Policy, Record,
    RecordId, Scope, StoreError, Timestamp, Token, async_trait,
};
use serde_json::json;

const PAIRS: usize = 100;
/// Pairs running at once (each on its own key).
const BATCH: usize = 10;
const TOOL: Duration = Duration::from_millis(300);
const RETRY_AFTER: Duration = Duration::from_millis(10);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let notified = measure(Arc::new(MemoryStore::new())).await;
        let polled = measure(Arc::new(Plain(MemoryStore::new()))).await;
        println!(
            "retry {RETRY_AFTER:?} after the first request of a {TOOL:?} operation, {PAIRS} pairs:"
        );
        println!("  from the first answer to the retry's replay   p50       p99       max");
        for (name, mut gaps) in [
            ("memory, in-process wake-up", notified),
            ("polling get (portable default)", polled),
        ] {
            gaps.sort();
            let at = |p: usize| gaps[(gaps.len() * p).div_ceil(100).max(1) - 1];
            println!(
                "  {name:<40} {:>8.2?} {:>9.2?} {:>9.2?}",
                at(50),
                at(99),
                gaps[gaps.len() - 1]
            );
        }
    });
}

/// The gaps between the first answer and the retry's, one per pair.
async fn measure(store: Arc<dyn KeyStore>) -> Vec<Duration> {
    let executor = Executor::from_arc(store).with_policy(
        Policy::builder()
            .lease(Duration::from_secs(30))
            .build()
            .unwrap(),
    );
    let scope = Scope::new("bench/create_ticket").unwrap();
    let fp = Fingerprint::of("create_ticket", &json!({"title": "t"})).unwrap();
    let mut gaps = Vec::with_capacity(PAIRS);
    for batch in 0..PAIRS / BATCH {
        let pairs: Vec<_> = (0..BATCH)
            .map(|i| {
                let key = IdempotencyKey::new(format!("{}:{batch}:{i}", rand_run())).unwrap();
                let (first, retry) = (executor.clone(), executor.waiting(Duration::from_secs(5)));
                let (scope, fp) = (scope.clone(), fp.clone());
                tokio::spawn(async move {
                    let holder = {
                        let (scope, key, fp) = (scope.clone(), key.clone(), fp.clone());
                        tokio::spawn(async move {
                            first
                                .run(&scope, &key, &fp, |_| async {
                                    tokio::time::sleep(TOOL).await;
                                    Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap()
                                })
                                .await
                                .unwrap();
                            Instant::now()
                        })
                    };
                    tokio::time::sleep(RETRY_AFTER).await;
                    let again = retry
                        .run(&scope, &key, &fp, |_| async { unreachable!() })
                        .await;
                    let answered = Instant::now();
                    assert!(again.unwrap().is_replay());
                    answered.saturating_duration_since(holder.await.unwrap())
                })
            })
            .collect();
        for pair in pairs {
            gaps.push(pair.await.unwrap());
        }
    }
    gaps
}

fn rand_run() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `MemoryStore` behind a store that forwards only the required methods: the portable wait.
#[derive(Debug)]
struct Plain(MemoryStore);

#[async_trait]
impl KeyStore for Plain {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.0.claim(id, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.0.complete(id, token, outcome, policy, now).await
    }
    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.0.release(id, token, now).await
    }
    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.0.extend(id, token, lease, now).await
    }
    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.0.get(id, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.0.list(filter, now, limit).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(now, limit).await
    }
}
