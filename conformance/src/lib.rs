//! The conformance suite every idem [`KeyStore`] runs: each guarantee of SPEC §3 and each row of
//! the SPEC §2 table as its own named case.
//!
//! # Running it against your store
//!
//! In your store's `tests/conformance.rs`, one line generates one `#[test]` per case:
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! // A factory: called at least once per case, and many times in the concurrency cases; each
//! // call returns a new handle (for a real backend: new connections) to the same storage.
//! idem_conformance::conformance_tests!({
//!     let shared = MemoryStore::new();
//!     move || {
//!         let store = shared.clone();
//!         async move { store }
//!     }
//! });
//! # fn main() {}
//! ```
//!
//! `cargo test claim_` then runs the claim cases, `cargo test fencing_` the fencing cases, and a
//! failure names its case. No `#[tokio::test]` is needed: each case builds its own multi-threaded
//! tokio runtime, so the factory may create pools bound to it. Or run everything at once and get
//! every failure, not just the first:
//!
//! ```no_run
//! # use idem_core::MemoryStore;
//! let report = idem_conformance::run_all(|| async { MemoryStore::new() });
//! println!("{report}");
//! report.assert_all_passed();
//! ```
//!
//! # What a store must tolerate
//!
//! - Cases run in parallel against the same storage; each isolates itself with scopes of its own
//!   (`idem-conformance/<case>/<random run id>/…`), never by deleting data, so the storage may be
//!   shared with other data and other runs.
//! - Time comes from a [`ManualClock`] passed as `now`: cases move it by
//!   days, and the expiry, purge and reconciliation cases run it decades in the past (1975–2000) so
//!   that their purges cannot touch other cases' records. A store must decide everything from the
//!   `now` it is given, never from its own clock.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{IdempotencyKey, KeyStore, ManualClock, Scope, Timestamp};

pub mod cases;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Makes store handles for the suite. Implemented for every
/// `Fn() -> impl Future<Output = impl KeyStore>`; each call returns a new handle to the same
/// storage.
pub trait StoreFactory: Send + Sync + 'static {
    /// A new handle.
    fn make(&self) -> BoxFuture<'static, Arc<dyn KeyStore>>;
}

impl<F, Fut, S> StoreFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = S> + Send + 'static,
    S: KeyStore,
{
    fn make(&self) -> BoxFuture<'static, Arc<dyn KeyStore>> {
        let fut = self();
        Box::pin(async move { Arc::new(fut.await) as Arc<dyn KeyStore> })
    }
}

/// What a case gets: store handles, a clock it controls, and names of its own.
#[derive(Clone)]
pub struct Harness {
    factory: Arc<dyn StoreFactory>,
    clock: ManualClock,
    case: &'static str,
    run: String,
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
        }
    }

    /// A new store handle (for a real backend, new connections).
    pub async fn store(&self) -> Arc<dyn KeyStore> {
        self.factory.make().await
    }

    /// The case's clock; it starts at the wall clock's time.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The clock's time.
    pub fn now(&self) -> Timestamp {
        idem_core::Clock::now(&self.clock)
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// A scope no other case or run uses.
    pub fn scope(&self, name: &str) -> Scope {
        Scope::new(format!(
            "idem-conformance/{}/{}/{}",
            self.case, self.run, name
        ))
        .expect("valid scope")
    }

    /// A key (keys need not be unique: scopes are).
    pub fn key(&self, name: &str) -> IdempotencyKey {
        IdempotencyKey::new(name).expect("valid key")
    }

    /// The case's name.
    pub fn case(&self) -> &'static str {
        self.case
    }
}

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name (also the name of its generated `#[test]`).
    pub name: &'static str,
    /// What it checks, in a line.
    pub group: &'static str,
    /// Runs it.
    pub run: fn(Harness) -> BoxFuture<'static, ()>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// How long one case may take before it is failed (a deadlocked store must not hang CI).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one case on a fresh multi-threaded runtime; panics (fails the test) if the case fails.
pub fn run_case(
    name: &'static str,
    factory: impl StoreFactory,
    case: fn(Harness) -> BoxFuture<'static, ()>,
) {
    run_case_shared(name, Arc::new(factory), case)
}

fn run_case_shared(
    name: &'static str,
    factory: Arc<dyn StoreFactory>,
    case: fn(Harness) -> BoxFuture<'static, ()>,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let harness = Harness::new(name, factory);
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
}

/// The result of [`run_all`].
#[derive(Debug, Default)]
pub struct Report {
    /// The cases that passed.
    pub passed: Vec<&'static str>,
    /// The cases that failed, with their failure message.
    pub failed: Vec<(&'static str, String)>,
}

impl Report {
    /// Panics, listing every failed case, if any failed.
    pub fn assert_all_passed(&self) {
        assert!(self.failed.is_empty(), "{self}");
    }

    /// Whether the named case failed.
    pub fn failed(&self, case: &str) -> bool {
        self.failed.iter().any(|(name, _)| *name == case)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for name in &self.passed {
            writeln!(f, "pass  {name}")?;
        }
        for (name, why) in &self.failed {
            writeln!(f, "FAIL  {name}: {why}")?;
        }
        write!(
            f,
            "{} passed, {} failed",
            self.passed.len(),
            self.failed.len()
        )
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// Runs the cases whose names satisfy `filter`, each on its own runtime, and reports every
/// failure.
pub fn run_matching(factory: impl StoreFactory, filter: impl Fn(&str) -> bool) -> Report {
    let factory: Arc<dyn StoreFactory> = Arc::new(factory);
    let mut report = Report::default();
    for case in cases::ALL.iter().filter(|c| filter(c.name)) {
        let f = factory.clone();
        match catch_unwind(AssertUnwindSafe(|| run_case_shared(case.name, f, case.run))) {
            Ok(()) => report.passed.push(case.name),
            Err(payload) => report
                .failed
                .push((case.name, panic_message(payload.as_ref()))),
        }
    }
    report
}

/// Runs every case and reports every failure.
pub fn run_all(factory: impl StoreFactory) -> Report {
    run_matching(factory, |_| true)
}

/// Generates one `#[test]` per case, running it against the store the factory makes.
///
/// The argument is an expression evaluated once per generated test; its value must implement
/// [`StoreFactory`] (e.g. `|| async { MyStore::connect(..).await.unwrap() }`).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr $(,)?) => {
        $crate::__case_list!(__emit_tests($factory));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_tests {
    (($factory:expr) $($group:ident :: $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::run_case(
                    ::core::stringify!($case),
                    $factory,
                    |h| ::std::boxed::Box::pin($crate::cases::$group::$case(h)),
                );
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __emit_table {
    (() $($group:ident :: $case:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: ::core::stringify!($case),
                group: ::core::stringify!($group),
                run: |h| ::std::boxed::Box::pin($crate::cases::$group::$case(h)),
            },
        )*]
    };
}

/// The root README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
