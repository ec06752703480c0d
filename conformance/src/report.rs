//! Running the cases: one by name ([`run_case`], what each generated `#[test]` calls), or many
//! with every failure reported ([`run_all`], [`run_matching`], [`run_streaming`], [`Report`]).

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{Case, StoreFactory, run_case_shared};

/// Every case of the suite, in the order [`run_all`] runs them.
///
/// Minor releases may add cases (a store that passed may then fail a new one: a defect the suite
/// had not looked for); a case keeps its name once released.
pub fn cases() -> &'static [Case] {
    crate::cases::ALL
}

/// Runs the case named `name` against the store the factory makes, on a multi-threaded tokio
/// runtime of its own, and panics (fails the test) if it fails. Each `#[test]` that
/// [`conformance_tests!`](crate::conformance_tests) generates is one call of it.
///
/// A case the store passes by refusing a feature it does not support (see
/// [`Report::not_supported`]) passes, and says so on stderr.
///
/// # Panics
///
/// If the case fails, or if no case is named `name` (the names are those of [`cases()`]).
pub fn run_case(name: &str, factory: impl StoreFactory) {
    let Some(case) = cases().iter().find(|c| c.name == name) else {
        panic!("idem-conformance has no case named {name:?}");
    };
    if let Some(feature) = run_case_shared(case.name, Arc::new(factory), case.run) {
        eprintln!(
            "{}: the store does not support {feature} (it says so); not a failure",
            case.name
        );
    }
}

/// The result of [`run_all`], [`run_matching`] and [`run_streaming`].
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// The cases that passed.
    pub passed: Vec<&'static str>,
    /// The cases that failed, with their failure message.
    pub failed: Vec<(&'static str, String)>,
    /// The cases that passed because the store says it does not support their feature (and
    /// refuses it with a typed error), with the feature: e.g. `("checkpoint_…", "checkpoints")`.
    /// They are also in `passed`.
    pub not_supported: Vec<(&'static str, &'static str)>,
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
        for (name, feature) in &self.not_supported {
            writeln!(f, "n/a   {name}: the store does not support {feature}")?;
        }
        write!(
            f,
            "{} passed, {} failed",
            self.passed.len(),
            self.failed.len()
        )
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// One finished case, as [`run_streaming`] hands it over.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CaseResult {
    /// The case's name ([`Case::name`]).
    pub name: &'static str,
    /// The case's group ([`Case::group`]).
    pub group: &'static str,
    /// `None` when it passed; else why it failed.
    pub failure: Option<String>,
    /// How long it took.
    pub elapsed: Duration,
    /// The feature the store says it does not support (e.g. `"checkpoints"`), when the case
    /// passed only by checking that the store refuses it with a typed error.
    pub not_supported: Option<&'static str>,
}

impl CaseResult {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// Runs the cases whose names satisfy `filter`, each on its own runtime, and reports every
/// failure.
pub fn run_matching(factory: impl StoreFactory, filter: impl Fn(&str) -> bool) -> Report {
    run_streaming(factory, filter, |_| {})
}

/// [`run_matching`], calling `on_case` as each case finishes (in order), so a runner can show
/// results while the suite is still running.
pub fn run_streaming(
    factory: impl StoreFactory,
    filter: impl Fn(&str) -> bool,
    mut on_case: impl FnMut(&CaseResult),
) -> Report {
    let factory: Arc<dyn StoreFactory> = Arc::new(factory);
    let mut report = Report::default();
    for case in cases().iter().filter(|c| filter(c.name)) {
        let f = factory.clone();
        let started = std::time::Instant::now();
        let ran = catch_unwind(AssertUnwindSafe(|| run_case_shared(case.name, f, case.run)));
        let (failure, not_supported) = match ran {
            Ok(not_supported) => (None, not_supported),
            Err(payload) => (Some(panic_message(payload.as_ref())), None),
        };
        let result = CaseResult {
            name: case.name,
            group: case.group,
            failure,
            elapsed: started.elapsed(),
            not_supported,
        };
        on_case(&result);
        if let Some(feature) = result.not_supported {
            report.not_supported.push((case.name, feature));
        }
        match result.failure {
            None => report.passed.push(case.name),
            Some(why) => report.failed.push((case.name, why)),
        }
    }
    report
}

/// Runs every case and reports every failure.
pub fn run_all(factory: impl StoreFactory) -> Report {
    run_matching(factory, |_| true)
}
