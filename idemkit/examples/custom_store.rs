//! A custom `KeyStore` running the public conformance suite, as your own store would.
//!
//! `AuditedStore` wraps `MemoryStore` and counts the calls it forwards for a record (a
//! stand-in for the metrics, tracing or tenancy checks a real wrapper adds). The example runs
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

use idemkit::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idemkit::store::ListFilter;
use idemkit::{
    Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome, Policy, Record, Scope, StoreError,
    Timestamp, Token, async_trait,
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
    fn scope(&self, scope: &Scope) -> Scope {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.lowercase_scopes {
            // Lower case keeps a scope valid; were it not, the scope as it was.
            Scope::new(scope.as_str().to_lowercase()).unwrap_or_else(|_| scope.clone())
        } else {
            scope.clone()
        }
    }
}

#[async_trait]
impl KeyStore for AuditedStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        self.inner
            .claim(&self.scope(scope), key, fingerprint, policy, now)
            .await
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        self.inner
            .complete(&self.scope(scope), key, token, outcome, policy, now)
            .await
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        self.inner
            .release(&self.scope(scope), key, token, now)
            .await
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        self.inner
            .extend(&self.scope(scope), key, token, lease, now)
            .await
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.get(&self.scope(scope), key, now).await
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
