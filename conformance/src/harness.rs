//! What a case runs with: the [`StoreFactory`], the `Harness` (store handles, a clock, names
//! of its own) and one [`Case`] run on a runtime of its own.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{IdempotencyKey, KeyStore, ManualClock, RecordId, Scope, Timestamp};

/// A boxed, sendable future.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Makes store handles for the suite. Implemented for every
/// `Fn() -> impl Future<Output = impl KeyStore>`; each call returns a new handle to the same
/// storage.
///
/// A closure is all a store needs (`|| async { MyStore::connect(URL).await.unwrap() }`);
/// implement the trait yourself only for a factory with a name.
pub trait StoreFactory: Send + Sync + 'static {
    /// A new handle.
    fn make(&self) -> Pin<Box<dyn Future<Output = Arc<dyn KeyStore>> + Send>>;
}

impl<F, Fut, S> StoreFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = S> + Send + 'static,
    S: KeyStore,
{
    fn make(&self) -> Pin<Box<dyn Future<Output = Arc<dyn KeyStore>> + Send>> {
        let fut = self();
        Box::pin(async move { Arc::new(fut.await) as Arc<dyn KeyStore> })
    }
}

/// What a case gets: store handles, a clock it controls, and names of its own.
#[derive(Clone)]
pub(crate) struct Harness {
    factory: Arc<dyn StoreFactory>,
    clock: ManualClock,
    case: &'static str,
    run: String,
    not_supported: Arc<std::sync::Mutex<Option<&'static str>>>,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("case", &self.case)
            .field("run", &self.run)
            .field("now", &idem_core::Clock::now(&self.clock))
            .finish_non_exhaustive()
    }
}

impl Harness {
    fn new(case: &'static str, factory: Arc<dyn StoreFactory>) -> Self {
        Self {
            factory,
            clock: ManualClock::starting_now(),
            case,
            run: format!("{:016x}", rand::random::<u64>()),
            not_supported: Arc::default(),
        }
    }

    /// Notes that the store does not support `feature` (e.g. `"checkpoints"`), which the case
    /// checked it refuses with a typed error: the case passes and is reported as not supported
    /// ([`Report::not_supported`](crate::Report::not_supported),
    /// [`CaseResult::not_supported`](crate::CaseResult::not_supported)).
    pub(crate) fn not_supported(&self, feature: &'static str) {
        *self.not_supported.lock().unwrap_or_else(|e| e.into_inner()) = Some(feature);
    }

    /// A new store handle (for a real backend, new connections).
    pub(crate) async fn store(&self) -> Arc<dyn KeyStore> {
        self.factory.make().await
    }

    /// The case's clock; it starts at the wall clock's time.
    pub(crate) fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The clock's time.
    pub(crate) fn now(&self) -> Timestamp {
        idem_core::Clock::now(&self.clock)
    }

    /// Moves the clock forward.
    pub(crate) fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// A scope no other case or run uses.
    pub(crate) fn scope(&self, name: &str) -> Scope {
        Scope::new(format!(
            "idem-conformance/{}/{}/{}",
            self.case, self.run, name
        ))
        .expect("valid scope")
    }

    /// A key (keys need not be unique: scopes are).
    pub(crate) fn key(&self, name: &str) -> IdempotencyKey {
        IdempotencyKey::new(name).expect("valid key")
    }

    /// The record of the key `key` in the case's scope `scope` ([`Harness::scope`]).
    pub(crate) fn id(&self, scope: &str, key: &str) -> RecordId {
        RecordId::new(self.scope(scope), self.key(key))
    }
}

/// One case of the suite, as [`cases`](crate::cases()) lists them.
#[derive(Clone, Copy)]
pub struct Case {
    pub(crate) name: &'static str,
    pub(crate) group: &'static str,
    pub(crate) run: fn(Harness) -> BoxFuture<'static, ()>,
}

impl Case {
    /// Its name, e.g. `claim_completed_replays`: the name of its generated `#[test]`, what
    /// [`run_case`](crate::run_case) takes, and what a [`Report`](crate::Report) lists.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Its group, e.g. `claim` (the `inspect_` cases are in the `expiry` group): the
    /// [contract](idem_core::contract) section it checks, as the crate docs list them.
    pub fn group(&self) -> &'static str {
        self.group
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("group", &self.group)
            .finish()
    }
}

/// How long one case may take before it is failed (a deadlocked store must not hang CI).
pub(crate) const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `case` on a fresh multi-threaded runtime; panics if it fails, else returns the feature
/// the store said it does not support, if any.
pub(crate) fn run_case_shared(
    name: &'static str,
    factory: Arc<dyn StoreFactory>,
    case: fn(Harness) -> BoxFuture<'static, ()>,
) -> Option<&'static str> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let harness = Harness::new(name, factory);
    let not_supported = harness.not_supported.clone();
    runtime.block_on(async move {
        // Spawned, so the case's futures run on the worker threads in parallel.
        let task = tokio::spawn(case(harness));
        match tokio::time::timeout(CASE_TIMEOUT, task).await {
            Ok(Ok(())) => {}
            Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Ok(Err(join)) => panic!("case {name} was cancelled: {join}"),
            Err(_) => panic!("case {name} did not finish within {CASE_TIMEOUT:?}"),
        }
    });
    *not_supported.lock().unwrap_or_else(|e| e.into_inner())
}
