//! `run_all` runs every case and reports each one.

use idem_core::MemoryStore;

#[test]
fn run_all_reports_every_case_passing_on_memory_store() {
    let shared = MemoryStore::new();
    let report = idem_conformance::run_all(move || {
        let store = shared.clone();
        async move { store }
    });
    report.assert_all_passed();
    assert_eq!(report.passed.len(), idem_conformance::cases::ALL.len());
    assert!(report.passed.len() >= 30, "at least 30 cases");
    let names: std::collections::HashSet<_> = idem_conformance::cases::ALL
        .iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(
        names.len(),
        idem_conformance::cases::ALL.len(),
        "case names are unique"
    );
}

#[test]
fn run_streaming_reports_each_case_as_it_finishes() {
    let shared = MemoryStore::new();
    let mut seen = Vec::new();
    let report = idem_conformance::run_streaming(
        move || {
            let store = shared.clone();
            async move { store }
        },
        |name| name.starts_with("claim") || name.starts_with("fencing"),
        |case| {
            assert!(case.passed(), "{case:?}");
            seen.push(case.name);
        },
    );
    assert!(!seen.is_empty());
    assert_eq!(seen, report.passed, "one call per case, in order");
    assert!(report.failed.is_empty());
}
