//! A custom `KeyStore` running the public conformance suite, as your own store would.
//!
//! `AuditedStore` wraps `MemoryStore` and counts the calls it forwards for a record (a
//! stand-in for the metrics, tracing or tenancy checks a real wrapper adds). Every call names its
//! record by one `RecordId`; checkpoints are a capability the store opts into with
//! `CheckpointStore`. The example runs
//! every case of `idem-conformance` against it and checks they all pass and went through the
//! wrapper. Then it shows the suite failing a broken variant that lower-cases scopes (two
//! tenants `Acme` and `acme` would share records).
//!
//! ```sh
//! cargo run -p idemkit --example custom_store
//! ```
//!
//! In your crate: `cargo add --dev idem-conformance`, and in `tests/conformance.rs`
//! `idem_conformance::conformance_tests!(|| async { your_test_store().await });` for one
//! `#[test]` per case (`your_test_store` opens a new handle to your store; the README shows one).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit::machine::{
    CheckpointAnswer, ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idemkit::store::{CheckpointStore, ListFilter};
use idemkit::{
    Checkpoint, Fingerprint, KeyStore, MemoryStore, Outcome, Policy, Record, RecordId, Scope,
    StoreError, Timestamp, Token, async_trait,
};

/// Forwards every call to a `MemoryStore`, counting those for a record. Clones share the records.
#[derive(Debug, Clone, Default)]
struct AuditedStore {
    inner: MemoryStore,
    calls: Arc<AtomicUsize>,
    /// The defect of the broken variant: scopes compared without case.
    lowercase_scopes: bool,
}

impl AuditedStore {
    /// The record the inner store keeps for `id` (counting the call).
    fn id(&self, id: &RecordId) -> RecordId {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !self.lowercase_scopes {
            return id.clone();
        }
        // Lower case keeps a scope valid; were it not, the scope as it was.
        let scope =
            Scope::new(id.scope().as_str().to_lowercase()).unwrap_or_else(|_| id.scope().clone());
        RecordId::new(scope, id.key().clone())
    }
}

#[async_trait]
impl KeyStore for AuditedStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.inner
            .claim(&self.id(id), fingerprint, policy, now)
            .await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.inner
            .complete(&self.id(id), token, outcome, policy, now)
            .await
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.inner.release(&self.id(id), token, now).await
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.inner.extend(&self.id(id), token, lease, now).await
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.inner.get(&self.id(id), now).await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_flight(older_than, limit).await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list(filter, now, limit).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(now, limit).await
    }

    fn backend(&self) -> &'static str {
        "audited-memory"
    }

    // It keeps checkpoints (the capability below): say so, or nobody asks it to.
    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }
}

/// Checkpoints are a capability of their own: a store that cannot keep them leaves this out
/// (and `as_checkpoint_store` to its default), and is never asked for one.
#[async_trait]
impl CheckpointStore for AuditedStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        self.inner
            .checkpoint(&self.id(id), token, checkpoint, policy)
            .await
    }
}

/// The suite's factory: each call a new handle on the same records.
fn factory(
    store: AuditedStore,
) -> impl Fn() -> std::future::Ready<AuditedStore> + Send + Sync + 'static {
    move || std::future::ready(store.clone())
}

fn main() {
    // The suite makes its own runtimes: call it outside of one (as in a plain #[test]).
    let store = AuditedStore::default();
    let report = idem_conformance::run_all(factory(store.clone()));
    println!("{report}");
    let calls = store.calls.load(Ordering::Relaxed);
    println!("calls through the wrapper: {calls}");
    if !report.failed.is_empty() || report.passed.is_empty() || calls == 0 {
        eprintln!(
            "custom_store: FAILED: the wrapper must pass every case, through its own methods"
        );
        std::process::exit(1);
    }

    // The suite can fail: the broken variant must fail the case that compares scopes by case.
    std::panic::set_hook(Box::new(|_| {})); // the failing cases' panics are expected: keep quiet
    let broken = AuditedStore {
        lowercase_scopes: true,
        ..AuditedStore::default()
    };
    let report = idem_conformance::run_matching(factory(broken), |case| case.starts_with("scope_"));
    println!(
        "broken variant, scope cases: {} passed, {} failed",
        report.passed.len(),
        report.failed.len()
    );
    if !report.failed("scope_case_is_significant") {
        eprintln!("custom_store: FAILED: the suite did not catch lower-cased scopes");
        std::process::exit(1);
    }
    println!("custom_store: ok");
}
